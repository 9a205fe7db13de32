//! One Durable Object per tenant holds its record, its spend, the holds of requests in flight
//! and the cost records, in SQLite. A Durable Object runs one event at a time and every SQL
//! call here is synchronous, so a reservation's check-and-insert cannot interleave with
//! another's: concurrent requests can never overshoot a limit. Spend windows are UTC days and
//! months read from timestamps, so they reset by time alone; an alarm reclaims the holds of
//! requests whose worker died before settling them.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use worker::{
    DurableObject, Env, Method, Request, RequestInit, Response, Result, SqlStorage,
    SqlStorageValue, State, Stub, Url, durable_object,
};

use straddle_protocol::Feedback;

use crate::sql::json_rows;
use crate::tenant::{Limits, Tenant};

/// What a worker route asks of a tenant's budget object: one typed call per operation, so
/// the two sides cannot disagree on a path or on the order of a tuple.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "call", content = "with", rename_all = "snake_case")]
pub enum BudgetCall {
    /// Take a hold; answers a [`HoldAnswer`].
    Hold(Hold),
    /// Grow a hold; answers a [`HoldAnswer`].
    Extend(Hold),
    /// Release a hold and write the request's record.
    Settle { hold_id: String, record: Record },
    /// Write edge answers' records, each once.
    EdgeRecords(Vec<Record>),
    /// Set users' rewards on answers given in `session`.
    Feedback {
        session: String,
        feedback: Vec<Feedback>,
    },
    /// Replace the tenant's record; answers the [`Tenant`] saved.
    PutTenant(Tenant),
    /// The tenant's record, a [`Tenant`].
    Tenant,
    /// The usage report.
    Usage(UsageQuery),
}

/// What `GET /v1/tenants/:id/usage` asks for.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct UsageQuery {
    pub from: Option<i64>,
    pub to: Option<i64>,
    pub group_by: Option<String>,
    /// The newest records themselves, this many.
    pub records: Option<i64>,
}

impl UsageQuery {
    /// Reads a request's query string; a number that does not parse is left out.
    pub fn of(url: &Url) -> Self {
        let q = |k: &str| {
            url.query_pairs()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.into_owned())
        };
        UsageQuery {
            from: q("from").and_then(|v| v.parse().ok()),
            to: q("to").and_then(|v| v.parse().ok()),
            group_by: q("group_by"),
            records: q("records").and_then(|v| v.parse().ok()),
        }
    }
}

/// The budget object of `tenant`.
pub fn stub(env: &Env, tenant: &str) -> Result<Stub> {
    env.durable_object("BUDGET")?
        .id_from_name(tenant)?
        .get_stub()
}

/// Makes `call` on the budget object behind `stub`.
pub async fn call<T: DeserializeOwned>(stub: &Stub, call: &BudgetCall) -> Result<T> {
    let mut init = RequestInit::new();
    init.with_method(Method::Post)
        .with_body(Some(serde_json::to_string(call)?.into()));
    let req = Request::new_with_init("https://budget/", &init)?;
    stub.fetch_with_request(req).await?.json().await
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
    /// The token's user and feature tag: their sub-limits apply too.
    #[serde(default)]
    pub user: String,
    #[serde(default)]
    pub feature: String,
}

