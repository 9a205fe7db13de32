//! Which tensors each architecture's layers read, under which names and shapes: written once
//! for both models, each of which holds what it reads its own way ([`WeightStore`]: quantized
//! blocks in host memory for the CPU model, tensors on a burn device for the device model).

use crate::config::{Config, ModelError};
use crate::gguf::{ByteSource, Gguf, GgufError, TensorInfo};
use crate::quant::{self, TensorType};

/// How a model holds the weights it loads.
pub(crate) trait WeightStore {
    /// A weight matrix, `x [n, cols] → [n, rows]`.
    type Matrix;
    /// A norm's weights or a bias.
    type Vector;

    /// GGUF blocks of type `ty` holding a `[rows, cols]` matrix, row after row.
    fn matrix(
        &self,
        ty: TensorType,
        bytes: &[u8],
        rows: usize,
        cols: usize,
    ) -> Result<Self::Matrix, ModelError>;

    /// A vector's values.
    fn vector(&self, values: Vec<f32>) -> Self::Vector;
}

/// One layer's weights: matrices `M` and vectors `V`.
pub(crate) struct LayerWeights<M, V> {
    pub attn_norm: V,
    pub wq: M,
    pub wk: M,
    pub wv: M,
    pub wo: M,
    pub ffn_norm: V,
    pub w_gate: M,
    pub w_up: M,
    pub w_down: M,
    /// RMSNorm weights of each query and key head (Qwen 3, Gemma 3).
    pub qk_norm: Option<[V; 2]>,
    /// RMSNorm weights of the attention and MLP outputs (Gemma 3).
    pub post_norms: Option<[V; 2]>,
    /// Biases of the Q, K and V products (Qwen 2).
    pub qkv_bias: Option<[V; 3]>,
}

impl<M, V> LayerWeights<M, V> {
    /// The seven products, attention's first.
    pub fn matrices(&self) -> [&M; 7] {
        [
            &self.wq,
            &self.wk,
            &self.wv,
            &self.wo,
            &self.w_gate,
            &self.w_up,
            &self.w_down,
        ]
    }

    /// Every vector: norms, then biases.
    pub fn vectors(&self) -> impl Iterator<Item = &V> {
        [&self.attn_norm, &self.ffn_norm]
            .into_iter()
            .chain(self.qk_norm.iter().flatten())
            .chain(self.post_norms.iter().flatten())
            .chain(self.qkv_bias.iter().flatten())
    }
}

fn info<'g, S: ByteSource>(g: &'g Gguf<S>, name: &str) -> Result<&'g TensorInfo, ModelError> {
    g.tensor(name)
        .ok_or_else(|| GgufError::MissingTensor(name.into()).into())
}

fn check_shape(t: &TensorInfo, want: &[u64]) -> Result<(), ModelError> {
    if t.shape != want {
        return Err(ModelError::Shape {
            name: t.name.clone(),
            got: t.shape.clone(),
            want: want.to_vec(),
        });
    }
    Ok(())
}

/// The matrix `name`, `[rows, cols]`.
pub(crate) fn matrix<S: ByteSource, W: WeightStore>(
    store: &W,
    g: &Gguf<S>,
    name: &str,
    rows: usize,
    cols: usize,
) -> Result<W::Matrix, ModelError> {
    let t = info(g, name)?;
    // GGUF lists the input (column) dimension first.
    check_shape(t, &[cols as u64, rows as u64])?;
    store.matrix(t.ty, &g.tensor_bytes(name)?, rows, cols)
}

/// A tensor of stacked matrices (rows `rows[0]`, then `rows[1]`, …, all `cols` wide), split
/// into one matrix each: each row's blocks are contiguous, so the split is by bytes.
fn fused<S: ByteSource, W: WeightStore, const N: usize>(
    store: &W,
    g: &Gguf<S>,
    name: &str,
    rows: [usize; N],
    cols: usize,
) -> Result<[W::Matrix; N], ModelError> {
    let t = info(g, name)?;
    check_shape(t, &[cols as u64, rows.iter().sum::<usize>() as u64])?;
    if !(cols as u64).is_multiple_of(t.ty.block_elements()) {
        return Err(ModelError::Config(format!(
            "rows of `{name}` are not whole {:?} blocks",
            t.ty
        )));
    }
    let row_bytes = cols as u64 / t.ty.block_elements() * t.ty.block_bytes();
    let bytes = g.tensor_bytes(name)?;
    let mut start = 0;
    let mut parts = Vec::with_capacity(N);
    for n in rows {
        let end = start + n * row_bytes as usize;
        parts.push(store.matrix(t.ty, &bytes[start..end], n, cols)?);
        start = end;
    }
    Ok(parts
        .try_into()
        .unwrap_or_else(|_| unreachable!("one matrix per part")))
}

/// The vector `name` of `len` values, dequantized.
pub(crate) fn vector<S: ByteSource, W: WeightStore>(
    store: &W,
    g: &Gguf<S>,
    name: &str,
    len: usize,
) -> Result<W::Vector, ModelError> {
    let t = info(g, name)?;
    check_shape(t, &[len as u64])?;
    Ok(store.vector(quant::dequantize(t.ty, &g.tensor_bytes(name)?)?))
}

/// Layer `i`'s weights, each checked against the shape the config implies.
pub(crate) fn load_layer<S: ByteSource, W: WeightStore>(
    store: &W,
    g: &Gguf<S>,
    c: &Config,
    i: usize,
) -> Result<LayerWeights<W::Matrix, W::Vector>, ModelError> {
    let (d, q, kv, f) = (c.dim, c.q_dim(), c.kv_dim(), c.ffn_dim);
    let n = |s: &str| format!("blk.{i}.{s}.weight");
    let vector = |name: &str, len| vector(store, g, name, len);
    let matrix = |name: &str, rows, cols| matrix(store, g, name, rows, cols);
    let arch = c.arch;
    let qk_norm = match arch.qk_norm() {
        true => Some([
            vector(&n("attn_q_norm"), c.head_dim)?,
            vector(&n("attn_k_norm"), c.head_dim)?,
        ]),
        false => None,
    };
    let post_norms = match arch.post_norms() {
        true => Some([
            vector(&n("post_attention_norm"), d)?,
            vector(&n("post_ffw_norm"), d)?,
        ]),
        false => None,
    };
    let bias = |s: &str, len| vector(&format!("blk.{i}.{s}.bias"), len);
    let qkv_bias = match arch.qkv_bias() {
        true => Some([bias("attn_q", q)?, bias("attn_k", kv)?, bias("attn_v", kv)?]),
        false => None,
    };
    let ([wq, wk, wv], [w_gate, w_up]) = match arch.fused() {
        true => (
            fused(store, g, &n("attn_qkv"), [q, kv, kv], d)?,
            fused(store, g, &n("ffn_up"), [f, f], d)?,
        ),
        false => (
            [
                matrix(&n("attn_q"), q, d)?,
                matrix(&n("attn_k"), kv, d)?,
                matrix(&n("attn_v"), kv, d)?,
            ],
            [matrix(&n("ffn_gate"), f, d)?, matrix(&n("ffn_up"), f, d)?],
        ),
    };
    Ok(LayerWeights {
        attn_norm: vector(&n("attn_norm"), d)?,
        wq,
        wk,
        wv,
        wo: matrix(&n("attn_output"), d, q)?,
        ffn_norm: vector(&n("ffn_norm"), d)?,
        w_gate,
        w_up,
        w_down: matrix(&n("ffn_down"), d, f)?,
        qk_norm,
        post_norms,
        qkv_bias,
    })
}
