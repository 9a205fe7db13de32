//! `straddle bench-speculative`: edge-draft / cloud-verify beside plain cloud streaming, same
//! prompts, same cloud server, at simulated round-trip times (a delay proxy on 127.0.0.1).

use std::net::ToSocketAddrs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use straddle_engine::speculative::DraftLength;
use straddle_engine::{ChatMessage, GenerateParams};

use crate::chat;
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
    let model = args
        .model
        .clone()
        .unwrap_or_else(straddle_engine::default_model_path);
    let engine = chat::load_engine(&model)?;
    let upstream = args
        .cloud
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_socket_addrs()
        .with_context(|| format!("{} is not an http://host:port address", args.cloud))?
        .next()
        .context("the cloud address resolves to nothing")?;
    let params = GenerateParams {
        max_tokens: args.max_tokens,
        ..Default::default()
    };
    let timeout = Duration::from_secs(300);
    let one = |base: &str,
               case: &Case|
     -> anyhow::Result<(cloud_client::Streamed, speculative::Outcome)> {
        let messages = [ChatMessage::new("user", case.prompt.clone())];
        let plain =
            cloud_client::stream_cloud(base, None, &messages, &params, timeout, false, |_| {})?;
        let mut verifier = RemoteVerifier::new(base, None, &engine, &params, timeout);
        let lengths = DraftLength::new(args.draft, args.min_draft, args.max_draft);
        let spec = speculative::generate(
            &engine,
            &messages,
            &params,
            lengths,
            &mut verifier,
            None,
            |_| {},
        )?;
        if let Some(why) = &spec.degraded {
            anyhow::bail!("verification failed during the benchmark: {why}");
        }
        Ok((plain, spec))
    };
    // Warm-up: page in both models and the server's first allocations.
    if let Some(first) = cases.first() {
        one(&args.cloud, first)?;
    }
    let mut rows = Vec::new();
    let mut by_kind: Vec<(String, Tally)> = Vec::new();
    for (r, &rtt) in args.rtts_ms.iter().enumerate() {
        let proxy = DelayProxy::start(upstream, Duration::from_millis(rtt))?;
        let mut t = Tally::default();
        for case in &cases {
            let (plain, spec) = one(&proxy.url(), case)?;
            let add = |t: &mut Tally| {
                t.prompts += 1;
                t.identical += usize::from(plain.text == spec.text);
                t.plain_tokens += plain.completion_tokens as usize;
                t.plain_s += plain.elapsed.as_secs_f64();
                t.spec_tokens += spec.tokens.len();
                t.spec_s += spec.elapsed.as_secs_f64();
                t.calls += spec.stats.calls;
                t.drafted += spec.stats.drafted;
                t.accepted += spec.stats.accepted;
            };
            add(&mut t);
            if r == 0 {
                match by_kind.iter_mut().find(|(k, _)| *k == case.kind) {
                    Some((_, kt)) => add(kt),
                    None => {
                        let mut kt = Tally::default();
                        add(&mut kt);
                        by_kind.push((case.kind.clone(), kt));
                    }
                }
            }
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
        rows.push((rtt, t));
    }
    let mut out = String::from(
        "| RTT ms | plain cloud tok/s | speculative tok/s | speculative ÷ plain | draft tokens accepted | cloud passes per output token | tokens per verify call | identical to plain |\n|---|---|---|---|---|---|---|---|\n",
    );
    for (rtt, t) in &rows {
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
    if let Some(first) = args.rtts_ms.first() {
        out.push_str(&format!(
            "\nBy kind of prompt (RTT {first} ms):\n\n| kind | prompts | draft tokens accepted | cloud passes per output token | tokens per verify call | identical |\n|---|---|---|---|---|---|\n"
        ));
        for (kind, t) in &by_kind {
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
    }
    Ok(out)
}
