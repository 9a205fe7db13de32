//! `straddle eval route`: the shipped router, measured with the real edge model. Each
//! benchmark prompt is answered by the edge model (through [`crate::edge_answers`]), graded
//! against its key, paired with the cloud model's recorded correctness (GPT-4's in RouteLLM's
//! files; for the routine `classify` sets the cloud is counted correct, an upper bound), and
//! routed with the functions the page calls: `decide_conversation` before generation and
//! `at_first_token` after prefill. RouteLLM's metrics then sweep a threshold over the routers'
//! scores.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::eval::{self, Outcome, Summary};
use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use straddle_router::policy::{self, Context as RouteContext, Decision, Policy, Target};
use straddle_router::quality::{self, QualityError, QualityModel};
use straddle_router::rng::SplitMix;

use crate::edge_answers::{EdgeAnswer, EdgeGrader, Question};
use crate::routellm;

/// One graded prompt of one benchmark.
#[derive(Debug, Clone)]
pub struct Item {
    pub benchmark: String,
    /// The cross-fitting group: an MMLU domain, GSM8K, or a `classify` file.
    pub group: String,
    pub question: Question,
    /// The cloud model's correctness (0 or 1).
    pub cloud: f64,
}

/// The benchmarks under `dir` (the layout of `../shared/data`), at most `limit` prompts per
/// domain (GSM8K and each `classify` file count as one domain).
pub fn load(dir: &Path, limit: Option<usize>) -> anyhow::Result<Vec<Item>> {
    let mut items = Vec::new();
    let routellm_dir = dir.join("routellm");
    let benchmarks = routellm::load(
        &routellm_dir,
        routellm::DEFAULT_WEAK,
        routellm::DEFAULT_STRONG,
    )?;
    let letters = mmlu_keys(&dir.join("mmlu-answers"))?;
    let numbers = gsm8k_keys(&dir.join("gsm8k/test.jsonl"))?;
    for b in benchmarks.iter().filter(|b| !b.graded) {
        for p in &b.prompts {
            let question = match b.name {
                "mmlu" => letters.get(p.text.trim()).map(|&key| Question::Letter {
                    prompt: p.text.clone(),
                    key,
                }),
                _ => numbers.get(p.text.trim()).map(|&key| Question::Number {
                    prompt: p.text.clone(),
                    key,
                }),
            };
            let Some(question) = question else { continue };
            items.push(Item {
                benchmark: b.name.to_string(),
                // An MMLU domain is a group; GSM8K is one (RouteLLM groups it by prompt).
                group: match b.name {
                    "mmlu" => p.group.trim_start_matches("mmlu/").to_string(),
                    name => name.to_string(),
                },
                question,
                cloud: p.outcome.strong,
            });
        }
    }
    items.extend(classify_items(&dir.join("classify"))?);
    if items.is_empty() {
        bail!("no graded prompts under {}", dir.display());
    }
    Ok(limit_per_group(items, limit))
}

fn limit_per_group(items: Vec<Item>, limit: Option<usize>) -> Vec<Item> {
    let Some(limit) = limit else { return items };
    let mut seen: HashMap<String, usize> = HashMap::new();
    items
        .into_iter()
        .filter(|i| {
            let n = seen.entry(i.group.clone()).or_default();
            *n += 1;
            *n <= limit
        })
        .collect()
}

/// MMLU answer keys by the prompt RouteLLM builds from each row.
fn mmlu_keys(dir: &Path) -> anyhow::Result<HashMap<String, char>> {
    let mut keys = HashMap::new();
    let files = std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))?;
    for path in files.filter_map(|e| e.ok().map(|e| e.path())) {
        if path.extension().is_none_or(|x| x != "csv") {
            continue;
        }
        let mut reader = csv::ReaderBuilder::new()
            .has_headers(false)
            .from_path(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        for (i, row) in reader.records().enumerate() {
            let row = row.with_context(|| format!("{}: row {}", path.display(), i + 1))?;
            let cells: Vec<&str> = row.iter().collect();
            let [q, a, b, c, d, key] = cells[..] else {
                bail!("{}: row {}: expected 6 columns", path.display(), i + 1);
            };
            let key = key
                .trim()
                .chars()
                .next()
                .filter(|k| ('A'..='D').contains(k));
            let Some(key) = key else {
                bail!("{}: row {}: answer must be A–D", path.display(), i + 1);
            };
            let prompt = format!("{q}\nA. {a}\nB. {b}\nC. {c}\nD. {d}\nAnswer:");
            keys.insert(prompt.trim().to_string(), key);
        }
    }
    Ok(keys)
}

