//! The quality model: the probability that the edge model's answer to a request is
//! acceptable, from what the page can compute at once (the turn's text and task type) and,
//! once the edge has prefilled the prompt, from the edge model's own state: the confidence
//! of its first-token distribution and its final hidden state at the prompt's last position
//! (a linear probe, as "Language Models (Mostly) Know What They Know" probes P(IK)).
//!
//! Three logistic regressions over standardised features: `text_only` for the decision
//! before generation, `with_edge` for the first token's confidence, and `with_state` for the
//! confidence and the hidden state together. Edge signals are specific to the edge model, so
//! a model names the GGUF (its SHA-256) it was trained for; for any other edge model only
//! `text_only` applies. `straddle train-router --quality-data` fits one; those that ship
//! are in this crate's `data/quality-models/`, one per edge model.

use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use crate::signals::{self, OutputEstimate};
use crate::task::{self, TaskGuess, TaskType};

mod train;
pub use train::{Example, ShareRow, train, with_pre_generation_share};

/// Names of the features, in vector order: the text features, then the first token's.
pub const FEATURE_NAMES: [&str; DIM] = [
    "log_chars",
    "digit_share",
    "log_numbers",
    "log_math_symbols",
    "multiple_choice",
    "long_word_share",
    "task_routine",
    "task_knowledge",
    "task_generative",
    "task_hard",
    "log_expected_output",
    "first_token_entropy",
    "first_token_logprob",
    "first_token_margin",
];

/// Features that need only the text.
pub const TEXT_DIM: usize = 11;
/// All scalar features: the text's and the edge model's first-token confidence.
pub const DIM: usize = TEXT_DIM + 3;

/// The format tag a model file must carry.
pub const FORMAT: &str = "straddle-quality/2";

/// The models that ship, the default edge model's first: its text-only part stands in for an
/// edge model none of them was trained for.
const BUNDLED_JSON: [&str; 2] = [
    include_str!("../data/quality-models/qwen2.5-coder-0.5b.json"),
    include_str!("../data/quality-models/smollm2-135m.json"),
];

/// Why a quality model could not be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum QualityError {
    #[error("quality model is not valid JSON: {0}")]
    Json(String),
    #[error("quality model format `{0}` (this build reads `{FORMAT}`)")]
    Format(String),
    #[error("quality model features differ from this build's ({0})")]
    Features(String),
    #[error("quality model weights: {0}")]
    Weights(String),
    #[error("training needs examples the edge got right and examples it got wrong")]
    OneSidedLabels,
    /// The caller asked for the task priors alone (a baseline, a cost-model test).
    #[error("quality model turned off: {0}")]
    Disabled(&'static str),
}

/// How sure the edge model is of its first answer token, right after prefill.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct EdgeSignals {
    /// Entropy of the first-token distribution, nats.
    pub entropy: f32,
    /// Log-probability of the most likely first token.
    pub logprob: f32,
    /// Its log-probability minus the second most likely token's.
    #[serde(default)]
    pub margin: f32,
}

/// One logistic regression: bias plus a weight per standardised feature.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Logistic {
    pub bias: f32,
    pub weights: Vec<f32>,
}

/// A probe of the edge model's final hidden state, read beside the scalar features.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateProbe {
    /// The hidden state's width (the edge model's embedding width).
    pub width: usize,
    /// Standardisation of the state: element `i` enters as `(h - mean[i]) / scale[i]`.
    pub mean: Vec<f32>,
    pub scale: Vec<f32>,
    /// Weights on the [`DIM`] scalar features, then on the `width` state elements.
    pub model: Logistic,
}

