//! The GGUF file format, on its own so that whatever reads a model file (the engine, the
//! fuzzer, a tool that inspects a download) does not need a tensor library.
//!
//! `gguf` is the container: header, metadata, tensor directory and lazily read tensor bytes,
//! hardened against hostile files. `quant` is GGML's element types: block geometry,
//! dequantization, and the encoders the tests use to write small models.

pub mod gguf;
pub mod quant;

#[cfg(unix)]
pub use gguf::FileSource;
pub use gguf::{ByteSource, Gguf, GgufError, GgufWriter, Prefix, TensorInfo, Value};
pub use quant::{QuantError, TensorType};
