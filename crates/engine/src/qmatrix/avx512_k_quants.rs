//! AVX-512 VNNI kernels for the K-quants (Q4_K, Q6_K) over several tokens, in the order of
//! sums `super_blocks` sets out. Sixteen rows go side by side in a register's lanes, as
//! llama.cpp's repacked kernels put eight: each sub-block's integer sums, its scale's
//! product and each float step then run for sixteen outputs at once, and no sum is ever
//! added across lanes, which is what keeps a pair of sub-blocks' (or a super-block's) sum a
//! whole integer before its one fused multiply-add.
//!
//! A task's rows are unpacked once into [`Panel`]s (four bytes of a row a lane) and read for
//! all of its tokens. Tokens the order takes one by one (one token alone; Q6_K below its
//! tiled kernel's batch) and rows past the last whole sixteen go to the AVX2 kernel.

use std::arch::x86_64::*;
use std::cell::RefCell;

use super::lane_tiles::{self, LanePanel};
use super::super_blocks::{WOVEN, WOVEN_BYTES, q4k_in_fours};
use super::{BLOCK, QActs, QK_K, QMatrix, avx2};

/// Rows side by side in a register.
const LANES: usize = 16;
/// Tokens a tile computes at once.
const TOKENS: usize = 4;

/// Rows `first..first + count` against every token of `xs` into `out[k * xs.len() + t]`.
pub(super) fn rows(w: &QMatrix, first: usize, count: usize, xs: &[QActs], out: &mut [f32]) {
    // SAFETY: AVX-512 F, BW and VNNI run here (the family's table is handed out only where
    // they do); the task's rows lie inside the matrix.
    unsafe { lane_tiles::rows::<Panel>(w, first, count, xs, out) }
}

thread_local! {
    /// Each thread's unpacked rows, reused from task to task.
    static PANEL: RefCell<Panel> = RefCell::default();
}

/// Sixteen rows of a K-quant matrix unpacked: per group of four values, a register of each
/// row's four (unsigned) bytes; per sub-block, each row's integer scale (and Q4_K's minimum);
/// per super-block, each row's scale (and Q4_K's minimum scale).
#[derive(Default)]
struct Panel {
    /// Q6_K's rows unpacked to a byte a value, one after another, before regrouping.
    bytes: Vec<u8>,
    values: Vec<__m512i>,
    scales: Vec<__m512i>,
    mins: Vec<__m512i>,
    d: Vec<__m512>,
    dmin: Vec<__m512>,
}

impl LanePanel for Panel {
    const LANES: usize = LANES;
    const TOKENS: usize = TOKENS;
    /// Unpacking sixteen rows costs more than a few tokens' products gain from it: a
    /// decoded token, a short verified draft and a few streams decoding together read each
    /// row straight from the matrix (measured in BENCHMARKS.md's speculative section).
    const MIN_TOKENS: usize = 6;

