//! A graded prompt: what is asked, how an answer is graded, and what its answer is cached
//! under.

use sha2::{Digest, Sha256};

use crate::answer_text;
use crate::code_grade;

/// Changes when what an answer records changes, so an older cache line is recomputed.
const CACHE_VERSION: &str = "answers/3";

/// What is asked and how an answer is graded.
#[derive(Debug, Clone, PartialEq)]
pub enum Question {
    /// A multiple-choice prompt whose options are lettered (`A. …`); the key is the letter.
    Letter { prompt: String, key: char },
    /// A routine prompt with fixed answers; the key is the right one's index.
    Choice {
        prompt: String,
        choices: Vec<String>,
        key: usize,
    },
    /// A word problem; the key is the final number.
    Number { prompt: String, key: f64 },
    /// A short free-form question; right when the answer names one of the keys.
    Contains { prompt: String, keys: Vec<String> },
    /// A programming task; right when the answer's code passes `tests` after `setup`.
    Code {
        prompt: String,
        setup: String,
        tests: Vec<String>,
    },
}

impl Question {
    /// The text the user sends.
    pub fn prompt(&self) -> &str {
        match self {
            Question::Letter { prompt, .. }
            | Question::Choice { prompt, .. }
            | Question::Number { prompt, .. }
            | Question::Contains { prompt, .. }
            | Question::Code { prompt, .. } => prompt,
        }
    }

    /// What an answer is cached under: the question and what shapes its answer.
    pub fn cache_key(&self) -> String {
        let mut h = Sha256::new();
        h.update(format!("{CACHE_VERSION}\0"));
        // Answers of another length are other answers.
        if let Question::Letter { .. } = self {
            h.update(format!("max_tokens {}\0", self.max_tokens()));
        }
        match self {
            Question::Letter { prompt, key } => h.update(format!("letter\0{prompt}\0{key}")),
            Question::Choice {
                prompt,
                choices,
                key,
            } => h.update(format!("choice\0{prompt}\0{}\0{key}", choices.join("\0"))),
            Question::Number { prompt, key } => h.update(format!("number\0{prompt}\0{key}")),
            Question::Contains { prompt, keys } => {
                h.update(format!("contains\0{prompt}\0{}", keys.join("\0")))
            }
            Question::Code {
                prompt,
                setup,
                tests,
            } => h.update(format!("code\0{prompt}\0{setup}\0{}", tests.join("\0"))),
        }
        hex::encode(h.finalize())
    }

    /// Most tokens the answer may take: room for what this kind of answer needs.
    pub fn max_tokens(&self) -> usize {
        match self {
            // A chat model often reasons through the options before it names one: cut short,
            // an answer would be graded on its length, not on what it concludes.
            Question::Letter { .. } => 384,
            Question::Contains { .. } => 32,
            Question::Choice { .. } => 24,
            Question::Number { .. } => 320,
            Question::Code { .. } => 512,
        }
    }

    /// Whether `text` already holds all that grading reads, so generating more would change
    /// no grade: a program's answer is read from its first code block
    /// ([`code_grade::code_of`]), so it is complete once that block closes, and a letter
    /// that opens the answer is the answer; the explanation after either would cost minutes
    /// a set.
    pub fn is_graded_by(&self, text: &str) -> bool {
        match self {
            Question::Code { .. } => code_grade::closes_block(text),
            Question::Letter { prompt, .. } => answer_text::opens_with_letter(text, prompt),
            _ => false,
        }
    }
}
