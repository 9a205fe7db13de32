//! Speculative steps for edge-draft / cloud-verify: the edge model drafts k tokens greedily,
//! the target model checks them in one forward pass, and [`DraftLength`] picks k.
//!
//! The draft is deterministic (greedy), so the draft distribution is a point mass and the
//! verifier needs no more than the drafted ids to stay exact: with temperature 0 it accepts a
//! token exactly when it is the target's greedy choice (the output is token for token the
//! target's greedy output); with temperature > 0 it accepts token x with probability p(x) and
//! otherwise draws from p with x removed, which leaves every emitted token distributed as p
//! (the rejection rule of Leviathan et al. 2023 with q = δ_x).

use web_time::Instant;

use crate::causal_lm::{BlockingLm, CausalLm, ModelCache, ready};
use crate::config::ModelError;
use crate::generate::{Engine, EngineError, Finish, GenerateParams, Prompt, shown_next};
use crate::kv::KvCache;
use crate::model::Model;
use crate::sample::{self, Rng, SamplingParams};
use crate::tokenizer::Tokenizer;

#[cfg(feature = "device")]
mod device;

/// Drafts `k` tokens greedily after the cache's contents, given the logits of its last
/// position; the cache grows by every drafted token but the last.
async fn draft_greedy<D: CausalLm>(
    model: &D,
    cache: &mut D::Cache,
    last_logits: &[f32],
    k: usize,
) -> Result<Draft, ModelError> {
    let mut logits = last_logits.to_vec();
    let mut out = Draft {
        tokens: Vec::with_capacity(k),
        probs: Vec::with_capacity(k),
    };
    let greedy = SamplingParams::default();
    let mut rng = Rng::new(0);
    for i in 0..k {
        let s = sample::sample(&logits, &greedy, &[], &mut rng);
        out.tokens.push(s.token);
        out.probs.push(s.logprob.exp());
        if i + 1 == k {
            break;
        }
        logits = model.forward_last(&[s.token], cache).await?;
    }
    Ok(out)
}

/// The drafting side after a verdict: keeps the accepted draft in the cache, feeds the
/// verifier's token, and returns the logits to draft from next. `base` is the cache length
/// before the draft.
async fn accept_verdict<D: CausalLm>(
    model: &D,
    cache: &mut D::Cache,
    base: usize,
    draft: &Draft,
    verdict: &Verdict,
) -> Result<Vec<f32>, ModelError> {
    let keep = base + verdict.accepted.min(draft.tokens.len());
    cache.rewind(keep);
    let mut feed: Vec<u32> = draft.tokens[cache.filled() - base..keep - base].to_vec();
    feed.push(verdict.next_token);
    // Emitted tokens, each computed as decoding it would be: the edge then goes on from the
    // very bits the verifier's plain decoding has.
    let mut all = model.forward_all(&feed, cache).await?;
    Ok(all.pop().unwrap_or_default())
}

/// Drafted tokens with the draft model's probability of each.
#[derive(Debug, Clone, PartialEq)]
pub struct Draft {
    pub tokens: Vec<u32>,
    pub probs: Vec<f32>,
}

/// The verifier's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// Draft tokens accepted, from the start.
    pub accepted: usize,
    /// The target's token after the accepted prefix (a correction, or a bonus token when
    /// every draft token was accepted).
    pub next_token: u32,
}

impl Model {
    /// Drafts `k` tokens greedily after the cache's contents, given the logits of its last
    /// position. The cache grows by every drafted token but the last; [`Model::accept`]
    /// settles it.
    pub fn draft(
        &self,
        cache: &mut KvCache,
        last_logits: &[f32],
        k: usize,
    ) -> Result<Draft, ModelError> {
        ready(draft_greedy(self, cache, last_logits, k))
    }

    /// The drafting side after a verdict: keeps the accepted draft in the cache, feeds the
    /// verifier's token, and returns the logits to draft from next. `base` is the cache length
    /// before [`Model::draft`].
    pub fn accept(
        &self,
        cache: &mut KvCache,
        base: usize,
        draft: &Draft,
        verdict: &Verdict,
    ) -> Result<Vec<f32>, ModelError> {
        ready(accept_verdict(self, cache, base, draft, verdict))
    }
}

