//! `cargo xtask bench [engine]`: runs benchmarks beside their peers in the same run and
//! writes the table to BENCHMARKS.md.

use std::process::Command;

use anyhow::{Context, bail};

use crate::setup;
use crate::util::{self, root};

const PROMPT_TOKENS: usize = 128;
const DECODE_TOKENS: usize = 128;

pub fn run(args: &[String]) -> anyhow::Result<()> {
    let which = args.first().map(String::as_str).unwrap_or("engine");
    match which {
        "all" | "engine" => engine(),
        other => bail!("unknown benchmark `{other}` (known: engine)"),
    }
}

/// The llama.cpp peer, in a venv of its own (built once: about 6 minutes).
fn llama_python() -> anyhow::Result<std::path::PathBuf> {
    let venv = root().join("tests/reference/.venv");
    let python = venv.join("bin/python");
    let ok = python.is_file()
        && Command::new(&python)
            .args(["-c", "import llama_cpp"])
            .output()
            .is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("bench: building llama-cpp-python 0.3.36 (the peer; once, several minutes)");
        util::run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
        util::run(
            Command::new(venv.join("bin/pip"))
                .args(["install", "--quiet", "llama-cpp-python==0.3.36"])
                // GGML_NATIVE=ON produced a binary that died with SIGILL on this AVX-512 machine.
                .env(
                    "CMAKE_ARGS",
                    "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON",
                ),
        )
        .context("installing llama-cpp-python from PyPI")?;
    }
    Ok(python)
}

fn engine() -> anyhow::Result<()> {
    let tools = setup::run()?;
    let model = tools.model.to_string_lossy().into_owned();
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2);
    util::run(
        util::cargo()
            .args([
                "build",
                "--quiet",
                "--profile",
                "fast",
                "-p",
                "straddle-engine",
                "--example",
                "bench",
            ])
            .current_dir(root()),
    )?;
    let ours_bin = util::target_dir().join("fast/examples/bench");
    let python = llama_python()?;
    let (np, nd) = (PROMPT_TOKENS.to_string(), DECODE_TOKENS.to_string());
    let mut rows = Vec::new();
    // Alternate the two twice so a noisy neighbour hurts both alike.
    for _ in 0..2 {
        let ours = util::output(
            Command::new(&ours_bin)
                .args([&model, &np, &nd])
                .env("RAYON_NUM_THREADS", threads.to_string()),
        )?;
        rows.push(serde_json::from_str::<serde_json::Value>(ours.trim())?);
        let peer = util::output(
            Command::new(&python)
                .arg(root().join("tests/reference/bench_llama.py"))
                .args([&model, &np, &nd, &threads.to_string()]),
        )?;
        rows.push(serde_json::from_str::<serde_json::Value>(peer.trim())?);
    }
    let best = |name: &str, key: &str| {
        rows.iter()
            .filter(|r| r["engine"] == name)
            .filter_map(|r| r[key].as_f64())
            .fold(0f64, f64::max)
    };
    let mut table = String::new();
    table.push_str(&format!(
        "| engine | threads | prefill tok/s ({PROMPT_TOKENS}-token prompt) | decode tok/s ({DECODE_TOKENS} tokens) | load ms |\n|---|---|---|---|---|\n"
    ));
    for name in ["straddle-cpu", "llama.cpp"] {
        let load = rows
            .iter()
            .filter(|r| r["engine"] == name)
            .filter_map(|r| r["load_ms"].as_f64())
            .fold(f64::INFINITY, f64::min);
        table.push_str(&format!(
            "| {name} | {threads} | {:.1} | {:.1} | {load:.0} |\n",
            best(name, "prefill_tps"),
            best(name, "decode_tps")
        ));
    }
    let ratio = |k: &str| best("straddle-cpu", k) / best("llama.cpp", k).max(1e-9);
    table.push_str(&format!("\nRatio (ours ÷ llama.cpp): prefill {:.2}×, decode {:.2}×. Best of 2 alternating runs each.\n", ratio("prefill_tps"), ratio("decode_tps")));
    if let Some(r) = rows.iter().find(|r| r["engine"] == "straddle-cpu") {
        table.push_str(&format!(
            "Resident weights (quantized): {} MB; f32 KV cache at 2,048 positions: {} MB.\n",
            r["weights_mb"], r["kv_mb"]
        ));
    }
    println!("{table}");
    write_section(
        "Engine (native CPU)",
        &format!("Command: `cargo xtask bench engine`\n\n{table}"),
    )
}

/// Replaces (or appends) one `## title` section of BENCHMARKS.md.
fn write_section(title: &str, body: &str) -> anyhow::Result<()> {
    let path = root().join("BENCHMARKS.md");
    let old = std::fs::read_to_string(&path).unwrap_or_else(|_| "# Benchmarks\n\nWritten by `cargo xtask bench`; every row beside its peer from the same run.\n".into());
    let head = format!("## {title}\n");
    let machine = format!(
        "Machine: {} cores; run on {}.\n\n",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        util::output(Command::new("date").arg("-u").arg("+%Y-%m-%d %H:%M UTC"))
            .unwrap_or_default()
            .trim()
    );
    let section = format!("{head}\n{machine}{body}\n");
    let new = match old.find(&head) {
        Some(start) => {
            let end = old[start + head.len()..]
                .find("\n## ")
                .map(|i| start + head.len() + i + 1)
                .unwrap_or(old.len());
            format!("{}{section}{}", &old[..start], &old[end..])
        }
        None => format!("{}\n{section}", old.trim_end()),
    };
    std::fs::write(&path, new)?;
    Ok(())
}
