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