/// Verifies `draft` after the cache's contents, whose last position's logits are
/// `last_logits`, on any model that can run synchronously, in one pass that computes each
/// drafted position as decoding it would. `context` is every token before the draft (for the
/// repetition penalty). Afterwards the cache holds the prefix plus the accepted tokens; the
/// verdict's `next_token` is not in it yet.
pub fn verify<M: BlockingLm>(
    model: &M,
    cache: &mut M::Cache,
    last_logits: &[f32],
    draft: &[u32],
    params: &SamplingParams,
    context: &[u32],
    rng: &mut Rng,
) -> Result<Verdict, ModelError> {
    let start = cache.filled();
    let all = if draft.is_empty() {
        Vec::new()
    } else {
        model.forward_all_blocking(draft, cache)?
    };
    // Position i's prediction: the prefix's logits for draft[0], then draft[i-1]'s.
    let at = |i: usize| if i == 0 { last_logits } else { &all[i - 1] };
    let verdict = judge(at, draft, params, context, rng);
    cache.rewind(start + verdict.accepted);
    Ok(verdict)
}

/// Verifies `draft` after a `pending` token the cache does not hold yet (the previous
/// verdict's `next_token`), on any model that can run synchronously: one pass over the
/// pending token and the draft, the call a verify session makes, so the previous call's
/// logits need not be kept. Afterwards the cache holds the pending token and the accepted
/// draft.
pub fn verify_after<M: BlockingLm>(
    model: &M,
    cache: &mut M::Cache,
    pending: u32,
    draft: &[u32],
    params: &SamplingParams,
    context: &[u32],
    rng: &mut Rng,
) -> Result<Verdict, ModelError> {
    let start = cache.filled();
    let mut input = Vec::with_capacity(draft.len() + 1);
    input.push(pending);
    input.extend_from_slice(draft);
    let all = model.forward_all_blocking(&input, cache)?;
    let verdict = judge_after(&all, pending, draft, params, context, rng);
    cache.rewind(start + 1 + verdict.accepted);
    Ok(verdict)
}

/// The verdict on `draft` from the logits of a pass over the pending token and the draft.
fn judge_after(
    all: &[Vec<f32>],
    pending: u32,
    draft: &[u32],
    params: &SamplingParams,
    context: &[u32],
    rng: &mut Rng,
) -> Verdict {
    let mut ctx = context.to_vec();
    ctx.push(pending);
    // A pass returns a row per input token; an empty row would only come from a broken device.
    judge(
        |i| all.get(i).map_or(&[][..], Vec::as_slice),
        draft,
        params,
        &ctx,
        rng,
    )
}

/// The verdict on a greedy draft, given the target's logits predicting each draft position
/// (`logits_at(draft.len())` predicts the bonus token).
fn judge<'a>(
    logits_at: impl Fn(usize) -> &'a [f32],
    draft: &[u32],
    params: &SamplingParams,
    context: &[u32],
    rng: &mut Rng,
) -> Verdict {
    let mut ctx = context.to_vec();
    for (i, &token) in draft.iter().enumerate() {
        let logits = logits_at(i);
        let rejected_for = match sample::target_probs(logits, params, &ctx) {
            None => Some(sample::greedy(logits, params, &ctx)).filter(|&c| c != token),
            Some(mut p) => {
                let p_token = p.get(token as usize).copied().unwrap_or(0.0);
                if rng.next_f32() < p_token {
                    None
                } else {
                    // The residual max(0, p - δ_token), normalised by the draw.
                    if let Some(slot) = p.get_mut(token as usize) {
                        *slot = 0.0;
                    }
                    let rest: f32 = p.iter().sum();
                    if rest > 0.0 {
                        p.iter_mut().for_each(|v| *v /= rest);
                    }
                    Some(sample::draw(&p, rng))
                }
            }
        };
        if let Some(next_token) = rejected_for {
            return Verdict {
                accepted: i,
                next_token,
            };
        }
        ctx.push(token);
    }
    Verdict {
        accepted: draft.len(),
        next_token: sample::sample(logits_at(draft.len()), params, &ctx, rng).token,
    }
}

