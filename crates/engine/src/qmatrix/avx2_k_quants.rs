//! AVX2 kernels for the K-quants (Q4_K, Q6_K) with eight rows side by side in a register's
//! lanes, in the order of sums `super_blocks` sets out. As in `avx512_k_quants`, no sum is
//! ever added across lanes, so each sub-block's scaled sum, each pair's (or super-block's)
//! total and every float step run for eight outputs at once, and each lane's steps are the
//! scalar order's own.
//!
//! A task's rows are unpacked once into a [`Panel`] (four bytes of a row a lane) and read
//! for each of its tokens. A product with fewer tokens than pay for the unpacking (a decoded
//! token) reads Q4_K's woven rows in place ([`woven_rows`]); Q6_K's tokens below its tiled
//! kernel's batch, and rows past the last whole eight, go to the one-row kernel.

use std::arch::x86_64::*;
use std::cell::RefCell;

use super::lane_tiles::{self, LanePanel};
use super::super_blocks::{Q4KGroup, WOVEN, WOVEN_BYTES, q4k_in_fours};
use super::{BLOCK, QActs, QK_K, QMatrix, avx2};

/// Rows side by side in a register.
const LANES: usize = 8;

/// Rows `first..first + count` against every token of `xs` into `out[k * xs.len() + t]`.
pub(super) fn rows(w: &QMatrix, first: usize, count: usize, xs: &[QActs], out: &mut [f32]) {
    // SAFETY: AVX2 and FMA run here (the family's table is handed out only where they do);
    // the task's rows lie inside the matrix.
    unsafe { lane_tiles::rows::<Panel>(w, first, count, xs, out) }
}

thread_local! {
    /// Each thread's unpacked rows, reused from task to task.
    static PANEL: RefCell<Panel> = RefCell::default();
}

/// Eight rows of a K-quant matrix unpacked: per group of four values, a register of each
/// row's four (unsigned) bytes; per sub-block, each row's integer scale as two equal 16-bit
/// halves of its lane (what `madd` multiplies a pair of products by); Q4_K's minimums per
/// pair of sub-blocks, and Q6_K's scales per pair of sixteens, as a lane's two halves; per
/// super-block, each row's scale (and Q4_K's minimum scale).
#[derive(Default)]
struct Panel {
    /// Q6_K's rows unpacked to a byte a value, one after another, before regrouping.
    bytes: Vec<u8>,
    values: Vec<__m256i>,
    scales: Vec<__m256i>,
    pairs: Vec<__m256i>,
    d: Vec<__m256>,
    dmin: Vec<__m256>,
}

/// Two 16-bit values in one 32-bit lane: `low` in the lower half.
fn halves(low: i32, high: i32) -> i32 {
    (low & 0xFFFF) | (high << 16)
}

/// Eight lanes, lane `i` from `f(i)`.
#[target_feature(enable = "avx2")]
#[inline]
fn lanes_i32(f: impl Fn(usize) -> i32) -> __m256i {
    let v: [i32; LANES] = std::array::from_fn(f);
    // SAFETY: an array of eight i32.
    unsafe { _mm256_loadu_si256(v.as_ptr().cast()) }
}

/// Eight float lanes, lane `i` from `f(i)`.
#[target_feature(enable = "avx2")]
#[inline]
fn lanes_f32(f: impl Fn(usize) -> f32) -> __m256 {
    let v: [f32; LANES] = std::array::from_fn(f);
    // SAFETY: an array of eight f32.
    unsafe { _mm256_loadu_ps(v.as_ptr()) }
}

/// Sixteen bytes of each of eight rows, `row(i)` the start of row `i`'s, regrouped by fours:
/// register `g` holds bytes `4g..4g + 4` of every row, row `i` in lane `i`.
///
/// # Safety
/// AVX2 runs here; each `row(i)` points at sixteen readable bytes.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn transpose(row: impl Fn(usize) -> *const u8) -> [__m256i; 4] {
    // SAFETY: the caller's guarantee (sixteen bytes at each row).
    let pair = |i: usize| unsafe {
        _mm256_set_m128i(
            _mm_loadu_si128(row(i + 4).cast()),
            _mm_loadu_si128(row(i).cast()),
        )
    };
    let [a, b, c, d] = [pair(0), pair(1), pair(2), pair(3)];
    let (ab_low, cd_low) = (_mm256_unpacklo_epi32(a, b), _mm256_unpacklo_epi32(c, d));
    let (ab_high, cd_high) = (_mm256_unpackhi_epi32(a, b), _mm256_unpackhi_epi32(c, d));
    [
        _mm256_unpacklo_epi64(ab_low, cd_low),
        _mm256_unpackhi_epi64(ab_low, cd_low),
        _mm256_unpacklo_epi64(ab_high, cd_high),
        _mm256_unpackhi_epi64(ab_high, cd_high),
    ]
}

