//! wasm SIMD128 kernels for the formats of the default model and Gemma 3's: what every browser we target
//! runs (the page's CPU path, and the engine on a software WebGPU adapter). LLVM does not
//! turn the portable loops' i8 widening products into `i32x4.dot_i16x8`; these do.

use core::arch::wasm32::*;

use super::{
    BLOCK, FormatKernels, KernelTable, PORTABLE_FORMAT, QActs, QK_K, QMatrix, RowBlocks,
    f16_to_f32,
    super_blocks::{self, IntSums, Q4KRow, Q6KRow},
};

/// This family's kernel for each format (the portable loop for Q4_0).
pub(super) const TABLE: KernelTable = KernelTable {
    q4_1: SIMD,
    q4_0: PORTABLE_FORMAT,
    q8_0: SIMD,
    q5_0: SIMD,
    q5_1: SIMD,
    q4k: SIMD,
    q6k: SIMD,
    f32: PORTABLE_FORMAT,
};

/// One row at a time with the format's kernel.
const SIMD: FormatKernels = FormatKernels {
    dot: row_dot,
    rows: None,
};

/// Row `r` · `x` with the format's SIMD128 kernel.
fn row_dot(w: &QMatrix, r: usize, x: &QActs) -> f32 {
    match w.row_blocks(r) {
        RowBlocks::Q4_1 { d, m, qs } => dot_q4_1(d, m, qs, x),
        RowBlocks::Q8_0 { d, qs } => dot_q8_0(d, qs, x),
        RowBlocks::Q5_0 { d, qh, qs } => dot_q5_0(d, qh, qs, x),
        RowBlocks::Q5_1 { d, m, qs } => dot_q5_1(d, m, qs, x),
        blocks @ (RowBlocks::Q4K { .. } | RowBlocks::Q6K { .. }) => {
            // SAFETY: wasm SIMD runs wherever this module does.
            unsafe { super_blocks::dot::<Simd128>(blocks, x) }
        }
        RowBlocks::Q4_0 { .. } | RowBlocks::Other => w.dot_row_portable(r, x),
    }
}

/// The K-quants' integer sums on wasm SIMD (`super_blocks` takes the float steps).
struct Simd128;

impl IntSums for Simd128 {
    unsafe fn q4k(row: &Q4KRow<'_>, s: usize, x: &QActs) -> ([i32; 4], [i32; 4]) {
        let (mut scaled, mut mins) = ([0; 4], [0; 4]);
        let mask = u8x16_splat(0x0F);
        for j in 0..8 {
            let b = s * 8 + j;
            assert!((b + 1) * 16 <= row.qs.len() && (b + 1) * BLOCK <= x.qs.len());
            // SAFETY: the assert above puts block b inside both; no alignment needed.
            let (raw, x0, x1) = unsafe {
                (
                    v128_load(row.qs.as_ptr().add(b * 16) as *const v128),
                    v128_load(x.qs.as_ptr().add(b * BLOCK) as *const v128),
                    v128_load(x.qs.as_ptr().add(b * BLOCK + 16) as *const v128),
                )
            };
            // Nibbles are below 16, so they read as signed bytes too.
            let sums = i32x4_add(dot16(v128_and(raw, mask), x0), dot16(u8x16_shr(raw, 4), x1));
            scaled[j / 2] += i32::from(row.sc[b]) * hsum_i32(sums);
            mins[j / 2] += i32::from(row.m[b]) * (x.bsums[2 * b] + x.bsums[2 * b + 1]);
        }
        (scaled, mins)
    }

