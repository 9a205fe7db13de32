//! The K-quants' products (Q4_K, Q6_K), written once in the order llama.cpp's x86 build sums
//! them. A kernel family supplies only each super-block's integer sums ([`IntSums`]), which
//! are exact in any order; the float steps here are the reference's own, so every family that
//! fuses multiply-adds gives llama.cpp's bits:
//! - Q4_K (repacked 8×8): per output, the scaled sums and the minimums' sums each go into one
//!   chain of fused multiply-adds, and the output is the difference of the two chains. The
//!   chains take a link per super-block for the tokens `gemv` takes (a batch's last n mod 4),
//!   and a link per pair of sub-blocks for those `gemm` takes in fours.
//! - Q6_K for fewer than 8 tokens (`ggml_vec_dot_q6_K_q8_K`): eight integer lanes a
//!   super-block, one fused multiply-add a lane, then AVX's horizontal sum.
//! - Q6_K for 8 tokens or more (the tiled kernel): one integer a super-block, times the
//!   weight's scale, fused into the output with the activation's.

use super::{BLOCK, Place, QActs, QK_K, RowBlocks, dot_nibbles, fused, hsum_lanes};

/// The tokens from which llama.cpp's CPU backend takes a K-quant product through its tiled
/// kernel (`ggml_tiled_min_batch`).
pub(super) const TILED_MIN_TOKENS: usize = 8;

/// A Q4_K row: per super-block its scales, then 16 bytes of nibbles per 32 values.
pub(super) struct Q4KRow<'a> {
    pub d: &'a [f32],
    pub dmin: &'a [f32],
    pub sc: &'a [u8],
    pub m: &'a [u8],
    pub qs: &'a [u8],
}

/// A Q6_K row: per super-block a scale and 16 sub-block scales, then a byte per value.
pub(super) struct Q6KRow<'a> {
    pub d: &'a [f32],
    pub sc: &'a [i8],
    pub qs: &'a [u8],
}

