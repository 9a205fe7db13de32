//! AVX2 kernels for the formats of the default model (the portable loops of `qmatrix.rs`
//! are the reference they are tested against).

use std::arch::x86_64::*;
use std::sync::OnceLock;

use super::{
    BLOCK, FormatKernels, KernelTable, PORTABLE_FORMAT, QActs, QK_K, QMatrix, RowBlocks,
    each_row_and_token, f16_to_f32,
    super_blocks::{self, IntSums, Q4KRow, Q6KRow},
};

/// Whether this machine runs them (AVX2 and FMA, detected once).
pub fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"))
}

/// This family's kernel for each format. Every entry is safe to call only where AVX2 and FMA
/// run, which [`super::Kernels::table`] checks before handing the table out.
pub(super) const TABLE: KernelTable = KernelTable {
    q4_1: WITH_MIN,
    q5_1: WITH_MIN,
    q4_0: ONE_AT_A_TIME,
    q8_0: SIGNED,
    q5_0: SIGNED,
    q4k: K_QUANT_LANES,
    q6k: K_QUANT_LANES,
    f32: PORTABLE_FORMAT,
};

/// Each row and token alone.
const ONE_AT_A_TIME: FormatKernels = FormatKernels {
    dot: row_dot,
    rows: None,
};

/// The K-quants: eight rows side by side (`avx2_k_quants`), single rows where a token's
/// order or the rows left over call for the one-row kernel.
const K_QUANT_LANES: FormatKernels = FormatKernels {
    dot: row_dot,
    rows: Some(super::avx2_k_quants::rows),
};

/// The formats read as 32 unsigned values, a scale and a minimum a block (Q4_1's nibbles,
/// the widened Q5_1's bytes).
const WITH_MIN: FormatKernels = FormatKernels {
    dot: row_dot,
    rows: Some(rows_with_min),
};

/// The formats read as 32 signed bytes a block (Q8_0, and Q5_0 widened to them).
const SIGNED: FormatKernels = FormatKernels {
    dot: row_dot,
    rows: Some(rows_signed),
};

/// Row `r` · `x` with the format's AVX2 kernel.
fn row_dot(w: &QMatrix, r: usize, x: &QActs) -> f32 {
    // SAFETY (each call): AVX2 and FMA run here (see `TABLE`); the slices hold the row's
    // blocks, and `x` as many.
    match w.row_blocks(r) {
        RowBlocks::Q4_1 { d, m, qs } => unsafe { dot_with_min(Q4Row { d, m, qs }, x) },
        RowBlocks::Q5_1 { d, m, qs } => unsafe { dot_with_min(Q5MinRow { d, m, qs }, x) },
        RowBlocks::Q4_0 { d, qs } => unsafe { dot_q4_0(d, qs, x) },
        RowBlocks::Q8_0 { d, qs } => unsafe { dot_signed(Q8Row { d, qs }, x) },
        RowBlocks::Q5_0 { d, qh, qs } => unsafe { dot_signed(Q5Row { d, qh, qs }, x) },
        blocks @ (RowBlocks::Q4K { .. } | RowBlocks::Q6K { .. }) => unsafe {
            k_quant_dot(blocks, x)
        },
        RowBlocks::Other => w.dot_row_portable(r, x),
    }
}

/// Rows with a minimum: a decoded token's chunk in one call, a prompt's tokens four at a time.
fn rows_with_min(w: &QMatrix, first: usize, _count: usize, xs: &[QActs], out: &mut [f32]) {
    if let [x] = xs {
        // SAFETY: AVX2 and FMA run here (see `TABLE`).
        return unsafe { dot_rows_with_min(w, first, x, out) };
    }
    by_fours(w, first, xs, out, |blocks, four| match blocks {
        // SAFETY (each call): as in `row_dot`.
        RowBlocks::Q4_1 { d, m, qs } => Some(unsafe { dot_with_min_x4(Q4Row { d, m, qs }, four) }),
        RowBlocks::Q5_1 { d, m, qs } => {
            Some(unsafe { dot_with_min_x4(Q5MinRow { d, m, qs }, four) })
        }
        _ => None,
    });
}

