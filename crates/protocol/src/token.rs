//! The short-lived tenant token a browser presents to the worker: an HS256 JWT signed with
//! the tenant's secret, which only the tenant's backend and the worker hold.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

/// The audience every Straddle token names.
pub const AUDIENCE: &str = "straddle";

/// Clock skew tolerated on `exp`, `nbf`, `iat` and the lifetime cap, seconds: the tenant's
/// backend and the worker each keep their own clock, and NTP keeps them well within this.
pub const LEEWAY_S: u64 = 30;

/// The longest a token may live when its tenant's record sets no other limit, seconds.
pub const DEFAULT_MAX_LIFETIME_S: u64 = 3600;

/// Who a token is for: a page (bound to its origin) or a tenant's own server.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenKind {
    /// Presented by a page: must name the origin it is bound to, which the worker compares
    /// with the request's `Origin`.
    #[default]
    Browser,
    /// Presented by the tenant's backend: names no origin and is refused from a page.
    Server,
}

/// What a token asserts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    /// Tenant id.
    pub ten: String,
    /// End user within the tenant.
    pub sub: String,
    /// Session id.
    #[serde(default)]
    pub sid: String,
    pub aud: String,
    /// Expiry, not-before and issued-at, seconds since the Unix epoch (0: not given).
    pub exp: u64,
    #[serde(default)]
    pub nbf: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub iat: u64,
    /// A page's token or a server's; absent means a page's.
    #[serde(default, skip_serializing_if = "is_browser")]
    pub kind: TokenKind,
    /// The page origin the token is bound to; the worker compares `Origin`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
    /// Optional feature tag for per-feature budgets and usage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub feat: Option<String>,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

fn is_browser(k: &TokenKind) -> bool {
    *k == TokenKind::Browser
}

/// Why a token was refused (worded for the 401 body: never echoes the token).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("token is not a JWT (three base64url parts)")]
    Malformed,
    #[error("token algorithm must be HS256")]
    Algorithm,
    #[error("token signature does not verify")]
    Signature,
    #[error("token claims are not valid JSON: {0}")]
    Claims(String),
    #[error("token expired")]
    Expired,
    #[error("token not valid yet")]
    NotYetValid,
    #[error("token audience must be `{AUDIENCE}`")]
    Audience,
    #[error("token is bound to another origin")]
    Origin,
    #[error(
        "a browser token must name the page origin it is bound to (`origin`); calls from a backend need a `\"kind\": \"server\"` token"
    )]
    NoOrigin,
    #[error("a server token names no origin (`origin` is for browser tokens)")]
    ServerOrigin,
    #[error(
        "a server token was sent from a page (the request has an `Origin`); pages need a browser token"
    )]
    ServerFromPage,
    #[error("token lives {lifetime_s} s, longer than this tenant's maximum of {max_s} s")]
    Lifetime { lifetime_s: u64, max_s: u64 },
}

#[derive(Serialize, Deserialize)]
struct Header {
    alg: String,
    #[serde(default)]
    typ: String,
}

fn sign(secret: &[u8], signing_input: &str) -> Vec<u8> {
    let mut mac =
        <Hmac<Sha256> as Mac>::new_from_slice(secret).expect("HMAC accepts keys of any length");
    mac.update(signing_input.as_bytes());
    mac.finalize().into_bytes().to_vec()
}

/// Signs `claims` with `secret`.
pub fn mint(claims: &Claims, secret: &[u8]) -> String {
    let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"HS256","typ":"JWT"}"#);
    let body = URL_SAFE_NO_PAD.encode(serde_json::to_vec(claims).unwrap_or_default());
    let input = format!("{header}.{body}");
    let sig = URL_SAFE_NO_PAD.encode(sign(secret, &input));
    format!("{input}.{sig}")
}

/// The tenant a token claims, read before its signature is checked (to pick the secret).
pub fn unverified_tenant(token: &str) -> Result<String, TokenError> {
    let body = token.split('.').nth(1).ok_or(TokenError::Malformed)?;
    let bytes = URL_SAFE_NO_PAD
        .decode(body)
        .map_err(|_| TokenError::Malformed)?;
    let claims: Claims =
        serde_json::from_slice(&bytes).map_err(|e| TokenError::Claims(e.to_string()))?;
    Ok(claims.ten)
}

