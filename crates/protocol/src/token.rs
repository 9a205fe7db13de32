//! The short-lived tenant token a browser presents to the worker: an HS256 JWT signed with
//! the tenant's secret, which only the tenant's backend and the worker hold.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

/// The audience every Straddle token names.
pub const AUDIENCE: &str = "straddle";

/// Clock skew tolerated on `exp` and `nbf`, seconds.
pub const LEEWAY_S: u64 = 30;

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
    /// Expiry and not-before, seconds since the Unix epoch.
    pub exp: u64,
    #[serde(default)]
    pub nbf: u64,
    /// The page origin the token is bound to; the worker compares `Origin`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
    /// Optional feature tag for per-feature budgets and usage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub feat: Option<String>,
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
    if let Some(bound) = &claims.origin
        && origin != Some(bound.as_str())
    {
        return Err(TokenError::Origin);
    }
    Ok(claims)
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
            origin: Some("https://app.acme.test".into()),
            feat: Some("chat".into()),
        }
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
