//! AVX2 kernels for the formats of the default model (the portable loops of `qmatrix.rs`
//! are the reference they are tested against).

use std::arch::x86_64::*;
use std::sync::OnceLock;

use super::{
    BLOCK, FormatKernels, KernelTable, PORTABLE_FORMAT, QActs, QMatrix, RowBlocks,
    each_row_and_token,
};

/// Whether this machine runs them (AVX2 and FMA, detected once).
pub fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"))
}

/// This family's kernel for each format. Every entry is safe to call only where AVX2 and FMA
/// run, which [`super::Kernels::table`] checks before handing the table out.
pub(super) const TABLE: KernelTable = KernelTable {
    q4_1: FormatKernels {
        dot: row_dot,
        rows: Some(rows_q4_1),
    },
    q4_0: FormatKernels {
        dot: row_dot,
        rows: None,
    },
    q8_0: FormatKernels {
        dot: row_dot,
        rows: Some(rows_q8_0),
    },
    q6k: FormatKernels {
        dot: row_dot,
        rows: None,
    },
    f32: PORTABLE_FORMAT,
};

/// Row `r` · `x` with the format's AVX2 kernel.
fn row_dot(w: &QMatrix, r: usize, x: &QActs) -> f32 {
    // SAFETY (each call): AVX2 and FMA run here (see `TABLE`); the slices hold the row's
    // blocks, and `x` as many.
    match w.row_blocks(r) {
        RowBlocks::Q4_1 { d, m, qs } => unsafe { dot_q4_1(d, m, qs, x) },
        RowBlocks::Q4_0 { d, qs } => unsafe { dot_q4_0(d, qs, x) },
        RowBlocks::Q8_0 { d, qs } => unsafe { dot_q8_0(d, qs, x) },
        RowBlocks::Q6K { d, qs } => unsafe { dot_q6_k(d, qs, x) },
        RowBlocks::Other => w.dot_row_portable(r, x),
    }
}

/// Q4_1 rows: a decoded token's chunk in one call, a prompt's tokens four at a time.
fn rows_q4_1(w: &QMatrix, first: usize, count: usize, xs: &[QActs], out: &mut [f32]) {
    if let ([x], QMatrix::Q4_1 { cols, d, m, qs, .. }) = (xs, w) {
        let nb = cols / BLOCK;
        let blocks = first * nb..(first + count) * nb;
        let qs = &qs[blocks.start * 16..blocks.end * 16];
        // SAFETY: AVX2 and FMA run here; the slices hold `count` rows of `nb` blocks, and `x`
        // holds `nb` blocks.
        return unsafe { dot_rows_q4_1(nb, &d[blocks.clone()], &m[blocks], qs, x, out) };
    }
    by_fours(w, first, xs, out, |blocks, four| match blocks {
        // SAFETY: as in `row_dot`.
        RowBlocks::Q4_1 { d, m, qs } => Some(unsafe { dot_q4_1_x4(d, m, qs, four) }),
        _ => None,
    });
}

