//! `straddle bench-speculative`: edge-draft / cloud-verify beside plain cloud streaming, same
//! prompts, same cloud server, at simulated round-trip times (a delay proxy on 127.0.0.1).

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use straddle_engine::speculative::DraftLength;
use straddle_engine::{ChatMessage, Engine, GenerateParams};

use crate::cloud_client;
use crate::delay_proxy::DelayProxy;
use crate::speculative::{self, RemoteVerifier};

/// Settings of the benchmark.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// The drafting (edge) model.
    #[arg(long, env = "STRADDLE_MODEL")]
    pub model: Option<PathBuf>,
    /// The cloud server (http://host:port), reached through a delay proxy.
    #[arg(long)]
    pub cloud: String,
    #[arg(long, default_value = "crates/cli/data/speculative-prompts.jsonl")]
    pub prompts: PathBuf,
    /// Round-trip times to simulate, in ms.
    #[arg(long = "rtt", value_delimiter = ',', default_value = "0,20,50,80")]
    pub rtts_ms: Vec<u64>,
    #[arg(long, default_value_t = 64)]
    pub max_tokens: usize,
    #[arg(long, default_value_t = 4)]
    pub draft: usize,
    /// Shortest draft (set equal to --max-draft for a fixed k).
    #[arg(long, default_value_t = 1)]
    pub min_draft: usize,
    #[arg(long, default_value_t = 16)]
    pub max_draft: usize,
    /// Only stream each prompt from `--cloud` (a peer's own server, with or without its own
    /// speculation) and print the completion tokens, seconds and texts as JSON.
    #[arg(long)]
    pub stream_only: bool,
}

#[derive(serde::Deserialize)]
struct Case {
    kind: String,
    prompt: String,
}

#[derive(Default, Clone)]
struct Tally {
    prompts: usize,
    identical: usize,
    plain_tokens: usize,
    plain_s: f64,
    spec_tokens: usize,
    spec_s: f64,
    calls: usize,
    drafted: usize,
    accepted: usize,
}

impl Tally {
    /// Counts one prompt answered both ways.
    fn add(&mut self, plain: &cloud_client::Streamed, spec: &speculative::Outcome) {
        self.prompts += 1;
        self.identical += usize::from(plain.text == spec.text);
        self.plain_tokens += plain.completion_tokens as usize;
        self.plain_s += plain.elapsed.as_secs_f64();
        self.spec_tokens += spec.tokens.len();
        self.spec_s += spec.elapsed.as_secs_f64();
        self.calls += spec.stats.calls;
        self.drafted += spec.stats.drafted;
        self.accepted += spec.stats.accepted;
    }
    fn acceptance(&self) -> f64 {
        self.accepted as f64 / self.drafted.max(1) as f64
    }
    fn passes_per_token(&self) -> f64 {
        self.calls as f64 / self.spec_tokens.max(1) as f64
    }
    fn tokens_per_call(&self) -> f64 {
        self.spec_tokens as f64 / self.calls.max(1) as f64
    }
}

fn read_cases(path: &Path) -> anyhow::Result<Vec<Case>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| {
            serde_json::from_str(l).with_context(|| format!("{} line {}", path.display(), i + 1))
        })
        .collect()
}

/// Runs the benchmark and returns its tables (markdown).
pub fn run(args: &BenchArgs) -> anyhow::Result<String> {
    let cases = read_cases(&args.prompts)?;
    if args.stream_only {
        return stream_only(args, &cases);
    }
    let model = args
        .model
        .clone()
        .unwrap_or_else(|| straddle_models::DEFAULT_EDGE.path());
    let engine = crate::model_file::load_engine(&model)?;
    let upstream = resolve_upstream(&args.cloud)?;
    let bench = Bench {
        args,
        engine: &engine,
        params: GenerateParams {
            max_tokens: args.max_tokens,
            ..Default::default()
        },
    };
    // Warm-up: page in both models and the server's first allocations.
    if let Some(first) = cases.first() {
        bench.answer_both(&args.cloud, first)?;
    }
    let mut results = Vec::new();
    for &rtt in &args.rtts_ms {
        results.push((rtt, bench.at_rtt(upstream, rtt, &cases)?));
    }
    Ok(render(&results))
}

/// Every case streamed from `args.cloud` directly, after one warm-up answer: the completion
/// tokens, the seconds and each text, as one JSON object.
fn stream_only(args: &BenchArgs, cases: &[Case]) -> anyhow::Result<String> {
    let params = GenerateParams {
        max_tokens: args.max_tokens,
        ..Default::default()
    };
    let stream = |case: &Case| {
        let messages = [ChatMessage::new("user", case.prompt.clone())];
        let timeout = Duration::from_secs(300);
        cloud_client::stream_cloud(
            &args.cloud,
            None,
            &messages,
            &params,
            timeout,
            false,
            |_| {},
        )
    };
    if let Some(first) = cases.first() {
        stream(first)?;
    }
    let (mut tokens, mut seconds, mut texts) = (0u64, 0f64, Vec::new());
    for case in cases {
        let answer = stream(case)?;
        tokens += u64::from(answer.completion_tokens);
        seconds += answer.elapsed.as_secs_f64();
        texts.push(answer.text);
    }
    let summary = serde_json::json!({ "tokens": tokens, "seconds": seconds, "texts": texts });
    Ok(format!("{summary}\n"))
}

