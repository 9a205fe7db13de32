//! Straddle's local LLM engine.
//!
//! One file per idea, in the order a reader meets them: `gguf` (the container), `quant`
//! (block formats), `qmatrix` (weights kept quantized, and their products), `tokenizer`,
//! `template` (chat templates), `model` (config, layers, forward), `kv` (the cache),
//! `sample` (choosing tokens), `generate` (the loop), `speculative` (draft and verify).

pub mod generate;
pub mod gguf;
pub mod kv;
pub mod model;
pub mod qmatrix;
pub mod quant;
pub mod sample;
pub mod speculative;
pub mod template;
pub mod tokenizer;

pub use generate::{
    Completion, Engine, EngineError, Finish, Flow, GenerateParams, Prompt, Sequence, TokenEvent,
};
pub use sample::SamplingParams;
pub use template::ChatMessage;