/// Checks signature, algorithm, audience, expiry, not-before and the bound origin.
pub fn verify(
    token: &str,
    secret: &[u8],
    now_s: u64,
    origin: Option<&str>,
) -> Result<Claims, TokenError> {
    let mut parts = token.split('.');
    let (Some(h), Some(b), Some(s), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(TokenError::Malformed);
    };
    let header: Header = URL_SAFE_NO_PAD
        .decode(h)
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .ok_or(TokenError::Malformed)?;
    if header.alg != "HS256" {
        return Err(TokenError::Algorithm);
    }
    let sig = URL_SAFE_NO_PAD
        .decode(s)
        .map_err(|_| TokenError::Malformed)?;
    let mut mac =
        <Hmac<Sha256> as Mac>::new_from_slice(secret).map_err(|_| TokenError::Signature)?;
    mac.update(h.as_bytes());
    mac.update(b".");
    mac.update(b.as_bytes());
    // Constant-time comparison.
    mac.verify_slice(&sig).map_err(|_| TokenError::Signature)?;
    let bytes = URL_SAFE_NO_PAD
        .decode(b)
        .map_err(|_| TokenError::Malformed)?;
    let claims: Claims =
        serde_json::from_slice(&bytes).map_err(|e| TokenError::Claims(e.to_string()))?;
    if claims.aud != AUDIENCE {
        return Err(TokenError::Audience);
    }
    if now_s > claims.exp.saturating_add(LEEWAY_S) {
        return Err(TokenError::Expired);
    }
    if claims.nbf > now_s.saturating_add(LEEWAY_S) {
        return Err(TokenError::NotYetValid);
    }
    check_origin(&claims, origin)?;
    Ok(claims)
}

/// A browser token is bound to the request's origin; a server token names none and comes
/// from no page.
fn check_origin(claims: &Claims, origin: Option<&str>) -> Result<(), TokenError> {
    match (claims.kind, &claims.origin) {
        (TokenKind::Browser, None) => Err(TokenError::NoOrigin),
        (TokenKind::Browser, Some(bound)) if origin != Some(bound.as_str()) => {
            Err(TokenError::Origin)
        }
        (TokenKind::Server, Some(_)) => Err(TokenError::ServerOrigin),
        (TokenKind::Server, None) if origin.is_some() => Err(TokenError::ServerFromPage),
        _ => Ok(()),
    }
}

