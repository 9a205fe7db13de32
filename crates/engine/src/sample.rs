//! Choosing the next token: greedy, temperature, top-k, top-p, logit bias, repetition,
//! presence and frequency penalties, a seeded RNG; and the per-token log-probability and
//! entropy the router uses as confidence.

use std::borrow::Cow;

use crate::lanes::{LaneKernel, Lanes, on_widest};

/// Sampling settings of one generation.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// 0 means no top-k cut.
    pub top_k: usize,
    /// 1.0 means no nucleus cut.
    pub top_p: f32,
    /// 1.0 means no penalty; >1 discourages tokens already in the context.
    pub repetition_penalty: f32,
    /// Subtracted once from the logit of every token already in the context (OpenAI's
    /// `presence_penalty`); 0 means none.
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per time it is in the context (OpenAI's
    /// `frequency_penalty`); 0 means none.
    pub frequency_penalty: f32,
    /// Added to the logits of these token ids before anything else (OpenAI's `logit_bias`:
    /// −100 bans a token, +100 all but forces it).
    pub logit_bias: Vec<(u32, f32)>,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: Vec::new(),
            seed: 0,
        }
    }
}

/// SplitMix64: small, seedable, identical on every platform.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// A uniform float in [0, 1).
    pub fn next_f32(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 40) as f32 / (1u64 << 24) as f32
    }
}

/// The chosen token with what the router needs to judge it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampled {
    pub token: u32,
    /// log p(token) under the model's raw distribution (temperature 1).
    pub logprob: f32,
    /// Entropy of that distribution, in nats.
    pub entropy: f32,
}

/// Log-softmax of `logits`.
pub fn log_softmax(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = logits.iter().map(|l| (l - max).exp()).sum::<f32>().ln() + max;
    logits.iter().map(|l| l - lse).collect()
}

/// The `k` most likely tokens with their log-probabilities, best first.
pub fn top_logprobs(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
    let lp = log_softmax(logits);
    let mut idx: Vec<u32> = (0..lp.len() as u32).collect();
    let k = k.min(idx.len());
    if k == 0 {
        return Vec::new();
    }
    idx.select_nth_unstable_by(k - 1, |&a, &b| lp[b as usize].total_cmp(&lp[a as usize]));
    idx.truncate(k);
    idx.sort_by(|&a, &b| lp[b as usize].total_cmp(&lp[a as usize]));
    idx.into_iter().map(|i| (i, lp[i as usize])).collect()
}

/// The distribution sampling draws from, after bias, penalties, temperature, top-k and
/// top-p; `None` for greedy. Shared with speculative verification so both use the same
/// target.
pub fn target_probs(logits: &[f32], params: &SamplingParams, context: &[u32]) -> Option<Vec<f32>> {
    if params.temperature <= 0.0 {
        return None;
    }
    let mut l = adjusted(logits, params, context).into_owned();
    let inv_t = 1.0 / params.temperature;
    l.iter_mut().for_each(|v| *v *= inv_t);
    let mut order: Vec<usize> = (0..l.len()).collect();
    order.sort_unstable_by(|&a, &b| l[b].total_cmp(&l[a]));
    let keep_k = if params.top_k == 0 {
        l.len()
    } else {
        params.top_k.min(l.len())
    };
    let max = l[order[0]];
    let mut probs = vec![0f32; l.len()];
    let mut sum = 0f32;
    for &i in &order[..keep_k] {
        probs[i] = (l[i] - max).exp();
        sum += probs[i];
    }
    // Nucleus: keep the smallest prefix whose mass reaches top_p.
    let mut cum = 0f32;
    let mut cut = keep_k;
    for (n, &i) in order[..keep_k].iter().enumerate() {
        cum += probs[i] / sum;
        if cum >= params.top_p {
            cut = n + 1;
            break;
        }
    }
    for &i in &order[cut..keep_k] {
        probs[i] = 0.0;
    }
    let total: f32 = order[..cut].iter().map(|&i| probs[i]).sum();
    probs.iter_mut().for_each(|p| *p /= total);
    Some(probs)
}

/// `logits` after the request's logit bias and its repetition, presence and frequency
/// penalties over `context` (prompt included, as the repetition penalty always counted).
fn adjusted<'a>(logits: &'a [f32], params: &SamplingParams, context: &[u32]) -> Cow<'a, [f32]> {
    let penalised = params.repetition_penalty != 1.0
        || params.presence_penalty != 0.0
        || params.frequency_penalty != 0.0;
    if !penalised && params.logit_bias.is_empty() {
        return Cow::Borrowed(logits);
    }
    let mut l = logits.to_vec();
    for &(token, bias) in &params.logit_bias {
        if let Some(v) = l.get_mut(token as usize) {
            *v += bias;
        }
    }
    if penalised {
        for (token, count) in counts(context) {
            if let Some(v) = l.get_mut(token as usize) {
                *v = penalise(*v, count, params);
            }
        }
    }
    Cow::Owned(l)
}

