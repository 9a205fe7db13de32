//! A tiny random 2-layer Llama GGUF written in memory: any weight type, grouped-query
//! attention, tied or untied output head.
// Each test binary uses a different part of this helper.
#![allow(dead_code)]

use straddle_engine::gguf::{ByteSource, Gguf, GgufWriter, Value};
use straddle_engine::quant::{TensorType, encode};

pub const VOCAB: usize = 40;

/// Model width and FFN width for weights of type `ty`: rows must hold whole blocks, 256 values
/// for the K-quants.
fn dims(ty: TensorType) -> (usize, usize) {
    if ty.block_elements() == 256 {
        (256, 512)
    } else {
        (64, 96)
    }
}

struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.5
    }
    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.next()).collect()
    }
}

fn encode_as(ty: TensorType, v: &[f32]) -> Vec<u8> {
    match ty {
        TensorType::F32 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        TensorType::F16 => v
            .iter()
            .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
            .collect(),
        TensorType::Q8_0 => encode::q8_0(v),
        TensorType::Q4_0 => encode::q4_0(v),
        TensorType::BF16 => v
            .iter()
            .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
            .collect(),
        TensorType::Q4_1 => encode::q4_1(v),
        TensorType::Q4_K => encode::q4_k(v),
        TensorType::Q6_K => encode::q6_k(v),
        TensorType::Q5_0 => encode::q5_0(v),
        TensorType::Q5_1 => encode::q5_1(v),
        TensorType::Q5_K => encode::q5_k(v),
        other => panic!("no encoder for {other:?}"),
    }
}

/// A 2-layer model with `heads`/`kv_heads` attention heads and weights of type `ty`.
pub fn model(ty: TensorType, heads: u32, kv_heads: u32, untied: bool) -> Vec<u8> {
    build(dims(ty), heads, kv_heads, untied, |v| {
        (ty, encode_as(ty, v))
    })
}

/// A `layers`-layer Gemma 3 with weights of type `ty`: 4 query heads and 1 KV head of 32
/// (wider together than the model's 64), its extra norms, and a sliding window of `window`
/// on all but every sixth layer.
pub fn gemma3(ty: TensorType, layers: usize, window: u32) -> Vec<u8> {
    gemma3_with_context(ty, layers, window, 64)
}

/// [`gemma3`] trained (by its header) for `context` positions.
pub fn gemma3_with_context(ty: TensorType, layers: usize, window: u32, context: u32) -> Vec<u8> {
    let (d, ffn, hd) = (64usize, 96usize, 32usize);
    let mut rng = Lcg(11);
    let mut w = GgufWriter::new()
        .kv("general.architecture", Value::String("gemma3".into()))
        .kv("gemma3.block_count", Value::U32(layers as u32))
        .kv("gemma3.embedding_length", Value::U32(d as u32))
        .kv("gemma3.feed_forward_length", Value::U32(ffn as u32))
        .kv("gemma3.attention.head_count", Value::U32(4))
        .kv("gemma3.attention.head_count_kv", Value::U32(1))
        .kv("gemma3.attention.key_length", Value::U32(hd as u32))
        .kv("gemma3.attention.value_length", Value::U32(hd as u32))
        .kv("gemma3.attention.sliding_window", Value::U32(window))
        .kv("gemma3.rope.freq_base", Value::F32(1e6))
        .kv("gemma3.attention.layer_norm_rms_epsilon", Value::F32(1e-6))
        .kv("gemma3.context_length", Value::U32(context));
    let mut mat = |w: GgufWriter, name: &str, rows: usize, cols: usize| {
        let v = rng.vec(rows * cols);
        w.tensor(name, &[cols as u64, rows as u64], ty, encode_as(ty, &v))
    };
    w = mat(w, "token_embd.weight", VOCAB, d);
    w = w.tensor("output_norm.weight", &[d as u64], TensorType::F32, norm(d));
    for l in 0..layers {
        let n = |s: &str| format!("blk.{l}.{s}.weight");
        for (name, len) in [
            ("attn_norm", d),
            ("ffn_norm", d),
            ("post_attention_norm", d),
            ("post_ffw_norm", d),
            ("attn_q_norm", hd),
            ("attn_k_norm", hd),
        ] {
            w = w.tensor(&n(name), &[len as u64], TensorType::F32, norm(len));
        }
        w = mat(w, &n("attn_q"), 4 * hd, d);
        w = mat(w, &n("attn_k"), hd, d);
        w = mat(w, &n("attn_v"), hd, d);
        w = mat(w, &n("attn_output"), d, 4 * hd);
        w = mat(w, &n("ffn_gate"), ffn, d);
        w = mat(w, &n("ffn_up"), ffn, d);
        w = mat(w, &n("ffn_down"), d, ffn);
    }
    w.to_bytes()
}

