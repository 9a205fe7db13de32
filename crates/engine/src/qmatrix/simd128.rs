//! wasm SIMD128 kernels for the formats of the default model and Gemma 3's: what every browser we target
//! runs (the page's CPU path, and the engine on a software WebGPU adapter). LLVM does not
//! turn the portable loops' i8 widening products into `i32x4.dot_i16x8`; these do.

use core::arch::wasm32::*;

use super::{
    BLOCK, FormatKernels, KernelTable, PORTABLE_FORMAT, QActs, QK_K, QMatrix, RowBlocks,
    f16_to_f32,
    super_blocks::{self, IntSums, Q4KRow, Q6KRow, WOVEN, WOVEN_BYTES},
};

/// This family's kernel for each format (the portable loop for Q4_0).
pub(super) const TABLE: KernelTable = KernelTable {
    q4_1: IN_PAIRS,
    q4_0: PORTABLE_FORMAT,
    q8_0: IN_PAIRS,
    q5_0: IN_PAIRS,
    q5_1: IN_PAIRS,
    q4k: ONE_ROW,
    q6k: ONE_ROW,
    f32: PORTABLE_FORMAT,
};

/// A format of 32-value blocks: two rows at a time.
const IN_PAIRS: FormatKernels = FormatKernels {
    dot: row_dot,
    rows: Some(rows_in_pairs),
};

/// A K-quant: one row at a time.
const ONE_ROW: FormatKernels = FormatKernels {
    dot: row_dot,
    rows: None,
};

/// Row `r` · `x` with the format's SIMD128 kernel.
fn row_dot(w: &QMatrix, r: usize, x: &QActs) -> f32 {
    match w.row_blocks(r) {
        blocks @ (RowBlocks::Q4K { .. } | RowBlocks::Q6K { .. }) => {
            // SAFETY: wasm SIMD runs wherever this module does.
            unsafe { super_blocks::dot::<Simd128>(blocks, x) }
        }
        RowBlocks::Q4_0 { .. } | RowBlocks::Other => w.dot_row_portable(r, x),
        blocks => {
            let [value] = block_rows::<1>(blocks, x);
            value
        }
    }
}

/// Rows `first..first + count` of a format of 32-value blocks × every token of `xs` into
/// `out[k * xs.len() + t]`, a pair of rows against each token in turn: the token's loads and
/// widening serve both rows.
fn rows_in_pairs(w: &QMatrix, first: usize, count: usize, xs: &[QActs], out: &mut [f32]) {
    let n = xs.len();
    for k in (0..count).step_by(2) {
        for (t, x) in xs.iter().enumerate() {
            if k + 1 < count {
                let [a, b] = block_rows::<2>(w.rows_blocks(first + k, 2), x);
                (out[k * n + t], out[(k + 1) * n + t]) = (a, b);
            } else {
                out[k * n + t] = row_dot(w, first + k, x);
            }
        }
    }
}

/// `N` consecutive rows' `blocks` (Q4_1, Q5_1, Q8_0 or Q5_0) · `x`.
#[inline(always)]
fn block_rows<const N: usize>(blocks: RowBlocks<'_>, x: &QActs) -> [f32; N] {
    match blocks {
        RowBlocks::Q4_1 { d, m, qs } => dot_q4_1::<N>(d, m, qs, x),
        RowBlocks::Q5_1 { d, m, qs } => dot_q5_1::<N>(d, m, qs, x),
        RowBlocks::Q8_0 { d, qs } => dot_q8_0::<N>(d, qs, x),
        RowBlocks::Q5_0 { d, qh, qs } => dot_q5_0::<N>(d, qh, qs, x),
        _ => unreachable!("a format of 32-value blocks with a SIMD kernel"),
    }
}

/// The K-quants' integer sums on wasm SIMD (`super_blocks` takes the float steps).
struct Simd128;

const _: () = assert!(WOVEN == 1, "wasm SIMD reads Q4_K a row at a time");

