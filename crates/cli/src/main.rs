//! `straddle`: the command-line face of the engine and the router.

mod answer_cache;
mod answer_text;
mod auroc;
mod bench_speculative;
mod bench_structured;
mod chat;
mod cloud_answers;
mod cloud_client;
mod code_grade;
mod delay_proxy;
mod edge_answers;
mod eval;
mod model_file;
mod pii;
mod progress;
mod quality_folds;
mod question;
mod requant;
mod route_data;
mod route_eval;
mod routellm;
mod sim;
mod speculative;
#[cfg(test)]
mod test_support;
mod train_router;

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Parser, Subcommand};
use straddle_engine::gguf::{FileSource, Gguf, Value};

#[derive(Parser)]
#[command(version, about = "Straddle: hybrid edge-cloud LLM inference")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print a GGUF file's metadata and tensor directory.
    Gguf {
        path: PathBuf,
        /// Also list every tensor.
        #[arg(long)]
        tensors: bool,
    },
    /// Rewrite a GGUF's weight matrices of one block type in another (e.g. a lower-precision
    /// copy of a model to draft for it).
    Requant {
        input: PathBuf,
        output: PathBuf,
        #[arg(long, value_enum, default_value = "q4-1")]
        from: requant::Target,
        #[arg(long, value_enum)]
        to: requant::Target,
    },
    /// Scan text for personal data and print the entity classes found; with `--jsonl`,
    /// scan one `{"id", "text"}` a line from standard input and write one `{"id", "spans"}`
    /// a line (offsets in code points, end exclusive).
    Pii {
        #[arg(required_unless_present = "jsonl")]
        text: Option<String>,
        #[arg(long, conflicts_with = "text")]
        jsonl: bool,
    },
    /// Train the PII tagger (names, places, organisations, addresses without cue words)
    /// and write the model the router bundles.
    TrainPii {
        /// Labelled corpus in the `{full_text, spans}` shape (make_corpus.py writes one).
        #[arg(long)]
        data: PathBuf,
        /// First names, surnames, cities and countries, one `class<tab>name` a line.
        #[arg(long)]
        gazetteer: PathBuf,
        #[arg(long, default_value = "crates/router/data/pii-tagger.bin")]
        out: PathBuf,
        #[arg(long, default_value_t = straddle_router::pii::tagger::TrainConfig::default().epochs)]
        epochs: usize,
        /// Hash buckets of the weights (a power of two; each costs 18 bytes in the file).
        #[arg(long, default_value_t = straddle_router::pii::tagger::TrainConfig::default().buckets)]
        buckets: usize,
        /// A held-out corpus to evaluate the new tagger on after training.
        #[arg(long)]
        heldout: Option<PathBuf>,
    },
    /// Train the router's task-type model, report held-out accuracy, write the model.
    TrainRouter {
        /// Labelled JSONL corpus (`text`, `label`, `lang`).
        #[arg(long, default_value = "crates/router/data/tasks.jsonl")]
        corpus: PathBuf,
        /// Where the trained model goes (the router bundles this file).
        #[arg(long, default_value = "crates/router/data/task-model.bin")]
        out: PathBuf,
        /// Train the quality model instead, from the graded prompts under these directories
        /// (the training splits' layout of `../shared/data/train`, or our own generated
        /// prompts' `classify/`, `short/`, `letter/`, `number/` and `code/`), answered by
        /// `--edge` as the product would show the answers.
        #[arg(long)]
        quality_data: Vec<PathBuf>,
        /// At most this many prompts from each training file (a fixed-seed draw).
        #[arg(long)]
        limit_per_file: Option<usize>,
        /// Also write the examples the quality model is fitted on (JSON lines), for study.
        #[arg(long)]
        examples_out: Option<PathBuf>,
        /// The edge model the quality model is trained for (default: the model `cargo xtask
        /// setup` fetched).
        #[arg(long, env = "STRADDLE_MODEL")]
        edge: Option<PathBuf>,
        /// Where the quality model goes (the router bundles the files of this folder).
        #[arg(
            long,
            default_value = "crates/router/data/quality-models/qwen2.5-coder-0.5b.json"
        )]
        quality_out: PathBuf,
    },
    /// Compare routing policies (the seed-1 EdgeRouter baseline, the fixed policy with and
    /// without the energy and load signals, the bandit) on a simulated day: drifting
    /// difficulty, a phone's battery running down, bursts of load at the cloud.
    Sim {
        /// Requests in the stream.
        #[arg(long, default_value_t = 100)]
        requests: usize,
        #[arg(long, default_value_t = 42)]
        seed: u64,
        /// One request in this many carries a card number.
        #[arg(long, default_value_t = 20)]
        personal_every: usize,
        /// The simulated world: `day` (both), `calm-cloud` (no bursts) or `on-mains` (the
        /// phone plugged in all day).
        #[arg(long, default_value = "day")]
        world: String,
    },
    /// Mint a tenant token (HS256) the way a tenant's backend would, for local testing.
    Token {
        #[arg(long)]
        tenant: String,
        /// The tenant's secret (the worker's `TENANT_SECRET_<TENANT>`).
        #[arg(long, env = "STRADDLE_TENANT_SECRET")]
        secret: String,
        #[arg(long, default_value = "local-user")]
        user: String,
        /// Page origin the token is bound to (a browser token needs one).
        #[arg(long, required_unless_present = "server", conflicts_with = "server")]
        origin: Option<String>,
        /// A token for the tenant's backend: no origin, refused from a page.
        #[arg(long)]
        server: bool,
        /// Lifetime in seconds (the worker refuses more than the tenant's
        /// `max_token_lifetime_s`, an hour unless set).
        #[arg(long, default_value_t = 900)]
        ttl: u64,
    },
    /// Answer a prompt on the edge engine, from the cloud, or speculatively (the edge drafts,
    /// the cloud verifies); the text streams to standard output, a summary to standard error.
    Chat(chat::ChatArgs),
    /// Benchmark speculative decoding beside plain cloud streaming at simulated round-trip
    /// times (what `cargo xtask bench speculative` runs).
    BenchSpeculative(bench_speculative::BenchArgs),
    /// Benchmark constrained decoding on real-world JSON schemas with the edge model (what
    /// `cargo xtask bench structured` runs).
    BenchStructured(bench_structured::BenchArgs),
    /// Evaluate the router on benchmark data.
    Eval {
        #[command(subcommand)]
        benchmark: Eval,
    },
}