/// A trained quality model (the JSON document that ships).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QualityModel {
    pub format: String,
    /// Goes on every decision trace and cost record.
    pub version: String,
    /// The edge model whose signals `with_edge` and `with_state` were fitted to (SHA-256 of
    /// the GGUF, hex).
    pub edge_model_sha256: String,
    /// Where the training data came from.
    pub provenance: String,
    pub features: Vec<String>,
    /// Standardisation: feature `i` enters as `(x - mean[i]) / scale[i]`.
    pub mean: Vec<f32>,
    pub scale: Vec<f32>,
    pub text_only: Logistic,
    pub with_edge: Logistic,
    /// Absent where the model was trained without the edge model's states.
    #[serde(default)]
    pub with_state: Option<StateProbe>,
    /// The share of the first-token bar the text alone must clear before prefill, chosen
    /// for this edge model on its training answers ([`with_pre_generation_share`]).
    #[serde(default = "default_pre_generation_share")]
    pub pre_generation_share: f64,
}

/// The share of the bar asked before prefill of a model that does not carry its own: half,
/// since the first token applies the whole bar before any text is shown.
pub const DEFAULT_PRE_GENERATION_SHARE: f64 = 0.5;

fn default_pre_generation_share() -> f64 {
    DEFAULT_PRE_GENERATION_SHARE
}

/// What entered an estimate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Inputs {
    /// The turn's text alone: before prefill, or for an edge model the quality model does
    /// not know.
    Text,
    /// The text and the first token's confidence.
    FirstToken,
    /// The text, the first token's confidence and the edge model's hidden state.
    State,
}

/// A quality estimate and what drove it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Estimate {
    /// P(the edge answer is acceptable).
    pub p_edge_ok: f64,
    /// What the estimate read.
    pub inputs: Inputs,
    /// The largest contributions to the log-odds, largest first: (feature, contribution);
    /// the hidden state counts as one, `edge_state`.
    pub drivers: Vec<(String, f64)>,
}

/// The models bundled with this build, parsed once, the default edge model's first.
pub fn bundled_all() -> Result<&'static [QualityModel], QualityError> {
    static MODELS: OnceLock<Result<Vec<QualityModel>, QualityError>> = OnceLock::new();
    MODELS
        .get_or_init(|| {
            BUNDLED_JSON
                .iter()
                .map(|j| QualityModel::from_json(j))
                .collect()
        })
        .as_deref()
        .map_err(Clone::clone)
}

/// The bundled model for the edge model with this SHA-256: the one trained for it, else the
/// default edge model's (whose text-only part then applies).
pub fn bundled_for(edge_sha256: Option<&str>) -> Result<&'static QualityModel, QualityError> {
    let all = bundled_all()?;
    let known = all.iter().find(|m| m.knows_edge(edge_sha256));
    known
        .or_else(|| all.first())
        .ok_or(QualityError::Weights("no model is bundled".into()))
}

impl QualityModel {
    /// Parses and checks a model document: format, feature names, and finite weights of the
    /// right lengths.
    pub fn from_json(json: &str) -> Result<Self, QualityError> {
        let m: QualityModel =
            serde_json::from_str(json).map_err(|e| QualityError::Json(e.to_string()))?;
        if m.format != FORMAT {
            return Err(QualityError::Format(m.format));
        }
        if m.features != FEATURE_NAMES {
            return Err(QualityError::Features(m.features.join(", ")));
        }
        m.check_lengths()?;
        let state_values = m
            .with_state
            .iter()
            .flat_map(|p| p.mean.iter().chain(&p.model.weights).chain([&p.model.bias]));
        let values = m
            .mean
            .iter()
            .chain(&m.text_only.weights)
            .chain(&m.with_edge.weights)
            .chain([&m.text_only.bias, &m.with_edge.bias])
            .chain(state_values);
        let scales = m
            .scale
            .iter()
            .chain(m.with_state.iter().flat_map(|p| &p.scale));
        if values.into_iter().any(|v| !v.is_finite())
            || scales.into_iter().any(|s| !s.is_finite() || *s <= 0.0)
        {
            return Err(QualityError::Weights(
                "values must be finite, scales positive".into(),
            ));
        }
        if !(m.pre_generation_share > 0.0 && m.pre_generation_share <= 1.0) {
            return Err(QualityError::Weights(format!(
                "pre_generation_share {} is not in (0, 1]",
                m.pre_generation_share
            )));
        }
        Ok(m)
    }