impl IntSums for Simd128 {
    unsafe fn q4k(row: &Q4KRow<'_>, s: usize, x: &QActs) -> ([i32; 4], [i32; 4]) {
        let first = s * 8;
        assert!((first + 8) * BLOCK <= x.qs.len() && (first + 8) * 2 <= x.bsums.len());
        // Rows are not woven here (`WOVEN` is one, so the group is the row): its scales,
        // minimums and sixteen bytes of each sub-block lie together, read once a super-block.
        let (sc, m) = (
            &row.group.sc[first..first + 8],
            &row.group.m[first..first + 8],
        );
        let nibbles = &row.group.qs[first * WOVEN_BYTES..(first + 8) * WOVEN_BYTES];
        let mask = u8x16_splat(0x0F);
        // Each pair's sums stay in four lanes until the end: one reduction a super-block.
        let mut pairs = [i32x4_splat(0); 4];
        for j in 0..8 {
            let b = first + j;
            // SAFETY: `nibbles` holds the super-block's 128 bytes, and the assert above puts
            // block b inside `x`; no alignment needed.
            let (raw, x0, x1) = unsafe {
                (
                    v128_load(nibbles.as_ptr().add(j * WOVEN_BYTES) as *const v128),
                    v128_load(x.qs.as_ptr().add(b * BLOCK) as *const v128),
                    v128_load(x.qs.as_ptr().add(b * BLOCK + 16) as *const v128),
                )
            };
            // Nibbles are below 16, so they read as signed bytes too.
            let sums = i32x4_add(dot16(v128_and(raw, mask), x0), dot16(u8x16_shr(raw, 4), x1));
            let scaled = i32x4_mul(sums, i32x4_splat(i32::from(sc[j])));
            pairs[j / 2] = i32x4_add(pairs[j / 2], scaled);
        }
        // SAFETY: the assert above puts the super-block's sixteen sums inside `bsums`.
        let sixteens: [v128; 4] = std::array::from_fn(|i| unsafe {
            v128_load(x.bsums.as_ptr().add(first * 2 + 4 * i) as *const v128)
        });
        let sub_blocks = [
            add_neighbours(sixteens[0], sixteens[1]),
            add_neighbours(sixteens[2], sixteens[3]),
        ];
        let mins = [
            i32x4_mul(
                sub_blocks[0],
                u32x4(m[0].into(), m[1].into(), m[2].into(), m[3].into()),
            ),
            i32x4_mul(
                sub_blocks[1],
                u32x4(m[4].into(), m[5].into(), m[6].into(), m[7].into()),
            ),
        ];
        (
            lanes(sum_each(pairs)),
            lanes(add_neighbours(mins[0], mins[1])),
        )
    }

    unsafe fn q6k(row: &Q6KRow<'_>, s: usize, x: &QActs) -> [i32; 8] {
        let start = s * QK_K;
        assert!(start + QK_K <= x.qs.len());
        let sc = &row.sc[s * 16..s * 16 + 16];
        let (ql, qh) = (&row.ql[s * 128..][..128], &row.qh[s * 64..][..64]);
        // Lanes 0–3 from each run's first sixteen values, 4–7 from its second.
        let mut sums = [i32x4_splat(0); 2];
        // Each half of the super-block is four runs from 64 bytes of `ql` and 32 of `qh`
        // ([`super_blocks::q6k_run_at`]): three loads give sixteen values of all four runs.
        for half in 0..2 {
            for (h, sums) in sums.iter_mut().enumerate() {
                let (low_a, low_b, high) = (
                    &ql[64 * half + 16 * h..][..16],
                    &ql[64 * half + 32 + 16 * h..][..16],
                    &qh[32 * half + 16 * h..][..16],
                );
                // SAFETY: each slice holds sixteen bytes.
                let (low_a, low_b, high) = unsafe {
                    (
                        v128_load(low_a.as_ptr() as *const v128),
                        v128_load(low_b.as_ptr() as *const v128),
                        v128_load(high.as_ptr() as *const v128),
                    )
                };
                // Sixteen-bit shifts are one instruction where byte shifts are several, and
                // the masks drop the bits that cross from a neighbouring byte.
                let (nibble, two) = (u8x16_splat(0x0F), u8x16_splat(0x30));
                let runs = [
                    v128_or(v128_and(low_a, nibble), v128_and(i16x8_shl(high, 4), two)),
                    v128_or(v128_and(low_b, nibble), v128_and(i16x8_shl(high, 2), two)),
                    v128_or(v128_and(u16x8_shr(low_a, 4), nibble), v128_and(high, two)),
                    v128_or(
                        v128_and(u16x8_shr(low_b, 4), nibble),
                        v128_and(u16x8_shr(high, 2), two),
                    ),
                ];
                for (quarter, q) in runs.into_iter().enumerate() {
                    let c = 4 * half + quarter;
                    // SAFETY: the assert above puts the sixteen values inside `x`.
                    let a = unsafe {
                        v128_load(x.qs.as_ptr().add(start + 32 * c + 16 * h) as *const v128)
                    };
                    let scale = i32x4_splat(i32::from(sc[2 * c + h]));
                    *sums = i32x4_add(*sums, i32x4_mul(fours(q, a), scale));
                }
            }
        }
        // Lane l's offset, 32·(sc[2l]·Σx[2l] + sc[2l+1]·Σx[2l+1]), over four sixteens at a time.
        let bsums = &x.bsums[s * 16..s * 16 + 16];
        // SAFETY: both slices hold sixteen values.
        let (scales, sixteens) = unsafe {
            (
                v128_load(sc.as_ptr() as *const v128),
                std::array::from_fn::<v128, 4, _>(|i| {
                    v128_load(bsums.as_ptr().add(4 * i) as *const v128)
                }),
            )
        };
        let wide = [
            i16x8_extend_low_i8x16(scales),
            i16x8_extend_high_i8x16(scales),
        ];
        let scaled: [v128; 4] = std::array::from_fn(|i| {
            let quarter = match i % 2 {
                0 => i32x4_extend_low_i16x8(wide[i / 2]),
                _ => i32x4_extend_high_i16x8(wide[i / 2]),
            };
            i32x4_mul(quarter, sixteens[i])
        });
        let offsets = [
            add_neighbours(scaled[0], scaled[1]),
            add_neighbours(scaled[2], scaled[3]),
        ];
        let [low, high] = [0, 1].map(|h| lanes(i32x4_sub(sums[h], i32x4_shl(offsets[h], 5))));
        [
            low[0], low[1], low[2], low[3], high[0], high[1], high[2], high[3],
        ]
    }
}