/// Chooses how many tokens to draft from the running acceptance and the measured costs, and
/// says when speculation has stopped paying for itself.
///
/// With per-token acceptance α a draft of k yields (1 − α^(k+1)) / (1 − α) tokens per verify
/// call; a call costs k drafted tokens plus the verify call, modelled as a + b·(k + 1): a round
/// trip and a fixed cost, plus what each verified token costs the verifier (about nothing on a
/// GPU, most of a decode step on a CPU). k maximises tokens per second.
#[derive(Debug, Clone)]
pub struct DraftLength {
    k: usize,
    min: usize,
    max: usize,
    /// Exponentially weighted counts of accepted and rejected draft tokens.
    accepted: f32,
    rejected: f32,
    draft_ms_per_token: Option<f32>,
    /// Decayed sums for the least-squares fit of call time on verified tokens:
    /// weight, Σx, Σy, Σx², Σxy.
    fit: [f32; 5],
    calls: usize,
}

/// Weight of the past in the running averages: about the last eight calls count.
const DECAY: f32 = 0.875;

impl Default for DraftLength {
    fn default() -> Self {
        Self::new(4, 1, 16)
    }
}

impl DraftLength {
    /// Starts at `k`, always within `min..=max`.
    pub fn new(k: usize, min: usize, max: usize) -> Self {
        let min = min.max(1);
        let max = max.max(min);
        Self {
            k: k.clamp(min, max),
            min,
            max,
            // A prior worth a few tokens, so one early rejection does not collapse k.
            accepted: 3.0,
            rejected: 1.0,
            draft_ms_per_token: None,
            fit: [0.0; 5],
            calls: 0,
        }
    }

    /// Tokens to draft next.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Running per-token acceptance rate.
    pub fn acceptance(&self) -> f32 {
        self.accepted / (self.accepted + self.rejected)
    }

    /// Verify calls recorded.
    pub fn calls(&self) -> usize {
        self.calls
    }

    /// Records one call: tokens drafted and accepted, and what drafting and the verify call
    /// (round trip included) took.
    pub fn record(&mut self, drafted: usize, accepted: usize, draft_ms: f32, call_ms: f32) {
        self.calls += 1;
        let rejected = if accepted < drafted { 1.0 } else { 0.0 };
        self.accepted = self.accepted * DECAY + accepted as f32;
        self.rejected = self.rejected * DECAY + rejected;
        let ewma =
            |old: Option<f32>, new: f32| Some(old.map_or(new, |o| o * DECAY + new * (1.0 - DECAY)));
        if drafted > 0 {
            self.draft_ms_per_token = ewma(self.draft_ms_per_token, draft_ms / drafted as f32);
        }
        let x = drafted as f32 + 1.0;
        for (sum, add) in self
            .fit
            .iter_mut()
            .zip([1.0, x, call_ms, x * x, x * call_ms])
        {
            *sum = *sum * DECAY + add;
        }
        self.k = self.best_k();
    }

    /// The call-time model (fixed ms, ms per verified token), once a call was seen.
    pub fn call_cost(&self) -> Option<(f32, f32)> {
        let [w, sx, sy, sxx, sxy] = self.fit;
        if w <= 0.0 {
            return None;
        }
        let var = sxx / w - (sx / w).powi(2);
        // Too little spread in k to tell the parts apart: treat the cost as fixed.
        if var < 0.25 {
            return Some((sy / w, 0.0));
        }
        let b = ((sxy / w - sx / w * sy / w) / var).max(0.0);
        let a = (sy / w - b * sx / w).max(0.0);
        Some((a, b))
    }

    /// Whether to stop speculating and stream from the cloud instead: after a few calls, the
    /// acceptance stayed below `threshold`.
    pub fn should_fall_back(&self, threshold: f32) -> bool {
        self.calls >= 4 && self.acceptance() < threshold
    }

    fn best_k(&self) -> usize {
        let alpha = self.acceptance().clamp(0.0, 0.999);
        let (Some(t_draft), Some((fixed, per_token))) = (self.draft_ms_per_token, self.call_cost())
        else {
            return self.k;
        };
        let yield_of = |k: usize| (1.0 - alpha.powi(k as i32 + 1)) / (1.0 - alpha);
        let cost = |k: usize| k as f32 * t_draft + fixed + per_token * (k as f32 + 1.0);
        let rate = |k: usize| yield_of(k) / cost(k).max(0.01);
        (self.min..=self.max)
            .max_by(|&a, &b| rate(a).total_cmp(&rate(b)))
            .unwrap_or(self.k)
    }
}