/// [`gemma3`]'s bytes with a header that claims heads of 64: its Q/K norms (32 values) and
/// projections no longer agree with it (a lying file).
pub fn gemma3_with_lying_heads() -> Vec<u8> {
    let mut bytes = gemma3(TensorType::Q8_0, 2, 3);
    for key in [
        &b"gemma3.attention.key_length"[..],
        b"gemma3.attention.value_length",
    ] {
        let at = bytes
            .windows(key.len())
            .position(|w| w == key)
            .expect("key")
            + key.len()
            + 4;
        bytes[at..at + 4].copy_from_slice(&64u32.to_le_bytes());
    }
    bytes
}

/// An RMSNorm weight of `n` values near 1.
fn norm(n: usize) -> Vec<u8> {
    (0..n)
        .flat_map(|i| (1.0 + i as f32 * 0.01).to_le_bytes())
        .collect()
}

/// The same model as [`model`], with every `ty` weight replaced by its exact dequantized
/// values stored as F32: a full-precision reference for the quantized one.
pub fn model_as_f32(ty: TensorType, heads: u32, kv_heads: u32, untied: bool) -> Vec<u8> {
    build(dims(ty), heads, kv_heads, untied, |v| {
        let exact = straddle_engine::quant::dequantize(ty, &encode_as(ty, v)).expect("dequantize");
        (TensorType::F32, encode_as(TensorType::F32, &exact))
    })
}

