//! A tenant's record, set by `PUT /v1/tenants/:id`: what it may spend (as a whole, per user
//! and per feature), which pages may call for it, which models it may name and what of its
//! users' data must stay on their devices.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use straddle_protocol::ApiError;
use straddle_router::pii::Sensitivity;

/// Messages a request may carry when the tenant sets no limit of its own.
pub const DEFAULT_MAX_MESSAGES: usize = 512;
/// The longest token lifetime a tenant's record may allow: a day.
pub const MAX_TOKEN_LIFETIME_S: u64 = 86_400;

/// Spend and rate limits of one scope: the tenant, one of its users or one feature (absent
/// fields are unlimited). Days and months are UTC calendar days and months.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    pub daily_usd: Option<f64>,
    pub daily_tokens: Option<i64>,
    pub monthly_usd: Option<f64>,
    pub monthly_tokens: Option<i64>,
    pub max_concurrent: Option<i64>,
    /// Requests and tokens (worst case while in flight) in any 60-second window.
    pub requests_per_minute: Option<i64>,
    pub tokens_per_minute: Option<i64>,
}

/// How a request's output is held in the tenant's budget before it is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HoldMode {
    /// The whole `max_tokens` is held up front: a request is refused unless its worst case
    /// fits, so nothing can overshoot, but answers shorter than their bound are refused too.
    WorstCase,
    /// A streamed request holds its prompt and a first chunk of output, and its hold grows
    /// chunk by chunk as tokens pass; when the budget pays for no more the stream ends with
    /// `finish_reason: "length"`. Non-streamed requests are held at their worst case.
    Growing,
}

/// The tenant's record. Its own limits sit at the top level; `per_user` applies to each user
/// (the token's `sub`) on their own, `per_feature` to the requests tagged with that feature
/// (the token's `feat`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Tenant {
    #[serde(flatten)]
    pub limits: Limits,
    /// Largest `max_tokens` a request may ask for.
    pub max_tokens_cap: Option<i64>,
    /// Most messages a request may carry; absent: `DEFAULT_MAX_MESSAGES`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_messages: Option<usize>,
    /// How a request's output is held in the budget; absent: `worst_case`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holds: Option<HoldMode>,
    /// Longest a token may live, seconds; absent: `token::DEFAULT_MAX_LIFETIME_S`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_token_lifetime_s: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_user: Option<Limits>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub per_feature: BTreeMap<String, Limits>,
    /// Page origins that may call for this tenant; absent: the deployment's `ALLOWED_ORIGINS`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_origins: Option<Vec<String>>,
    /// Models a request may name; absent: any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_models: Option<Vec<String>>,
    /// Entity classes this sensitive or more are refused (451) rather than sent to a cloud;
    /// absent: `high`, the router's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_on_device_at: Option<Sensitivity>,
    /// Keys no field claimed: `flatten` cannot deny them, so `validate` does.
    #[serde(flatten, skip_serializing)]
    unknown: BTreeMap<String, serde_json::Value>,
}

impl Limits {
    fn validate(&self, scope: &str) -> Result<(), ApiError> {
        let money = [
            ("daily_usd", self.daily_usd),
            ("monthly_usd", self.monthly_usd),
        ];
        for (name, value) in money {
            if value.is_some_and(|v| !v.is_finite() || v < 0.0) {
                return Err(ApiError::invalid(
                    format!("{scope}{name}"),
                    "must be a finite number of dollars, 0 or more",
                ));
            }
        }
        let counts = [
            ("daily_tokens", self.daily_tokens),
            ("monthly_tokens", self.monthly_tokens),
            ("max_concurrent", self.max_concurrent),
            ("requests_per_minute", self.requests_per_minute),
            ("tokens_per_minute", self.tokens_per_minute),
        ];
        for (name, value) in counts {
            if value.is_some_and(|v| v < 0) {
                return Err(ApiError::invalid(
                    format!("{scope}{name}"),
                    "must be 0 or more",
                ));
            }
        }
        Ok(())
    }
}

impl Tenant {
    /// Refuses unknown keys, negative limits and origins that are not origins.
    pub fn validate(&self) -> Result<(), ApiError> {
        if let Some(key) = self.unknown.keys().next() {
            return Err(ApiError::invalid(key, "unknown field"));
        }
        self.limits.validate("")?;
        if self.max_tokens_cap.is_some_and(|c| c < 1) {
            return Err(ApiError::invalid("max_tokens_cap", "must be 1 or more"));
        }
        if self.max_messages == Some(0) {
            return Err(ApiError::invalid("max_messages", "must be 1 or more"));
        }
        if self
            .max_token_lifetime_s
            .is_some_and(|s| !(60..=MAX_TOKEN_LIFETIME_S).contains(&s))
        {
            return Err(ApiError::invalid(
                "max_token_lifetime_s",
                format!("must be 60 to {MAX_TOKEN_LIFETIME_S} seconds"),
            ));
        }
        if let Some(per_user) = &self.per_user {
            per_user.validate("per_user.")?;
        }
        for (feature, limits) in &self.per_feature {
            limits.validate(&format!("per_feature.{feature}."))?;
        }
        for origin in self.allowed_origins.iter().flatten() {
            if !is_origin(origin) {
                return Err(ApiError::invalid(
                    "allowed_origins",
                    format!("{origin:?} is not an origin like https://app.example.com"),
                ));
            }
        }
        Ok(())
    }

