//! `cargo xtask bench engine`: our CPU engine beside llama.cpp (`llama-bench` and
//! llama-cpp-python) on one model, and the burn device model.

use super::{model_flag, section_name, write_section};
use crate::llama_cpp;
use crate::setup;
use crate::util::{self, root};
use anyhow::Context;
use std::process::Command;
use straddle_models::{KnownModel, SMOLLM2};

const PROMPT_TOKENS: usize = 128;

/// The issue's prefill target is a 512-token prompt (decode is measured after the short one).
const LONG_PROMPT_TOKENS: usize = 512;

/// The burn model's shorter workload (see `engine`).
const DEVICE_PROMPT_TOKENS: usize = 16;

const DEVICE_DECODE_TOKENS: usize = 16;

const DECODE_TOKENS: usize = 128;

/// The llama.cpp peer, in a venv of its own (built once per set of CPU flags: about 6
/// minutes).
fn llama_python() -> anyhow::Result<std::path::PathBuf> {
    let venv = root().join("tests/reference/.venv");
    let python = venv.join("bin/python");
    let cmake_args = llama_cpp::cpu_flags().0.join(" ");
    let stamp = venv.join("straddle-cmake-args");
    let ok = python.is_file()
        && std::fs::read_to_string(&stamp).is_ok_and(|s| s == cmake_args)
        && Command::new(&python)
            .args(["-c", "import llama_cpp"])
            .output()
            .is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!(
            "bench: building llama-cpp-python 0.3.36 with {cmake_args} (the peer; once, several minutes)"
        );
        util::run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
        util::run(
            Command::new(venv.join("bin/pip"))
                // No cached wheel: one built with other flags would be taken as this one.
                .args([
                    "install",
                    "--quiet",
                    "--no-cache-dir",
                    "--force-reinstall",
                    "llama-cpp-python==0.3.36",
                ])
                .env("CMAKE_ARGS", &cmake_args),
        )
        .context("installing llama-cpp-python from PyPI")?;
        std::fs::write(&stamp, &cmake_args)?;
    }
    Ok(python)
}

/// Our CPU engine beside llama.cpp on `known`; then, for SmolLM2, the burn model on its
/// backends (the larger models take minutes a token on lavapipe).
pub(super) fn engine(known: KnownModel) -> anyhow::Result<()> {
    let tools = setup::run()?;
    let model = tools.path_of(known).to_string_lossy().into_owned();
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2);
    util::build_fast(&["-p", "straddle-engine", "--example", "bench"])?;
    let ours_bin = util::target_dir().join("fast/examples/bench");
    let python = llama_python()?;
    let llama = llama_cpp::tools()?;
    let rows = EngineRuns {
        ours_bin: &ours_bin,
        python: &python,
        llama_bench: &llama.bench,
        model: &model,
        threads,
    }
    .measure()?;
    let mut table = engine_table(&rows, threads, &llama.build);
    if known == SMOLLM2 {
        table.push_str(&device_rows(&ours_bin, &model)?);
    }
    println!("{table}");
    let title = match known {
        SMOLLM2 => "Engine (native CPU)".to_string(),
        other => format!("Engine (native CPU), {}", section_name(other)),
    };
    let flag = model_flag(known);
    write_section(
        &title,
        &format!("Command: `cargo xtask bench engine{flag}`\n\n{table}"),
    )
}

/// The three engines of the CPU table, ready to run on one model with one thread count.
struct EngineRuns<'a> {
    ours_bin: &'a std::path::Path,
    python: &'a std::path::Path,
    llama_bench: &'a std::path::Path,
    model: &'a str,
    threads: usize,
}

/// Every round's rows: the short prompt's (prefill and decode), the long prompt's (prefill).
#[derive(Default)]
struct EngineRows {
    short: Vec<serde_json::Value>,
    long: Vec<serde_json::Value>,
    /// The kernel family our bench picked on its own: the machine's best.
    best_kernels: Option<String>,
}

