//! `cargo xtask test`: every suite a contributor keeps green, in order, stopping at the
//! first failure, then one line per suite and a final `N passed, N failed` line.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, bail};

use crate::setup::{self, Tools};
use crate::util::{self, root};

/// Tests counted from one suite's output.
#[derive(Default, Clone)]
struct Counts {
    passed: u64,
    failed: u64,
    /// Ignored by libtest or skipped by node's runner: shown, so a skip is never silent.
    skipped: u64,
    /// What the tests that said why they skipped said, for the summary.
    reasons: Vec<String>,
}

struct Suite {
    name: &'static str,
    outcome: Result<Counts, String>,
    secs: f64,
}

/// One step of the run: its name and what it does.
type Step = (&'static str, fn(&Tools) -> anyhow::Result<Counts>);

/// Every step, in order.
const STEPS: [Step; 6] = [
    ("fmt", fmt),
    ("clippy", clippy),
    ("native", native),
    ("wasm", wasm),
    ("worker", worker),
    ("browser", browser),
];

pub fn run(args: &[String]) -> anyhow::Result<()> {
    let only: Vec<&str> = args
        .iter()
        .map(String::as_str)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let with_timings = args.iter().any(|a| a == "--timings");
    if with_timings {
        // Cargo's own report of every crate's compile time, per build, beside the steps'.
        util::record_build_timings();
    }
    let started = Instant::now();
    let mut timings = Timings::load();
    let tools = setup::run()?;
    timings.record("setup", started.elapsed().as_secs_f64());
    let chosen = STEPS
        .into_iter()
        .filter(|(name, _)| only.is_empty() || only.contains(name));
    let suites = run_steps(chosen, &tools, &mut timings);
    let failed = summarize(&suites, started.elapsed().as_secs_f64());
    timings.save();
    eprintln!("step times: {}", Timings::path().display());
    if with_timings {
        let reports = util::target_dir().join("cargo-timings");
        eprintln!("cargo's per-crate reports: {}", reports.display());
    }
    if failed {
        bail!("test run failed");
    }
    Ok(())
}

/// Runs `steps` in order, saying which is running and how long it took here last time,
/// until one fails.
fn run_steps(
    steps: impl Iterator<Item = Step>,
    tools: &Tools,
    timings: &mut Timings,
) -> Vec<Suite> {
    let mut suites = Vec::new();
    for (name, step) in steps {
        eprintln!("\n==> {name}{}", timings.last_time(name));
        let t = Instant::now();
        let outcome = step(tools).map_err(|e| format!("{e:#}"));
        let secs = t.elapsed().as_secs_f64();
        let failed = outcome.is_err();
        if !failed {
            timings.record(name, secs);
        }
        suites.push(Suite {
            name,
            outcome,
            secs,
        });
        if failed {
            break;
        }
    }
    suites
}

/// Prints one line per suite and the totals; returns whether anything failed.
fn summarize(suites: &[Suite], secs: f64) -> bool {
    println!("\nsummary ({secs:.0} s):");
    let (mut passed, mut failed, mut skipped) = (0, 0, 0);
    for s in suites {
        match &s.outcome {
            Ok(c) => {
                passed += c.passed;
                failed += c.failed;
                skipped += c.skipped;
                println!(
                    "  {:<8} ok      {:>4} passed  {:>3} skipped  ({:.0} s)",
                    s.name, c.passed, c.skipped, s.secs
                );
            }
            Err(e) => {
                failed += 1;
                println!(
                    "  {:<8} FAILED  {}  ({:.0} s)",
                    s.name,
                    e.lines().next().unwrap_or(""),
                    s.secs
                );
            }
        }
    }
    println!("{passed} passed, {failed} failed, {skipped} skipped");
    for why in suites.iter().filter_map(|s| s.outcome.as_ref().ok()) {
        why.reasons.iter().for_each(|r| println!("  skipped: {r}"));
    }
    failed > 0
}

/// How long each step took the last time it passed on this machine (in the cache, outside
/// any checkout), so the waiting person knows what is coming.
struct Timings(std::collections::BTreeMap<String, f64>);

impl Timings {
    fn path() -> std::path::PathBuf {
        util::cache_dir().join("test-timings.json")
    }

    fn load() -> Self {
        let read = std::fs::read_to_string(Self::path()).ok();
        Timings(
            read.and_then(|t| serde_json::from_str(&t).ok())
                .unwrap_or_default(),
        )
    }

    fn record(&mut self, step: &str, secs: f64) {
        self.0.insert(step.to_string(), secs.round());
    }

    fn last_time(&self, step: &str) -> String {
        self.0
            .get(step)
            .map_or(String::new(), |s| format!(" (last time here: {s:.0} s)"))
    }

    fn save(&self) {
        if let Ok(text) = serde_json::to_string_pretty(&self.0) {
            let _ = std::fs::write(Self::path(), text);
        }
    }
}

/// Runs `cmd`, echoing its output, and counts tests from cargo's and node's summary lines.
fn counted(cmd: &mut Command) -> anyhow::Result<Counts> {
    let desc = util::describe(cmd);
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("starting `{desc}`"))?;
    let mut counts = Counts::default();
    if let Some(out) = child.stdout.take() {
        for line in BufReader::new(out).lines() {
            let line = line?;
            println!("{line}");
            parse_counts(&line, &mut counts);
        }
    }
    let status = child.wait()?;
    if !status.success() {
        bail!(
            "`{desc}` failed ({status}); {} passed, {} failed",
            counts.passed,
            counts.failed
        );
    }
    Ok(counts)
}

