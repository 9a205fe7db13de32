//! `straddle eval routellm`: reads RouteLLM's evaluation files (per-prompt correctness of a
//! weak and a strong model on MMLU and GSM8K, judge scores on MT-Bench), scores every prompt
//! with our cross-fitted difficulty model and with a random router, and prints RouteLLM's
//! metrics for both beside the oracle.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::eval::{self, CurvePoint, Labelled, Outcome, Summary};
use anyhow::{Context, bail};
use serde::Deserialize;
use straddle_router::linear::TrainConfig;

/// RouteLLM's pair.
pub const DEFAULT_WEAK: &str = "mistralai/Mixtral-8x7B-Instruct-v0.1";
pub const DEFAULT_STRONG: &str = "gpt-4-1106-preview";

/// One benchmark's prompts and what each model earned on them.
#[derive(Debug)]
pub struct Benchmark {
    pub name: &'static str,
    /// Judge scores (MT-Bench) rather than 0/1 correctness.
    pub graded: bool,
    pub prompts: Vec<Prompt>,
}

/// A prompt, its group for cross-fitting, and the two models' quality on it.
#[derive(Debug)]
pub struct Prompt {
    pub text: String,
    pub group: String,
    pub outcome: Outcome,
}

impl Benchmark {
    fn quality(&self, pick: impl Fn(&Outcome) -> f64) -> f64 {
        self.prompts.iter().map(|p| pick(&p.outcome)).sum::<f64>() / self.prompts.len() as f64
    }
}

/// Loads every benchmark found under `dir`, in our flat layout or RouteLLM's own.
pub fn load(dir: &Path, weak: &str, strong: &str) -> anyhow::Result<Vec<Benchmark>> {
    if !dir.is_dir() {
        bail!("{} is not a directory", dir.display());
    }
    let mut out = Vec::new();
    if let Some(csv) = first_existing(dir, &["gsm8k_responses.csv", "gsm8k/gsm8k_responses.csv"]) {
        let skip = contaminated(dir, "gsm8k")?;
        let rows = read_bool_csv(&csv, weak, strong)?;
        let prompts = rows
            .into_iter()
            .filter(|(text, _)| !skip.contains(text))
            .enumerate()
            .map(|(i, (text, outcome))| Prompt {
                text,
                group: format!("gsm8k/{i}"),
                outcome,
            })
            .collect();
        out.push(Benchmark {
            name: "gsm8k",
            graded: false,
            prompts,
        });
    }
    if let Some(mmlu) = first_existing(dir, &["mmlu/responses", "mmlu"]) {
        let skip = contaminated(dir, "mmlu")?;
        let mut files: Vec<PathBuf> = std::fs::read_dir(&mmlu)
            .with_context(|| format!("listing {}", mmlu.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "csv"))
            .collect();
        files.sort();
        let mut prompts = Vec::new();
        for file in &files {
            let domain = file
                .file_stem()
                .map(|s| s.to_string_lossy().trim_start_matches("mmlu_").to_owned())
                .unwrap_or_default();
            for (text, outcome) in read_bool_csv(file, weak, strong)? {
                if !skip.contains(&text) {
                    prompts.push(Prompt {
                        text,
                        // A domain is one group: scored only by models that never saw it.
                        group: format!("mmlu/{domain}"),
                        outcome,
                    });
                }
            }
        }
        if !prompts.is_empty() {
            out.push(Benchmark {
                name: "mmlu",
                graded: false,
                prompts,
            });
        }
    }
    if let (Some(questions), Some(judgements)) = (
        first_existing(dir, &["mt_bench_question.jsonl", "mt_bench/question.jsonl"]),
        first_existing(
            dir,
            &["mt_bench_judgements.jsonl", "mt_bench/judgements.jsonl"],
        ),
    ) {
        let skip = contaminated(dir, "mt_bench")?;
        out.push(Benchmark {
            name: "mt-bench",
            graded: true,
            prompts: read_mt_bench(&questions, &judgements, weak, strong, &skip)?,
        });
    }
    if out.is_empty() {
        bail!(
            "no RouteLLM data under {} (expected gsm8k_responses.csv, mmlu/*.csv or mt_bench_*.jsonl)",
            dir.display()
        );
    }
    Ok(out)
}

fn first_existing(dir: &Path, names: &[&str]) -> Option<PathBuf> {
    names.iter().map(|n| dir.join(n)).find(|p| p.exists())
}