/// What the budget answered to a hold.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct HoldAnswer {
    pub admitted: bool,
    /// Why not, when refused: `budget`, `concurrency` or `rate`.
    #[serde(default)]
    pub refused_for: Option<String>,
    /// Whose limit refused it: `tenant`, `user` or `feature`.
    #[serde(default)]
    pub scope: Option<String>,
    /// For `budget`: the window that is used up, `day` or `month`.
    #[serde(default)]
    pub window: Option<String>,
    /// For `rate`: seconds until the window has room again.
    #[serde(default)]
    pub retry_after_s: Option<i64>,
    /// For `budget`: what is spent leaves room for the request, and only the holds of
    /// requests in flight fill it; it may fit once they settle.
    #[serde(default)]
    pub holds_in_flight_block: bool,
    /// What is left in the refusing scope's window (or the tenant's day when admitted).
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
    /// The page's router, policy and quality-model versions, from the envelope.
    #[serde(default)]
    pub router_version: String,
    pub policy_version: String,
    #[serde(default)]
    pub quality_model_version: String,
    /// The page's edge model (GGUF SHA-256) and the model the upstream says answered.
    #[serde(default)]
    pub edge_model_sha256: String,
    #[serde(default)]
    pub upstream_model: String,
    /// Tokens used past a growing hold, and so not billed.
    #[serde(default)]
    pub unbilled_tokens: i64,
    pub tokens_in: i64,
    pub tokens_out: i64,
    pub usd: f64,
    pub ttfb_ms: i64,
    pub total_ms: i64,
    /// `ok`, `upstream_error`, `client_gone`, …
    pub outcome: String,
    /// Answered by a failover upstream after the first choice failed.
    #[serde(default)]
    pub degraded: bool,
    /// An edge answer's cloud price at the first upstream's rates: what it saved.
    #[serde(default)]
    pub saved_usd: f64,
    /// The page's cascade handed this answer to the cloud mid-stream.
    #[serde(default)]
    pub escalated_mid_stream: bool,
    /// The page's completion id, which its user's feedback names.
    #[serde(default)]
    pub answer_id: String,
    /// A verify call's drafted tokens and how many of them the cloud accepted.
    #[serde(default)]
    pub draft_tokens: i64,
    #[serde(default)]
    pub accepted_tokens: i64,
    /// The user's reward for the answer (0–1), once the page reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reward: Option<f64>,
}

/// The Durable Object.
#[durable_object(alarm)]
pub struct TenantBudget {
    state: State,
    sql: SqlStorage,
}

const DAY_MS: i64 = 86_400_000;
/// What usage may be grouped by.
const GROUP_BY: &str = "user, session, feature, model, outcome, upstream, degraded, route, \
                        router_version, policy_version, quality_model_version, edge_model, upstream_model";
/// Most records one usage call lists.
const MAX_RECORDS: i64 = 1000;
/// JavaScript's largest safe integer: SQLite values cross into JS.
const MAX_SAFE: i64 = 9_007_199_254_740_991;

/// Schema versions, applied in order once each; a deployed object upgrades in place.
const MIGRATIONS: &[&[&str]] = &[
    &[
        "CREATE TABLE IF NOT EXISTS limits (id INTEGER PRIMARY KEY CHECK (id = 1), json TEXT NOT NULL)",
        "CREATE TABLE IF NOT EXISTS spend (day INTEGER PRIMARY KEY, usd REAL NOT NULL, tokens INTEGER NOT NULL)",
        "CREATE TABLE IF NOT EXISTS holds (id TEXT PRIMARY KEY, usd REAL NOT NULL, tokens INTEGER NOT NULL, expires_ms INTEGER NOT NULL)",
        "CREATE TABLE IF NOT EXISTS records (id TEXT PRIMARY KEY, ts_ms INTEGER NOT NULL, json TEXT NOT NULL, \
         user TEXT, session TEXT, feature TEXT, model TEXT, tokens_in INTEGER, tokens_out INTEGER, usd REAL, outcome TEXT)",
    ],
    // Per-user and per-feature spend beside the tenant's; holds that know whose they are.
    &[
        "ALTER TABLE holds ADD COLUMN user TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE holds ADD COLUMN feature TEXT NOT NULL DEFAULT ''",
        "CREATE TABLE spending (scope TEXT NOT NULL, key TEXT NOT NULL, day INTEGER NOT NULL, \
         usd REAL NOT NULL, tokens INTEGER NOT NULL, PRIMARY KEY (scope, key, day))",
        "INSERT INTO spending (scope, key, day, usd, tokens) SELECT 'tenant', '', day, usd, tokens FROM spend",
        "DROP TABLE spend",
        "CREATE INDEX records_ts ON records (ts_ms)",
        "CREATE INDEX records_user ON records (user, ts_ms)",
        "CREATE INDEX records_feature ON records (feature, ts_ms)",
    ],
    // Usage by upstream and by whether a failover answered.
    &[
        "ALTER TABLE records ADD COLUMN upstream TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE records ADD COLUMN degraded INTEGER NOT NULL DEFAULT 0",
    ],
    // Feedback finds its answer within the caller's session.
    &["CREATE INDEX records_session ON records (session, ts_ms)"],
];

