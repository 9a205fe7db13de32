//! The routing decision: ordered rules first (privacy is a hard constraint), then a cost
//! score over latency, money and quality. Every decision carries a trace that names each
//! signal's value and what decided.

use serde::{Deserialize, Serialize};

use std::collections::BTreeMap;

use crate::cascade::CascadeRule;
use crate::energy::{self, Battery, EdgeBackend, EnergyModel};
use crate::pii::{self, EntityKind, Sensitivity};
use crate::price::Price;
use crate::quality::{self, EdgeSignals, Estimate, QualityError, QualityModel};
use crate::signals;
use crate::task::TaskType;
use straddle_protocol::LoadReport;

/// Where to answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Target {
    Edge,
    Cloud,
    /// The edge drafts, the cloud verifies each draft in one pass: the cloud's answer, token
    /// for token, for a fraction of its forward passes and output-token price.
    Speculative,
}

impl Target {
    /// The wire name (`edge`, `cloud`, `speculative`).
    pub fn as_str(self) -> &'static str {
        match self {
            Target::Edge => "edge",
            Target::Cloud => "cloud",
            Target::Speculative => "speculative",
        }
    }
}

/// What the caller knows about the device and the network (measured by the web crate).
/// `Default` is offline with no edge model: name what is known and default the rest.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Context {
    pub online: bool,
    /// Whether the edge model is loaded and can run.
    pub edge_available: bool,
    /// Measured edge decode speed.
    pub edge_tokens_per_s: f32,
    /// Measured round trip to the worker.
    pub rtt_ms: f32,
    /// Languages the edge model handles (GGUF `general.languages`).
    pub edge_languages: Vec<String>,
    /// The cloud can verify edge drafts: the worker's upstream serves `/v1/verify` and the
    /// tokenizer hash its `/v1/models` reports equals the edge model's.
    #[serde(default)]
    pub cloud_verifies: bool,
    /// Measured bandwidth to the worker, kilobits per second: uploading the prompt adds to
    /// the cloud's latency. Unknown: not counted.
    #[serde(default)]
    pub bandwidth_kbps: Option<f32>,
    /// Measured edge prefill speed, prompt tokens per second: the edge reads the prompt
    /// before its first token. Unknown: not counted.
    #[serde(default)]
    pub edge_prefill_tokens_per_s: Option<f32>,
    /// The longest conversation the edge can hold, in tokens (its KV cache, sized from the
    /// device's memory); a longer one cannot run there.
    #[serde(default)]
    pub edge_context_tokens: Option<u32>,
    /// What the tenant has left to spend, USD (the worker's usage report): a request
    /// expected to cost more stays on the edge.
    #[serde(default)]
    pub budget_remaining_usd: Option<f64>,
    /// SHA-256 of the loaded edge model's GGUF (hex): the quality model uses the edge's
    /// first-token signals only for the model it was trained for.
    #[serde(default)]
    pub edge_model_sha256: Option<String>,
    /// The device's battery (the Battery Status API), where the browser reports one.
    #[serde(default)]
    pub battery: Option<Battery>,
    /// Where the edge model runs, for its energy per token.
    #[serde(default)]
    pub edge_backend: Option<EdgeBackend>,
    /// The request holds its answer to a schema or a tool call (`response_format`, `tools`):
    /// the answer's expected length then follows the schema.
    #[serde(default)]
    pub structured: Option<signals::StructuredOutput>,
    /// The cloud server's load as the worker relays it (`GET /v1/load`): its queue adds to
    /// the cloud's latency, its measured rate replaces the policy's. Unknown: no queue.
    #[serde(default)]
    pub cloud_load: Option<LoadReport>,
    /// The cloud's measured time to first token (the page's running average), for an
    /// upstream that reports no load: what it takes beyond the round trip counts as queue.
    #[serde(default)]
    pub cloud_ttft_ms: Option<f32>,
    /// Seconds until the on-device engine is free for this request: the answers ahead of
    /// it on this page.
    #[serde(default)]
    pub edge_busy_s: Option<f32>,
    /// The browser asks pages to save data (the Network Information API's `saveData`):
    /// speculation, which sends the drafts up again with every verify call, is not chosen.
    #[serde(default)]
    pub save_data: bool,
}

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
    /// ([`energy::drain`]: 0 on mains power).
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
/// with the same rule ([`at_first_token`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QualityCheck {
    pub model_version: String,
    /// The turn's text features ([`quality::text_features`]).
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
    decide_with(turns, max_tokens, ctx, policy, quality::bundled())
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

/// What the request says: personal data, language, task, expected size.
struct Measured {
    /// The whole conversation, as it would be uploaded.
    conversation: String,
    pii: Vec<EntityKind>,
    /// The kinds of personal data at or above the policy's keep-on-device level.
    private: Vec<EntityKind>,
    tagger: Result<String, String>,
    lang: &'static str,
    lang_ok: bool,
    read: quality::Turn,
    prompt_tokens: u32,
    fits_edge: bool,
}

impl Measured {
    fn read(turns: &[&str], max_tokens: Option<u32>, ctx: &Context, policy: &Policy) -> Self {
        let turn = turns.last().copied().unwrap_or_default();
        let conversation = turns.join("\n");
        let mut pii: Vec<EntityKind> = pii::detect_personal(&conversation)
            .iter()
            .map(|s| s.kind)
            .collect();
        pii.sort();
        pii.dedup();
        let private = pii
            .iter()
            .copied()
            .filter(|k| k.sensitivity() >= policy.keep_on_device_at)
            .collect();
        let lang = crate::language::detect(turn);
        let mut read = quality::read_turn(turn, max_tokens);
        if let Some(shape) = ctx.structured {
            // A short schema bounds the answer, whatever the prompt's cue words say; the
            // quality model reads the bounded length too.
            let bounded = shape.expected_output(max_tokens);
            if bounded.tokens < read.output.tokens {
                read.output = bounded;
                read.features = quality::text_features(turn, read.task, bounded.tokens);
            }
        }
        let prompt_tokens = signals::prompt_tokens_estimate(&conversation);
        let fits_edge = ctx
            .edge_context_tokens
            .is_none_or(|n| prompt_tokens + read.output.tokens <= n);
        Self {
            pii,
            private,
            tagger: pii::tagger_version().map_err(|e| e.to_string()),
            lang,
            lang_ok: ctx.edge_languages.is_empty() || ctx.edge_languages.iter().any(|l| l == lang),
            read,
            prompt_tokens,
            fits_edge,
            conversation,
        }
    }

    fn output_tokens(&self) -> u32 {
        self.read.output.tokens
    }

