//! "Redact then upload": personal data in a prompt is replaced by typed placeholders
//! (`[EMAIL_1]`) before the prompt leaves the device; the mapping stays on the device and
//! puts the originals back into the cloud's answer, also while it streams in.

use std::collections::HashMap;

use crate::pii::{self, EntityKind};

/// A prompt with its personal data replaced, and the mapping back (which never leaves the
/// device).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redaction {
    /// The text to upload.
    pub text: String,
    /// `(placeholder, original)` in order of first appearance.
    mapping: Vec<(String, String)>,
}

/// The placeholder stem of a class: `EMAIL`, `PAYMENT_CARD`, ….
fn stem(kind: EntityKind) -> String {
    kind.as_str().to_ascii_uppercase()
}

/// Redacts every entity whose class `redact_kind` selects. The same value gets the same
/// placeholder each time it appears, so the cloud model can still refer to it consistently.
pub fn redact(text: &str, redact_kind: impl Fn(EntityKind) -> bool) -> Redaction {
    let mut out = String::with_capacity(text.len());
    let mut mapping: Vec<(String, String)> = Vec::new();
    let mut by_value: HashMap<(EntityKind, &str), usize> = HashMap::new();
    let mut per_kind: HashMap<EntityKind, usize> = HashMap::new();
    let mut last = 0;
    for span in pii::detect_personal(text) {
        if !redact_kind(span.kind) {
            continue;
        }
        let value = &text[span.start..span.end];
        let index = *by_value.entry((span.kind, value)).or_insert_with(|| {
            let n = per_kind.entry(span.kind).or_insert(0);
            *n += 1;
            mapping.push((format!("[{}_{}]", stem(span.kind), n), value.to_string()));
            mapping.len() - 1
        });
        out.push_str(&text[last..span.start]);
        out.push_str(&mapping[index].0);
        last = span.end;
    }
    out.push_str(&text[last..]);
    Redaction { text: out, mapping }
}

impl Redaction {
    /// Whether anything was replaced.
    pub fn is_empty(&self) -> bool {
        self.mapping.is_empty()
    }

    /// The placeholders used, in order of first appearance (safe to log: no values).
    pub fn placeholders(&self) -> impl Iterator<Item = &str> {
        self.mapping.iter().map(|(p, _)| p.as_str())
    }

    /// Puts the originals back into a whole answer.
    pub fn reidentify(&self, answer: &str) -> String {
        let mut stream = self.stream();
        let mut out = stream.push(answer);
        out.push_str(&stream.finish());
        out
    }

    /// A re-identifier for an answer that arrives in chunks (it keeps its own copy of the
    /// mapping, so it can outlive this value, e.g. across a JS boundary).
    pub fn stream(&self) -> StreamReidentifier {
        StreamReidentifier {
            redaction: self.clone(),
            pending: String::new(),
        }
    }

    fn original(&self, placeholder: &str) -> Option<&str> {
        self.mapping
            .iter()
            .find(|(p, _)| p == placeholder)
            .map(|(_, v)| v.as_str())
    }
}

/// Re-identifies a streamed answer: a placeholder split across chunks (`…[EMA` + `IL_1]…`) is
/// held back until it is complete, so the page never shows half a placeholder.
#[derive(Debug, Clone)]
pub struct StreamReidentifier {
    redaction: Redaction,
    pending: String,
}

/// Longest placeholder we hold back for: `[` + stem + `_` + index + `]`.
const MAX_PLACEHOLDER: usize = 32;

