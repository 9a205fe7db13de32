//! `straddle eval route`: the shipped router, measured with the real edge model. Each
//! benchmark prompt is answered by the edge model the way the product shows it (through
//! [`crate::edge_answers`]), graded against its key, paired with the cloud model's
//! correctness (GPT-4's in RouteLLM's files; for routine and code sets the real cloud model,
//! run once and cached), and routed with the functions the page calls: `decide_with` before
//! generation and `at_first_token_with` after prefill. RouteLLM's metrics then sweep a
//! threshold over each router's scores; the shipped policy's own operating point, the
//! probe's AUROC, the prefill spent on what went up and the router's own time sit beside them.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use serde::Serialize;
use straddle_router::policy::{self, Context as RouteContext, Decision, Policy, Target};
use straddle_router::quality::{self, QualityError, QualityModel};
use straddle_router::rng::SplitMix;

use crate::answer_cache::Answerer;
use crate::auroc::auroc;
use crate::cloud_answers::EndpointGrader;
use crate::edge_answers::{EdgeAnswer, EdgeGrader};
use crate::eval::{self, Outcome, Summary};
use crate::quality_folds;
use crate::route_data::{self, Item};
use crate::routellm;

/// Where the cloud's correctness comes from for prompts no file records it for.
#[derive(Debug, Clone)]
pub enum Cloud<'a> {
    /// The cloud model itself (a GGUF), run once per prompt and cached.
    Model(&'a Path),
    /// An OpenAI-compatible endpoint (its base URL), asked once per prompt and cached.
    Endpoint(&'a str),
    /// Counted right on all of them: an upper bound for the cloud, kept for comparison.
    AlwaysRight,
}

/// Answers every item with `grader`, with a progress bar for the uncached ones.
pub fn grade<A: Answerer>(
    items: &[Item],
    grader: &mut A,
    what: &str,
) -> anyhow::Result<Vec<A::Answer>> {
    let todo = items
        .iter()
        .filter(|i| !grader.is_cached(&i.question))
        .count();
    let bar = crate::progress::bar(todo as u64, what);
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

/// The cloud's correctness on each item: the recorded one, else per `cloud`.
pub fn cloud_grades(items: &[Item], cloud: &Cloud, cache: &Path) -> anyhow::Result<Vec<f64>> {
    let unrecorded: Vec<Item> = items
        .iter()
        .filter(|i| i.cloud.is_none())
        .cloned()
        .collect();
    let mut answered = match cloud {
        Cloud::Model(path) if !unrecorded.is_empty() => {
            let mut grader = EdgeGrader::open(path, cache)?;
            grade(&unrecorded, &mut grader, "cloud answers")?
                .into_iter()
                .map(|a| f64::from(u8::from(a.correct)))
                .collect()
        }
        Cloud::Endpoint(base) if !unrecorded.is_empty() => {
            let mut grader = EndpointGrader::open(base, cache)?;
            let what = format!("cloud answers ({})", grader.model());
            grade(&unrecorded, &mut grader, &what)?
                .into_iter()
                .map(|right| f64::from(u8::from(right)))
                .collect()
        }
        _ => vec![1.0; unrecorded.len()],
    }
    .into_iter();
    Ok(items
        .iter()
        .map(|i| i.cloud.or_else(|| answered.next()).unwrap_or(1.0))
        .collect())
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

/// Each router's score for one prompt (higher sends it to the cloud first), and what the
/// shipped policy did with it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Routed {
    /// The shipped router: the quality model with the edge model's state after prefill.
    pub state: f64,
    /// The same model with the first token's confidence alone.
    pub first_token: f64,
    /// The same model on the text alone.
    pub text_only: f64,
    /// The policy without a quality model (the task priors).
    pub prior_only: f64,
    /// What the shipped policy did.
    pub outcome: PolicyOutcome,
    /// Seconds the router's two calls took here.
    pub router_s: f64,
}

/// Where the shipped policy, run as the page runs it, sent a prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyOutcome {
    /// Answered on the device.
    Edge,
    /// Sent up before any prefill (a rule, or the text alone).
    CloudBeforePrefill,
    /// Prefilled on the device, then sent up on the edge model's state.
    CloudAfterPrefill,
}

/// Routes one prompt the way the page does, with `model` as the quality model.
pub fn route_one(
    item: &Item,
    edge: &EdgeAnswer,
    ctx: &RouteContext,
    model: Result<&QualityModel, QualityError>,
) -> Routed {
    let policy = Policy::default();
    let turns = [item.question.prompt()];
    let started = Instant::now();
    let d = policy::decide_with(&turns, None, ctx, &policy, model.clone());
    let state = (!edge.state.is_empty()).then_some(&edge.state[..]);
    let check = policy::at_first_token_with(&d, edge.signals, state, model.clone());
    let router_s = started.elapsed().as_secs_f64();
    let outcome = match (d.target, &check.escalate) {
        (Target::Edge, None) => PolicyOutcome::Edge,
        (Target::Edge, Some(_)) => PolicyOutcome::CloudAfterPrefill,
        _ => PolicyOutcome::CloudBeforePrefill,
    };
    let p = |edge, state| {
        let q = d.quality.as_ref()?;
        let text = <[f32; quality::TEXT_DIM]>::try_from(q.text_features.as_slice()).ok()?;
        let m = model.as_ref().ok()?;
        Some(m.estimate(&text, edge, state).p_edge_ok)
    };
    let prior = policy::decide_with(
        &turns,
        None,
        ctx,
        &policy,
        Err(QualityError::Disabled("the prior-only baseline")),
    );
    let known = d.quality.as_ref().is_some_and(|q| q.edge_signals);
    let edge_signals = known.then_some(edge.signals);
    Routed {
        state: cloud_score(&d, p(edge_signals, state.filter(|_| known))),
        first_token: cloud_score(&d, p(edge_signals, None)),
        text_only: cloud_score(&d, p(None, None)),
        prior_only: cloud_score(&prior, edge_quality_signal(&prior)),
        outcome,
        router_s,
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
    /// AUROC of the score for "the edge is wrong" (the oracle and random have none).
    pub auroc: Option<f64>,
}

/// What the shipped policy itself did on one benchmark.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OperatingPoint {
    /// Quality of the routed answers over quality with every prompt in the cloud.
    pub quality_of_all_cloud: f64,
    /// Share of prompts answered on the device (cloud calls saved).
    pub kept_on_edge: f64,
    /// Share sent up before any prefill.
    pub up_before_prefill: f64,
    /// Share prefilled on the device and then sent up.
    pub up_after_prefill: f64,
    /// Seconds of edge prefill (measured here) spent on prompts that then went up.
    pub prefill_s_spent_on_escalated: f64,
    /// The router's two calls per prompt, natively: median and 99th percentile, µs.
    pub router_us_p50: f64,
    pub router_us_p99: f64,
}

/// One benchmark's figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BenchmarkReport {
    pub prompts: usize,
    /// The edge's accuracy on the answers the product shows (generated, parsed).
    pub edge_accuracy: f64,
    /// The older reading (letters' logits, choices' log-likelihoods), where it applies.
    pub edge_accuracy_scored: Option<f64>,
    pub cloud_accuracy: f64,
    pub routers: BTreeMap<&'static str, Metrics>,
    pub shipped_policy: OperatingPoint,
}

