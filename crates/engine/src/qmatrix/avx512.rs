//! AVX-512 VNNI kernels for Q4_1, Q8_0 and Q5_0: a tile of rows × tokens per call, 64 bytes
//! a 512-bit register, `vpdpbusd` for the byte products.
//!
//! Every kernel sums as llama.cpp's AVX2 build does (`ggml_vec_dot_q8_0_q8_0`, tinyBLAS,
//! `ggml_vec_dot_q4_1_q8_1`): eight lanes of four products a block, one fused multiply-add a
//! lane a block, then `hsum`. So a register holds one block of two rows for a prompt's tiles
//! (each fused multiply-add takes both rows one block on), and two consecutive blocks of one
//! row for a decoded token, whose rows are read in place one after another (the two blocks
//! then take two fused multiply-adds in turn). A tile unpacks each row's blocks once for its
//! tokens; every shape gives each (row, token) the same operations in the same order, so a
//! row alone, a decoded token's chunk of rows and a prompt's tiles agree to the bit.

use std::arch::x86_64::*;
use std::sync::OnceLock;

use super::{BLOCK, FormatKernels, KernelTable, PORTABLE_FORMAT, QActs, QMatrix, avx2};

/// This family's kernel for each format (AVX2's for Q4_0 and Q5_1). Every entry is safe to call only
/// where AVX-512 F, BW and VNNI and AVX2 run, which [`super::Kernels::table`] checks.
pub(super) const TABLE: KernelTable = KernelTable {
    q4_1: TILED,
    q4_0: avx2::TABLE.q4_0,
    q8_0: TILED,
    q5_0: TILED,
    q5_1: avx2::TABLE.q5_1,
    q4k: K_QUANT_TILES,
    q6k: K_QUANT_TILES,
    f32: PORTABLE_FORMAT,
};

/// The K-quants: AVX2's kernel for a row, sixteen rows a register over a task's rows.
const K_QUANT_TILES: FormatKernels = FormatKernels {
    dot: avx2::TABLE.q4k.dot,
    rows: Some(super::avx512_k_quants::rows),
};

/// The tiles, alone or over a task's rows.
const TILED: FormatKernels = FormatKernels {
    dot: row_dot,
    rows: Some(task_rows),
};

/// Row `r` · `x`: a tile of one row and one token.
fn row_dot(w: &QMatrix, r: usize, x: &QActs) -> f32 {
    let nb = w.shape().1 / BLOCK;
    // SAFETY (each call): the features run here (see `TABLE`); the tile checks its rows and
    // tokens.
    match w {
        QMatrix::Q4_1 { d, m, qs, .. } => unsafe { Q4_1 { nb, d, m, qs }.one(r, x) },
        QMatrix::Q8_0 { d, qs, .. } => unsafe { Q8_0 { nb, d, qs }.one(r, x) },
        QMatrix::Q5_0 { d, qh, qs, .. } => unsafe { Q5_0 { nb, d, qh, qs }.one(r, x) },
        QMatrix::Q4_0 { .. }
        | QMatrix::Q5_1 { .. }
        | QMatrix::Q4K { .. }
        | QMatrix::Q6K { .. }
        | QMatrix::F32 { .. } => w.dot_row_portable(r, x),
    }
}

/// A task's rows against every token, by tiles.
fn task_rows(w: &QMatrix, first: usize, count: usize, xs: &[QActs], out: &mut [f32]) {
    let nb = w.shape().1 / BLOCK;
    // SAFETY (each call): as in `row_dot`.
    match w {
        QMatrix::Q4_1 { d, m, qs, .. } => unsafe {
            fill(&Q4_1 { nb, d, m, qs }, first, count, xs, out)
        },
        QMatrix::Q8_0 { d, qs, .. } => unsafe { fill(&Q8_0 { nb, d, qs }, first, count, xs, out) },
        QMatrix::Q5_0 { d, qh, qs, .. } => unsafe {
            fill(&Q5_0 { nb, d, qh, qs }, first, count, xs, out)
        },
        QMatrix::Q4_0 { .. }
        | QMatrix::Q5_1 { .. }
        | QMatrix::Q4K { .. }
        | QMatrix::Q6K { .. }
        | QMatrix::F32 { .. } => {
            super::each_row_and_token(QMatrix::dot_row_portable, w, first, xs, out)
        }
    }
}

