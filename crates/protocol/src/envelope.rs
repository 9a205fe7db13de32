//! The `straddle` envelope a browser adds to an escalated request, and the `straddle`
//! metadata every response carries back.

use serde::{Deserialize, Serialize};

/// Where a request was (or will be) answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Route {
    Edge,
    Cloud,
    EdgeThenVerify,
    Speculative,
}

/// Sent by the browser with an escalation: who asks, why, and what it promises.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StraddleEnvelope {
    /// Session id chosen by the page; groups cost records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// Why the router escalated (rule or score name), for the cost record.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub router_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_version: Option<String>,
    /// The router's quality model that scored the decision, when one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quality_model_version: Option<String>,
    /// SHA-256 of the edge model's GGUF loaded in the page (hex), when one is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edge_model_sha256: Option<String>,
    /// The browser's claim about the PII it found and the action it took; the worker re-checks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub privacy: Option<PrivacyAttestation>,
    /// The browser's estimate of prompt tokens, used before the worker counts for itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_estimate: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub feature: Option<String>,
    /// True when the body re-sends a history that was started on the edge.
    #[serde(default)]
    pub escalated_mid_stream: bool,
    /// The page's completion id for this answer, which its user's feedback names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer_id: Option<String>,
}

/// What the browser found and did about personal data before sending.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrivacyAttestation {
    /// Entity classes detected (never their values).
    #[serde(default)]
    pub entities: Vec<String>,
    /// Whether the content was redacted with placeholders before upload.
    #[serde(default)]
    pub redacted: bool,
}

/// Cost of one answer as the router estimated or the worker settled it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Cost {
    pub usd: f64,
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
}

/// The `straddle` object every response and final chunk carries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StraddleMeta {
    pub route: Route,
    #[serde(default)]
    pub reasons: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confidence: Option<f32>,
    /// Set when the preferred route failed and another answered; says why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub degraded: Option<String>,
    #[serde(default)]
    pub cost: Cost,
    #[serde(default)]
    pub latency_ms: f64,
    #[serde(default)]
    pub model_versions: Vec<String>,
    /// Set on the last chunk of a stream the worker ended because the tenant's budget could
    /// pay for no more (its `finish_reason` is `length`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub budget_exhausted: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelope_round_trips_and_rejects_unknown_fields() {
        let env = StraddleEnvelope {
            session: Some("s1".into()),
            reasons: vec!["long_output".into()],
            privacy: Some(PrivacyAttestation {
                entities: vec!["email".into()],
                redacted: true,
            }),
            ..Default::default()
        };
        let json = serde_json::to_string(&env).expect("serialise");
        assert_eq!(
            serde_json::from_str::<StraddleEnvelope>(&json).expect("parse"),
            env
        );
        assert!(serde_json::from_str::<StraddleEnvelope>(r#"{"sesion":"x"}"#).is_err());
    }

    #[test]
    fn route_is_snake_case_on_the_wire() {
        assert_eq!(
            serde_json::to_string(&Route::EdgeThenVerify).expect("ser"),
            "\"edge_then_verify\""
        );
    }
}
