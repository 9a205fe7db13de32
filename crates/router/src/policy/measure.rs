//! What the request says: personal data, language, task, expected size.

use super::config::Policy;
use super::context::Context;
use crate::pii::{self, EntityKind};
use crate::quality;
use crate::signals;

/// What the request says: personal data, language, task, expected size.
pub(super) struct Measured {
    /// The whole conversation, as it would be uploaded.
    pub(super) conversation: String,
    pub(super) pii: Vec<EntityKind>,
    /// The kinds of personal data at or above the policy's keep-on-device level.
    pub(super) private: Vec<EntityKind>,
    pub(super) tagger: Result<String, String>,
    pub(super) lang: &'static str,
    pub(super) lang_ok: bool,
    pub(super) read: quality::Turn,
    pub(super) prompt_tokens: u32,
    pub(super) fits_edge: bool,
}

impl Measured {
    pub(super) fn read(
        turns: &[&str],
        max_tokens: Option<u32>,
        ctx: &Context,
        policy: &Policy,
    ) -> Self {
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

    pub(super) fn output_tokens(&self) -> u32 {
        self.read.output.tokens
    }

    pub(super) fn language_warning(&self) -> Option<String> {
        (!self.lang_ok).then(|| {
            format!(
                "quality warning: the edge model does not support language `{}`",
                self.lang
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::test_support::{ctx, signal};
    use crate::policy::{Target, decide, decide_conversation};

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
}
