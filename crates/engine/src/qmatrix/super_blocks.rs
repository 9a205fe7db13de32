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

/// Rows a Q4_K matrix weaves together, as llama.cpp's repacked `block_q4_Kx8` does where a
/// kernel reads them so (x86's lane kernels): a decoded token's product then reads eight rows
/// in one stream, a row a register lane. Elsewhere one, which is the plain order of rows.
#[cfg(target_arch = "x86_64")]
pub(super) const WOVEN: usize = 8;
/// Rows a Q4_K matrix weaves together: none without a kernel that reads them so.
#[cfg(not(target_arch = "x86_64"))]
pub(super) const WOVEN: usize = 1;

/// Row `r`'s woven group and its lane in it.
#[allow(clippy::modulo_one)] // `WOVEN` is one where no kernel reads rows woven
pub(super) fn woven_place(r: usize) -> (usize, usize) {
    (r / WOVEN, r % WOVEN)
}

/// Bytes of nibbles a woven group holds per sub-block: sixteen of each row.
pub(super) const WOVEN_BYTES: usize = 16 * WOVEN;

/// [`WOVEN`] Q4_K rows woven together (`QMatrix::Q4K`'s layout), lane `i` row `i`: per
/// super-block each row's scale and minimum scale (`d[8s + i]`), per sub-block each row's
/// integer scale and minimum (`sc[8b + i]`), and per sub-block the rows' sixteen bytes of
/// nibbles four at a time: bytes `4g..4g + 4` of row `i` at `WOVEN_BYTES·b + 4·WOVEN·g + 4i`.
#[derive(Clone, Copy)]
pub(super) struct Q4KGroup<'a> {
    pub d: &'a [f32],
    pub dmin: &'a [f32],
    pub sc: &'a [u8],
    pub m: &'a [u8],
    pub qs: &'a [u8],
}

/// A Q4_K row: one lane of its woven group.
#[derive(Clone, Copy)]
pub(super) struct Q4KRow<'a> {
    pub group: Q4KGroup<'a>,
    pub lane: usize,
}

impl Q4KRow<'_> {
    /// Super-blocks in the row.
    pub fn supers(&self) -> usize {
        self.group.d.len() / WOVEN
    }

    /// Super-block `s`'s scale.
    pub fn d(&self, s: usize) -> f32 {
        self.group.d[s * WOVEN + self.lane]
    }

    /// Super-block `s`'s minimum scale.
    pub fn dmin(&self, s: usize) -> f32 {
        self.group.dmin[s * WOVEN + self.lane]
    }

    /// Sub-block `b`'s integer scale.
    pub fn sc(&self, b: usize) -> u8 {
        self.group.sc[b * WOVEN + self.lane]
    }

    /// Sub-block `b`'s integer minimum.
    pub fn m(&self, b: usize) -> u8 {
        self.group.m[b * WOVEN + self.lane]
    }

    /// Sub-block `b`'s sixteen bytes of nibbles as four little-endian words (Q4_1's order:
    /// byte `j`'s low nibble is value `j`, its high nibble value `j + 16`).
    pub fn nibble_words(&self, b: usize) -> [u32; 4] {
        let at = b * WOVEN_BYTES + 4 * self.lane;
        std::array::from_fn(|g| {
            let w = &self.group.qs[at + 4 * WOVEN * g..][..4];
            u32::from_le_bytes([w[0], w[1], w[2], w[3]])
        })
    }

    /// Sub-block `b`'s sixteen bytes of nibbles.
    pub fn nibbles(&self, b: usize) -> [u8; 16] {
        let words = self.nibble_words(b);
        std::array::from_fn(|j| words[j / 4].to_le_bytes()[j % 4])
    }
}

/// A Q6_K row as the file packs its values: per super-block a scale and 16 sub-block
/// scales, then each value's low four bits (`ql`, 128 bytes a super-block) and high two
/// (`qh`, 64 bytes), in llama.cpp's order ([`q6k_run_at`]).
pub(super) struct Q6KRow<'a> {
    pub d: &'a [f32],
    pub sc: &'a [i8],
    pub ql: &'a [u8],
    pub qh: &'a [u8],
}

