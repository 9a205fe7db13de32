//! Writes the fuzzer's starting corpus: small well-formed files (v2 and v3) holding every
//! metadata value type, nested arrays and every tensor type the reader dequantizes, so
//! mutations start from the structure of a real model file rather than from nothing.

use std::path::PathBuf;

use straddle_gguf::quant::encode;
use straddle_gguf::{GgufWriter, TensorType, Value};

fn main() -> std::io::Result<()> {
    let dir = PathBuf::from(
        std::env::args()
            .nth(1)
            .unwrap_or_else(|| "corpus/gguf_read".into()),
    );
    std::fs::create_dir_all(&dir)?;
    let values: Vec<f32> = (0..256).map(|i| (i as f32 - 128.0) / 37.0).collect();
    let metadata = |w: GgufWriter| {
        w.kv("general.architecture", Value::String("llama".into()))
            .kv("general.alignment", Value::U32(32))
            .kv("u8", Value::U8(7))
            .kv("i8", Value::I8(-7))
            .kv("u16", Value::U16(700))
            .kv("i16", Value::I16(-700))
            .kv("llama.block_count", Value::U32(2))
            .kv("i32", Value::I32(-70_000))
            .kv("u64", Value::U64(1 << 40))
            .kv("i64", Value::I64(-(1 << 40)))
            .kv("llama.rope.freq_base", Value::F32(10_000.0))
            .kv("f64", Value::F64(0.5))
            .kv("bool", Value::Bool(true))
            .kv(
                "tokenizer.ggml.tokens",
                Value::Array(vec![Value::String("<s>".into()), Value::String("é".into())]),
            )
            .kv(
                "nested",
                Value::Array(vec![Value::Array(vec![Value::U8(1), Value::U8(2)])]),
            )
    };
    let f16: Vec<u8> = values
        .iter()
        .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
        .collect();
    let bf16: Vec<u8> = values
        .iter()
        .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
        .collect();
    let f32: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let tensors: Vec<(&str, TensorType, Vec<u8>)> = vec![
        ("f32", TensorType::F32, f32),
        ("f16", TensorType::F16, f16),
        ("bf16", TensorType::BF16, bf16),
        ("q8_0", TensorType::Q8_0, encode::q8_0(&values)),
        ("q4_0", TensorType::Q4_0, encode::q4_0(&values)),
        ("q4_1", TensorType::Q4_1, encode::q4_1(&values)),
        ("q5_0", TensorType::Q5_0, encode::q5_0(&values)),
        ("q5_1", TensorType::Q5_1, vec![0x33; 24]),
        ("q4_k", TensorType::Q4_K, vec![0x11; 144]),
        ("q5_k", TensorType::Q5_K, vec![0x44; 176]),
        ("q6_k", TensorType::Q6_K, vec![0x22; 210]),
    ];
    for version in [2, 3] {
        let mut all = metadata(GgufWriter::new().version(version));
        for (name, ty, bytes) in &tensors {
            let shape = [ty.block_elements() * bytes.len() as u64 / ty.block_bytes()];
            all = all.tensor(name, &shape, *ty, bytes.clone());
            let one = GgufWriter::new()
                .version(version)
                .tensor(name, &shape, *ty, bytes.clone());
            std::fs::write(dir.join(format!("v{version}-{name}.gguf")), one.to_bytes())?;
        }
        std::fs::write(dir.join(format!("v{version}-all.gguf")), all.to_bytes())?;
        std::fs::write(
            dir.join(format!("v{version}-metadata.gguf")),
            metadata(GgufWriter::new().version(version)).to_bytes(),
        )?;
        std::fs::write(
            dir.join(format!("v{version}-gemma3-metadata.gguf")),
            gemma3_metadata(GgufWriter::new().version(version)).to_bytes(),
        )?;
    }
    Ok(())
}

/// The metadata a Gemma 3 file carries: SentencePiece scores and token types, the keys the
/// second architecture reads (head length, sliding window).
fn gemma3_metadata(w: GgufWriter) -> GgufWriter {
    let pieces = ["<pad>", "<eos>", "<bos>", "\u{2581}a", "<0x41>", "\n\n"];
    w.kv("general.architecture", Value::String("gemma3".into()))
        .kv("gemma3.attention.key_length", Value::U32(256))
        .kv("gemma3.attention.value_length", Value::U32(256))
        .kv("gemma3.attention.sliding_window", Value::U32(512))
        .kv("tokenizer.ggml.model", Value::String("llama".into()))
        .kv(
            "tokenizer.ggml.tokens",
            Value::Array(pieces.iter().map(|p| Value::String(p.to_string())).collect()),
        )
        .kv(
            "tokenizer.ggml.scores",
            Value::Array((0..6).map(|i| Value::F32(-(i as f32))).collect()),
        )
        .kv(
            "tokenizer.ggml.token_type",
            Value::Array([3, 3, 3, 1, 6, 4].into_iter().map(Value::I32).collect()),
        )
        .kv("tokenizer.ggml.add_space_prefix", Value::Bool(false))
}
