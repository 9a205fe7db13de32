//! JSON documents kept in a column of a Durable Object's SQLite tables.

use serde::Deserialize;
use serde::de::DeserializeOwned;
use worker::{Result, SqlStorage, SqlStorageValue};

/// The `json` column of each row that `query` returns, parsed as `T`; a row that does not
/// parse is left out (a document written by an older version, say).
pub fn json_rows<T: DeserializeOwned>(
    sql: &SqlStorage,
    query: &str,
    params: Vec<SqlStorageValue>,
) -> Result<Vec<T>> {
    #[derive(Deserialize)]
    struct Row {
        json: String,
    }
    let rows: Vec<Row> = sql.exec(query, params)?.to_array()?;
    Ok(rows
        .iter()
        .filter_map(|r| serde_json::from_str(&r.json).ok())
        .collect())
}
