//! A model file on disk: loaded into the CPU engine, or hashed to name it (the router's
//! quality model and the answer caches know an edge model by its SHA-256).

use std::path::Path;

use anyhow::Context;
use sha2::{Digest, Sha256};
use straddle_engine::Engine;

/// Loads the edge model from `path`.
pub fn load_engine(path: &Path) -> anyhow::Result<Engine> {
    let source = straddle_engine::gguf::FileSource::open(path).with_context(|| {
        format!(
            "opening model {} (run `cargo xtask setup`, or pass --model)",
            path.display()
        )
    })?;
    Engine::load(source, straddle_engine::DEFAULT_CONTEXT)
        .with_context(|| format!("loading model {}", path.display()))
}

/// SHA-256 of a file, hex.
pub fn sha256(path: &Path) -> anyhow::Result<String> {
    let mut f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut h = Sha256::new();
    std::io::copy(&mut f, &mut h).with_context(|| format!("reading {}", path.display()))?;
    Ok(hex::encode(h.finalize()))
}
