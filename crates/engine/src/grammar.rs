//! Constrained decoding: an answer that must be JSON, or JSON under a schema, is generated
//! with every token the grammar cannot continue masked out before sampling.
//!
//! The grammar engine is `llguidance` (the one llama.cpp and vLLM use): it compiles a JSON
//! Schema once per request and computes each step's mask over a token trie built once per
//! vocabulary. This module only feeds it our vocabulary and applies its masks.

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use serde_json::{Value, json};

use crate::tokenizer::Tokenizer;
use crate::tool_prompt;

/// Why a grammar could not be built, compiled or followed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum GrammarError {
    /// The request's schema is not valid JSON Schema, or uses what the grammar engine does
    /// not support (under `strict`).
    #[error("invalid JSON schema: {0}")]
    InvalidSchema(String),
    /// The vocabulary could not be turned into a token trie.
    #[error("the grammar engine cannot use this vocabulary: {0}")]
    Vocabulary(String),
    /// The grammar refused a token it had allowed, or failed mid-answer.
    #[error("constrained decoding failed: {0}")]
    Decoding(String),
}

/// What an answer must be: OpenAI's `response_format` (or its `tools`) as the engine sees it.
#[derive(Debug, Clone, PartialEq)]
pub enum OutputFormat {
    /// Any JSON object (`{"type": "json_object"}`).
    JsonObject,
    /// JSON valid under `schema`. With `strict`, a keyword the grammar engine cannot enforce
    /// is an error and objects that do not say otherwise take no properties beyond those
    /// listed (OpenAI's strict mode requires `additionalProperties: false` everywhere); without
    /// it, unenforceable keywords are ignored.
    JsonSchema { schema: Value, strict: bool },
    /// A call to one of `functions`, written as [`tool_prompt::call_text`] writes it; unless
    /// `required`, the model may answer instead, in free text or in the JSON format `answer`.
    ToolCall {
        functions: Vec<FunctionSpec>,
        required: bool,
        answer: Option<Box<OutputFormat>>,
    },
}

/// A function an answer may call, as the grammar needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct FunctionSpec {
    pub name: String,
    /// Its arguments' JSON Schema.
    pub parameters: Value,
    /// Refuse what cannot be enforced, as [`OutputFormat::JsonSchema`]'s `strict`.
    pub strict: bool,
}

impl OutputFormat {
    /// The grammar llguidance compiles.
    fn grammar(&self) -> TopLevelGrammar {
        match self {
            OutputFormat::ToolCall {
                functions,
                required,
                answer,
            } => TopLevelGrammar::from_lark(tool_lark(functions, *required, answer.as_deref())),
            json => TopLevelGrammar::from_json_schema(json.json_schema()),
        }
    }

    /// The schema of a JSON format as llguidance takes it (any JSON for a tool call, which is
    /// never nested in another format).
    fn json_schema(&self) -> Value {
        match self {
            OutputFormat::JsonObject => guided(json!({"type": "object"}), false),
            OutputFormat::JsonSchema { schema, strict } => guided(schema.clone(), *strict),
            OutputFormat::ToolCall { .. } => guided(json!({}), false),
        }
    }
}

/// `schema` with llguidance's options: compact JSON (no free whitespace, which a small model
/// can fill forever), lenient unless `strict`, and under `strict` closed objects.
fn guided(mut schema: Value, strict: bool) -> Value {
    if strict {
        close_objects(&mut schema);
    }
    if let Value::Object(map) = &mut schema {
        map.insert(
            "x-guidance".into(),
            json!({"whitespace_flexible": false, "lenient": !strict}),
        );
    }
    schema
}

/// The Lark grammar of a tool call (or, unless `required`, an answer): the call's JSON names
/// one function and holds its arguments. Free text may not open with `<`, so that a call
/// cannot be begun and abandoned as text.
fn tool_lark(functions: &[FunctionSpec], required: bool, answer: Option<&OutputFormat>) -> String {
    let calls: Vec<Value> = functions
        .iter()
        .map(|f| {
            json!({"type": "object", "properties": {"name": {"const": f.name},
                "arguments": f.parameters}, "required": ["name", "arguments"],
                "additionalProperties": false})
        })
        .collect();
    let strict = functions.iter().all(|f| f.strict);
    let call = guided(json!({"anyOf": calls}), strict);
    let (open, close) = (tool_prompt::CALL_OPEN, tool_prompt::CALL_CLOSE);
    let mut lark = format!("call: \"{open}\" %json {call} \"{close}\"\n");
    match (required, answer) {
        (true, _) => lark.insert_str(0, "start: call\n"),
        (false, None) => {
            lark.insert_str(0, "start: call | TEXT\n");
            lark.push_str("TEXT: /[^<][\\s\\S]*/\n");
        }
        (false, Some(format)) => {
            lark.insert_str(0, "start: call | answer\n");
            lark.push_str(&format!("answer: %json {}\n", format.json_schema()));
        }
    }
    lark
}

