//! The ordered rules: the first that applies decides, before any score.

use super::config::Policy;
use super::context::{Context, Target};
use super::estimate::Estimates;
use super::measure::Measured;
use super::trace::SignalValue;

/// Everything the rules and the score read.
pub(super) struct Facts<'a> {
    pub(super) m: Measured,
    pub(super) e: Estimates,
    pub(super) signals: Vec<SignalValue>,
    pub(super) ctx: &'a Context,
    pub(super) policy: &'a Policy,
}

/// A rule's ruling: the target and why.
type Ruling = (Target, Vec<String>);

/// A rule: its ruling, or `None` when it does not apply.
type Rule = fn(&Facts) -> Option<Ruling>;

/// The rules, in order; the first that applies decides. Privacy first: it is a constraint,
/// not a weight.
pub(super) const RULES: [(&str, Rule); 10] = [
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::energy::Battery;
    use crate::pii::Sensitivity;
    use crate::policy::decide;
    use crate::policy::test_support::{ctx, priors, signal};
    use straddle_protocol::LoadReport;

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
        // The cost model over the task priors: the queue's seconds are what this is about.
        let essay = "Write a detailed 500-word essay on the history of the printing press.";
        let calm = priors(essay, Some(400), &ctx(), &Policy::default());
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
        let d = priors(essay, Some(400), &full, &Policy::default());
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
        let d = priors(essay, Some(400), &slow, &Policy::default());
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
            priors(essay, Some(400), &idle, &Policy::default()).target,
            Target::Cloud
        );
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
}
