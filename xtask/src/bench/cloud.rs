//! `cargo xtask bench cloud`: the cloud server beside llama.cpp's `llama-server`, and the
//! load generator both are measured with.

use super::write_section;
use crate::llama_cpp;
use crate::setup;
use crate::util;
use anyhow::{Context, bail};
use std::process::Command;
use straddle_models::QWEN_CLOUD;

/// Throughput of `clients` concurrent non-streamed requests of `max_tokens` each against an
/// OpenAI-compatible server; returns (completion tokens per second, p50 and p99 latency ms).
/// What `clients` concurrent streamed requests measured.
struct Load {
    tokens_per_s: f64,
    /// Time to the first content chunk, p50 and p99 (ms).
    ttft: (f64, f64),
    /// Time to the whole answer, p50 and p99 (ms).
    total: (f64, f64),
}

/// `clients` concurrent streamed chat requests for `max_tokens` tokens each.
fn load(base: &str, clients: usize, max_tokens: u32) -> anyhow::Result<Load> {
    use std::io::BufRead;
    let started = std::time::Instant::now();
    let handles: Vec<_> = (0..clients)
        .map(|i| {
            let url = format!("{base}/v1/chat/completions");
            std::thread::spawn(move || -> anyhow::Result<(u64, f64, f64)> {
                let body = format!(
                    r#"{{"model":"m","messages":[{{"role":"user","content":"Write a short note number {i} about rivers."}}],"max_tokens":{max_tokens},"temperature":0,"stream":true,"stream_options":{{"include_usage":true}}}}"#
                );
                let t = std::time::Instant::now();
                let mut resp = util::http(std::time::Duration::from_secs(600))
                    .post(&url)
                    .header("content-type", "application/json")
                    .send(&body)?;
                if resp.status() != 200 {
                    bail!("{url} answered {}: {}", resp.status(), resp.body_mut().read_to_string().unwrap_or_default());
                }
                let (mut first, mut chunks, mut usage) = (None, 0u64, None);
                let mut seen = String::new();
                for line in std::io::BufReader::new(resp.body_mut().as_reader()).lines() {
                    let line = line?;
                    if seen.len() < 400 {
                        seen.push_str(&line);
                        seen.push('\n');
                    }
                    let Some(data) = line.strip_prefix("data: ") else { continue };
                    if data == "[DONE]" {
                        break;
                    }
                    let v: serde_json::Value = serde_json::from_str(data)?;
                    if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
                        usage = Some(n);
                    }
                    let content = v["choices"][0]["delta"]["content"].as_str().unwrap_or("");
                    if !content.is_empty() {
                        chunks += 1;
                        first.get_or_insert_with(|| t.elapsed().as_secs_f64() * 1e3);
                    }
                }
                let first = first.with_context(|| format!("{url}: the stream carried no content:\n{seen}"))?;
                // A server that reports no usage streams one token a chunk.
                Ok((usage.unwrap_or(chunks), first, t.elapsed().as_secs_f64() * 1e3))
            })
        })
        .collect();
    let mut tokens = 0;
    let (mut ttft, mut total) = (Vec::new(), Vec::new());
    for h in handles {
        let (n, first, ms) = h
            .join()
            .map_err(|_| anyhow::anyhow!("client thread panicked"))??;
        tokens += n;
        ttft.push(first);
        total.push(ms);
    }
    let wall = started.elapsed().as_secs_f64();
    let pcts = |mut xs: Vec<f64>| {
        xs.sort_by(f64::total_cmp);
        let at = |p: f64| xs[((xs.len() as f64 - 1.0) * p).round() as usize];
        (at(0.5), at(0.99))
    };
    Ok(Load {
        tokens_per_s: tokens as f64 / wall,
        ttft: pcts(ttft),
        total: pcts(total),
    })
}

/// Starts a `straddle-cloud` binary serving `model` on 127.0.0.1:`port`, quietly.
pub(super) fn spawn_cloud(
    bin: &std::path::Path,
    model: &std::path::Path,
    port: u16,
) -> anyhow::Result<std::process::Child> {
    Ok(Command::new(bin)
        .arg("--model")
        .arg(model)
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()?)
}

