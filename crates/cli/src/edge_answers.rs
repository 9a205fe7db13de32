//! The edge model's answers to graded prompts, with the first-token signals the router sees
//! after prefill: multiple choice by the letter logits, routine choices by log-likelihood,
//! arithmetic by generating and reading the final number. Answers are cached on disk, keyed
//! by the model's SHA-256 and the prompt, so a re-run costs seconds.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use straddle_engine::sample::{self, Rng, SamplingParams};
use straddle_engine::{ChatMessage, Engine, Flow, GenerateParams, Prompt};
use straddle_router::quality::EdgeSignals;

/// What is asked and how an answer is graded.
#[derive(Debug, Clone, PartialEq)]
pub enum Question {
    /// An MMLU-style prompt ending in `Answer:`; the key is the letter.
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
}

impl Question {
    /// The text the user sends.
    pub fn prompt(&self) -> &str {
        match self {
            Question::Letter { prompt, .. }
            | Question::Choice { prompt, .. }
            | Question::Number { prompt, .. }
            | Question::Contains { prompt, .. } => prompt,
        }
    }

    fn cache_key(&self) -> String {
        let mut h = Sha256::new();
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
        }
        hex::encode(h.finalize())
    }
}

/// The edge's graded answer and its first-token signals.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EdgeAnswer {
    pub correct: bool,
    pub answer: String,
    pub signals: EdgeSignals,
}

#[derive(Serialize, Deserialize)]
struct CacheLine {
    key: String,
    #[serde(flatten)]
    answer: EdgeAnswer,
}

/// Longest generation for a word problem: room for a short worked answer.
const MAX_SOLUTION_TOKENS: usize = 256;
/// Longest generation for a short free-form question: the answer comes in its first words.
const MAX_SHORT_ANSWER_TOKENS: usize = 32;

/// Runs one edge model over questions, through its on-disk cache.
pub struct EdgeGrader {
    engine: Engine,
    sha256: String,
    cache: HashMap<String, EdgeAnswer>,
    cache_file: std::fs::File,
}

impl EdgeGrader {
    /// Loads the model and the cache kept for it under `cache_dir`.
    pub fn open(model: &Path, cache_dir: &Path) -> anyhow::Result<Self> {
        let sha256 = file_sha256(model)?;
        let engine = crate::chat::load_engine(model)?;
        std::fs::create_dir_all(cache_dir)
            .with_context(|| format!("creating {}", cache_dir.display()))?;
        let path = cache_dir.join(format!("{}.jsonl", &sha256[..16]));
        let cache = read_cache(&path)?;
        let cache_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        Ok(EdgeGrader {
            engine,
            sha256,
            cache,
            cache_file,
        })
    }

    /// SHA-256 of the model file, hex.
    pub fn sha256(&self) -> &str {
        &self.sha256
    }

    /// Whether `q` is answered already (a cache hit costs nothing).
    pub fn is_cached(&self, q: &Question) -> bool {
        self.cache.contains_key(&q.cache_key())
    }

    /// The edge's graded answer to `q`, from the cache or by running the model.
    pub fn answer(&mut self, q: &Question) -> anyhow::Result<EdgeAnswer> {
        let key = q.cache_key();
        if let Some(a) = self.cache.get(&key) {
            return Ok(a.clone());
        }
        let answer = self.run(q)?;
        let line = serde_json::to_string(&CacheLine {
            key: key.clone(),
            answer: answer.clone(),
        })?;
        writeln!(self.cache_file, "{line}").context("writing the answer cache")?;
        self.cache.insert(key, answer.clone());
        Ok(answer)
    }

    fn run(&self, q: &Question) -> anyhow::Result<EdgeAnswer> {
        let messages = [ChatMessage::new("user", q.prompt())];
        match q {
            Question::Letter { key, .. } => self.letter(&messages, *key),
            Question::Choice { choices, key, .. } => self.choice(&messages, choices, *key),
            Question::Number { key, .. } => self.number(&messages, *key),
            Question::Contains { keys, .. } => self.contains(&messages, keys),
        }
    }

    /// Prefills the conversation: its cache and the first-token logits and signals.
    fn prefill(
        &self,
        messages: &[ChatMessage],
        room: usize,
    ) -> anyhow::Result<(straddle_engine::KvCache, Vec<f32>, EdgeSignals)> {
        let ids = self.engine.prompt_tokens(Prompt::Messages(messages))?;
        let (_, cache, logits) = self
            .engine
            .prefill(Prompt::Tokens(&ids), ids.len() + room)?;
        let signals = first_token_signals(&logits);
        Ok((cache, logits, signals))
    }

    fn letter(&self, messages: &[ChatMessage], key: char) -> anyhow::Result<EdgeAnswer> {
        let (_, logits, signals) = self.prefill(messages, 1)?;
        let mut best = ('?', f32::NEG_INFINITY);
        for letter in ['A', 'B', 'C', 'D'] {
            for spelling in [letter.to_string(), format!(" {letter}")] {
                let ids = self.engine.tokenizer.encode(&spelling)?;
                if let [id] = ids[..]
                    && let Some(&l) = logits.get(id as usize)
                    && l > best.1
                {
                    best = (letter, l);
                }
            }
        }
        Ok(EdgeAnswer {
            correct: best.0 == key,
            answer: best.0.to_string(),
            signals,
        })
    }

