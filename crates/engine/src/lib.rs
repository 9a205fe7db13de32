//! Straddle's local LLM engine.
//!
//! One file per idea, in the order a reader meets them, after the container and its block
//! formats (`gguf` and `quant`, from `straddle-gguf`, re-exported here): `qmatrix` (weights
//! kept quantized, and their products), `tokenizer`, `template` (chat templates) with `tool_prompt` (how tools and calls are written), `model`
//! (config, layers, forward on the CPU) with `attention` (its attention kernels),
//! `device_model` (the same model on a burn device: WebGPU, Vulkan, flex) and `kernels` (our
//! cubecl kernels for it), `kv` (the cache), `causal_lm` (what the loop needs of either
//! model), `sample` (choosing tokens), `grammar` (constrained decoding: the masks that keep
//! an answer to a JSON schema), `generate` (the loop: one `Engine<M>` over either model), `speculative` (draft and verify), and `bandwidth` (what the memory delivers, the
//! bound decoding is measured against).

// Each item has one path. Types a user names sit at the root; free functions and the types
// that only they take sit in the namespaces below (`sample`, `speculative`, `bandwidth`,
// `parallel`, `tool_prompt`), and the container's modules are straddle-gguf's own.
mod attention;
pub mod bandwidth;
mod causal_lm;
#[cfg(feature = "device")]
mod device_model;
mod generate;
mod grammar;
#[cfg(feature = "device")]
mod kernels;
mod kv;
mod lanes;
mod model;
pub mod parallel;
mod qmatrix;
pub mod sample;
pub mod speculative;
mod template;
mod tokenizer;
pub mod tool_prompt;
mod weights;

pub use straddle_gguf::{gguf, quant};

#[cfg(feature = "device")]
pub use burn::tensor::Device;
pub use causal_lm::{BlockingLm, CausalLm, ModelCache};
#[cfg(feature = "device")]
pub use device_model::{DeviceCache, DeviceModel};
pub use generate::{
    Completion, DEFAULT_CONTEXT, Engine, EngineError, Finish, Flow, GenerateParams, Prefilled,
    Prompt, PromptPrefix, Sequence, TokenEvent,
};
pub use grammar::{Constraint, FunctionSpec, GrammarError, Grammars, OutputFormat};
#[cfg(feature = "device")]
pub use kernels::matvec::MatvecKernel;
pub use kv::KvCache;
pub use model::{Arch, Config, Model, ModelError};
pub use qmatrix::{Kernels, QActs, QMatrix};
pub use template::{ChatMessage, ChatTemplate, TemplateError};
pub use tokenizer::{Tokenizer, TokenizerError};

/// File name of the default edge model in the model cache.
pub const DEFAULT_MODEL_FILE: &str = "smollm2-135m-instruct-q4_1.gguf";

/// File name of the second model `cargo xtask setup` fetches: Gemma 3 270M (base), Q4_K_M.
pub const GEMMA3_MODEL_FILE: &str = "gemma-3-270m-q4_k_m.gguf";

/// Where `cargo xtask setup` puts the models: `$STRADDLE_CACHE/models/`, else
/// `~/.cache/straddle/models/`.
pub fn model_dir() -> std::path::PathBuf {
    let cache = std::env::var_os("STRADDLE_CACHE")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".cache/straddle"))
        })
        .unwrap_or_else(|| std::path::PathBuf::from(".cache/straddle"));
    cache.join("models")
}

/// Where `cargo xtask setup` puts the default model.
pub fn default_model_path() -> std::path::PathBuf {
    model_dir().join(DEFAULT_MODEL_FILE)
}
