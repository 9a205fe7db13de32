//! `cargo xtask bench [engine|cloud|router|pii|web|speculative|structured|worker|budget|all]`: runs benchmarks beside their peers in the same run and
//! writes the table to BENCHMARKS.md.

use std::process::Command;

use anyhow::bail;

use straddle_models::{GEMMA3, KnownModel, QWEN_CLOUD, QWEN_EDGE, SMOLLM2};

use crate::util::{self, root};

mod cloud;
mod engine;
mod pii;
mod router;
mod speculative;
mod structured;
mod web;
mod worker;

use cloud::cloud;
use engine::engine;
use pii::pii;
use router::router;
use speculative::speculative;
use structured::structured;
use web::web;
use worker::{budget, worker};

pub fn run(args: &[String]) -> anyhow::Result<()> {
    let which = args.first().map(String::as_str).unwrap_or("engine");
    let model = picked_model(args);
    match which {
        "engine" => engine(model),
        "cloud" => cloud(args.iter().any(|a| a == "--qwen")),
        "router" => router(),
        "web" => web(args.iter().any(|a| a == "--release"), model),
        "speculative" => speculative(args.iter().any(|a| a == "--qwen")),
        "structured" => structured(),
        "pii" => pii(),
        "worker" => worker(),
        "budget" => budget(),
        "all" => engine(SMOLLM2)
            .and_then(|()| cloud(false))
            .and_then(|()| router())
            .and_then(|()| pii())
            .and_then(|()| web(false, SMOLLM2))
            .and_then(|()| worker())
            .and_then(|()| budget()),
        other => bail!(
            "unknown benchmark `{other}` (known: engine, cloud, router, pii, web, speculative, structured, worker, budget, all)"
        ),
    }
}

/// The model a bench runs on: `--gemma` (Gemma 3 270M), `--qwen` (Qwen2.5-Coder-0.5B, the
/// edge model), `--qwen-cloud` (Qwen2.5-Coder-1.5B, the cloud model), else SmolLM2-135M.
fn picked_model(args: &[String]) -> KnownModel {
    let has = |flag: &str| args.iter().any(|a| a == flag);
    if has("--gemma") {
        GEMMA3
    } else if has("--qwen-cloud") {
        QWEN_CLOUD
    } else if has("--qwen") {
        QWEN_EDGE
    } else {
        SMOLLM2
    }
}

/// How BENCHMARKS.md's section titles name `model` (Gemma's sections predate the others).
fn section_name(model: KnownModel) -> &'static str {
    if model == GEMMA3 {
        "Gemma 3 270M"
    } else {
        model.title
    }
}

/// The command-line flag that picks `model` (empty for the default).
fn model_flag(model: KnownModel) -> &'static str {
    match model.id {
        id if id == GEMMA3.id => " --gemma",
        id if id == QWEN_EDGE.id => " --qwen",
        id if id == QWEN_CLOUD.id => " --qwen-cloud",
        _ => "",
    }
}

/// Runs a Node benchmark script of the `dir` package (`web`, `worker`) from that package's
/// directory, and returns what it printed.
fn node_bench(dir: &str, script: &str, args: &[&std::ffi::OsStr]) -> anyhow::Result<String> {
    util::output(
        Command::new("node")
            .arg(root().join(dir).join(script))
            .args(args)
            .current_dir(root().join(dir)),
    )
}

/// Replaces (or appends) one `## title` section of BENCHMARKS.md.
fn write_section(title: &str, body: &str) -> anyhow::Result<()> {
    let path = root().join("BENCHMARKS.md");
    let old = std::fs::read_to_string(&path).unwrap_or_else(|_| "# Benchmarks\n\nWritten by `cargo xtask bench`; every row beside its peer from the same run.\n".into());
    let head = format!("## {title}\n");
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .map(|name| format!(" ({name})"))
        .unwrap_or_default();
    let machine = format!(
        "Machine: {} cores{cpu}; run on {}.\n\n",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        util::output(Command::new("date").arg("-u").arg("+%Y-%m-%d %H:%M UTC"))
            .unwrap_or_default()
            .trim()
    );
    let section = format!("{head}\n{machine}{body}\n\n");
    let new = match old.find(&head) {
        Some(start) => {
            let end = old[start + head.len()..]
                .find("\n## ")
                .map(|i| start + head.len() + i + 1)
                .unwrap_or(old.len());
            format!("{}{section}{}", &old[..start], &old[end..])
        }
        None => format!("{}\n\n{section}", old.trim_end()),
    };
    std::fs::write(&path, new)?;
    Ok(())
}