#[derive(Subcommand)]
enum Eval {
    /// The personal-data detector on a labelled corpus (`{full_text, spans}` JSON lines):
    /// recall per class, typed precision, request-level recall on direct identifiers,
    /// false alarms on clean texts.
    Pii {
        #[arg(long)]
        data: PathBuf,
        /// A tagger model to use instead of the bundled one.
        #[arg(long, conflicts_with = "no_tagger")]
        tagger: Option<PathBuf>,
        /// The rules alone, without the tagger (for comparison).
        #[arg(long)]
        no_tagger: bool,
        /// Score another detector's spans (`straddle pii --jsonl`'s output shape, one line
        /// per text in the corpus's order) instead of running ours.
        #[arg(long, conflicts_with_all = ["tagger", "no_tagger"])]
        predictions: Option<PathBuf>,
    },
    /// RouteLLM's strong/weak routing benchmarks (MMLU, GSM8K, MT-Bench) and metrics.
    Routellm {
        /// A directory holding RouteLLM's evaluation files.
        #[arg(long)]
        data: PathBuf,
        /// The weak model's column.
        #[arg(long, default_value = routellm::DEFAULT_WEAK)]
        weak: String,
        /// The strong model's column.
        #[arg(long, default_value = routellm::DEFAULT_STRONG)]
        strong: String,
        /// Threshold quantile bins (RouteLLM uses 10).
        #[arg(long, default_value_t = 10)]
        bins: usize,
        /// Cross-fitting folds for the learned scorer.
        #[arg(long, default_value_t = 5)]
        folds: usize,
        /// Seeds the random router is averaged over.
        #[arg(long, default_value_t = 20)]
        random_seeds: u64,
        /// Also print each curve's points.
        #[arg(long)]
        curves: bool,
    },
    /// The shipped router with the real edge model: MMLU, GSM8K, routine prompts and code
    /// answered on the edge as the product shows them, graded, and routed as the page routes
    /// them, beside the cloud model's own answers.
    Route {
        /// A directory in the layout of `../shared/data` (`routellm/`, `mmlu-answers/`,
        /// `gsm8k/`, `classify/*.jsonl`, `code/*.jsonl`).
        #[arg(long)]
        data: PathBuf,
        /// The edge model (any GGUF the engine loads).
        #[arg(long, env = "STRADDLE_MODEL")]
        edge: Option<PathBuf>,
        /// The cloud model that answers the routine and code prompts (run once, cached);
        /// MMLU and GSM8K use GPT-4's answers as RouteLLM recorded them.
        #[arg(long)]
        cloud_model: Option<PathBuf>,
        /// Ask an OpenAI-compatible server instead (its base URL: `straddle-cloud`,
        /// `llama-server`, a hosted API), once per prompt, cached under the model it names.
        #[arg(long, conflicts_with = "cloud_model")]
        cloud_url: Option<String>,
        /// Count the cloud right on every routine and code prompt instead (an upper bound).
        #[arg(long, conflicts_with_all = ["cloud_model", "cloud_url"])]
        cloud_upper_bound: bool,
        /// Also write every graded prompt's features, edge state and grades (JSON lines).
        #[arg(long)]
        examples_out: Option<PathBuf>,
        /// At most this many prompts per domain (GSM8K and each routine set count as one).
        #[arg(long)]
        limit_per_domain: Option<usize>,
        /// At most this many per MMLU domain, where it should differ (MMLU has 28).
        #[arg(long)]
        mmlu_limit_per_domain: Option<usize>,
        /// Refit the quality model leaving each domain out, for development.
        #[arg(long)]
        cross_fit: bool,
        /// Route with this quality model (`straddle train-router --quality-out`'s file)
        /// instead of the bundled one: a model is judged here before it ships.
        #[arg(long, conflicts_with = "cross_fit")]
        quality_model: Option<PathBuf>,
        /// Print one JSON object instead of the table.
        #[arg(long)]
        json: bool,
        /// Where the edge's answers are cached.
        #[arg(long)]
        cache: Option<PathBuf>,
    },
}