/// Signed-byte rows: a decoded token's chunk in one call, a prompt's tokens four at a time.
fn rows_signed(w: &QMatrix, first: usize, _count: usize, xs: &[QActs], out: &mut [f32]) {
    if let [x] = xs {
        // SAFETY: AVX2 and FMA run here (see `TABLE`).
        return unsafe { dot_rows_signed(w, first, x, out) };
    }
    by_fours(w, first, xs, out, |blocks, four| match blocks {
        // SAFETY (each call): as in `row_dot`.
        RowBlocks::Q8_0 { d, qs } => Some(unsafe { dot_signed_x4(Q8Row { d, qs }, four) }),
        RowBlocks::Q5_0 { d, qh, qs } => Some(unsafe { dot_signed_x4(Q5Row { d, qh, qs }, four) }),
        _ => None,
    });
}

/// Each row against four tokens a pass (each weight block unpacked once for them) with
/// `four`, and the tokens left over one at a time.
fn by_fours(
    w: &QMatrix,
    first: usize,
    xs: &[QActs],
    out: &mut [f32],
    four: impl Fn(RowBlocks<'_>, [&QActs; 4]) -> Option<[f32; 4]>,
) {
    let n = xs.len();
    for (k, values) in out.chunks_mut(n).enumerate() {
        let r = first + k;
        let mut t = 0;
        while t + 4 <= n {
            let tokens = [&xs[t], &xs[t + 1], &xs[t + 2], &xs[t + 3]];
            let Some(v) = four(w.row_blocks(r), tokens) else {
                break;
            };
            values[t..t + 4].copy_from_slice(&v);
            t += 4;
        }
        each_row_and_token(row_dot, w, r, &xs[t..], &mut values[t..]);
    }
}

/// The sum of eight lanes as ggml's `hsum_float_8` adds them: the upper half onto the lower,
/// lanes 2 and 3 onto 0 and 1, lane 1 onto 0.
#[target_feature(enable = "avx2,fma")]
pub(super) fn hsum(v: __m256) -> f32 {
    let lo = _mm256_castps256_ps128(v);
    let hi = _mm256_extractf128_ps(v, 1);
    let s = _mm_add_ps(lo, hi);
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    _mm_cvtss_f32(s)
}

/// The sum of eight integer lanes (exact in any order).
#[target_feature(enable = "avx2")]
#[inline]
fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01>(s));
    _mm_cvtsi128_si32(s)
}

/// How far ahead of the block being read the weights are requested. Decoding one token
/// reads every weight once; without the hint each row's first cache lines arrive only
/// when asked for, and the kernel waits on memory.
const PREFETCH_BYTES: usize = 1024;

/// Requests the cache line `PREFETCH_BYTES` past byte `at` of `bytes`, once per line.
#[inline(always)]
pub(super) fn prefetch_ahead<T>(bytes: &[T], at: usize) {
    if at.is_multiple_of(64) {
        // A prefetch never faults, so the address may lie past the slice (the next
        // rows follow in memory).
        let p = bytes
            .as_ptr()
            .cast::<i8>()
            .wrapping_add(at + PREFETCH_BYTES);
        // SAFETY: SSE is part of x86-64; a prefetch reads nothing the program sees.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p) };
    }
}

/// A row whose blocks the kernels with a minimum read as 32 unsigned values below 128, an
/// f32 scale and an f32 minimum: `BLOCK_BYTES` bytes a block, 16 of nibbles (Q4_1, low
/// nibbles elements 0..16) or 32 of bytes (the widened Q5_1).
#[derive(Clone, Copy)]
struct MinRow<'a, const BLOCK_BYTES: usize> {
    d: &'a [f32],
    m: &'a [f32],
    qs: &'a [u8],
}

/// A Q4_1 row.
type Q4Row<'a> = MinRow<'a, 16>;
/// A widened Q5_1 row.
type Q5MinRow<'a> = MinRow<'a, BLOCK>;

