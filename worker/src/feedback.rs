//! `POST /v1/feedback`: the user's reward for answers the page gave, by the page's completion
//! ids, set on those answers' records in the caller's session (edge and cloud alike), so that
//! usage by version reports the reward each router, policy or model earned.

use straddle_protocol::FeedbackReport;
use worker::{Env, Request, Response, Result};

use crate::admission::{caller, json_body};
use crate::budget::{self, BudgetCall};
use crate::error::{Refusal, respond};

/// `POST /v1/feedback`.
pub async fn feedback(req: Request, env: &Env) -> Result<Response> {
    respond(record(req, env).await)
}

async fn record(mut req: Request, env: &Env) -> std::result::Result<Response, Refusal> {
    let caller = caller(&req, env).await?;
    let (_, report) = json_body::<FeedbackReport>(&mut req).await?;
    report.validate()?;
    let call = BudgetCall::Feedback {
        session: caller.claims.sid.clone(),
        feedback: report.feedback,
    };
    let written: serde_json::Value = budget::call(&caller.stub, &call).await?;
    Ok(Response::from_json(&written)?)
}