/// GSM8K final answers (after `####`) by question.
fn gsm8k_keys(path: &Path) -> anyhow::Result<HashMap<String, f64>> {
    #[derive(Deserialize)]
    struct Row {
        question: String,
        answer: String,
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut keys = HashMap::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let row: Row = serde_json::from_str(line)
            .with_context(|| format!("{}: line {}", path.display(), i + 1))?;
        let number = row
            .answer
            .rsplit("####")
            .next()
            .map(|s| s.trim().replace(',', ""));
        let Some(key) = number.and_then(|n| n.parse().ok()) else {
            bail!(
                "{}: line {}: no final answer after ####",
                path.display(),
                i + 1
            );
        };
        keys.insert(row.question.trim().to_string(), key);
    }
    Ok(keys)
}

/// Every `classify/*.jsonl` file: one benchmark of `{"prompt", "choices", "answer"}` lines.
fn classify_items(dir: &Path) -> anyhow::Result<Vec<Item>> {
    #[derive(Deserialize)]
    struct Row {
        prompt: String,
        choices: Vec<String>,
        answer: usize,
    }
    let mut items = Vec::new();
    for (path, n, line) in jsonl_lines(dir)? {
        let at = || format!("{}: line {n}", path.display());
        let row: Row = serde_json::from_str(&line).with_context(at)?;
        if row.answer >= row.choices.len() {
            bail!("{}: answer out of range", at());
        }
        let stem = path
            .file_stem()
            .map(|s| s.to_string_lossy())
            .unwrap_or_default();
        items.push(Item {
            benchmark: stem.to_string(),
            group: stem.to_string(),
            question: Question::Choice {
                prompt: row.prompt,
                choices: row.choices,
                key: row.answer,
            },
            cloud: 1.0,
        });
    }
    Ok(items)
}

/// Answers every item on the edge, with a progress bar for the uncached ones.
pub fn grade(items: &[Item], grader: &mut EdgeGrader) -> anyhow::Result<Vec<EdgeAnswer>> {
    let todo = items
        .iter()
        .filter(|i| !grader.is_cached(&i.question))
        .count();
    let bar = crate::progress::bar(todo as u64, "edge answers");
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        let cached = grader.is_cached(&item.question);
        out.push(grader.answer(&item.question)?);
        if !cached {
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    Ok(out)
}

/// The device the evaluation routes for: online, the edge loaded and decoding at a laptop's
/// speed, a 60 ms round trip.
pub fn eval_context(edge_sha256: &str) -> RouteContext {
    RouteContext {
        online: true,
        edge_available: true,
        edge_tokens_per_s: 40.0,
        rtt_ms: 60.0,
        edge_languages: vec!["en".into()],
        edge_model_sha256: Some(edge_sha256.into()),
        ..RouteContext::default()
    }
}

/// Each router's score for one prompt: higher sends it to the cloud first.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scores {
    /// The shipped router after prefill (`at_first_token`).
    pub router: f64,
    /// The shipped router before generation.
    pub router_pre_generation: f64,
    /// Today's prior-only policy (no quality model).
    pub prior_only: f64,
}

/// Routes one prompt the way the page does, with `model` as the quality model.
pub fn route_one(
    item: &Item,
    edge: &EdgeAnswer,
    ctx: &RouteContext,
    policy: &Policy,
    model: Result<&QualityModel, QualityError>,
) -> Scores {
    let turns = [item.question.prompt()];
    let d = policy::decide_with(&turns, None, ctx, policy, model.clone());
    let first = policy::at_first_token_with(&d, edge.signals, model);
    let prior = policy::decide_with(
        &turns,
        None,
        ctx,
        policy,
        Err(QualityError::Disabled("the prior-only baseline")),
    );
    let pre = d.quality.as_ref().map(|q| q.estimate.p_edge_ok);
    let post = first.estimate.as_ref().map(|e| e.p_edge_ok).or(pre);
    Scores {
        router: cloud_score(&d, post),
        router_pre_generation: cloud_score(&d, pre),
        prior_only: cloud_score(&prior, edge_quality_signal(&prior)),
    }
}