    fn check_lengths(&self) -> Result<(), QualityError> {
        let mut lengths = vec![
            ("mean", self.mean.len(), DIM),
            ("scale", self.scale.len(), DIM),
            ("text_only", self.text_only.weights.len(), TEXT_DIM),
            ("with_edge", self.with_edge.weights.len(), DIM),
        ];
        if let Some(p) = &self.with_state {
            lengths.extend([
                ("with_state.mean", p.mean.len(), p.width),
                ("with_state.scale", p.scale.len(), p.width),
                ("with_state.model", p.model.weights.len(), DIM + p.width),
            ]);
        }
        match lengths.iter().find(|(_, got, want)| got != want) {
            Some((name, got, want)) => Err(QualityError::Weights(format!(
                "{name} has {got} values, expected {want}"
            ))),
            None => Ok(()),
        }
    }

    /// Whether the edge signals of the model with this SHA-256 are the ones it was fitted to.
    pub fn knows_edge(&self, sha256: Option<&str>) -> bool {
        sha256.is_some_and(|s| s.eq_ignore_ascii_case(&self.edge_model_sha256))
    }

    /// The estimate from the text features alone, with the first token's confidence, or with
    /// that and the hidden state (where the model has a probe of the state's width).
    pub fn estimate(
        &self,
        text: &[f32; TEXT_DIM],
        edge: Option<EdgeSignals>,
        state: Option<&[f32]>,
    ) -> Estimate {
        let mut x = text.to_vec();
        let Some(e) = edge else {
            return self.scored(&x, &self.text_only, None, Inputs::Text);
        };
        x.extend(edge_features(e));
        match (&self.with_state, state) {
            (Some(p), Some(h)) if h.len() == p.width => {
                self.scored(&x, &p.model, Some((p, h)), Inputs::State)
            }
            _ => self.scored(&x, &self.with_edge, None, Inputs::FirstToken),
        }
    }

    /// `model` over the scalar features `x` (and the standardised state, when given).
    fn scored(
        &self,
        x: &[f32],
        model: &Logistic,
        state: Option<(&StateProbe, &[f32])>,
        inputs: Inputs,
    ) -> Estimate {
        let mut drivers: Vec<(String, f64)> = x
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let z = (v - self.mean[i]) / self.scale[i];
                (
                    FEATURE_NAMES[i].to_string(),
                    f64::from(model.weights[i] * z),
                )
            })
            .collect();
        if let Some((p, h)) = state {
            let w = &model.weights[DIM..];
            let dot: f64 = (0..p.width)
                .map(|i| {
                    f64::from(w[i] * finite_or(h[i], p.mean[i]) - w[i] * p.mean[i])
                        / f64::from(p.scale[i])
                })
                .sum();
            drivers.push(("edge_state".into(), dot));
        }
        let logit = f64::from(model.bias) + drivers.iter().map(|(_, c)| c).sum::<f64>();
        drivers.sort_by(|a, b| b.1.abs().total_cmp(&a.1.abs()));
        drivers.truncate(3);
        Estimate {
            p_edge_ok: sigmoid(logit),
            inputs,
            drivers,
        }
    }
}

/// The edge signals as features: a NaN or infinite statistic reads as no confidence at all.
fn edge_features(e: EdgeSignals) -> [f32; 3] {
    [
        finite_or(e.entropy, 12.0),
        finite_or(e.logprob, -30.0),
        // One finite logit (a grammar that allows one token) is all the margin there is.
        finite_or(e.margin, 30.0).min(30.0),
    ]
}

fn finite_or(v: f32, fallback: f32) -> f32 {
    if v.is_finite() { v } else { fallback }
}

