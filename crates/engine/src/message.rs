//! A conversation turn, as chat templates and tool prompts read it.

use serde::Serialize;
use serde_json::Value;

/// A conversation turn as templates expect it (Hugging Face's shape).
#[derive(Debug, Clone, Serialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    /// The calls an assistant turn made: `{"type": "function", "function": {"name",
    /// "arguments"}}`, arguments as a JSON value.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<Value>>,
    /// The call a `tool` turn answers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl ChatMessage {
    /// A turn with the given role and text.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            tool_calls: None,
            tool_call_id: None,
        }
    }
}