/// Whether this machine runs them (AVX-512 F, BW and VNNI, and F16C, detected once).
pub fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vnni")
            && is_x86_feature_detected!("f16c")
    })
}

/// Rows of one tile call. Four rows × four tokens keep sixteen accumulators in registers;
/// the narrower shapes tried were no faster on a long prompt.
const TILE_ROWS: usize = 4;
/// Tokens of one tile call.
const TILE_TOKENS: usize = 4;

/// Tokens whose activations one pass over a task's rows reads: a long prompt's activations
/// would not stay in cache across all of a task's rows.
const TOKEN_BLOCK: usize = 64;

/// How far ahead of the pair being read the weights are requested (as in the AVX2 kernels:
/// a decoded token reads every weight once, and waits on memory without the hint).
const PREFETCH_BYTES: usize = 1024;

/// A weight format the tiles read: rows of `nb` blocks, readied once for all the tokens a
/// task reads them with.
pub trait Tiles {
    /// `R` rows as the tiles read them.
    type Rows: Default;

    /// Readies rows `first..first + R` into `rows`.
    ///
    /// # Safety
    /// The machine has AVX-512 F, BW and VNNI and F16C ([`available`]). (Rows past the
    /// matrix panic.)
    unsafe fn prepare<const R: usize>(&self, first: usize, rows: &mut Self::Rows);

    /// `out[i][j]` = row `i` of `rows` (readied for `R`) · token `x[j]`.
    ///
    /// # Safety
    /// As [`Tiles::prepare`]. (Tokens with fewer blocks than a row panic.)
    unsafe fn tile<const R: usize, const T: usize>(
        &self,
        rows: &Self::Rows,
        x: [&QActs; T],
    ) -> [[f32; T]; R];

    /// Rows `r` and `r + 1` · token `x` (a decoded token's rows, two at a time).
    ///
    /// # Safety
    /// As [`Tiles::tile`].
    unsafe fn two(&self, r: usize, x: &QActs) -> [f32; 2] {
        // SAFETY: the caller's guarantees.
        unsafe { [self.one(r, x), self.one(r + 1, x)] }
    }

    /// Row `r` · token `x`: a tile of one.
    ///
    /// # Safety
    /// As [`Tiles::tile`].
    unsafe fn one(&self, r: usize, x: &QActs) -> f32 {
        let mut rows = Self::Rows::default();
        // SAFETY: the caller's guarantees.
        unsafe {
            self.prepare::<1>(r, &mut rows);
            self.tile::<1, 1>(&rows, [x])[0][0]
        }
    }
}

/// Q4_1 rows: per block a scale, a minimum and 16 bytes of nibbles.
pub struct Q4_1<'a> {
    pub nb: usize,
    pub d: &'a [f32],
    pub m: &'a [f32],
    pub qs: &'a [u8],
}

impl Q4_1<'_> {
    /// Rows `r..r + N` read in place for a decoded token, two blocks a register, each pair's
    /// two products of scales multiplied in one 128-bit register and spread once; the rows'
    /// chains of fused multiply-adds interleave, where one row's alone waits on each add.
    ///
    /// # Safety
    /// As [`Tiles::tile`].
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c,avx2,fma")]
    unsafe fn rows_in_place<const N: usize>(&self, r: usize, x: &QActs) -> [f32; N] {
        let nb = self.nb;
        assert!((r + N) * nb <= self.d.len(), "rows past the matrix");
        assert!(x.qs.len() >= nb * BLOCK && x.d.len() >= nb && x.sum.len() >= nb);
        let (mut acc, mut mins) = ([_mm256_setzero_ps(); N], [0f32; N]);
        for b in (0..nb).step_by(2) {
            let two = b + 1 < nb;
            // SAFETY: the blocks lie inside `x` (asserted above).
            let (xv, dx) = unsafe { token_pair(x, b, two) };
            for i in 0..N {
                let block = (r + i) * nb + b;
                for k in 0..(nb - b).min(2) {
                    mins[i] = self.m[block + k].mul_add(x.sum[b + k], mins[i]);
                }
                let p = self.qs[block * 16..].as_ptr();
                prefetch_ahead(p, block * 16, PREFETCH_BYTES);
                // SAFETY: the blocks lie inside row `r + i` (asserted above).
                let (raw, dw) = unsafe {
                    let d = self.d.as_ptr().add(block);
                    (pair_packed_nibbles(p, two), pair_floats(d, two))
                };
                let dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), pair_nibbles(raw), xv);
                acc[i] = add_scaled_pair(acc[i], dot, spread_pair(_mm_mul_ps(dw, dx)));
            }
        }
        std::array::from_fn(|i| avx2::hsum(acc[i]) + mins[i])
    }
}