/// 1 − P(edge acceptable) for a scored decision; a rule's decision sorts to its end.
fn cloud_score(d: &Decision, p_edge_ok: Option<f64>) -> f64 {
    match (d.trace.rule.as_deref(), p_edge_ok) {
        (None, Some(p)) => 1.0 - p,
        _ if d.target == Target::Edge => -1.0,
        _ => 2.0,
    }
}

fn edge_quality_signal(d: &Decision) -> Option<f64> {
    d.trace
        .signals
        .iter()
        .find(|s| s.name == "edge_quality")
        .and_then(|s| s.value.as_f64())
}

/// The routing figures for one router on one benchmark.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Metrics {
    pub apgr: f64,
    pub cpt50: Option<f64>,
    pub cpt80: Option<f64>,
    /// Share of cloud calls saved at 95 % of the cloud's quality.
    pub saved_at_95: Option<f64>,
}

impl From<&Summary> for Metrics {
    fn from(s: &Summary) -> Self {
        Metrics {
            apgr: s.apgr,
            cpt50: s.cpt50,
            cpt80: s.cpt80,
            saved_at_95: s.share_at_95_quality.map(|v| 1.0 - v),
        }
    }
}

/// One benchmark's figures, every router beside the shipped one.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BenchmarkReport {
    pub prompts: usize,
    pub edge_accuracy: f64,
    pub cloud_accuracy: f64,
    pub router: Metrics,
    pub router_pre_generation: Metrics,
    pub random: Metrics,
    pub prior_only: Metrics,
    pub oracle: Metrics,
}

/// The whole report: `{"benchmarks": {name: …}}`, the mix included.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    pub quality_model: String,
    pub benchmarks: BTreeMap<String, BenchmarkReport>,
}

/// Curve bins (RouteLLM's default) and random seeds per benchmark.
const BINS: usize = 10;
const RANDOM_SEEDS: u64 = 20;

/// Scores one set of prompts (a benchmark, or the mix).
pub fn report(
    picked: &[usize],
    edge: &[EdgeAnswer],
    items: &[Item],
    scores: &[Scores],
) -> BenchmarkReport {
    let outcomes: Vec<Outcome> = picked
        .iter()
        .map(|&i| Outcome {
            weak: f64::from(u8::from(edge[i].correct)),
            strong: items[i].cloud,
        })
        .collect();
    let n = outcomes.len().max(1) as f64;
    let weak = outcomes.iter().map(|o| o.weak).sum::<f64>() / n;
    let strong = outcomes.iter().map(|o| o.strong).sum::<f64>() / n;
    let metrics = |s: &[f64]| {
        Metrics::from(&eval::summarize(
            &eval::curve(s, &outcomes, BINS),
            weak,
            strong,
        ))
    };
    let pick = |f: fn(&Scores) -> f64| picked.iter().map(|&i| f(&scores[i])).collect::<Vec<_>>();
    let random: Vec<Summary> = (0..RANDOM_SEEDS)
        .map(|seed| {
            let c = eval::curve(&eval::random_scores(outcomes.len(), seed), &outcomes, BINS);
            eval::summarize(&c, weak, strong)
        })
        .collect();
    let oracle: Vec<f64> = outcomes.iter().map(|o| o.strong - o.weak).collect();
    BenchmarkReport {
        prompts: outcomes.len(),
        edge_accuracy: weak,
        cloud_accuracy: strong,
        router: metrics(&pick(|s| s.router)),
        router_pre_generation: metrics(&pick(|s| s.router_pre_generation)),
        random: Metrics::from(&routellm::mean_summary(&random)),
        prior_only: metrics(&pick(|s| s.prior_only)),
        oracle: metrics(&oracle),
    }
}