impl<const BLOCK_BYTES: usize> MinRow<'_, BLOCK_BYTES> {
    /// Block `b`'s values.
    ///
    /// # Safety
    /// AVX2 runs here, and `b` is below the number of scales.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn values(self, b: usize) -> __m256i {
        debug_assert!(
            (b + 1) * BLOCK_BYTES <= self.qs.len(),
            "block inside the row"
        );
        prefetch_ahead(self.qs, b * BLOCK_BYTES);
        let at = self.qs.as_ptr().wrapping_add(b * BLOCK_BYTES);
        if BLOCK_BYTES == BLOCK {
            // SAFETY: the caller's guarantee; a row's bytes are 32 per scale.
            return unsafe { _mm256_loadu_si256(at as *const __m256i) };
        }
        // SAFETY: the caller's guarantee; a row's nibbles are 16 bytes per scale.
        let raw = unsafe { _mm_loadu_si128(at as *const __m128i) };
        _mm256_and_si256(
            _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw),
            _mm256_set1_epi8(0x0F),
        )
    }
}

/// Σ over blocks of d·dx·Σ(q·qx) + m·sum_x, for one row with minimums.
///
/// # Safety
/// AVX2 and FMA run here, and `x` holds the row's blocks.
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_with_min<const N: usize>(row: MinRow<'_, N>, x: &QActs) -> f32 {
    let ones = _mm256_set1_epi16(1);
    let mut acc = _mm256_setzero_ps();
    let mut mins = 0f32;
    for (b, (&d, &m)) in row.d.iter().zip(row.m).enumerate() {
        // SAFETY: block b lies inside the row and `x` (the caller's guarantee).
        let (w, xv) = unsafe { (row.values(b), activation_block(x, b)) };
        let sum32 = _mm256_madd_epi16(_mm256_maddubs_epi16(w, xv), ones);
        let scale = _mm256_set1_ps(d * x.d[b]);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum32), scale, acc);
        mins = m.mul_add(x.sum[b], mins);
    }
    hsum(acc) + mins
}

/// [`dot_with_min`] for the rows from `first`, one result per row of `out`, in one call so
/// the loop runs with the kernel's features.
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_rows_with_min(w: &QMatrix, first: usize, x: &QActs, out: &mut [f32]) {
    for (k, o) in out.iter_mut().enumerate() {
        // SAFETY (each call): the row's slices hold its blocks, and `x` as many.
        *o = match w.row_blocks(first + k) {
            RowBlocks::Q4_1 { d, m, qs } => unsafe { dot_with_min(Q4Row { d, m, qs }, x) },
            RowBlocks::Q5_1 { d, m, qs } => unsafe { dot_with_min(Q5MinRow { d, m, qs }, x) },
            _ => row_dot(w, first + k, x),
        };
    }
}

/// [`dot_signed`] for the rows from `first`, one result per row of `out`, in one call so the
/// loop runs with the kernel's features.
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_rows_signed(w: &QMatrix, first: usize, x: &QActs, out: &mut [f32]) {
    for (k, o) in out.iter_mut().enumerate() {
        // SAFETY (each call): the row's slices hold its blocks, and `x` as many.
        *o = match w.row_blocks(first + k) {
            RowBlocks::Q8_0 { d, qs } => unsafe { dot_signed(Q8Row { d, qs }, x) },
            RowBlocks::Q5_0 { d, qh, qs } => unsafe { dot_signed(Q5Row { d, qh, qs }, x) },
            _ => row_dot(w, first + k, x),
        };
    }
}

/// [`dot_with_min`] for four activation vectors: the same operations in the same order for
/// each, with the row's values unpacked once.
///
/// # Safety
/// As for [`dot_with_min`], for every token.
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_with_min_x4<const N: usize>(row: MinRow<'_, N>, x: [&QActs; 4]) -> [f32; 4] {
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut mins = [0f32; 4];
    for (b, (&d, &m)) in row.d.iter().zip(row.m).enumerate() {
        // SAFETY: block b lies inside the row (the caller's guarantee).
        let w = unsafe { row.values(b) };
        for j in 0..4 {
            // SAFETY: block b lies inside every `x[j].qs` (32 bytes a block).
            let xv = unsafe { activation_block(x[j], b) };
            let sum32 = _mm256_madd_epi16(_mm256_maddubs_epi16(w, xv), ones);
            let scale = _mm256_set1_ps(d * x[j].d[b]);
            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum32), scale, acc[j]);
            mins[j] = m.mul_add(x[j].sum[b], mins[j]);
        }
    }
    [
        hsum(acc[0]) + mins[0],
        hsum(acc[1]) + mins[1],
        hsum(acc[2]) + mins[2],
        hsum(acc[3]) + mins[3],
    ]
}