impl LanePanel for Panel {
    const LANES: usize = LANES;
    const TOKENS: usize = 1;
    /// One token reads each row once, and the one-row kernel reads it straight from the
    /// matrix for less than unpacking it costs.
    const MIN_TOKENS: usize = 3;

    fn with<R>(f: impl FnOnce(&mut Self) -> R) -> R {
        PANEL.with_borrow_mut(f)
    }

    #[target_feature(enable = "avx2")]
    unsafe fn unpack(&mut self, w: &QMatrix, first: usize) {
        self.values.clear();
        self.scales.clear();
        self.pairs.clear();
        self.d.clear();
        self.dmin.clear();
        match w {
            QMatrix::Q4K { cols, .. } => {
                let group = Woven(w.q4k_group(first / WOVEN));
                assert!(first.is_multiple_of(WOVEN), "a panel starts a woven group");
                for b in 0..cols / BLOCK {
                    // SAFETY: sub-block `b` lies inside the group (the caller's guarantee).
                    unsafe {
                        self.values.extend(group.values(b));
                        self.scales.push(group.scales(b));
                    }
                }
                for p in 0..cols / BLOCK / 2 {
                    // SAFETY: as above.
                    self.pairs.push(unsafe { group.min_pairs(p) });
                }
                for s in 0..group.supers() {
                    // SAFETY: as above.
                    unsafe {
                        self.d.push(group.d(s));
                        self.dmin.push(group.dmin(s));
                    }
                }
            }
            QMatrix::Q6K { cols, d, sc, .. } => {
                let sixteens = cols / 16;
                self.bytes.clear();
                for i in 0..LANES {
                    avx2::q6k_row_bytes(w, first + i, &mut self.bytes);
                }
                let qs = &self.bytes;
                assert_eq!(qs.len(), LANES * cols, "every row unpacked");
                for k in 0..sixteens {
                    // SAFETY: sixteen bytes of each row unpacked, inside (asserted).
                    let grouped = unsafe { transpose(|i| qs.as_ptr().add(i * cols + 16 * k)) };
                    self.values.extend(grouped);
                    let scale = |i: usize, k: usize| i32::from(sc[(first + i) * sixteens + k]);
                    self.scales
                        .push(lanes_i32(|i| halves(scale(i, k), scale(i, k))));
                    if k % 2 == 1 {
                        self.pairs
                            .push(lanes_i32(|i| halves(scale(i, k - 1), scale(i, k))));
                    }
                }
                let supers = cols / QK_K;
                for s in 0..supers {
                    self.d.push(lanes_f32(|i| d[(first + i) * supers + s]));
                }
            }
            _ => unreachable!("a K-quant matrix"),
        }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile(&self, w: &QMatrix, xs: &[&QActs], put: &mut dyn FnMut(usize, usize, f32)) {
        for (j, x) in xs.iter().enumerate() {
            let v = match w {
                // SAFETY: the caller's guarantees.
                QMatrix::Q4K { .. } => unsafe { q4k_lanes(self, x) },
                QMatrix::Q6K { .. } => unsafe { self.q6k(x) },
                _ => unreachable!("a K-quant matrix"),
            };
            let mut out = [0f32; LANES];
            // SAFETY: eight floats.
            unsafe { _mm256_storeu_ps(out.as_mut_ptr(), v) };
            out.iter()
                .enumerate()
                .for_each(|(lane, &v)| put(j, lane, v));
        }
    }
}

/// What the Q4_K lane kernel reads, eight rows a register: a [`Panel`] unpacked once for
/// many tokens, or a [`Woven`] group read in place for a decoded token.
trait Q4KLanes {
    /// Super-blocks in a row.
    fn supers(&self) -> usize;

    /// Sub-block `b`'s 32 values of each row, four a register (values 0..16, then 16..32).
    ///
    /// # Safety
    /// AVX2 runs here, and the rows hold sub-block `b`.
    unsafe fn values(&self, b: usize) -> [__m256i; 8];

    /// Sub-block `b`'s integer scale of each row, as a lane's two equal 16-bit halves.
    ///
    /// # Safety
    /// As [`Q4KLanes::values`].
    unsafe fn scales(&self, b: usize) -> __m256i;

    /// The minimums of sub-blocks 2p and 2p + 1 of each row, as a lane's two halves.
    ///
    /// # Safety
    /// As [`Q4KLanes::values`].
    unsafe fn min_pairs(&self, p: usize) -> __m256i;

    /// Super-block `s`'s scale of each row.
    ///
    /// # Safety
    /// As [`Q4KLanes::values`].
    unsafe fn d(&self, s: usize) -> __m256;