/// Parses the command line and runs the command it names.
fn main() -> anyhow::Result<()> {
    init_tracing();
    dispatch(Cli::parse().command)
}

/// Logs to standard error, so they never mix with an answer or a report on standard output;
/// warnings only unless `RUST_LOG` says otherwise.
fn init_tracing() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
}

/// Runs one subcommand.
fn dispatch(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Chat(args) => chat::run(&args),
        Command::Gguf { path, tensors } => gguf(&path, tensors),
        Command::BenchSpeculative(args) => {
            print!("{}", bench_speculative::run(&args)?);
            Ok(())
        }
        Command::BenchStructured(args) => {
            print!("{}", bench_structured::run(&args)?);
            Ok(())
        }
        Command::Requant {
            input,
            output,
            from,
            to,
        } => requant(&input, &output, from, to),
        Command::Pii { jsonl: true, .. } => {
            pii::scan_jsonl(std::io::stdin().lock(), std::io::stdout().lock())?;
            Ok(())
        }
        Command::Pii { text, .. } => {
            print_pii(text.as_deref().unwrap_or_default());
            Ok(())
        }
        Command::TrainPii {
            data,
            gazetteer,
            out,
            epochs,
            buckets,
            heldout,
        } => train_pii(&data, &gazetteer, &out, epochs, buckets, heldout.as_deref()),
        Command::Sim {
            requests,
            seed,
            personal_every,
            world,
        } => sim::command(&world, requests, seed, personal_every),
        Command::Token {
            tenant,
            secret,
            user,
            origin,
            server,
            ttl,
        } => token(tenant, &secret, user, origin, server, ttl),
        Command::TrainRouter {
            quality_data,
            edge,
            quality_out,
            limit_per_file,
            examples_out,
            ..
        } if !quality_data.is_empty() => train_quality(
            &quality_data,
            edge,
            &quality_out,
            (limit_per_file, examples_out.as_deref()),
        ),
        Command::TrainRouter { corpus, out, .. } => train_router(&corpus, &out),
        Command::Eval { benchmark } => eval(benchmark),
    }
}

