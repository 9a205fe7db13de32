//! `cargo xtask fuzz`: the GGUF reader under libFuzzer (cargo-fuzz, nightly) for a fixed
//! time, starting from a corpus of well-formed files of every value and tensor type.
//!
//! Kept out of `test` on purpose: it needs nightly and minutes; a crash it finds becomes a
//! regression test in `crates/gguf`.

use std::process::Command;

use anyhow::{Context, bail};

use crate::util::{self, root, tools_bin};

const CARGO_FUZZ_VERSION: &str = "0.13.2";
const TARGET: &str = "gguf_read";

/// Runs the reader's fuzz target; `--seconds N` (default 600).
pub fn run(args: &[String]) -> anyhow::Result<()> {
    let seconds = match args {
        [] => 600,
        [flag, n] if flag == "--seconds" => n
            .parse::<u64>()
            .with_context(|| format!("--seconds takes a whole number, not `{n}`"))?,
        _ => bail!("usage: cargo xtask fuzz [--seconds N]"),
    };
    nightly()?;
    let mut did = Vec::new();
    crate::setup::cargo_tool("cargo-fuzz", CARGO_FUZZ_VERSION, &["cargo-fuzz"], &mut did)?;

    let dir = root().join("crates/gguf/fuzz");
    // Its own target dir: instrumented builds would otherwise evict the test builds.
    let target = util::cache_dir().join("fuzz-target");
    let corpus = dir.join("corpus").join(TARGET);
    util::run(
        Command::new("rustup")
            .current_dir(&dir)
            .env("CARGO_TARGET_DIR", &target)
            .args([
                "run",
                "nightly",
                "cargo",
                "run",
                "--quiet",
                "--bin",
                "write_seeds",
                "--",
            ])
            .arg(&corpus),
    )?;
    let started = std::time::Instant::now();
    util::run(
        Command::new("rustup")
            .current_dir(&dir)
            .env("CARGO_TARGET_DIR", &target)
            // cargo-fuzz runs the `cargo` it finds: nightly's, through rustup.
            .env("PATH", fuzz_path()?)
            .args(["run", "nightly", "cargo-fuzz", "fuzz", "run", TARGET])
            .arg(&corpus)
            .args([
                "--",
                &format!("-max_total_time={seconds}"),
                // Bounded input and memory: an allocation the input did not pay for shows
                // up as an out-of-memory crash rather than passing unnoticed.
                "-max_len=65536",
                "-rss_limit_mb=2048",
                "-malloc_limit_mb=512",
                "-print_final_stats=1",
            ]),
    )
    .context("the fuzzer found a crash: the input is in crates/gguf/fuzz/artifacts/")?;
    eprintln!(
        "fuzz: {TARGET} ran {:.0} s with no crash",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `PATH` with the project's tools (cargo-fuzz) first.
fn fuzz_path() -> anyhow::Result<std::ffi::OsString> {
    let mut paths = vec![tools_bin()];
    paths.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    std::env::join_paths(paths).context("PATH holds a path that cannot be joined")
}

/// cargo-fuzz needs a nightly compiler for its sanitizer and coverage flags.
fn nightly() -> anyhow::Result<()> {
    let have = Command::new("rustup")
        .args(["run", "nightly", "rustc", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if have {
        return Ok(());
    }
    util::run(Command::new("rustup").args([
        "toolchain",
        "install",
        "nightly",
        "--profile",
        "minimal",
    ]))
    .context("cargo xtask fuzz needs a nightly toolchain and could not install one")
}
