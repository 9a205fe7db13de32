//! The real models for tests, found by `straddle-testkit` (missing: a failure under CI, a
//! counted skip elsewhere).

use std::path::PathBuf;

/// SmolLM2-135M, the smallest model.
#[allow(dead_code)] // not every test file uses each
pub fn model_path() -> Option<PathBuf> {
    straddle_testkit::model(straddle_testkit::SMOLLM2)
}

/// Gemma 3 270M.
#[allow(dead_code)]
pub fn gemma_path() -> Option<PathBuf> {
    straddle_testkit::model(straddle_testkit::GEMMA3)
}

/// Qwen2.5-Coder-0.5B-Instruct, the default edge model.
#[allow(dead_code)]
pub fn qwen_edge_path() -> Option<PathBuf> {
    straddle_testkit::model(straddle_testkit::QWEN_EDGE)
}

/// Qwen2.5-Coder-1.5B-Instruct, the default cloud model.
#[allow(dead_code)]
pub fn qwen_cloud_path() -> Option<PathBuf> {
    straddle_testkit::model(straddle_testkit::QWEN_CLOUD)
}