    fn choice(
        &self,
        messages: &[ChatMessage],
        choices: &[String],
        key: usize,
    ) -> anyhow::Result<EdgeAnswer> {
        let encoded: Vec<Vec<u32>> = choices
            .iter()
            .map(|c| self.engine.tokenizer.encode(c))
            .collect::<Result<_, _>>()?;
        let room = encoded.iter().map(Vec::len).max().unwrap_or(0) + 1;
        let (mut cache, logits, signals) = self.prefill(messages, room)?;
        let start = cache.len();
        let mut best = (0, f32::NEG_INFINITY);
        for (i, ids) in encoded.iter().enumerate() {
            let score = self.choice_logprob(&mut cache, &logits, ids)?;
            cache.truncate(start);
            if score > best.1 {
                best = (i, score);
            }
        }
        Ok(EdgeAnswer {
            correct: best.0 == key,
            answer: choices.get(best.0).cloned().unwrap_or_default(),
            signals,
        })
    }

    /// log p(choice | prompt): the first token from the prompt's logits, the rest from one
    /// pass over the choice on the prompt's cache.
    fn choice_logprob(
        &self,
        cache: &mut straddle_engine::KvCache,
        first_logits: &[f32],
        ids: &[u32],
    ) -> anyhow::Result<f32> {
        let Some((&first, _)) = ids.split_first() else {
            return Ok(f32::NEG_INFINITY);
        };
        let mut total = sample::log_softmax(first_logits)[first as usize];
        if ids.len() > 1 {
            let logits = self
                .engine
                .model
                .forward(&ids[..ids.len() - 1], cache, true)?;
            for (l, &next) in logits.iter().zip(&ids[1..]) {
                total += sample::log_softmax(l)[next as usize];
            }
        }
        Ok(total)
    }

    fn number(&self, messages: &[ChatMessage], key: f64) -> anyhow::Result<EdgeAnswer> {
        let (text, signals) = self.generate(messages, MAX_SOLUTION_TOKENS)?;
        let got = final_number(&text);
        Ok(EdgeAnswer {
            correct: got.is_some_and(|g| (g - key).abs() < 1e-6),
            answer: got.map(|g| g.to_string()).unwrap_or_default(),
            signals,
        })
    }

    fn contains(&self, messages: &[ChatMessage], keys: &[String]) -> anyhow::Result<EdgeAnswer> {
        let (text, signals) = self.generate(messages, MAX_SHORT_ANSWER_TOKENS)?;
        let lower = text.to_lowercase();
        Ok(EdgeAnswer {
            correct: keys.iter().any(|k| lower.contains(&k.to_lowercase())),
            answer: text,
            signals,
        })
    }

    /// A greedy answer and the signals of its first token.
    fn generate(
        &self,
        messages: &[ChatMessage],
        max_tokens: usize,
    ) -> anyhow::Result<(String, EdgeSignals)> {
        let params = GenerateParams {
            max_tokens,
            ..GenerateParams::default()
        };
        let done = self
            .engine
            .generate(Prompt::Messages(messages), &params, |_| Flow::Continue)?;
        let signals = EdgeSignals {
            entropy: done.entropies.first().copied().unwrap_or(f32::NAN),
            logprob: done.logprobs.first().copied().unwrap_or(f32::NAN),
        };
        Ok((done.text, signals))
    }
}

/// The signals of the distribution the first answer token is drawn from, as the engine
/// reports them for every token it streams (greedy choice).
fn first_token_signals(logits: &[f32]) -> EdgeSignals {
    let s = sample::sample(logits, &SamplingParams::default(), &[], &mut Rng::new(0));
    EdgeSignals {
        entropy: s.entropy,
        logprob: s.logprob,
    }
}

/// The last number in a text (`1,234.5` reads as 1234.5), the usual GSM8K grading.
pub fn final_number(text: &str) -> Option<f64> {
    let mut last = None;
    let mut current = String::new();
    for c in text.chars().chain([' ']) {
        if c.is_ascii_digit()
            || (c == '.' && !current.is_empty())
            || (c == ',' && !current.is_empty())
        {
            current.push(c);
        } else if !current.is_empty() {
            let cleaned: String = current.trim_end_matches(['.', ',']).replace(',', "");
            last = cleaned.parse().ok().or(last);
            current.clear();
        }
    }
    last
}

/// SHA-256 of a file, hex.
pub fn file_sha256(path: &Path) -> anyhow::Result<String> {
    let mut f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut h = Sha256::new();
    std::io::copy(&mut f, &mut h).with_context(|| format!("reading {}", path.display()))?;
    Ok(hex::encode(h.finalize()))
}

fn read_cache(path: &Path) -> anyhow::Result<HashMap<String, EdgeAnswer>> {
    let mut out = HashMap::new();
    let Ok(f) = std::fs::File::open(path) else {
        return Ok(out);
    };
    for line in std::io::BufReader::new(f).lines() {
        let line = line.with_context(|| format!("reading {}", path.display()))?;
        // A line cut short by an interrupted run is skipped: that answer is recomputed.
        if let Ok(l) = serde_json::from_str::<CacheLine>(&line) {
            out.insert(l.key, l.answer);
        }
    }
    Ok(out)
}

/// Where answers are cached: `$STRADDLE_CACHE/edge-answers` (default `~/.cache/straddle`).
pub fn default_cache_dir() -> PathBuf {
    straddle_engine::default_model_path()
        .parent()
        .and_then(Path::parent)
        .map_or_else(|| PathBuf::from(".cache/straddle"), Path::to_path_buf)
        .join("edge-answers")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_final_number_is_read_as_gsm8k_grades_it() {
        assert_eq!(final_number("16 - 3 - 4 = 9, so 9 * 2 = $18."), Some(18.0));
        assert_eq!(final_number("The answer is 1,234.5 dollars"), Some(1234.5));
        assert_eq!(final_number("no digits"), None);
        assert_eq!(final_number("3 apples and 12."), Some(12.0));
    }
}