impl EngineRuns<'_> {
    /// Two rounds, each engine in turn, so a noisy neighbour hurts all of them alike.
    fn measure(&self) -> anyhow::Result<EngineRows> {
        let (np, nd) = (PROMPT_TOKENS.to_string(), DECODE_TOKENS.to_string());
        let long = LONG_PROMPT_TOKENS.to_string();
        let mut rows = EngineRows::default();
        // Per round: ours and the wrapper on each prompt, then llama-bench.
        let bar = util::bench_bar(2 * 5, "engine");
        for _ in 0..2 {
            for (np, nd, into) in [
                (&np, &nd, &mut rows.short),
                (&long, &"4".to_string(), &mut rows.long),
            ] {
                bar.set_message(format!("straddle, {np}-token prompt"));
                self.ours(np, nd, into, &mut rows.best_kernels)?;
                bar.inc(1);
                bar.set_message(format!("llama-cpp-python, {np}-token prompt"));
                into.push(self.llama_cpp_python(np, nd)?);
                bar.inc(1);
            }
            bar.set_message("llama-bench");
            let (short, long) = llama_bench(self.llama_bench, self.model, self.threads)?;
            rows.short.push(short);
            rows.long.push(long);
            bar.inc(1);
        }
        bar.finish_and_clear();
        Ok(rows)
    }

    /// Our best kernels, and the AVX2 ones beside them where the machine has better
    /// (AVX-512 VNNI): the family most x86 machines run.
    fn ours(
        &self,
        np: &str,
        nd: &str,
        into: &mut Vec<serde_json::Value>,
        best_kernels: &mut Option<String>,
    ) -> anyhow::Result<()> {
        for family in [None, Some("avx2")] {
            let mut cmd = Command::new(self.ours_bin);
            cmd.args([self.model, np, nd])
                .env("STRADDLE_THREADS", self.threads.to_string());
            if let Some(f) = family {
                cmd.env("STRADDLE_CPU_KERNELS", f);
            }
            let mut row: serde_json::Value = serde_json::from_str(util::output(&mut cmd)?.trim())?;
            let kernels = row["kernels"].as_str().unwrap_or("?").to_string();
            match family {
                None => *best_kernels = Some(kernels),
                // Not this machine's (the bench fell back to its best), or its best anyway.
                Some(f) if f != kernels || best_kernels.as_deref() == Some(f) => continue,
                Some(_) => row["engine"] = format!("straddle-cpu ({kernels})").into(),
            }
            into.push(row);
        }
        Ok(())
    }

    /// The Python wrapper's row: kept to show what its argmax round trip per token costs.
    fn llama_cpp_python(&self, np: &str, nd: &str) -> anyhow::Result<serde_json::Value> {
        let peer = util::output(
            Command::new(self.python)
                .arg(root().join("tests/reference/bench_llama.py"))
                .args([self.model, np, nd, &self.threads.to_string()]),
        )?;
        Ok(serde_json::from_str::<serde_json::Value>(peer.trim())?)
    }
}

impl EngineRows {
    /// `name`'s best `key` over the short prompt's rounds: the least disturbed one.
    fn best(&self, name: &str, key: &str) -> f64 {
        best_of(&self.short, name, key)
    }

    /// `name`'s best prefill over the long prompt's rounds.
    fn best_long(&self, name: &str) -> f64 {
        best_of(&self.long, name, "prefill_tps")
    }
}

/// The highest `key` among `name`'s rows (0 when it has none), as a noisy machine only slows.
fn best_of(rows: &[serde_json::Value], name: &str, key: &str) -> f64 {
    rows.iter()
        .filter(|r| r["engine"] == name)
        .filter_map(|r| r[key].as_f64())
        .fold(0f64, f64::max)
}

