//! `cargo xtask bench router`: the router's decision latency, natively and as wasm.

use super::{node_bench, write_section};
use crate::util;
use std::process::Command;

/// Decision latency of the router on 2 KB prompts, every signal on (goals: p99 < 100 µs
/// native, < 1 ms in wasm): the same example natively and as wasm in Node (WASI).
pub(super) fn router() -> anyhow::Result<()> {
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