/// Counts of one speculative generation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpeculationStats {
    /// Verify calls answered.
    pub calls: usize,
    /// Tokens drafted into answered calls.
    pub drafted: usize,
    /// Drafted tokens the verifier accepted.
    pub accepted: usize,
    /// Tokens generated by the edge alone after the verifier failed.
    pub edge_alone: usize,
}

/// The drafting side of one speculative generation: [`Speculation::draft`] proposes tokens,
/// the caller has them verified (over HTTP, in the browser through the worker) and hands the
/// verdict to [`Speculation::settle`], which emits the accepted tokens and the verifier's own.
/// If the verifier fails, [`Speculation::step_alone`] goes on with the edge model alone from
/// exactly the tokens emitted so far.
///
/// `C` is the drafting model's cache. The plain methods run a [`BlockingLm`] synchronously;
/// `start_with` and the `*_with` methods are awaited and take any model (WebGPU in a browser).
pub struct Speculation<C = KvCache> {
    cache: C,
    /// Logits after the last emitted token (what the next draft starts from).
    logits: Vec<f32>,
    prompt: Vec<u32>,
    tokens: Vec<u32>,
    text: String,
    /// Bytes of `text` already handed out.
    emitted: usize,
    params: GenerateParams,
    rng: Rng,
    lengths: DraftLength,
    /// The draft awaiting a verdict: the cache length before it, the draft, when drafting began.
    pending: Option<(usize, Draft, Instant)>,
    draft_ms: f32,
    finish: Option<Finish>,
    stats: SpeculationStats,
}