/// The CPU table: a row per engine that ran, then the ratios and the memory it takes.
fn engine_table(rows: &EngineRows, threads: usize, llama_build: &str) -> String {
    let mut table = format!(
        "| engine | threads | prefill tok/s ({PROMPT_TOKENS}-token prompt) | prefill tok/s ({LONG_PROMPT_TOKENS}-token prompt) | decode tok/s ({DECODE_TOKENS} tokens) | decode GB/s read ÷ measured | load ms |\n|---|---|---|---|---|---|---|\n"
    );
    // The AVX2 row exists only where the machine's best family is another.
    let names = [
        "straddle-cpu",
        "straddle-cpu (avx2)",
        "llama-bench",
        "llama.cpp",
    ]
    .into_iter()
    .filter(|name| rows.short.iter().any(|r| r["engine"] == *name));
    for name in names {
        table.push_str(&engine_row(rows, name, threads, llama_build));
    }
    let ratio = |k: &str| rows.best("straddle-cpu", k) / rows.best("llama-bench", k).max(1e-9);
    let long_ratio = rows.best_long("straddle-cpu") / rows.best_long("llama-bench").max(1e-9);
    table.push_str(&format!("\nRatio (ours ÷ `llama-bench`): prefill {:.2}× ({PROMPT_TOKENS} tokens), {long_ratio:.2}× ({LONG_PROMPT_TOKENS} tokens), decode {:.2}×. Best of 2 alternating rounds each, each engine after a warm-up pass (`llama-bench`'s own, and one prefill of ours); `llama-bench` reports the mean of its 3 repetitions per round (`-r 3`), its decode row is `tg{DECODE_TOKENS}` at depth {PROMPT_TOKENS} (`-d {PROMPT_TOKENS}`), as ours decodes after the {PROMPT_TOKENS}-token prompt. The Python wrapper's row is kept to show what it costs: it is not the peer.\n", ratio("prefill_tps"), ratio("decode_tps")));
    if let Some(r) = rows.short.iter().find(|r| r["engine"] == "straddle-cpu") {
        table.push_str(&format!(
            "Resident weights (quantized): {} MB, {:.3}× the file's {} MB of tensors; f32 KV cache at 2,048 positions: {} MB.\nDecode GB/s: what a decoded token reads (every weight once, and the cached keys and values) × tokens per second, beside what a plain pass measured just after (host: every thread summing a 512 MiB buffer; device: `x + 1` over 96 MiB, reads and writes counted): the fraction of the memory-bandwidth bound.\n",
            r["weights_mb"],
            r["weights_mb"].as_f64().unwrap_or(0.0) / r["tensor_mb"].as_f64().unwrap_or(f64::NAN),
            r["tensor_mb"],
            r["kv_mb"]
        ));
    }
    table
}

/// One engine's line of the CPU table, its best rounds and fastest load.
fn engine_row(rows: &EngineRows, name: &str, threads: usize, llama_build: &str) -> String {
    let label = match (name, &rows.best_kernels) {
        ("straddle-cpu", Some(k)) => format!("straddle-cpu ({k})"),
        ("llama-bench", _) => format!("llama.cpp `llama-bench` ({llama_build})"),
        ("llama.cpp", _) => {
            "llama-cpp-python 0.3.36 (Python wrapper, an argmax round trip per token)".into()
        }
        _ => name.to_string(),
    };
    let load = rows
        .short
        .iter()
        .filter(|r| r["engine"] == name)
        .filter_map(|r| r["load_ms"].as_f64())
        .fold(f64::INFINITY, f64::min);
    // The bandwidth of the fastest decode, beside the host's measured read bandwidth.
    let fastest = rows
        .short
        .iter()
        .filter(|r| r["engine"] == name)
        .max_by(|a, b| {
            a["decode_tps"]
                .as_f64()
                .partial_cmp(&b["decode_tps"].as_f64())
                .unwrap_or(std::cmp::Ordering::Equal)
        });
    let load = if load.is_finite() {
        format!("{load:.0}")
    } else {
        "—".into()
    };
    format!(
        "| {label} | {threads} | {:.1} | {:.1} | {:.1} | {} | {load} |\n",
        rows.best(name, "prefill_tps"),
        rows.best_long(name),
        rows.best(name, "decode_tps"),
        fastest.map_or("—".into(), bandwidth_cell)
    )
}

