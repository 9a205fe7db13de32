//! Small helpers shared by the commands: paths, running processes, hashing.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

/// The repository root (the parent of `xtask/`).
pub fn root() -> PathBuf {
    // `cargo run` sets the variable at run time too; prefer it, because a target dir shared
    // between clones (CI caches one) can hold an xtask compiled in another clone's path.
    let manifest_dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    manifest_dir
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// Straddle's cache outside the repo: `$STRADDLE_CACHE` or `~/.cache/straddle`.
pub fn cache_dir() -> PathBuf {
    straddle_models::cache_dir()
}

/// The project-local tools dir (git-ignored).
pub fn tools_bin() -> PathBuf {
    root().join(".tools/bin")
}

/// The cargo target dir in use.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"))
}

/// `cargo` as invoked by the user (respects `$CARGO`).
pub fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// Whether builds write cargo's per-crate timing reports (`cargo xtask test --timings`).
static TIMINGS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Makes every [`cargo_building`] command write cargo's timing report.
pub fn record_build_timings() {
    TIMINGS.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// `cargo <subcommand>` for a command that compiles (`build`, `check`, `clippy`, `test`),
/// with `--timings` when [`record_build_timings`] asked for it.
pub fn cargo_building(subcommand: &str) -> Command {
    let mut cmd = cargo();
    cmd.arg(subcommand);
    if TIMINGS.load(std::sync::atomic::Ordering::Relaxed) {
        cmd.arg("--timings");
    }
    cmd
}

/// Runs `cmd`, failing with its description when it exits non-zero.
pub fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let desc = describe(cmd);
    let status = cmd
        .status()
        .with_context(|| format!("could not start `{desc}`"))?;
    if !status.success() {
        bail!("`{desc}` failed ({status})");
    }
    Ok(())
}

/// Runs `cmd` and returns its stdout, failing when it exits non-zero.
pub fn output(cmd: &mut Command) -> anyhow::Result<String> {
    let desc = describe(cmd);
    let out = cmd
        .output()
        .with_context(|| format!("could not start `{desc}`"))?;
    if !out.status.success() {
        bail!(
            "`{desc}` failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A shell-like rendering of `cmd` for messages.
pub fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Whether `program` can be found on `PATH` (or is a path that exists).
pub fn which(program: &str) -> Option<PathBuf> {
    if program.contains('/') {
        return Path::new(program).exists().then(|| PathBuf::from(program));
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(program))
            .find(|p| p.is_file())
    })
}

/// SHA-256 of a file, hex.
pub fn sha256_file(path: &Path) -> anyhow::Result<String> {
    use sha2::{Digest, Sha256};
    let mut file =
        std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut file, &mut hasher)?;
    Ok(hex::encode(hasher.finalize()))
}

/// The version of crate `name` in Cargo.lock.
pub fn locked_version(name: &str) -> anyhow::Result<String> {
    let lock = std::fs::read_to_string(root().join("Cargo.lock")).context("reading Cargo.lock")?;
    let needle = format!("name = \"{name}\"\nversion = \"");
    let start = lock
        .find(&needle)
        .with_context(|| format!("{name} is not in Cargo.lock"))?
        + needle.len();
    let end = lock[start..].find('"').context("malformed Cargo.lock")?;
    Ok(lock[start..start + end].to_string())
}

/// An HTTP client whose requests give up after `timeout`; error statuses come back as
/// responses, for the caller to judge.
pub fn http(timeout: std::time::Duration) -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_global(Some(timeout))
        .http_status_as_error(false)
        .build()
        .new_agent()
}

/// `cargo build` with the `fast` profile (release without LTO), as the demo and benchmarks run.
pub fn build_fast(args: &[&str]) -> anyhow::Result<()> {
    run(cargo()
        .args(["build", "--quiet", "--profile", "fast"])
        .args(args)
        .current_dir(root()))
}

/// Deletes every executable `NAME-<16 hex>` in `deps` but the newest of each `NAME`; returns
/// the bytes freed. Libraries (which have extensions) are never touched.
pub fn prune_superseded_binaries(deps: &Path) -> anyhow::Result<u64> {
    use std::collections::HashMap;
    use std::os::unix::fs::PermissionsExt;
    let mut newest: HashMap<String, Vec<(std::time::SystemTime, PathBuf, u64)>> = HashMap::new();
    let Ok(entries) = std::fs::read_dir(deps) else {
        return Ok(0);
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let Ok(meta) = entry.metadata() else {
            continue;
        };
        let is_exe = meta.is_file() && meta.permissions().mode() & 0o111 != 0;
        let Some((stem, hash)) = name.rsplit_once('-') else {
            continue;
        };
        if !is_exe
            || name.contains('.')
            || hash.len() != 16
            || !hash.bytes().all(|b| b.is_ascii_hexdigit())
        {
            continue;
        }
        let modified = meta.modified().unwrap_or(std::time::UNIX_EPOCH);
        newest
            .entry(stem.to_owned())
            .or_default()
            .push((modified, path, meta.len()));
    }
    let mut freed = 0;
    for mut versions in newest.into_values() {
        versions.sort();
        versions.pop();
        for (_, path, len) in versions {
            if std::fs::remove_file(&path).is_ok() {
                freed += len;
            }
        }
    }
    Ok(freed)
}

/// A bar over a bench's `steps` runs, naming the one in progress (`set_message`), with an
/// ETA; indicatif draws nothing when stderr is not a terminal (CI, a log file).
pub fn bench_bar(steps: u64, bench: &str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(steps).with_prefix(bench.to_string());
    let style = indicatif::ProgressStyle::with_template(
        "{prefix} {bar:30} {pos}/{len} {msg} [{elapsed_precise}, ETA {eta}]",
    )
    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
    bar.set_style(style);
    bar
}
