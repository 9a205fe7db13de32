//! The check at the edge's first token: escalate an unsure edge answer before any text is
//! shown.

use super::context::Target;
use super::trace::{Decision, FirstTokenCheck};
use crate::quality::{self, EdgeSignals, QualityError, QualityModel};

/// The check at the edge's first token, with the bundled quality model the decision used.
pub fn at_first_token(
    decision: &Decision,
    first: EdgeSignals,
    state: Option<&[f32]>,
) -> FirstTokenCheck {
    let version = decision.quality.as_ref().map(|q| q.model_version.as_str());
    let model = quality::bundled_all().and_then(|all| {
        all.iter()
            .find(|m| Some(m.version.as_str()) == version)
            .ok_or(QualityError::Disabled(
                "the decision was scored by no bundled model",
            ))
    });
    at_first_token_with(decision, first, state, model)
}

/// The quality estimate again, now with the edge model's first-token signals: an edge
/// decision whose estimate falls below the policy's bar escalates before any edge text is
/// shown. Decisions made by a rule, or by another quality model, are left alone.
pub fn at_first_token_with(
    decision: &Decision,
    first: EdgeSignals,
    state: Option<&[f32]>,
    quality: Result<&QualityModel, QualityError>,
) -> FirstTokenCheck {
    let unchanged = FirstTokenCheck {
        estimate: None,
        escalate: None,
    };
    let (Some(q), Ok(model)) = (&decision.quality, quality) else {
        return unchanged;
    };
    let Ok(text) = <[f32; quality::TEXT_DIM]>::try_from(q.text_features.as_slice()) else {
        return unchanged;
    };
    if model.version != q.model_version {
        return unchanged;
    }
    let edge = q.edge_signals.then_some(first);
    let estimate = model.estimate(&text, edge, state.filter(|_| q.edge_signals));
    let may_escalate = decision.target == Target::Edge && decision.cascade.is_some();
    let read = match estimate.inputs {
        quality::Inputs::State => "the edge model's state and first token",
        quality::Inputs::FirstToken => "the first token",
        quality::Inputs::Text => "the text alone",
    };
    let escalate = (may_escalate && estimate.p_edge_ok < q.bar).then(|| {
        format!(
            "after prefill: P(edge answer acceptable) {:.2} < {:.2} from {read} (entropy {:.2} \
             nats, log-prob {:.2})",
            estimate.p_edge_ok, q.bar, first.entropy, first.logprob
        )
    });
    FirstTokenCheck {
        estimate: Some(estimate),
        escalate,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::test_support::{ctx, first_token_model};
    use crate::policy::{Context, Policy, decide_with};

    #[test]
    fn the_first_token_escalates_an_unsure_edge_and_keeps_a_sure_one() {
        let sha = "ab".repeat(32);
        let model = first_token_model(&sha);
        let with_sha = Context {
            edge_model_sha256: Some(sha.clone()),
            ..ctx()
        };
        let decide = |prompt: &str, ctx: &Context| {
            decide_with(&[prompt], None, ctx, &Policy::default(), Ok(&model))
        };
        let check = |d: &Decision, first| at_first_token_with(d, first, None, Ok(&model));
        let prompt = "Is the sentiment of this review negative, neutral or positive?\nReview: \
                      The pizza was wonderful!\nSentiment:";
        let d = decide(prompt, &with_sha);
        assert_eq!(d.target, Target::Edge, "{:?}", d.reasons);
        let sure = EdgeSignals {
            entropy: 0.2,
            logprob: -0.05,
            margin: 5.0,
        };
        let unsure = EdgeSignals {
            entropy: 6.0,
            logprob: -5.0,
            margin: 0.01,
        };
        let kept = check(&d, sure);
        let sent = check(&d, unsure);
        assert!(kept.escalate.is_none(), "{kept:?}");
        let why = sent.escalate.expect("escalates");
        assert!(why.starts_with("after prefill:"), "{why}");
        assert!(sent.estimate.expect("e").p_edge_ok < kept.estimate.expect("e").p_edge_ok);
        // A rule's edge decision (privacy) is never escalated.
        let private = decide("my card 4111 1111 1111 1111", &with_sha);
        assert_eq!(check(&private, unsure).escalate, None);
        // Another edge model: its signals mean nothing to this quality model.
        let other = decide(prompt, &ctx());
        assert!(!other.quality.as_ref().expect("scored").edge_signals);
        assert_eq!(check(&other, unsure).escalate, None);
    }

    #[test]
    fn the_shipped_model_for_the_default_edge_reads_its_state() {
        let model = quality::bundled_for(None).expect("bundled");
        let with_sha = Context {
            edge_model_sha256: Some(model.edge_model_sha256.clone()),
            ..ctx()
        };
        let d = crate::policy::decide(
            "What is the capital of France?",
            None,
            &with_sha,
            &Policy::default(),
        );
        let width = model.with_state.as_ref().expect("a state probe").width;
        let state = vec![0.0; width];
        let sure = EdgeSignals {
            entropy: 0.2,
            logprob: -0.05,
            margin: 5.0,
        };
        let e = at_first_token(&d, sure, Some(&state))
            .estimate
            .expect("estimated");
        assert_eq!(e.inputs, quality::Inputs::State);
        // A state of another width is not read.
        let e = at_first_token(&d, sure, Some(&state[1..]))
            .estimate
            .expect("estimated");
        assert_eq!(e.inputs, quality::Inputs::FirstToken);
    }
}