/// Whose limits a check reads: the tenant's, one user's or one feature's.
#[derive(Clone, Copy)]
enum Scope<'a> {
    Tenant,
    User(&'a str),
    Feature(&'a str),
}

impl<'a> Scope<'a> {
    fn name(self) -> &'static str {
        match self {
            Scope::Tenant => "tenant",
            Scope::User(_) => "user",
            Scope::Feature(_) => "feature",
        }
    }

    fn key(self) -> &'a str {
        match self {
            Scope::Tenant => "",
            Scope::User(k) | Scope::Feature(k) => k,
        }
    }

    /// The condition that picks this scope's rows of `holds` and `records` (the column names
    /// are fixed here, never taken from input), with its parameters.
    fn filter(self) -> (&'static str, Vec<SqlStorageValue>) {
        match self {
            Scope::Tenant => ("1 = 1", vec![]),
            Scope::User(u) => ("user = ?", vec![SqlStorageValue::from(u)]),
            Scope::Feature(f) => ("feature = ?", vec![SqlStorageValue::from(f)]),
        }
    }
}

/// The day of the month (1-based) of a day counted from 1970-01-01, in the proleptic
/// Gregorian calendar (Howard Hinnant's `civil_from_days`).
fn day_of_month(days: i64) -> i64 {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    doy - (153 * mp + 2) / 5 + 1
}

/// The first day of the month that `day` is in.
fn month_start(day: i64) -> i64 {
    day - (day_of_month(day) - 1)
}

impl DurableObject for TenantBudget {
    fn new(state: State, _env: Env) -> Self {
        let sql = state.storage().sql();
        if let Err(e) = migrate(&sql) {
            // The first query then fails with the real error, which the caller reports.
            worker::console_error!("budget schema migration failed: {e}");
        }
        TenantBudget { state, sql }
    }

    async fn fetch(&self, mut req: Request) -> Result<Response> {
        match req.json::<BudgetCall>().await? {
            BudgetCall::Hold(hold) => {
                let answer = self.hold(&hold)?;
                if answer.admitted {
                    self.reclaim_at(hold.expires_ms, hold.now_ms).await?;
                }
                Response::from_json(&answer)
            }
            BudgetCall::Extend(more) => Response::from_json(&self.extend(&more)?),
            BudgetCall::Settle { hold_id, record } => {
                self.settle(&hold_id, &record)?;
                Response::from_json(&serde_json::json!({"settled": true}))
            }
            BudgetCall::EdgeRecords(records) => {
                let new = records
                    .iter()
                    .map(|r| self.insert_record(r))
                    .sum::<Result<usize>>()?;
                Response::from_json(
                    &serde_json::json!({"recorded": new, "duplicates": records.len() - new}),
                )
            }
            BudgetCall::Feedback { session, feedback } => {
                let found = feedback
                    .iter()
                    .map(|f| self.reward(&session, f))
                    .sum::<Result<usize>>()?;
                Response::from_json(
                    &serde_json::json!({"recorded": found, "unknown": feedback.len() - found}),
                )
            }
            BudgetCall::PutTenant(tenant) => {
                self.sql.exec(
                    "INSERT INTO limits (id, json) VALUES (1, ?) ON CONFLICT(id) DO UPDATE SET json = excluded.json",
                    vec![SqlStorageValue::from(serde_json::to_string(&tenant)?)],
                )?;
                Response::from_json(&tenant)
            }
            BudgetCall::Tenant => Response::from_json(&self.tenant()?),
            BudgetCall::Usage(q) => {
                let (from, to) = (q.from.unwrap_or(0), q.to.unwrap_or(MAX_SAFE));
                let now = js_sys::Date::now() as i64;
                let mut usage = self.usage(from, to, q.group_by.as_deref(), now)?;
                // The newest records themselves, for an audit of single requests.
                if let Some(n) = q.records {
                    usage["records"] = self.records(from, to, n.clamp(0, MAX_RECORDS))?;
                }
                Response::from_json(&usage)
            }
        }
    }

