//! Finds the real model for tests: `$STRADDLE_TEST_MODEL`, else the setup cache.

use std::path::PathBuf;

pub fn model_path() -> Option<PathBuf> {
    let path = std::env::var_os("STRADDLE_TEST_MODEL")
        .map_or_else(straddle_engine::default_model_path, PathBuf::from);
    if path.is_file() {
        Some(path)
    } else {
        eprintln!(
            "skipping: model not found at {} (run `cargo xtask setup`)",
            path.display()
        );
        None
    }
}