/// How often each token occurs in `context`.
fn counts(context: &[u32]) -> ahash::AHashMap<u32, u32> {
    let mut counts = ahash::AHashMap::new();
    for &t in context {
        *counts.entry(t).or_insert(0) += 1;
    }
    counts
}

/// One seen token's logit after the penalties: llama.cpp's repetition rule (divide a positive
/// logit, multiply a negative one), then OpenAI's `logit − count·frequency − presence`.
fn penalise(logit: f32, count: u32, params: &SamplingParams) -> f32 {
    let r = params.repetition_penalty;
    let repeated = if logit > 0.0 { logit / r } else { logit * r };
    repeated - count as f32 * params.frequency_penalty - params.presence_penalty
}

/// Index of the largest value (the first on ties, like llama.cpp's greedy sampler).
pub fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best as u32
}

/// Draws an index from `probs` with one uniform number.
pub fn draw(probs: &[f32], rng: &mut Rng) -> u32 {
    let r = rng.next_f32();
    let mut cum = 0f32;
    let mut last = 0;
    for (i, &p) in probs.iter().enumerate() {
        if p > 0.0 {
            cum += p;
            last = i;
            if r < cum {
                return i as u32;
            }
        }
    }
    last as u32
}

/// The greedy choice: the largest logit after the request's bias and penalties (the first
/// on ties).
pub fn greedy(logits: &[f32], params: &SamplingParams, context: &[u32]) -> u32 {
    argmax(&adjusted(logits, params, context))
}

/// Picks the next token from `logits`.
pub fn sample(logits: &[f32], params: &SamplingParams, context: &[u32], rng: &mut Rng) -> Sampled {
    let spread = spread(logits);
    let token = match target_probs(logits, params, context) {
        None => greedy(logits, params, context),
        Some(p) => draw(&p, rng),
    };
    Sampled {
        token,
        logprob: logits[token as usize] - spread.log_sum,
        entropy: spread.entropy,
    }
}

/// How sure a distribution is of its best token: what the router reads at an answer's first
/// position, computed once here for the page, the CLI and the evaluation alike.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Confidence {
    /// Entropy of the distribution, in nats.
    pub entropy: f32,
    /// log p of the most likely token.
    pub logprob: f32,
    /// log p of the most likely token minus that of the second.
    pub margin: f32,
}

/// [`Confidence`] of the raw distribution (temperature 1) of `logits`.
pub fn confidence(logits: &[f32]) -> Confidence {
    let spread = spread(logits);
    let (mut first, mut second) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &l in logits {
        if l > first {
            second = first;
            first = l;
        } else if l > second {
            second = l;
        }
    }
    Confidence {
        entropy: spread.entropy,
        logprob: first - spread.log_sum,
        margin: if second.is_finite() {
            first - second
        } else {
            f32::INFINITY
        },
    }
}

/// What one pass of exponentials over a vocabulary's logits gives the router.
#[derive(Debug, Clone, Copy)]
struct Spread {
    /// log Σ eˡ over the logits, the log-softmax's offset.
    log_sum: f32,
    /// The softmax's entropy in nats: log_sum − Σ p·l.
    entropy: f32,
}

/// Below this distance from the largest logit a term's eˣ is under f32's smallest subnormal:
/// clamping there leaves every sum as it is, and keeps a masked (−∞) logit's product finite.
const NEGLIGIBLE: f32 = -104.0;

/// [`Spread`] of `logits` on the widest vector lanes of the chosen kernel family: the vocabulary is
/// large enough (Gemma's 262,144) for its exponentials to show in a decode step.
fn spread(logits: &[f32]) -> Spread {
    on_widest(SpreadOf(logits))
}

/// [`spread`]'s loop.
struct SpreadOf<'a>(&'a [f32]);

impl LaneKernel for SpreadOf<'_> {
    type Output = Spread;
    /// The padded tail holds eight.
    const WIDEST: usize = 8;

    #[inline(always)]
    unsafe fn run<V: Lanes>(self) -> Spread {
        // SAFETY: the caller's guarantee.
        unsafe { spread_on::<V>(self.0) }
    }
}

