//! What the policy's tests share: a connected page and helpers to read decisions.

use super::config::{Policy, Weights};
use super::context::Context;
use super::decide_with;
use super::trace::Decision;
use crate::quality::{
    DEFAULT_PRE_GENERATION_SHARE, DIM, FEATURE_NAMES, FORMAT, Logistic, QualityError, QualityModel,
    TEXT_DIM,
};

pub(super) fn ctx() -> Context {
    Context {
        online: true,
        edge_available: true,
        edge_tokens_per_s: 40.0,
        rtt_ms: 60.0,
        edge_languages: vec!["en".into()],
        ..Context::default()
    }
}

/// A price-weighted tenant with an expensive cloud model, for whom speculation pays.
pub(super) fn thrifty() -> Policy {
    Policy {
        weights: Weights {
            latency: 0.01,
            cost: 8.0,
            quality: 4.0,
            energy: 0.0,
        },
        cloud_price_out_per_1k: 0.015,
        ..Policy::default()
    }
}

/// The composite score over the task priors (no quality model), whose latency and cost
/// terms these tests check.
pub(super) fn priors(
    prompt: &str,
    max_tokens: Option<u32>,
    ctx: &Context,
    policy: &Policy,
) -> Decision {
    let none = Err(QualityError::Disabled("the priors' cost model under test"));
    decide_with(&[prompt], max_tokens, ctx, policy, none)
}

/// The value of the trace's signal `name`, which must be there.
pub(super) fn signal<'a>(d: &'a Decision, name: &str) -> &'a serde_json::Value {
    &d.trace
        .signals
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no signal {name}"))
        .value
}

/// A quality model written by hand for the edge model `sha`: P = 0.5 from the text alone,
/// and after prefill high for a probable first token and low for an improbable one. The
/// checks of the mechanism use it, so they do not depend on what a trained model learned.
pub(super) fn first_token_model(sha: &str) -> QualityModel {
    let mut with_edge = vec![0.0; DIM];
    // The first token's log-probability (standardised as itself: mean 0, scale 1).
    with_edge[TEXT_DIM + 1] = 2.0;
    QualityModel {
        format: FORMAT.into(),
        version: "quality-hand-written-for-tests".into(),
        edge_model_sha256: sha.into(),
        provenance: "written by hand for the policy's tests".into(),
        features: FEATURE_NAMES.iter().map(|f| f.to_string()).collect(),
        mean: vec![0.0; DIM],
        scale: vec![1.0; DIM],
        text_only: Logistic {
            bias: 0.0,
            weights: vec![0.0; TEXT_DIM],
        },
        with_edge: Logistic {
            bias: 2.0,
            weights: with_edge,
        },
        with_state: None,
        pre_generation_share: DEFAULT_PRE_GENERATION_SHARE,
    }
}
