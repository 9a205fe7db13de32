//! OpenAI-compatible `/v1/chat/completions` request and response shapes.

use serde::{Deserialize, Serialize};

use crate::envelope::{StraddleEnvelope, StraddleMeta};
use crate::tools::{Tool, ToolCall, ToolCallDelta, ToolChoice, ToolChoiceMode};

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

/// One message of a conversation. Its content is text: a string, or (as many clients send
/// it) an array of `{"type": "text", "text": …}` parts, joined; any other part is refused by
/// name. An assistant turn may carry the tool calls it made, and a `tool` turn answers one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Message {
    pub role: Role,
    #[serde(default, deserialize_with = "content::text")]
    pub content: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
    /// The call a `tool` turn answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl Message {
    /// A message with the given role and text.
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Self {
            role,
            content: content.into(),
            name: None,
            tool_calls: None,
            tool_call_id: None,
        }
    }

    /// Tool calls only on the assistant's turns, and a `tool` turn says which call it answers.
    fn validate(&self, i: usize) -> Result<(), crate::ApiError> {
        use crate::ApiError;
        if self.tool_calls.is_some() && self.role != Role::Assistant {
            return Err(ApiError::invalid(
                format!("messages[{i}].tool_calls"),
                "only an assistant message calls tools",
            ));
        }
        if self.role == Role::Tool && self.tool_call_id.is_none() {
            return Err(ApiError::invalid(
                format!("messages[{i}].tool_call_id"),
                "a tool message must say which call it answers",
            ));
        }
        Ok(())
    }
}

/// A message's `content` as it may arrive: a string, `null` (an assistant turn that only
/// called tools), or an array of parts.
mod content {
    use serde::de::Error;
    use serde::{Deserialize, Deserializer};

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Content {
        Text(String),
        Parts(Vec<serde_json::Map<String, serde_json::Value>>),
        Null(()),
    }

    /// The content's text; text parts are joined with nothing between them, as OpenAI does.
    pub fn text<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
        match Content::deserialize(d)? {
            Content::Text(t) => Ok(t),
            Content::Null(()) => Ok(String::new()),
            Content::Parts(parts) => parts.iter().map(part_text).collect(),
        }
    }

    fn part_text<E: Error>(part: &serde_json::Map<String, serde_json::Value>) -> Result<&str, E> {
        match part.get("type").and_then(|t| t.as_str()) {
            Some("text") => part.get("text").and_then(|t| t.as_str()).ok_or_else(|| {
                E::custom("unsupported content part: a `text` part needs a string `text`")
            }),
            Some(other) => Err(E::custom(format!(
                "unsupported content part `{other}`: only `text` parts are supported"
            ))),
            None => Err(E::custom(
                "unsupported content part: every part needs a `type`",
            )),
        }
    }
}

/// What the answer must be (`response_format`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ResponseFormat {
    /// Free text, the default.
    Text,
    /// Any JSON object.
    JsonObject,
    /// JSON valid under a schema.
    JsonSchema { json_schema: JsonSchemaFormat },
}

/// The `json_schema` of a `{"type": "json_schema"}` response format.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonSchemaFormat {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The JSON Schema; absent means any JSON value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<serde_json::Value>,
    /// Refuse a schema keyword that cannot be enforced, instead of ignoring it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

impl ResponseFormat {
    /// Whether the answer must be JSON.
    pub fn is_json(&self) -> bool {
        !matches!(self, ResponseFormat::Text)
    }

