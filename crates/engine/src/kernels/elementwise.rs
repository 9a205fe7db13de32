//! Elementwise steps of the layer fused into one launch each: RoPE and the SwiGLU gate.

use burn::tensor::Tensor;
use cubecl::prelude::*;

use super::{cube_f32, empty_f32, from_cube};

const THREADS: u32 = 256;

/// Rotates each adjacent pair `(x[2i], x[2i+1])` of every head by its row's angle `i`.
#[cube(launch)]
fn rope_pairs(
    x: &[f32],
    cos: &[f32],
    sin: &[f32],
    out: &mut [f32],
    pairs: usize,
    half: usize,
    heads: usize,
) {
    let p = ABSOLUTE_POS;
    if p < pairs {
        let row = p / (heads * half);
        let angle = row * half + p % half;
        let c = cos[angle];
        let s = sin[angle];
        let even = x[2 * p];
        let odd = x[2 * p + 1];
        out[2 * p] = even * c - odd * s;
        out[2 * p + 1] = even * s + odd * c;
    }
}

/// `silu(gate) · up`.
#[cube(launch)]
fn swiglu_values(gate: &[f32], up: &[f32], out: &mut [f32], len: usize) {
    let i = ABSOLUTE_POS;
    if i < len {
        let g = gate[i];
        out[i] = g / (1.0f32 + f32::exp(-g)) * up[i];
    }
}

fn cubes(len: usize) -> CubeCount {
    CubeCount::Static((len as u32).div_ceil(THREADS), 1, 1)
}

/// RoPE ("normal" mode, adjacent pairs) of `x [n, heads, hd]` with angles `cos`, `sin` laid out
/// `[n, hd/2]` (any shape of that many values).
pub(crate) fn rope<const D: usize>(
    x: &Tensor<3>,
    cos: &Tensor<D>,
    sin: &Tensor<D>,
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
    rope_pairs::launch(
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
    );
    Some(from_cube(out))
}

/// `silu(gate) · up` for two tensors of one shape.
pub(crate) fn swiglu(gate: &Tensor<2>, up: &Tensor<2>) -> Option<Tensor<2>> {
    if gate.dims() != up.dims() {
        return None;
    }
    let dims = gate.dims();
    let len = dims[0] * dims[1];
    let gate = cube_f32(gate)?;
    let up = cube_f32(up)?;
    let (out, handle) = empty_f32(&gate, dims);
    swiglu_values::launch(
        &gate.client,
        cubes(len),
        CubeDim::new_1d(THREADS),
        unsafe { BufferArg::from_raw_parts(gate.handle.clone(), len) },
        unsafe { BufferArg::from_raw_parts(up.handle.clone(), len) },
        unsafe { BufferArg::from_raw_parts(handle, len) },
        len,
    );
    Some(from_cube(out))
}