    /// Whether a page at `origin` may call for this tenant, given the deployment's own list.
    pub fn allows_origin(&self, origin: &str, deployment: &[String]) -> bool {
        let list = self.allowed_origins.as_deref().unwrap_or(deployment);
        list.iter().any(|o| o == origin || o == "*")
    }

    /// Whether requests may name `model`.
    pub fn allows_model(&self, model: &str) -> bool {
        self.allowed_models
            .as_ref()
            .is_none_or(|list| list.iter().any(|m| m == model))
    }

    /// Most messages a request may carry.
    pub fn max_messages(&self) -> usize {
        self.max_messages.unwrap_or(DEFAULT_MAX_MESSAGES)
    }

    /// Whether streamed requests hold their output chunk by chunk.
    pub fn growing_holds(&self) -> bool {
        self.holds == Some(HoldMode::Growing)
    }

    /// The longest a token for this tenant may live, seconds.
    pub fn max_token_lifetime_s(&self) -> u64 {
        self.max_token_lifetime_s
            .unwrap_or(straddle_protocol::token::DEFAULT_MAX_LIFETIME_S)
    }

    /// The sensitivity at which data must stay on the device.
    pub fn keep_on_device_at(&self) -> Sensitivity {
        self.keep_on_device_at.unwrap_or(Sensitivity::High)
    }

    /// The limits that apply to `feature`, when the tenant set any.
    pub fn feature_limits(&self, feature: &str) -> Option<&Limits> {
        self.per_feature.get(feature)
    }
}

/// `scheme://host[:port]` with nothing after it, as browsers send in `Origin`.
fn is_origin(s: &str) -> bool {
    if s == "*" {
        return true;
    }
    let Some((scheme, rest)) = s.split_once("://") else {
        return false;
    };
    matches!(scheme, "http" | "https")
        && !rest.is_empty()
        && !rest.contains(['/', '?', '#', ' ', '@'])
}

/// The deployment's `ALLOWED_ORIGINS` (comma-separated).
pub fn deployment_origins(var: Option<&str>) -> Vec<String> {
    var.unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|o| !o.is_empty())
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<Tenant, String> {
        let t: Tenant = serde_json::from_str(json).map_err(|e| e.to_string())?;
        t.validate().map_err(|e| e.message)?;
        Ok(t)
    }

    #[test]
    fn flat_limits_and_nested_scopes_parse() {
        let t = parse(
            r#"{"daily_usd": 5, "monthly_tokens": 100, "max_tokens_cap": 256,
                "per_user": {"daily_usd": 0.5}, "per_feature": {"summarize": {"daily_tokens": 10}},
                "allowed_origins": ["https://app.acme.test"], "allowed_models": ["gpt-x"],
                "keep_on_device_at": "medium"}"#,
        )
        .expect("valid");
        assert_eq!(t.limits.daily_usd, Some(5.0));
        assert_eq!(t.limits.monthly_tokens, Some(100));
        assert_eq!(t.per_user.as_ref().and_then(|l| l.daily_usd), Some(0.5));
        assert_eq!(
            t.feature_limits("summarize").and_then(|l| l.daily_tokens),
            Some(10)
        );
        assert!(t.feature_limits("chat").is_none());
        assert!(t.allows_origin("https://app.acme.test", &[]));
        assert!(!t.allows_origin("https://evil.test", &["https://evil.test".into()]));
        assert!(t.allows_model("gpt-x") && !t.allows_model("gpt-y"));
        assert_eq!(t.keep_on_device_at(), Sensitivity::Medium);
        // What is saved reads back the same.
        let again: Tenant =
            serde_json::from_str(&serde_json::to_string(&t).expect("json")).expect("round trip");
        assert_eq!(again, t);
    }

    #[test]
    fn defaults_fall_back_to_the_deployment() {
        let t = parse("{}").expect("empty is valid");
        let deployment = deployment_origins(Some(" https://a.test, https://b.test ,"));
        assert_eq!(deployment, ["https://a.test", "https://b.test"]);
        assert!(t.allows_origin("https://b.test", &deployment));
        assert!(!t.allows_origin("https://c.test", &deployment));
        assert!(t.allows_model("anything"));
        assert_eq!(t.keep_on_device_at(), Sensitivity::High);
    }

    #[test]
    fn bad_records_name_the_field() {
        let cases = [
            (r#"{"daily_usd_limit": 1}"#, "daily_usd_limit"),
            (r#"{"daily_usd": -1}"#, "daily_usd"),
            (
                r#"{"per_user": {"daily_tokens": -5}}"#,
                "per_user.daily_tokens",
            ),
            (
                r#"{"per_feature": {"x": {"monthly_usd": -1}}}"#,
                "per_feature.x.monthly_usd",
            ),
            (
                r#"{"allowed_origins": ["https://a.test/path"]}"#,
                "allowed_origins",
            ),
            (r#"{"max_tokens_cap": 0}"#, "max_tokens_cap"),
        ];
        for (json, field) in cases {
            let t: Tenant = serde_json::from_str(json).expect("parses");
            let err = t.validate().expect_err(json);
            assert_eq!(err.param.as_deref(), Some(field), "{json}");
        }
        assert!(serde_json::from_str::<Tenant>(r#"{"per_user": {"bogus": 1}}"#).is_err());
        assert!(serde_json::from_str::<Tenant>(r#"{"daily_usd": "lots"}"#).is_err());
        assert!(serde_json::from_str::<Tenant>(r#"{"keep_on_device_at": "secret"}"#).is_err());
    }
}
