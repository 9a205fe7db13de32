//! What the browser asks of the router: privacy scans, decisions, redaction, and the
//! cascade monitor that watches an edge answer.

use wasm_bindgen::prelude::*;

/// Scans `text` for personal data and returns the entity classes found (never the values).
#[wasm_bindgen(js_name = piiKinds)]
pub fn pii_kinds(text: &str) -> Vec<String> {
    pii_kind_names(text)
}

fn pii_kind_names(text: &str) -> Vec<String> {
    // In order of first appearance, each class once (spans of one class need not be adjacent).
    let mut kinds: Vec<String> = Vec::new();
    for span in straddle_router::pii::detect_personal(text) {
        let name = span.kind.as_str();
        if !kinds.iter().any(|k| k == name) {
            kinds.push(name.to_string());
        }
    }
    kinds
}

/// Decides where the last of `turns` (a conversation's message texts, in order) should run:
/// `context_json` is a router `Context`, `policy_json` a `Policy` (the default when absent).
/// Returns the `Decision` as JSON, trace included.
#[wasm_bindgen]
pub fn route(
    turns: Vec<String>,
    max_tokens: Option<u32>,
    context_json: &str,
    policy_json: Option<String>,
) -> Result<String, JsError> {
    route_json(&turns, max_tokens, context_json, policy_json.as_deref())
        .map_err(|e| JsError::new(&e))
}

fn route_json(
    turns: &[String],
    max_tokens: Option<u32>,
    context_json: &str,
    policy_json: Option<&str>,
) -> Result<String, String> {
    use straddle_router::policy::{self, Context, Policy};
    let ctx: Context =
        serde_json::from_str(context_json).map_err(|e| format!("invalid context: {e}"))?;
    let policy = match policy_json {
        Some(p) => Policy::from_json(p).map_err(|e| e.to_string())?,
        None => Policy::default(),
    };
    let turns: Vec<&str> = turns.iter().map(String::as_str).collect();
    serde_json::to_string(&policy::decide_conversation(
        &turns, max_tokens, &ctx, &policy,
    ))
    .map_err(|e| e.to_string())
}

/// The check after an edge answer's prefill (`straddle_router::policy::at_first_token`):
/// `decision_json` is the decision the answer started from; `look` the engine's
/// `{entropy, logprob, margin}` of the first token; `state` the edge model's final hidden state
/// at the prompt's last position, where the engine read one. Returns the `FirstTokenCheck` as
/// JSON: its `escalate` is the reason to hand the request to the cloud before any edge text
/// is shown.
#[wasm_bindgen(js_name = firstToken)]
pub fn first_token(
    decision_json: &str,
    look_json: &str,
    state: Option<Vec<f32>>,
) -> Result<String, JsError> {
    first_token_json(decision_json, look_json, state.as_deref()).map_err(|e| JsError::new(&e))
}

fn first_token_json(
    decision_json: &str,
    look_json: &str,
    state: Option<&[f32]>,
) -> Result<String, String> {
    let decision = parse_decision(decision_json)?;
    let first: straddle_router::quality::EdgeSignals =
        serde_json::from_str(look_json).map_err(|e| format!("invalid first-token signals: {e}"))?;
    serde_json::to_string(&straddle_router::policy::at_first_token(
        &decision, first, state,
    ))
    .map_err(|e| e.to_string())
}

/// A prompt (or a conversation's messages) with its personal data replaced by typed
/// placeholders (`[EMAIL_1]`) for upload; the originals stay inside this object, on the device.
#[wasm_bindgen]
pub struct Redacted {
    inner: straddle_router::redact::Redaction,
    /// The redacted texts, one per input text.
    parts: Vec<String>,
}

#[wasm_bindgen]
impl Redacted {
    /// The text to send to the cloud (the texts joined by newlines for a conversation).
    #[wasm_bindgen(getter)]
    pub fn text(&self) -> String {
        self.parts.join("\n")
    }

    /// The redacted texts, in the order given.
    pub fn parts(&self) -> Vec<String> {
        self.parts.clone()
    }

    /// The placeholders used, in order (no values).
    pub fn placeholders(&self) -> Vec<String> {
        self.inner.placeholders().map(str::to_string).collect()
    }

    /// Puts the originals back into the cloud's whole answer.
    pub fn reidentify(&self, answer: &str) -> String {
        self.inner.reidentify(answer)
    }

    /// A re-identifier for an answer that streams in: `push(chunk)` returns the text safe to
    /// show (never half a placeholder), `finish()` the rest.
    pub fn stream(&self) -> ReidentifyStream {
        ReidentifyStream {
            inner: self.inner.stream(),
        }
    }
}