/// RouteLLM's decontamination lists (`<bench>/contaminated_prompts.jsonl`), when present.
fn contaminated(dir: &Path, bench: &str) -> anyhow::Result<HashSet<String>> {
    #[derive(Deserialize)]
    struct Row {
        eval_prompt: String,
    }
    let path = dir.join(bench).join("contaminated_prompts.jsonl");
    if !path.exists() {
        return Ok(HashSet::new());
    }
    read_jsonl::<Row>(&path).map(|rows| rows.into_iter().map(|r| r.eval_prompt).collect())
}

/// `prompt,<model>,<model>,…` with `True`/`False` cells.
fn read_bool_csv(path: &Path, weak: &str, strong: &str) -> anyhow::Result<Vec<(String, Outcome)>> {
    let mut reader =
        csv::Reader::from_path(path).with_context(|| format!("opening {}", path.display()))?;
    let headers = reader
        .headers()
        .with_context(|| format!("{}: reading the header", path.display()))?
        .clone();
    let column = |name: &str| {
        headers
            .iter()
            .position(|h| h == name)
            .with_context(|| format!("{}: no column {name:?}", path.display()))
    };
    let (p, w, s) = (column("prompt")?, column(weak)?, column(strong)?);
    let mut rows = Vec::new();
    for (i, record) in reader.records().enumerate() {
        let record = record.with_context(|| format!("{}: row {}", path.display(), i + 2))?;
        let cell = |c: usize| -> anyhow::Result<f64> {
            match record.get(c) {
                Some("True") => Ok(1.0),
                Some("False") => Ok(0.0),
                other => bail!(
                    "{}: row {}: expected True or False, found {other:?}",
                    path.display(),
                    i + 2
                ),
            }
        };
        let text = record.get(p).unwrap_or_default().to_owned();
        rows.push((
            text,
            Outcome {
                weak: cell(w)?,
                strong: cell(s)?,
            },
        ));
    }
    Ok(rows)
}

fn read_mt_bench(
    questions: &Path,
    judgements: &Path,
    weak: &str,
    strong: &str,
    skip: &HashSet<String>,
) -> anyhow::Result<Vec<Prompt>> {
    #[derive(Deserialize)]
    struct Question {
        question_id: u64,
        turns: Vec<String>,
    }
    #[derive(Deserialize)]
    struct Judgement {
        question_id: u64,
        model: String,
        score: f64,
    }
    // Per question and model: the sum and count of the judge's scores over both turns.
    let mut scores: BTreeMap<(u64, bool), (f64, u32)> = BTreeMap::new();
    for j in read_jsonl::<Judgement>(judgements)? {
        let is_strong = if j.model == strong {
            true
        } else if j.model == weak {
            false
        } else {
            continue;
        };
        let e = scores.entry((j.question_id, is_strong)).or_default();
        e.0 += j.score;
        e.1 += 1;
    }
    let mean = |q: u64, s: bool| scores.get(&(q, s)).map(|(sum, n)| sum / f64::from(*n));
    let mut prompts = Vec::new();
    for q in read_jsonl::<Question>(questions)? {
        if q.turns.iter().any(|t| skip.contains(t)) {
            continue;
        }
        // RouteLLM routes on the first turn only.
        let Some(first) = q.turns.first() else {
            bail!(
                "{}: question {} has no turns",
                questions.display(),
                q.question_id
            );
        };
        let (Some(w), Some(s)) = (mean(q.question_id, false), mean(q.question_id, true)) else {
            bail!(
                "{}: question {} lacks a judgement for both models",
                judgements.display(),
                q.question_id
            );
        };
        prompts.push(Prompt {
            text: first.clone(),
            group: format!("mt-bench/{}", q.question_id),
            outcome: Outcome { weak: w, strong: s },
        });
    }
    Ok(prompts)
}

fn read_jsonl<T: serde::de::DeserializeOwned>(path: &Path) -> anyhow::Result<Vec<T>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).with_context(|| format!("{}: line {}", path.display(), i + 1))
        })
        .collect()
}

/// One router's result on one benchmark.
#[derive(Debug)]
pub struct Row {
    pub benchmark: &'static str,
    pub router: &'static str,
    pub summary: Summary,
    pub curve: Vec<CurvePoint>,
}

/// Settings of one evaluation run.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    pub bins: usize,
    pub folds: usize,
    pub random_seeds: u64,
    pub train: TrainConfig,
}

