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
    use crate::policy::test_support::ctx;
    use crate::policy::{Policy, decide};

    #[test]
    fn the_first_token_escalates_an_unsure_edge_and_keeps_a_sure_one() {
        let mut with_sha = ctx();
        let model = quality::bundled_for(None).expect("bundled");
        with_sha.edge_model_sha256 = Some(model.edge_model_sha256.clone());
        let prompt = "Is the sentiment of this review negative, neutral or positive?\nReview: \
                      The pizza was wonderful!\nSentiment:";
        let d = decide(prompt, None, &with_sha, &Policy::default());
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
        let kept = at_first_token(&d, sure, None);
        let sent = at_first_token(&d, unsure, None);
        assert!(kept.escalate.is_none(), "{kept:?}");
        let why = sent.escalate.expect("escalates");
        assert!(why.starts_with("after prefill:"), "{why}");
        assert!(sent.estimate.expect("e").p_edge_ok < kept.estimate.expect("e").p_edge_ok);
        // A rule's edge decision (privacy) is never escalated.
        let private = decide(
            "my card 4111 1111 1111 1111",
            None,
            &with_sha,
            &Policy::default(),
        );
        assert_eq!(at_first_token(&private, unsure, None).escalate, None);
        // Another edge model: its signals mean nothing to this quality model.
        let other = decide(prompt, None, &ctx(), &Policy::default());
        assert!(!other.quality.as_ref().expect("scored").edge_signals);
        assert_eq!(at_first_token(&other, unsure, None).escalate, None);
    }
}