/// Q8_0 rows: a decoded token's chunk in one call, a prompt's tokens four at a time.
fn rows_q8_0(w: &QMatrix, first: usize, count: usize, xs: &[QActs], out: &mut [f32]) {
    if let ([x], QMatrix::Q8_0 { cols, d, qs, .. }) = (xs, w) {
        let nb = cols / BLOCK;
        let blocks = first * nb..(first + count) * nb;
        let qs = &qs[blocks.start * BLOCK..blocks.end * BLOCK];
        // SAFETY: as in `rows_q4_1`.
        return unsafe { dot_rows_q8_0(nb, &d[blocks], qs, x, out) };
    }
    by_fours(w, first, xs, out, |blocks, four| match blocks {
        // SAFETY: as in `row_dot`.
        RowBlocks::Q8_0 { d, qs } => Some(unsafe { dot_q8_0_x4(d, qs, four) }),
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

#[target_feature(enable = "avx2,fma")]
fn hsum(v: __m256) -> f32 {
    let lo = _mm256_castps256_ps128(v);
    let hi = _mm256_extractf128_ps(v, 1);
    let s = _mm_add_ps(lo, hi);
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    _mm_cvtss_f32(s)
}

/// How far ahead of the block being read the weights are requested. Decoding one token
/// reads every weight once; without the hint each row's first cache lines arrive only
/// when asked for, and the kernel waits on memory.
const PREFETCH_BYTES: usize = 1024;

/// Requests the cache line `PREFETCH_BYTES` past byte `at` of `bytes`, once per line.
#[inline(always)]
fn prefetch_ahead<T>(bytes: &[T], at: usize) {
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

/// Σ over blocks of d·dx·Σ(q·qx) + m·sum_x, for one Q4_1 row.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn dot_q4_1(d: &[f32], m: &[f32], qs: &[u8], x: &QActs) -> f32 {
    let mask = _mm256_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    let mut acc = _mm256_setzero_ps();
    let mut mins = 0f32;
    for b in 0..d.len() {
        prefetch_ahead(qs, b * 16);
        // SAFETY: block b lies inside `qs` (16 bytes a block) and `x.qs` (32 a block).
        let (raw, xv) = unsafe {
            (
                _mm_loadu_si128(qs.as_ptr().add(b * 16) as *const __m128i),
                _mm256_loadu_si256(x.qs.as_ptr().add(b * BLOCK) as *const __m256i),
            )
        };
        // Low nibbles are elements 0..16, high nibbles 16..32.
        let w = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), mask);
        let sum16 = _mm256_maddubs_epi16(w, xv);
        let sum32 = _mm256_madd_epi16(sum16, ones);
        let scale = _mm256_set1_ps(d[b] * x.d[b]);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum32), scale, acc);
        mins += m[b] * x.sum[b];
    }
    hsum(acc) + mins
}

/// [`dot_q4_1`] for consecutive rows of `nb` blocks each, one result per row of `out`.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn dot_rows_q4_1(
    nb: usize,
    d: &[f32],
    m: &[f32],
    qs: &[u8],
    x: &QActs,
    out: &mut [f32],
) {
    for (r, o) in out.iter_mut().enumerate() {
        let blocks = r * nb..(r + 1) * nb;
        // SAFETY: the caller's guarantees for `dot_q4_1`, row by row.
        *o = unsafe {
            dot_q4_1(
                &d[blocks.clone()],
                &m[blocks.clone()],
                &qs[blocks.start * 16..blocks.end * 16],
                x,
            )
        };
    }
}

/// [`dot_q8_0`] for consecutive rows of `nb` blocks each, one result per row of `out`.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn dot_rows_q8_0(nb: usize, d: &[f32], qs: &[i8], x: &QActs, out: &mut [f32]) {
    for (r, o) in out.iter_mut().enumerate() {
        let blocks = r * nb..(r + 1) * nb;
        // SAFETY: the caller's guarantees for `dot_q8_0`, row by row.
        *o = unsafe {
            dot_q8_0(
                &d[blocks.clone()],
                &qs[blocks.start * BLOCK..blocks.end * BLOCK],
                x,
            )
        };
    }
}

/// [`dot_q4_1`] for four activation vectors: the same operations in the same order for
/// each, with the row's nibbles unpacked once.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn dot_q4_1_x4(d: &[f32], m: &[f32], qs: &[u8], x: [&QActs; 4]) -> [f32; 4] {
    let mask = _mm256_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut mins = [0f32; 4];
    for b in 0..d.len() {
        prefetch_ahead(qs, b * 16);
        // SAFETY: block b lies inside `qs` (16 bytes a block).
        let raw = unsafe { _mm_loadu_si128(qs.as_ptr().add(b * 16) as *const __m128i) };
        let w = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), mask);
        for j in 0..4 {
            // SAFETY: block b lies inside every `x[j].qs` (32 bytes a block).
            let xv =
                unsafe { _mm256_loadu_si256(x[j].qs.as_ptr().add(b * BLOCK) as *const __m256i) };
            let sum32 = _mm256_madd_epi16(_mm256_maddubs_epi16(w, xv), ones);
            let scale = _mm256_set1_ps(d[b] * x[j].d[b]);
            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum32), scale, acc[j]);
            mins[j] += m[b] * x[j].sum[b];
        }
    }
    [
        hsum(acc[0]) + mins[0],
        hsum(acc[1]) + mins[1],
        hsum(acc[2]) + mins[2],
        hsum(acc[3]) + mins[3],
    ]
}

