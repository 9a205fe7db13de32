//! Straddle's local LLM engine.
//!
//! One file per idea, in the order a reader meets them, after the container and its block
//! formats (`gguf` and `quant`, from `straddle-gguf`, re-exported here): `config` (the
//! families, hyper-parameters and load errors, before any weight), `qmatrix` (weights kept
//! quantized, and their products), `tokenizer`, `message` (a conversation turn), `template`
//! (chat templates) with `tool_prompt` (how tools and calls are written), `weights` (which
//! tensors each family reads), `model` (forward on the CPU) with `attention` (its attention
//! kernels), `device_model` (the same model on a burn device: WebGPU, Vulkan, flex) and
//! `kernels` (our cubecl kernels for it), `kv` (the cache), `memory` (what a model needs,
//! from its header alone), `chunk` (a sequence's tokens in a pass, and the pass they belong
//! to), `causal_lm` (what the loop needs of either model),
//! `sample` (choosing tokens, and how sure the model is), `grammar` (constrained decoding:
//! the masks that keep an answer to a JSON schema), `generate` (the loop: one `Engine<M>` over
//! either model, and the look at a prefilled prompt the router reads), `speculative` (draft
//! and verify), and `bandwidth` (what the memory delivers, the bound decoding is measured
//! against).

// Each item has one path. Types a user names sit at the root; free functions and the types
// that only they take sit in the namespaces below (`sample`, `speculative`, `bandwidth`,
// `parallel`, `tool_prompt`), and the container's modules are straddle-gguf's own.
mod attention;
pub mod bandwidth;
mod block;
mod causal_lm;
mod chunk;
mod config;
#[cfg(feature = "device")]
mod device_model;
mod generate;
mod grammar;
#[cfg(feature = "device")]
mod kernels;
mod kv;
mod lanes;
mod memory;
mod message;
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
pub use chunk::Chunk;
pub use config::{Arch, Config, ModelError};
#[cfg(feature = "device")]
pub use device_model::{DeviceCache, DeviceModel};
pub use generate::{
    Completion, DEFAULT_CONTEXT, Engine, EngineError, Finish, Flow, GenerateParams, Look,
    Prefilled, Prompt, PromptPrefix, Sequence, TokenEvent,
};
pub use grammar::{Constraint, FunctionSpec, GrammarError, Grammars, OutputFormat};
#[cfg(feature = "device")]
pub use kernels::matvec::MatvecKernel;
pub use kv::KvCache;
pub use memory::{MIN_CONTEXT, MemoryNeed};
pub use message::ChatMessage;
pub use model::Model;
pub use qmatrix::{Kernels, QActs, QMatrix};
pub use template::{ChatTemplate, TemplateError};
pub use tokenizer::{Tokenizer, TokenizerError};
