//! OpenAI's function calling: the `tools` a request offers, its `tool_choice`, and the
//! `tool_calls` an assistant answers with (whole, or as streamed deltas).

use serde::{Deserialize, Serialize};

use crate::ApiError;

/// The kind of a tool: OpenAI defines only functions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ToolKind {
    #[default]
    Function,
}

/// One tool a request offers the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tool {
    #[serde(rename = "type")]
    pub kind: ToolKind,
    pub function: FunctionDefinition,
}

/// A function the model may call: its name, what it does, and its arguments' JSON Schema.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FunctionDefinition {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The arguments' JSON Schema; absent means no arguments (`{}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<serde_json::Value>,
    /// Refuse a schema keyword that cannot be enforced, as `response_format`'s `strict`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

/// `tool_choice`: a mode, or one function the model must call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ToolChoice {
    Mode(ToolChoiceMode),
    Function(NamedToolChoice),
}

/// Whether the model may, must, or must not call a tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ToolChoiceMode {
    /// Answer in text; the tools are not offered.
    None,
    /// Answer in text or call a tool, as the model chooses (the default with tools).
    Auto,
    /// Call one of the tools.
    Required,
}

/// `{"type": "function", "function": {"name": …}}`: call this function.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamedToolChoice {
    #[serde(rename = "type")]
    pub kind: ToolKind,
    pub function: FunctionName,
}

/// A function named by `tool_choice`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FunctionName {
    pub name: String,
}

/// A call the assistant made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: ToolKind,
    pub function: FunctionCall,
}

/// The function called and its arguments, as a JSON string (OpenAI's shape).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FunctionCall {
    pub name: String,
    pub arguments: String,
}

/// A streamed piece of a tool call; pieces with the same `index` concatenate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCallDelta {
    pub index: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<ToolKind>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function: Option<FunctionCallDelta>,
}

/// A streamed piece of a function call.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FunctionCallDelta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
}

impl ToolCallDelta {
    /// The whole of `call` as the one delta at `index`.
    pub fn whole(index: u32, call: &ToolCall) -> Self {
        Self {
            index,
            id: Some(call.id.clone()),
            kind: Some(call.kind),
            function: Some(FunctionCallDelta {
                name: Some(call.function.name.clone()),
                arguments: Some(call.function.arguments.clone()),
            }),
        }
    }
}

/// Whether `name` is a valid function or schema name: 1 to 64 letters, digits, `_` or `-`.
pub fn is_identifier(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Checks `tools` and `tool_choice` together: names are identifiers and distinct, parameters
/// are schemas, and a choice names a function that is offered.
pub fn validate(tools: Option<&[Tool]>, choice: Option<&ToolChoice>) -> Result<(), ApiError> {
    let tools = tools.unwrap_or_default();
    for (i, tool) in tools.iter().enumerate() {
        let f = &tool.function;
        if !is_identifier(&f.name) {
            return Err(ApiError::invalid(
                format!("tools[{i}].function.name"),
                "must be 1 to 64 letters, digits, underscores or dashes",
            ));
        }
        if tools[..i].iter().any(|t| t.function.name == f.name) {
            return Err(ApiError::invalid(
                format!("tools[{i}].function.name"),
                format!("`{}` is offered twice", f.name),
            ));
        }
        if !matches!(&f.parameters, None | Some(serde_json::Value::Object(_))) {
            return Err(ApiError::invalid(
                format!("tools[{i}].function.parameters"),
                "must be a JSON Schema object",
            ));
        }
    }
    match choice {
        None | Some(ToolChoice::Mode(ToolChoiceMode::None | ToolChoiceMode::Auto)) => Ok(()),
        Some(_) if tools.is_empty() => Err(ApiError::invalid(
            "tool_choice",
            "a tool must be called, but `tools` offers none",
        )),
        Some(ToolChoice::Mode(ToolChoiceMode::Required)) => Ok(()),
        Some(ToolChoice::Function(named)) => {
            let name = &named.function.name;
            if tools.iter().any(|t| &t.function.name == name) {
                Ok(())
            } else {
                Err(ApiError::invalid(
                    "tool_choice",
                    format!("names `{name}`, which is not among `tools`"),
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools(json: &str) -> Vec<Tool> {
        serde_json::from_str(json).expect("tools parse")
    }

    #[test]
    fn every_choice_shape_parses() {
        let parse = |s: &str| serde_json::from_str::<ToolChoice>(s).expect("parses");
        assert_eq!(parse(r#""auto""#), ToolChoice::Mode(ToolChoiceMode::Auto));
        assert_eq!(parse(r#""none""#), ToolChoice::Mode(ToolChoiceMode::None));
        assert_eq!(
            parse(r#""required""#),
            ToolChoice::Mode(ToolChoiceMode::Required)
        );
        let ToolChoice::Function(named) = parse(r#"{"type":"function","function":{"name":"f"}}"#)
        else {
            panic!("not named")
        };
        assert_eq!(named.function.name, "f");
        assert!(serde_json::from_str::<ToolChoice>(r#""sometimes""#).is_err());
    }

    #[test]
    fn bad_tools_and_choices_are_refused_by_field() {
        let offered = tools(
            r#"[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}]"#,
        );
        let named = |n: &str| {
            serde_json::from_value::<ToolChoice>(
                serde_json::json!({"type":"function","function":{"name":n}}),
            )
            .expect("parses")
        };
        assert!(validate(Some(&offered), Some(&named("get_weather"))).is_ok());
        let err = validate(Some(&offered), Some(&named("get_time"))).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("tool_choice"));
        assert!(err.message.contains("get_time"), "{}", err.message);
        let required = ToolChoice::Mode(ToolChoiceMode::Required);
        assert_eq!(
            validate(None, Some(&required))
                .unwrap_err()
                .param
                .as_deref(),
            Some("tool_choice")
        );
        let spaced = tools(r#"[{"type":"function","function":{"name":"get weather"}}]"#);
        assert_eq!(
            validate(Some(&spaced), None).unwrap_err().param.as_deref(),
            Some("tools[0].function.name")
        );
        let twice = [offered[0].clone(), offered[0].clone()];
        assert_eq!(
            validate(Some(&twice), None).unwrap_err().param.as_deref(),
            Some("tools[1].function.name")
        );
        let listed = tools(r#"[{"type":"function","function":{"name":"f","parameters":[1]}}]"#);
        assert_eq!(
            validate(Some(&listed), None).unwrap_err().param.as_deref(),
            Some("tools[0].function.parameters")
        );
    }

    #[test]
    fn a_whole_call_is_one_delta_with_everything() {
        let call = ToolCall {
            id: "call_1".into(),
            kind: ToolKind::Function,
            function: FunctionCall {
                name: "f".into(),
                arguments: r#"{"x":1}"#.into(),
            },
        };
        let wire = serde_json::to_value(ToolCallDelta::whole(0, &call)).expect("serialises");
        assert_eq!(
            wire,
            serde_json::json!({"index":0,"id":"call_1","type":"function",
                "function":{"name":"f","arguments":"{\"x\":1}"}})
        );
    }
}
