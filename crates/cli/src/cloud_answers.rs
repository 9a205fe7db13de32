//! A cloud endpoint's graded answers: any OpenAI-compatible server (`straddle-cloud`,
//! llama.cpp's `llama-server`, a hosted API) asked each prompt as the page asks it (one user
//! turn, greedy, the answer's room as on the edge), graded as the edge's answers are, and
//! cached on disk under the model the endpoint names, so each prompt is asked once.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use straddle_engine::{ChatMessage, GenerateParams};

use crate::answer_cache::{AnswerCache, Answerer};
use crate::cloud_client;
use crate::edge_answers::AnswerGrader;
use crate::question::Question;

/// How long one answer may take: a long program on a slow server.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(900);

/// What the cache keeps of an answer: its text (graded on load, so a better reading of
/// answers asks nothing again).
#[derive(Clone, Serialize, Deserialize)]
struct Said {
    answer: String,
}

/// Asks one endpoint, through its on-disk cache.
pub struct EndpointGrader {
    base: String,
    model: String,
    cache: AnswerCache<Said>,
    grader: AnswerGrader,
}

impl EndpointGrader {
    /// Asks `base` which model it serves and opens that model's cache under `cache_dir`.
    pub fn open(base: &str, cache_dir: &Path) -> anyhow::Result<Self> {
        let model = served_model(base)?;
        let name = hex::encode(Sha256::digest(model.as_bytes()));
        let cache = AnswerCache::open(&cache_dir.join(format!("cloud-{}.jsonl", &name[..16])))?;
        Ok(EndpointGrader {
            base: base.to_string(),
            model,
            cache,
            grader: AnswerGrader::default(),
        })
    }

    /// The model the endpoint says it serves.
    pub fn model(&self) -> &str {
        &self.model
    }
}

impl Answerer for EndpointGrader {
    /// Whether the endpoint's answer is right.
    type Answer = bool;

    fn is_cached(&self, q: &Question) -> bool {
        self.cache.get(&q.cache_key()).is_some()
    }

    /// Whether the endpoint's answer to `q` is right, asking it when no answer is cached.
    fn answer(&mut self, q: &Question) -> anyhow::Result<bool> {
        let key = q.cache_key();
        let answer = match self.cache.get(&key) {
            Some(said) => said.answer.clone(),
            None => self.ask(q, key)?,
        };
        self.grader.grade(q, &answer)
    }
}

impl EndpointGrader {
    fn ask(&mut self, q: &Question, key: String) -> anyhow::Result<String> {
        let params = GenerateParams {
            max_tokens: q.max_tokens(),
            ..GenerateParams::default()
        };
        let messages = [ChatMessage::new("user", q.prompt())];
        let answer =
            cloud_client::answer_until(&self.base, &messages, &params, ANSWER_TIMEOUT, |text| {
                q.is_graded_by(text)
            })?;
        let said = Said {
            answer: answer.clone(),
        };
        self.cache.insert(key, said)?;
        Ok(answer)
    }
}

/// The first model `GET /v1/models` lists.
fn served_model(base: &str) -> anyhow::Result<String> {
    #[derive(Deserialize)]
    struct Models {
        data: Vec<Entry>,
    }
    #[derive(Deserialize)]
    struct Entry {
        id: String,
    }
    let url = format!("{}/v1/models", base.trim_end_matches('/'));
    let body = ureq::get(&url)
        .call()
        .with_context(|| format!("GET {url}"))?
        .body_mut()
        .read_to_string()
        .with_context(|| format!("reading {url}"))?;
    let models: Models =
        serde_json::from_str(&body).with_context(|| format!("{url} is not a model list"))?;
    models
        .data
        .into_iter()
        .next()
        .map(|m| m.id)
        .with_context(|| format!("{url} lists no model"))
}
