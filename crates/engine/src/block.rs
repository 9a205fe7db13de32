//! The transformer's layers, written once for every [`crate::Arch`] and for both models.
//!
//! A layer is RMSNorm → attention (Q/K/V products, Qwen 2's biases, Qwen 3's and Gemma's
//! per-head norms, RoPE, Gemma's query scale, grouped-query attention over the cache, the
//! output product, Gemma's post-norm) → residual → RMSNorm → gated MLP (SiLU, or Gemma's
//! GELU; Gemma's post-norm) → residual. The families' differences are data: the optional
//! weights a layer has ([`LayerWeights`]) and the [`Config`]. Each model supplies the
//! operations on a pass's rows ([`Ops`]) its own way: quantized products on host rows
//! (`model.rs`), burn tensors on a device (`device_model`).

use crate::config::{Config, ModelError};
use crate::qmatrix::QMatrix;
use crate::weights::LayerWeights;

/// The operations a layer is made of, over every row of one pass. A model's implementation
/// knows the pass: each row's sequence and position, and the caches.
pub(crate) trait Ops {
    /// A weight matrix, `x [n, cols] → [n, rows]`.
    type Matrix;
    /// A norm's weights or a bias.
    type Vector;
    /// Every row of the pass at one width, `[rows, width]`.
    type Rows;

    /// RMSNorm of each row by `weight`.
    fn norm(&mut self, x: &Self::Rows, weight: &Self::Vector) -> Self::Rows;

    /// RMSNorm of each head (`head_dim` values) of each row by `weight`.
    fn head_norm(&mut self, x: Self::Rows, weight: &Self::Vector) -> Self::Rows;

    /// `x`'s products with each of `w`, from one reading of `x`.
    fn products<const N: usize>(&mut self, x: Self::Rows, w: [&Self::Matrix; N])
    -> [Self::Rows; N];

    /// `bias` added to every row.
    fn add_bias(&mut self, x: Self::Rows, bias: &Self::Vector) -> Self::Rows;

    /// Each head of each row rotated by RoPE at the row's position, in layer `li`'s base.
    fn rope(&mut self, x: Self::Rows, li: usize) -> Self::Rows;

    /// Every value multiplied by `by`.
    fn scale(&mut self, x: Self::Rows, by: f32) -> Self::Rows;

    /// Layer `li`'s attention: each row's new key and value into its sequence's cache, then
    /// its query heads against that cache (under the layer's window), scaled by
    /// [`Config::score_scale`].
    fn attend(
        &mut self,
        li: usize,
        q: Self::Rows,
        k: Self::Rows,
        v: Self::Rows,
    ) -> Result<Self::Rows, ModelError>;

    /// `act(gate) · up`, with GELU's tanh approximation where `gelu`, else SiLU.
    fn gate(&mut self, gate: Self::Rows, up: Self::Rows, gelu: bool) -> Self::Rows;

    /// `x + y`.
    fn add(&mut self, x: Self::Rows, y: Self::Rows) -> Self::Rows;

    /// Before the last layer's MLP: the rows the pass outputs, where it computes no others
    /// further.
    fn keep_outputs(&mut self, x: Self::Rows) -> Self::Rows;
}

/// One layer's weights as a model `O` holds them.
pub(crate) type Layer<O> = LayerWeights<<O as Ops>::Matrix, <O as Ops>::Vector>;

/// Every layer over the embedded rows `x`: the final hidden rows, before the output norm.
pub(crate) fn layers<O: Ops>(
    o: &mut O,
    c: &Config,
    layers: &[Layer<O>],
    mut x: O::Rows,
) -> Result<O::Rows, ModelError> {
    let last = layers.len().saturating_sub(1);
    for (li, layer) in layers.iter().enumerate() {
        x = attention(o, c, (li, layer), x)?;
        if li == last {
            x = o.keep_outputs(x);
        }
        x = mlp(o, c, layer, x);
    }
    Ok(x)
}

/// Layer `li`'s attention block, residual included.
fn attention<O: Ops>(
    o: &mut O,
    c: &Config,
    (li, layer): (usize, &Layer<O>),
    x: O::Rows,
) -> Result<O::Rows, ModelError> {
    let h = o.norm(&x, &layer.attn_norm);
    let [mut q, mut k, mut v] = o.products(h, [&layer.wq, &layer.wk, &layer.wv]);
    if let Some([bq, bk, bv]) = &layer.qkv_bias {
        q = o.add_bias(q, bq);
        k = o.add_bias(k, bk);
        v = o.add_bias(v, bv);
    }
    if let Some([nq, nk]) = &layer.qk_norm {
        q = o.head_norm(q, nq);
        k = o.head_norm(k, nk);
    }
    q = o.rope(q, li);
    k = o.rope(k, li);
    if let Some(by) = c.query_scale() {
        q = o.scale(q, by);
    }
    let attended = o.attend(li, q, k, v)?;
    let [y] = o.products(attended, [&layer.wo]);
    let post_norm = layer.post_norms.as_ref().map(|[attention, _]| attention);
    Ok(residual(o, x, y, post_norm))
}

/// The MLP block, residual included.
fn mlp<O: Ops>(o: &mut O, c: &Config, layer: &Layer<O>, x: O::Rows) -> O::Rows {
    let h = o.norm(&x, &layer.ffn_norm);
    let [gate, up] = o.products(h, [&layer.w_gate, &layer.w_up]);
    let gated = o.gate(gate, up, c.arch.gelu_gate());
    let [y] = o.products(gated, [&layer.w_down]);
    let post_norm = layer.post_norms.as_ref().map(|[_, mlp]| mlp);
    residual(o, x, y, post_norm)
}

/// `x + y`, with `y` RMS-normalised by `post_norm` first where the block has one (Gemma).
fn residual<O: Ops>(o: &mut O, x: O::Rows, y: O::Rows, post_norm: Option<&O::Vector>) -> O::Rows {
    let y = match post_norm {
        Some(weight) => o.norm(&y, weight),
        None => y,
    };
    o.add(x, y)
}

/// The embedding of each of `tokens` into `x` (`[n, dim]`), scaled where the architecture
/// scales it: both models embed on the host (a prompt needs a handful of rows of the table).
pub(crate) fn embed(
    table: &QMatrix,
    c: &Config,
    tokens: &[u32],
    x: &mut [f32],
) -> Result<(), ModelError> {
    for (&token, row) in tokens.iter().zip(x.chunks_mut(c.dim)) {
        if token as usize >= c.vocab {
            return Err(ModelError::BadToken(token));
        }
        table.row(token as usize, row);
        if let Some(scale) = c.embedding_scale() {
            row.iter_mut().for_each(|v| *v *= scale);
        }
    }
    Ok(())
}
