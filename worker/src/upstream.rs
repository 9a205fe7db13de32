//! Forwarding to the configured upstream: the body is validated here, then passed through
//! and the upstream's response (SSE included) streamed back without buffering.
//!
//! Tenant auth, budgets, failover across several upstreams and cost records are not here
//! yet (see the edge-worker issue); this is the single-upstream path the demo uses, with the
//! privacy re-check in front of it.

use straddle_protocol::{ApiError, ChatRequest, ErrorKind};
use worker::{Env, Fetch, Headers, Method, Request, RequestInit, Response, Result};

use crate::error::error_response;

/// Largest request body accepted.
const MAX_BODY: usize = 1 << 20;

/// `POST /v1/chat/completions`: validate, forward, stream back.
pub async fn chat(mut req: Request, env: &Env) -> Result<Response> {
    let body = req.bytes().await?;
    if body.len() > MAX_BODY {
        return error_response(&ApiError::new(
            ErrorKind::TooLarge,
            format!("body over {MAX_BODY} bytes"),
        ));
    }
    let parsed: ChatRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return error_response(&ApiError::from_json_error(&e)),
    };
    if let Err(e) = parsed.validate() {
        return error_response(&e);
    }
    if let Some(refusal) = crate::privacy::recheck(&parsed) {
        return error_response(&refusal);
    }
    let Ok(base) = env.var("UPSTREAM_URL").map(|v| v.to_string()) else {
        return error_response(&ApiError::new(
            ErrorKind::Unavailable,
            "no upstream configured (UPSTREAM_URL)",
        ));
    };
    let headers = Headers::new();
    headers.set("content-type", "application/json")?;
    let mut init = RequestInit::new();
    init.with_method(Method::Post)
        .with_headers(headers)
        .with_body(Some(js_sys::Uint8Array::from(body.as_slice()).into()));
    let upstream = Request::new_with_init(
        &format!("{}/v1/chat/completions", base.trim_end_matches('/')),
        &init,
    )?;
    match Fetch::Request(upstream).send().await {
        Ok(resp) => Ok(resp),
        Err(e) => error_response(&ApiError::new(
            ErrorKind::UpstreamError,
            format!("upstream unreachable: {e}"),
        )),
    }
}
