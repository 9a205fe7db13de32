//! A model's answers to graded prompts, read the way the product would show them: each
//! prompt goes through the chat template, the model answers greedily, and the answer is parsed
//! (a letter, a choice, a final number, a program run against its tests). Choice-shaped
//! questions are also scored the older way (the letters' logits, each choice's
//! log-likelihood), for comparison. Beside each grade, what the router reads after prefill:
//! the first token's confidence and the final hidden state at the prompt's last position.
//! Answers are cached on disk, keyed by the model's SHA-256 and the question, so a re-run
//! costs seconds.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use serde::{Deserialize, Serialize};
use straddle_engine::sample;
use straddle_engine::{ChatMessage, Engine, GenerateParams, KvCache, Prompt};
use straddle_router::quality::EdgeSignals;

use crate::answer_cache::{AnswerCache, Answerer};
use crate::answer_text::{final_number, parse_choice, parse_letter};
use crate::code_grade;
use crate::model_file;
use crate::question::Question;

/// Grades shown answers against their keys; finds Python on the first program.
#[derive(Default)]
pub struct AnswerGrader {
    python: Option<PathBuf>,
}

impl AnswerGrader {
    /// Whether `answer`, as the product would show it, answers `q` rightly.
    pub fn grade(&mut self, q: &Question, answer: &str) -> anyhow::Result<bool> {
        Ok(match q {
            Question::Letter { prompt, key } => parse_letter(answer, prompt) == Some(*key),
            Question::Choice { choices, key, .. } => parse_choice(answer, choices) == Some(*key),
            Question::Number { key, .. } => {
                final_number(answer).is_some_and(|g| (g - key).abs() < 1e-6)
            }
            Question::Contains { keys, .. } => {
                let lower = answer.to_lowercase();
                keys.iter().any(|k| lower.contains(&k.to_lowercase()))
            }
            Question::Code { setup, tests, .. } => {
                if self.python.is_none() {
                    self.python = Some(code_grade::python()?);
                }
                let python = self.python.as_deref().unwrap_or(Path::new("python3"));
                code_grade::passes(python, answer, setup, tests)?
            }
        })
    }
}

/// Most choices a question may have for the older, log-likelihood reading.
const MAX_SCORED_CHOICES: usize = 16;

/// A model's graded answer and what the router reads after its prefill. The cache keeps the
/// answer, not its grade: a better reading of answers costs no model run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EdgeAnswer {
    /// Whether the answer the product would show (generated, then parsed) is right.
    #[serde(skip)]
    pub correct: bool,
    /// For choice-shaped questions, the older reading: the letters' logits at the first
    /// position, or each choice's log-likelihood.
    #[serde(default)]
    pub scored_correct: Option<bool>,
    /// The generated answer.
    pub answer: String,
    /// The first token's confidence.
    pub signals: EdgeSignals,
    /// The final hidden state at the prompt's last position.
    #[serde(default)]
    pub state: Vec<f32>,
    /// Prompt tokens and the seconds their prefill took.
    #[serde(default)]
    pub prompt_tokens: usize,
    #[serde(default)]
    pub prefill_s: f64,
}

/// Runs one model over questions, through its on-disk cache.
pub struct EdgeGrader {
    engine: Engine,
    sha256: String,
    cache: AnswerCache<EdgeAnswer>,
    grader: AnswerGrader,
}

impl EdgeGrader {
    /// Loads the model and the cache kept for it under `cache_dir`.
    pub fn open(model: &Path, cache_dir: &Path) -> anyhow::Result<Self> {
        let sha256 = model_file::sha256(model)?;
        let engine = model_file::load_engine(model)?;
        let cache = AnswerCache::open(&cache_dir.join(format!("{}.jsonl", &sha256[..16])))?;
        Ok(EdgeGrader {
            engine,
            sha256,
            cache,
            grader: AnswerGrader::default(),
        })
    }

    /// SHA-256 of the model file, hex.
    pub fn sha256(&self) -> &str {
        &self.sha256
    }
}

impl Answerer for EdgeGrader {
    type Answer = EdgeAnswer;

    fn is_cached(&self, q: &Question) -> bool {
        self.cache.get(&q.cache_key()).is_some()
    }

