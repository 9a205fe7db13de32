//! `straddle chat`: one prompt answered on the edge engine, by the cloud (through the worker
//! or a cloud server), or by both with speculative decoding.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use straddle_engine::sample::SamplingParams;
use straddle_engine::speculative::DraftLength;
use straddle_engine::{ChatMessage, Engine, Flow, GenerateParams, Prompt};
use straddle_router::policy::{self, Context as RouteContext, Policy, Target};
use straddle_router::quality::EdgeSignals;

use crate::cloud_client::stream_cloud;
use crate::model_file::load_engine;
use crate::speculative::{self, RemoteVerifier};

/// Where the answer comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// The local engine alone.
    Edge,
    /// Plain streaming from the cloud.
    Cloud,
    /// The local engine drafts, the cloud verifies.
    Speculative,
    /// The router decides, as the page does: before generation, then at the edge's first
    /// token (the cloud is used only with `--cloud`).
    Auto,
}

/// Settings of `straddle chat`.
#[derive(Debug, clap::Args)]
pub struct ChatArgs {
    /// The prompt (read from standard input when absent).
    pub prompt: Option<String>,
    /// The edge model (default: the model fetched by `cargo xtask setup`).
    #[arg(long, env = "STRADDLE_MODEL")]
    pub model: Option<PathBuf>,
    /// The worker or cloud server to escalate to.
    #[arg(long, env = "STRADDLE_CLOUD")]
    pub cloud: Option<String>,
    /// A tenant token for the worker (`straddle token`).
    #[arg(long, env = "STRADDLE_TOKEN")]
    pub token: Option<String>,
    #[arg(long, value_enum, default_value = "edge")]
    pub mode: Mode,
    /// Shorthand for `--mode speculative`.
    #[arg(long)]
    pub speculative: bool,
    #[arg(long)]
    pub system: Option<String>,
    #[arg(long, default_value_t = 256)]
    pub max_tokens: usize,
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Tokens drafted per verify call at first (adapted as acceptance is measured).
    #[arg(long, default_value_t = 4)]
    pub draft: usize,
    /// Longest draft.
    #[arg(long, default_value_t = 16)]
    pub max_draft: usize,
    /// Seconds one cloud call may take.
    #[arg(long, default_value_t = 60)]
    pub timeout: u64,
    /// Draft acceptance below which speculation hands the rest of the answer to plain cloud
    /// streaming, after four verify calls (0: never).
    #[arg(long, default_value_t = 0.3)]
    pub hand_off_below: f32,
}

/// Answers `prompt` (or standard input when it is absent), streaming to standard output and
/// a summary to standard error.
pub fn run(args: &ChatArgs) -> anyhow::Result<()> {
    let messages = conversation(args.system.as_deref(), read_prompt(args)?);
    let params = generate_params(args);
    let mut out = std::io::stdout().lock();
    let print = |t: &str| {
        // A closed pipe (`| head`) ends the output, not the program with a panic.
        let _ = out.write_all(t.as_bytes());
        let _ = out.flush();
    };
    let model = args
        .model
        .clone()
        .unwrap_or_else(|| straddle_models::DEFAULT_EDGE.path());
    match args.mode() {
        Mode::Edge => answer_on_edge(&load_engine(&model)?, &messages, &params, print),
        Mode::Cloud => answer_in_cloud(args, &messages, &params, print),
        Mode::Auto => answer_auto(args, &model, &messages, &params, print),
        Mode::Speculative => {
            let engine = load_engine(&model)?;
            answer_speculatively(args, &engine, &messages, &params, print)
        }
    }
}

impl ChatArgs {
    /// The mode asked for, `--speculative` winning over `--mode`.
    fn mode(&self) -> Mode {
        if self.speculative {
            Mode::Speculative
        } else {
            self.mode
        }
    }
}

/// The prompt from the command line, else all of standard input; an empty one is an error.
fn read_prompt(args: &ChatArgs) -> anyhow::Result<String> {
    let prompt = match args.prompt.clone() {
        Some(p) => p,
        None => {
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .context("reading the prompt from standard input")?;
            s
        }
    };
    if prompt.trim().is_empty() {
        anyhow::bail!("the prompt is empty");
    }
    Ok(prompt)
}

/// The conversation sent to every mode: the optional system message, then the prompt.
fn conversation(system: Option<&str>, prompt: String) -> Vec<ChatMessage> {
    let mut messages = Vec::new();
    if let Some(s) = system {
        messages.push(ChatMessage::new("system", s.to_string()));
    }
    messages.push(ChatMessage::new("user", prompt));
    messages
}

/// Sampling and length settings shared by the edge and the cloud, so both answer alike.
fn generate_params(args: &ChatArgs) -> GenerateParams {
    GenerateParams {
        sampling: SamplingParams {
            temperature: args.temperature,
            seed: args.seed,
            ..Default::default()
        },
        max_tokens: args.max_tokens,
        ..Default::default()
    }
}

/// The `--cloud` address, required by every mode that reaches the cloud.
fn cloud_url(args: &ChatArgs) -> anyhow::Result<&str> {
    args.cloud
        .as_deref()
        .context("--cloud URL is needed for this mode (the worker or a cloud server)")
}

/// Answers on the edge engine alone.
fn answer_on_edge(
    engine: &Engine,
    messages: &[ChatMessage],
    params: &GenerateParams,
    mut print: impl FnMut(&str),
) -> anyhow::Result<()> {
    let c = engine.generate(Prompt::Messages(messages), params, |ev| {
        print(&ev.text);
        Flow::Continue
    })?;
    edge_summary(&c);
    Ok(())
}

