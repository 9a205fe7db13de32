//! One Durable Object per tenant holds its limits, its spend, the holds of requests in flight
//! and the cost records, in SQLite. A Durable Object runs one request at a time and every
//! SQL call here is synchronous, so a reservation's check-and-insert cannot interleave with
//! another's: concurrent requests can never overshoot a limit.

use serde::{Deserialize, Serialize};
use worker::{
    DurableObject, Env, Method, Request, Response, Result, SqlStorage, SqlStorageValue, State,
    durable_object,
};

/// A tenant's limits (absent fields are unlimited).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    pub daily_usd: Option<f64>,
    pub daily_tokens: Option<i64>,
    pub max_concurrent: Option<i64>,
    /// Largest `max_tokens` a request may ask for.
    pub max_tokens_cap: Option<i64>,
    /// Requests and tokens (worst case while in flight) in any 60-second window.
    pub requests_per_minute: Option<i64>,
    pub tokens_per_minute: Option<i64>,
}

/// A worst-case hold taken before forwarding.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Hold {
    pub id: String,
    pub usd: f64,
    pub tokens: i64,
    /// When an unsettled hold is reclaimed (a worker that died mid-request).
    pub expires_ms: i64,
    pub now_ms: i64,
}

/// What the budget answered to a hold.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HoldAnswer {
    pub admitted: bool,
    /// Why not, when refused: `budget`, `concurrency` or `rate`.
    #[serde(default)]
    pub refused_for: Option<String>,
    /// For `rate`: seconds until the window has room again.
    #[serde(default)]
    pub retry_after_s: Option<i64>,
    pub remaining_usd: Option<f64>,
    pub remaining_tokens: Option<i64>,
}

/// One request's cost record.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Record {
    pub id: String,
    pub ts_ms: i64,
    pub user: String,
    pub session: String,
    pub feature: String,
    pub model: String,
    pub upstream: String,
    pub route_reason: String,
    pub policy_version: String,
    pub tokens_in: i64,
    pub tokens_out: i64,
    pub usd: f64,
    pub ttfb_ms: i64,
    pub total_ms: i64,
    /// `ok`, `upstream_error`, `client_gone`, …
    pub outcome: String,
}

/// The Durable Object.
#[durable_object(fetch)]
pub struct TenantBudget {
    sql: SqlStorage,
}

const DAY_MS: i64 = 86_400_000;

const SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS limits (id INTEGER PRIMARY KEY CHECK (id = 1), json TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS spend (day INTEGER PRIMARY KEY, usd REAL NOT NULL, tokens INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS holds (id TEXT PRIMARY KEY, usd REAL NOT NULL, tokens INTEGER NOT NULL, expires_ms INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS records (id TEXT PRIMARY KEY, ts_ms INTEGER NOT NULL, json TEXT NOT NULL, \
     user TEXT, session TEXT, feature TEXT, model TEXT, tokens_in INTEGER, tokens_out INTEGER, usd REAL, outcome TEXT)",
];

impl DurableObject for TenantBudget {
    fn new(state: State, _env: Env) -> Self {
        let sql = state.storage().sql();
        for stmt in SCHEMA {
            // A failure here surfaces on the first query with the real error.
            let _ = sql.exec(stmt, None);
        }
        TenantBudget { sql }
    }

    async fn fetch(&self, mut req: Request) -> Result<Response> {
        let path = req.path();
        match (req.method(), path.as_str()) {
            (Method::Post, "/hold") => {
                let hold: Hold = req.json().await?;
                Response::from_json(&self.hold(&hold)?)
            }
            (Method::Post, "/settle") => {
                let (hold_id, record): (String, Record) = req.json().await?;
                self.settle(&hold_id, &record)?;
                Response::from_json(&serde_json::json!({"settled": true}))
            }
            (Method::Put, "/limits") => {
                let limits: Limits = req.json().await?;
                self.sql.exec(
                    "INSERT INTO limits (id, json) VALUES (1, ?) ON CONFLICT(id) DO UPDATE SET json = excluded.json",
                    vec![SqlStorageValue::from(serde_json::to_string(&limits)?)],
                )?;
                Response::from_json(&limits)
            }
            (Method::Get, "/limits") => Response::from_json(&self.limits()?),
            (Method::Get, "/usage") => {
                let url = req.url()?;
                let q = |k: &str| {
                    url.query_pairs()
                        .find(|(key, _)| key == k)
                        .map(|(_, v)| v.into_owned())
                };
                let from = q("from").and_then(|v| v.parse().ok()).unwrap_or(0i64);
                // JavaScript's largest safe integer: SQLite values cross into JS.
                let to = q("to")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(9_007_199_254_740_991i64);
                Response::from_json(&self.usage(from, to, q("group_by").as_deref())?)
            }
            _ => Response::error("no such budget route", 404),
        }
    }
}

#[derive(Deserialize)]
struct Sums {
    usd: Option<f64>,
    tokens: Option<i64>,
    n: Option<i64>,
}

impl TenantBudget {
    fn limits(&self) -> Result<Limits> {
        #[derive(Deserialize)]
        struct Row {
            json: String,
        }
        let rows: Vec<Row> = self
            .sql
            .exec("SELECT json FROM limits WHERE id = 1", None)?
            .to_array()?;
        Ok(rows
            .first()
            .and_then(|r| serde_json::from_str(&r.json).ok())
            .unwrap_or_default())
    }

    /// What the holds in flight add up to: (USD, tokens, count).
    fn held(&self) -> Result<(f64, i64, i64)> {
        let rows: Vec<Sums> = self
            .sql
            .exec(
                "SELECT SUM(usd) AS usd, SUM(tokens) AS tokens, COUNT(*) AS n FROM holds",
                None,
            )?
            .to_array()?;
        let s = rows.first();
        Ok((
            s.and_then(|s| s.usd).unwrap_or(0.0),
            s.and_then(|s| s.tokens).unwrap_or(0),
            s.and_then(|s| s.n).unwrap_or(0),
        ))
    }

    fn hold(&self, h: &Hold) -> Result<HoldAnswer> {
        // Holds of workers that never settled are reclaimed first.
        self.sql.exec(
            "DELETE FROM holds WHERE expires_ms < ?",
            vec![SqlStorageValue::from(h.now_ms)],
        )?;
        let limits = self.limits()?;
        let day = h.now_ms / DAY_MS;
        let spent: Vec<Sums> = self
            .sql
            .exec(
                "SELECT usd, tokens, 0 AS n FROM spend WHERE day = ?",
                vec![SqlStorageValue::from(day)],
            )?
            .to_array()?;
        let (held_usd, held_tokens, in_flight) = self.held()?;
        let spent_usd = spent.first().and_then(|s| s.usd).unwrap_or(0.0);
        let spent_tokens = spent.first().and_then(|s| s.tokens).unwrap_or(0);
        let remaining_usd = limits.daily_usd.map(|l| l - spent_usd - held_usd);
        let remaining_tokens = limits.daily_tokens.map(|l| l - spent_tokens - held_tokens);
        let refuse = |why: &str| HoldAnswer {
            admitted: false,
            refused_for: Some(why.into()),
            retry_after_s: None,
            remaining_usd: remaining_usd.map(|r| r.max(0.0)),
            remaining_tokens: remaining_tokens.map(|r| r.max(0)),
        };
        if limits.max_concurrent.is_some_and(|m| in_flight >= m) {
            return Ok(refuse("concurrency"));
        }
        if limits.requests_per_minute.is_some() || limits.tokens_per_minute.is_some() {
            // The window holds the requests that started in the last minute, plus every
            // request still in flight (counted at its worst case).
            let window_start = h.now_ms - 60_000;
            #[derive(Deserialize)]
            struct Window {
                tokens: Option<i64>,
                n: Option<i64>,
                oldest: Option<i64>,
            }
            let recent: Vec<Window> = self
                .sql
                .exec(
                    "SELECT SUM(tokens_in + tokens_out) AS tokens, COUNT(*) AS n, MIN(ts_ms) AS oldest \
                     FROM records WHERE ts_ms >= ?",
                    vec![SqlStorageValue::from(window_start)],
                )?
                .to_array()?;
            let w = recent.first();
            let requests = w.and_then(|w| w.n).unwrap_or(0) + in_flight;
            let tokens = w.and_then(|w| w.tokens).unwrap_or(0) + held_tokens;
            let over = limits.requests_per_minute.is_some_and(|m| requests >= m)
                || limits
                    .tokens_per_minute
                    .is_some_and(|m| tokens + h.tokens > m);
            if over {
                let oldest = w.and_then(|w| w.oldest).unwrap_or(h.now_ms);
                let wait_ms = (oldest + 60_000 - h.now_ms).clamp(1_000, 60_000);
                return Ok(HoldAnswer {
                    retry_after_s: Some((wait_ms + 999) / 1000),
                    ..refuse("rate")
                });
            }
        }
        if remaining_usd.is_some_and(|r| h.usd > r)
            || remaining_tokens.is_some_and(|r| h.tokens > r)
        {
            return Ok(refuse("budget"));
        }
        self.sql.exec(
            "INSERT INTO holds (id, usd, tokens, expires_ms) VALUES (?, ?, ?, ?)",
            vec![
                SqlStorageValue::from(h.id.as_str()),
                SqlStorageValue::from(h.usd),
                SqlStorageValue::from(h.tokens),
                SqlStorageValue::from(h.expires_ms),
            ],
        )?;
        Ok(HoldAnswer {
            admitted: true,
            refused_for: None,
            retry_after_s: None,
            remaining_usd: remaining_usd.map(|r| r - h.usd),
            remaining_tokens: remaining_tokens.map(|r| r - h.tokens),
        })
    }

    /// Replaces the hold with what was actually spent and writes the cost record (once: a
    /// repeated settle of the same id changes nothing).
    fn settle(&self, hold_id: &str, r: &Record) -> Result<()> {
        let existing: Vec<Sums> = self
            .sql
            .exec(
                "SELECT 0.0 AS usd, 0 AS tokens, COUNT(*) AS n FROM records WHERE id = ?",
                vec![SqlStorageValue::from(r.id.as_str())],
            )?
            .to_array()?;
        self.sql.exec(
            "DELETE FROM holds WHERE id = ?",
            vec![SqlStorageValue::from(hold_id)],
        )?;
        if existing.first().and_then(|s| s.n).unwrap_or(0) > 0 {
            return Ok(());
        }
        self.sql.exec(
            "INSERT INTO spend (day, usd, tokens) VALUES (?, ?, ?) \
             ON CONFLICT(day) DO UPDATE SET usd = usd + excluded.usd, tokens = tokens + excluded.tokens",
            vec![
                SqlStorageValue::from(r.ts_ms / DAY_MS),
                SqlStorageValue::from(r.usd),
                SqlStorageValue::from(r.tokens_in + r.tokens_out),
            ],
        )?;
        self.sql.exec(
            "INSERT INTO records (id, ts_ms, json, user, session, feature, model, tokens_in, tokens_out, usd, outcome) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            vec![
                SqlStorageValue::from(r.id.as_str()),
                SqlStorageValue::from(r.ts_ms),
                SqlStorageValue::from(serde_json::to_string(r)?),
                SqlStorageValue::from(r.user.as_str()),
                SqlStorageValue::from(r.session.as_str()),
                SqlStorageValue::from(r.feature.as_str()),
                SqlStorageValue::from(r.model.as_str()),
                SqlStorageValue::from(r.tokens_in),
                SqlStorageValue::from(r.tokens_out),
                SqlStorageValue::from(r.usd),
                SqlStorageValue::from(r.outcome.as_str()),
            ],
        )?;
        Ok(())
    }

    fn usage(&self, from: i64, to: i64, group_by: Option<&str>) -> Result<serde_json::Value> {
        #[derive(Serialize, Deserialize)]
        struct Group {
            key: Option<String>,
            requests: i64,
            tokens_in: Option<i64>,
            tokens_out: Option<i64>,
            usd: Option<f64>,
        }
        // The column comes from this list, never from the query string.
        let column = match group_by {
            None => "'all'",
            Some("user") => "user",
            Some("session") => "session",
            Some("feature") => "feature",
            Some("model") => "model",
            Some("outcome") => "outcome",
            Some(other) => {
                return Ok(serde_json::json!({
                    "error": format!("group_by must be user, session, feature, model or outcome, not {other:?}")
                }));
            }
        };
        let rows: Vec<Group> = self
            .sql
            .exec(
                &format!(
                    "SELECT {column} AS key, COUNT(*) AS requests, SUM(tokens_in) AS tokens_in, \
                     SUM(tokens_out) AS tokens_out, SUM(usd) AS usd FROM records \
                     WHERE ts_ms >= ? AND ts_ms < ? GROUP BY key ORDER BY key"
                ),
                vec![SqlStorageValue::from(from), SqlStorageValue::from(to)],
            )?
            .to_array()?;
        let (_, _, in_flight) = self.held()?;
        Ok(serde_json::json!({
            "groups": rows,
            "in_flight": in_flight,
            "limits": self.limits()?,
        }))
    }
}