    /// Super-block `s`'s minimum scale of each row.
    ///
    /// # Safety
    /// As [`Q4KLanes::values`].
    unsafe fn dmin(&self, s: usize) -> __m256;
}

impl Q4KLanes for Panel {
    fn supers(&self) -> usize {
        self.d.len()
    }

    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn values(&self, b: usize) -> [__m256i; 8] {
        std::array::from_fn(|g| self.values[b * 8 + g])
    }

    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn scales(&self, b: usize) -> __m256i {
        self.scales[b]
    }

    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn min_pairs(&self, p: usize) -> __m256i {
        self.pairs[p]
    }

    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn d(&self, s: usize) -> __m256 {
        self.d[s]
    }

    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn dmin(&self, s: usize) -> __m256 {
        self.dmin[s]
    }
}

/// Eight woven Q4_K rows read in place: the matrix's layout is the registers'.
struct Woven<'a>(Q4KGroup<'a>);

const _: () = assert!(WOVEN == LANES, "a woven group is a register of rows");

/// Eight bytes from `at` widened to a lane each.
///
/// # Safety
/// AVX2 runs here.
#[target_feature(enable = "avx2")]
#[inline]
fn widened(bytes: &[u8], at: usize) -> __m256i {
    let eight = &bytes[at..at + WOVEN];
    // SAFETY: `eight` holds the eight bytes read.
    _mm256_cvtepu8_epi32(unsafe { _mm_loadl_epi64(eight.as_ptr().cast()) })
}

impl Q4KLanes for Woven<'_> {
    fn supers(&self) -> usize {
        self.0.d.len() / WOVEN
    }

    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn values(&self, b: usize) -> [__m256i; 8] {
        let qs = &self.0.qs[b * WOVEN_BYTES..(b + 1) * WOVEN_BYTES];
        avx2::prefetch_ahead(self.0.qs, b * WOVEN_BYTES);
        avx2::prefetch_ahead(self.0.qs, b * WOVEN_BYTES + 64);
        // SAFETY: `qs` holds the sub-block's four registers of bytes.
        let packed: [__m256i; 4] =
            std::array::from_fn(|g| unsafe { _mm256_loadu_si256(qs.as_ptr().add(32 * g).cast()) });
        let low = _mm256_set1_epi8(0x0F);
        std::array::from_fn(|g| match g {
            0..4 => _mm256_and_si256(packed[g], low),
            _ => _mm256_and_si256(_mm256_srli_epi16::<4>(packed[g - 4]), low),
        })
    }

    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn scales(&self, b: usize) -> __m256i {
        let sc = widened(self.0.sc, b * WOVEN);
        _mm256_or_si256(sc, _mm256_slli_epi32::<16>(sc))
    }

    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn min_pairs(&self, p: usize) -> __m256i {
        let (even, odd) = (
            widened(self.0.m, 2 * p * WOVEN),
            widened(self.0.m, (2 * p + 1) * WOVEN),
        );
        _mm256_or_si256(even, _mm256_slli_epi32::<16>(odd))
    }

    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn d(&self, s: usize) -> __m256 {
        let d = &self.0.d[s * WOVEN..(s + 1) * WOVEN];
        // SAFETY: eight floats.
        unsafe { _mm256_loadu_ps(d.as_ptr()) }
    }

    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn dmin(&self, s: usize) -> __m256 {
        let dmin = &self.0.dmin[s * WOVEN..(s + 1) * WOVEN];
        // SAFETY: eight floats.
        unsafe { _mm256_loadu_ps(dmin.as_ptr()) }
    }
}

/// The rows of `first..first + count` in whole woven groups of a Q4_K matrix, against every
/// token of `xs` into `out[k * xs.len() + t]`, read in place; returns the rows (`k`) done.
pub(super) fn woven_rows(
    w: &QMatrix,
    first: usize,
    count: usize,
    xs: &[QActs],
    out: &mut [f32],
) -> std::ops::Range<usize> {
    let n = xs.len();
    let start = first.next_multiple_of(WOVEN);
    let end = ((first + count) / WOVEN * WOVEN).max(start);
    for g in (start..end).step_by(WOVEN) {
        let group = Woven(w.q4k_group(g / WOVEN));
        for (t, x) in xs.iter().enumerate() {
            // SAFETY: AVX2 and FMA run here (the family's table is handed out only where
            // they do); every token holds the matrix's columns in Q8_K.
            let v = unsafe { q4k_lanes(&group, x) };
            let mut lanes = [0f32; LANES];
            // SAFETY: eight floats.
            unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), v) };
            for (lane, &v) in lanes.iter().enumerate() {
                out[(g + lane - first) * n + t] = v;
            }
        }
    }
    start - first..end - first
}

