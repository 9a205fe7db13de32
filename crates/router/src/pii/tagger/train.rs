//! Learning the tagger's weights: the averaged structured perceptron over labelled sentences.

use super::features::{CONTEXT, IDENTITY, features, words};
use super::{
    Bloom, FEATURES_VERSION, Header, KINDS, N_TAGS, TAGS, Tagger, TaggerError, Token, fnv64,
    segments, tokenize, viterbi,
};
use crate::pii::kinds::EntityKind;
use crate::rng::SplitMix;

/// A sentence for training: its text and the labelled entity spans (byte offsets).
#[derive(Debug, Clone, PartialEq)]
pub struct Labelled {
    pub text: String,
    pub spans: Vec<(EntityKind, usize, usize)>,
}

/// Chances that one training pass hides a word's own features (so the tagger learns names
/// it has never seen from their shape and context), its neighbours' (so it does not learn
/// whole training sentences by heart) or a capitalised word's gazetteer entry (the names
/// people bring are often in no list, and a tagger that only ever saw listed names would
/// call every unlisted one a place or a company).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Dropout {
    pub word: f32,
    pub context: f32,
    pub gazetteer: f32,
}

/// Training settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TrainConfig {
    pub epochs: usize,
    /// Hash buckets (rounded up to a power of two).
    pub buckets: usize,
    pub dropout: Dropout,
    pub seed: u64,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            epochs: 8,
            buckets: 1 << 15,
            dropout: Dropout {
                word: 0.25,
                context: 0.3,
                gazetteer: 0.4,
            },
            seed: 0x5eed,
        }
    }
}

/// The gold tag of every token of a labelled sentence.
pub(super) fn gold_tags(example: &Labelled, tokens: &[Token]) -> Vec<usize> {
    let mut tags = vec![0; tokens.len()];
    for &(kind, start, end) in &example.spans {
        let Some(class) = KINDS.iter().position(|k| *k == kind) else {
            continue;
        };
        let mut first = true;
        for (t, tok) in tags.iter_mut().zip(tokens) {
            if tok.start >= start && tok.end <= end {
                *t = 1 + 2 * class + usize::from(!first);
                first = false;
            }
        }
    }
    tags
}

/// Learns a tagger from labelled sentences with the averaged structured perceptron
/// (Collins, 2002): decode, and where the best sequence differs from the gold one, add the
/// gold features and subtract the predicted ones; the model is the average over every step.
/// `on_step` is called after each sentence of each epoch (a caller's progress bar).
pub fn train(
    examples: &[Labelled],
    gazetteer: Bloom,
    config: TrainConfig,
    provenance: &str,
    mut on_step: impl FnMut(),
) -> Result<Tagger, TaggerError> {
    if examples.is_empty() {
        return Err(TaggerError::NoExamples);
    }
    let buckets = config.buckets.next_power_of_two();
    let mut learner = Perceptron::new(buckets, gazetteer);
    let prepared: Vec<(Vec<Token>, Vec<usize>)> = examples
        .iter()
        .map(|e| {
            let tokens = tokenize(&e.text);
            let gold = gold_tags(e, &tokens);
            (tokens, gold)
        })
        .collect();
    let mut order: Vec<usize> = (0..examples.len()).collect();
    let mut rng = SplitMix(config.seed);
    for _ in 0..config.epochs {
        for k in (1..order.len()).rev() {
            order.swap(k, rng.below(k + 1));
        }
        for &idx in &order {
            let (tokens, gold) = &prepared[idx];
            learner.step(&examples[idx].text, tokens, gold, config.dropout, &mut rng);
            on_step();
        }
    }
    Ok(learner.finish(provenance))
}

/// The perceptron's running and accumulated weights (Daumé's averaging trick: the average
/// is `w − u / c`, where every update at step `c` also adds `c · Δ` to `u`).
pub(super) struct Perceptron {
    buckets: usize,
    gazetteer: Bloom,
    weights: Vec<f32>,
    accumulated: Vec<f32>,
    transitions: Vec<f32>,
    transitions_accumulated: Vec<f32>,
    step: f32,
}