/// Runs one `straddle eval` benchmark.
fn eval(benchmark: Eval) -> anyhow::Result<()> {
    match benchmark {
        Eval::Pii {
            data,
            tagger,
            no_tagger,
            predictions,
        } => eval_pii(&data, tagger.as_deref(), no_tagger, predictions.as_deref()),
        Eval::Route {
            data,
            edge,
            cloud_model,
            cloud_url,
            cloud_upper_bound,
            examples_out,
            limit_per_domain,
            mmlu_limit_per_domain,
            cross_fit,
            quality_model,
            json,
            cache,
        } => {
            let quality = quality_model
                .as_deref()
                .map(read_quality_model)
                .transpose()?;
            let edge = edge.unwrap_or_else(|| straddle_models::DEFAULT_EDGE.path());
            let cloud_model = cloud_model.unwrap_or_else(|| straddle_models::DEFAULT_CLOUD.path());
            let cache = cache.unwrap_or_else(default_cache);
            let run = route_eval::Run {
                data: &data,
                edge_model: &edge,
                cloud: match (cloud_upper_bound, &cloud_url) {
                    (true, _) => route_eval::Cloud::AlwaysRight,
                    (false, Some(url)) => route_eval::Cloud::Endpoint(url),
                    (false, None) => route_eval::Cloud::Model(&cloud_model),
                },
                cache: &cache,
                limit: route_data::Limits {
                    per_domain: limit_per_domain,
                    per_mmlu_domain: mmlu_limit_per_domain.or(limit_per_domain),
                },
                cross_fitted: cross_fit,
                quality: quality.as_ref(),
                examples_out: examples_out.as_deref(),
            };
            eval_route(&run, json)
        }
        Eval::Routellm {
            data,
            weak,
            strong,
            bins,
            folds,
            random_seeds,
            curves,
        } => {
            let settings = routellm::Settings {
                bins,
                folds,
                random_seeds,
                train: straddle_router::linear::TrainConfig::default(),
            };
            eval_routellm(&data, &weak, &strong, settings, curves)
        }
    }
}

/// Rewrites `input`'s `from` matrices as `to` into `output`.
fn requant(
    input: &Path,
    output: &Path,
    from: requant::Target,
    to: requant::Target,
) -> anyhow::Result<()> {
    let n = requant::run(input, output, from, to)?;
    println!(
        "{n} tensors rewritten as {to:?}; wrote {}",
        output.display()
    );
    Ok(())
}

/// Prints the personal data found in `text`, one span a line.
fn print_pii(text: &str) {
    for span in straddle_router::pii::detect(text) {
        println!(
            "{:?}\t{}..{}\t{:.2}",
            span.kind, span.start, span.end, span.confidence
        );
    }
}

/// Trains and writes the PII tagger, then scores it on `heldout` when one is given.
fn train_pii(
    data: &Path,
    gazetteer: &Path,
    out: &Path,
    epochs: usize,
    buckets: usize,
    heldout: Option<&Path>,
) -> anyhow::Result<()> {
    let config = straddle_router::pii::tagger::TrainConfig {
        epochs,
        buckets,
        ..Default::default()
    };
    let tagger = pii::train(data, gazetteer, out, config)?;
    println!("wrote {} ({})", out.display(), tagger.version());
    if let Some(heldout) = heldout {
        let examples = pii::read_corpus(heldout)?;
        let report = pii::evaluate(&examples, |t| {
            straddle_router::pii::detect_with(t, Some(&tagger))
        });
        print!("{}", report.render());
    }
    Ok(())
}

/// Mints and prints a tenant token valid from now for `ttl` seconds.
fn token(
    tenant: String,
    secret: &str,
    user: String,
    origin: Option<String>,
    server: bool,
    ttl: u64,
) -> anyhow::Result<()> {
    use straddle_protocol::token::{AUDIENCE, Claims, TokenKind, mint};
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .context("the clock is before 1970")?
        .as_secs();
    let claims = Claims {
        ten: tenant,
        sub: user,
        sid: format!("cli-{now}"),
        aud: AUDIENCE.into(),
        exp: now + ttl,
        nbf: now,
        iat: now,
        kind: if server {
            TokenKind::Server
        } else {
            TokenKind::Browser
        },
        origin,
        feat: None,
    };
    println!("{}", mint(&claims, secret.as_bytes()));
    Ok(())
}

/// A quality model from a file, checked as the bundled ones are.
fn read_quality_model(path: &Path) -> anyhow::Result<straddle_router::quality::QualityModel> {
    let json = std::fs::read_to_string(path)
        .with_context(|| format!("reading the quality model {}", path.display()))?;
    straddle_router::quality::QualityModel::from_json(&json)
        .with_context(|| format!("the quality model {}", path.display()))
}

/// Trains the quality model on `edge`'s graded answers to the prompts under `data`.
fn train_quality(
    data: &[PathBuf],
    edge: Option<PathBuf>,
    quality_out: &Path,
    (limit, examples_out): (Option<usize>, Option<&Path>),
) -> anyhow::Result<()> {
    let edge = edge.unwrap_or_else(|| straddle_models::DEFAULT_EDGE.path());
    let dirs: Vec<&Path> = data.iter().map(PathBuf::as_path).collect();
    let trained = route_eval::train_quality(&dirs, &edge, &default_cache(), limit, examples_out)?;
    println!("Each training set left out in turn, ranked by a model fitted to the others:\n");
    println!("{}", quality_folds::render(&trained.folds));
    println!("When to prefill, on the same answers with the model fitted to all of them:\n");
    println!("{}", trained.prefill);
    let model = trained.model;
    std::fs::write(quality_out, serde_json::to_string_pretty(&model)? + "\n")
        .with_context(|| format!("writing {}", quality_out.display()))?;
    println!("wrote {} ({})", quality_out.display(), model.version);
    Ok(())
}