pub(super) fn wait_health(url: &str, child: &mut std::process::Child) -> anyhow::Result<()> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let agent = util::http(std::time::Duration::from_secs(2));
    while std::time::Instant::now() < deadline {
        if let Some(status) = child.try_wait()? {
            bail!("server exited while starting ({status})");
        }
        if matches!(agent.get(url).call(), Ok(r) if r.status() == 200) {
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
    bail!("server at {url} did not come up")
}

/// Tokens each client of the cloud bench asks for.
const CLOUD_ANSWER_TOKENS: u32 = 64;

/// `cargo xtask bench cloud [--qwen]`: our server beside llama.cpp's own `llama-server`
/// (continuous batching, `-np` equal to the stream count), same GGUF, same threads, same
/// prompts, alternating level by level, two rounds; on SmolLM2, or with `qwen` on the cloud
/// model, Qwen2.5-Coder-1.5B.
pub(super) fn cloud(qwen: bool) -> anyhow::Result<()> {
    let tools = setup::run()?;
    util::build_fast(&["-p", "straddle-cloud"])?;
    let llama = llama_cpp::tools()?;
    let port = 18090u16;
    let base = format!("http://127.0.0.1:{port}");
    let (model, levels): (&std::path::Path, &[usize]) = match qwen {
        true => (&tools.qwen_cloud, &[1, 4, 16]),
        false => (&tools.model, &[1, 4, 16, 32]),
    };
    let mut rows: Vec<(&str, usize, Vec<Load>)> = Vec::new();
    for &n in levels {
        for name in ["straddle-cloud", "llama-server"] {
            rows.push((name, n, Vec::new()));
        }
    }
    for _round in 0..2 {
        for row in rows.iter_mut() {
            let (name, n, loads) = row;
            let mut child = match *name {
                "straddle-cloud" => {
                    spawn_cloud(&util::target_dir().join("fast/straddle-cloud"), model, port)?
                }
                _ => spawn_llama_server(&llama.server, (model, None), port, *n)?,
            };
            let result = (|| -> anyhow::Result<Load> {
                wait_health(&format!("{base}/health"), &mut child)?;
                load(&base, 1, 8)?; // warm-up
                load(&base, *n, CLOUD_ANSWER_TOKENS)
            })();
            let _ = child.kill();
            let _ = child.wait();
            loads.push(result?);
        }
    }
    let table = cloud_table(&rows, &llama.build);
    println!("{table}");
    let (title, flag) = match qwen {
        true => (format!("Cloud server, {}", QWEN_CLOUD.title), " --qwen"),
        false => ("Cloud server".to_string(), ""),
    };
    write_section(
        &title,
        &format!("Command: `cargo xtask bench cloud{flag}`\n\n{table}"),
    )
}

/// llama.cpp's `llama-server` on 127.0.0.1:`port` serving `model` (with `draft` as its
/// speculative draft model, where given) with `slots` slots, continuous batching and the
/// machine's cores, quietly.
pub(super) fn spawn_llama_server(
    bin: &std::path::Path,
    (model, draft): (&std::path::Path, Option<&std::path::Path>),
    port: u16,
    slots: usize,
) -> anyhow::Result<std::process::Child> {
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    // Each slot holds its prompt (at most a few hundred tokens with the template) and the
    // answer.
    let ctx = slots * 512;
    let mut server = Command::new(bin);
    server
        .arg("-m")
        .arg(model)
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["-t", &threads.to_string(), "-np", &slots.to_string(), "-cb"])
        .args(["-c", &ctx.to_string()]);
    if let Some(draft) = draft {
        server.arg("-md").arg(draft);
    }
    Ok(server
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()?)
}

/// The cloud bench's table: one row per server and stream count, each cell listing the rounds.
fn cloud_table(rows: &[(&str, usize, Vec<Load>)], llama_build: &str) -> String {
    let mut table = String::from(
        "| server | streams | completion tok/s | first token p50 / p99 ms | whole answer p50 / p99 ms |\n|---|---|---|---|---|\n",
    );
    let join = |loads: &[Load], cell: &dyn Fn(&Load) -> String| {
        loads.iter().map(cell).collect::<Vec<_>>().join(", ")
    };
    for (name, n, loads) in rows {
        table.push_str(&format!(
            "| {name} | {n} | {} | {} | {} |\n",
            join(loads, &|l| format!("{:.1}", l.tokens_per_s)),
            join(loads, &|l| format!("{:.0} / {:.0}", l.ttft.0, l.ttft.1)),
            join(loads, &|l| format!("{:.0} / {:.0}", l.total.0, l.total.1)),
        ));
    }
    table.push_str(&format!(
        "\nEach client streams one chat request for {CLOUD_ANSWER_TOKENS} tokens (greedy), all started together; tok/s is all clients' completion tokens over the wall time; each cell lists the two rounds (the servers alternate at every stream count). Both servers use the machine's cores; `llama-server` ({llama_build}) runs `-np` equal to the stream count with continuous batching (`-cb`), ours its defaults (continuous batching with chunked prefill, up to 32 sequences).\n"
    ));
    table
}
