//! The edge worker's entry: routing and CORS only. Each route's logic lives in its own module.

use straddle_protocol::{ApiError, ErrorKind};
use worker::{Context, Env, Method, Request, Response, Result, Router, event};

mod admin;
mod admission;
mod auth;
pub mod budget;
mod chat;
mod clock;
mod deadline;
mod error;
mod feedback;
mod forward;
mod grow;
mod health;
pub mod origins;
mod privacy;
mod sql;
pub mod tenant;
mod upstreams;
mod usage;
mod verify;

use error::error_response;

/// Whether pages at `origin` may read this deployment's answers: the deployment lists it
/// (`ALLOWED_ORIGINS`, comma-separated) or some tenant's record does. Which tenant a request
/// spends for is checked on the request itself (`admission::caller`): a preflight has no token.
async fn origin_known(env: &Env, origin: &str) -> bool {
    let deployment = tenant::deployment_origins(
        env.var("ALLOWED_ORIGINS")
            .ok()
            .map(|v| v.to_string())
            .as_deref(),
    );
    if deployment.iter().any(|o| o == origin || o == "*") {
        return true;
    }
    origins::known(env, origin).await.unwrap_or_else(|e| {
        worker::console_warn!("origin registry unreachable: {e}");
        false
    })
}

/// Adds the CORS headers for `origin` when pages there may call.
async fn cors(env: &Env, origin: Option<&str>, resp: &mut Response) -> Result<()> {
    let Some(origin) = origin else {
        return Ok(());
    };
    if origin_known(env, origin).await {
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
        chat::chat(req, &env, &ctx).await?
    } else if req.method() == Method::Post && req.path() == "/v1/verify" {
        verify::verify(req, &env).await?
    } else if req.method() == Method::Post && req.path() == "/v1/usage/edge" {
        usage::edge(req, &env).await?
    } else if req.method() == Method::Post && req.path() == "/v1/feedback" {
        feedback::feedback(req, &env).await?
    } else {
        routes(req, env.clone()).await?
    };
    cors(&env, origin.as_deref(), &mut resp).await?;
    Ok(resp)
}

async fn routes(req: Request, env: Env) -> Result<Response> {
    Router::new()
        .get("/health", |_, _| {
            Response::from_json(&serde_json::json!({"status": "ok", "service": "straddle-worker"}))
        })
        .get_async("/v1/models", |_, ctx| async move {
            forward::models(&ctx.env).await
        })
        .get_async(
            "/v1/load",
            |_, ctx| async move { forward::load(&ctx.env).await },
        )
        .put_async("/v1/tenants/:id", |req, ctx| async move {
            match admin_tenant(&req, &ctx) {
                Some(tenant) => admin::put_tenant(req, &ctx.env, &tenant).await,
                None => admin_refusal(&req, &ctx),
            }
        })
        .get_async("/v1/tenants/:id/usage", |req, ctx| async move {
            match admin_tenant(&req, &ctx) {
                Some(tenant) => admin::usage(&req, &ctx.env, &tenant).await,
                None => admin_refusal(&req, &ctx),
            }
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
