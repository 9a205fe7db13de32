//! Chat templates: the GGUF's `tokenizer.chat_template` (Jinja) rendered with minijinja.

use minijinja::{Environment, context};
use serde_json::{Value, json};

use crate::message::ChatMessage;
use crate::tool_prompt;

/// A template that failed to parse or render.
#[derive(Debug, thiserror::Error)]
#[error("chat template: {0}")]
pub struct TemplateError(String);

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos: String,
    eos: String,
    /// The template renders `tools` itself; otherwise [`tool_prompt::fallback_turns`] does.
    native_tools: bool,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ChatTemplate")
    }
}

impl ChatTemplate {
    /// Compiles `source` (the GGUF's `tokenizer.chat_template`).
    pub fn new(source: &str, bos: &str, eos: &str) -> Result<Self, TemplateError> {
        let mut env = Environment::new();
        // HF templates call Python string methods (`.strip()`, `.startswith()`).
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> Result<String, minijinja::Error> {
                Err(minijinja::Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    msg,
                ))
            },
        );
        env.add_filter("tojson", tojson);
        env.add_template_owned("chat", source.to_string())
            .map_err(|e| TemplateError(e.to_string()))?;
        let mut template = Self {
            env,
            bos: bos.into(),
            eos: eos.into(),
            native_tools: false,
        };
        template.native_tools = template.renders_tools();
        Ok(template)
    }

    /// Whether the template shows a tool it is given (as llama.cpp decides it too: by
    /// rendering one and looking for its name).
    fn renders_tools(&self) -> bool {
        const PROBE: &str = "straddle_probe_tool";
        let tools = [json!({"type": "function", "function": {"name": PROBE,
            "description": "", "parameters": {"type": "object", "properties": {}}}})];
        self.render_raw(&[ChatMessage::new("user", "x")], Some(&tools), true)
            .is_ok_and(|text| text.contains(PROBE))
    }

    /// Whether the template renders tools itself.
    pub fn renders_tools_natively(&self) -> bool {
        self.native_tools
    }

    /// ChatML, for models that ship without a template.
    pub fn chatml() -> Self {
        const CHATML: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
        Self::new(CHATML, "", "<|im_end|>").expect("the built-in ChatML template compiles")
    }

    /// Gemma's turns, for Gemma files that ship without a template: `assistant` is `model`,
    /// and a system message opens the first user turn (Gemma has no system role).
    pub fn gemma() -> Self {
        const GEMMA: &str = "{% if messages and messages[0].role == 'system' %}{% set system = messages[0].content ~ '\n\n' %}{% set turns = messages[1:] %}{% else %}{% set system = '' %}{% set turns = messages %}{% endif %}{% for m in turns %}<start_of_turn>{{ 'model' if m.role == 'assistant' else m.role }}\n{{ system if loop.first else '' }}{{ m.content }}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}";
        Self::new(GEMMA, "", "<end_of_turn>").expect("the built-in Gemma template compiles")
    }

    /// Renders `messages`, ending with the assistant's opening when `add_generation_prompt`.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TemplateError> {
        self.render_with_tools(messages, &[], add_generation_prompt)
    }

    /// Renders `messages` offering `tools` (OpenAI's `{"type": "function", "function": …}`
    /// objects): through the template where it renders tools, else as the fallback's turns.
    pub fn render_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: &[Value],
        add_generation_prompt: bool,
    ) -> Result<String, TemplateError> {
        if !tool_prompt::involves_tools(messages, tools) {
            return self.render_raw(messages, None, add_generation_prompt);
        }
        if self.native_tools {
            let offered = (!tools.is_empty()).then_some(tools);
            return self.render_raw(messages, offered, add_generation_prompt);
        }
        let turns = tool_prompt::fallback_turns(messages, tools);
        self.render_raw(&turns, None, add_generation_prompt)
    }

    fn render_raw(
        &self,
        messages: &[ChatMessage],
        tools: Option<&[Value]>,
        add_generation_prompt: bool,
    ) -> Result<String, TemplateError> {
        let tmpl = self
            .env
            .get_template("chat")
            .map_err(|e| TemplateError(e.to_string()))?;
        tmpl.render(context! {
            messages => messages,
            tools => tools,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos,
            eos_token => self.eos,
        })
        .map_err(|e| TemplateError(e.to_string()))
    }

    /// Renders `messages` so that the model continues the last one, the assistant's: the
    /// conversation up to the end of that turn's text, without what closes the turn (as
    /// `continue_final_message` does in Hugging Face's `apply_chat_template`). An empty last
    /// turn is the plain generation prompt.
    pub fn render_continuing(&self, messages: &[ChatMessage]) -> Result<String, TemplateError> {
        let Some((last, earlier)) = messages.split_last() else {
            return self.render(messages, true);
        };
        if last.role != "assistant" {
            return Err(TemplateError(format!(
                "only an assistant turn can be continued; the last message is the {}'s",
                last.role
            )));
        }
        let text = last.content.trim();
        if text.is_empty() {
            return self.render(earlier, true);
        }
        let rendered = self.render(messages, false)?;
        let Some(at) = rendered.rfind(text) else {
            return Err(TemplateError(
                "the template does not show the assistant's turn as given, so it cannot be continued"
                    .into(),
            ));
        };
        // Keep the turn's own leading and trailing spaces where the template kept them.
        let whole = last.content.trim_start();
        let end = if rendered[at..].starts_with(whole) {
            at + whole.len()
        } else {
            at + text.len()
        };
        Ok(rendered[..end].to_string())
    }
}

