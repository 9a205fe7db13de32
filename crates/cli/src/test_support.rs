//! Paths for tests.

use std::path::PathBuf;

/// This crate's directory. `cargo test` sets `CARGO_MANIFEST_DIR` when it runs a test; the
/// compile-time value is only a fallback, because a target dir shared between checkouts
/// (CI's cache) can run a binary compiled in another checkout.
pub fn manifest_dir() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

/// SmolLM2-135M, the smallest real model, for tests that need speed.
pub fn test_model() -> Option<PathBuf> {
    straddle_testkit::model(straddle_testkit::SMOLLM2)
}