/// Builds the model, storing each random weight matrix as `encode` does.
fn build(
    (d, ffn): (usize, usize),
    heads: u32,
    kv_heads: u32,
    untied: bool,
    encode: impl Fn(&[f32]) -> (TensorType, Vec<u8>),
) -> Vec<u8> {
    let mut rng = Lcg(7);
    let kv = d / heads as usize * kv_heads as usize;
    let mut w = GgufWriter::new()
        .kv("general.architecture", Value::String("llama".into()))
        .kv("llama.block_count", Value::U32(2))
        .kv("llama.embedding_length", Value::U32(d as u32))
        .kv("llama.feed_forward_length", Value::U32(ffn as u32))
        .kv("llama.attention.head_count", Value::U32(heads))
        .kv("llama.attention.head_count_kv", Value::U32(kv_heads))
        .kv("llama.rope.freq_base", Value::F32(10_000.0))
        .kv("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5))
        .kv("llama.context_length", Value::U32(64));
    let mat = |w: GgufWriter, name: &str, rows: usize, cols: usize, rng: &mut Lcg| {
        let (ty, bytes) = encode(&rng.vec(rows * cols));
        w.tensor(name, &[cols as u64, rows as u64], ty, bytes)
    };
    let embed = rng.vec(VOCAB * d);
    let (ty, bytes) = encode(&embed);
    w = w.tensor("token_embd.weight", &[d as u64, VOCAB as u64], ty, bytes);
    if untied {
        // Same values as the embedding: an untied head must then give the tied logits.
        let (ty, bytes) = encode(&embed);
        w = w.tensor("output.weight", &[d as u64, VOCAB as u64], ty, bytes);
    }
    w = w.tensor("output_norm.weight", &[d as u64], TensorType::F32, norm(d));
    for l in 0..2 {
        let n = |s: &str| format!("blk.{l}.{s}.weight");
        w = w.tensor(&n("attn_norm"), &[d as u64], TensorType::F32, norm(d));
        w = w.tensor(&n("ffn_norm"), &[d as u64], TensorType::F32, norm(d));
        w = mat(w, &n("attn_q"), d, d, &mut rng);
        w = mat(w, &n("attn_k"), kv, d, &mut rng);
        w = mat(w, &n("attn_v"), kv, d, &mut rng);
        w = mat(w, &n("attn_output"), d, d, &mut rng);
        w = mat(w, &n("ffn_gate"), ffn, d, &mut rng);
        w = mat(w, &n("ffn_up"), ffn, d, &mut rng);
        w = mat(w, &n("ffn_down"), d, ffn, &mut rng);
    }
    w.to_bytes()
}

/// The families checked against llama.cpp on tiny random weights with a real vocabulary:
/// `(name, architecture, pre-tokenizer)`.
pub const FAMILIES: [(&str, &str, &str); 4] = [
    ("qwen2", "qwen2", "qwen2"),
    ("qwen3", "qwen3", "qwen2"),
    ("llama3", "llama", "llama-bpe"),
    ("phi3", "phi3", "llama-bpe"),
];

/// A 2-layer random-weight model of `arch` with the vocabulary (tokens, merges, types,
/// special ids) of `vocab`, a real GGUF, under the pre-tokenizer `pre`.
/// The output norm is large so the logits spread and most greedy steps have a clear margin.
/// `tests/reference/make_families.py` runs llama.cpp on exactly these bytes.
pub fn family<S: ByteSource>(arch: &str, pre: &str, vocab: &Gguf<S>) -> Vec<u8> {
    let (d, ffn, heads, kv_heads) = (64usize, 128usize, 4usize, 2usize);
    // Qwen 3 declares its head size: wider heads than d / heads, as the real ones have.
    let hd = if arch == "qwen3" { 32 } else { d / heads };
    let tokens = vocab.get("tokenizer.ggml.tokens").expect("tokens").clone();
    let n_vocab = tokens.as_array().map_or(0, <[Value]>::len);
    let key = |k: &str| format!("{arch}.{k}");
    let mut w = GgufWriter::new()
        .kv("general.architecture", Value::String(arch.into()))
        .kv(&key("block_count"), Value::U32(2))
        .kv(&key("context_length"), Value::U32(256))
        .kv(&key("embedding_length"), Value::U32(d as u32))
        .kv(&key("feed_forward_length"), Value::U32(ffn as u32))
        .kv(&key("attention.head_count"), Value::U32(heads as u32))
        .kv(&key("attention.head_count_kv"), Value::U32(kv_heads as u32))
        .kv(&key("attention.key_length"), Value::U32(hd as u32))
        .kv(&key("attention.value_length"), Value::U32(hd as u32))
        .kv(&key("rope.freq_base"), Value::F32(1e6))
        .kv(&key("attention.layer_norm_rms_epsilon"), Value::F32(1e-6))
        .kv("tokenizer.ggml.model", Value::String("gpt2".into()))
        .kv("tokenizer.ggml.pre", Value::String(pre.into()))
        .kv("tokenizer.ggml.tokens", tokens);
    for k in [
        "tokenizer.ggml.merges",
        "tokenizer.ggml.token_type",
        "tokenizer.ggml.bos_token_id",
        "tokenizer.ggml.eos_token_id",
    ] {
        w = w.kv(k, vocab.get(k).expect("the vocabulary's metadata").clone());
    }
    let mut rng = Lcg(23);
    let mat = |w: GgufWriter, name: &str, rows: usize, cols: usize, rng: &mut Lcg| {
        let v = rng.vec(rows * cols);
        w.tensor(
            name,
            &[cols as u64, rows as u64],
            TensorType::Q8_0,
            encode::q8_0(&v),
        )
    };
    w = mat(w, "token_embd.weight", n_vocab, d, &mut rng);
    if arch == "phi3" {
        // llama.cpp requires Phi 3's output head (never tied there).
        w = mat(w, "output.weight", n_vocab, d, &mut rng);
    }
    let scaled = |n: usize, scale: f32| -> Vec<u8> {
        (0..n)
            .flat_map(|i| (scale * (1.0 + i as f32 * 0.01)).to_le_bytes())
            .collect()
    };
    w = w.tensor(
        "output_norm.weight",
        &[d as u64],
        TensorType::F32,
        scaled(d, 6.0),
    );
    for l in 0..2 {
        let n = |s: &str| format!("blk.{l}.{s}.weight");
        w = w.tensor(&n("attn_norm"), &[d as u64], TensorType::F32, norm(d));
        w = w.tensor(&n("ffn_norm"), &[d as u64], TensorType::F32, norm(d));
        if arch == "phi3" {
            // Phi 3 stacks Q, K and V in one tensor, and the gate above the up projection.
            w = mat(w, &n("attn_qkv"), (heads + 2 * kv_heads) * hd, d, &mut rng);
            w = mat(w, &n("ffn_up"), 2 * ffn, d, &mut rng);
        } else {
            w = mat(w, &n("attn_q"), heads * hd, d, &mut rng);
            w = mat(w, &n("attn_k"), kv_heads * hd, d, &mut rng);
            w = mat(w, &n("attn_v"), kv_heads * hd, d, &mut rng);
            w = mat(w, &n("ffn_gate"), ffn, d, &mut rng);
            w = mat(w, &n("ffn_up"), ffn, d, &mut rng);
        }
        w = mat(w, &n("attn_output"), d, heads * hd, &mut rng);
        w = mat(w, &n("ffn_down"), d, ffn, &mut rng);
        if arch == "qwen2" {
            for (name, len) in [
                ("attn_q", heads * hd),
                ("attn_k", kv_heads * hd),
                ("attn_v", kv_heads * hd),
            ] {
                let bias: Vec<f32> = rng.vec(len);
                let bytes = bias.iter().flat_map(|v| v.to_le_bytes()).collect();
                w = w.tensor(
                    &format!("blk.{l}.{name}.bias"),
                    &[len as u64],
                    TensorType::F32,
                    bytes,
                );
            }
        }
        if arch == "qwen3" {
            w = w.tensor(&n("attn_q_norm"), &[hd as u64], TensorType::F32, norm(hd));
            w = w.tensor(&n("attn_k_norm"), &[hd as u64], TensorType::F32, norm(hd));
        }
    }
    w.to_bytes()
}

/// `g` with its metadata as it is and every tensor rewritten as its exact dequantized values
/// in F32: a full-precision twin of any model, real or tiny.
pub fn as_f32<S: ByteSource>(g: &Gguf<S>) -> Vec<u8> {
    let mut w = GgufWriter::new();
    for (key, value) in &g.metadata {
        w = w.kv(key, value.clone());
    }
    for t in &g.tensors {
        let bytes = g.tensor_bytes(&t.name).expect("tensor bytes");
        let exact = straddle_engine::quant::dequantize(t.ty, &bytes).expect("dequantize");
        w = w.tensor(
            &t.name,
            &t.shape,
            TensorType::F32,
            encode_as(TensorType::F32, &exact),
        );
    }
    w.to_bytes()
}
