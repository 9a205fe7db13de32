//! An OpenAI chat request as the engine's work (the conversation, the sampling settings, the
//! grammar of its `response_format`), and the engine's ending as OpenAI's finish reason.
//!
//! The cloud server and the page both answer OpenAI requests with the engine; this is the one
//! translation they share, so a field means the same on the device and in the cloud.

use straddle_engine::{
    ChatMessage, Constraint, Finish, GenerateParams, GrammarError, OutputFormat, Prompt,
    SamplingParams,
};
use straddle_protocol::{ApiError, ChatRequest, FinishReason, ResponseFormat, Role};

/// The conversation a request asks the engine to answer.
#[derive(Debug, Clone)]
pub struct Conversation {
    pub messages: Vec<ChatMessage>,
    /// Continue the last message, the assistant's, rather than answer after it.
    pub continues: bool,
}

impl Conversation {
    /// The conversation of `req`.
    pub fn of(req: &ChatRequest) -> Self {
        Self {
            messages: req
                .messages
                .iter()
                .map(|m| ChatMessage::new(m.role.as_str(), m.content.clone()))
                .collect(),
            continues: req.continue_final_message == Some(true)
                && req
                    .messages
                    .last()
                    .is_some_and(|m| m.role == Role::Assistant),
        }
    }

    /// The prompt: an answer after the conversation, or the rest of its last turn.
    pub fn prompt(&self) -> Prompt<'_> {
        if self.continues {
            Prompt::Continue(&self.messages)
        } else {
            Prompt::Messages(&self.messages)
        }
    }
}

/// What the engine does where a request is silent.
#[derive(Debug, Clone, Copy)]
pub struct Defaults {
    pub max_tokens: u32,
    /// KV cache positions.
    pub context: usize,
}

/// The engine's settings for a request that passed [`ChatRequest::validate`]. `constrain`
/// compiles its `response_format` for the model's vocabulary: an invalid schema is a 400
/// naming `response_format`, before anything is generated.
pub fn params(
    req: &ChatRequest,
    defaults: Defaults,
    constrain: impl FnOnce(&OutputFormat) -> Result<Constraint, GrammarError>,
) -> Result<GenerateParams, ApiError> {
    let constraint = req
        .response_format
        .as_ref()
        .and_then(output_format)
        .map(|format| constrain(&format))
        .transpose()
        .map_err(|e| ApiError::invalid("response_format", e.to_string()))?;
    Ok(GenerateParams {
        sampling: SamplingParams {
            temperature: req.temperature.unwrap_or(0.0),
            top_k: req.top_k.unwrap_or(0) as usize,
            top_p: req.top_p.unwrap_or(1.0),
            repetition_penalty: req.repetition_penalty.unwrap_or(1.0),
            presence_penalty: req.presence_penalty.unwrap_or(0.0),
            frequency_penalty: req.frequency_penalty.unwrap_or(0.0),
            logit_bias: req.logit_bias()?,
            seed: req.seed.unwrap_or(0),
        },
        max_tokens: req.token_limit().unwrap_or(defaults.max_tokens) as usize,
        stop: req.stop.clone().map(|s| s.into_vec()).unwrap_or_default(),
        stop_tokens: Vec::new(),
        context: defaults.context,
        constraint,
    })
}

/// What the engine must hold the answer to, for a `response_format` (`None`: free text).
pub fn output_format(format: &ResponseFormat) -> Option<OutputFormat> {
    match format {
        ResponseFormat::Text => None,
        ResponseFormat::JsonObject => Some(OutputFormat::JsonObject),
        ResponseFormat::JsonSchema { json_schema } => Some(OutputFormat::JsonSchema {
            schema: json_schema
                .schema
                .clone()
                .unwrap_or_else(|| serde_json::json!({})),
            strict: json_schema.strict.unwrap_or(false),
        }),
    }
}

/// OpenAI's name for how the engine ended.
pub fn finish_reason(finish: Finish) -> FinishReason {
    match finish {
        Finish::Stop => FinishReason::Stop,
        Finish::Length => FinishReason::Length,
        Finish::Cancelled => FinishReason::Cancelled,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(json: &str) -> ChatRequest {
        let req: ChatRequest = serde_json::from_str(json).expect("parses");
        req.validate().expect("valid");
        req
    }

    const DEFAULTS: Defaults = Defaults {
        max_tokens: 100,
        context: 512,
    };

    fn no_grammar(_: &OutputFormat) -> Result<Constraint, GrammarError> {
        panic!("no response_format, nothing to compile")
    }

    #[test]
    fn every_sampling_field_reaches_the_engine() {
        let req = request(
            r#"{"messages":[{"role":"user","content":"x"}],"temperature":0.5,"top_p":0.9,
                "top_k":7,"seed":3,"presence_penalty":0.25,"frequency_penalty":-0.5,
                "repetition_penalty":1.1,"logit_bias":{"17":-100},"stop":"\n",
                "max_completion_tokens":9}"#,
        );
        let p = params(&req, DEFAULTS, no_grammar).expect("params");
        let s = &p.sampling;
        assert_eq!((s.temperature, s.top_p, s.top_k, s.seed), (0.5, 0.9, 7, 3));
        assert_eq!((s.presence_penalty, s.frequency_penalty), (0.25, -0.5));
        assert_eq!(s.repetition_penalty, 1.1);
        assert_eq!(s.logit_bias, vec![(17, -100.0)]);
        assert_eq!((p.max_tokens, p.context), (9, 512));
        assert_eq!(p.stop, vec!["\n".to_string()]);
        assert!(p.constraint.is_none());
    }

    #[test]
    fn a_schema_the_grammar_refuses_is_a_400_naming_response_format() {
        let req = request(
            r#"{"messages":[{"role":"user","content":"x"}],
                "response_format":{"type":"json_schema","json_schema":{"name":"n","strict":true,
                "schema":{"type":"array","uniqueItems":true}}}}"#,
        );
        let mut asked = None;
        let err = params(&req, DEFAULTS, |format| {
            asked = Some(format.clone());
            Err(GrammarError::InvalidSchema(
                "Unimplemented keys: uniqueItems".into(),
            ))
        })
        .expect_err("refused");
        assert_eq!(err.param.as_deref(), Some("response_format"));
        assert_eq!(err.status(), 400);
        assert!(matches!(
            asked,
            Some(OutputFormat::JsonSchema { strict: true, .. })
        ));
    }

    #[test]
    fn a_text_format_asks_for_no_grammar_and_continuation_needs_the_assistant_last() {
        let req = request(
            r#"{"messages":[{"role":"user","content":"x"},{"role":"assistant","content":"He"}],
                "response_format":{"type":"text"},"continue_final_message":true}"#,
        );
        assert!(params(&req, DEFAULTS, no_grammar).is_ok());
        let c = Conversation::of(&req);
        assert!(c.continues && matches!(c.prompt(), Prompt::Continue(m) if m.len() == 2));
        assert_eq!(
            output_format(&ResponseFormat::JsonObject),
            Some(OutputFormat::JsonObject)
        );
    }
}