    fn language_warning(&self) -> Option<String> {
        (!self.lang_ok).then(|| {
            format!(
                "quality warning: the edge model does not support language `{}`",
                self.lang
            )
        })
    }
}

/// What each target would cost: seconds, dollars, the device's joules, and the quality of
/// its answer.
struct Estimates {
    /// Includes `edge_wait`.
    edge_latency: f64,
    /// Seconds behind the answers already queued on this device.
    edge_wait: f64,
    /// Includes `cloud_queue`.
    cloud_latency: f64,
    /// Seconds the cloud would keep the request waiting for a slot.
    cloud_queue: f64,
    speculative_latency: f64,
    cloud_cost: f64,
    speculative_cost: f64,
    edge_joules: f64,
    cloud_joules: f64,
    /// How much a joule matters now (0 on mains; see [`energy::drain`]).
    drain: f64,
    edge_prior: f64,
    edge_quality: f64,
    cloud_quality: f64,
    estimate: Option<Estimate>,
    edge_score: f64,
    cloud_score: f64,
    speculative_score: f64,
    bar: QualityBar,
}

impl Estimates {
    fn of(
        m: &Measured,
        ctx: &Context,
        policy: &Policy,
        quality: &Result<&QualityModel, QualityError>,
    ) -> Self {
        let (prompt_tokens, out) = (f64::from(m.prompt_tokens), f64::from(m.output_tokens()));
        let (edge_latency, edge_wait) = edge_seconds(ctx, prompt_tokens, out);
        let rtt = f64::from(ctx.rtt_ms) / 1000.0;
        let (cloud_latency, cloud_queue, cloud_rate) = cloud_seconds(m, ctx, policy, out);
        let cloud_cost = policy.cloud_price(prompt_tokens, out);
        // Speculative: one round trip and one cloud pass per verify call, the edge drafting
        // every output token; the prompt and the drafts are billed as input, one token a call
        // as output.
        let verify_calls = (out / f64::from(policy.speculative_tokens_per_call.max(1.0))).ceil();
        let speculative_latency = verify_calls * (rtt + 1.0 / cloud_rate) + edge_latency;
        let speculative_cost = policy.cloud_price(prompt_tokens + out, verify_calls);
        // Energy: the edge computes every token; the cloud costs the device only its radio.
        // Speculation drafts every token on the edge and sends them up.
        let edge_joules =
            policy
                .energy
                .edge_joules(ctx.edge_backend, m.prompt_tokens, m.output_tokens());
        let cloud_joules = policy
            .energy
            .cloud_joules(m.prompt_tokens, m.output_tokens());
        let (edge_prior, cloud_quality) = task_priors(m, policy);
        let estimate = quality
            .as_ref()
            .ok()
            .map(|q| q.estimate(&m.read.features, None));
        let edge_quality = estimate.as_ref().map_or(edge_prior, |e| e.p_edge_ok);
        let edge_quality = if m.lang_ok {
            edge_quality
        } else {
            edge_quality * 0.3
        };
        let drain = energy::drain(ctx.battery);
        let score = |seconds, usd, quality, joules| {
            policy.weights.score(seconds, usd, quality, joules, drain)
        };
        Self {
            bar: QualityBar::of(
                policy,
                cloud_latency - edge_latency,
                (edge_joules - cloud_joules) * drain,
            ),
            edge_score: score(edge_latency, 0.0, edge_quality, edge_joules),
            cloud_score: score(cloud_latency, cloud_cost, cloud_quality, cloud_joules),
            // The cloud's own answer either way: speculation is worth it when its latency and
            // price beat plain streaming under the tenant's weights.
            speculative_score: score(
                speculative_latency,
                speculative_cost,
                cloud_quality,
                edge_joules + cloud_joules,
            ),
            edge_latency,
            edge_wait,
            cloud_latency,
            cloud_queue,
            speculative_latency,
            cloud_cost,
            speculative_cost,
            edge_joules,
            cloud_joules,
            drain,
            edge_prior,
            edge_quality,
            cloud_quality,
            estimate,
        }
    }
}

/// The least P(edge answer acceptable) for the edge to answer, at its first token. The
/// policy's `min_edge_quality` is set for a device on mains power and a cloud that answers no
/// slower than the edge; what else the score weighs moves it, at the weights' own rate
/// against a unit of quality: each second the cloud would take beyond the edge (a slow or
/// distant network, a queue) lowers it by `latency / quality`, and each joule the edge would
/// spend beyond the cloud on battery raises it by `energy · drain / quality`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct QualityBar {
    policy: f64,
    /// Zero or below.
    latency_shift: f64,
    /// Zero or above.
    energy_shift: f64,
}

impl QualityBar {
    /// The bar for a cloud `cloud_slower_s` seconds slower than the edge (negative: faster),
    /// with the edge spending `extra_joules_drained` more than the cloud, weighed by drain.
    fn of(policy: &Policy, cloud_slower_s: f64, extra_joules_drained: f64) -> Self {
        let w = policy.weights;
        let in_quality = |x: f64| {
            if w.quality > 0.0 && x.is_finite() {
                x.max(0.0) / w.quality
            } else {
                0.0
            }
        };
        QualityBar {
            policy: policy.min_edge_quality,
            latency_shift: -in_quality(w.latency * cloud_slower_s),
            energy_shift: in_quality(w.energy * extra_joules_drained),
        }
    }

    /// The bar at the first token.
    fn at_first_token(&self) -> f64 {
        (self.policy + self.latency_shift + self.energy_shift).clamp(0.0, 1.0)
    }

    /// The bar before generation: lower, since the first token applies the whole bar before
    /// any text is shown.
    fn before_generation(&self) -> f64 {
        self.at_first_token() * PRE_GENERATION_BAR
    }

    /// How the bar moved from the policy's, for the reasons; `None` when it did not.
    fn moved(&self, e: &Estimates) -> Option<String> {
        let mut parts = vec![];
        if self.latency_shift < 0.0 {
            parts.push(format!(
                "{:+.2} for a cloud {:.1} s slower than the edge",
                self.latency_shift,
                e.cloud_latency - e.edge_latency
            ));
        }
        if self.energy_shift > 0.0 {
            parts.push(format!(
                "{:+.2} for {:.1} J more from the battery on the edge",
                self.energy_shift,
                e.edge_joules - e.cloud_joules
            ));
        }
        (!parts.is_empty()).then(|| format!("the policy's {:.2} {}", self.policy, parts.join(", ")))
    }
}

