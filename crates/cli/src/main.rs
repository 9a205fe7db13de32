//! `straddle`: the command-line face of the engine and the router.

mod bench_speculative;
mod chat;
mod delay_proxy;
mod requant;
mod routellm;
mod speculative;
#[cfg(test)]
mod test_support;
mod train_router;

use std::path::PathBuf;

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
    /// Scan text for personal data and print the entity classes found.
    Pii { text: String },
    /// Train the router's task-type model, report held-out accuracy, write the model.
    TrainRouter {
        /// Labelled JSONL corpus (`text`, `label`, `lang`).
        #[arg(long, default_value = "crates/router/data/tasks.jsonl")]
        corpus: PathBuf,
        /// Where the trained model goes (the router bundles this file).
        #[arg(long, default_value = "crates/router/data/task-model.bin")]
        out: PathBuf,
    },
    /// Compare routing policies (the seed-1 EdgeRouter baseline, the fixed policy, the
    /// bandit) on a simulated stream with drifting difficulty.
    Sim {
        /// Requests in the stream.
        #[arg(long, default_value_t = 100)]
        requests: usize,
        #[arg(long, default_value_t = 42)]
        seed: u64,
        /// One request in this many carries a card number.
        #[arg(long, default_value_t = 20)]
        personal_every: usize,
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
        /// Page origin the token is bound to.
        #[arg(long)]
        origin: Option<String>,
        /// Lifetime in seconds.
        #[arg(long, default_value_t = 900)]
        ttl: u64,
    },
    /// Answer a prompt on the edge engine, from the cloud, or speculatively (the edge drafts,
    /// the cloud verifies); the text streams to standard output, a summary to standard error.
    Chat {
        /// The prompt (read from standard input when absent).
        prompt: Option<String>,
        /// The edge model (default: the model fetched by `cargo xtask setup`).
        #[arg(long, env = "STRADDLE_MODEL")]
        model: Option<PathBuf>,
        /// The worker or cloud server to escalate to.
        #[arg(long, env = "STRADDLE_CLOUD")]
        cloud: Option<String>,
        /// A tenant token for the worker (`straddle token`).
        #[arg(long, env = "STRADDLE_TOKEN")]
        token: Option<String>,
        #[arg(long, value_enum, default_value = "edge")]
        mode: chat::Mode,
        /// Shorthand for `--mode speculative`.
        #[arg(long)]
        speculative: bool,
        #[arg(long)]
        system: Option<String>,
        #[arg(long, default_value_t = 256)]
        max_tokens: usize,
        #[arg(long, default_value_t = 0.0)]
        temperature: f32,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Tokens drafted per verify call at first (adapted as acceptance is measured).
        #[arg(long, default_value_t = 4)]
        draft: usize,
        /// Longest draft.
        #[arg(long, default_value_t = 16)]
        max_draft: usize,
        /// Seconds one cloud call may take.
        #[arg(long, default_value_t = 60)]
        timeout: u64,
    },
    /// Benchmark speculative decoding beside plain cloud streaming at simulated round-trip
    /// times (what `cargo xtask bench speculative` runs).
    BenchSpeculative {
        /// The drafting (edge) model.
        #[arg(long, env = "STRADDLE_MODEL")]
        model: Option<PathBuf>,
        /// The cloud server (http://host:port), reached through a delay proxy.
        #[arg(long)]
        cloud: String,
        #[arg(long, default_value = "crates/cli/data/speculative-prompts.jsonl")]
        prompts: PathBuf,
        /// Round-trip times to simulate, in ms.
        #[arg(long, value_delimiter = ',', default_value = "0,20,50,80")]
        rtt: Vec<u64>,
        #[arg(long, default_value_t = 64)]
        max_tokens: usize,
        #[arg(long, default_value_t = 4)]
        draft: usize,
        /// Shortest draft (set equal to --max-draft for a fixed k).
        #[arg(long, default_value_t = 1)]
        min_draft: usize,
        #[arg(long, default_value_t = 16)]
        max_draft: usize,
    },
    /// Evaluate the router on benchmark data.
    Eval {
        #[command(subcommand)]
        benchmark: Eval,
    },
}

#[derive(Subcommand)]
enum Eval {
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
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Chat {
            prompt,
            model,
            cloud,
            token,
            mode,
            speculative,
            system,
            max_tokens,
            temperature,
            seed,
            draft,
            max_draft,
            timeout,
        } => chat::run(
            &chat::ChatArgs {
                model: model.unwrap_or_else(straddle_engine::default_model_path),
                cloud,
                token,
                mode: if speculative {
                    chat::Mode::Speculative
                } else {
                    mode
                },
                system,
                max_tokens,
                temperature,
                seed,
                draft,
                max_draft,
                timeout: std::time::Duration::from_secs(timeout),
            },
            prompt,
        ),
        Command::Gguf { path, tensors } => gguf(&path, tensors),
        Command::BenchSpeculative {
            model,
            cloud,
            prompts,
            rtt,
            max_tokens,
            draft,
            min_draft,
            max_draft,
        } => {
            let table = bench_speculative::run(&bench_speculative::BenchArgs {
                model: model.unwrap_or_else(straddle_engine::default_model_path),
                cloud,
                prompts,
                rtts_ms: rtt,
                max_tokens,
                draft,
                min_draft,
                max_draft,
            })?;
            print!("{table}");
            Ok(())
        }
        Command::Requant {
            input,
            output,
            from,
            to,
        } => {
            let n = requant::run(&input, &output, from, to)?;
            println!(
                "{n} tensors rewritten as {to:?}; wrote {}",
                output.display()
            );
            Ok(())
        }
        Command::Pii { text } => {
            for span in straddle_router::pii::detect(&text) {
                println!(
                    "{:?}\t{}..{}\t{:.2}",
                    span.kind, span.start, span.end, span.confidence
                );
            }
            Ok(())
        }
        Command::Sim {
            requests,
            seed,
            personal_every,
        } => {
            use straddle_router::sim;
            let world = sim::World::default();
            let stream = sim::stream(&sim::bundled_corpus(), requests, seed, personal_every);
            println!("{requests} requests, seed {seed}, world = sim::World::default()\n");
            print!("{}", sim::table(&sim::compare(&world, &stream, seed)));
            Ok(())
        }
        Command::Token {
            tenant,
            secret,
            user,
            origin,
            ttl,
        } => {
            use straddle_protocol::token::{AUDIENCE, Claims, mint};
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
                origin,
                feat: None,
            };
            println!("{}", mint(&claims, secret.as_bytes()));
            Ok(())
        }
        Command::TrainRouter { corpus, out } => {
            let examples = train_router::read_corpus(&corpus)?;
            let report = train_router::run(&examples, &out)?;
            print!("{}", report.render());
            println!("wrote {}", out.display());
            Ok(())
        }
        Command::Eval {
            benchmark:
                Eval::Routellm {
                    data,
                    weak,
                    strong,
                    bins,
                    folds,
                    random_seeds,
                    curves,
                },
        } => {
            let benchmarks = routellm::load(&data, &weak, &strong)?;
            let rows = routellm::evaluate(
                &benchmarks,
                routellm::Settings {
                    bins,
                    folds,
                    random_seeds,
                    train: straddle_router::linear::TrainConfig::default(),
                },
            )?;
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
    }
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
