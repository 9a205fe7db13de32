//! RMSNorm as one kernel: `x / sqrt(mean(x²) + ε) · weight`, one cube per row.

use burn::tensor::Tensor;
use cubecl::prelude::*;

use super::{cube_f32, empty_f32, from_cube};

/// Invocations per row: the WebGPU limit per workgroup.
const THREADS: u32 = 256;

#[cube(launch)]
fn rms_norm_rows(x: &[f32], weight: &[f32], out: &mut [f32], dim: usize, eps: f32) {
    let t = UNIT_POS_X as usize;
    let first = CUBE_POS_X as usize * dim;
    let mut squares = 0.0f32;
    let mut i = t;
    while i < dim {
        let v = x[first + i];
        squares += v * v;
        i += 256usize;
    }
    // Literal sizes: a `comptime!` value made mutable below fails shader validation.
    let mut partial = Shared::new_slice(256usize);
    partial[t] = squares;
    sync_cube();
    let mut stride = 128usize;
    while stride > 0 {
        if t < stride {
            let sum = partial[t] + partial[t + stride];
            partial[t] = sum;
        }
        sync_cube();
        stride /= 2;
    }
    let inv_rms = 1.0f32 / f32::sqrt(partial[0] / f32::cast_from(dim) + eps);
    let mut i = t;
    while i < dim {
        out[first + i] = x[first + i] * inv_rms * weight[i];
        i += 256usize;
    }
}

/// RMSNorm of each row of `x [n, d]` scaled by `weight [1, d]`.
pub(crate) fn rms_norm(x: &Tensor<2>, weight: &Tensor<2>, eps: f32) -> Option<Tensor<2>> {
    let [n, dim] = x.dims();
    if weight.dims() != [1, dim] || n == 0 {
        return None;
    }
    let x = cube_f32(x)?;
    let weight = cube_f32(weight)?;
    let (out, handle) = empty_f32(&x, [n, dim]);
    rms_norm_rows::launch(
        &x.client,
        CubeCount::Static(n as u32, 1, 1),
        CubeDim::new_1d(THREADS),
        unsafe { BufferArg::from_raw_parts(x.handle.clone(), n * dim) },
        unsafe { BufferArg::from_raw_parts(weight.handle.clone(), dim) },
        unsafe { BufferArg::from_raw_parts(handle, n * dim) },
        dim,
        eps,
    );
    Some(from_cube(out))
}
