//! The edge worker's entry: routing only. Each route's logic lives in its own module.

use straddle_protocol::{ApiError, ErrorKind};
use worker::{Context, Env, Request, Response, Result, Router, event};

mod error;
mod privacy;
mod upstream;

use error::error_response;

#[event(fetch)]
async fn fetch(req: Request, env: Env, _ctx: Context) -> Result<Response> {
    Router::new()
        .get("/health", |_, _| {
            Response::from_json(&serde_json::json!({"status": "ok", "service": "straddle-worker"}))
        })
        .post_async("/v1/chat/completions", |req, ctx| async move {
            upstream::chat(req, &ctx.env).await
        })
        .or_else_any_method("/*path", |_, _| {
            error_response(&ApiError::new(ErrorKind::NotFound, "no such route"))
        })
        .run(req, env)
        .await
}