    fn validate(&self) -> Result<(), crate::ApiError> {
        use crate::ApiError;
        let ResponseFormat::JsonSchema { json_schema } = self else {
            return Ok(());
        };
        if !crate::tools::is_identifier(&json_schema.name) {
            return Err(ApiError::invalid(
                "response_format.json_schema.name",
                "must be 1 to 64 letters, digits, underscores or dashes",
            ));
        }
        match &json_schema.schema {
            None | Some(serde_json::Value::Object(_)) | Some(serde_json::Value::Bool(_)) => Ok(()),
            Some(_) => Err(ApiError::invalid(
                "response_format.json_schema.schema",
                "must be a JSON Schema object",
            )),
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
    pub presence_penalty: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frequency_penalty: Option<f32>,
    /// Token id (as a string, as OpenAI sends it) → bias added to its logit, −100 to 100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logit_bias: Option<std::collections::BTreeMap<String, f32>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_format: Option<ResponseFormat>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<Tool>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<ToolChoice>,
    /// Accepted for compatibility: an answer makes at most one call either way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel_tool_calls: Option<bool>,
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

    /// The tools the model is offered: none when `tool_choice` is `"none"`.
    pub fn offered_tools(&self) -> &[Tool] {
        match (&self.tools, &self.tool_choice) {
            (_, Some(ToolChoice::Mode(ToolChoiceMode::None))) | (None, _) => &[],
            (Some(tools), _) => tools,
        }
    }

    /// `logit_bias` as token ids and biases; a key that is not a token id, or a bias outside
    /// −100..=100, is a 400 naming `logit_bias`.
    pub fn logit_bias(&self) -> Result<Vec<(u32, f32)>, crate::ApiError> {
        let bad = |why: String| crate::ApiError::invalid("logit_bias", why);
        let Some(map) = &self.logit_bias else {
            return Ok(Vec::new());
        };
        map.iter()
            .map(|(key, &bias)| {
                let token = key
                    .parse::<u32>()
                    .map_err(|_| bad(format!("`{key}` is not a token id")))?;
                if !(-100.0..=100.0).contains(&bias) {
                    return Err(bad(format!("bias {bias} for {key} is outside -100..100")));
                }
                Ok((token, bias))
            })
            .collect()
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
        for (name, value) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if value.is_some_and(|v| !(-2.0..=2.0).contains(&v)) {
                return Err(ApiError::invalid(name, "must be between -2 and 2"));
            }
        }
        self.logit_bias()?;
        for (i, m) in self.messages.iter().enumerate() {
            m.validate(i)?;
        }
        crate::tools::validate(self.tools.as_deref(), self.tool_choice.as_ref())?;
        if let Some(format) = &self.response_format {
            format.validate()?;
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
    /// The answer is a tool call.
    ToolCalls,
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
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
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

    #[test]
    fn content_may_be_an_array_of_text_parts_or_null() {
        let body = r#"{"messages":[
            {"role":"user","content":[{"type":"text","text":"Hello, "},{"type":"text","text":"world"}]},
            {"role":"assistant","content":null}]}"#;
        let req: ChatRequest = serde_json::from_str(body).expect("parts parse");
        assert_eq!(req.messages[0].content, "Hello, world");
        assert_eq!(req.messages[1].content, "");
    }

    #[test]
    fn a_non_text_part_is_refused_by_name() {
        let body = r#"{"messages":[{"role":"user","content":[
            {"type":"image_url","image_url":{"url":"https://x/y.png"}}]}]}"#;
        let err = serde_json::from_str::<ChatRequest>(body).unwrap_err();
        let api = crate::ApiError::from_json_error(&err);
        assert!(api.message.contains("`image_url`"), "{}", api.message);
        assert_eq!(api.param.as_deref(), Some("messages"));
    }

    #[test]
    fn response_format_parses_every_openai_shape() {
        let parse = |rf: &str| {
            let body = format!(
                r#"{{"messages":[{{"role":"user","content":"x"}}],"response_format":{rf}}}"#
            );
            serde_json::from_str::<ChatRequest>(&body).map(|r| r.response_format)
        };
        assert_eq!(
            parse(r#"{"type":"text"}"#).ok().flatten(),
            Some(ResponseFormat::Text)
        );
        assert_eq!(
            parse(r#"{"type":"json_object"}"#).ok().flatten(),
            Some(ResponseFormat::JsonObject)
        );
        let schema = parse(
            r#"{"type":"json_schema","json_schema":{"name":"person","strict":true,
                "schema":{"type":"object","properties":{"age":{"type":"integer"}}}}}"#,
        )
        .expect("schema parses")
        .expect("present");
        let ResponseFormat::JsonSchema { json_schema } = schema else {
            panic!("not a schema")
        };
        assert_eq!(json_schema.name, "person");
        assert_eq!(json_schema.strict, Some(true));
        assert!(parse(r#"{"type":"yaml"}"#).is_err());
    }

    #[test]
    fn bad_penalties_bias_and_schema_names_are_refused_by_field() {
        let base = || ChatRequest {
            messages: vec![Message::new(Role::User, "x")],
            ..Default::default()
        };
        let param = |r: ChatRequest| r.validate().unwrap_err().param;
        let mut r = base();
        r.presence_penalty = Some(2.5);
        assert_eq!(param(r).as_deref(), Some("presence_penalty"));
        let mut r = base();
        r.frequency_penalty = Some(-3.0);
        assert_eq!(param(r).as_deref(), Some("frequency_penalty"));
        let mut r = base();
        r.logit_bias = Some([("hello".to_string(), 1.0)].into());
        assert_eq!(param(r).as_deref(), Some("logit_bias"));
        let mut r = base();
        r.logit_bias = Some([("42".to_string(), 101.0)].into());
        assert_eq!(param(r).as_deref(), Some("logit_bias"));
        let mut r = base();
        r.logit_bias = Some([("42".to_string(), -100.0)].into());
        assert_eq!(r.logit_bias().expect("valid"), vec![(42, -100.0)]);
        let mut r = base();
        r.response_format = Some(ResponseFormat::JsonSchema {
            json_schema: JsonSchemaFormat {
                name: "has space".into(),
                description: None,
                schema: None,
                strict: None,
            },
        });
        assert_eq!(
            param(r).as_deref(),
            Some("response_format.json_schema.name")
        );
        let mut r = base();
        r.response_format = Some(ResponseFormat::JsonSchema {
            json_schema: JsonSchemaFormat {
                name: "n".into(),
                description: None,
                schema: Some(serde_json::json!([1, 2])),
                strict: None,
            },
        });
        assert_eq!(
            param(r).as_deref(),
            Some("response_format.json_schema.schema")
        );
    }

    #[test]
    fn a_tool_round_trip_parses_and_tool_turns_are_checked() {
        let body = r#"{"messages":[
            {"role":"user","content":"Weather in Paris?"},
            {"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function",
                "function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},
            {"role":"tool","tool_call_id":"call_1","content":"18C"}],
            "tools":[{"type":"function","function":{"name":"get_weather",
                "parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}],
            "tool_choice":"auto","parallel_tool_calls":false}"#;
        let req: ChatRequest = serde_json::from_str(body).expect("parses");
        req.validate().expect("valid");
        assert_eq!(req.offered_tools().len(), 1);
        let calls = req.messages[1].tool_calls.as_ref().expect("calls");
        assert_eq!(calls[0].function.arguments, r#"{"city":"Paris"}"#);
        let mut none = req.clone();
        none.tool_choice = Some(ToolChoice::Mode(ToolChoiceMode::None));
        assert!(none.offered_tools().is_empty());
        let mut orphan = req.clone();
        orphan.messages[2].tool_call_id = None;
        assert_eq!(
            orphan.validate().unwrap_err().param.as_deref(),
            Some("messages[2].tool_call_id")
        );
        let mut user_calls = req;
        user_calls.messages[0].tool_calls = user_calls.messages[1].tool_calls.clone();
        assert_eq!(
            user_calls.validate().unwrap_err().param.as_deref(),
            Some("messages[0].tool_calls")
        );
    }
}
