//! Signals read from the request text: expected output length and prompt size (the
//! language is [`crate::language`]'s).

use serde::{Deserialize, Serialize};

use crate::task::TaskGuess;

/// Below this confidence the task type does not move the length estimate.
const TASK_CONFIDENCE_FLOOR: f32 = 0.35;

/// How long an answer the prompt asks for.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct OutputEstimate {
    pub tokens: u32,
    /// What the estimate rests on: `max_tokens`, a cue word, or the default.
    pub basis: &'static str,
}

const LONG_CUES: &[&str] = &[
    "essay",
    "in detail",
    "detailed",
    "step by step",
    "comprehensive",
    "write a story",
    "write a report",
    "article",
    "详细",
    "文章",
    "论文",
    "报告",
];
const SHORT_CUES: &[&str] = &[
    "one word",
    "yes or no",
    "briefly",
    "in one sentence",
    "short answer",
    "简短",
    "一句话",
];

/// Expected completion tokens: cue words first, then the task type's typical length, then
/// a default; an explicit `max_tokens` caps it.
pub fn expected_output(
    text: &str,
    task: Option<TaskGuess>,
    max_tokens: Option<u32>,
) -> OutputEstimate {
    let lower = text.to_lowercase();
    let (tokens, basis) = if LONG_CUES.iter().any(|c| lower.contains(c)) {
        (1024, "long-form cue")
    } else if SHORT_CUES.iter().any(|c| lower.contains(c)) {
        (24, "short-answer cue")
    } else if let Some(t) = task.filter(|t| t.confidence >= TASK_CONFIDENCE_FLOOR) {
        (t.task.typical_output_tokens(), "task type")
    } else {
        (160, "default")
    };
    match max_tokens {
        Some(m) if m < tokens => OutputEstimate {
            tokens: m,
            basis: "max_tokens",
        },
        _ => OutputEstimate { tokens, basis },
    }
}

/// What a request holds its answer to: JSON under a schema, or a call to one of its tools.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct StructuredOutput {
    /// The schema's size as JSON text (the tools' definitions for a call); 0 for any JSON
    /// object.
    pub schema_bytes: u32,
    /// The answer may be a tool call.
    #[serde(default)]
    pub tool_call: bool,
}

/// Schemas up to this size describe the short answers the edge is meant to keep:
/// labels, extracted fields, a call's few arguments.
pub const SMALL_SCHEMA_BYTES: u32 = 1024;

impl StructuredOutput {
    /// Expected tokens of an answer held to this schema: a JSON answer restates the schema's
    /// property names with short values, so it grows with the schema, not with the prompt's
    /// cue words. A prior (about a token per eight schema bytes, beside the braces), capped
    /// where `max_tokens` caps it.
    pub fn expected_output(self, max_tokens: Option<u32>) -> OutputEstimate {
        let tokens = (16 + self.schema_bytes / 8).min(512);
        match max_tokens {
            Some(m) if m < tokens => OutputEstimate {
                tokens: m,
                basis: "max_tokens",
            },
            _ => OutputEstimate {
                tokens,
                basis: "schema size",
            },
        }
    }

    /// Whether the schema is small enough to count as an edge-friendly request.
    pub fn is_small(self) -> bool {
        self.schema_bytes <= SMALL_SCHEMA_BYTES
    }
}

/// Rough prompt token count without a tokenizer: ~4 bytes a token for Latin text, one a
/// character for CJK (a conservative bound used for cost and latency only).
pub fn prompt_tokens_estimate(text: &str) -> u32 {
    let cjk = text.chars().filter(|&c| (c as u32) >= 0x2E80).count();
    let rest = text.len().saturating_sub(cjk * 3);
    (cjk + rest.div_ceil(4)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_estimate_follows_cues_task_and_max_tokens() {
        use crate::task::{TaskGuess, TaskType};
        assert_eq!(
            expected_output("Write an essay about rivers", None, None).tokens,
            1024
        );
        let code = TaskGuess {
            task: TaskType::Code,
            confidence: 0.8,
        };
        assert_eq!(
            expected_output("Sort a list in Go", Some(code), None),
            OutputEstimate {
                tokens: 400,
                basis: "task type"
            }
        );
        let unsure = TaskGuess {
            confidence: 0.2,
            ..code
        };
        assert_eq!(
            expected_output("Sort a list in Go", Some(unsure), None).basis,
            "default"
        );
        assert_eq!(
            expected_output("Write an essay about rivers", None, Some(100)),
            OutputEstimate {
                tokens: 100,
                basis: "max_tokens"
            }
        );
        assert_eq!(
            expected_output("Answer yes or no: is water wet?", Some(code), None).tokens,
            24
        );
        assert_eq!(
            expected_output("请详细介绍长城", None, None).basis,
            "long-form cue"
        );
    }
}
