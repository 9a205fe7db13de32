//! The page's report of the answers it gave on the device (`POST /v1/usage/edge`), so that
//! usage by tenant, user, feature and session covers both tiers, and of the feedback its user
//! gave on any answer (`POST /v1/feedback`). Counts, timings, versions and rewards only: no
//! field can carry a prompt or an answer, and an unknown field is refused.

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
        check_ids("answers", self.answers.iter().map(|a| a.id.as_str()))
    }
}

/// The user's verdict on answers the page gave (its `feedback(id, reward)`), by the page's
/// completion ids: the usage report averages it per version.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeedbackReport {
    pub feedback: Vec<Feedback>,
}

/// One answer's reward.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Feedback {
    /// The page's completion id of the answer.
    pub id: String,
    /// 0 (useless) to 1 (just right).
    pub reward: f64,
}

impl FeedbackReport {
    /// At most [`MAX_EDGE_ANSWERS`] rewards, each for an id and within 0..=1.
    pub fn validate(&self) -> Result<(), ApiError> {
        check_ids("feedback", self.feedback.iter().map(|f| f.id.as_str()))?;
        match self
            .feedback
            .iter()
            .position(|f| !(0.0..=1.0).contains(&f.reward))
        {
            Some(i) => Err(ApiError::invalid(
                format!("feedback[{i}].reward"),
                "must be a number from 0 to 1",
            )),
            None => Ok(()),
        }
    }
}

/// At most [`MAX_EDGE_ANSWERS`] entries in `field`, each with an id of 1 to 128 characters.
fn check_ids<'a>(field: &str, ids: impl ExactSizeIterator<Item = &'a str>) -> Result<(), ApiError> {
    if ids.len() > MAX_EDGE_ANSWERS {
        return Err(ApiError::invalid(
            field,
            format!("at most {MAX_EDGE_ANSWERS} entries a report"),
        ));
    }
    match ids
        .enumerate()
        .find(|(_, id)| !(1..=128).contains(&id.len()))
    {
        Some((i, _)) => Err(ApiError::invalid(
            format!("{field}[{i}].id"),
            "must be 1 to 128 characters",
        )),
        None => Ok(()),
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

    #[test]
    fn feedback_is_a_bounded_reward_per_id() {
        let good: FeedbackReport =
            serde_json::from_str(r#"{"feedback":[{"id":"chatcmpl-1","reward":0.5}]}"#).unwrap();
        assert!(good.validate().is_ok());
        let with_text = r#"{"feedback":[{"id":"a","reward":1,"comment":"great answer"}]}"#;
        assert!(serde_json::from_str::<FeedbackReport>(with_text).is_err());
        let over = FeedbackReport {
            feedback: vec![Feedback {
                id: "a".into(),
                reward: 1.5,
            }],
        };
        assert_eq!(
            over.validate().unwrap_err().param.as_deref(),
            Some("feedback[0].reward")
        );
        let nan = FeedbackReport {
            feedback: vec![Feedback {
                id: "a".into(),
                reward: f64::NAN,
            }],
        };
        assert!(nan.validate().is_err());
    }
}
