//! Which page origins some tenant allows, for the answers that come before a tenant is known:
//! a CORS preflight carries no token, so it cannot be checked against one tenant's record.
//! One object for the deployment keeps the union of the tenants' `allowed_origins`; whether
//! a given tenant allows an origin is then checked on the request itself.

use serde::Deserialize;
use worker::{
    DurableObject, Env, Method, Request, RequestInit, Response, Result, SqlStorage,
    SqlStorageValue, State, Stub, durable_object,
};

/// The Durable Object (one instance, named `deployment`).
#[durable_object(fetch)]
pub struct OriginRegistry {
    sql: SqlStorage,
}

impl DurableObject for OriginRegistry {
    fn new(state: State, _env: Env) -> Self {
        let sql = state.storage().sql();
        if let Err(e) = sql.exec(
            "CREATE TABLE IF NOT EXISTS origins (tenant TEXT NOT NULL, origin TEXT NOT NULL, PRIMARY KEY (tenant, origin))",
            None,
        ) {
            worker::console_error!("origin registry schema failed: {e}");
        }
        OriginRegistry { sql }
    }

    async fn fetch(&self, mut req: Request) -> Result<Response> {
        let url = req.url()?;
        let param = |k: &str| {
            url.query_pairs()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.into_owned())
                .unwrap_or_default()
        };
        match req.method() {
            // The tenant's list replaces what it had.
            Method::Put => {
                let tenant = param("tenant");
                let origins: Vec<String> = req.json().await?;
                self.sql.exec(
                    "DELETE FROM origins WHERE tenant = ?",
                    vec![SqlStorageValue::from(tenant.as_str())],
                )?;
                for origin in &origins {
                    self.sql.exec(
                        "INSERT OR IGNORE INTO origins (tenant, origin) VALUES (?, ?)",
                        vec![
                            SqlStorageValue::from(tenant.as_str()),
                            SqlStorageValue::from(origin.as_str()),
                        ],
                    )?;
                }
                Response::from_json(&origins)
            }
            Method::Get => {
                #[derive(Deserialize)]
                struct Count {
                    n: i64,
                }
                let rows: Vec<Count> = self
                    .sql
                    .exec(
                        "SELECT COUNT(*) AS n FROM origins WHERE origin = ? OR origin = '*'",
                        vec![SqlStorageValue::from(param("origin").as_str())],
                    )?
                    .to_array()?;
                let known = rows.first().is_some_and(|c| c.n > 0);
                Response::from_json(&known)
            }
            _ => Response::error("no such registry route", 404),
        }
    }
}

fn registry(env: &Env) -> Result<Stub> {
    env.durable_object("ORIGINS")?
        .id_from_name("deployment")?
        .get_stub()
}

/// Records `tenant`'s allowed origins (none: it uses the deployment's list).
pub async fn publish(env: &Env, tenant: &str, origins: &[String]) -> Result<()> {
    let mut init = RequestInit::new();
    init.with_method(Method::Put)
        .with_body(Some(serde_json::to_string(origins)?.into()));
    let mut url = worker::Url::parse("https://registry/")?;
    url.query_pairs_mut().append_pair("tenant", tenant);
    let req = Request::new_with_init(url.as_str(), &init)?;
    let resp = registry(env)?.fetch_with_request(req).await?;
    if resp.status_code() != 200 {
        return Err(worker::Error::RustError(format!(
            "origin registry answered {}",
            resp.status_code()
        )));
    }
    Ok(())
}

/// Whether some tenant allows pages at `origin`.
pub async fn known(env: &Env, origin: &str) -> Result<bool> {
    let mut url = worker::Url::parse("https://registry/")?;
    url.query_pairs_mut().append_pair("origin", origin);
    let req = Request::new(url.as_str(), Method::Get)?;
    registry(env)?.fetch_with_request(req).await?.json().await
}