fn sigmoid(z: f64) -> f64 {
    1.0 / (1.0 + (-z).exp())
}

/// What the router reads off the turn being answered.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Turn {
    pub task: TaskGuess,
    pub output: OutputEstimate,
    /// The quality model's text features.
    pub features: [f32; TEXT_DIM],
}

/// Reads the turn being answered: its task type, expected length and text features.
pub fn read_turn(turn: &str, max_tokens: Option<u32>) -> Turn {
    let task = task::classify(turn);
    let output = signals::expected_output(turn, Some(task), max_tokens);
    Turn {
        task,
        output,
        features: text_features(turn, task, output.tokens),
    }
}

/// The features that need only the turn being answered, its task type and expected length.
pub fn text_features(turn: &str, task: TaskGuess, expected_output: u32) -> [f32; TEXT_DIM] {
    let chars = turn.chars().count().max(1) as f32;
    let digits = turn.chars().filter(char::is_ascii_digit).count() as f32;
    let numbers = turn
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .count() as f32;
    let math = turn
        .chars()
        .filter(|c| "=+*/^%×÷√∑∫<>≤≥".contains(*c))
        .count() as f32;
    let words: Vec<&str> = turn.split_whitespace().collect();
    let long = words
        .iter()
        .filter(|w| w.chars().filter(|c| c.is_alphabetic()).count() >= 9)
        .count() as f32;
    let conf = task.confidence;
    let of = |group: &[TaskType]| {
        if group.contains(&task.task) {
            conf
        } else {
            0.0
        }
    };
    use TaskType::*;
    [
        (1.0 + chars).ln(),
        digits / chars,
        (1.0 + numbers).ln(),
        (1.0 + math).ln(),
        f32::from(multiple_choice(turn)),
        long / (words.len().max(1) as f32),
        of(&[ChitChat, Intent, Classification, Extraction]),
        of(&[ShortQa]),
        of(&[Summarization, LongForm, Translation]),
        of(&[Code, Math, Reasoning]),
        (1.0 + expected_output as f32).ln(),
    ]
}