/// Scores each benchmark with the learned router (cross-fitted over all benchmarks pooled),
/// a random router (mean over seeds) and the oracle.
pub fn evaluate(benchmarks: &[Benchmark], settings: Settings) -> anyhow::Result<Vec<Row>> {
    // The label is "the weak model fails" — what an edge router needs to know — rather than
    // "the strong model wins": on correctness benchmarks that is a wrong answer, on judged
    // ones a lower score than the strong model's.
    let pooled: Vec<Labelled> = benchmarks
        .iter()
        .flat_map(|b| b.prompts.iter().map(move |p| (b, p)))
        .map(|(b, p)| Labelled {
            text: p.text.clone(),
            weak_fails: if b.graded {
                p.outcome.weak < p.outcome.strong
            } else {
                p.outcome.weak < 0.5
            },
            group: p.group.clone(),
        })
        .collect();
    let learned = eval::cross_fit_scores(&pooled, settings.folds, settings.train)
        .context("training the difficulty model")?;
    let mut rows = Vec::new();
    let mut offset = 0;
    for b in benchmarks {
        let n = b.prompts.len();
        let outcomes: Vec<Outcome> = b.prompts.iter().map(|p| p.outcome).collect();
        let (weak, strong) = (b.quality(|o| o.weak), b.quality(|o| o.strong));
        let scores = &learned[offset..offset + n];
        offset += n;
        let c = eval::curve(scores, &outcomes, settings.bins);
        rows.push(Row {
            benchmark: b.name,
            router: "straddle",
            summary: eval::summarize(&c, weak, strong),
            curve: c,
        });
        let random: Vec<Summary> = (0..settings.random_seeds.max(1))
            .map(|seed| {
                let c = eval::curve(&eval::random_scores(n, seed), &outcomes, settings.bins);
                eval::summarize(&c, weak, strong)
            })
            .collect();
        rows.push(Row {
            benchmark: b.name,
            router: "random",
            summary: mean_summary(&random),
            curve: Vec::new(),
        });
        let oracle: Vec<f64> = outcomes.iter().map(|o| o.strong - o.weak).collect();
        let c = eval::curve(&oracle, &outcomes, settings.bins);
        rows.push(Row {
            benchmark: b.name,
            router: "oracle",
            summary: eval::summarize(&c, weak, strong),
            curve: c,
        });
    }
    Ok(rows)
}

/// The mean of several summaries (the random router over seeds).
pub fn mean_summary(all: &[Summary]) -> Summary {
    let n = all.len() as f64;
    let mean = |f: &dyn Fn(&Summary) -> f64| all.iter().map(f).sum::<f64>() / n;
    let mean_opt = |f: &dyn Fn(&Summary) -> Option<f64>| {
        let v: Option<Vec<f64>> = all.iter().map(f).collect();
        v.map(|v| v.iter().sum::<f64>() / n)
    };
    Summary {
        weak: mean(&|s| s.weak),
        strong: mean(&|s| s.strong),
        pgr_at: [0, 1, 2].map(|i| mean(&|s| s.pgr_at[i])),
        apgr: mean(&|s| s.apgr),
        cpt50: mean_opt(&|s| s.cpt50),
        cpt80: mean_opt(&|s| s.cpt80),
        share_at_95_quality: mean_opt(&|s| s.share_at_95_quality),
    }
}

