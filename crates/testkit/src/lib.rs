//! What every test suite shares: the real models, the data that lives outside the
//! repository (`../shared/data`), and one rule for whatever of them is missing. Under
//! `CI=true` a missing model, tool or data set fails the test; elsewhere the test is skipped
//! with a `skipped: …` line that `cargo xtask test` counts, so a skip is never silent.

pub mod llama_reference;

use std::io::Write as _;
use std::path::{Path, PathBuf};

pub use straddle_models::{GEMMA3, KnownModel, QWEN_CLOUD, QWEN_EDGE, SMOLLM2};

/// Whether this run is CI's, where nothing may be skipped.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Reports that `what` is missing: a panic under CI, else a counted skip. Returns `None` so a
/// test can write `let Some(x) = … else { return };`.
pub fn missing<T>(what: &str) -> Option<T> {
    // Written past libtest's capture, which only holds the `print!` macros' output, so the
    // test runner sees it whether or not the test passes.
    missing_where(in_ci(), what, &mut std::io::stdout())
}

fn missing_where<T>(ci: bool, what: &str, out: &mut dyn std::io::Write) -> Option<T> {
    assert!(!ci, "CI=true: {what} (run `cargo xtask setup`)");
    let _ = writeln!(out, "skipped: {what}");
    None
}

/// Reports that this machine cannot run `what` (an instruction set the CPU lacks): a
/// counted skip everywhere, CI included, because no setup can add it.
pub fn unsupported(what: &str) {
    let _ = writeln!(
        std::io::stdout(),
        "skipped: {what} (this machine cannot run it)"
    );
}

/// Reports that no wgpu adapter came up (`why`): a failure where one is required, that is
/// under CI or with `STRADDLE_REQUIRE_WGPU` set (`cargo xtask test` sets it, since setup
/// installs lavapipe), else a counted skip. Returns `None` as [`missing`] does.
pub fn no_wgpu_adapter<T>(why: &str) -> Option<T> {
    assert!(
        std::env::var_os("STRADDLE_REQUIRE_WGPU").is_none(),
        "wgpu device required but unavailable: {why}"
    );
    missing(&format!("no wgpu adapter ({why})"))
}

/// The real model for a test: the file its variable names (`cargo xtask test` sets it), else
/// the one setup fetched; missing, it is [`missing`].
pub fn model(m: KnownModel) -> Option<PathBuf> {
    let path = m.test_path();
    if path.is_file() {
        return Some(path);
    }
    missing(&format!("{} is absent at {}", m.title, path.display()))
}

/// A tool or file a test is handed through the environment variable `var`.
pub fn from_env(var: &str) -> Option<PathBuf> {
    match std::env::var_os(var).map(PathBuf::from) {
        Some(p) if p.exists() => Some(p),
        Some(p) => missing(&format!("{var}={} does not exist", p.display())),
        None => missing(&format!("{var} is unset (`cargo xtask test` sets it)")),
    }
}

/// `../shared/data/<relative>` beside the checkout, which a user's fresh clone lacks.
pub fn shared_data(relative: &str) -> Option<PathBuf> {
    let path = workspace_root().join("../shared/data").join(relative);
    if path.exists() {
        return Some(path);
    }
    missing(&format!(
        "{} is absent (it lives outside the repository)",
        path.display()
    ))
}

/// The checkout's root: the nearest folder above the running test's crate that holds
/// `Cargo.lock`. Read at run time, because a target dir shared between checkouts (CI caches
/// one) can run a binary compiled in another.
pub fn workspace_root() -> PathBuf {
    let start = std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from);
    start
        .ancestors()
        .find(|d| d.join("Cargo.lock").is_file())
        .map_or(start.clone(), Path::to_path_buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_root_holds_the_workspace() {
        assert!(workspace_root().join("crates/testkit").is_dir());
    }

    #[test]
    fn a_missing_thing_fails_under_ci_and_is_a_named_skip_elsewhere() {
        let under_ci = std::panic::catch_unwind(|| {
            missing_where::<()>(true, "the probe file", &mut Vec::new())
        });
        let message = under_ci.expect_err("CI must fail");
        let text = message
            .downcast_ref::<String>()
            .map(String::as_str)
            .unwrap_or_default();
        assert!(text.contains("CI=true: the probe file"), "{text}");
        let mut out = Vec::new();
        assert_eq!(missing_where::<()>(false, "the probe file", &mut out), None);
        assert_eq!(out, b"skipped: the probe file\n");
    }
}