    /// Reclaims the holds whose worker never settled them, then waits for the next to expire.
    async fn alarm(&self) -> Result<Response> {
        let now = js_sys::Date::now() as i64;
        self.sql.exec(
            "DELETE FROM holds WHERE expires_ms <= ?",
            vec![SqlStorageValue::from(now)],
        )?;
        if let Some(next) = self.next_expiry()? {
            self.state.storage().set_alarm((next - now).max(1)).await?;
        }
        Response::ok("reclaimed")
    }
}

fn migrate(sql: &SqlStorage) -> Result<()> {
    sql.exec(
        "CREATE TABLE IF NOT EXISTS schema_version (id INTEGER PRIMARY KEY CHECK (id = 1), version INTEGER NOT NULL)",
        None,
    )?;
    #[derive(Deserialize)]
    struct Version {
        version: i64,
    }
    let rows: Vec<Version> = sql
        .exec("SELECT version FROM schema_version WHERE id = 1", None)?
        .to_array()?;
    let current = rows.first().map_or(0, |r| r.version);
    for (version, statements) in MIGRATIONS.iter().enumerate().skip(current as usize) {
        for stmt in *statements {
            sql.exec(stmt, None)?;
        }
        sql.exec(
            "INSERT INTO schema_version (id, version) VALUES (1, ?) ON CONFLICT(id) DO UPDATE SET version = excluded.version",
            vec![SqlStorageValue::from(version as i64 + 1)],
        )?;
    }
    Ok(())
}

#[derive(Deserialize)]
struct Sums {
    usd: Option<f64>,
    tokens: Option<i64>,
    n: Option<i64>,
}

/// What a scope has spent, holds and did lately, read once per hold.
struct Standing {
    day_usd: f64,
    day_tokens: i64,
    month_usd: f64,
    month_tokens: i64,
    held_usd: f64,
    held_tokens: i64,
    in_flight: i64,
    /// Requests started and tokens used in the last minute, with the oldest start.
    minute_requests: i64,
    minute_tokens: i64,
    minute_oldest: Option<i64>,
}

impl TenantBudget {
    fn tenant(&self) -> Result<Tenant> {
        let saved = json_rows(&self.sql, "SELECT json FROM limits WHERE id = 1", vec![])?;
        Ok(saved.into_iter().next().unwrap_or_default())
    }

    fn sums(&self, query: &str, params: Vec<SqlStorageValue>) -> Result<(f64, i64, i64)> {
        let rows: Vec<Sums> = self.sql.exec(query, params)?.to_array()?;
        let s = rows.first();
        Ok((
            s.and_then(|s| s.usd).unwrap_or(0.0),
            s.and_then(|s| s.tokens).unwrap_or(0),
            s.and_then(|s| s.n).unwrap_or(0),
        ))
    }

    fn standing(&self, scope: Scope, now_ms: i64, with_rate: bool) -> Result<Standing> {
        let day = now_ms.div_euclid(DAY_MS);
        let spent = |from_day: i64| {
            self.sums(
                "SELECT SUM(usd) AS usd, SUM(tokens) AS tokens, 0 AS n FROM spending \
                 WHERE scope = ? AND key = ? AND day BETWEEN ? AND ?",
                vec![
                    SqlStorageValue::from(scope.name()),
                    SqlStorageValue::from(scope.key()),
                    SqlStorageValue::from(from_day),
                    SqlStorageValue::from(day),
                ],
            )
        };
        let (day_usd, day_tokens, _) = spent(day)?;
        let (month_usd, month_tokens, _) = spent(month_start(day))?;
        let (condition, params) = scope.filter();
        let (held_usd, held_tokens, in_flight) = self.sums(
            &format!(
                "SELECT SUM(usd) AS usd, SUM(tokens) AS tokens, COUNT(*) AS n FROM holds WHERE {condition}"
            ),
            params.clone(),
        )?;
        let mut standing = Standing {
            day_usd,
            day_tokens,
            month_usd,
            month_tokens,
            held_usd,
            held_tokens,
            in_flight,
            minute_requests: 0,
            minute_tokens: 0,
            minute_oldest: None,
        };
        if with_rate {
            #[derive(Deserialize)]
            struct Window {
                tokens: Option<i64>,
                n: Option<i64>,
                oldest: Option<i64>,
            }
            let mut window_params = vec![SqlStorageValue::from(now_ms - 60_000)];
            window_params.extend(params);
            let rows: Vec<Window> = self
                .sql
                .exec(
                    &format!(
                        "SELECT SUM(tokens_in + tokens_out) AS tokens, COUNT(*) AS n, MIN(ts_ms) AS oldest \
                         FROM records WHERE ts_ms >= ? AND {condition}"
                    ),
                    window_params,
                )?
                .to_array()?;
            let w = rows.first();
            standing.minute_requests = w.and_then(|w| w.n).unwrap_or(0);
            standing.minute_tokens = w.and_then(|w| w.tokens).unwrap_or(0);
            standing.minute_oldest = w.and_then(|w| w.oldest);
        }
        Ok(standing)
    }