    unsafe fn q6k(row: &Q6KRow<'_>, s: usize, x: &QActs) -> [i32; 8] {
        let start = s * QK_K;
        assert!(start + QK_K <= row.qs.len() && start + QK_K <= x.qs.len());
        let sc = &row.sc[s * 16..s * 16 + 16];
        // Lanes 0–3 from each run's first sixteen values, 4–7 from its second.
        let mut lanes = [i32x4_splat(0); 2];
        for c in 0..8 {
            for (h, lanes) in lanes.iter_mut().enumerate() {
                let at = start + 32 * c + 16 * h;
                // SAFETY: the assert above puts the sixteen values inside both; values
                // below 64 read as signed bytes too.
                let (q, a) = unsafe {
                    (
                        v128_load(row.qs.as_ptr().add(at) as *const v128),
                        v128_load(x.qs.as_ptr().add(at) as *const v128),
                    )
                };
                let lo = i32x4_dot_i16x8(i16x8_extend_low_i8x16(q), i16x8_extend_low_i8x16(a));
                let hi = i32x4_dot_i16x8(i16x8_extend_high_i8x16(q), i16x8_extend_high_i8x16(a));
                let fours = i32x4_add(
                    i32x4_shuffle::<0, 2, 4, 6>(lo, hi),
                    i32x4_shuffle::<1, 3, 5, 7>(lo, hi),
                );
                let scale = i32x4_splat(i32::from(sc[2 * c + h]));
                *lanes = i32x4_add(*lanes, i32x4_mul(fours, scale));
            }
        }
        let bsums = &x.bsums[s * 16..s * 16 + 16];
        std::array::from_fn(|l| {
            let lane = match l % 4 {
                0 => i32x4_extract_lane::<0>(lanes[l / 4]),
                1 => i32x4_extract_lane::<1>(lanes[l / 4]),
                2 => i32x4_extract_lane::<2>(lanes[l / 4]),
                _ => i32x4_extract_lane::<3>(lanes[l / 4]),
            };
            let offsets =
                i32::from(sc[2 * l]) * bsums[2 * l] + i32::from(sc[2 * l + 1]) * bsums[2 * l + 1];
            lane - 32 * offsets
        })
    }
}

/// The sum of four i32 lanes.
#[inline(always)]
fn hsum_i32(v: v128) -> i32 {
    i32x4_extract_lane::<0>(v)
        + i32x4_extract_lane::<1>(v)
        + i32x4_extract_lane::<2>(v)
        + i32x4_extract_lane::<3>(v)
}

#[inline(always)]
fn hsum(v: v128) -> f32 {
    f32x4_extract_lane::<0>(v)
        + f32x4_extract_lane::<1>(v)
        + f32x4_extract_lane::<2>(v)
        + f32x4_extract_lane::<3>(v)
}

/// Partial sums (four lanes) of Σ a·b over 16 signed bytes each.
#[inline(always)]
fn dot16(a: v128, b: v128) -> v128 {
    let lo = i32x4_dot_i16x8(i16x8_extend_low_i8x16(a), i16x8_extend_low_i8x16(b));
    let hi = i32x4_dot_i16x8(i16x8_extend_high_i8x16(a), i16x8_extend_high_i8x16(b));
    i32x4_add(lo, hi)
}

/// Σ over blocks of d·dx·Σ(q·qx) + m·sum_x, for one Q4_1 row.
pub fn dot_q4_1(d: &[f32], m: &[f32], qs: &[u8], x: &QActs) -> f32 {
    assert!(qs.len() == d.len() * 16);
    let mask = u8x16_splat(0x0F);
    dot_with_min(d, m, x, |b| {
        // SAFETY: the assert above puts block b inside `qs` (16 bytes a block); v128_load
        // has no alignment requirement.
        let raw = unsafe { v128_load(qs.as_ptr().add(b * 16) as *const v128) };
        // Low nibbles are elements 0..16, high nibbles 16..32; both fit in i8.
        (v128_and(raw, mask), u8x16_shr(raw, 4))
    })
}

/// Σ over blocks of d·dx·Σ(q·qx) + m·sum_x, for one widened Q5_1 row (a byte a value).
pub fn dot_q5_1(d: &[f32], m: &[f32], qs: &[u8], x: &QActs) -> f32 {
    assert!(qs.len() == d.len() * BLOCK);
    dot_with_min(d, m, x, |b| {
        // SAFETY: the assert above puts block b inside `qs` (32 bytes a block).
        unsafe {
            (
                v128_load(qs.as_ptr().add(b * BLOCK) as *const v128),
                v128_load(qs.as_ptr().add(b * BLOCK + 16) as *const v128),
            )
        }
    })
}