/// [`dot_signed`] for four activation vectors, the row's bytes loaded once.
///
/// # Safety
/// As for [`dot_signed`], for every token.
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_signed_x4<'a, R: SignedBlocks<'a>>(row: R, x: [&QActs; 4]) -> [f32; 4] {
    let mut acc = [_mm256_setzero_ps(); 4];
    for b in 0..row.blocks() {
        // SAFETY: block b lies inside the row (the caller's guarantee).
        let w = unsafe { row.bytes(b) };
        let db = row.scale(b);
        for j in 0..4 {
            // SAFETY: block b lies inside every `x[j].qs` (32 bytes a block).
            let xv = unsafe { activation_block(x[j], b) };
            acc[j] = _mm256_fmadd_ps(
                _mm256_cvtepi32_ps(signed_sums(w, xv)),
                _mm256_set1_ps(db * x[j].d[b]),
                acc[j],
            );
        }
    }
    [hsum(acc[0]), hsum(acc[1]), hsum(acc[2]), hsum(acc[3])]
}

/// Σ over blocks of d·dx·Σ((q − 8)·qx), for one Q4_0 row.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn dot_q4_0(d: &[f32], qs: &[u8], x: &QActs) -> f32 {
    let mask = _mm256_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    let ones8 = _mm256_set1_epi8(1);
    let eight = _mm256_set1_epi32(8);
    let mut acc = _mm256_setzero_ps();
    for (b, &db) in d.iter().enumerate() {
        prefetch_ahead(qs, b * 16);
        // SAFETY: block b lies inside `qs` (16 bytes a block) and `x.qs` (32 a block).
        let (raw, xv) = unsafe {
            (
                _mm_loadu_si128(qs.as_ptr().add(b * 16) as *const __m128i),
                _mm256_loadu_si256(x.qs.as_ptr().add(b * BLOCK) as *const __m256i),
            )
        };
        let w = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), mask);
        let qx = _mm256_madd_epi16(_mm256_maddubs_epi16(w, xv), ones);
        let sx = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, xv), ones);
        let sum32 = _mm256_sub_epi32(qx, _mm256_mullo_epi32(sx, eight));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum32), _mm256_set1_ps(db * x.d[b]), acc);
    }
    hsum(acc)
}

/// A row whose blocks the signed-byte kernels read as 32 signed bytes and a scale.
trait SignedBlocks<'a>: Copy {
    /// The row's f16 scales, one a block.
    fn scales(self) -> &'a [u16];
    /// Blocks in the row.
    fn blocks(self) -> usize {
        self.scales().len()
    }
    /// Block `b`'s scale.
    fn scale(self, b: usize) -> f32 {
        f16_to_f32(self.scales()[b])
    }
    /// Block `b`'s values.
    ///
    /// # Safety
    /// AVX2 runs here, and `b` is below [`Self::blocks`] (a row's slices hold as many
    /// blocks as scales: see `QMatrix::row_blocks`).
    unsafe fn bytes(self, b: usize) -> __m256i;
}

/// A Q8_0 row: f16 scales and the signed bytes themselves.
#[derive(Clone, Copy)]
struct Q8Row<'a> {
    d: &'a [u16],
    qs: &'a [i8],
}

/// A Q5_0 row: f16 scales, high bits and nibbles, widened to `q − 16` a block at a time.
#[derive(Clone, Copy)]
struct Q5Row<'a> {
    d: &'a [u16],
    qh: &'a [u32],
    qs: &'a [u8],
}

impl<'a> SignedBlocks<'a> for Q8Row<'a> {
    fn scales(self) -> &'a [u16] {
        self.d
    }

    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn bytes(self, b: usize) -> __m256i {
        debug_assert!((b + 1) * BLOCK <= self.qs.len(), "block inside the row");
        prefetch_ahead(self.qs, b * BLOCK);
        // SAFETY: the caller's guarantee; a row's bytes are 32 per scale.
        unsafe { _mm256_loadu_si256(self.qs.as_ptr().add(b * BLOCK) as *const __m256i) }
    }
}