    /// Whether `limits` of `scope` admit `h`: `None`, or the refusal. An extension of a hold
    /// in flight is a request already counted: only its tokens and spend are checked.
    fn check(
        &self,
        scope: Scope,
        limits: &Limits,
        h: &Hold,
        extending: bool,
    ) -> Result<Option<HoldAnswer>> {
        let with_rate = limits.requests_per_minute.is_some() || limits.tokens_per_minute.is_some();
        let s = self.standing(scope, h.now_ms, with_rate)?;
        let refusal = |why: &str| HoldAnswer {
            admitted: false,
            refused_for: Some(why.into()),
            scope: Some(scope.name().into()),
            ..HoldAnswer::default()
        };
        if !extending && limits.max_concurrent.is_some_and(|m| s.in_flight >= m) {
            return Ok(Some(refusal("concurrency")));
        }
        if with_rate {
            // The window holds the requests that started in the last minute, plus every
            // request still in flight (counted at its worst case).
            let requests = s.minute_requests + s.in_flight;
            let tokens = s.minute_tokens + s.held_tokens;
            let over = (!extending && limits.requests_per_minute.is_some_and(|m| requests >= m))
                || limits
                    .tokens_per_minute
                    .is_some_and(|m| tokens + h.tokens > m);
            if over {
                let oldest = s.minute_oldest.unwrap_or(h.now_ms);
                let wait_ms = (oldest + 60_000 - h.now_ms).clamp(1_000, 60_000);
                return Ok(Some(HoldAnswer {
                    retry_after_s: Some((wait_ms + 999) / 1000),
                    ..refusal("rate")
                }));
            }
        }
        let windows = [
            (
                "day",
                limits.daily_usd,
                limits.daily_tokens,
                s.day_usd,
                s.day_tokens,
            ),
            (
                "month",
                limits.monthly_usd,
                limits.monthly_tokens,
                s.month_usd,
                s.month_tokens,
            ),
        ];
        for (window, usd_limit, token_limit, spent_usd, spent_tokens) in windows {
            let remaining_usd = usd_limit.map(|l| l - spent_usd - s.held_usd);
            let remaining_tokens = token_limit.map(|l| l - spent_tokens - s.held_tokens);
            if remaining_usd.is_some_and(|r| h.usd > r)
                || remaining_tokens.is_some_and(|r| h.tokens > r)
            {
                let fits_spent = usd_limit.is_none_or(|l| h.usd <= l - spent_usd)
                    && token_limit.is_none_or(|l| h.tokens <= l - spent_tokens);
                return Ok(Some(HoldAnswer {
                    holds_in_flight_block: fits_spent,
                    window: Some(window.into()),
                    remaining_usd: remaining_usd.map(|r| r.max(0.0)),
                    remaining_tokens: remaining_tokens.map(|r| r.max(0)),
                    ..refusal("budget")
                }));
            }
        }
        Ok(None)
    }

