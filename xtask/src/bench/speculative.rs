//! `cargo xtask bench speculative`: speculative decoding between the edge and the cloud.

use super::cloud::{spawn_cloud, spawn_llama_server, wait_health};
use super::write_section;
use crate::llama_cpp;
use crate::setup;
use crate::util::{self, root};
use std::process::Command;
use straddle_models::{QWEN_CLOUD, QWEN_EDGE};

/// The native engine drafting for `straddle-cloud` verifying: SmolLM2 on drafters of two
/// precisions, or with `qwen` the real pair, Qwen2.5-Coder-0.5B drafting for the 1.5B.
pub(super) fn speculative(qwen: bool) -> anyhow::Result<()> {
    if qwen {
        return speculative_pair();
    }
    let tools = setup::run()?;
    let body = with_verifier(&tools.model, 18092, |straddle, base| {
        let q4_0 = q4_0_drafter(straddle, &tools.model)?;
        speculative_tables(straddle, base, &q4_0, &tools.model)
    })?;
    write_section(
        "Speculative decoding: edge draft, cloud verify",
        &format!(
            "Command: `cargo xtask bench speculative` (20 prompts of four kinds from \
             `crates/cli/data/speculative-prompts.jsonl`, 64 tokens each, greedy; verifier: \
             `straddle-cloud` with the default SmolLM2-135M Q4_1 on 127.0.0.1, reached through a \
             delay proxy adding the RTT; drafter: the native engine in the same process as the \
             client; plain = `/v1/chat/completions` streaming through the same proxy; both on \
             the same 2 cores, one after the other). How to read it: \
             \"identical\" is the speculative text against plain greedy streaming; cloud \
             passes per output token is what speculation saves the cloud. Wall-clock speed \
             here is a CPU verifier's, which pays for every verified token (a verify call of \
             k + 1 tokens costs about k + 1 times 17 ms), with the drafter in series on the \
             same cores; on a GPU verifier a call costs about one decode step.\n\n{body}"
        ),
    )
}

/// Qwen2.5-Coder-0.5B drafting for Qwen2.5-Coder-1.5B on `straddle-cloud` (one vocabulary),
/// adaptive and fixed draft lengths, beside the 1.5B streaming alone through the same proxy.
fn speculative_pair() -> anyhow::Result<()> {
    let tools = setup::run()?;
    let runs = [
        ("adaptive k", ["4", "1", "16"]),
        ("fixed k = 4", ["4", "4", "4"]),
    ];
    let body = with_verifier(&tools.qwen_cloud, 18093, |straddle, base| {
        let mut body = String::new();
        for (name, [k, min, max]) in runs {
            let table = util::output(
                Command::new(straddle)
                    .arg("bench-speculative")
                    .arg("--model")
                    .arg(&tools.qwen_edge)
                    .args(["--cloud", base, "--rtt", "0,50", "--draft", k])
                    .args(["--min-draft", min, "--max-draft", max])
                    .current_dir(root()),
            )?;
            println!("### Drafter: Qwen2.5-Coder-0.5B, {name}\n\n{table}");
            body.push_str(&format!(
                "### Drafter: Qwen2.5-Coder-0.5B, {name}\n\n{table}\n"
            ));
        }
        Ok(body)
    })?;
    let peer = llama_server_speculation(&tools)?;
    println!("{peer}");
    let body = format!("{body}{peer}");
    write_section(
        "Speculative decoding with the real pair: Qwen2.5-Coder 0.5B drafts, 1.5B verifies",
        &format!(
            "Command: `cargo xtask bench speculative --qwen` (20 prompts of four kinds from \
             `crates/cli/data/speculative-prompts.jsonl`, 64 tokens each, greedy; verifier: \
             `straddle-cloud` with {} on 127.0.0.1 behind a delay proxy adding the RTT; drafter: \
             the native engine with {} in the client's process; plain = the 1.5B streaming \
             `/v1/chat/completions` alone through the same proxy; the peer: llama.cpp's \
             `llama-server` serving the 1.5B alone and with the 0.5B as its draft model \
             (`-md`, its draft settings at their defaults), the same prompts streamed straight \
             from it; all on the same 2 cores, one after the other).\n\n{body}",
            QWEN_CLOUD.title, QWEN_EDGE.title
        ),
    )
}

/// The peer a user would run for the same pair: llama.cpp's `llama-server` with the 1.5B,
/// alone and with the 0.5B as its own draft model (`-md`, its other settings left at their
/// defaults), the same prompts streamed from each with no proxy between (its drafter and
/// verifier share one process).
fn llama_server_speculation(tools: &setup::Tools) -> anyhow::Result<String> {
    let llama = llama_cpp::tools()?;
    let plain = llama_server_streams(&llama.server, &tools.qwen_cloud, None)?;
    let spec = llama_server_streams(&llama.server, &tools.qwen_cloud, Some(&tools.qwen_edge))?;
    let identical = plain
        .texts
        .iter()
        .zip(&spec.texts)
        .filter(|(a, b)| a == b)
        .count();
    Ok(format!(
        "### The peer: llama.cpp's own speculation (`llama-server -md`)\n\n\
         | server | plain tok/s | speculative tok/s | speculative ÷ plain | identical to its plain |\n\
         |---|---|---|---|---|\n\
         | `llama-server` ({}) | {:.1} | {:.1} | {:.2} | {identical}/{} |\n\n",
        llama.build,
        plain.tokens_per_s(),
        spec.tokens_per_s(),
        spec.tokens_per_s() / plain.tokens_per_s(),
        plain.texts.len()
    ))
}

