//! A dequantize-in-the-loop product for a few rows of activations times a block-quantized
//! weight matrix, as one cubecl kernel on the device's own weights.
//!
//! burn 0.22 runs a quantized matmul as its general tiled GEMM, which pads a one-row decode
//! product to a whole tile; for decoding that is most of the work thrown away. These kernels
//! read burn's packed values and block scales where burn put them (no second copy of the
//! weights), unpack a word of weights at a time, multiply it against eight (Q4) or four (Q8)
//! activations and accumulate per block; Q4_1's per-block offsets multiply the block sums of
//! `x` in the same pass. Two ways to share out a row, see [`MatvecKernel`].
//!
//! Only cubecl devices (WebGPU, Vulkan) run them; on others [`quantized_matvec`] answers `None`
//! and the caller keeps burn's product.

use burn::backend::BackendTensor;
use burn::tensor::quantization::QuantValue;
use burn::tensor::{DType, Tensor};
use cubecl::prelude::*;

use super::{cube_f32, cube_primitive, empty_f32, from_cube};

/// How an output row's work is shared out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MatvecKernel {
    /// 32 invocations per row, each reading every 32nd word, so neighbours read neighbouring
    /// words (coalesced loads on a GPU); a tree in shared memory sums their partial sums.
    #[default]
    Cooperative,
    /// One invocation per row, no shared memory and no barrier: for software adapters
    /// (lavapipe, SwiftShader), which run a workgroup barrier as a context switch of every
    /// invocation, so the cooperative kernel decodes slower there.
    PerRow,
}

/// Invocations that cooperate on one output row (a power of two for the reduction tree).
const LANES: u32 = 32;
/// Output rows one cube computes: 8 × 32 = 256 invocations, the WebGPU limit per workgroup.
const ROWS_PER_CUBE: u32 = 8;
// The kernel's shared array (256) and first reduction stride (16) are written out.
const _: () = assert!(LANES == 32 && LANES * ROWS_PER_CUBE == 256);
/// Invocations per cube of [`MatvecKernel::PerRow`].
const PER_ROW_CUBE: u32 = 64;

/// This invocation's share of `Σ_b scale[r, b] · Σ_j q[r, Bb + j] · x[t, Bb + j]
/// (+ bias[r, b] · Σ_j x[t, Bb + j])` for blocks of `B = block` values: the words `first_word,
/// first_word + step, …` of row `row`.
///
/// `words` packs `32 / bits` signed values per `u32`, lowest bits first, rows of `in_dim / (32 /
/// bits)` words; `scales` and `bias` hold one value per row and block.
#[allow(clippy::too_many_arguments)]
#[cube]
fn row_share(
    x: &[f32],
    words: &[u32],
    scales: &[f32],
    bias: &[f32],
    token: usize,
    row: usize,
    first_word: usize,
    step: usize,
    in_dim: usize,
    #[comptime] bits: u32,
    #[comptime] block: u32,
    #[comptime] with_bias: bool,
) -> f32 {
    let per_word = comptime!(32 / bits);
    let words_per_block = comptime!(block / (32 / bits));
    let mask = comptime!((1u32 << bits) - 1);
    let sign = comptime!(1u32 << (bits - 1));
    let offset = comptime!((1u32 << (bits - 1)) as f32);
    let words_per_row = in_dim / per_word as usize;
    let blocks_per_row = in_dim / block as usize;
    let mut acc = 0.0f32;
    let mut w = first_word;
    while w < words_per_row {
        let word = words[row * words_per_row + w];
        let first = token * in_dim + w * per_word as usize;
        let mut qsum = 0.0f32;
        let mut xsum = 0.0f32;
        #[unroll]
        for i in 0..per_word {
            // Two's complement of `bits` bits: flipping the sign bit and subtracting
            // 2^(bits−1) gives the signed value.
            let q = f32::cast_from(((word >> (i * bits)) & mask) ^ sign) - offset;
            let xi = x[first + i as usize];
            qsum += q * xi;
            xsum += xi;
        }
        let block = row * blocks_per_row + w / words_per_block as usize;
        acc += scales[block] * qsum;
        if with_bias {
            acc += bias[block] * xsum;
        }
        w += step;
    }
    acc
}

/// [`MatvecKernel::Cooperative`]: `out[t, r]` for `t` = the cube's y position and `r` = one of
/// this cube's rows.
#[allow(clippy::too_many_arguments)]
#[cube(launch)]
fn cooperative_matvec(
    x: &[f32],
    words: &[u32],
    scales: &[f32],
    bias: &[f32],
    out: &mut [f32],
    in_dim: usize,
    out_dim: usize,
    #[comptime] bits: u32,
    #[comptime] block: u32,
    #[comptime] with_bias: bool,
) {
    let lane = UNIT_POS_X as usize;
    let row = (CUBE_POS_X * CUBE_DIM_Y + UNIT_POS_Y) as usize;
    let token = CUBE_POS_Y as usize;
    let mut acc = 0.0f32;
    if row < out_dim {
        acc = row_share(
            x, words, scales, bias, token, row, lane, 32usize, in_dim, bits, block, with_bias,
        );
    }

    // Literal sizes: a `comptime!` value made mutable below fails shader validation.
    let mut partial = Shared::new_slice(256usize);
    let slot = (UNIT_POS_Y * LANES) as usize + lane;
    partial[slot] = acc;
    sync_cube();
    let mut stride = 16usize;
    while stride > 0 {
        if lane < stride {
            let sum = partial[slot] + partial[slot + stride];
            partial[slot] = sum;
        }
        sync_cube();
        stride /= 2;
    }
    if lane == 0 && row < out_dim {
        let total = partial[slot];
        out[token * out_dim + row] = total;
    }
}

