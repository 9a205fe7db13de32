//! The quality model: the probability that the edge model's answer to a request is
//! acceptable, from what the page can compute at once (the turn's text and task type) and,
//! once the edge has prefilled the prompt, from the edge model's own first-token distribution.
//!
//! Two logistic regressions over one standardised feature vector: `text_only` for the
//! decision before generation, `with_edge` for the check at the first token. Edge signals
//! are specific to the edge model, so a model names the GGUF (its SHA-256) it was trained
//! for; for any other edge model only `text_only` applies. `straddle train-router --quality`
//! fits it; the trained model ships inside this crate (`data/quality-model.json`).

use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use crate::signals::{self, OutputEstimate};
use crate::task::{self, TaskGuess, TaskType};

/// Names of the features, in vector order: the text features, then the edge signals.
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
];

/// Features that need only the text.
pub const TEXT_DIM: usize = 11;
/// All features: the text's and the edge model's two first-token signals.
pub const DIM: usize = TEXT_DIM + 2;

/// The format tag a model file must carry.
pub const FORMAT: &str = "straddle-quality/1";

const BUNDLED_JSON: &str = include_str!("../data/quality-model.json");

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

/// What the edge model's distribution over its first answer token says, right after prefill.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct EdgeSignals {
    /// Entropy of the first-token distribution, nats.
    pub entropy: f32,
    /// Log-probability of the token the edge chose first.
    pub logprob: f32,
}

/// One logistic regression: bias plus a weight per standardised feature.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Logistic {
    pub bias: f32,
    pub weights: Vec<f32>,
}

/// A trained quality model (the JSON document that ships).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QualityModel {
    pub format: String,
    /// Goes on every decision trace and cost record.
    pub version: String,
    /// The edge model whose signals `with_edge` was fitted to (SHA-256 of the GGUF, hex).
    pub edge_model_sha256: String,
    /// Where the training data came from.
    pub provenance: String,
    pub features: Vec<String>,
    /// Standardisation: feature `i` enters as `(x - mean[i]) / scale[i]`.
    pub mean: Vec<f32>,
    pub scale: Vec<f32>,
    pub text_only: Logistic,
    pub with_edge: Logistic,
}

/// A quality estimate and what drove it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Estimate {
    /// P(the edge answer is acceptable).
    pub p_edge_ok: f64,
    /// Whether the edge model's first-token signals entered it.
    pub edge_signals: bool,
    /// The largest contributions to the log-odds, largest first: (feature, contribution).
    pub drivers: Vec<(String, f64)>,
}

/// The model bundled with this build, parsed once.
pub fn bundled() -> Result<&'static QualityModel, QualityError> {
    static MODEL: OnceLock<Result<QualityModel, QualityError>> = OnceLock::new();
    MODEL
        .get_or_init(|| QualityModel::from_json(BUNDLED_JSON))
        .as_ref()
        .map_err(Clone::clone)
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
        let lengths = [
            ("mean", m.mean.len(), DIM),
            ("scale", m.scale.len(), DIM),
            ("text_only", m.text_only.weights.len(), TEXT_DIM),
            ("with_edge", m.with_edge.weights.len(), DIM),
        ];
        if let Some((name, got, want)) = lengths.iter().find(|(_, got, want)| got != want) {
            return Err(QualityError::Weights(format!(
                "{name} has {got} values, expected {want}"
            )));
        }
        let values = m
            .mean
            .iter()
            .chain(&m.text_only.weights)
            .chain(&m.with_edge.weights);
        let biases = [m.text_only.bias, m.with_edge.bias];
        if values.chain(&biases).any(|v| !v.is_finite())
            || m.scale.iter().any(|s| !s.is_finite() || *s <= 0.0)
        {
            return Err(QualityError::Weights(
                "values must be finite, scales positive".into(),
            ));
        }
        Ok(m)
    }

    /// Whether the edge signals of the model with this SHA-256 are the ones `with_edge` knows.
    pub fn knows_edge(&self, sha256: Option<&str>) -> bool {
        sha256.is_some_and(|s| s.eq_ignore_ascii_case(&self.edge_model_sha256))
    }

    /// The estimate from the text features alone, or with the edge's first-token signals.
    pub fn estimate(&self, text: &[f32; TEXT_DIM], edge: Option<EdgeSignals>) -> Estimate {
        let mut x = text.to_vec();
        let model = match edge {
            Some(e) => {
                x.extend(edge_features(e));
                &self.with_edge
            }
            None => &self.text_only,
        };
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
        let logit = f64::from(model.bias) + drivers.iter().map(|(_, c)| c).sum::<f64>();
        drivers.sort_by(|a, b| b.1.abs().total_cmp(&a.1.abs()));
        drivers.truncate(3);
        Estimate {
            p_edge_ok: sigmoid(logit),
            edge_signals: edge.is_some(),
            drivers,
        }
    }
}