/// The whole report: `{"benchmarks": {name: …}}`, the mix included.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    pub quality_model: String,
    pub cloud: String,
    pub benchmarks: BTreeMap<String, BenchmarkReport>,
}

/// Curve bins (RouteLLM's default) and random seeds per benchmark.
const BINS: usize = 10;
const RANDOM_SEEDS: u64 = 20;

/// One router's score of a routed prompt.
type Score = fn(&Routed) -> f64;

/// The routers in table order, each with its score.
const ROUTERS: [(&str, Score); 4] = [
    ("prior-only", |r| r.prior_only),
    ("text-only", |r| r.text_only),
    ("first token", |r| r.first_token),
    ("state-aware (shipped)", |r| r.state),
];

/// Everything one prompt contributes.
pub struct Graded<'a> {
    pub item: &'a Item,
    pub edge: &'a EdgeAnswer,
    pub cloud: f64,
    pub routed: Routed,
}

/// Scores one set of prompts (a benchmark, or the mix).
pub fn report(set: &[&Graded]) -> BenchmarkReport {
    let outcomes: Vec<Outcome> = set
        .iter()
        .map(|g| Outcome {
            weak: f64::from(u8::from(g.edge.correct)),
            strong: g.cloud,
        })
        .collect();
    let n = outcomes.len().max(1) as f64;
    let weak = outcomes.iter().map(|o| o.weak).sum::<f64>() / n;
    let strong = outcomes.iter().map(|o| o.strong).sum::<f64>() / n;
    let summary = |s: &[f64]| eval::summarize(&eval::curve(s, &outcomes, BINS), weak, strong);
    let wrong: Vec<bool> = set.iter().map(|g| !g.edge.correct).collect();
    let mut routers = BTreeMap::new();
    for (name, score) in ROUTERS {
        let s: Vec<f64> = set.iter().map(|g| score(&g.routed)).collect();
        routers.insert(name, metrics(&summary(&s), auroc(&s, &wrong)));
    }
    let random: Vec<Summary> = (0..RANDOM_SEEDS)
        .map(|seed| summary(&eval::random_scores(outcomes.len(), seed)))
        .collect();
    routers.insert(
        "random (20 seeds)",
        metrics(&routellm::mean_summary(&random), None),
    );
    let oracle: Vec<f64> = outcomes.iter().map(|o| o.strong - o.weak).collect();
    routers.insert("oracle", metrics(&summary(&oracle), None));
    let scored: Vec<bool> = set.iter().filter_map(|g| g.edge.scored_correct).collect();
    BenchmarkReport {
        prompts: outcomes.len(),
        edge_accuracy: weak,
        edge_accuracy_scored: (!scored.is_empty())
            .then(|| scored.iter().filter(|&&c| c).count() as f64 / scored.len() as f64),
        cloud_accuracy: strong,
        routers,
        shipped_policy: operating_point(set, strong),
    }
}