/// Q8_0 rows: per block an f16 scale and 32 signed bytes.
pub struct Q8_0<'a> {
    pub nb: usize,
    pub d: &'a [u16],
    pub qs: &'a [i8],
}

/// Q5_0 rows: per block an f16 scale, 32 high bits and 16 bytes of nibbles.
pub struct Q5_0<'a> {
    pub nb: usize,
    pub d: &'a [u16],
    pub qh: &'a [u32],
    pub qs: &'a [u8],
}

/// Rows the signed tile reads: two blocks at a time (the same block of two rows) as 64
/// signed bytes, with their scales spread over the lanes of the 32-bit sums each block's
/// values fall in.
trait SignedPairs {
    /// Blocks per row.
    fn nb(&self) -> usize;
    /// Rows held.
    fn rows(&self) -> usize;
    /// Blocks `first` and `second` (by their index in the matrix; zeros where `second` is
    /// `None`) and their scales in lanes 0 and 1, requesting the weights `rows_ahead` rows on.
    ///
    /// # Safety
    /// The features run here; the blocks lie inside the matrix.
    unsafe fn pair(
        &self,
        first: usize,
        second: Option<usize>,
        rows_ahead: usize,
    ) -> (__m512i, __m128);
}

impl SignedPairs for Q8_0<'_> {
    fn nb(&self) -> usize {
        self.nb
    }

    fn rows(&self) -> usize {
        self.d.len() / self.nb
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c")]
    #[inline]
    unsafe fn pair(
        &self,
        first: usize,
        second: Option<usize>,
        rows_ahead: usize,
    ) -> (__m512i, __m128) {
        let ahead = rows_ahead * self.nb * BLOCK + PREFETCH_BYTES;
        if second == Some(first + 1) {
            // One row's two blocks lie side by side: one load (a decoded token's path).
            let p = self.qs[first * BLOCK..(first + 2) * BLOCK].as_ptr();
            prefetch_ahead(p.cast(), first * BLOCK, ahead);
            // SAFETY: the two blocks' 64 bytes (sliced just above).
            let values = unsafe { _mm512_loadu_si512(p.cast()) };
            return (values, half_pair_scales(self.d, first, second));
        }
        let block = |b: usize| {
            let p = self.qs[b * BLOCK..(b + 1) * BLOCK].as_ptr();
            prefetch_ahead(p.cast(), b * BLOCK, ahead);
            // SAFETY: the block's 32 bytes (sliced just above).
            unsafe { _mm256_loadu_si256(p.cast()) }
        };
        let high = second.map_or(_mm256_setzero_si256(), block);
        let values = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(block(first)), high);
        (values, half_pair_scales(self.d, first, second))
    }
}