/// Seconds until the edge's whole answer (its queue, prefill and decoding; infinite without
/// a measured speed), and the queue alone.
fn edge_seconds(ctx: &Context, prompt_tokens: f64, out: f64) -> (f64, f64) {
    let prefill = ctx
        .edge_prefill_tokens_per_s
        .filter(|s| *s > 0.0)
        .map_or(0.0, |s| prompt_tokens / f64::from(s));
    let wait = ctx.edge_busy_s.map_or(0.0, f64::from).max(0.0);
    let total = if ctx.edge_tokens_per_s > 0.0 {
        wait + prefill + out / f64::from(ctx.edge_tokens_per_s)
    } else {
        f64::INFINITY
    };
    (total, wait)
}

/// The cloud's bill in seconds (round trip, upload, queue, compute, download), the queue
/// alone, and the decode rate it assumed.
fn cloud_seconds(m: &Measured, ctx: &Context, policy: &Policy, out: f64) -> (f64, f64, f64) {
    // Over the measured bandwidth, if any: the prompt goes up as JSON text, about its UTF-8
    // length, and each token comes down as one SSE chunk of JSON.
    let transfer = |bytes: f64| {
        ctx.bandwidth_kbps
            .filter(|k| *k > 0.0)
            .map_or(0.0, |k| bytes * 8.0 / (f64::from(k) * 1000.0))
    };
    let rtt = f64::from(ctx.rtt_ms) / 1000.0;
    let rate = f64::from(policy.cloud_tokens_per_s.max(1.0));
    let (queue, rate) = cloud_wait(ctx, out, rate, rtt);
    let upload = transfer(m.conversation.len() as f64);
    let download = transfer(out * SSE_CHUNK_BYTES);
    (rtt + upload + queue + out / rate + download, queue, rate)
}

/// The bytes of one streamed token: an SSE chunk of OpenAI's JSON around a few characters.
const SSE_CHUNK_BYTES: f64 = 150.0;

/// The cloud's queue in seconds and its decode rate: from the server's load report where the
/// worker relays one (requests ahead are assumed as long as this one), else from the
/// measured time to first token beyond the round trip; `rate` is the policy's where nothing
/// was measured.
fn cloud_wait(ctx: &Context, out: f64, rate: f64, rtt: f64) -> (f64, f64) {
    match (ctx.cloud_load, ctx.cloud_ttft_ms) {
        (Some(load), _) => {
            let rate = load
                .tokens_per_s
                .filter(|r| *r > 0.0)
                .map_or(rate, f64::from);
            (load.wait_s(out / rate), rate)
        }
        (None, Some(ttft)) => ((f64::from(ttft) / 1000.0 - rtt).max(0.0), rate),
        (None, None) => (0.0, rate),
    }
}

/// The edge's and the cloud's quality priors for the turn's task, counted as much as the
/// classifier is sure of the task.
fn task_priors(m: &Measured, policy: &Policy) -> (f64, f64) {
    let task = &m.read.task;
    let confidence = f64::from(task.confidence);
    let prior = policy
        .task_quality
        .get(&task.task)
        .copied()
        .unwrap_or(QualityPrior {
            edge: policy.edge_quality,
            cloud: policy.cloud_quality,
        });
    let blend = |p: f64, base: f64| confidence * p + (1.0 - confidence) * base;
    (
        blend(prior.edge, policy.edge_quality),
        blend(prior.cloud, policy.cloud_quality),
    )
}

/// Every signal and estimate, named, for the trace.
fn trace_signals(
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

/// Everything the rules and the score read.
struct Facts<'a> {
    m: Measured,
    e: Estimates,
    signals: Vec<SignalValue>,
    ctx: &'a Context,
    policy: &'a Policy,
}

/// A rule's ruling: the target and why.
type Ruling = (Target, Vec<String>);

/// A rule: its ruling, or `None` when it does not apply.
type Rule = fn(&Facts) -> Option<Ruling>;

/// The rules, in order; the first that applies decides. Privacy first: it is a constraint,
/// not a weight.
const RULES: [(&str, Rule); 10] = [
    ("privacy", privacy),
    ("offline", offline),
    ("edge_unavailable", edge_unavailable),
    ("edge_context", edge_context),
    ("budget", budget),
    ("edge_busy", edge_busy),
    ("language", language),
    ("battery", battery),
    ("cloud_queue", cloud_queue),
    ("long_output", long_output),
];

/// Personal data stays on the device; a detector that did not load cannot vouch for the
/// prompt, so it fails closed.
fn privacy(f: &Facts) -> Option<Ruling> {
    if let Err(e) = &f.m.tagger {
        let why =
            format!("privacy: the name detector is unavailable ({e}); nothing leaves this device");
        return Some((Target::Edge, vec![why]));
    }
    if f.m.private.is_empty() {
        return None;
    }
    let names: Vec<String> = f.m.private.iter().map(|k| format!("{k:?}")).collect();
    let mut reasons = vec![format!(
        "privacy: {} stays on this device",
        names.join(", ")
    )];
    reasons.extend(f.m.language_warning());
    if !f.m.fits_edge {
        reasons.push(
            "quality warning: the conversation is longer than the edge can hold; its start \
             will be cut"
                .into(),
        );
    }
    Some((Target::Edge, reasons))
}

/// Offline, or a policy that keeps everything on the device.
fn offline(f: &Facts) -> Option<Ruling> {
    if f.ctx.online && !f.policy.edge_only {
        return None;
    }
    let why = if f.ctx.online {
        "offline: the policy keeps every answer on this device"
    } else {
        "offline: only the edge can answer"
    };
    Some((Target::Edge, vec![why.into()]))
}

/// No edge model on this device.
fn edge_unavailable(f: &Facts) -> Option<Ruling> {
    (!f.ctx.edge_available).then(|| {
        (
            Target::Cloud,
            vec!["edge model not available on this device".into()],
        )
    })
}

/// A conversation longer than the edge's cache.
fn edge_context(f: &Facts) -> Option<Ruling> {
    (!f.m.fits_edge).then(|| {
        let why = format!(
            "about {} prompt and {} output tokens exceed the {} the edge can hold",
            f.m.prompt_tokens,
            f.m.output_tokens(),
            f.ctx.edge_context_tokens.unwrap_or(0)
        );
        (Target::Cloud, vec![why])
    })
}

/// A cloud answer the remaining budget cannot pay for.
fn budget(f: &Facts) -> Option<Ruling> {
    let left = f.ctx.budget_remaining_usd?;
    let cost = f.e.cloud_cost;
    if cost <= left {
        return None;
    }
    let mut reasons = vec![format!(
        "budget: the cloud would cost about ${cost:.5}, more than the ${left:.5} left"
    )];
    reasons.extend(f.m.language_warning());
    Some((Target::Edge, reasons))
}

