//! `straddle requant`: rewrites a GGUF's quantized weight matrices in another block type, e.g.
//! a lower-precision copy of a model to draft for it (same tokenizer, same shapes).

use std::path::Path;

use anyhow::Context;
use straddle_engine::gguf::{FileSource, Gguf, GgufWriter, Value};
use straddle_engine::quant::{self, TensorType};

/// Target block types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Target {
    Q4_0,
    Q4_1,
    Q8_0,
}

impl Target {
    fn ty(self) -> TensorType {
        match self {
            Target::Q4_0 => TensorType::Q4_0,
            Target::Q4_1 => TensorType::Q4_1,
            Target::Q8_0 => TensorType::Q8_0,
        }
    }

    /// llama.cpp's `general.file_type` for a file mostly of this type.
    fn file_type(self) -> u32 {
        match self {
            Target::Q4_0 => 2,
            Target::Q4_1 => 3,
            Target::Q8_0 => 7,
        }
    }

    fn encode(self, values: &[f32]) -> Vec<u8> {
        match self {
            Target::Q4_0 => quant::encode::q4_0(values),
            Target::Q4_1 => quant::encode::q4_1(values),
            Target::Q8_0 => quant::encode::q8_0(values),
        }
    }
}

/// Rewrites every tensor of type `from` in `input` as `to`, writing `output`; returns how
/// many tensors changed.
pub fn run(input: &Path, output: &Path, from: Target, to: Target) -> anyhow::Result<usize> {
    let source = FileSource::open(input).with_context(|| format!("opening {}", input.display()))?;
    let g = Gguf::read(source).with_context(|| format!("reading {}", input.display()))?;
    let mut w = GgufWriter::new().version(g.version);
    for (k, v) in &g.metadata {
        let v = if k == "general.file_type" {
            Value::U32(to.file_type())
        } else {
            v.clone()
        };
        w = w.kv(k, v);
    }
    let mut changed = 0;
    for t in &g.tensors {
        let bytes = g
            .tensor_bytes(&t.name)
            .with_context(|| format!("reading tensor {}", t.name))?;
        if t.ty == from.ty() && from != to {
            let values = quant::dequantize(t.ty, &bytes)
                .with_context(|| format!("dequantizing {}", t.name))?;
            w = w.tensor(&t.name, &t.shape, to.ty(), to.encode(&values));
            changed += 1;
        } else {
            w = w.tensor(&t.name, &t.shape, t.ty, bytes.into_owned());
        }
    }
    std::fs::write(output, w.to_bytes())
        .with_context(|| format!("writing {}", output.display()))?;
    Ok(changed)
}