impl SignedPairs for Q5_0<'_> {
    fn nb(&self) -> usize {
        self.nb
    }

    fn rows(&self) -> usize {
        self.d.len() / self.nb
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c")]
    #[inline]
    unsafe fn pair(
        &self,
        first: usize,
        second: Option<usize>,
        rows_ahead: usize,
    ) -> (__m512i, __m128) {
        let ahead = rows_ahead * self.nb * 16 + PREFETCH_BYTES;
        let nibbles_of = |b: usize| {
            let p = self.qs[b * 16..(b + 1) * 16].as_ptr();
            prefetch_ahead(p, b * 16, ahead);
            // SAFETY: the block's 16 bytes (sliced just above).
            unsafe { _mm_loadu_si128(p.cast()) }
        };
        let raw = if second == Some(first + 1) {
            // One row's two blocks lie side by side: one load (a decoded token's path).
            let p = self.qs[first * 16..(first + 2) * 16].as_ptr();
            prefetch_ahead(p, first * 16, ahead);
            // SAFETY: the two blocks' 32 bytes (sliced just above).
            unsafe { _mm256_loadu_si256(p.cast()) }
        } else {
            let second_nibbles = second.map_or(_mm_setzero_si128(), nibbles_of);
            _mm256_set_m128i(second_nibbles, nibbles_of(first))
        };
        let nibbles = pair_nibbles(raw);
        let high = u64::from(self.qh[first]) | second.map_or(0, |b| u64::from(self.qh[b]) << 32);
        // q − 16: the nibble where the high bit is set, the nibble − 16 (top bits set)
        // where not; nothing past a lone block.
        let low_only = _mm512_or_si512(nibbles, _mm512_set1_epi8(0xF0u8 as i8));
        let values = _mm512_mask_mov_epi8(low_only, high, nibbles);
        let present: __mmask64 = if second.is_some() { !0 } else { 0xFFFF_FFFF };
        let scales = half_pair_scales(self.d, first, second);
        (_mm512_maskz_mov_epi8(present, values), scales)
    }
}

/// Two consecutive scales spread over a register: lanes 0..8 the first, 8..16 the second
/// (zero where `two` is false: a row's odd last block).
#[target_feature(enable = "avx512f")]
unsafe fn pair_scales(p: *const f32, two: bool) -> __m512 {
    // SAFETY: the caller's guarantee.
    spread_pair(unsafe { pair_floats(p, two) })
}

/// Two consecutive floats in lanes 0 and 1 (the second zero where `two` is false).
///
/// # Safety
/// `p` holds two floats, or one where `two` is false.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn pair_floats(p: *const f32, two: bool) -> __m128 {
    // SAFETY: the caller's guarantee.
    unsafe {
        if two {
            _mm_castpd_ps(_mm_load_sd(p.cast::<f64>()))
        } else {
            _mm_load_ss(p)
        }
    }
}

/// Two consecutive Q4_1 blocks' nibbles (32 bytes), or one's and zeros.
///
/// # Safety
/// `p` holds 32 bytes, or 16 where `two` is false.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn pair_packed_nibbles(p: *const u8, two: bool) -> __m256i {
    // SAFETY: the caller's guarantee.
    unsafe {
        if two {
            _mm256_loadu_si256(p.cast())
        } else {
            _mm256_zextsi128_si256(_mm_loadu_si128(p.cast()))
        }
    }
}

/// Blocks `first` and `second`'s f16 scales, converted exactly, in lanes 0 and 1 (zero for a
/// missing second).
#[target_feature(enable = "avx512f,f16c")]
fn half_pair_scales(d: &[u16], first: usize, second: Option<usize>) -> __m128 {
    let bits = u32::from(d[first]) | second.map_or(0, |b| u32::from(d[b]) << 16);
    _mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32))
}

/// Lanes 0 and 1 of `v` over lanes 0..8 and 8..16.
#[target_feature(enable = "avx512f")]
fn spread_pair(v: __m128) -> __m512 {
    let spread = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    _mm512_permutexvar_ps(spread, _mm512_zextps128_ps512(v))
}

/// Two blocks' nibbles (16 bytes each, the first in the low half of `raw`) as 64 bytes in
/// element order: the first block's 32 values, then the second's.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
fn pair_nibbles(raw: __m256i) -> __m512i {
    // 128-bit lanes: [b low, b+1 low, b high, b+1 high] nibbles, reordered to
    // [b low, b high, b+1 low, b+1 high]: elements 0..32 of b, then of b+1.
    let both = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(raw), _mm256_srli_epi16::<4>(raw));
    _mm512_and_si512(
        _mm512_shuffle_i64x2::<0b11_01_10_00>(both, both),
        _mm512_set1_epi8(0x0F),
    )
}