/// One kernel family's integer sums of a super-block against a token's Q8_K activations.
pub(super) trait IntSums {
    /// Q4_K's super-block `s` by pairs `p` of sub-blocks: `Σ_j sc_j·(q·x)_j` and
    /// `Σ_j m_j·Σx_j` over sub-blocks `j` = 2p and 2p + 1.
    ///
    /// # Safety
    /// The machine runs the family's instruction set.
    unsafe fn q4k(row: &Q4KRow<'_>, s: usize, x: &QActs) -> ([i32; 4], [i32; 4]);

    /// Q4_K's super-block `s` whole: the totals of [`IntSums::q4k`]'s pairs, which is all
    /// `gemv`'s order reads (a family may sum them without keeping the pairs apart).
    ///
    /// # Safety
    /// As [`IntSums::q4k`].
    #[inline(always)]
    unsafe fn q4k_total(row: &Q4KRow<'_>, s: usize, x: &QActs) -> (i32, i32) {
        // SAFETY: the caller's guarantee.
        let (scaled, mins) = unsafe { Self::q4k(row, s, x) };
        (scaled.iter().sum(), mins.iter().sum())
    }

    /// Q6_K's super-block `s` in the eight lanes of `ggml_vec_dot_q6_K_q8_K` on AVX2: lane
    /// `l` holds, over the eight runs `c` of 32 values, sc[2c + l/4] times the products of
    /// values 4l..4l + 4 of the run (q unsigned), less 32·(sc[2l]·Σx[2l] + sc[2l+1]·Σx[2l+1])
    /// over sixteens. Their total is Σ sc·(q − 32)·x.
    ///
    /// # Safety
    /// As [`IntSums::q4k`].
    unsafe fn q6k(row: &Q6KRow<'_>, s: usize, x: &QActs) -> [i32; 8];
}

/// The integer sums one value at a time, the reference for the vector ones.
pub(super) struct Portable;

impl IntSums for Portable {
    unsafe fn q4k(row: &Q4KRow<'_>, s: usize, x: &QActs) -> ([i32; 4], [i32; 4]) {
        let (mut scaled, mut mins) = ([0; 4], [0; 4]);
        for j in 0..8 {
            let b = s * 8 + j;
            let q = &row.qs[b * 16..b * 16 + 16];
            scaled[j / 2] +=
                i32::from(row.sc[b]) * dot_nibbles(q, &x.qs[b * BLOCK..(b + 1) * BLOCK]);
            mins[j / 2] += i32::from(row.m[b]) * (x.bsums[2 * b] + x.bsums[2 * b + 1]);
        }
        (scaled, mins)
    }

    unsafe fn q6k(row: &Q6KRow<'_>, s: usize, x: &QActs) -> [i32; 8] {
        let (q, a) = (&row.qs[s * QK_K..], &x.qs[s * QK_K..]);
        let (sc, bsums) = (&row.sc[s * 16..s * 16 + 16], &x.bsums[s * 16..s * 16 + 16]);
        std::array::from_fn(|l| {
            let products = (0..8).map(|c| {
                let at = 32 * c + 4 * l;
                let four: i32 = (at..at + 4)
                    .map(|i| i32::from(q[i]) * i32::from(a[i]))
                    .sum();
                i32::from(sc[2 * c + l / 4]) * four
            });
            let offsets =
                i32::from(sc[2 * l]) * bsums[2 * l] + i32::from(sc[2 * l + 1]) * bsums[2 * l + 1];
            products.sum::<i32>() - 32 * offsets
        })
    }
}

/// Whether Q4_K's `gemm` takes a token (in fours, from its batch's first), not `gemv`.
pub(super) fn q4k_in_fours(place: Place) -> bool {
    place.index < place.of - place.of % 4
}

/// Whether Q6_K's tiled kernel takes a token, not `ggml_vec_dot_q6_K_q8_K`.
pub(super) fn q6k_tiled(place: Place) -> bool {
    place.of >= TILED_MIN_TOKENS
}

/// Row `row` (a Q4_K or Q6_K row) · `x`, in the order `x`'s place in its pass decides, with
/// `K`'s integer sums.
///
/// # Safety
/// The machine runs `K`'s instruction set.
#[inline(always)]
pub(super) unsafe fn dot<K: IntSums>(row: RowBlocks<'_>, x: &QActs) -> f32 {
    match row {
        RowBlocks::Q4K { d, dmin, sc, m, qs } => {
            let row = Q4KRow { d, dmin, sc, m, qs };
            let (mut acc, mut acc_min) = (0f32, 0f32);
            for s in 0..row.d.len() {
                let (scale, min) = (row.d[s] * x.d[s * 8], row.dmin[s] * x.d[s * 8]);
                if q4k_in_fours(x.place) {
                    // SAFETY: the caller's guarantee.
                    let (scaled, mins) = unsafe { K::q4k(&row, s, x) };
                    for (&sum, &min_sum) in scaled.iter().zip(&mins) {
                        acc = fused(sum as f32, scale, acc);
                        acc_min = fused(min_sum as f32, min, acc_min);
                    }
                } else {
                    // SAFETY: the caller's guarantee.
                    let (sum, min_sum) = unsafe { K::q4k_total(&row, s, x) };
                    acc = fused(sum as f32, scale, acc);
                    acc_min = fused(min_sum as f32, min, acc_min);
                }
            }
            acc - acc_min
        }
        RowBlocks::Q6K { d, sc, qs } => {
            let row = Q6KRow { d, sc, qs };
            let supers = 0..row.d.len();
            if q6k_tiled(x.place) {
                return supers.fold(0f32, |acc, s| {
                    // SAFETY: the caller's guarantee.
                    let total: i32 = unsafe { K::q6k(&row, s, x) }.iter().sum();
                    fused(row.d[s] * total as f32, x.d[s * 8], acc)
                });
            }
            let mut acc = [0f32; 8];
            for s in supers {
                // SAFETY: the caller's guarantee.
                let lanes = unsafe { K::q6k(&row, s, x) };
                let scale = x.d[s * 8] * row.d[s];
                for (a, &l) in acc.iter_mut().zip(&lanes) {
                    *a = fused(scale, l as f32, *a);
                }
            }
            hsum_lanes(acc)
        }
        _ => unreachable!("a K-quant row"),
    }
}

/// [`IntSums`] one value at a time, for [`dot`].
pub(super) fn portable_sums(row: RowBlocks<'_>, x: &QActs) -> f32 {
    // SAFETY: plain integers run anywhere.
    unsafe { dot::<Portable>(row, x) }
}