/// The table RouteLLM's paper prints, one row per router and benchmark.
pub fn table(rows: &[Row], benchmarks: &[Benchmark]) -> String {
    let mut out = String::new();
    let pct = |v: Option<f64>| v.map_or("—".to_owned(), |v| format!("{:.1}%", v * 100.0));
    let _ = writeln!(
        out,
        "| benchmark | prompts | router | weak | strong | PGR@20% | PGR@50% | PGR@80% | APGR | CPT(50%) | CPT(80%) | strong calls @95% quality | strong calls saved |"
    );
    let _ = writeln!(
        out,
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for r in rows {
        let s = &r.summary;
        let n = benchmarks
            .iter()
            .find(|b| b.name == r.benchmark)
            .map_or(0, |b| b.prompts.len());
        let _ = writeln!(
            out,
            "| {} | {n} | {} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {} | {} | {} | {} |",
            r.benchmark,
            r.router,
            s.weak,
            s.strong,
            s.pgr_at[0],
            s.pgr_at[1],
            s.pgr_at[2],
            s.apgr,
            pct(s.cpt50),
            pct(s.cpt80),
            pct(s.share_at_95_quality),
            pct(s.share_at_95_quality.map(|v| 1.0 - v)),
        );
    }
    out
}

/// The quality-vs-strong-share curve of each router, as `share quality` lines.
pub fn curves(rows: &[Row]) -> String {
    let mut out = String::new();
    for r in rows.iter().filter(|r| !r.curve.is_empty()) {
        let _ = writeln!(out, "# {} {}", r.benchmark, r.router);
        for p in &r.curve {
            let _ = writeln!(out, "{:.4} {:.4}", p.strong_share, p.quality);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared_data() -> Option<PathBuf> {
        let dir = crate::test_support::manifest_dir().join("../../../shared/data/routellm");
        if dir.is_dir() {
            Some(dir)
        } else {
            // Written past libtest's capture, so `cargo xtask test` counts the skip.
            use std::io::Write as _;
            let _ = writeln!(
                std::io::stdout(),
                "skipped: {} is absent (RouteLLM data lives outside the repo)",
                dir.display()
            );
            None
        }
    }

    fn settings() -> Settings {
        Settings {
            bins: 10,
            folds: 5,
            random_seeds: 10,
            train: TrainConfig::default(),
        }
    }

    #[test]
    fn shared_routellm_data_evaluates_with_sane_metrics() {
        let Some(dir) = shared_data() else {
            return;
        };
        let benchmarks = load(&dir, DEFAULT_WEAK, DEFAULT_STRONG).expect("load");
        let names: Vec<_> = benchmarks.iter().map(|b| b.name).collect();
        assert_eq!(names, ["gsm8k", "mmlu", "mt-bench"]);
        let gsm = &benchmarks[0];
        assert_eq!(gsm.prompts.len(), 1319);
        // Counted independently from the CSV (Python's csv module): 842 and 1130 correct.
        assert!((gsm.quality(|o| o.weak) - 842.0 / 1319.0).abs() < 1e-9);
        assert!((gsm.quality(|o| o.strong) - 1130.0 / 1319.0).abs() < 1e-9);
        assert_eq!(benchmarks[2].prompts.len(), 80);

        let rows = evaluate(&benchmarks, settings()).expect("evaluate");
        for r in &rows {
            let s = &r.summary;
            assert!(
                s.apgr.is_finite() && (-1.0..=1.5).contains(&s.apgr),
                "{r:?}"
            );
            if r.router == "oracle" {
                let random = rows
                    .iter()
                    .find(|x| x.benchmark == r.benchmark && x.router == "random")
                    .expect("random row");
                assert!(s.apgr > random.summary.apgr, "{}", r.benchmark);
            }
        }
        let t = table(&rows, &benchmarks);
        assert_eq!(t.lines().count(), 2 + 3 * 3, "{t}");
    }

    #[test]
    fn malformed_files_are_errors_that_name_the_file_and_row() {
        let dir = std::env::temp_dir().join(format!("straddle-routellm-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("tmp");
        std::fs::write(
            dir.join("gsm8k_responses.csv"),
            format!(
                "prompt,{DEFAULT_WEAK},{DEFAULT_STRONG}\n\"2+2?\",True,True\n\"3+3?\",maybe,True\n"
            ),
        )
        .expect("write");
        let err = format!(
            "{:#}",
            load(&dir, DEFAULT_WEAK, DEFAULT_STRONG).expect_err("bad cell")
        );
        assert!(err.contains("row 3") && err.contains("maybe"), "{err}");

        std::fs::write(
            dir.join("gsm8k_responses.csv"),
            "prompt,a,b\n\"x\",True,True\n",
        )
        .expect("write");
        let err = format!(
            "{:#}",
            load(&dir, DEFAULT_WEAK, DEFAULT_STRONG).expect_err("no column")
        );
        assert!(err.contains("no column"), "{err}");

        std::fs::remove_file(dir.join("gsm8k_responses.csv")).expect("rm");
        std::fs::write(
            dir.join("mt_bench_question.jsonl"),
            "{\"question_id\": 1, \"turns\": [\"hi\"]}\n",
        )
        .expect("write");
        std::fs::write(dir.join("mt_bench_judgements.jsonl"), "{not json\n").expect("write");
        let err = format!(
            "{:#}",
            load(&dir, DEFAULT_WEAK, DEFAULT_STRONG).expect_err("bad json")
        );
        assert!(err.contains("line 1"), "{err}");

        let empty = dir.join("empty");
        std::fs::create_dir_all(&empty).expect("mkdir");
        let err = format!(
            "{:#}",
            load(&empty, DEFAULT_WEAK, DEFAULT_STRONG).expect_err("empty")
        );
        assert!(err.contains("no RouteLLM data"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