    /// The graded answer to `q`, from the cache or by running the model.
    fn answer(&mut self, q: &Question) -> anyhow::Result<EdgeAnswer> {
        let key = q.cache_key();
        if let Some(a) = self.cache.get(&key).cloned() {
            let correct = self.grader.grade(q, &a.answer)?;
            return Ok(EdgeAnswer { correct, ..a });
        }
        let answer = self.run(q)?;
        self.cache.insert(key, answer.clone())?;
        Ok(answer)
    }
}

impl EdgeGrader {
    /// Prefills the question as a chat turn, reads what the router would, scores a
    /// choice-shaped question the older way, then generates the answer and grades it.
    fn run(&mut self, q: &Question) -> anyhow::Result<EdgeAnswer> {
        let messages = [ChatMessage::new("user", q.prompt())];
        let ids = self.engine.prompt_tokens(Prompt::Messages(&messages))?;
        let started = Instant::now();
        let room = ids.len() + q.max_tokens() + 1;
        let (ids, cache, logits) = self.engine.prefill(Prompt::Tokens(&ids), room)?;
        let prefill_s = started.elapsed().as_secs_f64();
        let c = sample::confidence(&logits);
        let signals = EdgeSignals {
            entropy: c.entropy,
            logprob: c.logprob,
            margin: c.margin,
        };
        let state = cache.last_state().map(<[f32]>::to_vec).unwrap_or_default();
        let scored_correct = self.scored(q, &cache, &logits)?;
        let prompt_tokens = ids.len();
        let answer = self.generate((ids, cache, logits), q)?;
        Ok(EdgeAnswer {
            correct: self.grader.grade(q, &answer)?,
            scored_correct,
            answer,
            signals,
            state,
            prompt_tokens,
            prefill_s,
        })
    }

    /// The greedy answer from a prefilled prompt, stopped once it holds all that grading
    /// reads ([`Question::is_graded_by`]).
    fn generate(
        &self,
        prefilled: straddle_engine::Prefilled<KvCache>,
        q: &Question,
    ) -> anyhow::Result<String> {
        let params = GenerateParams {
            max_tokens: q.max_tokens(),
            ..GenerateParams::default()
        };
        let mut seq = self.engine.resume(prefilled, &params);
        let mut text = String::new();
        while let Some(event) = self.engine.next_token(&mut seq)? {
            text.push_str(&event.text);
            if q.is_graded_by(&text) {
                seq.cancel();
                break;
            }
            self.engine.advance(&mut [&mut seq])?;
        }
        Ok(seq.into_completion().text)
    }

    /// The older reading of a choice-shaped question, from the prompt's logits and cache.
    fn scored(
        &self,
        q: &Question,
        cache: &KvCache,
        logits: &[f32],
    ) -> anyhow::Result<Option<bool>> {
        Ok(match q {
            Question::Letter { key, .. } => Some(self.letter_logit(logits)? == *key),
            // A pass per choice: beyond a handful (Banking77's 77 topics) the older reading
            // costs more than the answer, and only routine sets are compared on it.
            Question::Choice { choices, key, .. } if choices.len() <= MAX_SCORED_CHOICES => {
                Some(self.likeliest_choice(cache, logits, choices)? == *key)
            }
            _ => None,
        })
    }

    /// The letter A–D whose token (bare or after a space) has the largest first logit.
    fn letter_logit(&self, logits: &[f32]) -> anyhow::Result<char> {
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
        Ok(best.0)
    }

    /// The choice with the largest log-likelihood after the prompt.
    fn likeliest_choice(
        &self,
        cache: &KvCache,
        logits: &[f32],
        choices: &[String],
    ) -> anyhow::Result<usize> {
        let mut best = (0, f32::NEG_INFINITY);
        for (i, choice) in choices.iter().enumerate() {
            let ids = self.engine.tokenizer.encode(choice)?;
            let mut scratch = cache
                .prefix(cache.len())
                .context("copying the prompt's cache")?;
            scratch.reserve(cache.len() + ids.len() + 1);
            let score = self.choice_logprob(&mut scratch, logits, &ids)?;
            if score > best.1 {
                best = (i, score);
            }
        }
        Ok(best.0)
    }

    /// log p(choice | prompt): the first token from the prompt's logits, the rest from one
    /// pass over the choice on the prompt's cache.
    fn choice_logprob(
        &self,
        cache: &mut KvCache,
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
}

/// Where answers are cached: `$STRADDLE_CACHE/edge-answers` (default `~/.cache/straddle`).
pub fn default_cache_dir() -> PathBuf {
    straddle_models::cache_dir().join("edge-answers")
}