/// [`MatvecKernel::PerRow`]: `out[t, r]` for `t` = the cube's y position and `r` = this
/// invocation's row.
#[allow(clippy::too_many_arguments)]
#[cube(launch)]
fn per_row_matvec(
    x: &[f32],
    words: &[u32],
    scales: &[f32],
    bias: &[f32],
    out: &mut [f32],
    in_dim: usize,
    out_dim: usize,
    #[comptime] bits: u32,
    #[comptime] block: u32,
    #[comptime] with_bias: bool,
) {
    let row = ABSOLUTE_POS_X as usize;
    let token = CUBE_POS_Y as usize;
    if row < out_dim {
        out[token * out_dim + row] = row_share(
            x, words, scales, bias, token, row, 0usize, 1usize, in_dim, bits, block, with_bias,
        );
    }
}

/// `x [n, in] · weightᵀ (+ blocksum32(x) · biasᵀ)` for a weight held as burn's Q4F or Q8F
/// blocks along `in` (`PackedU32`, f32 scales; Q4F in blocks of 32, Q8F in blocks of 32 or 16)
/// and the offsets of Q4_1, Q5_1 and the K-quants with minimums, `bias [out, in/32]`.
///
/// `None` when the tensors do not live on a cubecl device or are not laid out as this kernel
/// reads them; the caller then runs burn's own product.
pub(crate) fn quantized_matvec(
    x: &Tensor<2>,
    weight: &Tensor<2>,
    bias: Option<&Tensor<2>>,
    kernel: MatvecKernel,
) -> Option<Tensor<2>> {
    let [n, in_dim] = x.dims();
    let [out_dim, w_in] = weight.dims();
    if w_in != in_dim || !in_dim.is_multiple_of(32) || n == 0 {
        return None;
    }
    let DType::QFloat(scheme) = weight.dtype() else {
        return None;
    };
    let block = scheme.block_size()?.num_elements();
    let bits = match (scheme.value, block) {
        (QuantValue::Q4F, 32) => 4,
        (QuantValue::Q8F, 32) => 8,
        (QuantValue::Q8F, 16) if bias.is_none() => 8,
        _ => return None,
    };
    if !in_dim.is_multiple_of(block) {
        return None;
    }
    let BackendTensor::Quantized(w) = cube_primitive(weight.clone())? else {
        return None;
    };
    let x = cube_f32(x)?;
    let bias = match bias {
        Some(b) => Some(cube_f32(b)?),
        None => None,
    };
    if w.meta.is_tiled() {
        return None;
    }
    let (words, scales) = w.quantized_handles()?;
    if scales.dtype != DType::F32 {
        return None;
    }
    let blocks = out_dim * in_dim / block;
    let client = x.client.clone();
    let (out, output) = empty_f32(&x, [n, out_dim]);
    // An unused one-element stand-in keeps the kernel's signature fixed without a bias.
    let bias_arg = match &bias {
        Some(b) => unsafe { BufferArg::from_raw_parts(b.handle.clone(), blocks) },
        None => unsafe { BufferArg::from_raw_parts(scales.handle.clone(), 1) },
    };
    let x_arg = unsafe { BufferArg::from_raw_parts(x.handle.clone(), n * in_dim) };
    let words_arg = unsafe {
        BufferArg::from_raw_parts(words.handle.clone(), out_dim * in_dim * bits as usize / 32)
    };
    let scales_arg = unsafe { BufferArg::from_raw_parts(scales.handle.clone(), blocks) };
    let out_arg = unsafe { BufferArg::from_raw_parts(output, n * out_dim) };
    match kernel {
        MatvecKernel::Cooperative => cooperative_matvec::launch(
            &client,
            CubeCount::Static((out_dim as u32).div_ceil(ROWS_PER_CUBE), n as u32, 1),
            CubeDim::new_2d(LANES, ROWS_PER_CUBE),
            x_arg,
            words_arg,
            scales_arg,
            bias_arg,
            out_arg,
            in_dim,
            out_dim,
            bits,
            block as u32,
            bias.is_some(),
        ),
        MatvecKernel::PerRow => per_row_matvec::launch(
            &client,
            CubeCount::Static((out_dim as u32).div_ceil(PER_ROW_CUBE), n as u32, 1),
            CubeDim::new_1d(PER_ROW_CUBE),
            x_arg,
            words_arg,
            scales_arg,
            bias_arg,
            out_arg,
            in_dim,
            out_dim,
            bits,
            block as u32,
            bias.is_some(),
        ),
    }
    Some(from_cube(out))
}