/// Two blocks of activations (64 bytes), or one and zeros.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn pair_bytes(p: *const i8, two: bool) -> __m512i {
    // SAFETY: the caller's pointer holds 64 bytes, or 32 where `two` is false (the masked
    // load reads no byte past them and cannot fault there).
    unsafe {
        if two {
            _mm512_loadu_si512(p.cast())
        } else {
            _mm512_maskz_loadu_epi8(0xFFFF_FFFF, p)
        }
    }
}

/// Token `x`'s activations and scales for blocks `b` and `b + 1` (or `b` alone).
///
/// # Safety
/// `x` holds block `b`, and block `b + 1` where `two` is true.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
unsafe fn activation_pair(x: &QActs, b: usize, two: bool) -> (__m512i, __m512) {
    // SAFETY: the caller's guarantee.
    let (bytes, scales) = unsafe { token_pair(x, b, two) };
    (bytes, spread_pair(scales))
}

/// [`activation_pair`] with the two scales in lanes 0 and 1, not yet spread (a decoded row
/// multiplies them by its own first).
///
/// # Safety
/// As [`activation_pair`].
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
unsafe fn token_pair(x: &QActs, b: usize, two: bool) -> (__m512i, __m128) {
    // SAFETY: the caller's guarantee.
    unsafe {
        (
            pair_bytes(x.qs.as_ptr().add(b * BLOCK), two),
            pair_floats(x.d.as_ptr().add(b), two),
        )
    }
}

/// Requests the line `ahead` bytes past `p` when `at` starts a cache line.
#[inline(always)]
fn prefetch_ahead(p: *const u8, at: usize, ahead: usize) {
    if at.is_multiple_of(64) {
        // SAFETY: SSE is part of x86-64; a prefetch never faults and reads nothing the
        // program sees, so the address may lie past the row (the next rows follow).
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(ahead).cast()) };
    }
}

impl Tiles for Q4_1<'_> {
    /// The first row: Q4_1's nibbles are read in place.
    type Rows = usize;

    /// Two rows read in place for a decoded token: [`Q4_1::rows_in_place`] of two.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c,avx2,fma")]
    unsafe fn two(&self, r: usize, x: &QActs) -> [f32; 2] {
        // SAFETY: the caller's guarantees.
        unsafe { self.rows_in_place::<2>(r, x) }
    }

    /// One row read in place for a decoded token: [`Q4_1::rows_in_place`] of one.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c,avx2,fma")]
    unsafe fn one(&self, r: usize, x: &QActs) -> f32 {
        // SAFETY: the caller's guarantees.
        let [value] = unsafe { self.rows_in_place::<1>(r, x) };
        value
    }

    unsafe fn prepare<const R: usize>(&self, first: usize, rows: &mut usize) {
        *rows = first;
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c,avx2,fma")]
    unsafe fn tile<const R: usize, const T: usize>(
        &self,
        &first: &usize,
        x: [&QActs; T],
    ) -> [[f32; T]; R] {
        let nb = self.nb;
        assert!((first + R) * nb <= self.d.len(), "rows past the matrix");
        assert!(
            x.iter()
                .all(|xj| xj.qs.len() >= nb * BLOCK && xj.d.len() >= nb && xj.sum.len() >= nb)
        );
        // The rows of a tile are read side by side: look past the whole tile.
        let ahead = R * nb * 16 + PREFETCH_BYTES;
        let mut acc = [[_mm256_setzero_ps(); T]; R];
        for b in (0..nb).step_by(2) {
            let two = b + 1 < nb;
            let mut w = [_mm512_setzero_si512(); R];
            let mut dw = [_mm512_setzero_ps(); R];
            for i in 0..R {
                let block = (first + i) * nb + b;
                let p = self.qs[block * 16..].as_ptr();
                prefetch_ahead(p, block * 16, ahead);
                // SAFETY: block `block` (and the next when `two`) lies inside the row.
                w[i] = pair_nibbles(unsafe { pair_packed_nibbles(p, two) });
                // SAFETY: the row's scales hold block `block` (and the next when `two`).
                dw[i] = unsafe { pair_scales(self.d[block..].as_ptr(), two) };
            }
            for (j, xj) in x.iter().enumerate() {
                // SAFETY: every token holds `nb` blocks (checked on entry).
                let (xv, dx) = unsafe { activation_pair(xj, b, two) };
                for i in 0..R {
                    let dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[i], xv);
                    acc[i][j] = add_pair_as_tinyblas(acc[i][j], dot, dw[i], dx);
                }
            }
        }
        // Σ minimum · Σ x over the blocks in a chain of its own, added after the lanes' sum
        // as `ggml_vec_dot_q4_1_q8_1` adds it. (Interleaved with the blocks' steps above, its
        // slices per block cost a tile more than the overlap won.)
        let mut out = [[0f32; T]; R];
        for i in 0..R {
            let m = &self.m[(first + i) * nb..(first + i + 1) * nb];
            for (j, xj) in x.iter().enumerate() {
                let mins = m
                    .iter()
                    .zip(&xj.sum)
                    .fold(0f32, |a, (&m, &s)| m.mul_add(s, a));
                out[i][j] = avx2::hsum(acc[i][j]) + mins;
            }
        }
        out
    }
}