/// The sums of four neighbouring products of `q` (unsigned bytes below 128) and `a`
/// (signed bytes): even bytes against even and odd against odd, which widen in one or two
/// sixteen-bit shifts where widening halves takes more, and meet in the lanes of four.
#[inline(always)]
fn fours(q: v128, a: v128) -> v128 {
    let (q_even, q_odd) = (v128_and(q, u16x8_splat(0x00FF)), u16x8_shr(q, 8));
    let (a_even, a_odd) = (i16x8_shr(i16x8_shl(a, 8), 8), i16x8_shr(a, 8));
    i32x4_add(
        i32x4_dot_i16x8(q_even, a_even),
        i32x4_dot_i16x8(q_odd, a_odd),
    )
}

/// `[a0 + a1, a2 + a3, b0 + b1, b2 + b3]` of i32 lanes.
#[inline(always)]
fn add_neighbours(a: v128, b: v128) -> v128 {
    i32x4_add(
        i32x4_shuffle::<0, 2, 4, 6>(a, b),
        i32x4_shuffle::<1, 3, 5, 7>(a, b),
    )
}

/// Lane `i` the sum of `v[i]`'s four i32 lanes.
#[inline(always)]
fn sum_each(v: [v128; 4]) -> v128 {
    add_neighbours(add_neighbours(v[0], v[1]), add_neighbours(v[2], v[3]))
}

/// The four i32 lanes of `v`.
#[inline(always)]
fn lanes(v: v128) -> [i32; 4] {
    [
        i32x4_extract_lane::<0>(v),
        i32x4_extract_lane::<1>(v),
        i32x4_extract_lane::<2>(v),
        i32x4_extract_lane::<3>(v),
    ]
}

#[inline(always)]
fn hsum(v: v128) -> f32 {
    f32x4_extract_lane::<0>(v)
        + f32x4_extract_lane::<1>(v)
        + f32x4_extract_lane::<2>(v)
        + f32x4_extract_lane::<3>(v)
}

/// A block of 32 activations widened to i16 once, for every row it meets.
#[inline(always)]
fn widened_block(x: &QActs, b: usize) -> [v128; 4] {
    assert!((b + 1) * BLOCK <= x.qs.len());
    // SAFETY: the assert above puts block b inside `x.qs`; wasm loads need no alignment.
    let (x0, x1) = unsafe {
        (
            v128_load(x.qs.as_ptr().add(b * BLOCK) as *const v128),
            v128_load(x.qs.as_ptr().add(b * BLOCK + 16) as *const v128),
        )
    };
    [
        i16x8_extend_low_i8x16(x0),
        i16x8_extend_high_i8x16(x0),
        i16x8_extend_low_i8x16(x1),
        i16x8_extend_high_i8x16(x1),
    ]
}