    /// The first refusal of `h` by the tenant's, its user's or its feature's limits.
    fn refusal(&self, tenant: &Tenant, h: &Hold, extending: bool) -> Result<Option<HoldAnswer>> {
        let mut scopes = vec![(Scope::Tenant, &tenant.limits)];
        if let Some(per_user) = &tenant.per_user {
            scopes.push((Scope::User(&h.user), per_user));
        }
        if let Some(limits) = tenant.feature_limits(&h.feature) {
            scopes.push((Scope::Feature(&h.feature), limits));
        }
        for (scope, limits) in scopes {
            if let Some(refusal) = self.check(scope, limits, h, extending)? {
                return Ok(Some(refusal));
            }
        }
        Ok(None)
    }

    fn hold(&self, h: &Hold) -> Result<HoldAnswer> {
        // Holds of workers that never settled are reclaimed first (the alarm may be late).
        self.sql.exec(
            "DELETE FROM holds WHERE expires_ms <= ?",
            vec![SqlStorageValue::from(h.now_ms)],
        )?;
        let tenant = self.tenant()?;
        if let Some(refusal) = self.refusal(&tenant, h, false)? {
            return Ok(refusal);
        }
        self.sql.exec(
            "INSERT INTO holds (id, usd, tokens, expires_ms, user, feature) VALUES (?, ?, ?, ?, ?, ?)",
            vec![
                SqlStorageValue::from(h.id.as_str()),
                SqlStorageValue::from(h.usd),
                SqlStorageValue::from(h.tokens),
                SqlStorageValue::from(h.expires_ms),
                SqlStorageValue::from(h.user.as_str()),
                SqlStorageValue::from(h.feature.as_str()),
            ],
        )?;
        let s = self.standing(Scope::Tenant, h.now_ms, false)?;
        Ok(HoldAnswer {
            admitted: true,
            remaining_usd: tenant.limits.daily_usd.map(|l| l - s.day_usd - s.held_usd),
            remaining_tokens: tenant
                .limits
                .daily_tokens
                .map(|l| l - s.day_tokens - s.held_tokens),
            ..HoldAnswer::default()
        })
    }

    /// Grows the hold `more.id` by `more`'s spend and tokens, if every limit still admits
    /// them. Refused when the hold is gone (settled, or reclaimed after its worker died).
    fn extend(&self, more: &Hold) -> Result<HoldAnswer> {
        let (_, _, live) = self.sums(
            "SELECT 0.0 AS usd, 0 AS tokens, COUNT(*) AS n FROM holds WHERE id = ?",
            vec![SqlStorageValue::from(more.id.as_str())],
        )?;
        if live == 0 {
            return Ok(HoldAnswer {
                refused_for: Some("hold_gone".into()),
                ..HoldAnswer::default()
            });
        }
        if let Some(refusal) = self.refusal(&self.tenant()?, more, true)? {
            return Ok(refusal);
        }
        self.sql.exec(
            "UPDATE holds SET usd = usd + ?, tokens = tokens + ? WHERE id = ?",
            vec![
                SqlStorageValue::from(more.usd),
                SqlStorageValue::from(more.tokens),
                SqlStorageValue::from(more.id.as_str()),
            ],
        )?;
        Ok(HoldAnswer {
            admitted: true,
            ..HoldAnswer::default()
        })
    }

    fn next_expiry(&self) -> Result<Option<i64>> {
        #[derive(Deserialize)]
        struct Next {
            next: Option<i64>,
        }
        let rows: Vec<Next> = self
            .sql
            .exec("SELECT MIN(expires_ms) AS next FROM holds", None)?
            .to_array()?;
        Ok(rows.first().and_then(|r| r.next))
    }

    /// Makes sure the alarm rings by `expires_ms`, when the hold would be reclaimed.
    async fn reclaim_at(&self, expires_ms: i64, now_ms: i64) -> Result<()> {
        let storage = self.state.storage();
        let due = storage.get_alarm().await?;
        if due.is_none_or(|d| d > expires_ms) {
            storage.set_alarm((expires_ms - now_ms).max(1)).await?;
        }
        Ok(())
    }

