//! Upstream health shared by every isolate of the deployment: one Durable Object keeps each
//! upstream's circuit breaker, so an upstream that trips in one isolate is skipped by all,
//! and after its open period a single probe, from whichever isolate asks first, half-opens
//! it. The breaker's logic is `upstreams::Breaker`; this file only keeps it and answers.
//! A deployment without the `HEALTH` binding (or an object that cannot be reached) falls
//! back to breakers kept in each isolate.

use std::cell::RefCell;

use serde::{Deserialize, Serialize};
use worker::{
    DurableObject, Env, Method, Request, RequestInit, Response, Result, SqlStorage,
    SqlStorageValue, State, durable_object,
};

use crate::clock::now_ms;
use crate::sql::json_rows;
use crate::upstreams::{Admission, Breaker, Breakers, Upstream};

thread_local! {
    /// This isolate's own breakers, for a deployment without the shared object.
    static LOCAL: RefCell<Breakers> = RefCell::new(Breakers::default());
}

/// A call to the health object.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "call", rename_all = "snake_case")]
enum Call {
    /// May a request go to `upstream` now? Takes the half-open probe, leased for
    /// `probe_lease_ms`, when one is due.
    Admit {
        upstream: String,
        probe_lease_ms: i64,
    },
    /// How a request to `upstream` went; a failure that opens it opens it for `open_ms`.
    Report {
        upstream: String,
        ok: bool,
        open_ms: i64,
    },
}

/// The Durable Object (one instance, named `deployment`).
#[durable_object(fetch)]
pub struct UpstreamHealth {
    sql: SqlStorage,
}

impl DurableObject for UpstreamHealth {
    fn new(state: State, _env: Env) -> Self {
        let sql = state.storage().sql();
        if let Err(e) = sql.exec(
            "CREATE TABLE IF NOT EXISTS breakers (upstream TEXT PRIMARY KEY, json TEXT NOT NULL)",
            None,
        ) {
            worker::console_error!("upstream health schema failed: {e}");
        }
        UpstreamHealth { sql }
    }

    async fn fetch(&self, mut req: Request) -> Result<Response> {
        let now = now_ms();
        match req.json::<Call>().await? {
            Call::Admit {
                upstream,
                probe_lease_ms,
            } => {
                let mut b = self.load(&upstream)?;
                let allowed = b.allow(now, probe_lease_ms);
                self.store(&upstream, &b)?;
                Response::from_json(&Admission {
                    allowed,
                    failures: b.failures,
                })
            }
            Call::Report {
                upstream,
                ok,
                open_ms,
            } => {
                let mut b = self.load(&upstream)?;
                if ok {
                    b.success();
                } else {
                    b.failure(now, open_ms);
                }
                self.store(&upstream, &b)?;
                Response::from_json(&b.failures)
            }
        }
    }
}

impl UpstreamHealth {
    fn load(&self, upstream: &str) -> Result<Breaker> {
        let saved = json_rows(
            &self.sql,
            "SELECT json FROM breakers WHERE upstream = ?",
            vec![SqlStorageValue::from(upstream)],
        )?;
        Ok(saved.into_iter().next().unwrap_or_default())
    }

    fn store(&self, upstream: &str, b: &Breaker) -> Result<()> {
        self.sql.exec(
            "INSERT INTO breakers (upstream, json) VALUES (?, ?) \
             ON CONFLICT(upstream) DO UPDATE SET json = excluded.json",
            vec![
                SqlStorageValue::from(upstream),
                SqlStorageValue::from(serde_json::to_string(b)?),
            ],
        )?;
        Ok(())
    }
}

/// Asks the health object.
async fn ask<T: serde::de::DeserializeOwned>(env: &Env, call: &Call) -> Result<T> {
    let stub = env
        .durable_object("HEALTH")?
        .id_from_name("deployment")?
        .get_stub()?;
    let mut init = RequestInit::new();
    init.with_method(Method::Post)
        .with_body(Some(serde_json::to_string(call)?.into()));
    let req = Request::new_with_init("https://health/", &init)?;
    let mut resp = stub.fetch_with_request(req).await?;
    if resp.status_code() != 200 {
        return Err(worker::Error::RustError(format!(
            "upstream health answered {}",
            resp.status_code()
        )));
    }
    resp.json().await
}

/// Whether a request may go to `up` now, by the deployment's breaker (this isolate's when
/// the shared one cannot be asked).
pub async fn admit(env: &Env, up: &Upstream) -> Admission {
    // A probe's outcome is known once headers arrive, so its lease is the first-byte wait.
    let probe_lease_ms = up.first_byte_timeout_ms as i64 + 1_000;
    let call = Call::Admit {
        upstream: up.name.clone(),
        probe_lease_ms,
    };
    match ask(env, &call).await {
        Ok(admission) => admission,
        Err(e) => {
            worker::console_warn!("upstream health unavailable, using this isolate's: {e}");
            LOCAL.with(|b| b.borrow_mut().admit(&up.name, now_ms(), probe_lease_ms))
        }
    }
}

/// Records how a request to `up` went; a success is worth a call only after failures.
pub async fn report(env: &Env, up: &Upstream, admitted: Admission, ok: bool) {
    let open_ms = up.breaker_open_ms as i64;
    LOCAL.with(|b| b.borrow_mut().report(&up.name, ok, now_ms(), open_ms));
    if ok && admitted.failures == 0 {
        return;
    }
    let call = Call::Report {
        upstream: up.name.clone(),
        ok,
        open_ms,
    };
    if let Err(e) = ask::<u32>(env, &call).await {
        worker::console_warn!("upstream health unavailable: {e}");
    }
}