/// Gives every object schema that says nothing of `additionalProperties` a `false` one. Only
/// narrows: whatever it admits, the original schema admits. `allOf` branches are left open,
/// since closing each would refuse the properties the others add.
fn close_objects(schema: &mut Value) {
    let Value::Object(node) = schema else {
        return;
    };
    let is_object = node.contains_key("properties")
        || match node.get("type") {
            Some(Value::String(t)) => t == "object",
            Some(Value::Array(types)) => types.iter().any(|t| t == "object"),
            _ => false,
        };
    if is_object && !node.contains_key("additionalProperties") && !node.contains_key("allOf") {
        node.insert("additionalProperties".into(), Value::Bool(false));
    }
    for (key, child) in node.iter_mut() {
        match (key.as_str(), child) {
            ("properties" | "patternProperties" | "$defs" | "definitions", Value::Object(map)) => {
                map.values_mut().for_each(close_objects)
            }
            ("anyOf" | "oneOf" | "prefixItems" | "items", Value::Array(list)) => {
                list.iter_mut().for_each(close_objects)
            }
            ("items" | "additionalProperties" | "additionalItems" | "contains", child) => {
                close_objects(child)
            }
            _ => {}
        }
    }
}

/// The grammar compiler for one vocabulary: build it once per model, then
/// [`Grammars::compile`] each request's format.
pub struct Grammars {
    factory: ParserFactory,
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammars").finish_non_exhaustive()
    }
}

impl Grammars {
    /// The compiler for `tokenizer`'s vocabulary; its end-of-turn ids end a finished answer.
    pub fn new(tokenizer: &Tokenizer) -> Result<Self, GrammarError> {
        let words: Vec<Vec<u8>> = tokenizer
            .token_bytes()
            .into_iter()
            .enumerate()
            .map(|(id, bytes)| bytes.unwrap_or_else(|| special(tokenizer, id as u32)))
            .collect();
        let info = TokRxInfo::new(words.len() as u32, tokenizer.eos);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(&tokenizer.stop_ids);
        let env: TokEnv = Arc::new(TrieEnv { trie });
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| GrammarError::Vocabulary(e.to_string()))?;
        factory.quiet();
        Ok(Self { factory })
    }

    /// A fresh constraint for one answer in `format`.
    pub fn compile(&self, format: &OutputFormat) -> Result<Constraint, GrammarError> {
        let parser = self
            .factory
            .create_parser(format.grammar())
            .map_err(|e| GrammarError::InvalidSchema(e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        match matcher.get_error() {
            Some(e) => Err(GrammarError::InvalidSchema(e)),
            None => Ok(Constraint { matcher }),
        }
    }
}

/// A special token as llguidance's trie spells it: its name behind the marker byte, so no
/// answer's text can contain it.
fn special(tokenizer: &Tokenizer, id: u32) -> Vec<u8> {
    let mut marked = vec![TokTrie::SPECIAL_TOKEN_MARKER];
    marked.extend(tokenizer.piece(id).unwrap_or_default().into_bytes());
    marked
}

/// The tokenizer environment llguidance asks for. Masks need only the trie; the rare text it
/// tokenizes itself is split greedily over the trie, so it is not told our tokenization is
/// canonical.
struct TrieEnv {
    trie: TokTrie,
}

impl TokenizerEnv for TrieEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.greedy_tokenize(s)
    }

    fn tokenize_is_canonical(&self) -> bool {
        false
    }
}

/// One answer's grammar state: which tokens may come next, advanced by each token sampled.
#[derive(Clone)]
pub struct Constraint {
    matcher: Matcher,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint")
            .field("stopped", &self.matcher.is_stopped())
            .finish()
    }
}

impl Constraint {
    /// Sets every logit the grammar forbids next to −∞ (an end-of-turn id is allowed only
    /// once the answer is complete).
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<(), GrammarError> {
        let allowed = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| GrammarError::Decoding(e.to_string()))?;
        for (i, l) in logits.iter_mut().enumerate() {
            if i >= allowed.len() || !allowed.is_allowed(i as TokenId) {
                *l = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }

    /// Advances past a sampled token.
    pub fn accept(&mut self, token: u32) -> Result<(), GrammarError> {
        self.matcher
            .consume_token(token)
            .map_err(|e| GrammarError::Decoding(e.to_string()))
    }

    /// Whether the answer is complete and nothing may follow it.
    pub fn is_complete(&self) -> bool {
        self.matcher.is_stopped() && !self.matcher.is_error()
    }
}
