//! llama.cpp's own answers on our prompts, as `tests/reference/make_reference.py` and
//! `make_families.py` write them: the prompt's token ids, the greedy continuation, and each
//! step's top-5 logits. One reading of the files for every suite that compares with them.

use std::collections::BTreeMap;

/// A reference file for one model: its prompts.
#[derive(Debug, serde::Deserialize)]
pub struct Reference {
    pub cases: Vec<Case>,
}

impl Reference {
    /// The file's text read; a malformed one panics, naming the file's fault.
    pub fn parse(text: &str) -> Self {
        serde_json::from_str(text).expect("reference JSON")
    }

    /// The case named `name`.
    pub fn case(&self, name: &str) -> &Case {
        self.cases
            .iter()
            .find(|c| c.name == name)
            .unwrap_or_else(|| panic!("the reference has no case {name}"))
    }
}

/// The reference for the tiny random-weight families: each architecture's prompts.
#[derive(Debug, serde::Deserialize)]
pub struct Families {
    pub families: BTreeMap<String, Vec<Case>>,
}

impl Families {
    /// The file's text read, as [`Reference::parse`].
    pub fn parse(text: &str) -> Self {
        serde_json::from_str(text).expect("reference JSON")
    }
}

/// One prompt and what llama.cpp made of it.
#[derive(Debug, serde::Deserialize)]
pub struct Case {
    pub name: String,
    pub prompt: String,
    /// The conversation a chat case's prompt renders, where it is one: the model's own
    /// template must render it to the same token ids.
    #[serde(default)]
    pub messages: Vec<Message>,
    pub prompt_tokens: Vec<u32>,
    pub greedy: Vec<u32>,
    /// Each greedy step's five largest logits, `(token, logit)`, largest first.
    pub top5: Vec<Vec<(u32, f64)>>,
}

/// One message of a chat case.
#[derive(Debug, serde::Deserialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}
