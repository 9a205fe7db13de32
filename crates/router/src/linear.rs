//! A multinomial logistic regression over [`features`](crate::features): trained here from
//! labelled prompts with a seed handed in, stored as 8-bit weights (one scale per class) in a
//! small binary format that the browser fetches and checks.

use serde::{Deserialize, Serialize};

use crate::features::{DIM, Features};
use crate::rng::SplitMix;

/// Why a model could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("not a straddle linear model (bad magic)")]
    BadMagic,
    #[error("linear model truncated: {0}")]
    Truncated(&'static str),
    #[error("linear model header: {0}")]
    Header(String),
    #[error("training needs at least two labels and one example per label")]
    TooFewExamples,
}

/// A trained classifier.
#[derive(Debug, Clone, PartialEq)]
pub struct LinearModel {
    header: Header,
    /// Feature-major: the weights of feature `i` for every class sit together
    /// (`i * classes + c`), so scoring touches one cache line per feature, not one per class.
    weights: Vec<f32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Header {
    labels: Vec<String>,
    dim: usize,
    /// Per class: the weight that 127 stands for.
    scales: Vec<f32>,
    /// Where the training data came from, for whoever inspects a shipped model.
    provenance: String,
}

/// Training settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TrainConfig {
    pub epochs: usize,
    pub learning_rate: f32,
    /// L2 penalty per example.
    pub l2: f32,
    /// Seeds the example order; the same seed gives the same model.
    pub seed: u64,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            epochs: 12,
            learning_rate: 0.5,
            l2: 1e-5,
            seed: 0x5eed,
        }
    }
}

const MAGIC: &[u8; 8] = b"STRDLIN1";

impl LinearModel {
    /// Fits the model to `(features, label index)` pairs with AdaGrad, visiting examples in
    /// an order shuffled by `config.seed`.
    pub fn train(
        labels: Vec<String>,
        examples: &[(Features, usize)],
        config: TrainConfig,
        provenance: &str,
    ) -> Result<Self, ModelError> {
        let k = labels.len();
        if k < 2 || (0..k).any(|c| !examples.iter().any(|(_, l)| *l == c)) {
            return Err(ModelError::TooFewExamples);
        }
        let mut weights = vec![0f32; DIM * k];
        let mut grad_sq = vec![1e-6f32; DIM * k];
        let mut order: Vec<usize> = (0..examples.len()).collect();
        let mut rng = SplitMix(config.seed);
        let mut probs = vec![0f32; k];
        for _ in 0..config.epochs {
            for i in (1..order.len()).rev() {
                order.swap(i, rng.below(i + 1));
            }
            for &e in &order {
                let (x, label) = &examples[e];
                logits(&weights, k, x, &mut probs);
                softmax(&mut probs);
                for (&i, &v) in x.indices.iter().zip(&x.values) {
                    for (c, &p) in probs.iter().enumerate() {
                        let at = i as usize * k + c;
                        let err = p - f32::from(c == *label);
                        let g = err * v + config.l2 * weights[at];
                        grad_sq[at] += g * g;
                        weights[at] -= config.learning_rate * g / grad_sq[at].sqrt();
                    }
                }
            }
        }
        Ok(Self::quantized(labels, weights, provenance))
    }

    /// Rounds the weights to 8 bits now, so the model in memory is the model on disk.
    fn quantized(labels: Vec<String>, mut weights: Vec<f32>, provenance: &str) -> Self {
        let k = labels.len();
        let scales: Vec<f32> = (0..k)
            .map(|c| {
                let max = (0..DIM).fold(0f32, |m, i| m.max(weights[i * k + c].abs()));
                if max > 0.0 { max / 127.0 } else { 1.0 }
            })
            .collect();
        for (at, w) in weights.iter_mut().enumerate() {
            let scale = scales[at % k];
            *w = (*w / scale).round().clamp(-127.0, 127.0) * scale;
        }
        LinearModel {
            header: Header {
                labels,
                dim: DIM,
                scales,
                provenance: provenance.to_owned(),
            },
            weights,
        }
    }

    /// The class names, in score order.
    pub fn labels(&self) -> &[String] {
        &self.header.labels
    }

    /// Where the training data came from.
    pub fn provenance(&self) -> &str {
        &self.header.provenance
    }

    /// Class probabilities for one prompt's features.
    pub fn probabilities(&self, x: &Features) -> Vec<f32> {
        let mut p = vec![0f32; self.header.labels.len()];
        logits(&self.weights, p.len(), x, &mut p);
        softmax(&mut p);
        p
    }

    /// The most probable label and its probability.
    pub fn classify(&self, x: &Features) -> (&str, f32) {
        let p = self.probabilities(x);
        let (best, prob) = p
            .iter()
            .enumerate()
            .fold((0, f32::MIN), |b, (i, &v)| if v > b.1 { (i, v) } else { b });
        (self.header.labels[best].as_str(), prob)
    }

    /// The binary form: magic, header length (u32 LE), JSON header, then i8 weights.
    pub fn to_bytes(&self) -> Vec<u8> {
        let header = serde_json::to_vec(&self.header).unwrap_or_default();
        let mut out = Vec::with_capacity(12 + header.len() + self.weights.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&(header.len() as u32).to_le_bytes());
        out.extend_from_slice(&header);
        // Class-major on disk: one class's row, then the next.
        let k = self.header.labels.len();
        for (c, &scale) in self.header.scales.iter().enumerate() {
            out.extend((0..DIM).map(|i| {
                (self.weights[i * k + c] / scale)
                    .round()
                    .clamp(-127.0, 127.0) as i8 as u8
            }));
        }
        out
    }