/// One round of llama.cpp's own `llama-bench` on `model`: `(a row with the short prompt's
/// prefill and the decode after it, a row with the long prompt's prefill)`, shaped as our
/// bench's rows.
fn llama_bench(
    bin: &std::path::Path,
    model: &str,
    threads: usize,
) -> anyhow::Result<(serde_json::Value, serde_json::Value)> {
    let run = |args: &[String]| -> anyhow::Result<Vec<serde_json::Value>> {
        let out = util::output(
            Command::new(bin)
                .args([
                    "-m",
                    model,
                    "-t",
                    &threads.to_string(),
                    "-r",
                    "3",
                    "-o",
                    "json",
                ])
                .args(args),
        )?;
        serde_json::from_str(&out).context("reading llama-bench's JSON")
    };
    let prefill = run(&[
        "-p".into(),
        format!("{PROMPT_TOKENS},{LONG_PROMPT_TOKENS}"),
        "-n".into(),
        "0".into(),
    ])?;
    let decode = run(&[
        "-p".into(),
        "0".into(),
        "-n".into(),
        DECODE_TOKENS.to_string(),
        "-d".into(),
        PROMPT_TOKENS.to_string(),
    ])?;
    let rate = |rows: &[serde_json::Value], key: &str, n: usize| {
        rows.iter()
            .find(|r| r[key].as_u64() == Some(n as u64))
            .and_then(|r| r["avg_ts"].as_f64())
            .with_context(|| format!("llama-bench printed no {key} = {n} row"))
    };
    let short = serde_json::json!({
        "engine": "llama-bench",
        "prefill_tps": rate(&prefill, "n_prompt", PROMPT_TOKENS)?,
        "decode_tps": rate(&decode, "n_gen", DECODE_TOKENS)?,
    });
    let long = serde_json::json!({
        "engine": "llama-bench",
        "prefill_tps": rate(&prefill, "n_prompt", LONG_PROMPT_TOKENS)?,
    });
    Ok((short, long))
}

/// The burn model (`DeviceModel`) on each backend, as table rows with their heading.
fn device_rows(ours_bin: &std::path::Path, model: &str) -> anyhow::Result<String> {
    let mut table = String::new();
    // The burn model on its backends: far slower than the CPU kernels on a machine without a
    // GPU (lavapipe and flex execute GPU-shaped kernels on 2 cores), so a shorter workload.
    let (dp, dd) = (
        DEVICE_PROMPT_TOKENS.to_string(),
        DEVICE_DECODE_TOKENS.to_string(),
    );
    table.push_str(&format!(
        "\nThe burn model (`DeviceModel`), {DEVICE_PROMPT_TOKENS}-token prompt, {DEVICE_DECODE_TOKENS} decoded tokens, 2,048-position cache:\n\n| backend | prefill tok/s | decode tok/s | decode GB/s read ÷ measured | load ms | weights on device MB | KV MB | peak device MB |\n|---|---|---|---|---|---|---|---|\n"
    ));
    // `wgpu` is what a GPU gets (our kernels, the cooperative product), `wgpu-per-row` what a
    // software adapter gets, `wgpu-burn` burn's own operations: the peer for our kernels.
    for backend in ["flex", "wgpu-burn", "wgpu", "wgpu-per-row"] {
        let out = util::output(Command::new(ours_bin).args([model, &dp, &dd, backend]))?;
        let line = out
            .lines()
            .rev()
            .find(|l| l.starts_with('{'))
            .unwrap_or("{}");
        let r: serde_json::Value = serde_json::from_str(line)?;
        table.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r["engine"],
            r["prefill_tps"],
            r["decode_tps"],
            bandwidth_cell(&r),
            r["load_ms"],
            r["weights_mb"],
            r["kv_mb"],
            r["peak_device_mb"]
        ));
    }
    Ok(table)
}

/// "read ÷ measured = fraction" for a row with the bench's bandwidth fields, else "—" (the
/// peer's rows: its bytes per token are not ours to count).
fn bandwidth_cell(r: &serde_json::Value) -> String {
    match (r["decode_gbs"].as_f64(), r["bound_gbs"].as_f64()) {
        (Some(read), Some(bound)) if bound > 0.0 => {
            format!("{read:.1} ÷ {bound:.1} = {:.0} %", 100.0 * read / bound)
        }
        _ => "—".into(),
    }
}