/// Re-identifies a streamed answer chunk by chunk.
#[wasm_bindgen]
pub struct ReidentifyStream {
    inner: straddle_router::redact::StreamReidentifier,
}

#[wasm_bindgen]
impl ReidentifyStream {
    /// Takes the next chunk; returns what is now safe to show.
    pub fn push(&mut self, chunk: &str) -> String {
        self.inner.push(chunk)
    }

    /// Ends the stream; returns whatever was held back.
    pub fn finish(&mut self) -> String {
        self.inner.finish()
    }
}

/// Redacts the personal data in `text` whose classes are listed in `kinds` (wire names such
/// as `"email"`, `"payment_card"`; empty = every class).
#[wasm_bindgen]
pub fn redact(text: &str, kinds: Vec<String>) -> Redacted {
    let inner = straddle_router::redact::redact(text, selected(&kinds));
    Redacted {
        parts: vec![inner.text.clone()],
        inner,
    }
}

/// Redacts several texts (a conversation's messages) with one numbering, so a value that
/// recurs across messages gets the same placeholder in each.
#[wasm_bindgen(js_name = redactAll)]
pub fn redact_all(texts: Vec<String>, kinds: Vec<String>) -> Result<Redacted, JsError> {
    // A separator no detector treats as part of an entity: record separator between newlines.
    const SEP: &str = "\n\u{1e}\n";
    if texts.iter().any(|t| t.contains('\u{1e}')) {
        return Err(JsError::new(
            "a message contains U+001E, which redaction reserves",
        ));
    }
    let inner = straddle_router::redact::redact(&texts.join(SEP), selected(&kinds));
    let parts: Vec<String> = inner.text.split(SEP).map(str::to_string).collect();
    if parts.len() != texts.len() {
        return Err(JsError::new(
            "redaction merged two messages; refusing to upload",
        ));
    }
    Ok(Redacted { inner, parts })
}

fn selected(kinds: &[String]) -> impl Fn(straddle_router::pii::EntityKind) -> bool + '_ {
    move |k| kinds.is_empty() || kinds.iter().any(|n| n == k.as_str())
}

/// The whole policy for a scenario preset (`balanced`, `low-latency`, `high-accuracy`,
/// `low-cost`, `offline`, `privacy-strict`) as JSON, for pages to adjust and pass to `route`.
#[wasm_bindgen(js_name = policyPreset)]
pub fn policy_preset(name: &str) -> Result<String, JsError> {
    preset_json(name).map_err(|e| JsError::new(&e))
}

fn preset_json(name: &str) -> Result<String, String> {
    use straddle_router::policy::Policy;
    let policy = Policy::preset(name).ok_or_else(|| {
        format!(
            "unknown policy preset `{name}` ({})",
            Policy::PRESETS.join(", ")
        )
    })?;
    serde_json::to_string(&policy).map_err(|e| e.to_string())
}

/// The contextual bandit of `straddle_router::bandit`, learning from a page's `feedback`
/// which target pays off for which kind of request. Its state is JSON, for IndexedDB.
#[wasm_bindgen]
pub struct Learner {
    bandit: straddle_router::bandit::LinUcb,
    weights: straddle_router::bandit::RewardWeights,
}

#[wasm_bindgen]
impl Learner {
    /// Restores saved state, or starts knowing nothing when `state_json` is absent.
    #[wasm_bindgen(constructor)]
    pub fn new(state_json: Option<String>) -> Result<Learner, JsError> {
        Self::restore(state_json.as_deref()).map_err(|e| JsError::new(&e))
    }

    fn restore(state_json: Option<&str>) -> Result<Learner, String> {
        use straddle_router::bandit::LinUcb;
        let bandit = match state_json {
            Some(json) => LinUcb::from_json(json).map_err(|e| e.to_string())?,
            None => LinUcb::default(),
        };
        Ok(Learner {
            bandit,
            weights: Default::default(),
        })
    }

    /// The target the bandit prefers for a scored decision (`decision_json` as `route`
    /// returns it); `undefined` when a rule decided (privacy, offline, …: not the bandit's
    /// call) or before any feedback (the policy's score decides). Feedback on either target
    /// is enough: from then on it also explores the other.
    pub fn choose(&self, decision_json: &str) -> Result<Option<String>, JsError> {
        self.prefer(decision_json).map_err(|e| JsError::new(&e))
    }

