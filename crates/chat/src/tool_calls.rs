//! The engine's answer as OpenAI's: text streams as content, except a tool call, which is held
//! until it is whole and then returned as `tool_calls`.

use straddle_engine::Finish;
use straddle_engine::tool_prompt::{CALL_CLOSE, CALL_OPEN};
use straddle_protocol::{FinishReason, FunctionCall, ToolCall, ToolKind};

use crate::finish_reason;

/// An answer as it streams: what to show as content now, and at the end the tool call, if the
/// answer was one.
#[derive(Debug, Clone, Default)]
pub struct AnswerStream {
    /// The request offered tools, so the answer may open with a call.
    may_call: bool,
    /// Text not shown yet: the start of a possible call, or a call.
    held: String,
    /// Whether the answer is a call (`Some(true)`), text (`Some(false)`), or not yet known.
    calling: Option<bool>,
}

/// How an answer ended, in OpenAI's terms.
#[derive(Debug, Clone, PartialEq)]
pub struct Ending {
    /// Content not yet shown.
    pub content: String,
    pub tool_calls: Vec<ToolCall>,
    pub reason: FinishReason,
}

impl AnswerStream {
    /// A stream for an answer that may be a tool call when `may_call`.
    pub fn new(may_call: bool) -> Self {
        Self {
            may_call,
            ..Self::default()
        }
    }

    /// The part of the answer so far that can be shown as content now, given its next piece.
    pub fn push(&mut self, piece: &str) -> String {
        if !self.may_call || self.calling == Some(false) {
            return piece.to_string();
        }
        self.held.push_str(piece);
        if self.calling.is_some() || self.held.is_empty() || CALL_OPEN.starts_with(&self.held) {
            return String::new();
        }
        let calling = self.held.starts_with(CALL_OPEN);
        self.calling = Some(calling);
        if calling {
            String::new()
        } else {
            std::mem::take(&mut self.held)
        }
    }

    /// The end of the answer, as the engine finished it. A call the engine completed becomes
    /// `tool_calls` with `id`; one cut short is returned as the text it is, with the engine's
    /// reason (`length`), never as a call.
    pub fn finish(self, finish: Finish, id: &str) -> Ending {
        let call = (self.calling == Some(true) && finish == Finish::Stop)
            .then(|| parse_call(&self.held, id))
            .flatten();
        match call {
            Some(call) => Ending {
                content: String::new(),
                tool_calls: vec![call],
                reason: FinishReason::ToolCalls,
            },
            None => Ending {
                content: self.held,
                tool_calls: Vec::new(),
                reason: finish_reason(finish),
            },
        }
    }
}

/// The call `text` writes, if it is one: `<tool_call>{"name", "arguments"}</tool_call>`.
fn parse_call(text: &str, id: &str) -> Option<ToolCall> {
    let json = text.strip_prefix(CALL_OPEN)?.strip_suffix(CALL_CLOSE)?;
    let call: serde_json::Value = serde_json::from_str(json).ok()?;
    Some(ToolCall {
        id: id.to_string(),
        kind: ToolKind::Function,
        function: FunctionCall {
            name: call.get("name")?.as_str()?.to_string(),
            arguments: call.get("arguments")?.to_string(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(may_call: bool, pieces: &[&str]) -> (String, AnswerStream) {
        let mut s = AnswerStream::new(may_call);
        let shown = pieces.iter().map(|p| s.push(p)).collect();
        (shown, s)
    }

    #[test]
    fn a_call_is_held_and_returned_whole() {
        let pieces = [
            "<",
            "tool",
            "_call>",
            r#"{"name":"get_weather","#,
            r#""arguments":{"city":"Oslo"}}"#,
            "</tool_call>",
        ];
        let (shown, s) = stream(true, &pieces);
        assert_eq!(shown, "");
        let end = s.finish(Finish::Stop, "call_1");
        assert_eq!(end.reason, FinishReason::ToolCalls);
        assert_eq!(end.content, "");
        assert_eq!(end.tool_calls[0].id, "call_1");
        assert_eq!(end.tool_calls[0].function.name, "get_weather");
        assert_eq!(end.tool_calls[0].function.arguments, r#"{"city":"Oslo"}"#);
    }

    #[test]
    fn text_streams_at_once_and_a_cut_call_is_never_passed_off_as_one() {
        let (shown, s) = stream(true, &["Hello", " there"]);
        assert_eq!(shown, "Hello there");
        assert_eq!(s.finish(Finish::Stop, "c").reason, FinishReason::Stop);
        // An opening `<` that turns out to be text is shown once it is known to be text.
        let (shown, _) = stream(true, &["<", "b>bold"]);
        assert_eq!(shown, "<b>bold");
        let (_, s) = stream(true, &["<tool_call>", r#"{"name":"get_wea"#]);
        let end = s.finish(Finish::Length, "c");
        assert_eq!(end.reason, FinishReason::Length);
        assert!(end.tool_calls.is_empty());
        assert_eq!(end.content, r#"<tool_call>{"name":"get_wea"#);
        // Without tools nothing is held, whatever the text.
        let (shown, _) = stream(false, &["<tool_call>", "x"]);
        assert_eq!(shown, "<tool_call>x");
    }
}
