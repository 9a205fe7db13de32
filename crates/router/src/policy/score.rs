//! No rule applied: the score (or the quality model against the bar) decides, and the
//! decision is built with its estimates and trace.

use super::context::Target;
use super::rules::Facts;
use super::trace::{Decision, DecisionTrace, QualityCheck};
use crate::quality::{QualityError, QualityModel};

impl Facts<'_> {
    /// Whether the cloud's answer comes faster or cheaper by speculation than by plain
    /// streaming.
    fn speculate(&self) -> bool {
        self.ctx.cloud_verifies
            && !self.ctx.save_data
            && self.e.speculative_score < self.e.cloud_score
    }

    /// The way to the cloud's answer: speculative (with its reason) or plain.
    pub(super) fn in_the_cloud(&self, reasons: &mut Vec<String>) -> Target {
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
    pub(super) fn scored(self, quality: &Result<&QualityModel, QualityError>) -> Decision {
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
        let (bar, before) = (
            e.bar.at_first_token(),
            e.bar.before_generation(model.pre_generation_share),
        );
        let p = estimate.p_edge_ok;
        let moved = e.bar.moved(e).map_or(String::new(), |m| format!("; {m}"));
        let mut reasons = vec![format!(
            "quality: P(edge answer acceptable) {p:.2} before generation (bar {before:.2}; \
             {bar:.2} at the first token{moved})"
        )];
        let target = if p >= before {
            reasons.push(
                "edge: the prompt is prefilled, then the edge model's own state decides at the \
                 first token, before any text is shown"
                    .into(),
            );
            Target::Edge
        } else {
            reasons.push("sent up before any prefill: the text alone is below the bar".into());
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
    pub(super) fn decision(
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::test_support::{ctx, signal, thrifty};
    use crate::policy::{Context, Policy, at_first_token_with, decide, decide_with};
    use crate::quality::{self, EdgeSignals};

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
    fn the_learned_estimate_decides_and_is_traced() {
        let model = quality::bundled_for(None).expect("the bundled quality model loads");
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
            margin: 0.0,
        };
        assert_eq!(
            at_first_token_with(&d, unsure, None, Err(err)).escalate,
            None
        );
    }

    #[test]
    fn the_edge_models_own_share_of_the_bar_decides_before_prefill() {
        let sha = "ab".repeat(32);
        let mut model = crate::policy::test_support::first_token_model(&sha);
        // The text alone reads P = 0.3: above half the balanced bar of 0.5, below 0.7 of it.
        model.text_only.bias = (0.3f32 / 0.7).ln();
        let with_sha = Context {
            edge_model_sha256: Some(sha),
            ..ctx()
        };
        let prompt = "Is the sentiment of this review negative, neutral or positive?\nReview: \
                      The pizza was wonderful!\nSentiment:";
        let decide =
            |m: &QualityModel| decide_with(&[prompt], None, &with_sha, &Policy::default(), Ok(m));
        let at_half = decide(&model);
        assert_eq!(at_half.target, Target::Edge, "{:?}", at_half.reasons);
        model.pre_generation_share = 0.7;
        let at_seven_tenths = decide(&model);
        assert_ne!(at_seven_tenths.target, Target::Edge);
        assert!(
            at_seven_tenths.reasons[0].contains("(bar 0.35;"),
            "{:?}",
            at_seven_tenths.reasons
        );
    }
}
