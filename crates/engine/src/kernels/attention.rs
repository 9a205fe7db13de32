//! Causal grouped-query attention of a few query rows against the KV cache, as one kernel:
//! scores, softmax and the weighted sum of values, one cube per (query row, head).
//!
//! burn composes the same from a transpose, two matmuls and a softmax whose reduction costs a
//! launch per step, which on a software adapter costs more than the arithmetic.

use burn::tensor::Tensor;
use cubecl::prelude::*;

use super::{cube_f32, empty_f32, from_cube};

/// Invocations per cube: the WebGPU limit per workgroup.
const THREADS: u32 = 256;
/// Longest context the kernel holds scores for in shared memory (8 KiB of the 16 KiB WebGPU
/// guarantees); longer ones fall back to burn.
pub(crate) const MAX_POSITIONS: usize = 2048;

/// `out[i, h] = softmax_j(q[i, h] · k[h / group, j] · scale) · v[h / group, j]` over the cache
/// positions `start + i − window < j ≤ start + i`, position `j` held in slot `j % capacity`
/// (a sliding-window layer's ring; every position lies in its own slot otherwise).
#[allow(clippy::too_many_arguments)]
#[cube(launch)]
fn causal_attention(
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    out: &mut [f32],
    start: usize,
    capacity: usize,
    head_dim: usize,
    group: usize,
    scale: f32,
    window: usize,
) {
    let t = UNIT_POS_X as usize;
    let head = CUBE_POS_X as usize;
    let row = CUBE_POS_Y as usize;
    let heads = CUBE_COUNT_X as usize;
    let upto = start + row + 1;
    let mut first = 0usize;
    if upto > window {
        first = upto - window;
    }
    // Position `first + j` is the row's `j`-th visible one.
    let seen = upto - first;
    let q_at = (row * heads + head) * head_dim;
    let kv_at = (head / group) * capacity * head_dim;

    // Literal sizes: a `comptime!` value made mutable fails shader validation.
    let mut probs = Shared::new_slice(2048usize);
    let mut partial = Shared::new_slice(256usize);

    let mut top = f32::new(-3.0e38);
    let mut j = t;
    while j < seen {
        let k_at = kv_at + ((first + j) % capacity) * head_dim;
        let mut dot = 0.0f32;
        let mut e = 0usize;
        while e < head_dim {
            dot += q[q_at + e] * keys[k_at + e];
            e += 1usize;
        }
        let s = dot * scale;
        probs[j] = s;
        if s > top {
            top = s;
        }
        j += 256usize;
    }
    partial[t] = top;
    sync_cube();
    let mut stride = 128usize;
    while stride > 0 {
        if t < stride {
            let other = partial[t + stride];
            if other > partial[t] {
                partial[t] = other;
            }
        }
        sync_cube();
        stride /= 2;
    }
    let top = partial[0];
    sync_cube();

    let mut sum = 0.0f32;
    let mut j = t;
    while j < seen {
        let p = f32::exp(probs[j] - top);
        probs[j] = p;
        sum += p;
        j += 256usize;
    }
    partial[t] = sum;
    sync_cube();
    let mut stride = 128usize;
    while stride > 0 {
        if t < stride {
            let both = partial[t] + partial[t + stride];
            partial[t] = both;
        }
        sync_cube();
        stride /= 2;
    }
    let total = partial[0];
    sync_cube();

    // 256 / head_dim groups of invocations each take every groups-th position for one element.
    let groups = 256usize / head_dim;
    let e = t % head_dim;
    let g = t / head_dim;
    let mut acc = 0.0f32;
    let mut j = g;
    while j < seen {
        acc += probs[j] * values[kv_at + ((first + j) % capacity) * head_dim + e];
        j += groups;
    }
    partial[t] = acc;
    sync_cube();
    if g == 0 {
        let mut weighted = 0.0f32;
        let mut k = 0usize;
        while k < groups {
            weighted += partial[k * head_dim + e];
            k += 1usize;
        }
        out[q_at + e] = weighted / total;
    }
}

/// Attention of `q [n, heads, hd]` (positions `start..start+n`) against caches
/// `[kv_heads, capacity, hd]` that hold the positions up to `start + n` in slots `p % capacity`,
/// each row seeing the last `window` of them where a window is given; `[n, heads·hd]`.
pub(crate) fn causal_attention_rows(
    q: &Tensor<3>,
    keys: &Tensor<3>,
    values: &Tensor<3>,
    start: usize,
    scale: f32,
    window: Option<usize>,
) -> Option<Tensor<2>> {
    let [n, heads, head_dim] = q.dims();
    let [kv_heads, capacity, kv_dim] = keys.dims();
    if values.dims() != keys.dims()
        || kv_dim != head_dim
        || kv_heads == 0
        || !heads.is_multiple_of(kv_heads)
        || head_dim == 0
        || head_dim > THREADS as usize
        || !(THREADS as usize).is_multiple_of(head_dim)
        || n == 0
    {
        return None;
    }
    let window = window.unwrap_or(start + n).min(start + n);
    // The rows together read from the first row's oldest visible position to the last row.
    let read = (start + n).min(window + n - 1);
    if window == 0 || window > MAX_POSITIONS || read > capacity {
        return None;
    }
    let q = cube_f32(q)?;
    let keys = cube_f32(keys)?;
    let values = cube_f32(values)?;
    let (out, handle) = empty_f32(&q, [n, heads * head_dim]);
    let cache_len = kv_heads * capacity * head_dim;
    causal_attention::launch(
        &q.client,
        CubeCount::Static(heads as u32, n as u32, 1),
        CubeDim::new_1d(THREADS),
        unsafe { BufferArg::from_raw_parts(q.handle.clone(), n * heads * head_dim) },
        unsafe { BufferArg::from_raw_parts(keys.handle.clone(), cache_len) },
        unsafe { BufferArg::from_raw_parts(values.handle.clone(), cache_len) },
        unsafe { BufferArg::from_raw_parts(handle, n * heads * head_dim) },
        start,
        capacity,
        head_dim,
        heads / kv_heads,
        scale,
        window,
    );
    Some(from_cube(out))
}