impl StreamReidentifier {
    /// Takes the next chunk; returns the text that is now safe to show.
    pub fn push(&mut self, chunk: &str) -> String {
        self.pending.push_str(chunk);
        let mut out = String::with_capacity(self.pending.len());
        let mut rest = self.pending.as_str();
        while let Some(open) = rest.find('[') {
            out.push_str(&rest[..open]);
            let tail = &rest[open..];
            match tail.find(']') {
                Some(close) if close < MAX_PLACEHOLDER => {
                    let candidate = &tail[..=close];
                    match self.redaction.original(candidate) {
                        Some(original) => out.push_str(original),
                        None => out.push_str(candidate),
                    }
                    rest = &tail[close + 1..];
                }
                // Unclosed and still short: it may be a placeholder whose end is in transit.
                None if tail.len() < MAX_PLACEHOLDER && could_be_placeholder(tail) => {
                    let keep = tail.to_string();
                    self.pending = keep;
                    return out;
                }
                _ => {
                    out.push('[');
                    rest = &tail[1..];
                }
            }
        }
        out.push_str(rest);
        self.pending.clear();
        out
    }

    /// Ends the stream; returns whatever was held back.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

/// Whether an unclosed `[…` can still grow into a placeholder: upper-case letters, `_` and
/// digits only.
fn could_be_placeholder(tail: &str) -> bool {
    tail[1..]
        .bytes()
        .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROMPT: &str = "Email jane.doe@example.com or call +1 415 555 0123; \
                          card 4111 1111 1111 1111. Again: jane.doe@example.com";

    #[test]
    fn redaction_replaces_values_with_stable_typed_placeholders() {
        let r = redact(PROMPT, |_| true);
        assert_eq!(
            r.text,
            "Email [EMAIL_1] or call [PHONE_1]; card [PAYMENT_CARD_1]. Again: [EMAIL_1]"
        );
        assert!(!r.text.contains("example.com") && !r.text.contains("4111"));
        assert_eq!(
            r.placeholders().collect::<Vec<_>>(),
            ["[EMAIL_1]", "[PHONE_1]", "[PAYMENT_CARD_1]"]
        );
    }

    #[test]
    fn only_selected_classes_are_redacted() {
        let r = redact(PROMPT, |k| k == EntityKind::PaymentCard);
        assert!(r.text.contains("jane.doe@example.com"));
        assert!(r.text.contains("[PAYMENT_CARD_1]"));
        let none = redact("nothing personal here", |_| true);
        assert!(none.is_empty());
        assert_eq!(none.text, "nothing personal here");
    }

    #[test]
    fn round_trip_restores_the_prompt_and_the_answer() {
        let r = redact(PROMPT, |_| true);
        assert_eq!(r.reidentify(&r.text), PROMPT);
        let answer = "I wrote to [EMAIL_1] about card [PAYMENT_CARD_1]; [UNKNOWN_9] stays.";
        assert_eq!(
            r.reidentify(answer),
            "I wrote to jane.doe@example.com about card 4111 1111 1111 1111; [UNKNOWN_9] stays."
        );
    }

    #[test]
    fn streamed_answers_never_show_half_a_placeholder() {
        let r = redact(PROMPT, |_| true);
        let answer = "Reply to [EMAIL_1] today [see note] and [PHONE_1].";
        // Every split of the answer into two chunks, and one chunk per character.
        for cut in 0..=answer.len() {
            let mut s = r.stream();
            let mut shown = s.push(&answer[..cut]);
            assert!(
                !shown.contains("[EMAIL") && !shown.contains("[PHONE"),
                "{shown}"
            );
            shown.push_str(&s.push(&answer[cut..]));
            shown.push_str(&s.finish());
            assert_eq!(shown, r.reidentify(answer), "cut at {cut}");
        }
        let mut s = r.stream();
        let mut shown: String = answer.chars().map(|c| s.push(&c.to_string())).collect();
        shown.push_str(&s.finish());
        assert_eq!(
            shown,
            "Reply to jane.doe@example.com today [see note] and +1 415 555 0123."
        );
    }

    #[test]
    fn an_unclosed_bracket_is_released_at_the_end_and_long_ones_at_once() {
        let r = redact(PROMPT, |_| true);
        let mut s = r.stream();
        assert_eq!(s.push("array[INDEX"), "array");
        assert_eq!(s.finish(), "[INDEX");
        let mut s = r.stream();
        let long = format!("[{}", "A".repeat(40));
        assert_eq!(s.push(&long), long);
    }
}