/// The seed's traffic: 70 % routine prompts (every `classify` set) and 30 % complex ones
/// (MMLU and GSM8K), as many as the smaller pool allows, drawn with a fixed seed.
pub fn bimodal_mix(items: &[Item]) -> Vec<usize> {
    let complex = |i: &&Item| i.benchmark == "mmlu" || i.benchmark == "gsm8k";
    let mut routine: Vec<usize> = (0..items.len()).filter(|&i| !complex(&&items[i])).collect();
    let mut hard: Vec<usize> = (0..items.len()).filter(|&i| complex(&&items[i])).collect();
    let mut rng = SplitMix(0x006d_6978);
    for v in [&mut routine, &mut hard] {
        for i in (1..v.len()).rev() {
            v.swap(i, rng.below(i + 1));
        }
    }
    let n_hard = hard.len().min(routine.len() * 3 / 7);
    let n_routine = routine.len().min(n_hard * 7 / 3);
    routine.truncate(n_routine);
    routine.extend(&hard[..n_hard]);
    routine
}

/// The report over every benchmark and the mix, each prompt scored by `scores`.
pub fn evaluate(items: &[Item], edge: &[EdgeAnswer], scores: &[Scores], model: &str) -> Report {
    let mut names: Vec<&str> = items.iter().map(|i| i.benchmark.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    let mut benchmarks = BTreeMap::new();
    for name in names {
        let picked: Vec<usize> = (0..items.len())
            .filter(|&i| items[i].benchmark == name)
            .collect();
        benchmarks.insert(name.to_string(), report(&picked, edge, items, scores));
    }
    let mix = bimodal_mix(items);
    if !mix.is_empty() {
        benchmarks.insert("mix".into(), report(&mix, edge, items, scores));
    }
    Report {
        quality_model: model.into(),
        benchmarks,
    }
}

/// The training examples the items make (their features, the edge's signals and grade).
pub fn examples(items: &[Item], edge: &[EdgeAnswer]) -> Vec<quality::Example> {
    items
        .iter()
        .zip(edge)
        .map(|(item, e)| quality::Example {
            text: quality::read_turn(item.question.prompt(), None).features,
            edge: e.signals,
            edge_ok: e.correct,
        })
        .collect()
}

/// Every item routed with a quality model fitted without its group (leave one domain out).
pub fn cross_fit(
    items: &[Item],
    edge: &[EdgeAnswer],
    ctx: &RouteContext,
    sha256: &str,
) -> anyhow::Result<Vec<Scores>> {
    let all = examples(items, edge);
    let mut groups: Vec<&str> = items.iter().map(|i| i.group.as_str()).collect();
    groups.sort_unstable();
    groups.dedup();
    let mut scores = vec![None; items.len()];
    for g in groups {
        let train: Vec<quality::Example> = all
            .iter()
            .zip(items)
            .filter(|(_, i)| i.group != g)
            .map(|(e, _)| e.clone())
            .collect();
        let model = quality::train(&train, sha256, "cross-fit fold")
            .with_context(|| format!("fitting the fold without {g}"))?;
        for (i, item) in items.iter().enumerate().filter(|(_, i)| i.group == g) {
            scores[i] = Some(route_one(
                item,
                &edge[i],
                ctx,
                &Policy::default(),
                Ok(&model),
            ));
        }
    }
    Ok(scores.into_iter().flatten().collect())
}

/// The report as a Markdown table.
pub fn table(r: &Report) -> String {
    let mut out = String::new();
    let pct = |v: Option<f64>| v.map_or("—".to_owned(), |v| format!("{:.1}%", v * 100.0));
    let _ = writeln!(out, "quality model: {}\n", r.quality_model);
    let _ = writeln!(
        out,
        "| benchmark | prompts | edge acc. | cloud acc. | router | APGR | CPT(50%) | CPT(80%) | cloud calls saved @95% |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---|---:|---:|---:|---:|");
    for (name, b) in &r.benchmarks {
        let rows = [
            ("straddle (first token)", &b.router),
            ("straddle (before generation)", &b.router_pre_generation),
            ("prior-only", &b.prior_only),
            ("random (20 seeds)", &b.random),
            ("oracle", &b.oracle),
        ];
        for (router, m) in rows {
            let _ = writeln!(
                out,
                "| {name} | {} | {:.3} | {:.3} | {router} | {:.3} | {} | {} | {} |",
                b.prompts,
                b.edge_accuracy,
                b.cloud_accuracy,
                m.apgr,
                pct(m.cpt50),
                pct(m.cpt80),
                pct(m.saved_at_95)
            );
        }
    }
    out
}

/// Runs the whole evaluation: load, answer on the edge, route, report.
pub fn run(
    data: &Path,
    edge_model: &Path,
    cache: &Path,
    limit: Option<usize>,
    cross_fitted: bool,
) -> anyhow::Result<Report> {
    let items = load(data, limit)?;
    let mut grader = EdgeGrader::open(edge_model, cache)?;
    let answers = grade(&items, &mut grader)?;
    let ctx = eval_context(grader.sha256());
    let (scores, model) = if cross_fitted {
        let scores = cross_fit(&items, &answers, &ctx, grader.sha256())?;
        (
            scores,
            "cross-fitted, one domain left out per fit".to_string(),
        )
    } else {
        let model = quality::bundled();
        let name = match &model {
            Ok(m) if m.knows_edge(Some(grader.sha256())) => m.version.clone(),
            Ok(m) => format!(
                "{} (trained for another edge model: text features only)",
                m.version
            ),
            Err(e) => format!("none ({e}): the priors stand in"),
        };
        let scores = items
            .iter()
            .zip(&answers)
            .map(|(item, a)| route_one(item, a, &ctx, &Policy::default(), model.clone()))
            .collect();
        (scores, name)
    };
    Ok(evaluate(&items, &answers, &scores, &model))
}

/// The graded prompts a quality model is trained on: `classify/*.jsonl` (routine choices),
/// `short/*.jsonl` (`{"prompt", "answers": ["Paris"]}`, free-form), `letter/*.jsonl`
/// (`{"prompt", "answer": "B"}`) and `number/*.jsonl` (`{"prompt", "answer": 12}`) under
/// `dir`.
pub fn training_items(dir: &Path) -> anyhow::Result<Vec<Item>> {
    #[derive(Deserialize)]
    struct Letter {
        prompt: String,
        answer: char,
    }
    #[derive(Deserialize)]
    struct Number {
        prompt: String,
        answer: f64,
    }
    #[derive(Deserialize)]
    struct Short {
        prompt: String,
        answers: Vec<String>,
    }
    let mut items = classify_items(&dir.join("classify"))?;
    for (path, n, line) in jsonl_lines(&dir.join("short"))? {
        let q: Short =
            serde_json::from_str(&line).with_context(|| format!("{}: line {n}", path.display()))?;
        let question = Question::Contains {
            prompt: q.prompt,
            keys: q.answers,
        };
        items.push(training_item("short", question));
    }
    for (path, n, line) in jsonl_lines(&dir.join("letter"))? {
        let l: Letter =
            serde_json::from_str(&line).with_context(|| format!("{}: line {n}", path.display()))?;
        items.push(training_item(
            "letter",
            Question::Letter {
                prompt: l.prompt,
                key: l.answer,
            },
        ));
    }
    for (path, n, line) in jsonl_lines(&dir.join("number"))? {
        let n: Number =
            serde_json::from_str(&line).with_context(|| format!("{}: line {n}", path.display()))?;
        items.push(training_item(
            "number",
            Question::Number {
                prompt: n.prompt,
                key: n.answer,
            },
        ));
    }
    if items.is_empty() {
        bail!("no graded prompts under {}", dir.display());
    }
    Ok(items)
}

fn training_item(kind: &str, question: Question) -> Item {
    Item {
        benchmark: kind.into(),
        group: kind.into(),
        question,
        cloud: 1.0,
    }
}

/// Every non-empty line of every `*.jsonl` file in `dir`, in file order, with its file and
/// line number (for errors); a missing directory has none.
fn jsonl_lines(dir: &Path) -> anyhow::Result<Vec<(PathBuf, usize, String)>> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(Vec::new());
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    files.sort();
    let mut out = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        for (i, line) in text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
        {
            out.push((path.clone(), i + 1, line.to_string()));
        }
    }
    Ok(out)
}

