//! Straddle's local LLM engine.
//!
//! One file per idea, in the order a reader meets them: `gguf` (the container format),
//! `quant` (block formats and dequantization).

pub mod gguf;
pub mod quant;
