//! The policy document: weights, scenario presets, quality priors and validation.

use serde::{Deserialize, Serialize};

use std::collections::BTreeMap;

use crate::cascade::CascadeRule;
use crate::energy::EnergyModel;
use crate::pii::Sensitivity;
use crate::price::Price;
use crate::task::TaskType;

/// Scenario weights of the composite score (larger means that term matters more).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Weights {
    /// Per second of expected latency.
    pub latency: f64,
    /// Per cent (USD) of expected spend.
    pub cost: f64,
    /// Per unit of expected quality (0–1).
    pub quality: f64,
    /// Per joule the device spends, times how dear a joule is at the battery's charge
    /// ([`energy::drain`](crate::energy::drain): 0 on mains power).
    #[serde(default)]
    pub energy: f64,
}

impl Weights {
    /// A named scenario preset.
    pub fn preset(name: &str) -> Option<Self> {
        Some(match name {
            "balanced" => Weights {
                latency: 1.0,
                cost: 1.0,
                quality: 4.0,
                energy: 0.01,
            },
            "low-latency" => Weights {
                latency: 4.0,
                cost: 0.5,
                quality: 2.0,
                energy: 0.0,
            },
            "high-accuracy" => Weights {
                latency: 0.25,
                cost: 0.25,
                quality: 12.0,
                energy: 0.0,
            },
            "low-cost" => Weights {
                latency: 0.5,
                cost: 8.0,
                quality: 2.0,
                energy: 0.01,
            },
            "battery-saver" => Weights {
                latency: 1.0,
                cost: 1.0,
                quality: 4.0,
                energy: 0.1,
            },
            _ => return None,
        })
    }

    /// The composite score of a target (lower wins), in one formula:
    /// `latency · seconds + cost · cents − quality · quality + energy · joules · drain`.
    pub fn score(&self, seconds: f64, usd: f64, quality: f64, joules: f64, drain: f64) -> f64 {
        self.latency * seconds + self.cost * usd * 100.0 - self.quality * quality
            + self.energy * joules * drain
    }
}

/// A tenant's routing policy. Data, versioned: the version travels with every decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    pub version: String,
    /// Personal data at or above this sensitivity never leaves the device.
    pub keep_on_device_at: Sensitivity,
    /// Expected outputs longer than this go to the cloud (the edge model rambles).
    pub long_output_tokens: u32,
    pub weights: Weights,
    /// Cloud price per 1,000 prompt / completion tokens, USD.
    pub cloud_price_in_per_1k: f64,
    pub cloud_price_out_per_1k: f64,
    pub cloud_tokens_per_s: f32,
    /// Prior answer quality of each target (0–1), before task-specific evidence.
    pub edge_quality: f64,
    pub cloud_quality: f64,
    /// Quality priors per task type; the classifier's confidence blends them with the
    /// general priors above. Missing tasks use the general priors.
    #[serde(default = "default_task_quality")]
    pub task_quality: BTreeMap<TaskType, QualityPrior>,
    /// When an edge answer hands over to the cloud mid-stream.
    #[serde(default)]
    pub cascade: CascadeRule,
    /// Output tokens one verify call yields when speculating (accepted draft plus the
    /// verifier's own); `cargo xtask bench speculative` measures it.
    #[serde(default = "default_tokens_per_verify")]
    pub speculative_tokens_per_call: f32,
    /// Per-token draft acceptance below which a speculative reply, after a few verify calls,
    /// hands the rest of the answer to plain cloud streaming (0 never does).
    #[serde(default = "default_min_acceptance")]
    pub speculative_min_acceptance: f32,
    /// Never use the cloud, online or not (the `offline` scenario).
    #[serde(default)]
    pub edge_only: bool,
    /// With a quality model: the least P(edge answer acceptable) at the edge's first token
    /// for the edge to answer (half of it before generation).
    #[serde(default = "default_min_edge_quality")]
    pub min_edge_quality: f64,
    /// Joules per token and what counts as a low battery.
    #[serde(default)]
    pub energy: EnergyModel,
}

fn default_min_edge_quality() -> f64 {
    0.5
}

fn default_tokens_per_verify() -> f32 {
    3.0
}

/// Below about a third of draft tokens accepted, a verify call yields little more than one
/// streamed token while costing a round trip and a cloud pass (BENCHMARKS.md, speculative).
fn default_min_acceptance() -> f32 {
    0.3
}

/// Expected answer quality (0–1) of each target for one kind of task.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QualityPrior {
    pub edge: f64,
    pub cloud: f64,
}

