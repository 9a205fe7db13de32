//! Finds the real models for tests: `$STRADDLE_TEST_MODEL` (the default model) and
//! `$STRADDLE_TEST_GEMMA`, else the setup cache.

use std::path::PathBuf;

/// The default model, SmolLM2-135M.
pub fn model_path() -> Option<PathBuf> {
    found(
        std::env::var_os("STRADDLE_TEST_MODEL")
            .map_or_else(straddle_engine::default_model_path, PathBuf::from),
    )
}

/// Gemma 3 270M.
#[allow(dead_code)] // not every test file uses it
pub fn gemma_path() -> Option<PathBuf> {
    found(std::env::var_os("STRADDLE_TEST_GEMMA").map_or_else(
        || straddle_engine::model_dir().join(straddle_engine::GEMMA3_MODEL_FILE),
        PathBuf::from,
    ))
}

fn found(path: PathBuf) -> Option<PathBuf> {
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