fn metrics(s: &Summary, auroc: Option<f64>) -> Metrics {
    Metrics {
        apgr: s.apgr,
        cpt50: s.cpt50,
        cpt80: s.cpt80,
        saved_at_95: s.share_at_95_quality.map(|v| 1.0 - v),
        auroc,
    }
}

/// What the shipped policy's own decisions earned on `set`.
fn operating_point(set: &[&Graded], all_cloud: f64) -> OperatingPoint {
    let n = set.len().max(1) as f64;
    let share = |o: PolicyOutcome| set.iter().filter(|g| g.routed.outcome == o).count() as f64 / n;
    let quality = set
        .iter()
        .map(|g| match g.routed.outcome {
            PolicyOutcome::Edge => f64::from(u8::from(g.edge.correct)),
            _ => g.cloud,
        })
        .sum::<f64>()
        / n;
    let mut times: Vec<f64> = set.iter().map(|g| g.routed.router_s * 1e6).collect();
    times.sort_by(f64::total_cmp);
    let at = |q: f64| {
        times
            .get(((times.len() as f64 - 1.0) * q).round() as usize)
            .copied()
    };
    OperatingPoint {
        quality_of_all_cloud: if all_cloud > 0.0 {
            quality / all_cloud
        } else {
            1.0
        },
        kept_on_edge: share(PolicyOutcome::Edge),
        up_before_prefill: share(PolicyOutcome::CloudBeforePrefill),
        up_after_prefill: share(PolicyOutcome::CloudAfterPrefill),
        prefill_s_spent_on_escalated: set
            .iter()
            .filter(|g| g.routed.outcome == PolicyOutcome::CloudAfterPrefill)
            .map(|g| g.edge.prefill_s)
            .sum(),
        router_us_p50: at(0.5).unwrap_or(0.0),
        router_us_p99: at(0.99).unwrap_or(0.0),
    }
}

/// The seed's traffic: 70 % routine prompts and code, 30 % complex ones (MMLU and GSM8K), as
/// many as the smaller pool allows, drawn with a fixed seed.
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