/// The cloud server's socket address, which the delay proxy forwards to.
fn resolve_upstream(cloud: &str) -> anyhow::Result<SocketAddr> {
    cloud
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_socket_addrs()
        .with_context(|| format!("{cloud} is not an http://host:port address"))?
        .next()
        .context("the cloud address resolves to nothing")
}

/// What every measurement shares: the settings, the drafting engine, the generation limits.
struct Bench<'a> {
    args: &'a BenchArgs,
    engine: &'a Engine,
    params: GenerateParams,
}

/// The tallies of one round-trip time: over all prompts, and per kind of prompt.
struct RttTallies {
    total: Tally,
    by_kind: Vec<(String, Tally)>,
}

impl Bench<'_> {
    /// Answers `case` by plain cloud streaming and then speculatively, both through `base`.
    fn answer_both(
        &self,
        base: &str,
        case: &Case,
    ) -> anyhow::Result<(cloud_client::Streamed, speculative::Outcome)> {
        let (engine, params) = (self.engine, &self.params);
        let timeout = Duration::from_secs(300);
        let messages = [ChatMessage::new("user", case.prompt.clone())];
        let plain =
            cloud_client::stream_cloud(base, None, &messages, params, timeout, false, |_| {})?;
        let mut verifier = RemoteVerifier::new(base, None, engine, params, timeout);
        let args = self.args;
        let lengths = DraftLength::new(args.draft, args.min_draft, args.max_draft);
        let spec = speculative::generate(
            engine,
            &messages,
            params,
            lengths,
            &mut verifier,
            None,
            |_| {},
        )?;
        if let Some(why) = &spec.degraded {
            anyhow::bail!("verification failed during the benchmark: {why}");
        }
        Ok((plain, spec))
    }

    /// Answers every case through a proxy that delays each round trip by `rtt` ms.
    fn at_rtt(&self, upstream: SocketAddr, rtt: u64, cases: &[Case]) -> anyhow::Result<RttTallies> {
        let proxy = DelayProxy::start(upstream, Duration::from_millis(rtt))?;
        let mut tallies = RttTallies {
            total: Tally::default(),
            by_kind: Vec::new(),
        };
        for case in cases {
            let (plain, spec) = self.answer_both(&proxy.url(), case)?;
            tallies.total.add(&plain, &spec);
            kind_tally(&mut tallies.by_kind, &case.kind).add(&plain, &spec);
            report_case(rtt, case, &plain, &spec);
        }
        Ok(tallies)
    }
}

/// The tally of prompts of `kind`, added in first-seen order so the table follows the file.
fn kind_tally<'a>(by_kind: &'a mut Vec<(String, Tally)>, kind: &str) -> &'a mut Tally {
    let i = match by_kind.iter().position(|(k, _)| k == kind) {
        Some(i) => i,
        None => {
            by_kind.push((kind.to_string(), Tally::default()));
            by_kind.len() - 1
        }
    };
    &mut by_kind[i].1
}

/// Progress on standard error, one line a prompt, since a run takes minutes.
fn report_case(rtt: u64, case: &Case, plain: &cloud_client::Streamed, spec: &speculative::Outcome) {
    eprintln!(
        "rtt {rtt} ms, {}: plain {} tokens {:.2} s; speculative {} tokens {:.2} s, {} calls, \
         acceptance {:.2}{}",
        case.kind,
        plain.completion_tokens,
        plain.elapsed.as_secs_f64(),
        spec.tokens.len(),
        spec.elapsed.as_secs_f64(),
        spec.stats.calls,
        spec.acceptance,
        if plain.text == spec.text {
            ""
        } else {
            " (text differs)"
        }
    );
}

/// The markdown report: one row per round-trip time, then the first one's split by kind.
fn render(results: &[(u64, RttTallies)]) -> String {
    let mut out = rtt_table(results);
    if let Some((first, tallies)) = results.first() {
        out.push_str(&kind_table(*first, &tallies.by_kind));
    }
    out
}

/// Speed and acceptance of both ways at each round-trip time.
fn rtt_table(results: &[(u64, RttTallies)]) -> String {
    let mut out = String::from(
        "| RTT ms | plain cloud tok/s | speculative tok/s | speculative ÷ plain | draft tokens accepted | cloud passes per output token | tokens per verify call | identical to plain |\n|---|---|---|---|---|---|---|---|\n",
    );
    for (rtt, RttTallies { total: t, .. }) in results {
        let plain = t.plain_tokens as f64 / t.plain_s;
        let spec = t.spec_tokens as f64 / t.spec_s;
        out.push_str(&format!(
            "| {rtt} | {plain:.1} | {spec:.1} | {:.2} | {:.0} % | {:.2} | {:.1} | {}/{} |\n",
            spec / plain,
            100.0 * t.acceptance(),
            t.passes_per_token(),
            t.tokens_per_call(),
            t.identical,
            t.prompts
        ));
    }
    out
}

/// Acceptance per kind of prompt at round-trip time `rtt`.
fn kind_table(rtt: u64, by_kind: &[(String, Tally)]) -> String {
    let mut out = format!(
        "\nBy kind of prompt (RTT {rtt} ms):\n\n| kind | prompts | draft tokens accepted | cloud passes per output token | tokens per verify call | identical |\n|---|---|---|---|---|---|\n"
    );
    for (kind, t) in by_kind {
        out.push_str(&format!(
            "| {kind} | {} | {:.0} % | {:.2} | {:.1} | {}/{} |\n",
            t.prompts,
            100.0 * t.acceptance(),
            t.passes_per_token(),
            t.tokens_per_call(),
            t.identical,
            t.prompts
        ));
    }
    out
}