/// The body of [`spread`] on lanes `V`: the largest logit, then Σ eˣ and Σ eˣ·x over
/// x = logit − largest, the last lanes padded with −∞.
///
/// # Safety
/// The machine runs `V`'s instruction set.
#[inline(always)]
unsafe fn spread_on<V: Lanes>(logits: &[f32]) -> Spread {
    let chunks = logits.chunks_exact(V::WIDTH);
    let mut tail = [f32::NEG_INFINITY; 8];
    tail[..chunks.remainder().len()].copy_from_slice(chunks.remainder());
    // SAFETY: the caller's guarantee; every load reads a whole chunk or the padded tail.
    unsafe {
        let mut top = V::load(&tail);
        for chunk in chunks.clone() {
            top = top.max(V::load(chunk));
        }
        let max = lanes_of(top, f32::NEG_INFINITY)
            .into_iter()
            .fold(f32::NEG_INFINITY, f32::max);
        if !max.is_finite() {
            return Spread {
                log_sum: max,
                entropy: 0.0,
            };
        }
        let (shift, floor) = (V::splat(-max), V::splat(NEGLIGIBLE));
        let mut sums = [V::splat(0.0); 2];
        for chunk in chunks {
            add_terms(V::load(chunk), (shift, floor), &mut sums);
        }
        add_terms(V::load(&tail), (shift, floor), &mut sums);
        let [total, weighted] =
            sums.map(|v| lanes_of(v, 0.0).into_iter().map(f64::from).sum::<f64>());
        let log_total = total.ln();
        Spread {
            log_sum: max + log_total as f32,
            entropy: (log_total - weighted / total) as f32,
        }
    }
}

/// Adds eˣ and eˣ·x of `x` = `logits` + `shift` (at least `floor`) to `sums`.
///
/// # Safety
/// The machine runs `V`'s instruction set.
#[inline(always)]
unsafe fn add_terms<V: Lanes>(logits: V, (shift, floor): (V, V), sums: &mut [V; 2]) {
    // SAFETY: the caller's guarantee.
    unsafe {
        let x = logits.add(shift).max(floor);
        let e = x.exp();
        sums[0] = sums[0].add(e);
        sums[1] = sums[1].add_product(e, x);
    }
}