/// Where run `c` (values `32c..32c + 32`) of a Q6_K super-block lies: `(ql offset, its
/// shift, qh offset, its shift)`; value `32c + j` is `(ql[at + j] >> shift) & 15` with
/// `(qh[at + j] >> shift) & 3` above it. Each 128 values share 64 bytes of `ql` (the runs
/// of a quarter 0 and 1 in the low nibbles, 2 and 3 in the high) and 32 of `qh`.
pub(super) fn q6k_run_at(c: usize) -> (usize, u32, usize, u32) {
    let (half, quarter) = (c / 4, c % 4);
    let shifts = (4 * (quarter as u32 / 2), 2 * quarter as u32);
    (
        64 * half + 32 * (quarter % 2),
        shifts.0,
        32 * half,
        shifts.1,
    )
}

impl Q6KRow<'_> {
    /// Run `c` of super-block `s`: 32 values, each `q + 32` in `0..64`.
    pub fn run(&self, s: usize, c: usize) -> [u8; 32] {
        let (low, low_shift, high, high_shift) = q6k_run_at(c);
        let ql = &self.ql[s * 128 + low..][..32];
        let qh = &self.qh[s * 64 + high..][..32];
        std::array::from_fn(|j| (ql[j] >> low_shift) & 15 | ((qh[j] >> high_shift) & 3) << 4)
    }
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
            let q = row.nibbles(b);
            scaled[j / 2] +=
                i32::from(row.sc(b)) * dot_nibbles(&q, &x.qs[b * BLOCK..(b + 1) * BLOCK]);
            mins[j / 2] += i32::from(row.m(b)) * (x.bsums[2 * b] + x.bsums[2 * b + 1]);
        }
        (scaled, mins)
    }

    unsafe fn q6k(row: &Q6KRow<'_>, s: usize, x: &QActs) -> [i32; 8] {
        let runs: [[u8; 32]; 8] = std::array::from_fn(|c| row.run(s, c));
        let a = &x.qs[s * QK_K..];
        let (sc, bsums) = (&row.sc[s * 16..s * 16 + 16], &x.bsums[s * 16..s * 16 + 16]);
        std::array::from_fn(|l| {
            let products = (0..8).map(|c| {
                let four: i32 = (4 * l..4 * l + 4)
                    .map(|j| i32::from(runs[c][j]) * i32::from(a[32 * c + j]))
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
        RowBlocks::Q4K(row) => {
            let (mut acc, mut acc_min) = (0f32, 0f32);
            for s in 0..row.supers() {
                let (scale, min) = (row.d(s) * x.d[s * 8], row.dmin(s) * x.d[s * 8]);
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
        RowBlocks::Q6K { d, sc, ql, qh } => {
            let row = Q6KRow { d, sc, ql, qh };
            // One call of the integer sums for both orders, so that a family's is inlined.
            let tiled = q6k_tiled(x.place);
            let (mut acc, mut lanes_acc) = (0f32, [0f32; 8]);
            for s in 0..row.d.len() {
                // SAFETY: the caller's guarantee.
                let lanes = unsafe { K::q6k(&row, s, x) };
                if tiled {
                    let total: i32 = lanes.iter().sum();
                    acc = fused(row.d[s] * total as f32, x.d[s * 8], acc);
                } else {
                    let scale = x.d[s * 8] * row.d[s];
                    for (a, &l) in lanes_acc.iter_mut().zip(&lanes) {
                        *a = fused(scale, l as f32, *a);
                    }
                }
            }
            if tiled { acc } else { hsum_lanes(lanes_acc) }
        }
        _ => unreachable!("a K-quant row"),
    }
}

/// [`IntSums`] one value at a time, for [`dot`].
pub(super) fn portable_sums(row: RowBlocks<'_>, x: &QActs) -> f32 {
    // SAFETY: plain integers run anywhere.
    unsafe { dot::<Portable>(row, x) }
}