impl<C> std::fmt::Debug for Speculation<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Speculation")
            .field("tokens", &self.tokens.len())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl<C: ModelCache> Speculation<C> {
    /// Tokenizes and prefills `prompt` on the drafting model. Every later call takes the
    /// same `engine` (the state holds no borrow, so a wasm object can own it).
    pub fn start<M: BlockingLm<Cache = C>>(
        engine: &Engine<M>,
        prompt: Prompt<'_>,
        params: &GenerateParams,
        lengths: DraftLength,
    ) -> Result<Self, EngineError> {
        ready(Self::start_with(engine, prompt, params, lengths))
    }

    /// [`Speculation::start`] on any model, awaited.
    pub async fn start_with<M: CausalLm<Cache = C>>(
        engine: &Engine<M>,
        prompt: Prompt<'_>,
        params: &GenerateParams,
        lengths: DraftLength,
    ) -> Result<Self, EngineError> {
        if params.constraint.is_some() {
            // The verifier would have to follow the same grammar, which /v1/verify does not
            // carry: a constrained answer is generated by one side alone.
            return Err(EngineError::SpeculationConstrained);
        }
        let (prompt, cache, logits) = engine.prefill_async(prompt, params.context).await?;
        Ok(Self::prefilled(cache, logits, prompt, params, lengths))
    }

    /// Drafts the next tokens to verify; `None` once finished. A draft still awaiting its
    /// verdict is returned again rather than redrafted.
    pub fn draft<M: BlockingLm<Cache = C>>(
        &mut self,
        engine: &Engine<M>,
    ) -> Result<Option<&[u32]>, EngineError> {
        ready(self.draft_with(&engine.model))
    }

    /// Takes the verifier's verdict on the pending draft and returns the new text to show.
    pub fn settle<M: BlockingLm<Cache = C>>(
        &mut self,
        engine: &Engine<M>,
        verdict: Verdict,
    ) -> Result<String, EngineError> {
        ready(self.settle_with(&engine.model, &engine.tokenizer, verdict))
    }

    /// One token from the edge model alone (the verifier is gone): forgets any pending draft
    /// and samples with the generation's own settings. Returns the new text, or `None` once
    /// finished.
    pub fn step_alone<M: BlockingLm<Cache = C>>(
        &mut self,
        engine: &Engine<M>,
    ) -> Result<Option<String>, EngineError> {
        ready(self.step_alone_with(&engine.model, &engine.tokenizer))
    }

    fn prefilled(
        cache: C,
        logits: Vec<f32>,
        prompt: Vec<u32>,
        params: &GenerateParams,
        lengths: DraftLength,
    ) -> Self {
        Self {
            cache,
            logits,
            prompt,
            tokens: Vec::new(),
            text: String::new(),
            emitted: 0,
            rng: Rng::new(params.sampling.seed),
            params: params.clone(),
            lengths,
            pending: None,
            draft_ms: 0.0,
            finish: None,
            stats: SpeculationStats::default(),
        }
    }

    /// The prompt's token ids (the first verify call's prefix).
    pub fn prompt(&self) -> &[u32] {
        &self.prompt
    }

    /// Tokens emitted so far.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// The text so far (up to a stop string).
    pub fn text(&self) -> &str {
        &self.text[..self.emitted.min(self.text.len())]
    }

    /// Why generation ended, once it has.
    pub fn finish(&self) -> Option<Finish> {
        self.finish
    }

    /// Counts so far.
    pub fn stats(&self) -> SpeculationStats {
        self.stats
    }

    /// The draft-length controller (its acceptance rate and k).
    pub fn lengths(&self) -> &DraftLength {
        &self.lengths
    }

    /// [`Speculation::draft`] with any drafting model.
    pub async fn draft_with<D: CausalLm<Cache = C>>(
        &mut self,
        model: &D,
    ) -> Result<Option<&[u32]>, EngineError> {
        if self.finish.is_some() {
            return Ok(None);
        }
        if self.pending.is_none() {
            let room = self.params.max_tokens.saturating_sub(self.tokens.len());
            // The verifier adds one token of its own to every call.
            let k = self.lengths.k().min(room.saturating_sub(1)).max(1);
            let started = Instant::now();
            let base = self.cache.filled();
            let d = draft_greedy(model, &mut self.cache, &self.logits, k).await?;
            self.draft_ms = started.elapsed().as_secs_f32() * 1000.0;
            self.pending = Some((base, d, Instant::now()));
        }
        Ok(self.pending.as_ref().map(|(_, d, _)| d.tokens.as_slice()))
    }

    /// [`Speculation::settle`] with any drafting model.
    pub async fn settle_with<D: CausalLm<Cache = C>>(
        &mut self,
        model: &D,
        tokenizer: &Tokenizer,
        verdict: Verdict,
    ) -> Result<String, EngineError> {
        let Some((base, d, sent)) = self.pending.take() else {
            return Ok(String::new());
        };
        let accepted = verdict.accepted.min(d.tokens.len());
        let call_ms = sent.elapsed().as_secs_f32() * 1000.0;
        self.stats.calls += 1;
        self.stats.drafted += d.tokens.len();
        self.stats.accepted += accepted;
        self.lengths
            .record(d.tokens.len(), accepted, self.draft_ms, call_ms);
        let mut emitted: Vec<u32> = d.tokens[..accepted].to_vec();
        emitted.push(verdict.next_token);
        let text = self.emit(tokenizer, &emitted)?;
        if self.finish.is_none() {
            let verdict = Verdict {
                accepted,
                ..verdict
            };
            self.logits = accept_verdict(model, &mut self.cache, base, &d, &verdict).await?;
        }
        Ok(text)
    }

    /// [`Speculation::step_alone`] with any drafting model.
    pub async fn step_alone_with<D: CausalLm<Cache = C>>(
        &mut self,
        model: &D,
        tokenizer: &Tokenizer,
    ) -> Result<Option<String>, EngineError> {
        if let Some((base, _, _)) = self.pending.take() {
            self.cache.rewind(base);
        }
        if self.finish.is_some() {
            return Ok(None);
        }
        let mut context = self.prompt.clone();
        context.extend_from_slice(&self.tokens);
        let s = sample::sample(&self.logits, &self.params.sampling, &context, &mut self.rng);
        self.stats.edge_alone += 1;
        let text = self.emit(tokenizer, &[s.token])?;
        if self.finish.is_none() {
            self.logits = model.forward_last(&[s.token], &mut self.cache).await?;
        }
        Ok(Some(text))
    }

    /// Appends tokens up to a stop token, a stop string or the token limit.
    fn emit(&mut self, tokenizer: &Tokenizer, new: &[u32]) -> Result<String, EngineError> {
        for &t in new {
            if self.params.stops_at(tokenizer, t) {
                self.finish = Some(Finish::Stop);
                break;
            }
            self.tokens.push(t);
            if self.tokens.len() >= self.params.max_tokens
                || self.prompt.len() + self.tokens.len() >= self.cache.room()
            {
                self.finish = Some(Finish::Length);
                break;
            }
        }
        let full = tokenizer.decode(&self.tokens)?;
        // Once finished, nothing more is coming: show what was held back for a partial stop.
        let shown = shown_next(
            &full,
            self.emitted,
            &self.params.stop,
            self.finish.is_some(),
        );
        if shown.stopped {
            self.finish = Some(Finish::Stop);
        }
        self.emitted = shown.emitted;
        self.text = full;
        Ok(shown.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_judge_accepts_up_to_the_first_disagreement() {
        // Vocabulary of 3; the target prefers 1, then 2, then 0.
        let logits = [
            vec![0.0, 5.0, 0.0],
            vec![0.0, 0.0, 5.0],
            vec![5.0, 0.0, 0.0],
        ];
        let at = |i: usize| logits[i].as_slice();
        let p = SamplingParams::default();
        let mut rng = Rng::new(1);
        let all = judge(at, &[1, 2], &p, &[], &mut rng);
        assert_eq!(
            all,
            Verdict {
                accepted: 2,
                next_token: 0
            }
        );
        let wrong = judge(at, &[1, 0], &p, &[], &mut rng);
        assert_eq!(
            wrong,
            Verdict {
                accepted: 1,
                next_token: 2
            }
        );
    }

    #[test]
    fn sampled_judge_never_emits_a_token_the_target_excludes() {
        // top_k = 1 leaves the target a point mass on token 1: a draft of 2 is always rejected
        // and replaced by 1; a draft of 1 is always accepted.
        let logits = [vec![0.0, 5.0, 4.0], vec![0.0, 5.0, 4.0]];
        let p = SamplingParams {
            temperature: 1.0,
            top_k: 1,
            ..Default::default()
        };
        let mut rng = Rng::new(7);
        for _ in 0..200 {
            let v = judge(|i| logits[i].as_slice(), &[2], &p, &[], &mut rng);
            assert_eq!(
                v,
                Verdict {
                    accepted: 0,
                    next_token: 1
                }
            );
            let v = judge(|i| logits[i].as_slice(), &[1], &p, &[], &mut rng);
            assert_eq!(v.accepted, 1);
        }
    }

    #[test]
    fn draft_length_grows_when_drafts_are_accepted_and_shrinks_when_not() {
        let mut good = DraftLength::default();
        for _ in 0..10 {
            let k = good.k();
            good.record(k, k, 2.0 * k as f32, 50.0);
        }
        assert!(good.k() > 4, "k = {}", good.k());
        assert!(!good.should_fall_back(0.3));

        let mut bad = DraftLength::default();
        for _ in 0..10 {
            let k = bad.k();
            bad.record(k, 0, 2.0 * k as f32, 50.0);
        }
        assert!(bad.k() < 4, "k = {}", bad.k());
        assert!(bad.should_fall_back(0.3));
        assert!((1..=16).contains(&bad.k()));
    }

    #[test]
    fn a_verifier_that_pays_per_token_gets_shorter_drafts() {
        let run = |per_token: f32| {
            let mut d = DraftLength::default();
            for i in 0..20 {
                // Vary k a little so the fit can separate the fixed and per-token parts.
                let k = (d.k() + i % 2).min(16);
                d.record(
                    k,
                    (k * 4) / 5,
                    3.0 * k as f32,
                    20.0 + per_token * (k + 1) as f32,
                );
            }
            (d.k(), d.call_cost().expect("fitted"))
        };
        let (gpu_like, _) = run(0.5);
        let (cpu_like, (fixed, per)) = run(20.0);
        assert!(cpu_like < gpu_like, "{cpu_like} vs {gpu_like}");
        assert!(
            (per - 20.0).abs() < 1.0 && (fixed - 20.0).abs() < 5.0,
            "{fixed} + {per}·k"
        );
    }

    #[test]
    fn a_longer_round_trip_asks_for_longer_drafts() {
        let run = |call_ms: f32| {
            let mut d = DraftLength::default();
            for _ in 0..10 {
                let k = d.k();
                // Three of every four tokens accepted.
                d.record(k, (k * 3) / 4, 5.0 * k as f32, call_ms);
            }
            d.k()
        };
        assert!(run(200.0) > run(5.0), "{} vs {}", run(200.0), run(5.0));
    }
}