    fn prefer(&self, decision_json: &str) -> Result<Option<String>, String> {
        use straddle_router::policy::Target;
        let d = parse_decision(decision_json)?;
        if d.trace.rule.is_some() || self.bandit.pulls == [0, 0] {
            return Ok(None);
        }
        let obs = straddle_router::bandit::Observation::of(&d, &self.weights);
        Ok(self
            .bandit
            .choose(&obs, &[Target::Edge, Target::Cloud])
            .map(|t| t.as_str().to_string()))
    }

    /// Learns from one answer: where it ran, the user's `quality` (0–1), its cost and latency.
    pub fn update(
        &mut self,
        decision_json: &str,
        target: &str,
        quality: f64,
        cost_usd: f64,
        latency_s: f64,
    ) -> Result<(), JsError> {
        self.learn(decision_json, target, quality, cost_usd, latency_s)
            .map_err(|e| JsError::new(&e))
    }

    fn learn(
        &mut self,
        decision_json: &str,
        target: &str,
        quality: f64,
        cost_usd: f64,
        latency_s: f64,
    ) -> Result<(), String> {
        use straddle_router::policy::Target;
        let d = parse_decision(decision_json)?;
        let target = match target {
            "edge" => Target::Edge,
            "cloud" => Target::Cloud,
            other => return Err(format!("unknown target `{other}`")),
        };
        let obs = straddle_router::bandit::Observation::of(&d, &self.weights);
        let reward = self.weights.reward(quality, cost_usd, latency_s);
        self.bandit.update(target, &obs, reward);
        Ok(())
    }

    /// Feedback seen so far per target, `[edge, cloud]`.
    pub fn pulls(&self) -> Vec<f64> {
        self.bandit.pulls.iter().map(|&n| n as f64).collect()
    }

    /// The state to keep.
    #[wasm_bindgen(js_name = toJson)]
    pub fn to_json(&self) -> String {
        serde_json::to_string(&self.bandit).unwrap_or_default()
    }
}

fn parse_decision(json: &str) -> Result<straddle_router::policy::Decision, String> {
    serde_json::from_str(json).map_err(|e| format!("invalid decision: {e}"))
}

/// The router's version, carried in every escalation's envelope and response.
/// What the cloud charges for `tokens_in` input and `tokens_out` output tokens at the given
/// prices per 1,000 tokens: the router's and the worker's formula, so the page's cost reports
/// agree with the bill.
#[wasm_bindgen(js_name = cloudCostUsd)]
pub fn cloud_cost_usd(in_per_1k: f64, out_per_1k: f64, tokens_in: f64, tokens_out: f64) -> f64 {
    let price = straddle_router::price::Price {
        in_per_1k,
        out_per_1k,
    };
    price.cost(tokens_in, tokens_out)
}

#[wasm_bindgen(js_name = routerVersion)]
pub fn router_version() -> String {
    format!("straddle-router/{}", env!("CARGO_PKG_VERSION"))
}

/// Watches one edge answer token by token (see `straddle_router::cascade`).
#[wasm_bindgen]
pub struct Cascade {
    monitor: straddle_router::cascade::CascadeMonitor,
    window: usize,
}

#[wasm_bindgen]
impl Cascade {
    /// A monitor for the rule in `rule_json` (a decision's `cascade` field).
    #[wasm_bindgen(constructor)]
    pub fn new(rule_json: &str) -> Result<Cascade, JsError> {
        Self::from_json(rule_json).map_err(|e| JsError::new(&e))
    }

    fn from_json(rule_json: &str) -> Result<Cascade, String> {
        let rule: straddle_router::cascade::CascadeRule =
            serde_json::from_str(rule_json).map_err(|e| format!("invalid cascade rule: {e}"))?;
        // Refusal phrases are watched over twice the window; held output must wait as long.
        let window = rule.window.max(1) * if rule.detect_refusals { 2 } else { 1 };
        Ok(Cascade {
            monitor: straddle_router::cascade::CascadeMonitor::new(rule),
            window,
        })
    }

    /// Tokens after which the verdict cannot change any more.
    #[wasm_bindgen(getter)]
    pub fn settles_after(&self) -> usize {
        self.window
    }