/// The report over every benchmark and the mix.
pub fn evaluate(graded: &[Graded], model: &str, cloud: &str) -> Report {
    let mut benchmarks = BTreeMap::new();
    let mut names: Vec<&str> = graded.iter().map(|g| g.item.benchmark.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    for name in names {
        let set: Vec<&Graded> = graded.iter().filter(|g| g.item.benchmark == name).collect();
        benchmarks.insert(name.to_string(), report(&set));
    }
    let items: Vec<Item> = graded.iter().map(|g| g.item.clone()).collect();
    let mix: Vec<&Graded> = bimodal_mix(&items)
        .into_iter()
        .map(|i| &graded[i])
        .collect();
    if !mix.is_empty() {
        benchmarks.insert("mix".into(), report(&mix));
    }
    Report {
        quality_model: model.into(),
        cloud: cloud.into(),
        benchmarks,
    }
}

/// The training examples the items make (their features, the edge's state and grade).
pub fn examples(items: &[Item], edge: &[EdgeAnswer]) -> Vec<quality::Example> {
    items
        .iter()
        .zip(edge)
        .map(|(item, e)| quality::Example {
            text: quality::read_turn(item.question.prompt(), None).features,
            edge: e.signals,
            state: e.state.clone(),
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
) -> anyhow::Result<Vec<Routed>> {
    let all = examples(items, edge);
    let mut groups: Vec<&str> = items.iter().map(|i| i.group.as_str()).collect();
    groups.sort_unstable();
    groups.dedup();
    let mut routed = vec![None; items.len()];
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
            routed[i] = Some(route_one(item, &edge[i], ctx, Ok(&model)));
        }
    }
    Ok(routed.into_iter().flatten().collect())
}

/// What `eval route` runs on.
pub struct Run<'a> {
    pub data: &'a Path,
    pub edge_model: &'a Path,
    pub cloud: Cloud<'a>,
    pub cache: &'a Path,
    pub limit: route_data::Limits,
    pub cross_fitted: bool,
    /// Where to write the graded prompts' examples (JSON lines), if anywhere.
    pub examples_out: Option<&'a Path>,
    /// The quality model to route with, where not the bundled one.
    pub quality: Option<&'a QualityModel>,
}

/// Runs the whole evaluation: load, answer on the edge and in the cloud, route, report.
pub fn run(r: &Run) -> anyhow::Result<Report> {
    let items = route_data::load_benchmarks(r.data, r.limit)?;
    let mut grader = EdgeGrader::open(r.edge_model, r.cache)?;
    let answers = grade(&items, &mut grader, "edge answers")?;
    let sha = grader.sha256().to_string();
    drop(grader);
    let clouds = cloud_grades(&items, &r.cloud, r.cache)?;
    if let Some(path) = r.examples_out {
        write_examples(path, &items, &answers, Some(&clouds))?;
    }
    let ctx = eval_context(&sha);
    let (routed, model) = if r.cross_fitted {
        let routed = cross_fit(&items, &answers, &ctx, &sha)?;
        (
            routed,
            "cross-fitted, one domain left out per fit".to_string(),
        )
    } else {
        let model = match r.quality {
            Some(m) => Ok(m),
            None => quality::bundled_for(Some(&sha)),
        };
        let name = match &model {
            Ok(m) if m.knows_edge(Some(&sha)) => m.version.clone(),
            Ok(m) => format!(
                "{} (trained for another edge model: text features only)",
                m.version
            ),
            Err(e) => format!("none ({e}): the priors stand in"),
        };
        let routed = items
            .iter()
            .zip(&answers)
            .map(|(item, a)| route_one(item, a, &ctx, model.clone()))
            .collect();
        (routed, name)
    };
    let graded: Vec<Graded> = items
        .iter()
        .zip(&answers)
        .zip(clouds)
        .zip(routed)
        .map(|(((item, edge), cloud), routed)| Graded {
            item,
            edge,
            cloud,
            routed,
        })
        .collect();
    let cloud = match &r.cloud {
        Cloud::Model(p) => format!(
            "GPT-4 as RouteLLM recorded it for MMLU and GSM8K; {} elsewhere",
            p.file_name().unwrap_or_default().to_string_lossy()
        ),
        Cloud::Endpoint(base) => {
            format!("GPT-4 as RouteLLM recorded it for MMLU and GSM8K; the model at {base} elsewhere")
        }
        Cloud::AlwaysRight => {
            "GPT-4 as RouteLLM recorded it for MMLU and GSM8K; counted right elsewhere (an upper bound)".into()
        }
    };
    Ok(evaluate(&graded, &model, &cloud))
}