    fn with<R>(f: impl FnOnce(&mut Self) -> R) -> R {
        PANEL.with_borrow_mut(f)
    }

    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn unpack(&mut self, w: &QMatrix, first: usize) {
        self.values.clear();
        self.scales.clear();
        self.mins.clear();
        self.d.clear();
        self.dmin.clear();
        let lane_rows = |x: &dyn Fn(usize) -> i32| std::array::from_fn::<i32, LANES, _>(x);
        match w {
            QMatrix::Q4K { cols, .. } => {
                // Lanes 0–7 are one woven group's, 8–15 the next's.
                assert!(first.is_multiple_of(WOVEN), "a panel starts a woven group");
                let groups = [0, 1].map(|h| w.q4k_group(first / WOVEN + h));
                let low = _mm512_set1_epi8(0x0F);
                for b in 0..cols / BLOCK {
                    let at = b * WOVEN_BYTES;
                    let packed: [__m512i; 4] = std::array::from_fn(|g| {
                        let [lo, hi] = groups.map(|group| {
                            let four = &group.qs[at + 32 * g..at + 32 * g + 32];
                            // SAFETY: `four` holds the 32 bytes read.
                            unsafe { _mm256_loadu_si256(four.as_ptr().cast()) }
                        });
                        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
                    });
                    self.values.extend(packed.map(|v| _mm512_and_si512(v, low)));
                    self.values
                        .extend(packed.map(|v| _mm512_and_si512(_mm512_srli_epi16::<4>(v), low)));
                    let scale =
                        lane_rows(&|i| i32::from(groups[i / WOVEN].sc[b * WOVEN + i % WOVEN]));
                    let min = lane_rows(&|i| i32::from(groups[i / WOVEN].m[b * WOVEN + i % WOVEN]));
                    // SAFETY: arrays of sixteen i32.
                    self.scales
                        .push(unsafe { _mm512_loadu_si512(scale.as_ptr().cast()) });
                    self.mins
                        .push(unsafe { _mm512_loadu_si512(min.as_ptr().cast()) });
                }
                for s in 0..cols / QK_K {
                    let at = |i: usize| s * WOVEN + i % WOVEN;
                    let dv: [f32; LANES] = std::array::from_fn(|i| groups[i / WOVEN].d[at(i)]);
                    let mv: [f32; LANES] = std::array::from_fn(|i| groups[i / WOVEN].dmin[at(i)]);
                    // SAFETY: arrays of sixteen f32.
                    self.d.push(unsafe { _mm512_loadu_ps(dv.as_ptr()) });
                    self.dmin.push(unsafe { _mm512_loadu_ps(mv.as_ptr()) });
                }
            }
            QMatrix::Q6K { cols, d, sc, .. } => {
                let supers = cols / QK_K;
                assert!((first + LANES) * supers <= d.len(), "rows past the matrix");
                self.bytes.clear();
                for i in 0..LANES {
                    avx2::q6k_row_bytes(w, first + i, &mut self.bytes);
                }
                assert_eq!(self.bytes.len(), LANES * cols, "every row unpacked");
                let rows = _mm512_mullo_epi32(
                    _mm512_set1_epi32((cols / 4) as i32),
                    _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                );
                let base = self.bytes.as_ptr();
                for group in 0..cols / 4 {
                    // SAFETY: every lane reads four bytes inside its row.
                    let v =
                        unsafe { _mm512_i32gather_epi32::<4>(rows, base.add(4 * group).cast()) };
                    self.values.push(v);
                }
                for k in 0..cols / 16 {
                    let scale = lane_rows(&|i| i32::from(sc[(first + i) * cols / 16 + k]));
                    // SAFETY: an array of sixteen i32.
                    self.scales
                        .push(unsafe { _mm512_loadu_si512(scale.as_ptr().cast()) });
                }
                for s in 0..supers {
                    let dv: [f32; LANES] = std::array::from_fn(|i| d[(first + i) * supers + s]);
                    // SAFETY: an array of sixteen f32.
                    self.d.push(unsafe { _mm512_loadu_ps(dv.as_ptr()) });
                }
            }
            _ => unreachable!("a K-quant matrix"),
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn tile(&self, w: &QMatrix, xs: &[&QActs], put: &mut dyn FnMut(usize, usize, f32)) {
        let sums = match w {
            // SAFETY: the caller's guarantees.
            QMatrix::Q4K { .. } => unsafe { self.q4k(xs) },
            QMatrix::Q6K { .. } => unsafe { self.q6k(xs) },
            _ => unreachable!("a K-quant matrix"),
        };
        for (j, v) in sums.iter().take(xs.len()).enumerate() {
            let mut out = [0f32; LANES];
            // SAFETY: sixteen floats.
            unsafe { _mm512_storeu_ps(out.as_mut_ptr(), *v) };
            out.iter()
                .enumerate()
                .for_each(|(lane, &v)| put(j, lane, v));
        }
    }
}

impl Panel {
    /// Q4_K: per token, the scaled sums' chain less the minimums' chain, each a link a pair
    /// of sub-blocks (`gemm`) or a super-block (`gemv`), as the token's place has it.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn q4k(&self, x: &[&QActs]) -> [__m512; TOKENS] {
        let zero = _mm512_setzero_si512();
        let (mut acc, mut acc_min) = ([_mm512_setzero_ps(); TOKENS], [_mm512_setzero_ps(); TOKENS]);
        let fours: [bool; TOKENS] =
            std::array::from_fn(|t| x.get(t).is_some_and(|x| q4k_in_fours(x.place)));
        for (s, (&d, &dmin)) in self.d.iter().zip(&self.dmin).enumerate() {
            let (mut sums, mut mins) = ([zero; TOKENS], [zero; TOKENS]);
            for p in 0..4 {
                let (mut pair, mut pair_mins) = ([zero; TOKENS], [zero; TOKENS]);
                for b in [s * 8 + 2 * p, s * 8 + 2 * p + 1] {
                    let values = &self.values[b * 8..b * 8 + 8];
                    for (t, xt) in x.iter().enumerate() {
                        // SAFETY: the token holds sub-block `b` (the caller's guarantee).
                        let dot = unsafe { dot_groups(values, &xt.qs[b * BLOCK..]) };
                        let bsum = _mm512_set1_epi32(xt.bsums[2 * b] + xt.bsums[2 * b + 1]);
                        pair[t] =
                            _mm512_add_epi32(pair[t], _mm512_mullo_epi32(dot, self.scales[b]));
                        pair_mins[t] =
                            _mm512_add_epi32(pair_mins[t], _mm512_mullo_epi32(bsum, self.mins[b]));
                    }
                }
                for (t, xt) in x.iter().enumerate() {
                    if fours[t] {
                        let xd = _mm512_set1_ps(xt.d[s * 8]);
                        acc[t] = _mm512_fmadd_ps(
                            _mm512_cvtepi32_ps(pair[t]),
                            _mm512_mul_ps(d, xd),
                            acc[t],
                        );
                        acc_min[t] = _mm512_fmadd_ps(
                            _mm512_cvtepi32_ps(pair_mins[t]),
                            _mm512_mul_ps(dmin, xd),
                            acc_min[t],
                        );
                    } else {
                        sums[t] = _mm512_add_epi32(sums[t], pair[t]);
                        mins[t] = _mm512_add_epi32(mins[t], pair_mins[t]);
                    }
                }
            }
            for (t, xt) in x.iter().enumerate() {
                if !fours[t] {
                    let xd = _mm512_set1_ps(xt.d[s * 8]);
                    acc[t] =
                        _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[t]), _mm512_mul_ps(d, xd), acc[t]);
                    acc_min[t] = _mm512_fmadd_ps(
                        _mm512_cvtepi32_ps(mins[t]),
                        _mm512_mul_ps(dmin, xd),
                        acc_min[t],
                    );
                }
            }
        }
        std::array::from_fn(|t| _mm512_sub_ps(acc[t], acc_min[t]))
    }

    /// Q6_K in the tiled kernel's order: per super-block one integer, Σ sc·(q − 32)·x, times
    /// the row's scale, fused into the output with the token's.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn q6k(&self, x: &[&QActs]) -> [__m512; TOKENS] {
        let zero = _mm512_setzero_si512();
        let mut acc = [_mm512_setzero_ps(); TOKENS];
        for (s, &d) in self.d.iter().enumerate() {
            let mut total = [zero; TOKENS];
            for k in s * 16..(s + 1) * 16 {
                let values = &self.values[k * 4..k * 4 + 4];
                for (t, xt) in x.iter().enumerate() {
                    // SAFETY: the token holds the sixteen values (the caller's guarantee).
                    let dot = unsafe { dot_groups(values, &xt.qs[k * 16..]) };
                    let offset = _mm512_set1_epi32(32 * xt.bsums[k]);
                    let scaled = _mm512_mullo_epi32(_mm512_sub_epi32(dot, offset), self.scales[k]);
                    total[t] = _mm512_add_epi32(total[t], scaled);
                }
            }
            for (t, xt) in x.iter().enumerate() {
                let result = _mm512_mul_ps(d, _mm512_cvtepi32_ps(total[t]));
                acc[t] = _mm512_fmadd_ps(result, _mm512_set1_ps(xt.d[s * 8]), acc[t]);
            }
        }
        acc
    }
}

/// Each lane's row · the activations `a`: four of the row's bytes from each of `values`
/// against the same four of `a`, for as many groups of four as `values` holds.
///
/// # Safety
/// AVX-512 F and VNNI run here; `a` holds four bytes for each of `values`.
#[target_feature(enable = "avx512f,avx512vnni")]
#[inline]
unsafe fn dot_groups(values: &[__m512i], a: &[i8]) -> __m512i {
    assert!(a.len() >= 4 * values.len());
    let mut dot = _mm512_setzero_si512();
    for (g, &v) in values.iter().enumerate() {
        // SAFETY: four bytes inside `a` (asserted); unaligned reads are allowed.
        let four = unsafe { a.as_ptr().add(4 * g).cast::<i32>().read_unaligned() };
        dot = _mm512_dpbusd_epi32(dot, v, _mm512_set1_epi32(four));
    }
    dot
}