fn parse_counts(line: &str, c: &mut Counts) {
    let num_before = |s: &str, word: &str| -> Option<u64> {
        let idx = s.find(word)?;
        s[..idx]
            .trim_end()
            .rsplit([' ', '.', ';'])
            .next()?
            .parse()
            .ok()
    };
    // A Rust test whose data is absent says so on stdout past libtest's capture.
    if let Some(why) = line.strip_prefix("skipped: ") {
        c.skipped += 1;
        c.reasons.push(why.to_string());
    } else if let Some(rest) = line.strip_prefix("test result: ") {
        c.passed += num_before(rest, " passed").unwrap_or(0);
        c.failed += num_before(rest, " failed").unwrap_or(0);
        c.skipped += num_before(rest, " ignored").unwrap_or(0);
    } else if let Some(n) = line
        .strip_prefix("ℹ pass ")
        .or_else(|| line.strip_prefix("# pass "))
    {
        c.passed += n.trim().parse::<u64>().unwrap_or(0);
    } else if let Some(n) = line
        .strip_prefix("ℹ fail ")
        .or_else(|| line.strip_prefix("# fail "))
    {
        c.failed += n.trim().parse::<u64>().unwrap_or(0);
    } else if let Some(n) = line
        .strip_prefix("ℹ skipped ")
        .or_else(|| line.strip_prefix("# skipped "))
    {
        c.skipped += n.trim().parse::<u64>().unwrap_or(0);
    }
}

fn fmt(_: &Tools) -> anyhow::Result<Counts> {
    util::run(
        util::cargo()
            .args(["fmt", "--all", "--", "--check"])
            .current_dir(root()),
    )
    .context("formatting differs: run `cargo fmt --all`")?;
    Ok(Counts {
        passed: 1,
        ..Counts::default()
    })
}

fn clippy(_: &Tools) -> anyhow::Result<Counts> {
    util::run(
        util::cargo_building("clippy")
            .args([
                "--quiet",
                "--workspace",
                "--all-targets",
                "--",
                "-D",
                "warnings",
            ])
            .current_dir(root()),
    )?;
    // The browser and worker crates also compile for wasm32, where other code paths are live.
    util::run(
        util::cargo_building("clippy")
            .args([
                "--quiet",
                "--target",
                "wasm32-unknown-unknown",
                "-p",
                "straddle-web",
                "-p",
                "straddle-worker",
            ])
            .args(["--all-targets", "--", "-D", "warnings"])
            .current_dir(root()),
    )?;
    Ok(Counts {
        passed: 2,
        ..Counts::default()
    })
}

fn native(tools: &Tools) -> anyhow::Result<Counts> {
    let counts = counted(
        util::cargo_building("test")
            .args(["--workspace"])
            .env(straddle_models::SMOLLM2.test_var, &tools.model)
            .env(straddle_models::GEMMA3.test_var, &tools.gemma)
            .env(straddle_models::QWEN_EDGE.test_var, &tools.qwen_edge)
            .env(straddle_models::QWEN_CLOUD.test_var, &tools.qwen_cloud)
            // Setup installs lavapipe: a wgpu test that cannot get an adapter fails, not skips.
            .env("STRADDLE_REQUIRE_WGPU", "1")
            .current_dir(root()),
    );
    // Each test binary links burn with debug info (~1 GB); every code change leaves the old
    // ones behind, and a cached target dir would fill the disk within a day of commits.
    match util::prune_superseded_binaries(&util::target_dir().join("debug/deps")) {
        Ok(freed) if freed > 0 => eprintln!(
            "test: pruned {} MB of superseded test binaries",
            freed >> 20
        ),
        Ok(_) => {}
        Err(e) => eprintln!("test: could not prune old test binaries: {e:#}"),
    }
    counts
}