/// The report as Markdown tables: one row per router per benchmark, then the shipped
/// policy's operating point per benchmark.
pub fn table(r: &Report) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let pct = |v: Option<f64>| v.map_or("—".to_owned(), |v| format!("{:.1}%", v * 100.0));
    let num = |v: Option<f64>| v.map_or("—".to_owned(), |v| format!("{v:.3}"));
    let _ = writeln!(
        out,
        "quality model: {}\ncloud: {}\n",
        r.quality_model, r.cloud
    );
    let _ = writeln!(
        out,
        "| benchmark | prompts | edge acc. (shown) | edge acc. (scored) | cloud acc. | router | APGR | CPT(50%) | CPT(80%) | cloud calls saved @95% | AUROC (edge wrong) |"
    );
    let _ = writeln!(
        out,
        "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|"
    );
    let order = [
        "random (20 seeds)",
        "prior-only",
        "text-only",
        "first token",
        "state-aware (shipped)",
        "oracle",
    ];
    for (name, b) in &r.benchmarks {
        for router in order {
            let Some(m) = b.routers.get(router) else {
                continue;
            };
            let _ = writeln!(
                out,
                "| {name} | {} | {:.3} | {} | {:.3} | {router} | {:.3} | {} | {} | {} | {} |",
                b.prompts,
                b.edge_accuracy,
                num(b.edge_accuracy_scored),
                b.cloud_accuracy,
                m.apgr,
                pct(m.cpt50),
                pct(m.cpt80),
                pct(m.saved_at_95),
                num(m.auroc)
            );
        }
    }
    let _ = writeln!(
        out,
        "\nThe shipped policy's own decisions (balanced preset):\n\n| benchmark | quality / all-cloud | kept on the edge | up before prefill | up after prefill | edge prefill spent on what went up | router p50 / p99 (native) |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|");
    for (name, b) in &r.benchmarks {
        let p = &b.shipped_policy;
        let _ = writeln!(
            out,
            "| {name} | {:.1}% | {:.1}% | {:.1}% | {:.1}% | {:.1} s | {:.0} / {:.0} µs |",
            p.quality_of_all_cloud * 100.0,
            p.kept_on_edge * 100.0,
            p.up_before_prefill * 100.0,
            p.up_after_prefill * 100.0,
            p.prefill_s_spent_on_escalated,
            p.router_us_p50,
            p.router_us_p99
        );
    }
    out
}

/// Answers the training prompts on `edge_model` and fits the quality model for it; with
/// `examples_out`, also writes what it was fitted on there ([`write_examples`]).
pub fn train_quality(
    data: &[&Path],
    edge_model: &Path,
    cache: &Path,
    limit: Option<usize>,
    examples_out: Option<&Path>,
) -> anyhow::Result<TrainedQuality> {
    let mut items = Vec::new();
    for dir in data {
        items.extend(route_data::load_training(dir, limit)?);
    }
    let mut grader = EdgeGrader::open(edge_model, cache)?;
    let answers = grade(&items, &mut grader, "edge answers")?;
    if let Some(path) = examples_out {
        write_examples(path, &items, &answers, None)?;
    }
    let right = answers.iter().filter(|a| a.correct).count();
    let dirs: Vec<String> = data.iter().map(|d| d.display().to_string()).collect();
    let provenance = format!(
        "{} graded prompts from {} ({right} answered right by the edge, read as the product \
         shows them)",
        items.len(),
        dirs.join(" and ")
    );
    let examples = examples(&items, &answers);
    let groups: Vec<&str> = items.iter().map(|i| i.group.as_str()).collect();
    let bar = Policy::default().min_edge_quality;
    let fitted = quality::train(&examples, grader.sha256(), &provenance)?;
    let (model, shares) = quality::with_pre_generation_share(fitted, &examples, bar);
    let chosen = model.pre_generation_share;
    Ok(TrainedQuality {
        prefill: quality_folds::when_to_prefill(&shares, chosen, examples.len(), bar),
        folds: quality_folds::leave_one_set_out(&groups, &examples, grader.sha256()),
        model,
    })
}

/// A quality model, how its settings rank each training set left out in turn, and what each
/// pre-generation share of the bar would send up unprefilled.
pub struct TrainedQuality {
    pub model: QualityModel,
    pub folds: Vec<quality_folds::Fold>,
    pub prefill: String,
}

