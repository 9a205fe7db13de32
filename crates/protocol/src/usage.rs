//! The page's report of the answers it gave on the device (`POST /v1/usage/edge`), so that
//! usage by tenant, user, feature and session covers both tiers. Counts, timings and
//! versions only: no field can carry a prompt or an answer, and an unknown field is refused.

use serde::{Deserialize, Serialize};

use crate::ApiError;

/// The most answers one report may carry.
pub const MAX_EDGE_ANSWERS: usize = 100;

/// A batch of edge answers.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EdgeUsageReport {
    pub answers: Vec<EdgeAnswer>,
}

/// One answer the device gave.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EdgeAnswer {
    /// The page's completion id: a report sent twice counts the answer once.
    pub id: String,
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub latency_ms: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttft_ms: Option<f64>,
    /// Why the router kept it on the device (the router's words: kinds, never values).
    #[serde(default)]
    pub reasons: Vec<String>,
    #[serde(default)]
    pub router_version: String,
    #[serde(default)]
    pub policy_version: String,
    #[serde(default)]
    pub quality_model_version: String,
    /// The edge model's GGUF SHA-256.
    #[serde(default)]
    pub edge_model_sha256: String,
    /// The edge model's name.
    #[serde(default)]
    pub model: String,
}

impl EdgeUsageReport {
    /// At most [`MAX_EDGE_ANSWERS`] answers, each with an id.
    pub fn validate(&self) -> Result<(), ApiError> {
        if self.answers.len() > MAX_EDGE_ANSWERS {
            return Err(ApiError::invalid(
                "answers",
                format!("at most {MAX_EDGE_ANSWERS} answers a report"),
            ));
        }
        match self
            .answers
            .iter()
            .position(|a| !(1..=128).contains(&a.id.len()))
        {
            Some(i) => Err(ApiError::invalid(
                format!("answers[{i}].id"),
                "must be 1 to 128 characters",
            )),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_carries_no_text_and_is_bounded() {
        let with_text = r#"{"answers":[{"id":"a","prompt_tokens":1,"completion_tokens":2,
            "latency_ms":3,"content":"the answer"}]}"#;
        let err = serde_json::from_str::<EdgeUsageReport>(with_text).unwrap_err();
        assert!(err.to_string().contains("content"), "{err}");
        let one = EdgeAnswer {
            id: "a".into(),
            ..EdgeAnswer::default()
        };
        let many = EdgeUsageReport {
            answers: vec![one.clone(); MAX_EDGE_ANSWERS + 1],
        };
        assert_eq!(
            many.validate().unwrap_err().param.as_deref(),
            Some("answers")
        );
        let nameless = EdgeUsageReport {
            answers: vec![one, EdgeAnswer::default()],
        };
        assert_eq!(
            nameless.validate().unwrap_err().param.as_deref(),
            Some("answers[1].id")
        );
    }
}