impl Perceptron {
    fn new(buckets: usize, gazetteer: Bloom) -> Perceptron {
        Perceptron {
            buckets,
            gazetteer,
            weights: vec![0.0; buckets * N_TAGS],
            accumulated: vec![0.0; buckets * N_TAGS],
            transitions: vec![0.0; (1 + N_TAGS) * N_TAGS],
            transitions_accumulated: vec![0.0; (1 + N_TAGS) * N_TAGS],
            step: 1.0,
        }
    }

    fn step(
        &mut self,
        text: &str,
        tokens: &[Token],
        gold: &[usize],
        dropout: Dropout,
        rng: &mut SplitMix,
    ) {
        let mut words = words(text, tokens, &self.gazetteer, None);
        for w in words.iter_mut().filter(|w| w.gaz != "l") {
            if rng.next_f64() < f64::from(dropout.gazetteer) {
                w.gaz = "-";
            }
        }
        for segment in segments(&words) {
            let feats: Vec<Vec<u32>> = segment
                .clone()
                .map(|i| {
                    let mut f = Vec::new();
                    features(&words, i, self.buckets, &mut f);
                    // Hide the neighbours, or the word itself, now and then: a name must be
                    // known by its own look as well as by the words around it.
                    if rng.next_f64() < f64::from(dropout.context) {
                        f.drain(CONTEXT);
                    }
                    if rng.next_f64() < f64::from(dropout.word) {
                        f.drain(IDENTITY);
                    }
                    f
                })
                .collect();
            let emissions: Vec<[f32; N_TAGS]> = feats.iter().map(|f| self.emission(f)).collect();
            let predicted = viterbi(&emissions, &self.transitions, &words[segment.clone()]);
            self.correct(&feats, &gold[segment], &predicted);
        }
        self.step += 1.0;
    }

    fn emission(&self, feats: &[u32]) -> [f32; N_TAGS] {
        let mut e = [0f32; N_TAGS];
        for &b in feats {
            let row = &self.weights[b as usize * N_TAGS..(b as usize + 1) * N_TAGS];
            for (x, w) in e.iter_mut().zip(row) {
                *x += w;
            }
        }
        e
    }

    /// The perceptron's update where the predicted tags differ from the gold ones.
    fn correct(&mut self, feats: &[Vec<u32>], gold: &[usize], predicted: &[usize]) {
        if predicted == gold {
            return;
        }
        for (i, f) in feats.iter().enumerate() {
            if predicted[i] != gold[i] {
                for &b in f {
                    self.update(b as usize * N_TAGS + gold[i], 1.0);
                    self.update(b as usize * N_TAGS + predicted[i], -1.0);
                }
            }
            let row = |tags: &[usize]| if i == 0 { 0 } else { 1 + tags[i - 1] };
            self.update_transition(row(gold) * N_TAGS + gold[i], 1.0);
            self.update_transition(row(predicted) * N_TAGS + predicted[i], -1.0);
        }
    }

    fn update(&mut self, at: usize, delta: f32) {
        self.weights[at] += delta;
        self.accumulated[at] += self.step * delta;
    }

    fn update_transition(&mut self, at: usize, delta: f32) {
        self.transitions[at] += delta;
        self.transitions_accumulated[at] += self.step * delta;
    }

    fn finish(self, provenance: &str) -> Tagger {
        // The average over every step: `w − u / c`.
        let average = |w: &[f32], u: &[f32]| -> Vec<f32> {
            w.iter().zip(u).map(|(w, u)| w - u / self.step).collect()
        };
        let averaged = average(&self.weights, &self.accumulated);
        let transitions = average(&self.transitions, &self.transitions_accumulated);
        let max = averaged
            .iter()
            .fold(0f32, |m, w| m.max(w.abs()))
            .max(f32::MIN_POSITIVE);
        let scale = max / f32::from(i16::MAX);
        let weights = averaged
            .iter()
            .map(|w| (w / scale).round() as i16)
            .collect();
        let mut tagger = Tagger {
            header: Header {
                tags: TAGS.iter().map(|t| (*t).to_string()).collect(),
                features_version: FEATURES_VERSION,
                buckets: self.buckets,
                scale,
                transitions,
                bloom_bits: self.gazetteer.words.len() * 64,
                checksum: 0,
                provenance: provenance.to_string(),
            },
            weights,
            gazetteer: self.gazetteer,
        };
        tagger.header.checksum = fnv64(&tagger.body());
        tagger
    }
}
