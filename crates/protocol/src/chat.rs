//! OpenAI-compatible `/v1/chat/completions` request and response shapes.

use serde::{Deserialize, Serialize};

use crate::envelope::{StraddleEnvelope, StraddleMeta};

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
    Tool,
    Developer,
}

impl Role {
    /// The lowercase name used on the wire and in chat templates.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
            Role::Developer => "developer",
        }
    }
}

/// One message of a conversation. Only text content is supported.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Message {
    pub role: Role,
    pub content: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl Message {
    /// A message with the given role and text.
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Self {
            role,
            content: content.into(),
            name: None,
        }
    }
}

/// `stop` may be one string or a list of strings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

impl Stop {
    /// The stop strings as a list.
    pub fn into_vec(self) -> Vec<String> {
        match self {
            Stop::One(s) => vec![s],
            Stop::Many(v) => v,
        }
    }
}

/// `stream_options` of a streaming request.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// A `/v1/chat/completions` request body, plus Straddle's optional envelope.
///
/// Unknown fields are rejected so that a typo (`max_token`) is a 400 naming the field,
/// not a silently ignored limit.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatRequest {
    #[serde(default)]
    pub model: String,
    pub messages: Vec<Message>,
    #[serde(default)]
    pub stream: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_options: Option<StreamOptions>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_completion_tokens: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<Stop>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_logprobs: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repetition_penalty: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Continue the last message, the assistant's, instead of answering after it (vLLM's
    /// extension): how a reply begun elsewhere (speculation) is handed to plain streaming.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continue_final_message: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub straddle: Option<StraddleEnvelope>,
}

impl ChatRequest {
    /// The effective completion-token limit (`max_completion_tokens` wins, as in OpenAI).
    pub fn token_limit(&self) -> Option<u32> {
        self.max_completion_tokens.or(self.max_tokens)
    }

    /// Checks what serde cannot: values in range, a non-empty conversation.
    pub fn validate(&self) -> Result<(), crate::ApiError> {
        use crate::ApiError;
        if self.messages.is_empty() {
            return Err(ApiError::invalid(
                "messages",
                "must contain at least one message",
            ));
        }
        if self.temperature.is_some_and(|t| !(0.0..=2.0).contains(&t)) {
            return Err(ApiError::invalid("temperature", "must be between 0 and 2"));
        }
        if self.top_p.is_some_and(|p| !(p > 0.0 && p <= 1.0)) {
            return Err(ApiError::invalid("top_p", "must be in (0, 1]"));
        }
        if self.n.is_some_and(|n| n != 1) {
            return Err(ApiError::invalid("n", "only n = 1 is supported"));
        }
        if self.top_logprobs.is_some_and(|k| k > 20) {
            return Err(ApiError::invalid("top_logprobs", "must be at most 20"));
        }
        if self.token_limit() == Some(0) {
            return Err(ApiError::invalid("max_tokens", "must be at least 1"));
        }
        if self.continue_final_message == Some(true)
            && self
                .messages
                .last()
                .is_some_and(|m| m.role != Role::Assistant)
        {
            return Err(ApiError::invalid(
                "continue_final_message",
                "the last message must be the assistant's to continue it",
            ));
        }
        Ok(())
    }
}

/// Token counts of one completion.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub total_tokens: u32,
}

impl Usage {
    /// Usage with `total_tokens` filled in.
    pub fn new(prompt_tokens: u32, completion_tokens: u32) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
        }
    }
}

/// Why generation stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    Stop,
    Length,
    Cancelled,
}

/// One candidate token and its log-probability.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f32,
}

/// Log-probability information for one generated token.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenLogprob {
    pub token: String,
    pub logprob: f32,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub top_logprobs: Vec<TopLogprob>,
}

/// The `logprobs` object of a choice.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Logprobs {
    pub content: Vec<TokenLogprob>,
}

/// One choice of a non-streaming response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Choice {
    pub index: u32,
    pub message: Message,
    pub finish_reason: Option<FinishReason>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Logprobs>,
}

/// A non-streaming `/v1/chat/completions` response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatResponse {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub model: String,
    pub choices: Vec<Choice>,
    pub usage: Usage,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub straddle: Option<StraddleMeta>,
}

/// The incremental part of a streamed choice.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Delta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<Role>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
}

/// One choice of a streamed chunk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChunkChoice {
    pub index: u32,
    pub delta: Delta,
    pub finish_reason: Option<FinishReason>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Logprobs>,
}

/// One `data:` event of a streamed response (`object: "chat.completion.chunk"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatChunk {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChunkChoice>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub straddle: Option<StraddleMeta>,
}

/// One entry of `GET /v1/models`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelInfo {
    pub id: String,
    pub object: String,
    pub owned_by: String,
    /// Hash of the tokenizer, so an edge client can tell whether its drafts are compatible.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer_hash: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_length: Option<u32>,
}

/// The `GET /v1/models` body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelList {
    pub object: String,
    pub data: Vec<ModelInfo>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_openai_request_with_single_stop_string() {
        let body = r#"{"model":"m","messages":[{"role":"user","content":"hi"}],
            "stream":true,"stream_options":{"include_usage":true},"max_tokens":16,"stop":"\n"}"#;
        let req: ChatRequest = serde_json::from_str(body).expect("valid body");
        assert_eq!(req.messages[0].role, Role::User);
        assert_eq!(
            req.stop.clone().map(Stop::into_vec),
            Some(vec!["\n".to_string()])
        );
        assert_eq!(req.token_limit(), Some(16));
        assert!(req.stream_options.as_ref().is_some_and(|o| o.include_usage));
        req.validate().expect("in range");
    }

    #[test]
    fn unknown_field_is_rejected_and_named() {
        let body = r#"{"messages":[{"role":"user","content":"hi"}],"max_token":5}"#;
        let err = serde_json::from_str::<ChatRequest>(body)
            .unwrap_err()
            .to_string();
        assert!(err.contains("max_token"), "{err}");
    }

    #[test]
    fn unknown_role_is_rejected() {
        let body = r#"{"messages":[{"role":"wizard","content":"hi"}]}"#;
        assert!(serde_json::from_str::<ChatRequest>(body).is_err());
    }

    #[test]
    fn only_an_assistant_turn_can_be_continued() {
        let body = r#"{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"Hel"}],"continue_final_message":true}"#;
        let req: ChatRequest = serde_json::from_str(body).expect("parses");
        assert_eq!(req.continue_final_message, Some(true));
        assert!(req.validate().is_ok());
        let body = r#"{"messages":[{"role":"user","content":"hi"}],"continue_final_message":true}"#;
        let req: ChatRequest = serde_json::from_str(body).expect("parses");
        assert_eq!(
            req.validate().unwrap_err().param.as_deref(),
            Some("continue_final_message")
        );
    }

    #[test]
    fn validate_names_the_bad_field() {
        let mut req = ChatRequest {
            messages: vec![Message::new(Role::User, "x")],
            ..Default::default()
        };
        req.temperature = Some(3.0);
        assert_eq!(
            req.validate().unwrap_err().param.as_deref(),
            Some("temperature")
        );
        req.temperature = None;
        req.messages.clear();
        assert_eq!(
            req.validate().unwrap_err().param.as_deref(),
            Some("messages")
        );
    }
}