/// Trains the task-type model on `corpus`, prints its held-out report and writes it to `out`.
fn train_router(corpus: &Path, out: &Path) -> anyhow::Result<()> {
    let examples = train_router::read_corpus(corpus)?;
    let report = train_router::run(&examples, out)?;
    print!("{}", report.render());
    println!("wrote {}", out.display());
    Ok(())
}

/// Routes the benchmark prompts with the edge model and prints the outcome.
fn eval_route(run: &route_eval::Run, json: bool) -> anyhow::Result<()> {
    let report = route_eval::run(run)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", route_eval::table(&report));
    }
    Ok(())
}

/// Scores the routers on RouteLLM's benchmarks for the `weak` and `strong` columns.
fn eval_routellm(
    data: &Path,
    weak: &str,
    strong: &str,
    settings: routellm::Settings,
    curves: bool,
) -> anyhow::Result<()> {
    let (folds, random_seeds) = (settings.folds, settings.random_seeds);
    let benchmarks = routellm::load(data, weak, strong)?;
    let rows = routellm::evaluate(&benchmarks, settings)?;
    println!(
        "weak = {weak}, strong = {strong}; straddle = hashed n-gram logistic model of \
         P(weak model fails), {folds}-fold cross-fitted over all benchmarks pooled (an \
         MMLU domain never shares a fold); random = mean of {random_seeds} seeds\n"
    );
    print!("{}", routellm::table(&rows, &benchmarks));
    if curves {
        print!("\n{}", routellm::curves(&rows));
    }
    Ok(())
}

fn default_cache() -> PathBuf {
    edge_answers::default_cache_dir()
}

fn eval_pii(
    data: &std::path::Path,
    tagger: Option<&std::path::Path>,
    none: bool,
    predictions: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    use straddle_router::pii::tagger::{self as pii_tagger, Tagger};
    let examples = pii::read_corpus(data)?;
    if let Some(path) = predictions {
        let report = pii::evaluate_predictions(&examples, path)?;
        let (n, from) = (examples.len(), data.display());
        println!(
            "{n} texts from {from}; detector: spans from {}\n",
            path.display()
        );
        print!("{}", report.render());
        return Ok(());
    }
    let loaded = match tagger {
        Some(path) => {
            let bytes =
                std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
            Some(
                Tagger::from_bytes(&bytes)
                    .with_context(|| format!("loading {}", path.display()))?,
            )
        }
        None if none => None,
        None => Some(
            pii_tagger::bundled()
                .map_err(|e| anyhow::anyhow!("the bundled tagger: {e}"))?
                .clone(),
        ),
    };
    let name = loaded
        .as_ref()
        .map_or_else(|| "rules only".to_string(), Tagger::version);
    println!(
        "{} texts from {}; detector: rules + {name}\n",
        examples.len(),
        data.display()
    );
    let report = pii::evaluate(&examples, |t| {
        straddle_router::pii::detect_with(t, loaded.as_ref())
    });
    print!("{}", report.render());
    Ok(())
}

fn gguf(path: &std::path::Path, tensors: bool) -> anyhow::Result<()> {
    let source = FileSource::open(path).with_context(|| format!("opening {}", path.display()))?;
    let g = Gguf::read(source).with_context(|| format!("reading {}", path.display()))?;
    println!(
        "GGUF v{}: {} metadata keys, {} tensors",
        g.version,
        g.metadata.len(),
        g.tensors.len()
    );
    for (k, v) in &g.metadata {
        println!("  {k} = {}", short(v));
    }
    if tensors {
        for t in &g.tensors {
            println!("  {:<40} {:?} {:?} {} bytes", t.name, t.ty, t.shape, t.size);
        }
    }
    Ok(())
}

fn short(v: &Value) -> String {
    match v {
        Value::Array(items) => format!("[{} items]", items.len()),
        Value::String(s) if s.len() > 80 => {
            format!("{:?}…", s.chars().take(80).collect::<String>())
        }
        other => format!("{other:?}"),
    }
}