    /// Reads [`to_bytes`](Self::to_bytes)' form, checking every length before trusting it.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, ModelError> {
        let rest = bytes.strip_prefix(MAGIC).ok_or(ModelError::BadMagic)?;
        let (len, rest) = rest
            .split_first_chunk::<4>()
            .ok_or(ModelError::Truncated("header length"))?;
        let len = u32::from_le_bytes(*len) as usize;
        let header_bytes = rest.get(..len).ok_or(ModelError::Truncated("header"))?;
        let header: Header =
            serde_json::from_slice(header_bytes).map_err(|e| ModelError::Header(e.to_string()))?;
        if header.dim != DIM {
            return Err(ModelError::Header(format!(
                "dimension {} (this build hashes into {DIM})",
                header.dim
            )));
        }
        if header.labels.len() < 2 || header.scales.len() != header.labels.len() {
            return Err(ModelError::Header(
                "labels and scales must pair up, at least two".into(),
            ));
        }
        if header.scales.iter().any(|s| !s.is_finite() || *s <= 0.0) {
            return Err(ModelError::Header("scales must be positive".into()));
        }
        let body = &rest[len..];
        let want = header.labels.len() * DIM;
        if body.len() != want {
            return Err(ModelError::Truncated("weights"));
        }
        let k = header.labels.len();
        let mut weights = vec![0f32; DIM * k];
        for (c, (row, &s)) in body.chunks(DIM).zip(&header.scales).enumerate() {
            for (i, &b) in row.iter().enumerate() {
                weights[i * k + c] = f32::from(b as i8) * s;
            }
        }
        Ok(LinearModel { header, weights })
    }
}

/// Per-class scores of `x` under feature-major `weights` with `k` classes.
fn logits(weights: &[f32], k: usize, x: &Features, out: &mut [f32]) {
    out.fill(0.0);
    for (&i, &v) in x.indices.iter().zip(&x.values) {
        let Some(row) = weights.get(i as usize * k..(i as usize + 1) * k) else {
            continue;
        };
        for (o, w) in out.iter_mut().zip(row) {
            *o += w * v;
        }
    }
}

fn softmax(v: &mut [f32]) {
    let max = v.iter().fold(f32::MIN, |m, &x| m.max(x));
    let mut sum = 0.0;
    for x in v.iter_mut() {
        *x = (*x - max).exp();
        sum += *x;
    }
    for x in v.iter_mut() {
        *x /= sum;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::features::extract;

    fn toy() -> (Vec<String>, Vec<(Features, usize)>) {
        let maths = [
            "solve 3x + 4 = 10",
            "what is 17 * 23",
            "integrate x^2 dx",
            "compute 2^10 - 1",
        ];
        let poems = [
            "write a poem about rain",
            "a haiku on autumn leaves",
            "compose a sonnet about love",
            "write verses about the sea",
        ];
        let mut ex = Vec::new();
        for m in maths {
            ex.push((extract(m), 0));
        }
        for p in poems {
            ex.push((extract(p), 1));
        }
        (vec!["math".into(), "poem".into()], ex)
    }

    #[test]
    fn learns_a_separable_toy_task_and_generalises_on_shared_words() {
        let (labels, ex) = toy();
        let m = LinearModel::train(labels, &ex, TrainConfig::default(), "toy").expect("train");
        assert_eq!(m.classify(&extract("solve 5x = 20")).0, "math");
        assert_eq!(m.classify(&extract("write a poem about snow")).0, "poem");
        let p = m.probabilities(&extract("anything at all"));
        assert!((p.iter().sum::<f32>() - 1.0).abs() < 1e-5);
    }

    #[test]
    fn bytes_round_trip_and_hostile_bytes_are_errors() {
        let (labels, ex) = toy();
        let m = LinearModel::train(labels, &ex, TrainConfig::default(), "toy").expect("train");
        let bytes = m.to_bytes();
        assert!(bytes.len() < 2 * DIM + 200);
        let back = LinearModel::from_bytes(&bytes).expect("read back");
        assert_eq!(back, m);

        assert!(matches!(
            LinearModel::from_bytes(b"nope"),
            Err(ModelError::BadMagic)
        ));
        for cut in [8, 10, 20, bytes.len() - 1] {
            assert!(
                LinearModel::from_bytes(&bytes[..cut]).is_err(),
                "cut at {cut}"
            );
        }
        let mut huge_len = bytes.clone();
        huge_len[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            LinearModel::from_bytes(&huge_len),
            Err(ModelError::Truncated(_))
        ));
    }

    #[test]
    fn the_same_seed_gives_the_same_model() {
        let (labels, ex) = toy();
        let a = LinearModel::train(labels.clone(), &ex, TrainConfig::default(), "t").expect("a");
        let b = LinearModel::train(labels, &ex, TrainConfig::default(), "t").expect("b");
        assert_eq!(a, b);
    }

    #[test]
    fn a_label_without_examples_is_an_error() {
        let (mut labels, ex) = toy();
        labels.push("unused".into());
        assert!(matches!(
            LinearModel::train(labels, &ex, TrainConfig::default(), "t"),
            Err(ModelError::TooFewExamples)
        ));
    }
}