fn wasm(tools: &Tools) -> anyhow::Result<Counts> {
    // The browser test loads the real model over HTTP, as a page would.
    let model_url = crate::file_server::serve(&tools.model)?;
    let gemma_url = crate::file_server::serve(&tools.gemma)?;
    counted(
        util::cargo_building("test")
            .args(["--target", "wasm32-unknown-unknown", "-p", "straddle-web"])
            .env(
                "CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER",
                &tools.wasm_bindgen_test_runner,
            )
            .env("CHROMEDRIVER", &tools.chromedriver)
            .env("WASM_BINDGEN_TEST_TIMEOUT", "900")
            .env("STRADDLE_TEST_MODEL_URL", &model_url)
            .env("STRADDLE_TEST_GEMMA_URL", &gemma_url)
            .current_dir(root().join("crates/web")),
    )
}

/// Builds the worker for workerd and the cloud server, and returns the server's path.
pub(crate) fn worker_and_cloud_built(tools: &Tools) -> anyhow::Result<std::path::PathBuf> {
    crate::build::worker(tools)?;
    // The cloud server as the native suite built it. `cargo build -p straddle-cloud` would
    // resolve features for that crate alone and compile burn a second time (~25 minutes
    // here); the workspace's own test build reuses the native suite's artefacts.
    util::run(
        util::cargo_building("test")
            .args(["--quiet", "--workspace", "--no-run"])
            .current_dir(root()),
    )?;
    Ok(util::target_dir().join("debug/straddle-cloud"))
}

/// The official `openai` Python package the client tests pin.
const OPENAI_PYTHON: &str = "openai==3.60.0";

fn worker(tools: &Tools) -> anyhow::Result<Counts> {
    // The forwarding tests need real upstreams: ours, and llama.cpp's own server.
    let cloud = worker_and_cloud_built(tools)?;
    let llama = crate::llama_cpp::tools()?;
    // The official Python client, as integrators run it.
    let clients = setup::python_venv("clients-venv", &[OPENAI_PYTHON])?;
    counted(
        Command::new("npm")
            .args(["test", "--silent"])
            .env("STRADDLE_CLOUD_BIN", cloud)
            .env("STRADDLE_LLAMA_SERVER", &llama.server)
            .env("STRADDLE_CLIENTS_PYTHON", clients.join("python"))
            .env("STRADDLE_TEST_MODEL", &tools.model)
            .current_dir(root().join("worker")),
    )
}

fn browser(tools: &Tools) -> anyhow::Result<Counts> {
    crate::build::web_with_profile(tools, "dev")?;
    // The page talks to the real worker under workerd, in front of the real cloud server.
    let cloud = worker_and_cloud_built(tools)?;
    let mut npm = Command::new("npm");
    npm.args(["test", "--silent"])
        .env("STRADDLE_TEST_MODEL", &tools.model)
        .env(straddle_models::QWEN_EDGE.test_var, &tools.qwen_edge)
        .env(straddle_models::QWEN_CLOUD.test_var, &tools.qwen_cloud)
        .env("STRADDLE_MODEL_CATALOG", straddle_models::page_catalog())
        .env("STRADDLE_CLOUD_BIN", cloud)
        .current_dir(root().join("web"));
    // Where setup found a nightly, build-web made the threaded package: its test must run.
    if tools.threads_toolchain.is_some() {
        npm.env("STRADDLE_REQUIRE_THREADS", "1");
    }
    counted(&mut npm)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_cargo_and_node_summaries() {
        let mut c = Counts::default();
        parse_counts(
            "test result: ok. 14 passed; 2 failed; 1 ignored; 0 measured",
            &mut c,
        );
        parse_counts("ℹ pass 3", &mut c);
        parse_counts("# fail 1", &mut c);
        parse_counts("ℹ skipped 8", &mut c);
        parse_counts("skipped: ../shared/data is absent", &mut c);
        assert_eq!((c.passed, c.failed, c.skipped), (17, 3, 10));
        assert_eq!(
            c.reasons,
            ["../shared/data is absent"],
            "a skip keeps its reason"
        );
    }
}
