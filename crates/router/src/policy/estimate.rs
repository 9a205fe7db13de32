//! What each target would cost: latency, money, energy and answer quality, and the quality
//! bar the edge must clear.

use super::config::{Policy, QualityPrior};
use super::context::Context;
use super::measure::Measured;
use crate::energy;
use crate::quality::{Estimate, QualityError, QualityModel};

/// What each target would cost: seconds, dollars, the device's joules, and the quality of
/// its answer.
pub(super) struct Estimates {
    /// Includes `edge_wait`.
    pub(super) edge_latency: f64,
    /// Seconds behind the answers already queued on this device.
    pub(super) edge_wait: f64,
    /// Includes `cloud_queue`.
    pub(super) cloud_latency: f64,
    /// Seconds the cloud would keep the request waiting for a slot.
    pub(super) cloud_queue: f64,
    pub(super) speculative_latency: f64,
    pub(super) cloud_cost: f64,
    pub(super) speculative_cost: f64,
    pub(super) edge_joules: f64,
    pub(super) cloud_joules: f64,
    /// How much a joule matters now (0 on mains; see [`energy::drain`]).
    pub(super) drain: f64,
    pub(super) edge_prior: f64,
    pub(super) edge_quality: f64,
    pub(super) cloud_quality: f64,
    pub(super) estimate: Option<Estimate>,
    pub(super) edge_score: f64,
    pub(super) cloud_score: f64,
    pub(super) speculative_score: f64,
    pub(super) bar: QualityBar,
}

impl Estimates {
    pub(super) fn of(
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
            .map(|q| q.estimate(&m.read.features, None, None));
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
pub(super) struct QualityBar {
    policy: f64,
    /// Zero or below.
    pub(super) latency_shift: f64,
    /// Zero or above.
    pub(super) energy_shift: f64,
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
    pub(super) fn at_first_token(&self) -> f64 {
        (self.policy + self.latency_shift + self.energy_shift).clamp(0.0, 1.0)
    }

    /// The bar before generation: `share` of the whole, since the first token applies the
    /// whole bar before any text is shown (each edge model's quality model carries its share).
    pub(super) fn before_generation(&self, share: f64) -> f64 {
        self.at_first_token() * share
    }

    /// How the bar moved from the policy's, for the reasons; `None` when it did not.
    pub(super) fn moved(&self, e: &Estimates) -> Option<String> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cascade::CascadeRule;
    use crate::energy::Battery;
    use crate::policy::test_support::{ctx, priors, signal};
    use crate::policy::{Decision, Target, Weights, decide};

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
    fn the_task_type_is_traced_and_moves_the_quality_terms() {
        let code = decide(
            "Write a Python function that merges two sorted lists.",
            None,
            &ctx(),
            &Policy::default(),
        );
        assert_eq!(signal(&code, "task"), "code");
        let by_priors = priors(
            "Write a Python function that merges two sorted lists.",
            None,
            &ctx(),
            &Policy::default(),
        );
        assert_eq!(by_priors.target, Target::Cloud, "{:?}", by_priors.reasons);
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
}
