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

/// The real model for tests: `STRADDLE_TEST_MODEL` (which `cargo xtask test` sets, and where
/// a missing file is a failure), else the model setup fetched when it is there.
pub fn test_model() -> Option<PathBuf> {
    let path = std::env::var_os("STRADDLE_TEST_MODEL")
        .map_or_else(straddle_engine::default_model_path, PathBuf::from);
    if path.is_file() {
        return Some(path);
    }
    assert!(
        std::env::var_os("STRADDLE_TEST_MODEL").is_none(),
        "no model at {}",
        path.display()
    );
    None
}
