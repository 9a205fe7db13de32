//! `/v1/verify`: the cloud checks k edge-drafted tokens in one forward pass.

use serde::{Deserialize, Serialize};

use crate::chat::{Message, Usage};

/// A verify request: the prefix (as messages or token ids) and the edge's draft.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VerifyRequest {
    #[serde(default)]
    pub model: String,
    /// Conversation to render with the chat template; ignored when `prefix_tokens` is set.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub messages: Vec<Message>,
    /// Token ids of everything before the draft.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix_tokens: Option<Vec<u32>>,
    pub draft_tokens: Vec<u32>,
    /// The draft model's probability of each drafted token (for rejection sampling).
    #[serde(default)]
    pub draft_probs: Vec<f32>,
    /// Sampling of the verifier (0 or absent: greedy). With a session, the call that starts it
    /// fixes `temperature`, `top_p` and `seed` for the whole generation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// The edge tokenizer's hash; a mismatch is a 409.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer_hash: Option<String>,
    /// Lets the server keep this sequence between calls: a call with a prefix (re)starts the
    /// session; a call without one continues it and carries only the new draft.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// On a continuing call, the tokens the client holds for the session (prefix and every
    /// token emitted so far); a mismatch with the server's count is a 409, never a guess.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_length: Option<u32>,
    /// The page's versions and answer id, for the cost record (the worker strips it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub straddle: Option<crate::StraddleEnvelope>,
}

impl VerifyRequest {
    /// Whether this call continues a session rather than giving the prefix.
    pub fn continues_session(&self) -> bool {
        self.session.is_some() && self.prefix_tokens.is_none() && self.messages.is_empty()
    }
}

/// The verdict on a draft.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VerifyResponse {
    /// How many draft tokens were accepted, from the start.
    pub accepted: u32,
    /// The token the verifier emits after the accepted prefix.
    pub next_token: u32,
    /// Tokens the session holds after this call, `next_token` included (sessions only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_length: Option<u32>,
    pub usage: Usage,
}