/// The signed formats' tiles are one tile over [`SignedPairs`].
macro_rules! signed_tiles {
    ($($format:ident),*) => {$(
        impl Tiles for $format<'_> {
            type Rows = SignedRows;

            #[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c")]
            unsafe fn prepare<const R: usize>(&self, first: usize, rows: &mut SignedRows) {
                // SAFETY: the caller's guarantees.
                unsafe { rows.unpack::<R>(self, first) }
            }

            #[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c,avx2,fma")]
            unsafe fn tile<const R: usize, const T: usize>(
                &self,
                rows: &SignedRows,
                x: [&QActs; T],
            ) -> [[f32; T]; R] {
                let (nb, pairs) = (self.nb, R.div_ceil(2));
                assert_eq!(rows.weights.len(), nb * pairs, "rows readied for R");
                let weights = |b: usize, p: usize| {
                    (rows.weights[b * pairs + p], rows.scales[b * pairs + p])
                };
                // SAFETY: the caller's guarantees.
                unsafe { signed_tile::<R, T>(weights, nb, x) }
            }

            /// One row read in place, two of its blocks a register: a decoded token reads
            /// each row once, so unpacking it to memory first would only add a store and a
            /// load, and two rows read side by side fall behind the prefetcher.
            #[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c,avx2,fma")]
            unsafe fn one(&self, r: usize, x: &QActs) -> f32 {
                let nb = self.nb;
                assert!(r < self.rows(), "rows past the matrix");
                assert!(x.qs.len() >= nb * BLOCK && x.d.len() >= nb);
                let zero = _mm512_setzero_si512();
                let offset = _mm512_set1_epi8(i8::MIN);
                let mut acc = _mm256_setzero_ps();
                for b in (0..nb).step_by(2) {
                    let second = (b + 1 < nb).then(|| r * nb + b + 1);
                    // SAFETY: the blocks lie inside row `r` and `x` (asserted above).
                    let ((w, dw), (xv, dx)) = unsafe {
                        (
                            unsigned_pair(self, r * nb + b, second, 1),
                            token_pair(x, b, second.is_some()),
                        )
                    };
                    // The weights are read as w + 128: each sum starts from −128 · Σx.
                    let start = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, offset, xv));
                    let dot = _mm512_dpbusd_epi32(start, w, xv);
                    let scales = spread_pair(_mm_mul_ps(dw, dx));
                    acc = add_scaled_pair(acc, dot, scales);
                }
                avx2::hsum(acc)
            }
        }
    )*};
}

signed_tiles!(Q8_0, Q5_0);

/// Rows of a signed format unpacked once for every token a task reads them with (Q5_0's
/// unpacking alone cost as much as its products): per block and pair of rows, as
/// [`unsigned_pair`] gives them.
#[derive(Default)]
pub struct SignedRows {
    weights: Vec<__m512i>,
    scales: Vec<__m512>,
}