/// Answers the training prompts on `edge_model` and fits the quality model for it.
pub fn train_quality(data: &Path, edge_model: &Path, cache: &Path) -> anyhow::Result<QualityModel> {
    let items = training_items(data)?;
    let mut grader = EdgeGrader::open(edge_model, cache)?;
    let answers = grade(&items, &mut grader)?;
    let right = answers.iter().filter(|a| a.correct).count();
    let provenance = format!(
        "{} graded prompts from {} ({right} answered right by the edge); the cloud is \
         assumed right on all of them",
        items.len(),
        data.display()
    );
    Ok(quality::train(
        &examples(&items, &answers),
        grader.sha256(),
        &provenance,
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A miniature of `../shared/data`: two MMLU questions, one GSM8K problem, three
    /// routine prompts.
    fn fixture(dir: &Path) {
        let write = |p: &str, s: &str| {
            let path = dir.join(p);
            std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
            std::fs::write(path, s).expect("write");
        };
        let (weak, strong) = (routellm::DEFAULT_WEAK, routellm::DEFAULT_STRONG);
        write(
            "routellm/mmlu/mmlu_geography.csv",
            &format!(
                "prompt,{weak},{strong}\n\"What is the capital of France?\nA. Rome\nB. Paris\nC. Oslo\nD. Lima\nAnswer:\",True,True\n\"Which planet is largest?\nA. Mars\nB. Venus\nC. Jupiter\nD. Mercury\nAnswer:\",False,True\n"
            ),
        );
        write(
            "mmlu-answers/geography_test.csv",
            "What is the capital of France?,Rome,Paris,Oslo,Lima,B\nWhich planet is largest?,Mars,Venus,Jupiter,Mercury,C\n",
        );
        let problem = "Tom has 3 bags of 4 apples and eats 2. How many apples are left?";
        write(
            "routellm/gsm8k_responses.csv",
            &format!("prompt,{weak},{strong}\n{problem},True,True\n"),
        );
        write(
            "gsm8k/test.jsonl",
            &format!("{{\"question\": \"{problem}\", \"answer\": \"3*4-2=10\\n#### 10\"}}\n"),
        );
        let line = |text: &str, answer: usize| {
            format!(
                "{{\"prompt\": \"Is the sentiment of this review negative, neutral or positive?\\nReview: {text}\\nSentiment:\", \"choices\": [\"negative\", \"neutral\", \"positive\"], \"answer\": {answer}}}\n"
            )
        };
        write(
            "classify/reviews.jsonl",
            &(line("Awful, it broke.", 0) + &line("It is blue.", 1) + &line("I love it!", 2)),
        );
    }

    #[test]
    fn the_shipped_router_is_evaluated_with_the_real_edge_model_and_its_answers_cached() {
        let Some(model) = crate::test_support::test_model() else {
            return;
        };
        let dir = std::env::temp_dir().join(format!("route-eval-{}", std::process::id()));
        fixture(&dir);
        let cache = dir.join("cache");
        let report = run(&dir, &model, &cache, None, false).expect("evaluates");
        let json = serde_json::to_value(&report).expect("json");
        for bench in ["mmlu", "gsm8k", "reviews", "mix"] {
            let b = &json["benchmarks"][bench];
            for router in ["router", "random", "prior_only", "oracle"] {
                assert!(b[router]["apgr"].is_number(), "{bench}/{router}: {b}");
            }
        }
        assert_eq!(json["benchmarks"]["mmlu"]["prompts"], 2);
        assert_eq!(json["benchmarks"]["reviews"]["cloud_accuracy"], 1.0);
        assert!(
            report.quality_model.starts_with("quality-"),
            "{}",
            report.quality_model
        );
        // A second run answers from the cache: the same report, no model runs needed.
        let mut grader = EdgeGrader::open(&model, &cache).expect("opens");
        let items = load(&dir, None).expect("loads");
        assert!(items.iter().all(|i| grader.is_cached(&i.question)));
        assert_eq!(
            grade(&items, &mut grader).expect("cached").len(),
            items.len()
        );
        assert_eq!(
            run(&dir, &model, &cache, None, false).expect("again"),
            report
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn missing_keys_and_malformed_rows_are_named() {
        let dir = std::env::temp_dir().join(format!("route-eval-bad-{}", std::process::id()));
        fixture(&dir);
        std::fs::write(dir.join("classify/reviews.jsonl"), "{\"prompt\": 1}\n").expect("write");
        let err = format!("{:#}", load(&dir, None).expect_err("malformed"));
        assert!(err.contains("reviews.jsonl: line 1"), "{err}");
        std::fs::write(dir.join("classify/reviews.jsonl"), "").expect("write");
        std::fs::write(dir.join("mmlu-answers/geography_test.csv"), "q,a,b,c,d,E\n").expect("w");
        let err = format!("{:#}", load(&dir, None).expect_err("bad key"));
        assert!(err.contains("answer must be A–D"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