/// Partial sums (four lanes) of Σ w·x over a block: `w` its two halves of 16 signed bytes,
/// `x` the block widened.
#[inline(always)]
fn dot_block((w0, w1): (v128, v128), x: &[v128; 4]) -> v128 {
    let low = i32x4_add(
        i32x4_dot_i16x8(i16x8_extend_low_i8x16(w0), x[0]),
        i32x4_dot_i16x8(i16x8_extend_high_i8x16(w0), x[1]),
    );
    let high = i32x4_add(
        i32x4_dot_i16x8(i16x8_extend_low_i8x16(w1), x[2]),
        i32x4_dot_i16x8(i16x8_extend_high_i8x16(w1), x[3]),
    );
    i32x4_add(low, high)
}

/// Partial sums (four lanes) of Σ a·b over 16 signed bytes each.
#[inline(always)]
fn dot16(a: v128, b: v128) -> v128 {
    let lo = i32x4_dot_i16x8(i16x8_extend_low_i8x16(a), i16x8_extend_low_i8x16(b));
    let hi = i32x4_dot_i16x8(i16x8_extend_high_i8x16(a), i16x8_extend_high_i8x16(b));
    i32x4_add(lo, hi)
}

/// Σ over blocks of d·dx·Σ(q·qx) + m·sum_x, for `N` consecutive Q4_1 rows.
#[inline(always)]
fn dot_q4_1<const N: usize>(d: &[f32], m: &[f32], qs: &[u8], x: &QActs) -> [f32; N] {
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

/// Σ over blocks of d·dx·Σ(q·qx) + m·sum_x, for `N` consecutive widened Q5_1 rows (a byte a
/// value).
#[inline(always)]
fn dot_q5_1<const N: usize>(d: &[f32], m: &[f32], qs: &[u8], x: &QActs) -> [f32; N] {
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

/// Σ over blocks of d·dx·Σ(q·qx) + m·sum_x for each of `N` consecutive rows whose blocks
/// (`d.len() / N` a row) are `values(b)`: 32 values (below 128) as two halves.
#[inline(always)]
fn dot_with_min<const N: usize>(
    d: &[f32],
    m: &[f32],
    x: &QActs,
    values: impl Fn(usize) -> (v128, v128),
) -> [f32; N] {
    let nb = d.len() / N;
    assert!(m.len() == d.len() && x.d.len() >= nb && x.sum.len() >= nb);
    let mut acc = [f32x4_splat(0.0); N];
    let mut mins = [0f32; N];
    for b in 0..nb {
        let xb = widened_block(x, b);
        for n in 0..N {
            let block = n * nb + b;
            let s = dot_block(values(block), &xb);
            let scale = f32x4_splat(d[block] * x.d[b]);
            acc[n] = f32x4_add(acc[n], f32x4_mul(f32x4_convert_i32x4(s), scale));
            mins[n] += m[block] * x.sum[b];
        }
    }
    std::array::from_fn(|n| hsum(acc[n]) + mins[n])
}

/// Σ over blocks of d·dx·Σ(q·qx), for `N` consecutive Q8_0 rows.
#[inline(always)]
fn dot_q8_0<const N: usize>(d: &[u16], qs: &[i8], x: &QActs) -> [f32; N] {
    assert!(qs.len() == d.len() * BLOCK);
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

/// Σ over blocks of d·dx·Σ((q − 16)·qx), for `N` consecutive Q5_0 rows: each block widened
/// to Q8_0's signed bytes.
#[inline(always)]
fn dot_q5_0<const N: usize>(d: &[u16], qh: &[u32], qs: &[u8], x: &QActs) -> [f32; N] {
    assert!(qh.len() == d.len() && qs.len() == d.len() * 16);
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

/// Σ over blocks of d·dx·Σ(q·qx) for each of `N` consecutive rows whose blocks (`d.len() / N`
/// a row) are `bytes(b)`: two halves of 16 signed bytes.
#[inline(always)]
fn dot_signed<const N: usize>(
    d: &[u16],
    x: &QActs,
    bytes: impl Fn(usize) -> (v128, v128),
) -> [f32; N] {
    let nb = d.len() / N;
    assert!(x.d.len() >= nb);
    let mut acc = [f32x4_splat(0.0); N];
    for b in 0..nb {
        let xb = widened_block(x, b);
        for (n, acc) in acc.iter_mut().enumerate() {
            let block = n * nb + b;
            let s = dot_block(bytes(block), &xb);
            let scale = f32x4_splat(f16_to_f32(d[block]) * x.d[b]);
            *acc = f32x4_add(*acc, f32x4_mul(f32x4_convert_i32x4(s), scale));
        }
    }
    acc.map(hsum)
}