impl SignedRows {
    /// Unpacks rows `first..first + R` of `m`.
    ///
    /// # Safety
    /// As for [`Tiles::prepare`].
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c")]
    unsafe fn unpack<const R: usize>(&mut self, m: &impl SignedPairs, first: usize) {
        let nb = m.nb();
        assert!(first + R <= m.rows(), "rows past the matrix");
        self.weights.clear();
        self.scales.clear();
        for b in 0..nb {
            for i in (0..R).step_by(2) {
                let second = (i + 1 < R).then(|| (first + i + 1) * nb + b);
                // SAFETY: block `b` of the rows lies inside the matrix.
                let (w, d) = unsafe { unsigned_pair(m, (first + i) * nb + b, second, R) };
                self.weights.push(w);
                self.scales.push(spread_pair(d));
            }
        }
    }
}

/// [`SignedPairs::pair`] with the weights as unsigned bytes w + 128: vpdpbusd multiplies
/// unsigned by signed bytes, and [`signed_tile`] takes 128 · Σx back off.
///
/// # Safety
/// As for [`SignedPairs::pair`].
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c")]
#[inline]
unsafe fn unsigned_pair(
    m: &impl SignedPairs,
    first: usize,
    second: Option<usize>,
    rows_ahead: usize,
) -> (__m512i, __m128) {
    // SAFETY: the caller's guarantees.
    let (w, d) = unsafe { m.pair(first, second, rows_ahead) };
    (_mm512_xor_si512(w, _mm512_set1_epi8(i8::MIN)), d)
}

/// The tile of rows read as signed bytes (Q8_0's, Q5_0's widened) of `nb` blocks:
/// `weights(b, p)` is block `b` of rows `2p` and `2p + 1` as [`unsigned_pair`] gives it,
/// unpacked beforehand or in place. Each register holds one block of two rows, so a fused
/// multiply-add takes each of their sums one block on, in llama.cpp's tinyBLAS order: eight
/// lanes of four products, one fused multiply-add a block, then `hsum`.
///
/// # Safety
/// As for [`Tiles::tile`].
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c,avx2,fma")]
#[inline]
unsafe fn signed_tile<const R: usize, const T: usize>(
    weights: impl Fn(usize, usize) -> (__m512i, __m512),
    nb: usize,
    x: [&QActs; T],
) -> [[f32; T]; R] {
    let zero = _mm512_setzero_si512();
    assert!(
        x.iter()
            .all(|xj| xj.qs.len() >= nb * BLOCK && xj.d.len() >= nb)
    );
    let offset = _mm512_set1_epi8(i8::MIN);
    let pairs = R.div_ceil(2);
    let mut acc = [[_mm512_setzero_ps(); T]; R];
    for b in 0..nb {
        let mut w = [zero; R];
        let mut dw = [_mm512_setzero_ps(); R];
        for p in 0..pairs {
            (w[p], dw[p]) = weights(b, p);
        }
        for (j, xj) in x.iter().enumerate() {
            // SAFETY: every token holds `nb` blocks (checked on entry).
            let a = unsafe { _mm256_loadu_si256(xj.qs.as_ptr().add(b * BLOCK).cast()) };
            let xv = _mm512_broadcast_i64x4(a);
            let dx = _mm512_set1_ps(xj.d[b]);
            // Each sum starts from −128 · Σx over its four bytes: with the weights read as
            // w + 128, the integer sums are w · x exactly.
            let start = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, offset, xv));
            for p in 0..pairs {
                let dot = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(start, w[p], xv));
                acc[p][j] = _mm512_fmadd_ps(_mm512_mul_ps(dw[p], dx), dot, acc[p][j]);
            }
        }
    }
    let mut out = [[0f32; T]; R];
    for i in 0..R {
        for j in 0..T {
            let both = acc[i / 2][j];
            let half = if i % 2 == 0 {
                _mm512_castps512_ps256(both)
            } else {
                _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(both)))
            };
            out[i][j] = avx2::hsum(half);
        }
    }
    out
}

/// `acc` plus a pair of blocks' products as llama.cpp's tinyBLAS adds one block's on AVX2:
/// the block's eight sums of four products, scaled by the product of its two scales, in one
/// fused multiply-add into eight lanes; block `b`, then block `b + 1`. (Both blocks in one
/// 16-lane step would be a different sum, and llama.cpp's greedy answers follow this one.)
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
fn add_pair_as_tinyblas(
    acc: __m256,
    dot: __m512i,
    weight_scales: __m512,
    act_scales: __m512,
) -> __m256 {
    add_scaled_pair(acc, dot, _mm512_mul_ps(weight_scales, act_scales))
}

