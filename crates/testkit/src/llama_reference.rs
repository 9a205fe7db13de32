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

/// The lead llama.cpp's top-1 logit must have over its top-2 for a step to be decisive:
/// another order of sums moves logits by up to ~0.8 on logits of magnitude ~20–35, so a gap
/// under twice that can flip either way.
pub const TIE_MARGIN: f64 = 1.6;

/// How a step's top-5 logits are held to llama.cpp's.
#[derive(Debug, Clone, Copy)]
pub enum Tolerance {
    /// Each logit within this of llama.cpp's.
    Absolute(f64),
    /// Each logit minus the top-1 token's within this of llama.cpp's difference: what decides
    /// the greedy choice and the distribution, where every logit may move together.
    FromTop1(f64),
}

impl Case {
    /// Whether llama.cpp's choice at `step` leads its runner-up by [`TIE_MARGIN`].
    pub fn decisive(&self, step: usize) -> bool {
        let top = &self.top5[step];
        top.len() > 1 && top[0].1 - top[1].1 >= TIE_MARGIN
    }

    /// Holds our `logits` at teacher-forced `step` to llama.cpp's: each top-5 logit within
    /// `tolerance`, and at a decisive step our greedy choice is llama.cpp's. Returns the
    /// largest difference seen; `who` names the backend in a failure.
    pub fn check_step(&self, who: &str, step: usize, logits: &[f32], tolerance: Tolerance) -> f64 {
        let top = &self.top5[step];
        let at = |t: u32| f64::from(logits[t as usize]);
        let (lead, lead_logit) = (top[0].0, as_f32(top[0].1));
        let mut max_err = 0f64;
        for &(tok, want) in top {
            let want = as_f32(want);
            let (err, tol) = match tolerance {
                Tolerance::Absolute(tol) => ((at(tok) - want).abs(), tol),
                Tolerance::FromTop1(tol) => ((at(tok) - at(lead) - (want - lead_logit)).abs(), tol),
            };
            assert!(
                err <= tol,
                "{who} {} step {step}: logit of {tok} is {}, llama.cpp {want} ({tolerance:?})",
                self.name,
                at(tok)
            );
            max_err = max_err.max(err);
        }
        if self.decisive(step) {
            let ours = argmax(logits);
            assert_eq!(
                ours, self.greedy[step],
                "{who} {} step {step}: chose {ours}, llama.cpp {} by a clear margin",
                self.name, self.greedy[step]
            );
        }
        max_err
    }
}

/// A reference logit as the f32 llama.cpp computed (the JSON holds its decimal expansion,
/// which parsing may leave an f64 ulp away).
pub fn as_f32(logit: f64) -> f64 {
    f64::from(logit as f32)
}

/// The first largest logit's token, computed here rather than by the engine under test.
fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}
