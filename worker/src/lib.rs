//! The edge worker's entry: routing and CORS only. Each route's logic lives in its own module.

use straddle_protocol::{ApiError, ErrorKind};
use worker::{Context, Env, Method, Request, Response, Result, Router, event};

mod auth;
pub mod budget;
mod error;
mod privacy;
mod upstream;
mod upstreams;
mod verify;

use error::error_response;

/// The CORS headers for `origin` when the deployment lists it (`ALLOWED_ORIGINS`,
/// comma-separated); a token bound to another origin is refused by `auth` anyway.
fn cors(env: &Env, origin: Option<&str>, resp: &mut Response) -> Result<()> {
    let Some(origin) = origin else {
        return Ok(());
    };
    let allowed = env
        .var("ALLOWED_ORIGINS")
        .map(|v| v.to_string())
        .unwrap_or_default();
    if allowed
        .split(',')
        .map(str::trim)
        .any(|o| o == origin || o == "*")
    {
        let h = resp.headers_mut();
        h.set("access-control-allow-origin", origin)?;
        h.set("vary", "origin")?;
        h.set(
            "access-control-allow-headers",
            "authorization, content-type",
        )?;
        h.set("access-control-allow-methods", "GET, POST, OPTIONS")?;
        h.set("access-control-max-age", "600")?;
    }
    Ok(())
}

#[event(fetch)]
async fn fetch(req: Request, env: Env, ctx: Context) -> Result<Response> {
    let origin = req.headers().get("origin").ok().flatten();
    let mut resp = if req.method() == Method::Options {
        Response::empty().map(|r| r.with_status(204))?
    } else if req.method() == Method::Post && req.path() == "/v1/chat/completions" {
        // Outside the router: streaming settles in `ctx.wait_until`.
        upstream::chat(req, &env, &ctx).await?
    } else if req.method() == Method::Post && req.path() == "/v1/verify" {
        verify::verify(req, &env).await?
    } else {
        routes(req, env.clone()).await?
    };
    cors(&env, origin.as_deref(), &mut resp)?;
    Ok(resp)
}

async fn routes(req: Request, env: Env) -> Result<Response> {
    Router::new()
        .get("/health", |_, _| {
            Response::from_json(&serde_json::json!({"status": "ok", "service": "straddle-worker"}))
        })
        .get_async("/v1/models", |_, ctx| async move {
            upstream::models(&ctx.env).await
        })
        .put_async("/v1/tenants/:id", |mut req, ctx| async move {
            let Some(tenant) = admin_tenant(&req, &ctx) else {
                return admin_refusal(&req, &ctx);
            };
            let limits: budget::Limits = match req.json().await {
                Ok(l) => l,
                Err(e) => {
                    return error_response(&ApiError::new(
                        ErrorKind::InvalidRequest,
                        format!("tenant limits: {e}"),
                    ));
                }
            };
            let stub = upstream::budget_stub(&ctx.env, &tenant)?;
            let saved: budget::Limits = upstream::budget_call(
                &stub,
                Method::Put,
                "/limits",
                Some(serde_json::to_string(&limits)?),
            )
            .await?;
            Response::from_json(&saved)
        })
        .get_async("/v1/tenants/:id/usage", |req, ctx| async move {
            let Some(tenant) = admin_tenant(&req, &ctx) else {
                return admin_refusal(&req, &ctx);
            };
            let query = req.url()?.query().map(str::to_owned).unwrap_or_default();
            let stub = upstream::budget_stub(&ctx.env, &tenant)?;
            let usage: serde_json::Value =
                upstream::budget_call(&stub, Method::Get, &format!("/usage?{query}"), None).await?;
            if let Some(message) = usage.get("error").and_then(|m| m.as_str()) {
                return error_response(&ApiError::invalid("group_by", message));
            }
            Response::from_json(&usage)
        })
        .or_else_any_method("/*path", |_, _| {
            error_response(&ApiError::new(ErrorKind::NotFound, "no such route"))
        })
        .run(req, env)
        .await
}

/// The tenant of an admin route, when the admin key is right and the id is valid.
fn admin_tenant(req: &Request, ctx: &worker::RouteContext<()>) -> Option<String> {
    auth::admin(req, &ctx.env).ok()?;
    ctx.param("id").filter(|id| auth::valid_tenant(id)).cloned()
}

fn admin_refusal(req: &Request, ctx: &worker::RouteContext<()>) -> Result<Response> {
    match auth::admin(req, &ctx.env) {
        Err(e) => error_response(&e),
        Ok(()) => error_response(&ApiError::invalid(
            "id",
            "tenant ids are 1-64 letters, digits, '-' or '_'",
        )),
    }
}
