//! How tools reach a model whose chat template does not render them, and how every model
//! writes a call.
//!
//! A call is always `<tool_call>{"name": …, "arguments": {…}}</tool_call>`, the format of
//! Hermes, Qwen 2.5/3 and SmolLM3; the grammar holds the model to it whatever the template,
//! so one parser reads every answer. A template that renders `tools` itself (most tool-trained
//! models ship one) gets the tools and the calls in the shape Hugging Face's templates take.
//! Otherwise the fallback below writes them into the conversation as text: the tool list and
//! the call format in the system turn, earlier calls as the assistant's text, and results as
//! a user turn of `<tool_response>` blocks.

use serde_json::{Value, json};

use crate::message::ChatMessage;

/// What opens a tool call in an answer.
pub const CALL_OPEN: &str = "<tool_call>";
/// What closes a tool call in an answer.
pub const CALL_CLOSE: &str = "</tool_call>";

/// A call as the model writes it.
pub fn call_text(name: &str, arguments: &Value) -> String {
    let call = json!({"name": name, "arguments": arguments});
    format!("{CALL_OPEN}{call}{CALL_CLOSE}")
}

/// Whether the conversation mentions tools anywhere: offered, called or answered.
pub fn involves_tools(messages: &[ChatMessage], tools: &[Value]) -> bool {
    !tools.is_empty()
        || messages
            .iter()
            .any(|m| m.tool_calls.is_some() || m.role == "tool")
}

/// The conversation with `tools`, its calls and their results written as plain turns, for a
/// template that knows nothing of tools.
pub fn fallback_turns(messages: &[ChatMessage], tools: &[Value]) -> Vec<ChatMessage> {
    let mut turns: Vec<ChatMessage> = Vec::with_capacity(messages.len() + 1);
    let (system, rest) = match messages.split_first() {
        Some((first, rest)) if first.role == "system" || first.role == "developer" => {
            (Some(first.content.as_str()), rest)
        }
        _ => (None, messages),
    };
    match (system, tools.is_empty()) {
        (Some(text), true) => turns.push(ChatMessage::new("system", text)),
        (system, false) => turns.push(ChatMessage::new("system", tool_system(system, tools))),
        (None, true) => {}
    }
    for m in rest {
        if m.role == "tool" {
            let response = format!("<tool_response>\n{}\n</tool_response>", m.content);
            match turns.last_mut() {
                // Results of several calls answer as one user turn.
                Some(last) if last.role == "user" && last.content.ends_with("</tool_response>") => {
                    last.content = format!("{}\n{response}", last.content);
                }
                _ => turns.push(ChatMessage::new("user", response)),
            }
        } else {
            turns.push(ChatMessage::new(m.role.clone(), plain_content(m)));
        }
    }
    turns
}

/// A turn's text with its calls written after it.
fn plain_content(m: &ChatMessage) -> String {
    let calls = m.tool_calls.iter().flat_map(|calls| calls.iter());
    let written: Vec<String> = calls
        .filter_map(|c| {
            let f = c.get("function")?;
            Some(call_text(f.get("name")?.as_str()?, f.get("arguments")?))
        })
        .collect();
    match (m.content.is_empty(), written.is_empty()) {
        (_, true) => m.content.clone(),
        (true, false) => written.join("\n"),
        (false, false) => format!("{}\n{}", m.content, written.join("\n")),
    }
}

/// The system turn that offers `tools`: the page's own system text first.
fn tool_system(system: Option<&str>, tools: &[Value]) -> String {
    let listed: Vec<String> = tools
        .iter()
        .map(|t| t.get("function").unwrap_or(t).to_string())
        .collect();
    let lead = system.map(|s| format!("{s}\n\n")).unwrap_or_default();
    format!(
        "{lead}You can call these tools:\n<tools>\n{}\n</tools>\n\nTo call one, answer with only {CALL_OPEN}{{\"name\": <tool name>, \"arguments\": <arguments as JSON>}}{CALL_CLOSE}. A tool's result comes back in <tool_response></tool_response>; then answer the user.",
        listed.join("\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> Value {
        json!({"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}})
    }

    #[test]
    fn the_tool_list_joins_the_system_turn_and_calls_become_text() {
        let mut call = ChatMessage::new("assistant", "");
        call.tool_calls = Some(vec![json!({"id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}})]);
        let mut result = ChatMessage::new("tool", "-3C");
        result.tool_call_id = Some("c1".into());
        let turns = fallback_turns(
            &[
                ChatMessage::new("system", "Be brief."),
                ChatMessage::new("user", "Weather in Oslo?"),
                call,
                result.clone(),
                result,
            ],
            &[weather()],
        );
        let roles: Vec<&str> = turns.iter().map(|t| t.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "user"]);
        assert!(
            turns[0]
                .content
                .starts_with("Be brief.\n\nYou can call these tools:")
        );
        assert!(turns[0].content.contains(r#""name":"get_weather""#));
        assert_eq!(
            turns[2].content,
            r#"<tool_call>{"name":"get_weather","arguments":{"city":"Oslo"}}</tool_call>"#
        );
        assert_eq!(
            turns[3].content,
            "<tool_response>\n-3C\n</tool_response>\n<tool_response>\n-3C\n</tool_response>"
        );
    }

    #[test]
    fn without_tools_a_plain_conversation_is_unchanged() {
        let plain = [ChatMessage::new("user", "Hi")];
        assert!(!involves_tools(&plain, &[]));
        assert_eq!(fallback_turns(&plain, &[]).len(), 1);
        assert!(involves_tools(&plain, &[weather()]));
    }
}