/// A language the edge model does not speak.
fn language(f: &Facts) -> Option<Ruling> {
    (!f.m.lang_ok).then(|| {
        let why = format!("language `{}` is not supported by the edge model", f.m.lang);
        (Target::Cloud, vec![why])
    })
}

/// A long answer on a low, discharging battery.
fn battery(f: &Facts) -> Option<Ruling> {
    let energy = &f.policy.energy;
    let out = f.m.output_tokens();
    if !energy.battery_low(f.ctx.battery) || out <= energy.low_battery_output_tokens {
        return None;
    }
    let level = f.ctx.battery.map_or(0.0, |b| b.level * 100.0);
    let why = format!(
        "battery: {level:.0}% and discharging; about {out} output tokens would cost the device \
         {:.1} J on the edge, {:.2} J from the cloud",
        f.e.edge_joules, f.e.cloud_joules
    );
    Some((Target::Cloud, vec![why]))
}

/// A busy device: the answers queued ahead of this one would keep it waiting longer than the
/// whole cloud answer takes. (A private request never gets here: it waits its turn.)
fn edge_busy(f: &Facts) -> Option<Ruling> {
    let e = &f.e;
    if e.edge_wait <= e.cloud_latency {
        return None;
    }
    let why = format!(
        "edge busy: {:.1} s of answers ahead on this device; the cloud answers in about {:.1} s",
        e.edge_wait, e.cloud_latency
    );
    Some((Target::Cloud, vec![why]))
}

/// A queueing cloud: waiting for its slot would take longer than the edge's whole answer,
/// and the edge can take the request.
fn cloud_queue(f: &Facts) -> Option<Ruling> {
    let e = &f.e;
    if e.cloud_queue <= e.edge_latency || !f.m.lang_ok || !f.m.fits_edge {
        return None;
    }
    let why = format!(
        "cloud queueing: about {:.1} s before it would start; the edge answers in about {:.1} s",
        e.cloud_queue, e.edge_latency
    );
    Some((Target::Edge, vec![why]))
}

/// An answer longer than the policy lets the edge write.
fn long_output(f: &Facts) -> Option<Ruling> {
    let out = &f.m.read.output;
    if out.tokens <= f.policy.long_output_tokens {
        return None;
    }
    let mut reasons = vec![format!(
        "expected {} output tokens ({}) exceeds {}",
        out.tokens, out.basis, f.policy.long_output_tokens
    )];
    let target = f.in_the_cloud(&mut reasons);
    Some((target, reasons))
}

impl Facts<'_> {
    /// Whether the cloud's answer comes faster or cheaper by speculation than by plain
    /// streaming.
    fn speculate(&self) -> bool {
        self.ctx.cloud_verifies
            && !self.ctx.save_data
            && self.e.speculative_score < self.e.cloud_score
    }

    /// The way to the cloud's answer: speculative (with its reason) or plain.
    fn in_the_cloud(&self, reasons: &mut Vec<String>) -> Target {
        let cheaper = self.ctx.cloud_verifies && self.e.speculative_score < self.e.cloud_score;
        if cheaper && self.ctx.save_data {
            reasons.push(
                "save-data: plain streaming, since speculation sends the drafts up again with \
                 every verify call"
                    .into(),
            );
        }
        if !self.speculate() {
            return Target::Cloud;
        }
        reasons.push(format!(
            "speculative: edge drafts, cloud verifies ({:.3} vs plain cloud {:.3})",
            self.e.speculative_score, self.e.cloud_score
        ));
        Target::Speculative
    }

    /// No rule applied: the learned estimate against the policy's bar decides, or without a
    /// quality model the composite score over the task priors.
    fn scored(self, quality: &Result<&QualityModel, QualityError>) -> Decision {
        let e = &self.e;
        let mut scores = vec![(Target::Edge, e.edge_score), (Target::Cloud, e.cloud_score)];
        if self.ctx.cloud_verifies {
            scores.push((Target::Speculative, e.speculative_score));
        }
        let (Ok(model), Some(estimate)) = (quality, e.estimate.clone()) else {
            let mut reasons = vec![format!(
                "score: edge {:.3} vs cloud {:.3} (lower wins)",
                e.edge_score, e.cloud_score
            )];
            let target = if e.edge_score <= e.cloud_score {
                Target::Edge
            } else {
                self.in_the_cloud(&mut reasons)
            };
            return self.decision(target, None, reasons, scores);
        };
        let (bar, before) = (e.bar.at_first_token(), e.bar.before_generation());
        let p = estimate.p_edge_ok;
        let moved = e.bar.moved(e).map_or(String::new(), |m| format!("; {m}"));
        let mut reasons = vec![format!(
            "quality: P(edge answer acceptable) {p:.2} before generation (bar {before:.2}; \
             {bar:.2} at the first token{moved})"
        )];
        let target = if p >= before {
            Target::Edge
        } else {
            self.in_the_cloud(&mut reasons)
        };
        let check = QualityCheck {
            model_version: model.version.clone(),
            text_features: self.m.read.features.to_vec(),
            edge_signals: model.knows_edge(self.ctx.edge_model_sha256.as_deref()),
            estimate,
            bar,
        };
        Decision {
            quality: Some(check),
            ..self.decision(target, None, reasons, scores)
        }
    }

    /// The decision for `target`, with its estimates and the trace.
    fn decision(
        &self,
        target: Target,
        rule: Option<&str>,
        reasons: Vec<String>,
        scores: Vec<(Target, f64)>,
    ) -> Decision {
        let e = &self.e;
        let (seconds, usd) = match target {
            Target::Edge => (e.edge_latency, 0.0),
            Target::Cloud => (e.cloud_latency, e.cloud_cost),
            Target::Speculative => (e.speculative_latency, e.speculative_cost),
        };
        Decision {
            target,
            reasons: self.with_structured_note(reasons),
            pii: self.m.pii.clone(),
            estimated_latency_ms: 1000.0 * seconds,
            estimated_cost_usd: usd,
            // Only a scored edge decision may escalate: a rule that chose the edge (privacy,
            // offline) forbids the cloud.
            cascade: (target == Target::Edge && rule.is_none())
                .then(|| self.policy.cascade.clone()),
            quality: None,
            trace: DecisionTrace {
                signals: self.signals.clone(),
                rule: rule.map(str::to_string),
                scores,
                policy_version: self.policy.version.clone(),
            },
        }
    }
}