/// [`dot_q8_0`] for four activation vectors, the row's bytes loaded once.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn dot_q8_0_x4(d: &[f32], qs: &[i8], x: [&QActs; 4]) -> [f32; 4] {
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); 4];
    for (b, &db) in d.iter().enumerate() {
        prefetch_ahead(qs, b * BLOCK);
        // SAFETY: block b lies inside `qs` (32 bytes a block).
        let w = unsafe { _mm256_loadu_si256(qs.as_ptr().add(b * BLOCK) as *const __m256i) };
        let abs_w = _mm256_sign_epi8(w, w);
        for j in 0..4 {
            // SAFETY: block b lies inside every `x[j].qs` (32 bytes a block).
            let xv =
                unsafe { _mm256_loadu_si256(x[j].qs.as_ptr().add(b * BLOCK) as *const __m256i) };
            let sum16 = _mm256_maddubs_epi16(abs_w, _mm256_sign_epi8(xv, w));
            let sum32 = _mm256_madd_epi16(sum16, ones);
            acc[j] = _mm256_fmadd_ps(
                _mm256_cvtepi32_ps(sum32),
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

/// Σ over blocks of d·dx·Σ(q·qx), for one Q8_0 row.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn dot_q8_0(d: &[f32], qs: &[i8], x: &QActs) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (b, &db) in d.iter().enumerate() {
        // SAFETY: block b lies inside `qs` and `x.qs` (the caller's slices).
        let sums = unsafe { signed_block_sums(qs, x, b) };
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_set1_ps(db * x.d[b]), acc);
    }
    hsum(acc)
}

/// Block `b`'s products of signed bytes with the activations, summed in fours: i32 lanes
/// 0–3 cover its first 16 values, 4–7 the rest.
///
/// # Safety
/// Block `b` (32 bytes) lies inside `qs` and `x.qs`.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn signed_block_sums(qs: &[i8], x: &QActs, b: usize) -> __m256i {
    prefetch_ahead(qs, b * BLOCK);
    // SAFETY: the caller's guarantee.
    let (w, xv) = unsafe {
        (
            _mm256_loadu_si256(qs.as_ptr().add(b * BLOCK) as *const __m256i),
            _mm256_loadu_si256(x.qs.as_ptr().add(b * BLOCK) as *const __m256i),
        )
    };
    // maddubs needs an unsigned operand: |w| times x with w's sign moved onto x (both at
    // most 127 in magnitude, so a pair's sum fits in i16).
    let sum16 = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(xv, w));
    _mm256_madd_epi16(sum16, _mm256_set1_epi16(1))
}

/// Σ over blocks of 32 of dx·(d₁·Σ(q·qx) + d₂·Σ(q·qx)), for one Q6_K row: a scale per 16
/// values, so each block's two halves (the two 128-bit lanes) are scaled apart.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn dot_q6_k(d: &[f32], qs: &[i8], x: &QActs) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (b, &dx) in x.d.iter().enumerate() {
        // SAFETY: block b lies inside `qs` and `x.qs` (the caller's slices).
        let sums = unsafe { signed_block_sums(qs, x, b) };
        let scale = _mm256_set_m128(_mm_set1_ps(d[2 * b + 1] * dx), _mm_set1_ps(d[2 * b] * dx));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), scale, acc);
    }
    hsum(acc)
}