/// Two or more lines that open with an option letter: `A.`, `B)`, `(C)`.
fn multiple_choice(text: &str) -> bool {
    let options = text
        .lines()
        .filter(|l| {
            let l = l.trim_start().trim_start_matches('(');
            let mut c = l.chars();
            matches!(
                (c.next(), c.next()),
                (Some('A'..='H'), Some('.' | ')' | ':'))
            )
        })
        .count();
    options >= 2
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guess(task: TaskType) -> TaskGuess {
        TaskGuess {
            task,
            confidence: 0.9,
        }
    }

    fn signals(entropy: f32) -> EdgeSignals {
        EdgeSignals {
            entropy,
            logprob: -entropy / 2.0,
            margin: 2.0 / entropy,
        }
    }

    /// A four-element "hidden state" whose third element says whether the edge knows the
    /// answer, the others noise.
    fn state(knows: bool, i: usize) -> Vec<f32> {
        let noise = |k: usize| ((i * 7 + k * 13) % 11) as f32 / 11.0;
        vec![noise(1), noise(2), if knows { 1.0 } else { -1.0 }, noise(3)]
    }

    fn example(hard: bool, entropy: f32, knows: bool, i: usize) -> Example {
        let text = if hard {
            text_features("What is 37 * 24 + 19 / 3?", guess(TaskType::Math), 250)
        } else {
            text_features(
                "Is this review positive? Great phone.",
                guess(TaskType::Classification),
                16,
            )
        };
        Example {
            text,
            edge: signals(entropy),
            state: state(knows, i),
            edge_ok: knows,
        }
    }

    /// Easy prompts and a sure first token go with right answers, but one in five answers
    /// goes the other way, which only the state's third element knows.
    fn toy() -> Vec<Example> {
        (0..200)
            .map(|i| {
                let hard = i % 2 == 0;
                let entropy = if i % 4 < 2 { 0.5 } else { 3.0 };
                let knows = (!hard && entropy < 1.0) ^ (i % 5 == 0);
                example(hard, entropy, knows, i)
            })
            .collect()
    }

    #[test]
    fn training_learns_the_direction_of_text_first_token_and_state() {
        let m = train(&toy(), &"ab".repeat(32), "toy").expect("trains");
        let easy = text_features(
            "Is this review positive? Great phone.",
            guess(TaskType::Classification),
            16,
        );
        let hard = text_features("What is 37 * 24 + 19 / 3?", guess(TaskType::Math), 250);
        let p = |text, edge, state: Option<&[f32]>| m.estimate(text, edge, state).p_edge_ok;
        assert!(p(&easy, None, None) > p(&hard, None, None));
        assert!(p(&easy, Some(signals(0.5)), None) > p(&easy, Some(signals(3.0)), None));
        // The state separates what text and first token cannot.
        let (knows, lost) = (state(true, 3), state(false, 3));
        let sure = Some(signals(0.5));
        for text in [&easy, &hard] {
            let (a, b) = (p(text, sure, Some(&knows)), p(text, sure, Some(&lost)));
            assert!(a > b + 0.2, "{a} vs {b}");
        }
        let e = m.estimate(&easy, sure, Some(&knows));
        assert_eq!(e.inputs, Inputs::State);
        assert!(
            e.drivers.iter().any(|(name, _)| name == "edge_state"),
            "{e:?}"
        );
        // A state of another width (another model's) is not read.
        assert_eq!(
            m.estimate(&easy, sure, Some(&[1.0])).inputs,
            Inputs::FirstToken
        );
        assert_eq!(m.estimate(&easy, None, Some(&knows)).inputs, Inputs::Text);
        let again = train(&toy(), &"ab".repeat(32), "toy").expect("again");
        assert_eq!(again, m, "deterministic");
        assert!(m.version.starts_with("quality-abababababab-"));
    }

    #[test]
    fn a_model_document_round_trips_and_bad_ones_are_named() {
        let m = train(&toy(), &"cd".repeat(32), "toy").expect("trains");
        let json = serde_json::to_string(&m).expect("ser");
        assert_eq!(QualityModel::from_json(&json).expect("reads"), m);
        assert!(matches!(
            QualityModel::from_json("{"),
            Err(QualityError::Json(_))
        ));
        let wrong = json.replace(FORMAT, "straddle-quality/0");
        assert!(matches!(
            QualityModel::from_json(&wrong),
            Err(QualityError::Format(_))
        ));
        let mut short = m.clone();
        short.with_edge.weights.pop();
        let e = QualityModel::from_json(&serde_json::to_string(&short).expect("ser"));
        assert!(matches!(e, Err(QualityError::Weights(w)) if w.contains("with_edge")));
        let mut narrow = m.clone();
        if let Some(p) = narrow.with_state.as_mut() {
            p.scale.pop();
        }
        let e = QualityModel::from_json(&serde_json::to_string(&narrow).expect("ser"));
        assert!(matches!(e, Err(QualityError::Weights(w)) if w.contains("with_state.scale")));
        let nan = json.replacen("\"bias\":", "\"bias\":1e999,\"x\":", 1);
        assert!(QualityModel::from_json(&nan).is_err());
        // A document without a share asks half the bar before prefill; a share outside (0, 1]
        // is named.
        let mut value: serde_json::Value = serde_json::from_str(&json).expect("json");
        value
            .as_object_mut()
            .expect("object")
            .remove("pre_generation_share");
        let without = QualityModel::from_json(&value.to_string()).expect("reads");
        assert_eq!(without.pre_generation_share, DEFAULT_PRE_GENERATION_SHARE);
        for share in [0.0, 1.5, -0.2] {
            let mut bad = m.clone();
            bad.pre_generation_share = share;
            let e = QualityModel::from_json(&serde_json::to_string(&bad).expect("ser"));
            assert!(
                matches!(e, Err(QualityError::Weights(w)) if w.contains("pre_generation_share"))
            );
        }
        assert!(m.knows_edge(Some(&"CD".repeat(32))) && !m.knows_edge(None));
        let one_sided: Vec<Example> = toy()
            .into_iter()
            .map(|e| Example { edge_ok: true, ..e })
            .collect();
        assert_eq!(
            train(&one_sided, "x", "toy"),
            Err(QualityError::OneSidedLabels)
        );
    }

    #[test]
    fn the_pre_generation_share_is_the_largest_that_sends_up_nothing_the_state_would_keep() {
        let examples = toy();
        let fitted = train(&examples, &"ab".repeat(32), "toy").expect("trains");
        let (m, rows) = with_pre_generation_share(fitted.clone(), &examples, 0.5);
        assert_eq!(rows.len(), train::PRE_GENERATION_SHARES.len());
        let chosen = rows
            .iter()
            .find(|r| r.share == m.pre_generation_share)
            .expect("a share of the grid");
        assert!(
            chosen.share == train::PRE_GENERATION_SHARES[0] || chosen.qualifies(),
            "{rows:?}"
        );
        assert!(
            rows.iter()
                .filter(|r| r.share > chosen.share)
                .all(|r| !r.qualifies()),
            "{rows:?}"
        );
        assert!(
            rows.windows(2).all(|w| w[0].sent_up <= w[1].sent_up),
            "a larger share sends up at least as many: {rows:?}"
        );
        // The rule itself: at most one in a hundred of what a share sends up kept.
        let row = |sent_up, kept| ShareRow {
            share: 0.7,
            sent_up,
            kept,
            kept_right: kept,
        };
        assert!(row(245, 1).qualifies() && row(100, 1).qualifies() && row(0, 0).qualifies());
        assert!(!row(532, 31).qualifies() && !row(99, 1).qualifies());
        assert_eq!(m.pre_generation_share == 0.5, m.version == fitted.version);
    }

    #[test]
    fn text_features_see_numbers_choices_and_the_task() {
        let mcq = "Which is a prime?\nA. 4\nB. 6\n(C) 7\nD. 9\nAnswer:";
        let f = text_features(mcq, guess(TaskType::ShortQa), 40);
        assert_eq!(f[4], 1.0);
        assert!(f[2] > 1.0 && f[7] > 0.0 && f[9] == 0.0);
        let plain = text_features("Tell me a joke", guess(TaskType::ChitChat), 48);
        assert_eq!((plain[1], plain[4]), (0.0, 0.0));
    }

    #[test]
    fn each_edge_model_gets_its_own_bundled_model_and_others_the_default_text_only() {
        let all = bundled_all().expect("the bundled quality models load");
        let qwen = straddle_testkit::QWEN_EDGE.sha256;
        let smol = straddle_testkit::SMOLLM2.sha256;
        let for_qwen = bundled_for(Some(qwen)).expect("qwen");
        assert!(for_qwen.knows_edge(Some(qwen)) && std::ptr::eq(for_qwen, &all[0]));
        assert!(
            for_qwen.with_state.is_some(),
            "the default edge model's probe reads its state"
        );
        assert!(
            bundled_for(Some(smol))
                .expect("smollm2")
                .knows_edge(Some(smol))
        );
        let other = bundled_for(Some(&"0".repeat(64))).expect("another model");
        assert!(
            std::ptr::eq(other, &all[0]),
            "the default's text-only part stands in"
        );
        for m in all {
            assert_eq!(m.features, FEATURE_NAMES);
            assert!(
                m.version
                    .starts_with(&format!("quality-{}-", &m.edge_model_sha256[..12]))
            );
            assert!(m.provenance.contains("graded prompts"), "{}", m.provenance);
        }
    }
}