    /// Feeds one token; returns the reason to escalate, or `undefined` to go on.
    pub fn push(&mut self, text: &str, logprob: f32, entropy: f32) -> Option<String> {
        use straddle_router::cascade::Escalation;
        match self.monitor.push(text, logprob, entropy) {
            Escalation::Escalate { reason } => Some(reason.clone()),
            Escalation::Undecided | Escalation::Continue => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn route_returns_a_decision_with_its_trace_and_rejects_bad_context() {
        let ctx = r#"{"online":false,"edge_available":true,"edge_tokens_per_s":30,"rtt_ms":50,"edge_languages":["en"]}"#;
        let d: serde_json::Value = serde_json::from_str(
            &route_json(&["hello".into()], None, ctx, None).expect("decision"),
        )
        .expect("json");
        assert_eq!(d["target"], "edge");
        assert_eq!(d["trace"]["rule"], "offline");
        assert!(
            route_json(&["hello".into()], None, "{}", None)
                .unwrap_err()
                .contains("invalid context")
        );
    }

    #[test]
    fn redaction_keeps_values_on_the_device_and_restores_them() {
        let r = redact("mail jane@example.com, card 4111 1111 1111 1111", vec![]);
        assert_eq!(r.text(), "mail [EMAIL_1], card [PAYMENT_CARD_1]");
        assert_eq!(r.placeholders(), ["[EMAIL_1]", "[PAYMENT_CARD_1]"]);
        let mut s = r.stream();
        let shown = s.push("Wrote to [EMA") + &s.push("IL_1].") + &s.finish();
        assert_eq!(shown, "Wrote to jane@example.com.");
        let only_cards = redact("mail jane@example.com", vec!["payment_card".into()]);
        assert_eq!(only_cards.text(), "mail jane@example.com");
    }

    #[test]
    fn a_conversation_is_redacted_with_one_numbering() {
        let r = redact_all(
            vec![
                "I am jane@example.com".into(),
                "again: jane@example.com, bob@example.org".into(),
            ],
            vec![],
        )
        .unwrap_or_else(|_| panic!("redacts"));
        assert_eq!(r.parts(), ["I am [EMAIL_1]", "again: [EMAIL_1], [EMAIL_2]"]);
        assert_eq!(r.reidentify("[EMAIL_2]"), "bob@example.org");
    }

    #[test]
    fn presets_are_whole_policies_the_router_accepts() {
        let json = preset_json("low-cost").expect("preset");
        let p = straddle_router::policy::Policy::from_json(&json).expect("valid policy");
        assert_eq!(p.version, "low-cost-1");
        assert!(
            preset_json("cheapest")
                .unwrap_err()
                .contains("unknown policy preset")
        );
    }

    #[test]
    fn the_learner_leaves_rules_alone_and_follows_rewards() {
        let ctx = r#"{"online":true,"edge_available":true,"edge_tokens_per_s":30,"rtt_ms":50,"edge_languages":["en"]}"#;
        let scored =
            route_json(&["Hello! How are you?".into()], Some(32), ctx, None).expect("decision");
        let private =
            route_json(&["my card 4111 1111 1111 1111".into()], Some(32), ctx, None).expect("d");
        let mut l = Learner::restore(None).expect("new");
        assert_eq!(l.prefer(&scored).expect("ok"), None, "no evidence yet");
        for _ in 0..20 {
            l.learn(&scored, "edge", 1.0, 0.0, 0.5).expect("learn");
            l.learn(&scored, "cloud", 0.2, 0.0001, 0.5).expect("learn");
        }
        assert_eq!(l.prefer(&scored).expect("ok").as_deref(), Some("edge"));
        assert_eq!(l.prefer(&private).expect("ok"), None, "privacy is a rule");
        let again = Learner::restore(Some(&l.to_json())).expect("restores");
        assert_eq!(again.pulls(), vec![20.0, 20.0]);
        assert!(Learner::restore(Some("{}")).is_err());
        assert!(l.learn(&scored, "moon", 1.0, 0.0, 0.0).is_err());
    }

    #[test]
    fn pii_kinds_names_classes_not_values() {
        assert_eq!(pii_kind_names("write to a@b.io"), vec!["email".to_string()]);
        assert!(pii_kind_names("nothing here").is_empty());
        assert_eq!(
            pii_kind_names("a@b.io, 4111 1111 1111 1111, c@d.io"),
            vec!["email".to_string(), "payment_card".to_string()]
        );
    }

    #[test]
    fn cascade_escalates_on_a_refusal_and_settles_after_twice_the_window() {
        let rule =
            serde_json::to_string(&straddle_router::cascade::CascadeRule::default()).expect("rule");
        let mut c = Cascade::from_json(&rule).expect("cascade");
        assert_eq!(c.settles_after(), 16);
        assert_eq!(c.push("Sure", -0.1, 0.5), None);
        assert!(
            c.push(" — I don't know", -0.1, 0.5)
                .expect("escalates")
                .contains("know")
        );
        assert!(Cascade::from_json("{}").is_err());
    }
}