    /// Replaces the hold with what was actually spent and writes the cost record (once: a
    /// repeated settle of the same id changes nothing).
    fn settle(&self, hold_id: &str, r: &Record) -> Result<()> {
        self.sql.exec(
            "DELETE FROM holds WHERE id = ?",
            vec![SqlStorageValue::from(hold_id)],
        )?;
        if self.is_recorded(&r.id)? {
            return Ok(());
        }
        let mut scopes = vec![Scope::Tenant, Scope::User(&r.user)];
        if !r.feature.is_empty() {
            scopes.push(Scope::Feature(&r.feature));
        }
        for scope in scopes {
            self.sql.exec(
                "INSERT INTO spending (scope, key, day, usd, tokens) VALUES (?, ?, ?, ?, ?) \
                 ON CONFLICT(scope, key, day) DO UPDATE SET usd = usd + excluded.usd, tokens = tokens + excluded.tokens",
                vec![
                    SqlStorageValue::from(scope.name()),
                    SqlStorageValue::from(scope.key()),
                    SqlStorageValue::from(r.ts_ms.div_euclid(DAY_MS)),
                    SqlStorageValue::from(r.usd),
                    SqlStorageValue::from(r.tokens_in + r.tokens_out),
                ],
            )?;
        }
        self.write_record(r)
    }

    /// Whether a record with this id exists: a retried settle or report counts once.
    fn is_recorded(&self, id: &str) -> Result<bool> {
        let (_, _, n) = self.sums(
            "SELECT 0.0 AS usd, 0 AS tokens, COUNT(*) AS n FROM records WHERE id = ?",
            vec![SqlStorageValue::from(id)],
        )?;
        Ok(n > 0)
    }

    /// Writes `r` unless its id is recorded already; 1 if it was written. Spending is the
    /// caller's (an edge answer spends nothing).
    fn insert_record(&self, r: &Record) -> Result<usize> {
        if self.is_recorded(&r.id)? {
            return Ok(0);
        }
        self.write_record(r).map(|()| 1)
    }

