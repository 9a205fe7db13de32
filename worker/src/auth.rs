//! Who is calling: a tenant token on the public routes, the admin key on the admin routes.
//! Secrets come from `wrangler secret put` (`TENANT_SECRET_<TENANT>`, `ADMIN_KEY`).

use straddle_protocol::token::{self, Claims};
use straddle_protocol::{ApiError, ErrorKind};
use worker::{Env, Request};

fn unauthorized(message: impl Into<String>) -> ApiError {
    ApiError::new(ErrorKind::Authentication, message)
}

fn bearer(req: &Request) -> Option<String> {
    let value = req.headers().get("authorization").ok().flatten()?;
    value
        .strip_prefix("Bearer ")
        .map(|t| t.trim().to_owned())
        .filter(|t| !t.is_empty())
}

/// A secret binding's text (a `wrangler secret`, or a plain var under local Miniflare).
pub(crate) fn secret(env: &Env, name: &str) -> Option<String> {
    env.secret(name)
        .map(|s| s.to_string())
        .ok()
        .or_else(|| env.var(name).map(|v| v.to_string()).ok())
        .filter(|s| !s.is_empty())
}

/// Tenant ids are the names of their secret bindings, so they are kept to a safe alphabet.
pub fn valid_tenant(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

fn secret_name(tenant: &str) -> String {
    format!(
        "TENANT_SECRET_{}",
        tenant.to_ascii_uppercase().replace('-', "_")
    )
}

/// The verified claims of the request's tenant token.
pub fn tenant(req: &Request, env: &Env) -> Result<Claims, ApiError> {
    let token = bearer(req)
        .ok_or_else(|| unauthorized("missing `Authorization: Bearer <tenant token>`"))?;
    let tenant = token::unverified_tenant(&token).map_err(|e| unauthorized(e.to_string()))?;
    if !valid_tenant(&tenant) {
        return Err(unauthorized("unknown tenant"));
    }
    let secret =
        secret(env, &secret_name(&tenant)).ok_or_else(|| unauthorized("unknown tenant"))?;
    let origin = req.headers().get("origin").ok().flatten();
    token::verify(&token, secret.as_bytes(), now_s(), origin.as_deref())
        .map_err(|e| unauthorized(e.to_string()))
}

/// Refuses a token that lives longer than its tenant allows (read after the token verified,
/// since the tenant's record is found by the token).
pub fn lifetime(claims: &Claims, max_s: u64) -> Result<(), ApiError> {
    claims
        .check_lifetime(now_s(), max_s)
        .map_err(|e| unauthorized(e.to_string()))
}

fn now_s() -> u64 {
    (js_sys::Date::now() / 1000.0) as u64
}

/// Whether the request carries the admin key.
pub fn admin(req: &Request, env: &Env) -> Result<(), ApiError> {
    let Some(expected) = secret(env, "ADMIN_KEY") else {
        return Err(unauthorized(
            "admin routes are disabled (no ADMIN_KEY secret)",
        ));
    };
    let given = bearer(req).unwrap_or_default();
    // Length-independent, constant-time comparison.
    let (a, b) = (given.as_bytes(), expected.as_bytes());
    let diff = a.len() ^ b.len();
    let folded = (0..a.len().max(b.len())).fold(diff, |acc, i| {
        acc | usize::from(a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0))
    });
    if folded == 0 {
        Ok(())
    } else {
        Err(unauthorized("admin key required"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_ids_are_binding_safe() {
        assert!(valid_tenant("acme-corp_1"));
        assert!(!valid_tenant(""));
        assert!(!valid_tenant("acme corp"));
        assert!(!valid_tenant("../x"));
        assert_eq!(secret_name("acme-corp"), "TENANT_SECRET_ACME_CORP");
    }
}