impl Claims {
    /// Refuses a token that lives longer than `max_s`: from its `iat` or `nbf` (the later)
    /// to its `exp` and, for one that states neither, from now to its `exp`, so a stolen
    /// token is worth at most that long whoever minted it.
    pub fn check_lifetime(&self, now_s: u64, max_s: u64) -> Result<(), TokenError> {
        let from = match self.iat.max(self.nbf) {
            0 => now_s,
            start => start,
        };
        // The remaining time counts too: an `iat` in the future cannot stretch a lifetime.
        let lifetime_s = self
            .exp
            .saturating_sub(from)
            .max(self.exp.saturating_sub(now_s));
        if lifetime_s > max_s.saturating_add(LEEWAY_S) {
            return Err(TokenError::Lifetime { lifetime_s, max_s });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims() -> Claims {
        Claims {
            ten: "acme".into(),
            sub: "user-1".into(),
            sid: "s1".into(),
            aud: AUDIENCE.into(),
            exp: 1_000_600,
            nbf: 1_000_000,
            iat: 0,
            kind: TokenKind::Browser,
            origin: Some("https://app.acme.test".into()),
            feat: Some("chat".into()),
        }
    }

    #[test]
    fn a_browser_token_needs_its_origin_and_a_server_token_none() {
        let unbound = mint(
            &Claims {
                origin: None,
                ..claims()
            },
            b"secret",
        );
        assert_eq!(
            verify(&unbound, b"secret", 1_000_100, None),
            Err(TokenError::NoOrigin)
        );
        let server = Claims {
            origin: None,
            kind: TokenKind::Server,
            ..claims()
        };
        let t = mint(&server, b"secret");
        assert_eq!(verify(&t, b"secret", 1_000_100, None), Ok(server.clone()));
        assert_eq!(
            verify(&t, b"secret", 1_000_100, Some("https://app.acme.test")),
            Err(TokenError::ServerFromPage)
        );
        let bound_server = mint(
            &Claims {
                kind: TokenKind::Server,
                ..claims()
            },
            b"secret",
        );
        assert_eq!(
            verify(&bound_server, b"secret", 1_000_100, None),
            Err(TokenError::ServerOrigin)
        );
    }

    #[test]
    fn a_token_may_live_no_longer_than_the_cap() {
        // Lives 600 s from its nbf.
        assert_eq!(claims().check_lifetime(1_000_100, 600), Ok(()));
        assert_eq!(
            claims().check_lifetime(1_000_100, 300),
            Err(TokenError::Lifetime {
                lifetime_s: 600,
                max_s: 300
            })
        );
        // Late in a long life is still a long life.
        assert!(claims().check_lifetime(1_000_590, 300).is_err());
        // Without iat or nbf the time left counts; within the leeway is tolerated.
        let undated = Claims { nbf: 0, ..claims() };
        assert_eq!(undated.check_lifetime(1_000_000, 590), Ok(()));
        assert!(undated.check_lifetime(1_000_000, 500).is_err());
        // A future iat cannot stretch it.
        let future = Claims {
            iat: 1_000_590,
            ..undated
        };
        assert!(future.check_lifetime(1_000_000, 300).is_err());
    }

    #[test]
    fn a_minted_token_verifies_and_names_its_tenant() {
        let t = mint(&claims(), b"secret");
        assert_eq!(unverified_tenant(&t).as_deref(), Ok("acme"));
        let got = verify(&t, b"secret", 1_000_100, Some("https://app.acme.test"));
        assert_eq!(got, Ok(claims()));
    }

    #[test]
    fn every_refusal_has_its_reason() {
        let t = mint(&claims(), b"secret");
        let origin = Some("https://app.acme.test");
        assert_eq!(
            verify(&t, b"other", 1_000_100, origin),
            Err(TokenError::Signature)
        );
        assert_eq!(
            verify(&t, b"secret", 1_000_700, origin),
            Err(TokenError::Expired)
        );
        assert_eq!(
            verify(&t, b"secret", 999_000, origin),
            Err(TokenError::NotYetValid)
        );
        assert_eq!(
            verify(&t, b"secret", 1_000_100, Some("https://evil.test")),
            Err(TokenError::Origin)
        );
        assert_eq!(
            verify(&t, b"secret", 1_000_100, None),
            Err(TokenError::Origin)
        );
        assert_eq!(
            verify("abc", b"secret", 0, None),
            Err(TokenError::Malformed)
        );
        let wrong_aud = mint(
            &Claims {
                aud: "other".into(),
                ..claims()
            },
            b"secret",
        );
        assert_eq!(
            verify(&wrong_aud, b"secret", 1_000_100, origin),
            Err(TokenError::Audience)
        );
        // A tampered body no longer matches its signature.
        let mut parts: Vec<&str> = t.split('.').collect();
        let forged = URL_SAFE_NO_PAD.encode(
            serde_json::to_vec(&Claims {
                ten: "victim".into(),
                ..claims()
            })
            .expect("json"),
        );
        parts[1] = &forged;
        assert_eq!(
            verify(&parts.join("."), b"secret", 1_000_100, origin),
            Err(TokenError::Signature)
        );
        // `alg: none` is refused outright.
        let none = format!(
            "{}.{}.",
            URL_SAFE_NO_PAD.encode(br#"{"alg":"none"}"#),
            t.split('.').nth(1).unwrap_or_default()
        );
        assert_eq!(
            verify(&none, b"secret", 1_000_100, origin),
            Err(TokenError::Algorithm)
        );
    }
}
