//! The admin routes, behind the deployment's admin key: a tenant's record and its usage.

use straddle_protocol::{ApiError, ErrorKind};
use worker::{Env, Request, Response, Result};

use crate::budget::{self, BudgetCall, UsageQuery};
use crate::error::error_response;
use crate::{origins, tenant::Tenant};

/// `PUT /v1/tenants/:id`: validates and saves `tenant`'s record, then publishes its page
/// origins for CORS preflights.
pub async fn put_tenant(mut req: Request, env: &Env, tenant: &str) -> Result<Response> {
    let record: Tenant = match req.json().await {
        Ok(r) => r,
        Err(e) => {
            return error_response(&ApiError::new(
                ErrorKind::InvalidRequest,
                format!("tenant record: {e}"),
            ));
        }
    };
    if let Err(e) = record.validate() {
        return error_response(&e);
    }
    let stub = budget::stub(env, tenant)?;
    let saved: Tenant = budget::call(&stub, &BudgetCall::PutTenant(record)).await?;
    // Saved first: a failure here leaves the registry stale until the PUT is retried.
    let origins = saved.allowed_origins.as_deref().unwrap_or_default();
    origins::publish(env, tenant, origins).await?;
    Response::from_json(&saved)
}

/// `GET /v1/tenants/:id/usage`: the usage report, grouped as the query asks.
pub async fn usage(req: &Request, env: &Env, tenant: &str) -> Result<Response> {
    let query = UsageQuery::of(&req.url()?);
    let stub = budget::stub(env, tenant)?;
    let usage: serde_json::Value = budget::call(&stub, &BudgetCall::Usage(query)).await?;
    if let Some(message) = usage.get("error").and_then(|m| m.as_str()) {
        return error_response(&ApiError::invalid("group_by", message));
    }
    Response::from_json(&usage)
}