impl Facts<'_> {
    /// `reasons`, with what a schema-held answer means for routing when the request has one.
    fn with_structured_note(&self, mut reasons: Vec<String>) -> Vec<String> {
        let Some(shape) = self.ctx.structured else {
            return reasons;
        };
        let what = if shape.tool_call {
            "a tool call"
        } else {
            "JSON"
        };
        let tokens = self.m.output_tokens();
        reasons.push(if shape.is_small() {
            format!(
                "structured output: {what} under a small schema ({} bytes), about {tokens} tokens: edge-friendly",
                shape.schema_bytes
            )
        } else {
            format!(
                "structured output: {what} under a large schema ({} bytes), about {tokens} tokens",
                shape.schema_bytes
            )
        });
        reasons
    }
}

/// The share of the quality bar a request must clear before generation.
const PRE_GENERATION_BAR: f64 = 0.5;

/// The check at the edge's first token, with the bundled quality model.
pub fn at_first_token(decision: &Decision, first: EdgeSignals) -> FirstTokenCheck {
    at_first_token_with(decision, first, quality::bundled())
}

/// The quality estimate again, now with the edge model's first-token signals: an edge
/// decision whose estimate falls below the policy's bar escalates before any edge text is
/// shown. Decisions made by a rule, or by another quality model, are left alone.
pub fn at_first_token_with(
    decision: &Decision,
    first: EdgeSignals,
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
    let estimate = model.estimate(&text, q.edge_signals.then_some(first));
    let may_escalate = decision.target == Target::Edge && decision.cascade.is_some();
    let escalate = (may_escalate && estimate.p_edge_ok < q.bar).then(|| {
        format!(
            "first token: P(edge answer acceptable) {:.2} < {:.2} (entropy {:.2} nats, log-prob \
             {:.2})",
            estimate.p_edge_ok, q.bar, first.entropy, first.logprob
        )
    });
    FirstTokenCheck {
        estimate: Some(estimate),
        escalate,
    }
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

    fn ctx() -> Context {
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
    fn thrifty() -> Policy {
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

    #[test]
    fn speculation_is_chosen_only_where_the_cloud_verifies_and_the_weights_favour_it() {
        let essay = "Write a detailed 2000-word essay on the history of the printing press.";
        let verifies = Context {
            cloud_verifies: true,
            ..ctx()
        };
        // Latency-weighted: drafting in series with a round trip a call loses to streaming.
        let d = decide(essay, None, &verifies, &Policy::default());
        assert_eq!(d.target, Target::Cloud, "{:?}", d.reasons);
        // A price-weighted tenant with an expensive cloud model: one output token a call.
        let thrifty = thrifty();
        let d = decide(essay, None, &verifies, &thrifty);
        assert_eq!(d.target, Target::Speculative, "{:?}", d.reasons);
        assert!(d.estimated_cost_usd > 0.0);
        let plain = decide(essay, None, &ctx(), &thrifty);
        assert_eq!(plain.target, Target::Cloud, "no verifier, no speculation");
        assert!(d.estimated_cost_usd < plain.estimated_cost_usd);
        // Privacy still decides first.
        let private = decide(
            "Write a detailed essay; my card is 4111 1111 1111 1111",
            None,
            &verifies,
            &thrifty,
        );
        assert_eq!(private.target, Target::Edge);
    }

    #[test]
    fn a_small_schema_bounds_the_answer_and_makes_the_request_edge_friendly() {
        let prompt = "Write a detailed report on this customer's complaint: the parcel came \
                      two weeks late and the box was crushed.";
        let free = decide(prompt, None, &ctx(), &Policy::default());
        let labelled = Context {
            structured: Some(signals::StructuredOutput {
                schema_bytes: 180,
                tool_call: false,
            }),
            ..ctx()
        };
        let held = decide(prompt, None, &labelled, &Policy::default());
        assert_eq!(free.target, Target::Cloud, "{:?}", free.reasons);
        assert_eq!(held.target, Target::Edge, "{:?}", held.reasons);
        assert_eq!(signal(&held, "expected_output_basis"), "schema size");
        assert_eq!(signal(&held, "structured_schema_bytes"), 180.0);
        assert!(held.reasons.iter().any(|r| r.contains("edge-friendly")));
        // A large schema is no such signal, and `max_tokens` still caps the estimate.
        let large = signals::StructuredOutput {
            schema_bytes: 20_000,
            tool_call: true,
        };
        assert!(!large.is_small());
        assert_eq!(large.expected_output(Some(30)).tokens, 30);
    }

    #[test]
    fn a_busy_device_sends_a_request_to_the_cloud_unless_it_is_private() {
        let prompt = "What is the capital of France?";
        let free = decide(prompt, None, &ctx(), &Policy::default());
        assert_eq!(free.target, Target::Edge, "{:?}", free.reasons);
        let busy = Context {
            edge_busy_s: Some(30.0),
            ..ctx()
        };
        let d = decide(prompt, None, &busy, &Policy::default());
        assert_eq!(d.target, Target::Cloud, "{:?}", d.reasons);
        assert_eq!(d.trace.rule.as_deref(), Some("edge_busy"));
        assert_eq!(signal(&d, "edge_busy_s"), 30.0);
        // A moment's wait is not worth the trip.
        let brief = Context {
            edge_busy_s: Some(0.05),
            ..ctx()
        };
        assert_eq!(
            decide(prompt, None, &brief, &Policy::default()).target,
            Target::Edge
        );
        // Private data waits its turn on the device.
        let private = "What is the capital of France? My card is 4111 1111 1111 1111.";
        let d = decide(private, None, &busy, &Policy::default());
        assert_eq!(d.target, Target::Edge);
        assert_eq!(d.trace.rule.as_deref(), Some("privacy"));
    }

    #[test]
    fn a_queueing_cloud_sends_a_long_answer_to_the_edge_and_its_queue_is_in_the_bill() {
        let essay = "Write a detailed 500-word essay on the history of the printing press.";
        let calm = decide(essay, Some(400), &ctx(), &Policy::default());
        assert_eq!(calm.target, Target::Cloud, "{:?}", calm.reasons);
        let full = Context {
            cloud_load: Some(LoadReport {
                queued: 40,
                active: 8,
                slots: 8,
                tokens_per_s: Some(20.0),
            }),
            ..ctx()
        };
        let d = decide(essay, Some(400), &full, &Policy::default());
        assert_eq!(d.target, Target::Edge, "{:?}", d.reasons);
        assert_eq!(d.trace.rule.as_deref(), Some("cloud_queue"));
        assert_eq!(signal(&d, "cloud_queued"), 40.0);
        assert!(
            signal(&d, "cloud_queue_s")
                .as_f64()
                .is_some_and(|s| s > 60.0)
        );
        // An upstream that reports no load: the measured time to first token stands in.
        let slow = Context {
            cloud_ttft_ms: Some(120_000.0),
            ..ctx()
        };
        let d = decide(essay, Some(400), &slow, &Policy::default());
        assert_eq!(
            d.trace.rule.as_deref(),
            Some("cloud_queue"),
            "{:?}",
            d.reasons
        );
        // A free slot on a cloud that decodes faster than the edge: the usual decision.
        let idle = Context {
            cloud_load: Some(LoadReport {
                queued: 0,
                active: 2,
                slots: 8,
                tokens_per_s: Some(60.0),
            }),
            ..ctx()
        };
        assert_eq!(
            decide(essay, Some(400), &idle, &Policy::default()).target,
            Target::Cloud
        );
    }

    #[test]
    fn a_slow_network_lowers_the_bar_and_keeps_a_short_answer_on_the_edge() {
        let problem = "A train leaves at 3 pm at 60 km/h and another at 4 pm at 90 km/h. \
                       When does the second catch up?";
        let near = decide(problem, Some(24), &ctx(), &Policy::default());
        let q = near.quality.clone().expect("scored by the quality model");
        assert_eq!(
            q.bar,
            Policy::default().min_edge_quality,
            "{:?}",
            near.reasons
        );
        assert!(
            near.trace
                .signals
                .iter()
                .all(|s| s.name != "quality_bar_latency_shift")
        );
        // Two seconds to the worker and a narrow link: the cloud's answer comes seconds after
        // the edge's would, and each second is worth a quarter of the quality scale under
        // the balanced weights.
        let far = Context {
            rtt_ms: 2000.0,
            bandwidth_kbps: Some(100.0),
            ..ctx()
        };
        let d = decide(problem, Some(24), &far, &Policy::default());
        let shift = signal(&d, "quality_bar_latency_shift")
            .as_f64()
            .unwrap_or(0.0);
        let seconds = |name| signal(&d, name).as_f64().unwrap_or(0.0);
        let slower = seconds("cloud_latency_s") - seconds("edge_latency_s");
        assert!(slower > 1.5, "{slower}");
        assert!((shift + slower / 4.0).abs() < 1e-9, "{shift} vs {slower}");
        let bar = d.quality.as_ref().expect("scored").bar;
        assert!((bar - (0.5 + shift).max(0.0)).abs() < 1e-9);
        assert_eq!(signal(&d, "quality_bar").as_f64(), Some(bar));
        assert_eq!(d.target, Target::Edge, "{:?}", d.reasons);
        assert!(d.reasons[0].contains("for a cloud"), "{:?}", d.reasons);
        // The accuracy-first preset hardly trades quality for seconds.
        let strict = decide(
            problem,
            Some(24),
            &far,
            &Policy::preset("high-accuracy").unwrap(),
        );
        assert!(strict.quality.expect("scored").bar > 0.7);
    }

    #[test]
    fn on_battery_the_edge_s_joules_raise_the_bar() {
        let prompt = "Explain how a rainbow forms.";
        let on_battery = |level| Context {
            battery: Some(Battery {
                level,
                charging: false,
            }),
            ..ctx()
        };
        let bar = |c: &Context, p: &Policy| decide(prompt, Some(200), c, p).quality.unwrap().bar;
        let balanced = Policy::default();
        assert_eq!(bar(&ctx(), &balanced), balanced.min_edge_quality);
        let (full, low) = (
            bar(&on_battery(1.0), &balanced),
            bar(&on_battery(0.3), &balanced),
        );
        assert!(
            balanced.min_edge_quality < full && full < low,
            "{full} {low}"
        );
        let saver = Policy::preset("battery-saver").unwrap();
        assert!(bar(&on_battery(1.0), &saver) > full);
    }

    #[test]
    fn save_data_chooses_plain_streaming_over_speculation() {
        let essay = "Write a detailed 2000-word essay on the history of the printing press.";
        // The thrifty tenant, for whom speculation pays.
        let policy = thrifty();
        let verifying = Context {
            cloud_verifies: true,
            ..ctx()
        };
        let d = decide(essay, None, &verifying, &policy);
        assert_eq!(d.target, Target::Speculative, "{:?}", d.reasons);
        let saving = Context {
            save_data: true,
            ..verifying
        };
        let d = decide(essay, None, &saving, &policy);
        assert_eq!(d.target, Target::Cloud, "{:?}", d.reasons);
        assert!(d.reasons.iter().any(|r| r.starts_with("save-data")));
        assert_eq!(signal(&d, "save_data"), &serde_json::Value::Bool(true));
    }

    #[test]
    fn the_readme_names_every_traced_signal() {
        let readme = include_str!("../../../README.md");
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

    #[test]
    fn card_number_never_leaves_even_for_a_long_chinese_essay() {
        let d = decide(
            "请写一篇详细的文章，我的卡号是 4111 1111 1111 1111",
            None,
            &ctx(),
            &Policy::default(),
        );
        assert_eq!(d.target, Target::Edge);
        assert_eq!(d.trace.rule.as_deref(), Some("privacy"));
        assert_eq!(d.cascade, None, "private data may not escalate mid-stream");
        assert!(d.reasons.iter().any(|r| r.contains("quality warning")));
        assert!(
            !d.reasons.concat().contains("4111"),
            "values never appear in reasons"
        );
    }

    #[test]
    fn email_is_below_the_default_threshold_but_a_strict_policy_keeps_it() {
        let strict = Policy {
            keep_on_device_at: Sensitivity::Medium,
            ..Policy::default()
        };
        let prompt = "Write an essay for bob@example.com";
        assert_eq!(
            decide(prompt, None, &ctx(), &Policy::default()).target,
            Target::Cloud
        );
        assert_eq!(decide(prompt, None, &ctx(), &strict).target, Target::Edge);
    }

    /// The composite score over the task priors (no quality model), whose latency and cost
    /// terms these tests check.
    fn priors(prompt: &str, max_tokens: Option<u32>, ctx: &Context, policy: &Policy) -> Decision {
        let none = Err(QualityError::Disabled("the priors' cost model under test"));
        decide_with(&[prompt], max_tokens, ctx, policy, none)
    }

    /// The value of the trace's signal `name`, which must be there.
    fn signal<'a>(d: &'a Decision, name: &str) -> &'a serde_json::Value {
        &d.trace
            .signals
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("no signal {name}"))
            .value
    }

    #[test]
    fn the_learned_estimate_decides_and_is_traced() {
        let model = quality::bundled().expect("the bundled quality model loads");
        let d = decide(
            "Hello! How are you today?",
            None,
            &ctx(),
            &Policy::default(),
        );
        assert_eq!(
            signal(&d, "quality_model"),
            &serde_json::json!(model.version)
        );
        let q = d.quality.as_ref().expect("scored with the quality model");
        assert_eq!(q.model_version, model.version);
        assert_eq!(
            signal(&d, "edge_quality").as_f64(),
            Some(q.estimate.p_edge_ok)
        );
        assert_eq!(q.estimate.drivers.len(), 3);
        assert!(
            d.reasons[0].contains("P(edge answer acceptable)"),
            "{:?}",
            d.reasons
        );
    }

    #[test]
    fn a_malformed_or_missing_quality_model_falls_back_to_the_priors() {
        let bad = QualityModel::from_json("{\"format\": 3}").map(|_| ());
        let err = bad.expect_err("malformed");
        let d = decide_with(
            &["Hello!"],
            None,
            &ctx(),
            &Policy::default(),
            Err(err.clone()),
        );
        let traced = signal(&d, "quality_model").as_str().expect("text");
        assert!(
            traced.contains("unavailable") && traced.contains("priors"),
            "{traced}"
        );
        assert!(d.quality.is_none() && d.reasons[0].starts_with("score:"));
        assert_eq!(signal(&d, "edge_quality"), signal(&d, "edge_quality_prior"));
        let unsure = EdgeSignals {
            entropy: 9.0,
            logprob: -9.0,
        };
        assert_eq!(at_first_token_with(&d, unsure, Err(err)).escalate, None);
    }

    #[test]
    fn the_first_token_escalates_an_unsure_edge_and_keeps_a_sure_one() {
        let mut with_sha = ctx();
        let model = quality::bundled().expect("bundled");
        with_sha.edge_model_sha256 = Some(model.edge_model_sha256.clone());
        let prompt = "Is the sentiment of this review negative, neutral or positive?\nReview: \
                      The pizza was wonderful!\nSentiment:";
        let d = decide(prompt, None, &with_sha, &Policy::default());
        assert_eq!(d.target, Target::Edge, "{:?}", d.reasons);
        let sure = EdgeSignals {
            entropy: 0.2,
            logprob: -0.05,
        };
        let unsure = EdgeSignals {
            entropy: 6.0,
            logprob: -5.0,
        };
        let kept = at_first_token(&d, sure);
        let sent = at_first_token(&d, unsure);
        assert!(kept.escalate.is_none(), "{kept:?}");
        let why = sent.escalate.expect("escalates");
        assert!(why.starts_with("first token:"), "{why}");
        assert!(sent.estimate.expect("e").p_edge_ok < kept.estimate.expect("e").p_edge_ok);
        // A rule's edge decision (privacy) is never escalated.
        let private = decide(
            "my card 4111 1111 1111 1111",
            None,
            &with_sha,
            &Policy::default(),
        );
        assert_eq!(at_first_token(&private, unsure).escalate, None);
        // Another edge model: its signals mean nothing to this quality model.
        let other = decide(prompt, None, &ctx(), &Policy::default());
        assert!(!other.quality.as_ref().expect("scored").edge_signals);
        assert_eq!(at_first_token(&other, unsure).escalate, None);
    }

    #[test]
    fn language_and_task_come_from_the_turn_being_answered() {
        let turns = [
            "Translate 'good morning' to French.",
            "Bonjour ! Je vous souhaite une excellente journée, à bientôt.",
            "Thanks! Now tell me a short joke about cats.",
        ];
        let d = decide_conversation(&turns, None, &ctx(), &Policy::default());
        assert_eq!(signal(&d, "language"), "en");
        assert_ne!(d.trace.rule.as_deref(), Some("language"), "{:?}", d.reasons);
        let french = decide_conversation(&turns[..2], None, &ctx(), &Policy::default());
        assert_eq!(french.trace.rule.as_deref(), Some("language"));
        // Privacy still reads everything that would be uploaded.
        let earlier_card = ["my card is 4111 1111 1111 1111", "ok", "and the weather?"];
        let d = decide_conversation(&earlier_card, None, &ctx(), &Policy::default());
        assert_eq!(d.trace.rule.as_deref(), Some("privacy"));
    }

    #[test]
    fn rules_in_order_offline_edge_unavailable_language_long_output() {
        let offline = Context {
            online: false,
            ..ctx()
        };
        assert_eq!(
            decide("Write an essay", None, &offline, &Policy::default())
                .trace
                .rule
                .as_deref(),
            Some("offline")
        );
        let no_edge = Context {
            edge_available: false,
            ..ctx()
        };
        assert_eq!(
            decide("hi", None, &no_edge, &Policy::default())
                .trace
                .rule
                .as_deref(),
            Some("edge_unavailable")
        );
        // Whatever the script: an English-only edge model hands other languages on.
        for prompt in [
            "你好，今天天气怎么样？",
            "Привет! Какая сегодня погода?",
            "今日の天気はどうですか？",
            "Bonjour, quel temps fait-il aujourd'hui ?",
        ] {
            assert_eq!(
                decide(prompt, None, &ctx(), &Policy::default())
                    .trace
                    .rule
                    .as_deref(),
                Some("language"),
                "{prompt}"
            );
        }
        assert_eq!(
            decide(
                "Write an essay about the sea",
                None,
                &ctx(),
                &Policy::default()
            )
            .trace
            .rule
            .as_deref(),
            Some("long_output")
        );
    }

    #[test]
    fn measured_bandwidth_and_prefill_speed_enter_the_latencies() {
        let prompt = "What is the capital of France?";
        let fast = Policy {
            weights: Weights::preset("low-latency").expect("preset"),
            ..Policy::default()
        };
        let base = priors(prompt, Some(20), &ctx(), &fast);
        // A slow uplink makes the same request's cloud latency worse, and only the cloud's.
        let slow_uplink = Context {
            bandwidth_kbps: Some(0.01),
            ..ctx()
        };
        let d = priors(prompt, Some(20), &slow_uplink, &fast);
        let score = |d: &Decision, t: Target| {
            d.trace
                .scores
                .iter()
                .find(|(x, _)| *x == t)
                .map(|(_, s)| *s)
        };
        assert!(score(&d, Target::Cloud) > score(&base, Target::Cloud));
        assert_eq!(score(&d, Target::Edge), score(&base, Target::Edge));
        assert_eq!(d.target, Target::Edge);
        assert!(d.trace.signals.iter().any(|s| s.name == "bandwidth_kbps"));
        // A slow edge prefill does the same to the edge.
        let slow_prefill = Context {
            edge_prefill_tokens_per_s: Some(0.05),
            ..ctx()
        };
        let d = priors(prompt, Some(20), &slow_prefill, &fast);
        assert!(score(&d, Target::Edge) > score(&base, Target::Edge));
        assert_eq!(d.target, Target::Cloud);
    }

    #[test]
    fn what_the_edge_cannot_hold_goes_to_the_cloud_unless_privacy_keeps_it() {
        let small = Context {
            edge_context_tokens: Some(16),
            ..ctx()
        };
        let long = "Please summarise the following meeting notes for the team. ".repeat(8);
        let d = decide(&long, Some(64), &small, &Policy::default());
        assert_eq!(d.trace.rule.as_deref(), Some("edge_context"));
        assert_eq!(d.target, Target::Cloud);
        // With personal data the edge keeps it anyway, and says what that costs.
        let private = format!("{long} My card is 4111 1111 1111 1111.");
        let d = decide(&private, Some(64), &small, &Policy::default());
        assert_eq!(d.target, Target::Edge);
        assert!(
            d.reasons
                .iter()
                .any(|r| r.contains("longer than the edge can hold"))
        );
        // Room enough: no rule.
        let roomy = Context {
            edge_context_tokens: Some(4096),
            ..ctx()
        };
        assert_ne!(
            decide(&long, Some(64), &roomy, &Policy::default())
                .trace
                .rule
                .as_deref(),
            Some("edge_context")
        );
    }

    #[test]
    fn an_exhausted_budget_keeps_requests_on_the_edge() {
        let essay = "Write an essay about the sea";
        let broke = Context {
            budget_remaining_usd: Some(0.0),
            ..ctx()
        };
        let d = decide(essay, None, &broke, &Policy::default());
        assert_eq!(d.trace.rule.as_deref(), Some("budget"));
        assert_eq!(d.target, Target::Edge);
        // The edge answer may not escalate to a cloud the tenant cannot pay for.
        assert!(d.cascade.is_none());
        let flush = Context {
            budget_remaining_usd: Some(100.0),
            ..ctx()
        };
        assert_eq!(
            decide(essay, None, &flush, &Policy::default())
                .trace
                .rule
                .as_deref(),
            Some("long_output")
        );
    }

    #[test]
    fn a_low_discharging_battery_sends_long_answers_to_the_cloud_unless_privacy_keeps_them() {
        let on_battery = |level, charging| Context {
            battery: Some(Battery { level, charging }),
            ..ctx()
        };
        let story = "Tell me a story about a fox";
        let max = Some(200);
        let d = decide(story, max, &on_battery(0.15, false), &Policy::default());
        assert_eq!(d.trace.rule.as_deref(), Some("battery"), "{:?}", d.reasons);
        assert_eq!(d.target, Target::Cloud);
        assert!(d.reasons[0].contains("15%"), "{:?}", d.reasons);
        // Charging, or a short answer, is not the battery's business.
        let charging = decide(story, max, &on_battery(0.15, true), &Policy::default());
        assert_ne!(charging.trace.rule.as_deref(), Some("battery"));
        let short = decide(
            story,
            Some(32),
            &on_battery(0.15, false),
            &Policy::default(),
        );
        assert_ne!(short.trace.rule.as_deref(), Some("battery"));
        // A card stays on the device however low the battery.
        let card = "Tell me a story about my card 4111 1111 1111 1111";
        let d = decide(card, max, &on_battery(0.05, false), &Policy::default());
        assert_eq!(d.trace.rule.as_deref(), Some("privacy"));
        // battery-saver counts half a charge as low.
        let saver = Policy::preset("battery-saver").expect("preset");
        let d = decide(story, max, &on_battery(0.45, false), &saver);
        assert_eq!(d.trace.rule.as_deref(), Some("battery"));
        assert_ne!(
            decide(story, max, &on_battery(0.45, false), &Policy::default())
                .trace
                .rule
                .as_deref(),
            Some("battery")
        );
    }

    #[test]
    fn the_energy_term_moves_the_score_only_on_battery_and_is_traced() {
        let question = "What is the capital of France?";
        let policy = Policy::preset("battery-saver").expect("preset");
        let mains = priors(question, Some(48), &ctx(), &policy);
        let battery = Context {
            battery: Some(Battery {
                level: 0.6,
                charging: false,
            }),
            ..ctx()
        };
        let drained = priors(question, Some(48), &battery, &policy);
        let edge_score = |d: &Decision| {
            d.trace
                .scores
                .iter()
                .find(|(t, _)| *t == Target::Edge)
                .map(|(_, s)| *s)
                .expect("an edge score")
        };
        assert!(edge_score(&drained) > edge_score(&mains));
        assert_eq!(signal(&mains, "energy_drain"), &serde_json::json!(0.0));
        assert!(
            signal(&drained, "edge_energy_j").as_f64()
                > signal(&drained, "cloud_energy_j").as_f64()
        );
        let bad = r#"{"version":"x","keep_on_device_at":"high","long_output_tokens":512,
            "weights":{"latency":1,"cost":1,"quality":4,"energy":-1},
            "cloud_price_in_per_1k":0,"cloud_price_out_per_1k":0,"cloud_tokens_per_s":60,
            "edge_quality":0.5,"cloud_quality":0.8}"#;
        assert!(Policy::from_json(bad).is_err());
    }

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
    fn the_task_type_is_traced_and_moves_the_quality_terms() {
        let code = decide(
            "Write a Python function that merges two sorted lists.",
            None,
            &ctx(),
            &Policy::default(),
        );
        assert_eq!(signal(&code, "task"), "code");
        assert_eq!(code.target, Target::Cloud);
        let chat = decide("hey, how's it going?", None, &ctx(), &Policy::default());
        assert_eq!(signal(&chat, "task"), "chit_chat");
        let q = |d: &Decision| signal(d, "edge_quality_prior").as_f64().expect("prior");
        assert!(q(&chat) > q(&code) + 0.2, "{} vs {}", q(&chat), q(&code));
        // Chit-chat on a slow network in the low-latency scenario stays on the device.
        let fast = Policy {
            weights: Weights::preset("low-latency").expect("preset"),
            ..Policy::default()
        };
        let slow_net = Context {
            rtt_ms: 1500.0,
            ..ctx()
        };
        let chat = decide("hey, how's it going?", None, &slow_net, &fast);
        assert_eq!(chat.target, Target::Edge);
        assert_eq!(chat.cascade, Some(CascadeRule::default()));
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