impl<'a> SignedBlocks<'a> for Q5Row<'a> {
    fn scales(self) -> &'a [u16] {
        self.d
    }

    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn bytes(self, b: usize) -> __m256i {
        debug_assert!((b + 1) * 16 <= self.qs.len(), "block inside the row");
        prefetch_ahead(self.qs, b * 16);
        // SAFETY: the caller's guarantee; a row's nibbles are 16 bytes per scale.
        let raw = unsafe { _mm_loadu_si128(self.qs.as_ptr().add(b * 16) as *const __m128i) };
        let nibbles = _mm256_and_si256(
            _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw),
            _mm256_set1_epi8(0x0F),
        );
        // Byte j holds byte j / 8 of the high bits; with every bit but j % 8 set, it is all
        // ones exactly where element j's high bit is (llama.cpp's `bytes_from_bits_32`).
        let spread = _mm256_shuffle_epi8(
            _mm256_set1_epi32(self.qh[b] as i32),
            _mm256_set_epi64x(
                0x0303_0303_0303_0303,
                0x0202_0202_0202_0202,
                0x0101_0101_0101_0101,
                0,
            ),
        );
        let others = _mm256_set1_epi64x(0x7FBF_DFEF_F7FB_FDFE);
        let high = _mm256_cmpeq_epi8(_mm256_or_si256(spread, others), _mm256_set1_epi8(-1));
        // q − 16 is the nibble where the high bit is set, and the nibble with the top four
        // bits set (nibble − 16) where it is not.
        _mm256_or_si256(
            nibbles,
            _mm256_andnot_si256(high, _mm256_set1_epi8(0xF0u8 as i8)),
        )
    }
}

/// Σ over blocks of d·dx·Σ(q·qx), for one row of signed-byte blocks.
///
/// # Safety
/// AVX2 and FMA run here, and `x` holds the row's blocks.
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_signed<'a, R: SignedBlocks<'a>>(row: R, x: &QActs) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for b in 0..row.blocks() {
        // SAFETY: block b lies inside the row and `x` (the caller's guarantee).
        let sums = unsafe { signed_sums(row.bytes(b), activation_block(x, b)) };
        acc = _mm256_fmadd_ps(
            _mm256_cvtepi32_ps(sums),
            _mm256_set1_ps(row.scale(b) * x.d[b]),
            acc,
        );
    }
    hsum(acc)
}

/// Block `b` of `x`'s quantized activations.
///
/// # Safety
/// AVX2 runs here, and `x` holds block `b`.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn activation_block(x: &QActs, b: usize) -> __m256i {
    debug_assert!(
        (b + 1) * BLOCK <= x.qs.len(),
        "block inside the activations"
    );
    // SAFETY: the caller's guarantee.
    unsafe { _mm256_loadu_si256(x.qs.as_ptr().add(b * BLOCK) as *const __m256i) }
}

/// A block's products of signed bytes `w` with activations `xv`, summed in fours: i32 lanes
/// 0–3 cover its first 16 values, 4–7 the rest.
#[target_feature(enable = "avx2")]
#[inline]
fn signed_sums(w: __m256i, xv: __m256i) -> __m256i {
    // maddubs needs an unsigned operand: |w| times x with w's sign moved onto x (both at
    // most 127 in magnitude, so a pair's sum fits in i16).
    let sum16 = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(xv, w));
    _mm256_madd_epi16(sum16, _mm256_set1_epi16(1))
}

/// The K-quants' integer sums on AVX2 (`super_blocks` takes the float steps).
struct Avx2;

