//! The routing decision: ordered rules first (privacy is a hard constraint), then a cost
//! score over latency, money and quality. Every decision carries a trace that names each
//! signal's value and what decided.

mod config;
mod context;
mod estimate;
mod first_token;
mod measure;
mod rules;
mod score;
#[cfg(test)]
mod test_support;
mod trace;

pub use config::{Policy, PolicyError, QualityPrior, Weights, default_task_quality};
pub use context::{Context, Target};
pub use first_token::{at_first_token, at_first_token_with};
pub use trace::{Decision, DecisionTrace, FirstTokenCheck, QualityCheck, SignalValue};

use crate::quality::{self, QualityError, QualityModel};
use estimate::Estimates;
use measure::Measured;
use rules::{Facts, RULES};
use trace::trace_signals;

/// Decides where `prompt` runs (a conversation of one turn).
pub fn decide(prompt: &str, max_tokens: Option<u32>, ctx: &Context, policy: &Policy) -> Decision {
    decide_conversation(&[prompt], max_tokens, ctx, policy)
}

/// Decides where the last of `turns` is answered, with the bundled quality model.
pub fn decide_conversation(
    turns: &[&str],
    max_tokens: Option<u32>,
    ctx: &Context,
    policy: &Policy,
) -> Decision {
    let quality = quality::bundled_for(ctx.edge_model_sha256.as_deref());
    decide_with(turns, max_tokens, ctx, policy, quality)
}

/// [`decide_conversation`] with the given quality model, or the reason there is none (the
/// task priors then stand in). Privacy and size read the whole conversation, which is what
/// would be uploaded; language, task and expected length read the turn being answered.
///
/// Three stages: [`Measured`] reads the request, [`Estimates`] prices each target, then the
/// [`RULES`] run in order and the first that applies decides; when none does, the score (or
/// the quality model's estimate against the policy's bar) does.
pub fn decide_with(
    turns: &[&str],
    max_tokens: Option<u32>,
    ctx: &Context,
    policy: &Policy,
    quality: Result<&QualityModel, QualityError>,
) -> Decision {
    let m = Measured::read(turns, max_tokens, ctx, policy);
    let e = Estimates::of(&m, ctx, policy, &quality);
    let facts = Facts {
        signals: trace_signals(&m, &e, ctx, &quality),
        m,
        e,
        ctx,
        policy,
    };
    match RULES
        .iter()
        .find_map(|(name, rule)| Some((*name, rule(&facts)?)))
    {
        Some((name, (target, reasons))) => facts.decision(target, Some(name), reasons, vec![]),
        None => facts.scored(&quality),
    }
}