/// Q4_K: the scaled sums' chain less the minimums' chain, each a link a pair of sub-blocks
/// (`gemm`) or a super-block (`gemv`), as the token's place has it.
///
/// # Safety
/// AVX2 and FMA run here; `x` holds the rows' columns in Q8_K.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn q4k_lanes<L: Q4KLanes>(rows: &L, x: &QActs) -> __m256 {
    let zero = _mm256_setzero_si256();
    let fours = q4k_in_fours(x.place);
    let (mut acc, mut acc_min) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    for s in 0..rows.supers() {
        // SAFETY (each call): the caller's guarantees.
        let (d, dmin) = unsafe { (rows.d(s), rows.dmin(s)) };
        let xd = _mm256_set1_ps(x.d[s * 8]);
        let (scale, min_scale) = (_mm256_mul_ps(d, xd), _mm256_mul_ps(dmin, xd));
        let (mut total, mut total_min) = (zero, zero);
        for p in s * 4..s * 4 + 4 {
            let mut pair = zero;
            for b in [2 * p, 2 * p + 1] {
                // SAFETY: the token holds sub-block `b` (the caller's guarantee).
                let (values, scales) = unsafe { (rows.values(b), rows.scales(b)) };
                let dot = unsafe { dot_groups(&values, &x.qs[b * BLOCK..]) };
                pair = _mm256_add_epi32(pair, _mm256_madd_epi16(dot, scales));
            }
            let sub_block = |b: usize| x.bsums[2 * b] + x.bsums[2 * b + 1];
            let sums = _mm256_set1_epi32(halves(sub_block(2 * p), sub_block(2 * p + 1)));
            // SAFETY: as above.
            let pair_min = _mm256_madd_epi16(unsafe { rows.min_pairs(p) }, sums);
            if fours {
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(pair), scale, acc);
                acc_min = _mm256_fmadd_ps(_mm256_cvtepi32_ps(pair_min), min_scale, acc_min);
            } else {
                total = _mm256_add_epi32(total, pair);
                total_min = _mm256_add_epi32(total_min, pair_min);
            }
        }
        if !fours {
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), scale, acc);
            acc_min = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total_min), min_scale, acc_min);
        }
    }
    _mm256_sub_ps(acc, acc_min)
}

impl Panel {
    /// Q6_K in the tiled kernel's order: per super-block one integer, Σ sc·(q − 32)·x, times
    /// the row's scale, fused into the output with the token's.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn q6k(&self, x: &QActs) -> __m256 {
        let mut acc = _mm256_setzero_ps();
        for (s, &d) in self.d.iter().enumerate() {
            let (mut total, mut offsets) = (_mm256_setzero_si256(), _mm256_setzero_si256());
            for k in s * 16..(s + 1) * 16 {
                // Two groups a 16-bit sum: four six-bit values' would overflow it.
                for half in [k * 4, k * 4 + 2] {
                    // SAFETY: the token holds the sixteen values (the caller's guarantee).
                    let dot =
                        unsafe { dot_groups(&self.values[half..half + 2], &x.qs[half * 4..]) };
                    total = _mm256_add_epi32(total, _mm256_madd_epi16(dot, self.scales[k]));
                }
                if k % 2 == 1 {
                    let sums = _mm256_set1_epi32(halves(x.bsums[k - 1], x.bsums[k]));
                    offsets = _mm256_add_epi32(offsets, _mm256_madd_epi16(self.pairs[k / 2], sums));
                }
            }
            let total = _mm256_sub_epi32(total, _mm256_slli_epi32::<5>(offsets));
            let result = _mm256_mul_ps(d, _mm256_cvtepi32_ps(total));
            acc = _mm256_fmadd_ps(result, _mm256_set1_ps(x.d[s * 8]), acc);
        }
        acc
    }
}

/// Each lane's row · the activations `a`, as 16-bit sums of pairs of products (lane `i`'s two
/// halves are row `i`'s): four of the row's bytes from each of `values` against the same
/// four of `a`. Exact while the sums fit in 16 bits: eight groups of nibbles (Q4_K's
/// sub-block), or two of six-bit values, against bytes of at most 128 in magnitude.
///
/// # Safety
/// AVX2 runs here; `a` holds four bytes for each of `values`.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn dot_groups(values: &[__m256i], a: &[i8]) -> __m256i {
    assert!(a.len() >= 4 * values.len());
    let mut dot = _mm256_setzero_si256();
    for (g, &v) in values.iter().enumerate() {
        // SAFETY: four bytes inside `a` (asserted); unaligned reads are allowed.
        let four = unsafe { a.as_ptr().add(4 * g).cast::<i32>().read_unaligned() };
        dot = _mm256_add_epi16(dot, _mm256_maddubs_epi16(v, _mm256_set1_epi32(four)));
    }
    dot
}
