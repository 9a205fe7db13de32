//! `straddle train-router`: fits the task-type model to a labelled corpus, reports its
//! accuracy on a held-out split, then fits it to the whole corpus and writes the model the
//! router bundles.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, bail};
use straddle_router::task::{self, TaskExample, TaskType};

/// Held-out accuracy, overall and per class and language.
#[derive(Debug)]
pub struct Report {
    pub train: usize,
    pub held_out: usize,
    pub correct: usize,
    /// (label, held out, correct).
    pub per_class: Vec<(TaskType, usize, usize)>,
    /// (language, held out, correct).
    pub per_lang: Vec<(String, usize, usize)>,
    pub model_bytes: usize,
}

impl Report {
    /// The report as a table.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let pct = |c: usize, n: usize| {
            if n == 0 {
                0.0
            } else {
                100.0 * c as f64 / n as f64
            }
        };
        let _ = writeln!(
            out,
            "trained on {} examples; held-out accuracy {}/{} = {:.1}% (chance {:.1}%); model {} KiB",
            self.train,
            self.correct,
            self.held_out,
            pct(self.correct, self.held_out),
            100.0 / TaskType::ALL.len() as f64,
            self.model_bytes / 1024
        );
        for (t, n, c) in &self.per_class {
            let _ = writeln!(
                out,
                "  {:<15} {c:>3}/{n:<3} {:>5.1}%",
                t.as_str(),
                pct(*c, *n)
            );
        }
        for (l, n, c) in &self.per_lang {
            let _ = writeln!(out, "  lang {l:<10} {c:>3}/{n:<3} {:>5.1}%", pct(*c, *n));
        }
        out
    }
}

/// Reads a JSONL corpus of `{"text", "label", "lang"}` lines.
pub fn read_corpus(path: &Path) -> anyhow::Result<Vec<TaskExample>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut corpus = Vec::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let e: TaskExample = serde_json::from_str(line)
            .with_context(|| format!("{}: line {}", path.display(), i + 1))?;
        if e.text.trim().is_empty() {
            bail!("{}: line {}: empty text", path.display(), i + 1);
        }
        corpus.push(e);
    }
    Ok(corpus)
}

/// Trains, evaluates on the held-out split, and writes the all-data model to `out`.
pub fn run(corpus: &[TaskExample], out: &Path) -> anyhow::Result<Report> {
    let (train, held) = task::split(corpus);
    let model = task::train(&train, "held-out evaluation").context("training")?;
    let mut per_class: Vec<(TaskType, usize, usize)> =
        TaskType::ALL.iter().map(|&t| (t, 0, 0)).collect();
    let mut per_lang: Vec<(String, usize, usize)> = Vec::new();
    let mut correct = 0;
    for e in &held {
        let ok = task::classify_with(&model, &e.text).task == e.label;
        correct += usize::from(ok);
        let c = &mut per_class[e.label as usize];
        c.1 += 1;
        c.2 += usize::from(ok);
        match per_lang.iter_mut().find(|(l, _, _)| *l == e.lang) {
            Some(l) => {
                l.1 += 1;
                l.2 += usize::from(ok);
            }
            None => per_lang.push((e.lang.clone(), 1, usize::from(ok))),
        }
    }
    let all: Vec<&TaskExample> = corpus.iter().collect();
    let bytes = task::train(&all, task::PROVENANCE)
        .context("training on the whole corpus")?
        .to_bytes();
    std::fs::write(out, &bytes).with_context(|| format!("writing {}", out.display()))?;
    Ok(Report {
        train: train.len(),
        held_out: held.len(),
        correct,
        per_class,
        per_lang,
        model_bytes: bytes.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn training_the_committed_corpus_reproduces_the_bundled_model() {
        let root = crate::test_support::manifest_dir().join("../router/data");
        let corpus = read_corpus(&root.join("tasks.jsonl")).expect("corpus");
        let out = std::env::temp_dir().join(format!("task-model-{}.bin", std::process::id()));
        let report = run(&corpus, &out).expect("train");
        let written = std::fs::read(&out).expect("model");
        let _ = std::fs::remove_file(&out);
        assert_eq!(written, task::BUNDLED_MODEL);
        assert_eq!(report.train + report.held_out, corpus.len());
        assert!(report.render().contains("held-out accuracy"));
    }

    #[test]
    fn a_bad_corpus_line_is_named() {
        let path = std::env::temp_dir().join(format!("bad-corpus-{}.jsonl", std::process::id()));
        std::fs::write(
            &path,
            "{\"text\":\"hi\",\"label\":\"chit_chat\",\"lang\":\"en\"}\n{\"text\":\"x\",\"label\":\"poetry\",\"lang\":\"en\"}\n",
        )
        .expect("write");
        let err = format!("{:#}", read_corpus(&path).expect_err("unknown label"));
        let _ = std::fs::remove_file(&path);
        assert!(err.contains("line 2"), "{err}");
    }
}
