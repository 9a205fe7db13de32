//! Finds the real model for tests: `$STRADDLE_TEST_MODEL`, else the setup cache.

use std::path::PathBuf;

pub fn model_path() -> Option<PathBuf> {
    let path = std::env::var_os("STRADDLE_TEST_MODEL")
        .map(PathBuf::from)
        .or_else(|| {
            let cache = std::env::var_os("STRADDLE_CACHE")
                .map(PathBuf::from)
                .or_else(|| {
                    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/straddle"))
                })?;
            Some(cache.join("models/smollm2-135m-instruct-q4_1.gguf"))
        })?;
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