/// The edge signals as features: a NaN or infinite statistic reads as no confidence at all.
fn edge_features(e: EdgeSignals) -> [f32; 2] {
    [finite_or(e.entropy, 12.0), finite_or(e.logprob, -30.0)]
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

/// One training example: the features of a request and whether the edge answered it well.
#[derive(Debug, Clone, PartialEq)]
pub struct Example {
    pub text: [f32; TEXT_DIM],
    pub edge: EdgeSignals,
    pub edge_ok: bool,
}

/// Fits both regressions (L2-penalised logistic loss, full-batch gradient descent from zero,
/// so the same examples give the same model) and names the edge model they were fitted for.
pub fn train(
    examples: &[Example],
    edge_model_sha256: &str,
    provenance: &str,
) -> Result<QualityModel, QualityError> {
    let positives = examples.iter().filter(|e| e.edge_ok).count();
    if positives == 0 || positives == examples.len() {
        return Err(QualityError::OneSidedLabels);
    }
    let rows: Vec<[f32; DIM]> = examples.iter().map(full_vector).collect();
    let (mean, scale) = standardisation(&rows);
    let z: Vec<Vec<f32>> = rows
        .iter()
        .map(|r| (0..DIM).map(|i| (r[i] - mean[i]) / scale[i]).collect())
        .collect();
    let y: Vec<f32> = examples
        .iter()
        .map(|e| f32::from(u8::from(e.edge_ok)))
        .collect();
    let text_rows: Vec<&[f32]> = z.iter().map(|r| &r[..TEXT_DIM]).collect();
    let all_rows: Vec<&[f32]> = z.iter().map(|r| &r[..]).collect();
    let mut fingerprint = 0xcbf2_9ce4_8422_2325u64;
    let text_only = fit(&text_rows, &y);
    let with_edge = fit(&all_rows, &y);
    for v in text_only.weights.iter().chain(&with_edge.weights) {
        fingerprint = (fingerprint ^ u64::from(v.to_bits())).wrapping_mul(0x0100_0000_01b3);
    }
    let short_sha: String = edge_model_sha256.chars().take(12).collect();
    Ok(QualityModel {
        format: FORMAT.into(),
        version: format!("quality-{short_sha}-{:08x}", fingerprint as u32),
        edge_model_sha256: edge_model_sha256.to_ascii_lowercase(),
        provenance: provenance.into(),
        features: FEATURE_NAMES.iter().map(|s| s.to_string()).collect(),
        mean: mean.to_vec(),
        scale: scale.to_vec(),
        text_only,
        with_edge,
    })
}

fn full_vector(e: &Example) -> [f32; DIM] {
    let mut v = [0f32; DIM];
    v[..TEXT_DIM].copy_from_slice(&e.text);
    v[TEXT_DIM..].copy_from_slice(&edge_features(e.edge));
    v
}

fn standardisation(rows: &[[f32; DIM]]) -> ([f32; DIM], [f32; DIM]) {
    let n = rows.len().max(1) as f32;
    let mut mean = [0f32; DIM];
    let mut scale = [0f32; DIM];
    for i in 0..DIM {
        mean[i] = rows.iter().map(|r| r[i]).sum::<f32>() / n;
        let var = rows.iter().map(|r| (r[i] - mean[i]).powi(2)).sum::<f32>() / n;
        // A constant feature carries nothing; a unit scale keeps it harmless.
        scale[i] = if var > 1e-8 { var.sqrt() } else { 1.0 };
    }
    (mean, scale)
}

/// The L2 penalty, per example: strong enough that a handful of features cannot overfit a
/// few hundred examples, weak enough to leave the real effects.
const L2: f32 = 0.02;

fn fit(rows: &[&[f32]], y: &[f32]) -> Logistic {
    let dim = rows.first().map_or(0, |r| r.len());
    let n = rows.len().max(1) as f32;
    let (mut w, mut b) = (vec![0f32; dim], 0f32);
    for _ in 0..3000 {
        let mut gw = vec![0f32; dim];
        let mut gb = 0f32;
        for (r, &t) in rows.iter().zip(y) {
            let z = b + r.iter().zip(&w).map(|(x, w)| x * w).sum::<f32>();
            let err = sigmoid(f64::from(z)) as f32 - t;
            gb += err;
            for (g, x) in gw.iter_mut().zip(r.iter()) {
                *g += err * x;
            }
        }
        b -= 0.5 * gb / n;
        for (wi, g) in w.iter_mut().zip(&gw) {
            *wi -= 0.5 * (g / n + L2 * *wi);
        }
    }
    Logistic {
        bias: b,
        weights: w,
    }
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

    fn example(hard: bool, entropy: f32, edge_ok: bool) -> Example {
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
            edge: EdgeSignals {
                entropy,
                logprob: -entropy / 2.0,
            },
            edge_ok,
        }
    }

    fn toy() -> Vec<Example> {
        (0..40)
            .map(|i| {
                let hard = i % 2 == 0;
                let entropy = if i % 4 < 2 { 0.5 } else { 3.0 };
                example(hard, entropy, !hard && entropy < 1.0 || i % 8 == 1)
            })
            .collect()
    }

    #[test]
    fn training_learns_the_direction_of_text_and_edge_signals() {
        let m = train(&toy(), &"ab".repeat(32), "toy").expect("trains");
        let easy = text_features(
            "Is this review positive? Great phone.",
            guess(TaskType::Classification),
            16,
        );
        let hard = text_features("What is 37 * 24 + 19 / 3?", guess(TaskType::Math), 250);
        assert!(m.estimate(&easy, None).p_edge_ok > m.estimate(&hard, None).p_edge_ok);
        let sure = EdgeSignals {
            entropy: 0.5,
            logprob: -0.25,
        };
        let unsure = EdgeSignals {
            entropy: 3.0,
            logprob: -1.5,
        };
        let (a, b) = (
            m.estimate(&easy, Some(sure)),
            m.estimate(&easy, Some(unsure)),
        );
        assert!(a.p_edge_ok > b.p_edge_ok, "{a:?} {b:?}");
        assert!(a.edge_signals && a.drivers.len() == 3);
        assert_eq!(
            train(&toy(), &"ab".repeat(32), "toy").expect("again"),
            m,
            "deterministic"
        );
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
    fn text_features_see_numbers_choices_and_the_task() {
        let mcq = "Which is a prime?\nA. 4\nB. 6\n(C) 7\nD. 9\nAnswer:";
        let f = text_features(mcq, guess(TaskType::ShortQa), 40);
        assert_eq!(f[4], 1.0);
        assert!(f[2] > 1.0 && f[7] > 0.0 && f[9] == 0.0);
        let plain = text_features("Tell me a joke", guess(TaskType::ChitChat), 48);
        assert_eq!((plain[1], plain[4]), (0.0, 0.0));
    }

    #[test]
    fn the_bundled_model_is_versioned_and_names_the_default_edge_model() {
        let m = bundled().expect("the bundled quality model loads");
        assert_eq!(m.features, FEATURE_NAMES);
        // SmolLM2-135M-Instruct Q4_1, the default model `cargo xtask setup` verifies.
        let default = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
        assert_eq!(m.edge_model_sha256, default);
        assert!(
            m.version.starts_with("quality-b179c9523d0e-"),
            "{}",
            m.version
        );
        assert!(m.provenance.contains("graded prompts"));
    }
}