/// What `straddle bench-speculative --stream-only` prints: every prompt's answer streamed.
#[derive(serde::Deserialize)]
struct Streams {
    tokens: u64,
    seconds: f64,
    texts: Vec<String>,
}

impl Streams {
    fn tokens_per_s(&self) -> f64 {
        self.tokens as f64 / self.seconds
    }
}

/// The bench's prompts streamed from `llama-server` serving `model`, with `draft` as its
/// draft model where given; the server goes down whether the run passed or not.
fn llama_server_streams(
    server: &std::path::Path,
    model: &std::path::Path,
    draft: Option<&std::path::Path>,
) -> anyhow::Result<Streams> {
    let port = 18094u16;
    let base = format!("http://127.0.0.1:{port}");
    let mut child = spawn_llama_server(server, (model, draft), port, 1)?;
    let straddle = util::target_dir().join("fast/straddle");
    let result = wait_health(&format!("{base}/health"), &mut child).and_then(|()| {
        let out = util::output(
            Command::new(&straddle)
                .args(["bench-speculative", "--stream-only", "--cloud", &base])
                .current_dir(root()),
        )?;
        Ok(serde_json::from_str(&out)?)
    });
    let _ = child.kill();
    let _ = child.wait();
    result
}

/// Builds the binaries, starts `straddle-cloud` with `model` on `port` as the verifier and
/// runs `bench(straddle, base_url)` against it; the verifier goes down whether the run passed
/// or not, since it holds the port.
fn with_verifier(
    model: &std::path::Path,
    port: u16,
    bench: impl FnOnce(&std::path::Path, &str) -> anyhow::Result<String>,
) -> anyhow::Result<String> {
    // The fast profile, as `bench cloud` serves: the test profile's debug assertions left the
    // 1.5B answering at well under half its speed (BENCHMARKS.md, the real pair's section).
    util::build_fast(&["-p", "straddle-cloud", "-p", "straddle-cli"])?;
    let straddle = util::target_dir().join("fast/straddle");
    let mut child = spawn_cloud(&util::target_dir().join("fast/straddle-cloud"), model, port)?;
    let base = format!("http://127.0.0.1:{port}");
    let result =
        wait_health(&format!("{base}/health"), &mut child).and_then(|()| bench(&straddle, &base));
    let _ = child.kill();
    let _ = child.wait();
    result
}

/// A Q4_0 copy of `model` beside it, made once: a drafter less precise than its verifier.
fn q4_0_drafter(
    straddle: &std::path::Path,
    model: &std::path::Path,
) -> anyhow::Result<std::path::PathBuf> {
    let q4_0 = model.with_file_name("smollm2-135m-instruct-q4_0-requant.gguf");
    if !q4_0.is_file() {
        util::run(
            Command::new(straddle)
                .arg("requant")
                .arg(model)
                .arg(&q4_0)
                .args(["--from", "q4-1", "--to", "q4-0"]),
        )?;
    }
    Ok(q4_0)
}

/// `straddle bench-speculative` against the verifier at `base`, a table per drafter: the
/// lower-precision copy with adaptive and fixed draft lengths, then the verifier's own file.
fn speculative_tables(
    straddle: &std::path::Path,
    base: &str,
    q4_0: &std::path::Path,
    model: &std::path::Path,
) -> anyhow::Result<String> {
    let runs = [
        (
            "Q4_0 copy (lower precision), adaptive k",
            q4_0,
            ["4", "1", "16"],
        ),
        (
            "Q4_0 copy (lower precision), fixed k = 8",
            q4_0,
            ["8", "8", "8"],
        ),
        (
            "the verifier's own file, adaptive k",
            model,
            ["4", "1", "16"],
        ),
    ];
    let mut body = String::new();
    for (name, drafter, [k, min, max]) in runs {
        let table = util::output(
            Command::new(straddle)
                .arg("bench-speculative")
                .arg("--model")
                .arg(drafter)
                .args([
                    "--cloud",
                    base,
                    "--draft",
                    k,
                    "--min-draft",
                    min,
                    "--max-draft",
                    max,
                ])
                .current_dir(root()),
        )?;
        println!("### Drafter: {name}\n\n{table}");
        body.push_str(&format!("### Drafter: {name}\n\n{table}\n"));
    }
    Ok(body)
}