impl IntSums for Avx2 {
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn q4k(row: &Q4KRow<'_>, s: usize, x: &QActs) -> ([i32; 4], [i32; 4]) {
        // Each pair's sums stay in lanes: the four are reduced together at the end.
        let mut pairs = [_mm256_setzero_si256(); 4];
        for j in 0..8 {
            // SAFETY: the caller's guarantee.
            let products = unsafe { q4k_sub_block(row, s * 8 + j, x) };
            pairs[j / 2] = _mm256_add_epi32(pairs[j / 2], products);
        }
        // hadd(hadd(p0, p1), hadd(p2, p3)) holds each pair's lanes 0–3 then 4–7 in turn.
        let h = _mm256_hadd_epi32(
            _mm256_hadd_epi32(pairs[0], pairs[1]),
            _mm256_hadd_epi32(pairs[2], pairs[3]),
        );
        let scaled = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h));
        // SAFETY: the caller's guarantee.
        let products = unsafe { q4k_min_products(row, s, x) };
        // Neighbours added: pairs 0, 2 in the low half's first lanes, 1, 3 in the high half's.
        let neighbours = _mm256_hadd_epi32(products, products);
        let mins =
            _mm256_permutevar8x32_epi32(neighbours, _mm256_setr_epi32(0, 4, 1, 5, 0, 0, 0, 0));
        let (mut scaled_out, mut mins_out) = ([0i32; 4], [0i32; 4]);
        // SAFETY: each array holds four lanes.
        unsafe {
            _mm_storeu_si128(scaled_out.as_mut_ptr() as *mut __m128i, scaled);
            _mm_storeu_si128(
                mins_out.as_mut_ptr() as *mut __m128i,
                _mm256_castsi256_si128(mins),
            );
        }
        (scaled_out, mins_out)
    }

    /// One register for the whole super-block, and one horizontal sum: a decoded token's
    /// order needs no pair apart.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn q4k_total(row: &Q4KRow<'_>, s: usize, x: &QActs) -> (i32, i32) {
        let mut scaled = _mm256_setzero_si256();
        for b in s * 8..s * 8 + 8 {
            // SAFETY: the caller's guarantee.
            scaled = _mm256_add_epi32(scaled, unsafe { q4k_sub_block(row, b, x) });
        }
        // SAFETY: the caller's guarantee.
        let mins = unsafe { q4k_min_products(row, s, x) };
        (hsum_i32(scaled), hsum_i32(mins))
    }

    /// `ggml_vec_dot_q6_K_q8_K`'s integer steps, each run of 32 values unpacked to bytes.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn q6k(row: &Q6KRow<'_>, s: usize, x: &QActs) -> [i32; 8] {
        // SAFETY (the loads): the super-block lies inside the row and `x`, and each holds
        // 16 scales and 16 sums of sixteens (the caller's guarantee).
        let (scales, sums) = unsafe {
            (
                _mm_loadu_si128(row.sc.as_ptr().add(s * 16) as *const __m128i),
                [0, 8].map(|h| {
                    _mm256_loadu_si256(x.bsums.as_ptr().add(s * 16 + h) as *const __m256i)
                }),
            )
        };
        for line in [0, 64] {
            prefetch_ahead(row.ql, s * 128 + line);
        }
        prefetch_ahead(row.qh, s * 64);
        let bsums16 =
            _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(sums[0], sums[1]));
        let offsets =
            _mm256_slli_epi32::<5>(_mm256_madd_epi16(bsums16, _mm256_cvtepi8_epi16(scales)));
        let mut lanes = _mm256_setzero_si256();
        for c in 0..8 {
            let at = s * QK_K + 32 * c;
            // SAFETY: as above.
            let (q, xv) = unsafe { (q6k_run(row, s, c), activation_block(x, at / BLOCK)) };
            let pairs = _mm256_maddubs_epi16(q, xv);
            // The run's two scales from the register already loaded, each over eight lanes.
            let (first, second) = ((2 * c) as i8, (2 * c + 1) as i8);
            let spread = _mm_setr_epi8(
                first, first, first, first, first, first, first, first, second, second, second,
                second, second, second, second, second,
            );
            let sc = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, spread));
            lanes = _mm256_add_epi32(lanes, _mm256_madd_epi16(sc, pairs));
        }
        let mut out = [0i32; 8];
        // SAFETY: `out` holds eight lanes.
        unsafe {
            _mm256_storeu_si256(
                out.as_mut_ptr() as *mut __m256i,
                _mm256_sub_epi32(lanes, offsets),
            )
        };
        out
    }
}