/// Priors for a ~100M-parameter edge model against a frontier-class cloud model: the small
/// model holds up on short, shallow tasks and falls away on code, maths and reasoning.
/// Stated beliefs, not measurements; the bandit's feedback is what corrects them.
pub fn default_task_quality() -> BTreeMap<TaskType, QualityPrior> {
    use TaskType::*;
    [
        (ChitChat, 0.70, 0.90),
        (Intent, 0.65, 0.90),
        (Classification, 0.60, 0.92),
        (Extraction, 0.55, 0.92),
        (ShortQa, 0.45, 0.92),
        (Summarization, 0.40, 0.90),
        (LongForm, 0.30, 0.90),
        (Translation, 0.20, 0.90),
        (Code, 0.15, 0.88),
        (Math, 0.10, 0.85),
        (Reasoning, 0.10, 0.85),
    ]
    .into_iter()
    .map(|(t, edge, cloud)| (t, QualityPrior { edge, cloud }))
    .collect()
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            version: "balanced-1".into(),
            keep_on_device_at: Sensitivity::High,
            long_output_tokens: 512,
            weights: Weights {
                latency: 1.0,
                cost: 1.0,
                quality: 4.0,
                energy: 0.01,
            },
            energy: EnergyModel::default(),
            cloud_price_in_per_1k: 0.00015,
            cloud_price_out_per_1k: 0.0006,
            cloud_tokens_per_s: 60.0,
            edge_quality: 0.55,
            cloud_quality: 0.85,
            task_quality: default_task_quality(),
            cascade: CascadeRule::default(),
            speculative_tokens_per_call: default_tokens_per_verify(),
            speculative_min_acceptance: default_min_acceptance(),
            edge_only: false,
            min_edge_quality: default_min_edge_quality(),
        }
    }
}

/// A policy document that could not be used.
#[derive(Debug, thiserror::Error)]
#[error("invalid policy: {0}")]
pub struct PolicyError(String);

impl Policy {
    /// The cloud's price of `tokens_in` input and `tokens_out` output tokens, in USD.
    pub fn cloud_price(&self, tokens_in: f64, tokens_out: f64) -> f64 {
        let price = Price {
            in_per_1k: self.cloud_price_in_per_1k,
            out_per_1k: self.cloud_price_out_per_1k,
        };
        price.cost(tokens_in, tokens_out)
    }

    /// The scenario presets: `balanced`, `low-latency`, `high-accuracy` and `low-cost` (weight
    /// vectors), `offline` (the device only), `privacy-strict` (anything personal of medium
    /// sensitivity or more — names, e-mails, phones, addresses — stays on the device) and
    /// `battery-saver` (energy weighs ten times as much; below half charge, discharging,
    /// long answers go to the cloud).
    pub const PRESETS: &[&str] = &[
        "balanced",
        "low-latency",
        "high-accuracy",
        "low-cost",
        "offline",
        "privacy-strict",
        "battery-saver",
    ];

    /// The whole policy for a scenario preset, or `None` for an unknown name.
    pub fn preset(name: &str) -> Option<Self> {
        let base = Policy {
            version: format!("{name}-1"),
            ..Policy::default()
        };
        Some(match name {
            "offline" => Policy {
                edge_only: true,
                ..base
            },
            "privacy-strict" => Policy {
                keep_on_device_at: Sensitivity::Medium,
                ..base
            },
            // Energy weighs ten times as much, and the battery counts as low at half charge.
            "battery-saver" => Policy {
                weights: Weights::preset(name)?,
                energy: EnergyModel {
                    low_battery: 0.5,
                    ..EnergyModel::default()
                },
                ..base
            },
            _ => Policy {
                weights: Weights::preset(name)?,
                // How much answer quality the scenario trades for keeping work on the device.
                min_edge_quality: match name {
                    "high-accuracy" => 0.75,
                    "low-latency" => 0.4,
                    "low-cost" => 0.3,
                    _ => default_min_edge_quality(),
                },
                ..base
            },
        })
    }