/// Jinja's `tojson` as Hugging Face's chat templates run it (Python's `json.dumps` with
/// `ensure_ascii=False`): `", "` and `": "` between items, keys in their given order, so a
/// tool reaches the model written as it was trained on.
fn tojson(value: minijinja::Value) -> Result<String, minijinja::Error> {
    let json = serde_json::to_value(&value).map_err(|e| {
        minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, e.to_string())
    })?;
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, PythonJson);
    serde::Serialize::serialize(&json, &mut ser).map_err(|e| {
        minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, e.to_string())
    })?;
    String::from_utf8(out)
        .map_err(|e| minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, e.to_string()))
}

/// serde_json's compact output with Python's default separators.
struct PythonJson;

/// Python's item separator, `", "`, before every item but the first.
fn comma_unless_first<W: ?Sized + std::io::Write>(
    writer: &mut W,
    first: bool,
) -> std::io::Result<()> {
    if first {
        Ok(())
    } else {
        writer.write_all(b", ")
    }
}

impl serde_json::ser::Formatter for PythonJson {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        comma_unless_first(writer, first)
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        comma_unless_first(writer, first)
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
    ) -> std::io::Result<()> {
        writer.write_all(b": ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tojson_writes_as_python_json_dumps_in_the_given_key_order() {
        let t = ChatTemplate::new("{% for t in tools %}{{ t | tojson }}{% endfor %}", "", "")
            .expect("compiles");
        assert!(t.renders_tools_natively());
        let tool: Value = serde_json::from_str(
            r#"{"type": "function", "function": {"name": "météo", "b": [1, 2], "a": null}}"#,
        )
        .expect("json");
        let user = [ChatMessage::new("user", "x")];
        let text = t.render_with_tools(&user, &[tool], false).expect("renders");
        assert_eq!(
            text,
            r#"{"type": "function", "function": {"name": "météo", "b": [1, 2], "a": null}}"#
        );
    }

    #[test]
    fn a_continued_turn_stops_where_its_text_does() {
        let t = ChatTemplate::chatml();
        let turns = |reply: &str| {
            vec![
                ChatMessage::new("user", "Name a colour."),
                ChatMessage::new("assistant", reply),
            ]
        };
        assert_eq!(
            t.render_continuing(&turns("The sky is")).expect("render"),
            "<|im_start|>user\nName a colour.<|im_end|>\n<|im_start|>assistant\nThe sky is"
        );
        // A trailing space the template keeps stays: the next token may start a word.
        assert!(
            t.render_continuing(&turns("Blue, and "))
                .expect("render")
                .ends_with("assistant\nBlue, and ")
        );
        // Nothing said yet: the ordinary generation prompt.
        assert_eq!(
            t.render_continuing(&turns("")).expect("render"),
            t.render(&turns("")[..1], true).expect("render")
        );
        let user_last = [ChatMessage::new("user", "Hi")];
        assert!(t.render_continuing(&user_last).is_err());
    }

    #[test]
    fn renders_a_jinja_template_with_generation_prompt() {
        let src = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nBe brief<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
        let t = ChatTemplate::new(src, "<|im_start|>", "<|im_end|>").expect("compiles");
        let out = t
            .render(&[ChatMessage::new("user", "Hi")], true)
            .expect("renders");
        assert_eq!(
            out,
            "<|im_start|>system\nBe brief<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        let no_prompt = t
            .render(&[ChatMessage::new("user", "Hi")], false)
            .expect("renders");
        assert!(!no_prompt.ends_with("assistant\n"));
    }

    #[test]
    fn python_string_methods_and_raise_exception_work() {
        let t = ChatTemplate::new("{{ messages[0].content.strip() }}{% if messages|length > 1 %}{{ raise_exception('one only') }}{% endif %}", "", "")
            .expect("compiles");
        assert_eq!(
            t.render(&[ChatMessage::new("user", "  x ")], false)
                .expect("renders"),
            "x"
        );
        let err = t
            .render(
                &[ChatMessage::new("user", "a"), ChatMessage::new("user", "b")],
                false,
            )
            .unwrap_err();
        assert!(err.to_string().contains("one only"));
    }

    #[test]
    fn a_template_that_renders_tools_gets_them_and_one_that_does_not_gets_the_fallback() {
        let tool = json!({"type": "function", "function": {"name": "get_weather"}});
        let native = ChatTemplate::new(
            "{% if tools %}<tools>{% for t in tools %}{{ t.function.name }}{% endfor %}</tools>{% endif %}{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}",
            "",
            "",
        )
        .expect("compiles");
        assert!(native.renders_tools_natively());
        let user = [ChatMessage::new("user", "Hi")];
        assert_eq!(
            native
                .render_with_tools(&user, std::slice::from_ref(&tool), true)
                .expect("render"),
            "<tools>get_weather</tools>[user]Hi"
        );
        let chatml = ChatTemplate::chatml();
        assert!(!chatml.renders_tools_natively());
        let text = chatml
            .render_with_tools(&user, &[tool], true)
            .expect("render");
        assert!(
            text.starts_with("<|im_start|>system\nYou can call these tools:"),
            "{text}"
        );
        assert!(text.ends_with("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"));
    }

    #[test]
    fn malformed_template_is_an_error() {
        assert!(ChatTemplate::new("{% for %}", "", "").is_err());
    }

    #[test]
    fn gemma_turns_fold_the_system_message_into_the_first_user_turn() {
        let messages = [
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", "Hi"),
            ChatMessage::new("assistant", "Hello."),
            ChatMessage::new("user", "Capital of Italy?"),
        ];
        let text = ChatTemplate::gemma()
            .render(&messages, true)
            .expect("render");
        assert_eq!(
            text,
            "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n<start_of_turn>user\nCapital of Italy?<end_of_turn>\n<start_of_turn>model\n"
        );
    }
}