    /// Writes `r`, whose id the caller has checked is new.
    fn write_record(&self, r: &Record) -> Result<()> {
        self.sql.exec(
            "INSERT INTO records (id, ts_ms, json, user, session, feature, model, tokens_in, tokens_out, usd, outcome, upstream, degraded) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
                SqlStorageValue::from(r.upstream.as_str()),
                SqlStorageValue::from(i64::from(r.degraded)),
            ],
        )?;
        Ok(())
    }

    /// Sets the reward of the answer `f` names in `session`: 1 when there is one, else 0.
    /// An answer of several records (a speculative one's verify calls) carries it on its
    /// first, so each answer counts once in the mean.
    fn reward(&self, session: &str, f: &Feedback) -> Result<usize> {
        let rows: Vec<serde::de::IgnoredAny> = self
            .sql
            .exec(
                "UPDATE records SET json = json_set(json, '$.reward', ?) WHERE id = \
                 (SELECT id FROM records WHERE session = ? AND json_extract(json, '$.answer_id') = ? \
                  ORDER BY ts_ms, id LIMIT 1) RETURNING id",
                vec![
                    SqlStorageValue::from(f.reward),
                    SqlStorageValue::from(session),
                    SqlStorageValue::from(f.id.as_str()),
                ],
            )?
            .to_array()?;
        Ok(rows.len().min(1))
    }

    fn records(&self, from: i64, to: i64, limit: i64) -> Result<serde_json::Value> {
        let records: Vec<serde_json::Value> = json_rows(
            &self.sql,
            "SELECT json FROM records WHERE ts_ms >= ? AND ts_ms < ? ORDER BY ts_ms DESC LIMIT ?",
            vec![
                SqlStorageValue::from(from),
                SqlStorageValue::from(to),
                SqlStorageValue::from(limit),
            ],
        )?;
        Ok(serde_json::Value::Array(records))
    }

    fn usage(
        &self,
        from: i64,
        to: i64,
        group_by: Option<&str>,
        now_ms: i64,
    ) -> Result<serde_json::Value> {
        #[derive(Serialize, Deserialize)]
        struct Group {
            key: Option<String>,
            requests: i64,
            tokens_in: Option<i64>,
            tokens_out: Option<i64>,
            usd: Option<f64>,
            saved_usd: Option<f64>,
            /// Of the group's answers, the share the cloud gave: with edge usage reported,
            /// the escalation rate, so a router or model update that moves it shows here.
            cloud_share: Option<f64>,
            /// The share the page's cascade handed to the cloud mid-stream.
            cascade_rate: Option<f64>,
            /// Of the tokens the page drafted for the cloud to verify, the share accepted.
            speculative_acceptance: Option<f64>,
            /// The users' mean reward, over the answers they rated, and how many they rated.
            feedback_reward: Option<f64>,
            feedback_count: i64,
        }
        // The column comes from this list, never from the query string.
        let column = match group_by {
            None => "'all'",
            Some("user") => "user",
            Some("session") => "session",
            Some("feature") => "feature",
            Some("model") => "model",
            Some("outcome") => "outcome",
            Some("upstream") => "upstream",
            Some("degraded") => "CASE degraded WHEN 1 THEN 'degraded' ELSE 'first_choice' END",
            Some("route") => "CASE outcome WHEN 'edge' THEN 'edge' ELSE 'cloud' END",
            // Versions live in the record's JSON: a model or router update shows as a new key.
            Some("router_version") => "json_extract(json, '$.router_version')",
            Some("policy_version") => "json_extract(json, '$.policy_version')",
            Some("quality_model_version") => "json_extract(json, '$.quality_model_version')",
            Some("edge_model") => "json_extract(json, '$.edge_model_sha256')",
            Some("upstream_model") => "json_extract(json, '$.upstream_model')",
            Some(other) => {
                return Ok(serde_json::json!({
                    "error": format!("group_by must be one of {GROUP_BY}, not {other:?}")
                }));
            }
        };
        let rows: Vec<Group> = self
            .sql
            .exec(
                &format!(
                    "SELECT {column} AS key, COUNT(*) AS requests, SUM(tokens_in) AS tokens_in, \
                     SUM(tokens_out) AS tokens_out, SUM(usd) AS usd, \
                     SUM(COALESCE(json_extract(json, '$.saved_usd'), 0)) AS saved_usd, \
                     AVG(CASE outcome WHEN 'edge' THEN 0.0 ELSE 1.0 END) AS cloud_share, \
                     AVG(CASE json_extract(json, '$.escalated_mid_stream') WHEN 1 THEN 1.0 ELSE 0.0 END) AS cascade_rate, \
                     SUM(COALESCE(json_extract(json, '$.accepted_tokens'), 0)) * 1.0 \
                       / NULLIF(SUM(COALESCE(json_extract(json, '$.draft_tokens'), 0)), 0) AS speculative_acceptance, \
                     AVG(json_extract(json, '$.reward')) AS feedback_reward, \
                     COUNT(json_extract(json, '$.reward')) AS feedback_count \
                     FROM records \
                     WHERE ts_ms >= ? AND ts_ms < ? GROUP BY key ORDER BY key"
                ),
                vec![SqlStorageValue::from(from), SqlStorageValue::from(to)],
            )?
            .to_array()?;
        let s = self.standing(Scope::Tenant, now_ms, false)?;
        Ok(serde_json::json!({
            "groups": rows,
            "in_flight": s.in_flight,
            "held": {"usd": s.held_usd, "tokens": s.held_tokens},
            "today": {"usd": s.day_usd, "tokens": s.day_tokens},
            "this_month": {"usd": s.month_usd, "tokens": s.month_tokens},
            "tenant": self.tenant()?,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn months_start_on_the_first() {
        // Days since 1970-01-01, checked against Python's datetime.
        assert_eq!(day_of_month(0), 1);
        assert_eq!(day_of_month(20_787), 30); // 2026-11-30
        assert_eq!(month_start(20_787), 20_787 - 29);
        assert_eq!(month_start(20_788), 20_788); // 2026-12-01
        assert_eq!(day_of_month(19_782), 29); // 2024-02-29
        assert_eq!(day_of_month(11_017), 1); // 2000-03-01
        assert_eq!(day_of_month(-1), 31); // 1969-12-31
    }
}