/// Σ over blocks of d·dx·Σ(q·qx) + m·sum_x, with `values(b)` block `b`'s 32 values (below
/// 128) as two halves.
#[inline(always)]
fn dot_with_min(d: &[f32], m: &[f32], x: &QActs, values: impl Fn(usize) -> (v128, v128)) -> f32 {
    let nb = d.len();
    assert!(m.len() == nb && x.qs.len() >= nb * BLOCK);
    let mut acc = f32x4_splat(0.0);
    let mut mins = 0f32;
    for b in 0..nb {
        let (w0, w1) = values(b);
        // SAFETY: the assert above puts block b inside `x.qs` (32 bytes a block).
        let (x0, x1) = unsafe {
            (
                v128_load(x.qs.as_ptr().add(b * BLOCK) as *const v128),
                v128_load(x.qs.as_ptr().add(b * BLOCK + 16) as *const v128),
            )
        };
        let s = i32x4_add(dot16(w0, x0), dot16(w1, x1));
        acc = f32x4_add(
            acc,
            f32x4_mul(f32x4_convert_i32x4(s), f32x4_splat(d[b] * x.d[b])),
        );
        mins += m[b] * x.sum[b];
    }
    hsum(acc) + mins
}

/// Σ over blocks of d·dx·Σ(q·qx), for one Q8_0 row.
pub fn dot_q8_0(d: &[u16], qs: &[i8], x: &QActs) -> f32 {
    let nb = d.len();
    assert!(qs.len() == nb * BLOCK);
    dot_signed(d, x, |b| {
        // SAFETY: the assert above puts block b inside `qs` (32 bytes a block).
        unsafe {
            (
                v128_load(qs.as_ptr().add(b * BLOCK) as *const v128),
                v128_load(qs.as_ptr().add(b * BLOCK + 16) as *const v128),
            )
        }
    })
}

/// Σ over blocks of d·dx·Σ((q − 16)·qx), for one Q5_0 row: each block widened to Q8_0's
/// signed bytes.
pub fn dot_q5_0(d: &[u16], qh: &[u32], qs: &[u8], x: &QActs) -> f32 {
    let nb = d.len();
    assert!(qh.len() == nb && qs.len() == nb * 16);
    let mask = u8x16_splat(0x0F);
    // Byte j of a half tests bit j % 8 of the high bits' byte j / 8.
    let bit = u8x16(1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128);
    let top = u8x16_splat(0xF0);
    dot_signed(d, x, |b| {
        // SAFETY: the assert above puts block b inside `qs` (16 bytes a block).
        let raw = unsafe { v128_load(qs.as_ptr().add(b * 16) as *const v128) };
        let bits = u32x4_splat(qh[b]);
        let high = |bytes: v128| {
            let spread = i8x16_swizzle(bits, bytes);
            i8x16_eq(v128_and(spread, bit), bit)
        };
        let low_half = high(u8x16(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1));
        let high_half = high(u8x16(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
        // q − 16: the nibble where the high bit is set, the nibble − 16 where not.
        (
            v128_or(v128_and(raw, mask), v128_andnot(top, low_half)),
            v128_or(u8x16_shr(raw, 4), v128_andnot(top, high_half)),
        )
    })
}

/// Σ over blocks of d·dx·Σ(q·qx) for a row whose block `b` is `bytes(b)`: two halves of 16
/// signed bytes.
#[inline(always)]
fn dot_signed(d: &[u16], x: &QActs, bytes: impl Fn(usize) -> (v128, v128)) -> f32 {
    assert!(x.qs.len() >= d.len() * BLOCK && x.d.len() >= d.len());
    let mut acc = f32x4_splat(0.0);
    for (b, &db) in d.iter().enumerate() {
        let (w0, w1) = bytes(b);
        // SAFETY: the assert above puts block b inside `x.qs` (32 bytes a block).
        let (x0, x1) = unsafe {
            (
                v128_load(x.qs.as_ptr().add(b * BLOCK) as *const v128),
                v128_load(x.qs.as_ptr().add(b * BLOCK + 16) as *const v128),
            )
        };
        let s = i32x4_add(dot16(w0, x0), dot16(w1, x1));
        acc = f32x4_add(
            acc,
            f32x4_mul(f32x4_convert_i32x4(s), f32x4_splat(f16_to_f32(db) * x.d[b])),
        );
    }
    hsum(acc)
}
