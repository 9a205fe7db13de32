//! An on-disk cache of a model's answers, one JSON line each, so an evaluation or a training
//! run asks each prompt once and an interrupted run loses one answer at most.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::path::Path;

use anyhow::Context;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::question::Question;

/// A model's answers through its on-disk cache: the edge model run here, or a cloud endpoint.
pub trait Answerer {
    /// What one answer gives back.
    type Answer;
    /// Whether `q` is answered already (a cache hit costs nothing).
    fn is_cached(&self, q: &Question) -> bool;
    /// The answer to `q`, from the cache or by asking the model.
    fn answer(&mut self, q: &Question) -> anyhow::Result<Self::Answer>;
}

#[derive(Serialize, Deserialize)]
struct Line<V> {
    key: String,
    #[serde(flatten)]
    value: V,
}

/// Answers by key, read from a JSON-lines file that new answers are appended to.
pub struct AnswerCache<V> {
    answers: HashMap<String, V>,
    file: std::fs::File,
}

impl<V: Serialize + DeserializeOwned + Clone> AnswerCache<V> {
    /// Reads the answers at `path` (creating its folder and file as needed).
    pub fn open(path: &Path) -> anyhow::Result<Self> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let answers = read(path)?;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("opening {}", path.display()))?;
        Ok(AnswerCache { answers, file })
    }

    /// The answer under `key`, if one is cached.
    pub fn get(&self, key: &str) -> Option<&V> {
        self.answers.get(key)
    }

    /// Keeps `value` under `key`, on disk first.
    pub fn insert(&mut self, key: String, value: V) -> anyhow::Result<()> {
        let line = serde_json::to_string(&Line {
            key: key.clone(),
            value: value.clone(),
        })?;
        // One write a line: two runs may append to one cache, and a single appended write is
        // not interleaved with another's.
        self.file
            .write_all(format!("{line}\n").as_bytes())
            .context("writing the answer cache")?;
        self.answers.insert(key, value);
        Ok(())
    }
}

fn read<V: DeserializeOwned>(path: &Path) -> anyhow::Result<HashMap<String, V>> {
    let mut out = HashMap::new();
    let Ok(f) = std::fs::File::open(path) else {
        return Ok(out);
    };
    for line in std::io::BufReader::new(f).lines() {
        let line = line.with_context(|| format!("reading {}", path.display()))?;
        // A line cut short by an interrupted run is skipped: that answer is recomputed.
        if let Ok(l) = serde_json::from_str::<Line<V>>(&line) {
            out.insert(l.key, l.value);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct Said {
        answer: String,
    }

    fn said(a: &str) -> Said {
        Said { answer: a.into() }
    }

    #[test]
    fn answers_survive_a_reopen_and_a_torn_last_line_is_skipped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sub/answers.jsonl");
        let mut cache = AnswerCache::open(&path).expect("open");
        cache.insert("a".into(), said("first")).expect("insert");
        cache.insert("b".into(), said("second")).expect("insert");
        drop(cache);
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(b"{\"key\":\"c\",\"ans"))
            .expect("tear");
        let cache = AnswerCache::<Said>::open(&path).expect("reopen");
        assert_eq!(cache.get("a"), Some(&said("first")));
        assert_eq!(cache.get("b"), Some(&said("second")));
        assert_eq!(cache.get("c"), None);
    }
}
