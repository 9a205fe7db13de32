//! An OpenAI chat request as the engine's work (the conversation and its tools, the sampling
//! settings, the grammar of its `response_format` or tool call), and the engine's answer as
//! OpenAI's: content or tool calls, and the finish reason.
//!
//! The cloud server and the page both answer OpenAI requests with the engine; this is the one
//! translation they share, so a field means the same on the device and in the cloud.

mod tool_calls;

pub use tool_calls::{AnswerStream, Ending};

use serde_json::Value;
use straddle_engine::sample::SamplingParams;
use straddle_engine::{
    ChatMessage, Constraint, Finish, FunctionSpec, GenerateParams, GrammarError, OutputFormat,
    Prompt,
};
use straddle_protocol::{
    ApiError, ChatRequest, FinishReason, Message, ResponseFormat, Role, ToolChoice, ToolChoiceMode,
};

/// The conversation a request asks the engine to answer.
#[derive(Debug, Clone)]
pub struct Conversation {
    pub messages: Vec<ChatMessage>,
    /// The tools offered (OpenAI's objects): none when `tool_choice` is `"none"`.
    pub tools: Vec<Value>,
    /// Continue the last message, the assistant's, rather than answer after it.
    pub continues: bool,
}

impl Conversation {
    /// The conversation of `req`.
    pub fn of(req: &ChatRequest) -> Self {
        Self {
            messages: req.messages.iter().map(turn).collect(),
            tools: req
                .offered_tools()
                .iter()
                .filter_map(|t| serde_json::to_value(t).ok())
                .collect(),
            continues: req.continue_final_message == Some(true)
                && req
                    .messages
                    .last()
                    .is_some_and(|m| m.role == Role::Assistant),
        }
    }

    /// The answer's stream: it may open with a tool call when tools are offered.
    pub fn answer_stream(&self) -> AnswerStream {
        AnswerStream::new(!self.tools.is_empty())
    }

    /// The prompt: an answer after the conversation, or the rest of its last turn.
    pub fn prompt(&self) -> Prompt<'_> {
        if self.continues {
            Prompt::Continue(&self.messages)
        } else {
            Prompt::WithTools(&self.messages, &self.tools)
        }
    }
}

/// A message as the template sees it: calls' arguments as JSON values, as Hugging Face's
/// templates expect them (a string that is not JSON stays a string).
fn turn(m: &Message) -> ChatMessage {
    let mut turn = ChatMessage::new(m.role.as_str(), m.content.clone());
    turn.tool_call_id = m.tool_call_id.clone();
    turn.tool_calls = m.tool_calls.as_ref().map(|calls| {
        calls
            .iter()
            .map(|c| {
                let arguments = serde_json::from_str(&c.function.arguments)
                    .unwrap_or_else(|_| Value::String(c.function.arguments.clone()));
                serde_json::json!({"id": c.id, "type": "function",
                    "function": {"name": c.function.name, "arguments": arguments}})
            })
            .collect()
    });
    turn
}

/// What the engine does where a request is silent.
#[derive(Debug, Clone, Copy)]
pub struct Defaults {
    pub max_tokens: u32,
    /// KV cache positions.
    pub context: usize,
}

/// The engine's settings for a request that passed [`ChatRequest::validate`]. `constrain`
/// compiles its `response_format` or tool call for the model's vocabulary: an invalid schema
/// is a 400 naming `tools` or `response_format`, before anything is generated.
pub fn params(
    req: &ChatRequest,
    defaults: Defaults,
    constrain: impl FnOnce(&OutputFormat) -> Result<Constraint, GrammarError>,
) -> Result<GenerateParams, ApiError> {
    let field = if req.offered_tools().is_empty() {
        "response_format"
    } else {
        "tools"
    };
    let constraint = answer_format(req)
        .map(|format| constrain(&format))
        .transpose()
        .map_err(|e| ApiError::invalid(field, e.to_string()))?;
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

/// What the engine must hold the answer to: a call to an offered tool (or, unless one is
/// required, an answer in the `response_format`), else the `response_format` (`None`: free
/// text).
pub fn answer_format(req: &ChatRequest) -> Option<OutputFormat> {
    let answer = req.response_format.as_ref().and_then(output_format);
    let tools = req.offered_tools();
    if tools.is_empty() {
        return answer;
    }
    let only = match &req.tool_choice {
        Some(ToolChoice::Function(named)) => Some(named.function.name.as_str()),
        _ => None,
    };
    let functions = tools
        .iter()
        .map(|t| &t.function)
        .filter(|f| only.is_none_or(|name| f.name == name))
        .map(|f| FunctionSpec {
            name: f.name.clone(),
            parameters: f
                .parameters
                .clone()
                .unwrap_or_else(|| serde_json::json!({"type": "object", "properties": {}})),
            strict: f.strict.unwrap_or(false),
        })
        .collect();
    let required = only.is_some()
        || matches!(
            req.tool_choice,
            Some(ToolChoice::Mode(ToolChoiceMode::Required))
        );
    Some(OutputFormat::ToolCall {
        functions,
        required,
        answer: answer.map(Box::new),
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

    #[test]
    fn tool_choice_decides_which_calls_the_grammar_allows() {
        let with = |choice: &str| {
            request(&format!(
                r#"{{"messages":[{{"role":"user","content":"x"}}],"tool_choice":{choice},
                "tools":[{{"type":"function","function":{{"name":"a"}}}},
                         {{"type":"function","function":{{"name":"b","strict":true,
                           "parameters":{{"type":"object"}}}}}}]}}"#
            ))
        };
        let format = |choice: &str| answer_format(&with(choice));
        let Some(OutputFormat::ToolCall {
            functions,
            required,
            answer,
        }) = format(r#""auto""#)
        else {
            panic!("a tool format")
        };
        assert_eq!((functions.len(), required, answer), (2, false, None));
        assert!(functions[1].strict && !functions[0].strict);
        assert!(matches!(
            format(r#""required""#),
            Some(OutputFormat::ToolCall { required: true, ref functions, .. }) if functions.len() == 2
        ));
        assert!(matches!(
            format(r#"{"type":"function","function":{"name":"b"}}"#),
            Some(OutputFormat::ToolCall { required: true, ref functions, .. })
                if functions.len() == 1 && functions[0].name == "b"
        ));
        assert_eq!(format(r#""none""#), None);
        let none = Conversation::of(&with(r#""none""#));
        assert!(none.tools.is_empty());
        assert_eq!(Conversation::of(&with(r#""auto""#)).tools.len(), 2);
    }

    #[test]
    fn earlier_calls_reach_the_template_with_their_arguments_as_json() {
        let req = request(
            r#"{"messages":[{"role":"user","content":"x"},
                {"role":"assistant","tool_calls":[{"id":"c","type":"function",
                  "function":{"name":"a","arguments":"{\"k\":1}"}}]},
                {"role":"tool","tool_call_id":"c","content":"ok"}]}"#,
        );
        let c = Conversation::of(&req);
        let calls = c.messages[1].tool_calls.as_ref().expect("calls");
        assert_eq!(
            calls[0]["function"]["arguments"],
            serde_json::json!({"k": 1})
        );
        assert_eq!(c.messages[2].tool_call_id.as_deref(), Some("c"));
    }
}
