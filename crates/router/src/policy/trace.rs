//! What a decision says: the target, its estimates, and the trace of every signal.

use serde::{Deserialize, Serialize};

use super::context::{Context, Target};
use super::estimate::Estimates;
use super::measure::Measured;
use crate::cascade::CascadeRule;
use crate::pii::EntityKind;
use crate::quality::{Estimate, QualityError, QualityModel};

/// One line of the trace: a signal and its value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SignalValue {
    pub name: String,
    pub value: serde_json::Value,
}

/// Why a decision came out as it did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecisionTrace {
    pub signals: Vec<SignalValue>,
    /// The rule that decided, or `None` when the score did.
    pub rule: Option<String>,
    /// Score of each target (lower is better), when scoring ran.
    pub scores: Vec<(Target, f64)>,
    pub policy_version: String,
}

/// A routing decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    pub target: Target,
    pub reasons: Vec<String>,
    /// Personal data found (classes only, never values).
    pub pii: Vec<EntityKind>,
    pub estimated_latency_ms: f64,
    pub estimated_cost_usd: f64,
    /// For an edge answer the cloud may take over: when to escalate mid-stream. `None` when
    /// the answer must stay on the device (privacy, offline) or runs in the cloud.
    #[serde(default)]
    pub cascade: Option<CascadeRule>,
    /// What the check at the first token needs, when a quality model scored this decision.
    #[serde(default)]
    pub quality: Option<QualityCheck>,
    pub trace: DecisionTrace,
}

/// The scored decision's quality terms, kept so that the edge's first token can revisit it
/// with the same rule ([`at_first_token`](super::at_first_token)).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QualityCheck {
    pub model_version: String,
    /// The turn's text features ([`quality::text_features`](crate::quality::text_features)).
    pub text_features: Vec<f32>,
    /// Whether the quality model was trained for this edge model, so its first-token
    /// signals can be used.
    pub edge_signals: bool,
    /// The estimate before generation.
    pub estimate: Estimate,
    /// The bar for the estimate at the first token: the policy's, moved by how much slower
    /// the cloud is and what the edge would cost the battery.
    pub bar: f64,
}

/// What the edge's first token says about an edge decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FirstTokenCheck {
    /// The estimate with the edge signals, when a quality model scored the decision.
    pub estimate: Option<Estimate>,
    /// Why to escalate before any edge text is shown, or `None` to go on.
    pub escalate: Option<String>,
}

/// Every signal and estimate, named, for the trace.
pub(super) fn trace_signals(
    m: &Measured,
    e: &Estimates,
    ctx: &Context,
    quality: &Result<&QualityModel, QualityError>,
) -> Vec<SignalValue> {
    let task = &m.read.task;
    let mut signals = vec![
        sig("pii", serde_json::to_value(&m.pii).unwrap_or_default()),
        sig(
            "pii_tagger",
            m.tagger
                .clone()
                .unwrap_or_else(|e| format!("unavailable: {e}"))
                .into(),
        ),
        sig("language", m.lang.into()),
        sig("task", task.task.as_str().into()),
        sig("task_confidence", f64::from(task.confidence).into()),
        sig("edge_quality_prior", e.edge_prior.into()),
        sig(
            "quality_model",
            match quality {
                Ok(q) => q.version.clone(),
                Err(err) => format!("unavailable ({err}); the task priors stand in"),
            }
            .into(),
        ),
        sig("edge_quality", e.edge_quality.into()),
        sig(
            "quality_drivers",
            serde_json::to_value(e.estimate.as_ref().map(|e| &e.drivers)).unwrap_or_default(),
        ),
        sig("cloud_quality_prior", e.cloud_quality.into()),
        sig("expected_output_tokens", m.output_tokens().into()),
        sig("expected_output_basis", m.read.output.basis.into()),
        sig("prompt_tokens_estimate", m.prompt_tokens.into()),
        sig("online", ctx.online.into()),
        sig("edge_available", ctx.edge_available.into()),
        sig("edge_tokens_per_s", f64::from(ctx.edge_tokens_per_s).into()),
        sig("rtt_ms", f64::from(ctx.rtt_ms).into()),
        sig("cloud_verifies", ctx.cloud_verifies.into()),
        sig("edge_energy_j", e.edge_joules.into()),
        sig("cloud_energy_j", e.cloud_joules.into()),
        sig("energy_drain", e.drain.into()),
        sig("quality_bar", e.bar.at_first_token().into()),
        sig("save_data", ctx.save_data.into()),
    ];
    signals.extend(optional_signals(e, ctx));
    signals
}