/// [`add_pair_as_tinyblas`] with the blocks' products of scales already spread (lanes 0..8
/// the first block's, 8..16 the second's).
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
fn add_scaled_pair(acc: __m256, dot: __m512i, scales: __m512) -> __m256 {
    let sums = _mm512_cvtepi32_ps(dot);
    let high = |v: __m512| _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
    let first = _mm256_fmadd_ps(
        _mm512_castps512_ps256(scales),
        _mm512_castps512_ps256(sums),
        acc,
    );
    _mm256_fmadd_ps(high(scales), high(sums), first)
}

/// `out[k * xs.len() + t]` = row `first + k` · `xs[t]` for `k < count`, by tiles of up to
/// [`TILE_ROWS`] rows × [`TILE_TOKENS`] tokens.
///
/// # Safety
/// As for [`Tiles::tile`].
pub unsafe fn fill<K: Tiles>(
    kernel: &K,
    first: usize,
    count: usize,
    xs: &[QActs],
    out: &mut [f32],
) {
    assert_eq!(
        out.len(),
        count * xs.len(),
        "a value for every row and token"
    );
    let n = xs.len();
    // One token (decoding) reads every weight once: row by row and in place its stream stays
    // ahead of the prefetcher, where rows side by side, or unpacked first, decoded slower.
    if n == 1 {
        let mut pairs = out.chunks_exact_mut(2);
        for (k, o) in (&mut pairs).enumerate() {
            // SAFETY: the caller's guarantees, for these rows.
            o.copy_from_slice(&unsafe { kernel.two(first + 2 * k, &xs[0]) });
        }
        if let [o] = pairs.into_remainder() {
            // SAFETY: as above.
            *o = unsafe { kernel.one(first + count - 1, &xs[0]) };
        }
        return;
    }
    let mut ready = K::Rows::default();
    // A block of tokens at a time against the task's rows: a long prompt's activations
    // (1.9 KB a token for a 1,536-wide input) would not stay in L2 for every group of rows.
    for t0 in (0..n).step_by(TOKEN_BLOCK) {
        let tokens = t0..(t0 + TOKEN_BLOCK).min(n);
        let mut k = 0;
        while k + TILE_ROWS <= count {
            // SAFETY: the caller's guarantees, for these rows.
            unsafe {
                rows::<K, TILE_ROWS>(kernel, (first, k), xs, tokens.clone(), out, &mut ready)
            };
            k += TILE_ROWS;
        }
        while k < count {
            // SAFETY: as above.
            unsafe { rows::<K, 1>(kernel, (first, k), xs, tokens.clone(), out, &mut ready) };
            k += 1;
        }
    }
}

/// `R` rows from `first + k` against `tokens`, by tiles of [`TILE_TOKENS`] and then one,
/// readied once in `ready` for all of them.
unsafe fn rows<K: Tiles, const R: usize>(
    kernel: &K,
    (first, k): (usize, usize),
    xs: &[QActs],
    tokens: std::ops::Range<usize>,
    out: &mut [f32],
    ready: &mut K::Rows,
) {
    let n = xs.len();
    let mut store = |t: usize, values: &[f32], i: usize| {
        for (j, &v) in values.iter().enumerate() {
            out[(k + i) * n + t + j] = v;
        }
    };
    // SAFETY: the caller's guarantees.
    unsafe { kernel.prepare::<R>(first + k, ready) };
    let mut t = tokens.start;
    while t + TILE_TOKENS <= tokens.end {
        // SAFETY: the caller's guarantees.
        let tile =
            unsafe { kernel.tile::<R, TILE_TOKENS>(ready, std::array::from_fn(|j| &xs[t + j])) };
        for (i, values) in tile.iter().enumerate() {
            store(t, values, i);
        }
        t += TILE_TOKENS;
    }
    while t < tokens.end {
        // SAFETY: the caller's guarantees.
        let tile = unsafe { kernel.tile::<R, 1>(ready, [&xs[t]]) };
        for (i, values) in tile.iter().enumerate() {
            store(t, values, i);
        }
        t += 1;
    }
}