/// The examples as JSON lines, `{benchmark, group, text, signals, state, edge_ok,
/// cloud_ok}`: what a quality model is fitted or evaluated on, for study outside the project.
pub fn write_examples(
    path: &Path,
    items: &[Item],
    answers: &[EdgeAnswer],
    clouds: Option<&[f64]>,
) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut out = std::io::BufWriter::new(
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
    );
    let examples = examples(items, answers);
    for (i, ((item, a), e)) in items.iter().zip(answers).zip(examples).enumerate() {
        let line = serde_json::json!({
            "benchmark": item.benchmark, "group": item.group, "prompt": item.question.prompt(),
            "answer": a.answer, "text": e.text,
            "signals": a.signals, "state": a.state, "edge_ok": a.correct,
            "scored_ok": a.scored_correct, "prefill_s": a.prefill_s,
            "cloud_ok": clouds.and_then(|c| c.get(i)),
        });
        writeln!(out, "{line}")?;
    }
    Ok(())
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
        write(
            "code/tiny.jsonl",
            "{\"task_id\": 1, \"prompt\": \"Write a Python function double(x) that returns twice x.\", \"test_setup_code\": \"\", \"tests\": [\"assert double(2) == 4\"]}\n",
        );
    }

    #[test]
    fn the_shipped_router_is_evaluated_with_real_models_and_their_answers_cached() {
        let Some(model) = crate::test_support::test_model() else {
            return;
        };
        let dir = std::env::temp_dir().join(format!("route-eval-{}", std::process::id()));
        fixture(&dir);
        let cache = dir.join("cache");
        // The smallest real model stands in for both tiers here: what is tested is the
        // evaluation's plumbing, not either model's skill.
        let run_once = || {
            run(&Run {
                data: &dir,
                edge_model: &model,
                cloud: Cloud::Model(&model),
                cache: &cache,
                limit: route_data::Limits::default(),
                cross_fitted: false,
                examples_out: None,
                quality: None,
            })
            .expect("evaluates")
        };
        let report = run_once();
        let json = serde_json::to_value(&report).expect("json");
        for bench in ["mmlu", "gsm8k", "reviews", "code", "mix"] {
            let b = &json["benchmarks"][bench];
            for router in [
                "state-aware (shipped)",
                "text-only",
                "random (20 seeds)",
                "prior-only",
                "oracle",
            ] {
                assert!(
                    b["routers"][router]["apgr"].is_number(),
                    "{bench}/{router}: {b}"
                );
            }
            assert!(
                b["shipped_policy"]["kept_on_edge"].is_number(),
                "{bench}: {b}"
            );
        }
        assert_eq!(json["benchmarks"]["mmlu"]["prompts"], 2);
        // The cloud answered the routine prompts itself, as the edge did: the same model.
        let reviews = &json["benchmarks"]["reviews"];
        assert_eq!(reviews["cloud_accuracy"], reviews["edge_accuracy"]);
        assert!(reviews["edge_accuracy_scored"].is_number());
        // A second run answers from the cache: the same report, no model runs needed.
        let mut grader = EdgeGrader::open(&model, &cache).expect("opens");
        let items =
            route_data::load_benchmarks(&dir, route_data::Limits::default()).expect("loads");
        assert!(items.iter().all(|i| grader.is_cached(&i.question)));
        assert_eq!(
            grade(&items, &mut grader, "x").expect("cached").len(),
            items.len()
        );
        let again = run_once();
        assert_eq!(
            again.benchmarks["mmlu"].edge_accuracy,
            report.benchmarks["mmlu"].edge_accuracy
        );
        assert_eq!(
            again.benchmarks["mix"].routers,
            report.benchmarks["mix"].routers
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn missing_keys_and_malformed_rows_are_named() {
        let dir = std::env::temp_dir().join(format!("route-eval-bad-{}", std::process::id()));
        fixture(&dir);
        std::fs::write(dir.join("classify/reviews.jsonl"), "{\"prompt\": 1}\n").expect("write");
        let err = format!(
            "{:#}",
            route_data::load_benchmarks(&dir, route_data::Limits::default())
                .expect_err("malformed")
        );
        assert!(err.contains("reviews.jsonl: line 1"), "{err}");
        std::fs::write(dir.join("classify/reviews.jsonl"), "").expect("write");
        std::fs::write(dir.join("mmlu-answers/geography_test.csv"), "q,a,b,c,d,E\n").expect("w");
        let err = format!(
            "{:#}",
            route_data::load_benchmarks(&dir, route_data::Limits::default()).expect_err("bad key")
        );
        assert!(err.contains("answer must be A–D"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
