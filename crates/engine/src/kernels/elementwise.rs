//! Elementwise steps of the layer fused into one launch each: RoPE and the MLP's gate.

use burn::tensor::Tensor;
use cubecl::prelude::*;

use super::{cube_f32, empty_f32, from_cube};
use crate::model::{GELU_CUBIC, GELU_SQRT_2_OVER_PI};

const THREADS: u32 = 256;

/// Rotates the pair `(x[a], x[a + pair])`, `a = step · i` within each head, by its row's
/// angle `i`: adjacent pairs (step 2, pair 1) or a head's two halves (step 1, pair hd/2).
#[allow(clippy::too_many_arguments)]
#[cube(launch)]
fn rope_rotate(
    x: &[f32],
    cos: &[f32],
    sin: &[f32],
    out: &mut [f32],
    pairs: usize,
    half: usize,
    heads: usize,
    step: usize,
    pair: usize,
) {
    let p = ABSOLUTE_POS;
    if p < pairs {
        let row = p / (heads * half);
        let i = p % half;
        let angle = row * half + i;
        let a = (p / half) * 2 * half + step * i;
        let b = a + pair;
        let c = cos[angle];
        let s = sin[angle];
        let xa = x[a];
        let xb = x[b];
        out[a] = xa * c - xb * s;
        out[b] = xa * s + xb * c;
    }
}

/// `act(gate) · up`, with SiLU, or GELU's tanh form written as `x / (1 + e^(−2u))` (as
/// [`crate::model`] computes it).
#[cube(launch)]
fn gated_values(gate: &[f32], up: &[f32], out: &mut [f32], len: usize, #[comptime] gelu: bool) {
    let i = ABSOLUTE_POS;
    if i < len {
        let g = gate[i];
        let mut z = g;
        if gelu {
            z = 2.0f32 * GELU_SQRT_2_OVER_PI * g * (1.0f32 + GELU_CUBIC * g * g);
        }
        out[i] = g / (1.0f32 + f32::exp(-z)) * up[i];
    }
}

fn cubes(len: usize) -> CubeCount {
    CubeCount::Static((len as u32).div_ceil(THREADS), 1, 1)
}

/// RoPE of `x [n, heads, hd]` with angles `cos`, `sin` laid out `[n, hd/2]`: over adjacent
/// pairs ("normal" mode), or over each head's halves (GPT-NeoX's mode) when `halves`.
pub(crate) fn rope(
    x: &Tensor<3>,
    cos: &Tensor<2>,
    sin: &Tensor<2>,
    halves: bool,
) -> Option<Tensor<3>> {
    let [n, heads, hd] = x.dims();
    let half = hd / 2;
    if hd % 2 != 0 || cos.shape().num_elements() != n * half || sin.shape() != cos.shape() {
        return None;
    }
    let x = cube_f32(x)?;
    let cos = cube_f32(cos)?;
    let sin = cube_f32(sin)?;
    let (out, handle) = empty_f32(&x, [n, heads, hd]);
    let pairs = n * heads * half;
    let (step, pair) = if halves { (1, half) } else { (2, 1) };
    rope_rotate::launch(
        &x.client,
        cubes(pairs),
        CubeDim::new_1d(THREADS),
        unsafe { BufferArg::from_raw_parts(x.handle.clone(), 2 * pairs) },
        unsafe { BufferArg::from_raw_parts(cos.handle.clone(), n * half) },
        unsafe { BufferArg::from_raw_parts(sin.handle.clone(), n * half) },
        unsafe { BufferArg::from_raw_parts(handle, 2 * pairs) },
        pairs,
        half,
        heads,
        step,
        pair,
    );
    Some(from_cube(out))
}

/// `act(gate) · up` for two tensors of one shape: GELU (tanh form) when `gelu`, else SiLU.
pub(crate) fn gated(gate: &Tensor<2>, up: &Tensor<2>, gelu: bool) -> Option<Tensor<2>> {
    if gate.dims() != up.dims() {
        return None;
    }
    let dims = gate.dims();
    let len = dims[0] * dims[1];
    let gate = cube_f32(gate)?;
    let up = cube_f32(up)?;
    let (out, handle) = empty_f32(&gate, dims);
    gated_values::launch(
        &gate.client,
        cubes(len),
        CubeDim::new_1d(THREADS),
        unsafe { BufferArg::from_raw_parts(gate.handle.clone(), len) },
        unsafe { BufferArg::from_raw_parts(up.handle.clone(), len) },
        unsafe { BufferArg::from_raw_parts(handle, len) },
        len,
        gelu,
    );
    Some(from_cube(out))
}
