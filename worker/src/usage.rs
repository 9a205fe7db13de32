//! `POST /v1/usage/edge`: the page's report of the answers it gave on the device, written as
//! records beside the cloud's (outcome `edge`, no spend, and what the cloud would have
//! charged as `saved_usd`), so usage by user, feature and session covers both tiers.

use straddle_protocol::{EdgeAnswer, EdgeUsageReport};
use straddle_router::price::Price;
use worker::{Env, Request, Response, Result};

use crate::admission::{Caller, caller, cost_usd, json_body};
use crate::budget::{self, BudgetCall, Record};
use crate::clock::now_ms;
use crate::error::{Refusal, respond};
use crate::forward::upstream_list;

/// `POST /v1/usage/edge`.
pub async fn edge(req: Request, env: &Env) -> Result<Response> {
    respond(record(req, env).await)
}

async fn record(mut req: Request, env: &Env) -> std::result::Result<Response, Refusal> {
    let caller = caller(&req, env).await?;
    let (_, report) = json_body::<EdgeUsageReport>(&mut req).await?;
    report.validate()?;
    // What the first upstream would have charged: the cloud spend the device saved.
    let price = upstream_list(env)
        .unwrap_or_default()
        .into_iter()
        .min_by_key(|u| u.priority)
        .map(|u| u.price())
        .unwrap_or_default();
    let now = now_ms();
    let records: Vec<Record> = report
        .answers
        .iter()
        .map(|a| edge_record(&caller, a, price, now))
        .collect();
    let written: serde_json::Value =
        budget::call(&caller.stub, &BudgetCall::EdgeRecords(records)).await?;
    Ok(Response::from_json(&written)?)
}

/// The record of one edge answer, attributed to the token's user, session and feature, with
/// what the cloud would have charged for it at `price`.
fn edge_record(caller: &Caller, a: &EdgeAnswer, price: Price, now: i64) -> Record {
    let (tokens_in, tokens_out) = (i64::from(a.prompt_tokens), i64::from(a.completion_tokens));
    Record {
        // Namespaced, so a page's id can never match a cloud request's hold.
        id: format!("edge:{}:{}", caller.claims.sid, a.id),
        ts_ms: now,
        user: caller.claims.sub.clone(),
        session: caller.claims.sid.clone(),
        feature: caller.claims.feat.clone().unwrap_or_default(),
        model: a.model.clone(),
        upstream: "edge".into(),
        route_reason: a.reasons.join("; "),
        router_version: a.router_version.clone(),
        policy_version: a.policy_version.clone(),
        quality_model_version: a.quality_model_version.clone(),
        edge_model_sha256: a.edge_model_sha256.clone(),
        answer_id: a.id.clone(),
        tokens_in,
        tokens_out,
        saved_usd: cost_usd(price, tokens_in, tokens_out),
        ttfb_ms: a.ttft_ms.unwrap_or(0.0) as i64,
        total_ms: a.latency_ms as i64,
        outcome: "edge".into(),
        ..Record::default()
    }
}