/// Run `c` of a Q6_K row's super-block `s` (`super_blocks::q6k_run_at`): 32 values, each
/// `q + 32` a byte.
///
/// # Safety
/// AVX2 runs here.
#[target_feature(enable = "avx2")]
#[inline]
fn q6k_run(row: &Q6KRow<'_>, s: usize, c: usize) -> __m256i {
    let (low_at, low_shift, high_at, high_shift) = super_blocks::q6k_run_at(c);
    let (ql, qh) = (
        &row.ql[s * 128 + low_at..][..32],
        &row.qh[s * 64 + high_at..][..32],
    );
    // SAFETY: both slices hold the 32 bytes read.
    let (low, high) = unsafe {
        (
            _mm256_loadu_si256(ql.as_ptr().cast()),
            _mm256_loadu_si256(qh.as_ptr().cast()),
        )
    };
    let shifted = |v: __m256i, by: u32| _mm256_srl_epi16(v, _mm_cvtsi32_si128(by as i32));
    let low = _mm256_and_si256(shifted(low, low_shift), _mm256_set1_epi8(0x0F));
    let high = _mm256_and_si256(shifted(high, high_shift), _mm256_set1_epi8(0x03));
    _mm256_or_si256(low, _mm256_slli_epi16::<4>(high))
}

/// Every value of Q6_K row `r` of `w`, `q + 32` a byte, into `out` (for the lane kernels,
/// which regroup rows' bytes).
///
/// # Safety
/// AVX2 runs here.
#[target_feature(enable = "avx2")]
pub(super) fn q6k_row_bytes(w: &QMatrix, r: usize, out: &mut Vec<u8>) {
    let RowBlocks::Q6K { d, sc, ql, qh } = w.row_blocks(r) else {
        unreachable!("a Q6_K matrix")
    };
    let row = Q6KRow { d, sc, ql, qh };
    for s in 0..d.len() {
        for c in 0..8 {
            let mut run = [0u8; 32];
            // SAFETY: `run` holds 32 bytes.
            unsafe { _mm256_storeu_si256(run.as_mut_ptr().cast(), q6k_run(&row, s, c)) };
            out.extend_from_slice(&run);
        }
    }
}

/// Q4_K sub-block `b`'s products with `x`, times its scale, in eight lanes of sums.
///
/// # Safety
/// AVX2 runs here, and sub-block `b` lies inside the row and `x`.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn q4k_sub_block(row: &Q4KRow<'_>, b: usize, x: &QActs) -> __m256i {
    let words = row.nibble_words(b);
    // SAFETY: `words` holds sixteen bytes; the caller's guarantee for `x`.
    let (raw, xv) = unsafe {
        (
            _mm_loadu_si128(words.as_ptr().cast()),
            activation_block(x, b),
        )
    };
    let q = _mm256_and_si256(
        _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw),
        _mm256_set1_epi8(0x0F),
    );
    let sc = _mm256_set1_epi16(i16::from(row.sc(b)));
    _mm256_madd_epi16(_mm256_maddubs_epi16(q, xv), sc)
}

/// Q4_K super-block `s`'s eight minimums times the sums of `x` over their sub-blocks, in the
/// order hadd leaves those sums: sub-blocks 0, 1, 4, 5 | 2, 3, 6, 7.
///
/// # Safety
/// AVX2 runs here, and super-block `s` lies inside the row and `x`.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn q4k_min_products(row: &Q4KRow<'_>, s: usize, x: &QActs) -> __m256i {
    assert!(x.bsums.len() >= (s + 1) * 16);
    let m: [i32; 8] = std::array::from_fn(|j| i32::from(row.m(s * 8 + j)));
    // SAFETY: the assert above puts the super-block's 16 sums inside; `m` holds eight lanes.
    let (sixteens, m) = unsafe {
        (
            [0, 8].map(|h| _mm256_loadu_si256(x.bsums.as_ptr().add(s * 16 + h) as *const __m256i)),
            _mm256_loadu_si256(m.as_ptr().cast()),
        )
    };
    let sub_blocks = _mm256_hadd_epi32(sixteens[0], sixteens[1]);
    let in_that_order = _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7);
    _mm256_mullo_epi32(sub_blocks, _mm256_permutevar8x32_epi32(m, in_that_order))
}

/// A K-quant row · `x`, in the order `x`'s place in its pass decides.
#[target_feature(enable = "avx2,fma")]
unsafe fn k_quant_dot(row: RowBlocks<'_>, x: &QActs) -> f32 {
    // SAFETY: AVX2 runs here (the caller's guarantee).
    unsafe { super_blocks::dot::<Avx2>(row, x) }
}