/// The signals a page may or may not have measured, and the estimates that exist only in
/// some conditions: each named when it has a value.
fn optional_signals(e: &Estimates, ctx: &Context) -> Vec<SignalValue> {
    let numbers = [
        ("bandwidth_kbps", ctx.bandwidth_kbps.map(f64::from)),
        (
            "edge_prefill_tokens_per_s",
            ctx.edge_prefill_tokens_per_s.map(f64::from),
        ),
        (
            "edge_context_tokens",
            ctx.edge_context_tokens.map(f64::from),
        ),
        ("budget_remaining_usd", ctx.budget_remaining_usd),
        ("battery_level", ctx.battery.map(|b| f64::from(b.level))),
        (
            "structured_schema_bytes",
            ctx.structured.map(|s| f64::from(s.schema_bytes)),
        ),
        ("edge_busy_s", Some(e.edge_wait).filter(|w| *w > 0.0)),
        ("cloud_queued", ctx.cloud_load.map(|l| f64::from(l.queued))),
        ("cloud_queue_s", Some(e.cloud_queue).filter(|w| *w > 0.0)),
        ("cloud_ttft_ms", ctx.cloud_ttft_ms.map(f64::from)),
        (
            "quality_bar_latency_shift",
            Some(e.bar.latency_shift).filter(|s| *s != 0.0),
        ),
        (
            "quality_bar_energy_shift",
            Some(e.bar.energy_shift).filter(|s| *s != 0.0),
        ),
        // The cost model's own estimates, so a learner can correct them from feedback.
        (
            "edge_latency_s",
            Some(e.edge_latency).filter(|s| s.is_finite()),
        ),
        ("cloud_latency_s", Some(e.cloud_latency)),
        ("cloud_cost_usd", Some(e.cloud_cost)),
    ];
    let mut signals: Vec<SignalValue> = numbers
        .into_iter()
        .filter_map(|(name, value)| Some(sig(name, value?.into())))
        .collect();
    if let Some(b) = ctx.battery {
        signals.push(sig("battery_charging", b.charging.into()));
    }
    if let Some(backend) = ctx.edge_backend {
        signals.push(sig(
            "edge_backend",
            serde_json::to_value(backend).unwrap_or_default(),
        ));
    }
    signals
}

fn sig(name: &str, value: serde_json::Value) -> SignalValue {
    SignalValue {
        name: name.into(),
        value,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::energy::{Battery, EdgeBackend};
    use crate::policy::test_support::ctx;
    use crate::policy::{Policy, decide};
    use crate::signals;
    use straddle_protocol::LoadReport;

    #[test]
    fn the_readme_names_every_traced_signal() {
        let readme = include_str!("../../../../README.md");
        let table = readme
            .split("<!-- signals:")
            .nth(1)
            .and_then(|t| t.split("<!-- /signals -->").next())
            .expect("README.md has the signals table");
        let documented: std::collections::BTreeSet<&str> = table
            .lines()
            .filter_map(|row| row.strip_prefix("| "))
            .filter_map(|row| row.split(" | ").next())
            .flat_map(|names| names.split(", "))
            .filter_map(|n| n.strip_prefix('`')?.strip_suffix('`'))
            .collect();
        // Every optional signal present: a page with everything measured, on battery, with
        // a structured answer, a busy device, a loaded cloud and a slow network.
        let everything = Context {
            rtt_ms: 3000.0,
            bandwidth_kbps: Some(100.0),
            edge_prefill_tokens_per_s: Some(400.0),
            edge_context_tokens: Some(2048),
            budget_remaining_usd: Some(1.0),
            battery: Some(Battery {
                level: 0.9,
                charging: false,
            }),
            edge_backend: Some(EdgeBackend::Cpu),
            structured: Some(signals::StructuredOutput {
                schema_bytes: 200,
                tool_call: false,
            }),
            cloud_load: Some(LoadReport {
                queued: 3,
                active: 8,
                slots: 8,
                tokens_per_s: Some(30.0),
            }),
            cloud_ttft_ms: Some(900.0),
            edge_busy_s: Some(0.5),
            ..ctx()
        };
        let d = decide(
            "What is the capital of France?",
            Some(16),
            &everything,
            &Policy::default(),
        );
        let traced: std::collections::BTreeSet<&str> =
            d.trace.signals.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(traced, documented);
    }
}