/// Lets the router choose between the edge and the cloud, as the page does.
fn answer_auto(
    args: &ChatArgs,
    model: &Path,
    messages: &[ChatMessage],
    params: &GenerateParams,
    mut print: impl FnMut(&str),
) -> anyhow::Result<()> {
    let engine = load_engine(model)?;
    let sha256 = crate::model_file::sha256(model)?;
    if !answer_routed(args, &engine, &sha256, messages, params, &mut print)? {
        answer_in_cloud(args, messages, params, print)?;
    }
    Ok(())
}

/// The edge drafts and the cloud verifies; the run's statistics go to standard error.
fn answer_speculatively(
    args: &ChatArgs,
    engine: &Engine,
    messages: &[ChatMessage],
    params: &GenerateParams,
    print: impl FnMut(&str),
) -> anyhow::Result<()> {
    let timeout = Duration::from_secs(args.timeout);
    let mut verifier = RemoteVerifier::new(
        cloud_url(args)?,
        args.token.clone(),
        engine,
        params,
        timeout,
    );
    let lengths = DraftLength::new(args.draft, 1, args.max_draft);
    let hand_off = (args.hand_off_below > 0.0).then(|| speculative::HandOff {
        below: args.hand_off_below,
        base: args.cloud.as_deref().unwrap_or_default(),
        token: args.token.as_deref(),
        timeout,
    });
    let o = speculative::generate(
        engine,
        messages,
        params,
        lengths,
        &mut verifier,
        hand_off,
        print,
    )?;
    println!();
    eprintln!("{}", speculative_summary(&o));
    Ok(())
}

/// One line on a speculative run: speed, verify calls, acceptance, and any hand-off or
/// degradation, so a slow answer can be told apart from a failing cloud.
fn speculative_summary(o: &speculative::Outcome) -> String {
    let n = o.total_tokens().max(1) as f64;
    let handed_off = match o.handed_off_after {
        Some(n) => format!(
            "; handed to plain cloud streaming after {n} tokens ({} more)",
            o.streamed_tokens
        ),
        None => String::new(),
    };
    let degraded = match &o.degraded {
        Some(why) => format!(
            "; degraded: {} tokens from the edge alone ({why})",
            o.stats.edge_alone
        ),
        None => String::new(),
    };
    format!(
        "speculative: {} tokens in {:.2} s ({:.1} tokens/s); {} verify calls ({:.2} per \
         token), {} of {} drafted tokens accepted, k now {}{handed_off}{degraded}",
        o.total_tokens(),
        o.elapsed.as_secs_f64(),
        n / o.elapsed.as_secs_f64(),
        o.stats.calls,
        o.stats.calls as f64 / n,
        o.stats.accepted,
        o.stats.drafted,
        o.final_k,
    )
}

/// Ends an edge answer's line and reports its speed on standard error.
fn edge_summary(c: &straddle_engine::Completion) {
    println!();
    eprintln!(
        "edge: {} tokens, prefill {:.0} ms, {:.1} tokens/s",
        c.tokens.len(),
        c.prefill_ms,
        c.decode_tokens_per_s()
    );
}

/// Plain cloud streaming through `--cloud`, with a summary to standard error.
fn answer_in_cloud(
    args: &ChatArgs,
    messages: &[ChatMessage],
    params: &GenerateParams,
    print: impl FnMut(&str),
) -> anyhow::Result<()> {
    let cloud = cloud_url(args)?;
    let timeout = Duration::from_secs(args.timeout);
    let streamed = stream_cloud(
        cloud,
        args.token.as_deref(),
        messages,
        params,
        timeout,
        false,
        print,
    )?;
    println!();
    eprintln!(
        "cloud: {} tokens in {:.2} s",
        streamed.completion_tokens,
        streamed.elapsed.as_secs_f64()
    );
    Ok(())
}

/// The device `straddle chat --mode auto` routes for: this engine, online when a cloud is
/// given, decoding at a laptop's speed.
fn auto_context(args: &ChatArgs, engine: &Engine, sha256: &str) -> RouteContext {
    RouteContext {
        online: args.cloud.is_some(),
        edge_available: true,
        edge_tokens_per_s: 40.0,
        rtt_ms: 60.0,
        edge_languages: engine.languages.clone(),
        edge_model_sha256: Some(sha256.to_string()),
        ..RouteContext::default()
    }
}

/// Routes the conversation with the router's own functions and answers on the edge when they
/// keep it there. Returns `false` when the cloud should answer instead, decided before any
/// edge text was printed.
fn answer_routed(
    args: &ChatArgs,
    engine: &Engine,
    sha256: &str,
    messages: &[ChatMessage],
    params: &GenerateParams,
    print: &mut impl FnMut(&str),
) -> anyhow::Result<bool> {
    let turns: Vec<&str> = messages.iter().map(|m| m.content.as_str()).collect();
    let ctx = auto_context(args, engine, sha256);
    let max_tokens = Some(params.max_tokens as u32);
    let decision = policy::decide_conversation(&turns, max_tokens, &ctx, &Policy::default());
    eprintln!(
        "route: {} ({})",
        decision.target.as_str(),
        decision.reasons.join("; ")
    );
    if decision.target != Target::Edge {
        return Ok(false);
    }
    let mut seq = engine.start(Prompt::Messages(messages), params)?;
    let look = engine.look(&seq)?;
    let signals = EdgeSignals {
        entropy: look.confidence.entropy,
        logprob: look.confidence.logprob,
        margin: look.confidence.margin,
    };
    let check = policy::at_first_token(&decision, signals, look.state.as_deref());
    if let Some(why) = check.escalate {
        eprintln!("route: cloud ({why})");
        return Ok(false);
    }
    while let Some(ev) = engine.next_token(&mut seq)? {
        print(&ev.text);
        engine.advance(&mut [&mut seq])?;
    }
    let c = seq.into_completion();
    edge_summary(&c);
    Ok(true)
}