/// The lanes of `v`, then `pad` up to eight.
///
/// # Safety
/// The machine runs `V`'s instruction set.
#[inline(always)]
unsafe fn lanes_of<V: Lanes>(v: V, pad: f32) -> [f32; 8] {
    let mut out = [pad; 8];
    // SAFETY: the caller's guarantee.
    unsafe { v.store(&mut out) };
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one-pass log-sum and entropy equal the definitions' (in f64) on a vocabulary whose
    /// length leaves a tail, with masked logits, on every lane type this machine runs.
    #[test]
    fn spread_equals_the_definitions() {
        let mut logits: Vec<f32> = (0..1003).map(|i| (i as f32 * 0.731).sin() * 9.0).collect();
        logits[17] = f32::NEG_INFINITY;
        logits[1002] = f32::NEG_INFINITY;
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let z: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
        let log_sum = max + z.ln();
        let entropy: f64 = -logits
            .iter()
            .filter(|l| l.is_finite())
            .map(|&l| (l as f64 - log_sum).exp() * (l as f64 - log_sum))
            .sum::<f64>();
        // SAFETY: plain floats run anywhere.
        let portable = unsafe { spread_on::<f32>(&logits) };
        for s in [spread(&logits), portable] {
            assert!(
                (s.log_sum as f64 - log_sum).abs() < 1e-5,
                "{s:?} vs {log_sum}"
            );
            assert!(
                (s.entropy as f64 - entropy).abs() < 1e-5,
                "{s:?} vs {entropy}"
            );
        }
    }

    #[test]
    fn greedy_takes_the_max_and_reports_its_logprob() {
        let s = sample(
            &[0.0, 2.0, 1.0],
            &SamplingParams::default(),
            &[],
            &mut Rng::new(1),
        );
        assert_eq!(s.token, 1);
        let want = 2.0 - (1f32 + 2f32.exp() + 1f32.exp()).ln();
        assert!((s.logprob - want).abs() < 1e-6);
        assert!(s.entropy > 0.0 && s.entropy < 3f32.ln());
    }

    #[test]
    fn confidence_is_entropy_top_log_prob_and_margin_of_the_softmax() {
        // p = 0.5, 0.25, 0.25: H = 1.5 ln 2, log p1 = −ln 2, margin ln 2.
        let logits = [2f32.ln(), 0.0, 0.0];
        let c = confidence(&logits);
        let ln2 = std::f32::consts::LN_2;
        assert!((c.entropy - 1.5 * ln2).abs() < 1e-5, "{c:?}");
        assert!((c.logprob + ln2).abs() < 1e-5, "{c:?}");
        assert!((c.margin - ln2).abs() < 1e-6, "{c:?}");
        let one = confidence(&[1.0, f32::NEG_INFINITY]);
        assert_eq!((one.logprob, one.margin), (0.0, f32::INFINITY));
    }

    #[test]
    fn same_seed_same_tokens_and_top_k_one_is_greedy() {
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
        let p = SamplingParams {
            temperature: 0.9,
            top_p: 0.9,
            seed: 7,
            ..Default::default()
        };
        let run = |seed| {
            let mut rng = Rng::new(seed);
            (0..20)
                .map(|_| sample(&logits, &p, &[], &mut rng).token)
                .collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
        let k1 = SamplingParams {
            temperature: 1.0,
            top_k: 1,
            ..Default::default()
        };
        assert_eq!(
            sample(&logits, &k1, &[], &mut Rng::new(3)).token,
            argmax(&logits)
        );
    }

    #[test]
    fn sampling_frequencies_follow_the_distribution() {
        let logits = [1.0f32.ln(), 3.0f32.ln()]; // p = 0.25, 0.75
        let p = SamplingParams {
            temperature: 1.0,
            ..Default::default()
        };
        let mut rng = Rng::new(42);
        let ones = (0..20_000)
            .filter(|_| sample(&logits, &p, &[], &mut rng).token == 1)
            .count();
        assert!((ones as f32 / 20_000.0 - 0.75).abs() < 0.015, "{ones}");
    }

    #[test]
    fn top_p_cuts_the_tail_and_penalty_demotes_seen_tokens() {
        let logits = [3.0, 2.0, -5.0];
        let p = target_probs(
            &logits,
            &SamplingParams {
                temperature: 1.0,
                top_p: 0.5,
                ..Default::default()
            },
            &[],
        )
        .expect("probs");
        assert_eq!(p, vec![1.0, 0.0, 0.0]);
        let s = sample(
            &[2.0, 1.9],
            &SamplingParams {
                repetition_penalty: 1.5,
                ..Default::default()
            },
            &[0],
            &mut Rng::new(0),
        );
        assert_eq!(s.token, 1);
    }

    #[test]
    fn logit_bias_bans_and_forces_tokens_even_when_greedy() {
        let logits = [3.0, 2.0, 1.0];
        let ban = SamplingParams {
            logit_bias: vec![(0, -100.0)],
            ..Default::default()
        };
        assert_eq!(sample(&logits, &ban, &[], &mut Rng::new(0)).token, 1);
        let force = SamplingParams {
            logit_bias: vec![(2, 100.0)],
            temperature: 1.0,
            ..Default::default()
        };
        let mut rng = Rng::new(5);
        assert!((0..200).all(|_| sample(&logits, &force, &[], &mut rng).token == 2));
        // An id outside the vocabulary is ignored, not a panic.
        let outside = SamplingParams {
            logit_bias: vec![(99, 5.0)],
            ..Default::default()
        };
        assert_eq!(sample(&logits, &outside, &[], &mut Rng::new(0)).token, 0);
    }

    #[test]
    fn presence_counts_once_and_frequency_per_occurrence() {
        // Token 0 leads and was seen three times; token 1 was seen once; token 2 never.
        let logits = [2.0, 1.0, 0.5];
        let context = [0, 0, 0, 1];
        let greedy = |params: SamplingParams| sample(&logits, &params, &context, &mut Rng::new(0));
        // Presence: 2.0 − 0.9 = 1.1 still leads 0.1 and 0.5.
        let presence = SamplingParams {
            presence_penalty: 0.9,
            ..Default::default()
        };
        assert_eq!(greedy(presence).token, 0);
        // Frequency: 2.0 − 3·0.6 = 0.2 and 1.0 − 0.6 = 0.4 fall behind the unseen 0.5.
        let frequency = SamplingParams {
            frequency_penalty: 0.6,
            ..Default::default()
        };
        assert_eq!(greedy(frequency).token, 2);
        // A negative presence penalty favours what was seen: 1.0 + 1.5 passes 2.0.
        let favour = SamplingParams {
            presence_penalty: -1.5,
            ..Default::default()
        };
        assert_eq!(
            sample(&[1.0, 2.0], &favour, &[0], &mut Rng::new(0)).token,
            0
        );
    }
}