    /// Parses a policy from JSON, naming the field at fault.
    pub fn from_json(json: &str) -> Result<Self, PolicyError> {
        let p: Policy = serde_json::from_str(json).map_err(|e| PolicyError(e.to_string()))?;
        let w = p.weights;
        if [w.latency, w.cost, w.quality, w.energy]
            .iter()
            .any(|v| !v.is_finite() || *v < 0.0)
        {
            return Err(PolicyError(
                "weights must be finite and non-negative".into(),
            ));
        }
        let priors = p
            .task_quality
            .values()
            .flat_map(|q| [q.edge, q.cloud])
            .chain([p.edge_quality, p.cloud_quality]);
        if priors.clone().any(|q| !(0.0..=1.0).contains(&q)) {
            return Err(PolicyError("quality priors must lie in 0..=1".into()));
        }
        p.energy.validate().map_err(PolicyError)?;
        if !(0.0..=1.0).contains(&p.min_edge_quality) {
            return Err(PolicyError("min_edge_quality must lie in 0..=1".into()));
        }
        if !(0.0..=1.0).contains(&p.speculative_min_acceptance) {
            return Err(PolicyError(
                "speculative_min_acceptance must lie in 0..=1".into(),
            ));
        }
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::test_support::{ctx, priors};
    use crate::policy::{Context, Target, decide};

    #[test]
    fn scenario_presets_are_whole_policies() {
        for name in Policy::PRESETS {
            let p = Policy::preset(name).expect("a preset");
            assert_eq!(p.version, format!("{name}-1"));
            let json = serde_json::to_string(&p).expect("ser");
            assert_eq!(Policy::from_json(&json).expect("valid"), p);
        }
        assert!(Policy::preset("cheapest").is_none());
        let chat = "Hello! How are you today?";
        let offline = decide(
            chat,
            None,
            &ctx(),
            &Policy::preset("offline").expect("preset"),
        );
        assert_eq!(offline.target, Target::Edge);
        assert_eq!(offline.trace.rule.as_deref(), Some("offline"));
        assert!(
            offline.cascade.is_none(),
            "no escalation to a cloud it may not use"
        );
        // An e-mail address is medium: uploaded under balanced, kept under privacy-strict.
        let mail = "Draft a polite reply to jane.doe@example.com declining the meeting.";
        let strict = Policy::preset("privacy-strict").expect("preset");
        assert_eq!(
            decide(mail, None, &ctx(), &strict).trace.rule.as_deref(),
            Some("privacy")
        );
        assert_ne!(
            decide(mail, None, &ctx(), &Policy::default())
                .trace
                .rule
                .as_deref(),
            Some("privacy")
        );
    }

    #[test]
    fn presets_move_the_score() {
        let prompt = "What is the capital of France?";
        let fast = Policy {
            weights: Weights::preset("low-latency").expect("preset"),
            ..Policy::default()
        };
        let accurate = Policy {
            weights: Weights::preset("high-accuracy").expect("preset"),
            ..Policy::default()
        };
        let slow_net = Context {
            rtt_ms: 2000.0,
            ..ctx()
        };
        assert_eq!(
            priors(prompt, Some(20), &slow_net, &fast).target,
            Target::Edge
        );
        assert_eq!(
            priors(prompt, Some(20), &ctx(), &accurate).target,
            Target::Cloud
        );
        let d = priors(prompt, Some(20), &ctx(), &accurate);
        assert_eq!(d.trace.scores.len(), 2);
        assert!(
            d.trace
                .signals
                .iter()
                .any(|s| s.name == "language" && s.value == "en")
        );
    }

    #[test]
    fn malformed_policy_json_names_the_problem() {
        assert!(Policy::from_json("{").is_err());
        let err = Policy::from_json(r#"{"version":"x","keep_on_device_at":"high","long_output_tokens":1,"weights":{"latency":-1,"cost":0,"quality":0},"cloud_price_in_per_1k":0,"cloud_price_out_per_1k":0,"cloud_tokens_per_s":1,"edge_quality":0,"cloud_quality":0}"#).unwrap_err();
        assert!(err.to_string().contains("non-negative"));
        let mut bad_prior = serde_json::to_value(Policy::default()).expect("ser");
        bad_prior["task_quality"]["code"]["edge"] = 1.5.into();
        let err = Policy::from_json(&bad_prior.to_string()).unwrap_err();
        assert!(err.to_string().contains("0..=1"), "{err}");
        let mut bad_threshold = serde_json::to_value(Policy::default()).expect("ser");
        bad_threshold["speculative_min_acceptance"] = 2.0.into();
        let err = Policy::from_json(&bad_threshold.to_string()).unwrap_err();
        assert!(
            err.to_string().contains("speculative_min_acceptance"),
            "{err}"
        );
        let round = serde_json::to_string(&Policy::default()).expect("ser");
        assert_eq!(Policy::from_json(&round).expect("parse"), Policy::default());
    }
}
