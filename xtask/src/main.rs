//! `cargo xtask`: the project's automation. Every tool the build and tests need is
//! installed by `setup`; every other command calls it first.

mod bench;
mod build;
mod demo;
mod file_server;
mod fuzz;
mod llama_cpp;
mod setup;
mod test;
mod util;

use anyhow::bail;

const USAGE: &str = "usage: cargo xtask <command>

commands:
  setup          install every tool, package and the default model (idempotent)
  test [STEP...] fmt, clippy, native, wasm (Chromium), worker (workerd), browser e2e
               [--timings] (cargo's per-crate compile reports beside the step times)
  demo [--check] build and start cloud + worker + demo page; --check runs one prompt and exits
               [--port-cloud N] [--port-worker N] [--port-web N]
               [--upstream URL [--upstream-key-env VAR] [--upstream-model NAME]]
               (any OpenAI-compatible server or provider behind the worker instead of ours)
  build-web      build crates/web to web/pkg with the settings of wasm-pack.toml
  build-worker   build worker/ for workerd (offline worker-build)
  bench [name]   run benchmarks and write BENCHMARKS.md
               [--qwen | --qwen-cloud | --gemma] (engine, web, cloud, speculative)
  fuzz           run the GGUF reader's fuzz target (nightly, cargo-fuzz)
               [--seconds N] (default 600)";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Err(err) = run(&args) {
        eprintln!("xtask: error: {err:#}");
        std::process::exit(1);
    }
}

fn run(args: &[String]) -> anyhow::Result<()> {
    let Some((cmd, rest)) = args.split_first() else {
        println!("{USAGE}");
        return Ok(());
    };
    match cmd.as_str() {
        "setup" => setup::run().map(|_| ()),
        "test" => test::run(rest),
        "demo" => demo::run(rest),
        // Not for users: the demo's supervisor over one child, for `tests/demo_signals.rs`.
        "supervise-probe" => demo::probe(),
        "build-web" => build::web(&setup::run()?),
        "build-worker" => build::worker(&setup::run()?),
        "bench" => bench::run(rest),
        "fuzz" => fuzz::run(rest),
        "help" | "--help" | "-h" => {
            println!("{USAGE}");
            Ok(())
        }
        other => bail!("unknown command `{other}`\n\n{USAGE}"),
    }
}
