//! Speculative steps for edge-draft / cloud-verify: `draft` proposes k tokens from a
//! small model; `verify` checks them with the target model in one forward pass.
//!
//! With temperature 0 the verifier accepts a drafted token exactly when it is the target's
//! greedy choice, so the output is token-for-token the target's greedy output. Sampled
//! verification (temperature > 0) needs the draft's whole distribution for exact residual
//! sampling and is not implemented yet: `verify` refuses it rather than approximate.

use crate::generate::{Engine, EngineError};
use crate::kv::KvCache;
use crate::sample::{self, Rng, SamplingParams};

/// k drafted tokens with the draft model's probability of each.
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

/// Sampled verification was asked for.
#[derive(Debug, thiserror::Error)]
#[error("speculative verification with temperature > 0 is not supported yet")]
pub struct SampledVerifyUnsupported;

impl Engine {
    /// Drafts `k` tokens after the cache's contents, given the logits of its last position.
    /// The cache grows by the drafted tokens; truncate it to what the verifier accepts.
    pub fn draft(
        &self,
        cache: &mut KvCache,
        last_logits: &[f32],
        k: usize,
        params: &SamplingParams,
        rng: &mut Rng,
    ) -> Result<Draft, EngineError> {
        let mut logits = last_logits.to_vec();
        let mut out = Draft {
            tokens: Vec::with_capacity(k),
            probs: Vec::with_capacity(k),
        };
        for i in 0..k {
            let s = sample::sample(&logits, params, &[], rng);
            out.tokens.push(s.token);
            out.probs.push(s.logprob.exp());
            if i + 1 < k {
                logits = self
                    .model
                    .forward(&[s.token], cache, false)?
                    .pop()
                    .unwrap_or_default();
            } else {
                // Keep the cache in step with the draft: it now holds every drafted token.
                self.model.forward(&[s.token], cache, false)?;
            }
        }
        Ok(out)
    }

    /// Verifies `draft` after the cache's contents (`last_logits` are those of its last
    /// position) in one forward pass. Afterwards the cache holds the prefix plus the accepted
    /// tokens; the verdict's `next_token` is not in it yet.
    pub fn verify(
        &self,
        cache: &mut KvCache,
        last_logits: &[f32],
        draft: &[u32],
        params: &SamplingParams,
    ) -> Result<Verdict, EngineError> {
        if params.temperature > 0.0 {
            return Err(EngineError::Unsupported(
                SampledVerifyUnsupported.to_string(),
            ));
        }
        let start = cache.len();
        if draft.is_empty() {
            return Ok(Verdict {
                accepted: 0,
                next_token: sample::argmax(last_logits),
            });
        }
        let all = self.model.forward(draft, cache, true)?;
        // Position i's prediction: the prefix's logits for draft[0], then draft[i-1]'s.
        let mut accepted = 0;
        let mut next = None;
        for (i, &tok) in draft.iter().enumerate() {
            let logits = if i == 0 { last_logits } else { &all[i - 1] };
            let choice = sample::argmax(logits);
            if choice != tok {
                next = Some(choice);
                break;
            }
            accepted += 1;
        }
        let next_token = next.unwrap_or_else(|| sample::argmax(&all[draft.len() - 1]));
        cache.truncate(start + accepted);
        Ok(Verdict {
            accepted,
            next_token,
        })
    }
}
