//! Weight matrices that stay quantized in memory, and the matrix × vector products over
//! them. Activations are quantized to 8 bits per block of 32 (as llama.cpp does), so the
//! inner loop is an integer dot product that the compiler vectorizes.

use half::f16;

use crate::quant::{self, QuantError, TensorType};

const BLOCK: usize = 32;

/// A row-major weight matrix `[rows, cols]`; each row is one output.
#[derive(Debug, Clone)]
pub enum QMatrix {
    /// Q4_1 repacked: per-block f32 scale and minimum, then 16 bytes of nibbles per block.
    Q4_1 {
        rows: usize,
        cols: usize,
        d: Vec<f32>,
        m: Vec<f32>,
        qs: Vec<u8>,
    },
    /// Q4_0 repacked: per-block f32 scale, 16 bytes of nibbles per block (value − 8).
    Q4_0 {
        rows: usize,
        cols: usize,
        d: Vec<f32>,
        qs: Vec<u8>,
    },
    /// Q8_0 repacked: per-block f32 scale, 32 signed bytes per block.
    Q8_0 {
        rows: usize,
        cols: usize,
        d: Vec<f32>,
        qs: Vec<i8>,
    },
    /// Q6_K repacked: an f32 scale per 16 values, one signed byte per value (−32..32).
    Q6K {
        rows: usize,
        cols: usize,
        d: Vec<f32>,
        qs: Vec<i8>,
    },
    /// Anything else, dequantized once at load.
    F32 {
        rows: usize,
        cols: usize,
        w: Vec<f32>,
    },
}

/// One row's blocks of a quantized matrix.
#[allow(dead_code)] // on targets without a kernel
enum RowBlocks<'a> {
    Q4_1 {
        d: &'a [f32],
        m: &'a [f32],
        qs: &'a [u8],
    },
    Q4_0 {
        d: &'a [f32],
        qs: &'a [u8],
    },
    Q8_0 {
        d: &'a [f32],
        qs: &'a [i8],
    },
    Other,
}

/// Activations quantized to 8 bits per block of 32: scale, block sum (for Q4_1's minimum), values.
#[derive(Debug, Clone, Default)]
pub struct QActs {
    pub d: Vec<f32>,
    pub sum: Vec<f32>,
    pub qs: Vec<i8>,
    pub f: Vec<f32>,
}

impl QActs {
    /// Quantizes `x` (length a multiple of 32); keeps the f32 copy for f32 weights.
    pub fn quantize(x: &[f32]) -> Self {
        let mut a = QActs::default();
        a.fill(x);
        a
    }

    /// Re-quantizes into the existing buffers.
    pub fn fill(&mut self, x: &[f32]) {
        let nb = x.len() / BLOCK;
        self.d.clear();
        self.sum.clear();
        self.qs.clear();
        self.qs.reserve(x.len());
        self.f.clear();
        self.f.extend_from_slice(x);
        for block in x.chunks_exact(BLOCK).take(nb) {
            let amax = block.iter().fold(0f32, |a, v| a.max(v.abs()));
            let d = amax / 127.0;
            let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
            let mut s = 0i32;
            for &v in block {
                let q = (v * inv).round() as i8;
                s += i32::from(q);
                self.qs.push(q);
            }
            self.d.push(d);
            self.sum.push(d * s as f32);
        }
    }
}

impl QMatrix {
    /// Builds the matrix from GGUF bytes of type `ty` holding `rows` rows of `cols` values.
    pub fn from_gguf(
        ty: TensorType,
        bytes: &[u8],
        rows: usize,
        cols: usize,
    ) -> Result<Self, QuantError> {
        let nb = rows * cols / BLOCK;
        let f16_at = |b: &[u8], i: usize| f16::from_le_bytes([b[i], b[i + 1]]).to_f32();
        Ok(match ty {
            TensorType::Q4_1 if cols.is_multiple_of(BLOCK) => {
                let (mut d, mut m, mut qs) = (
                    Vec::with_capacity(nb),
                    Vec::with_capacity(nb),
                    Vec::with_capacity(nb * 16),
                );
                for b in bytes.chunks_exact(20) {
                    d.push(f16_at(b, 0));
                    m.push(f16_at(b, 2));
                    qs.extend_from_slice(&b[4..20]);
                }
                QMatrix::Q4_1 {
                    rows,
                    cols,
                    d,
                    m,
                    qs,
                }
            }
            // x = s·q − m per sub-block of 32 is Q4_1 with d = s and a minimum of −m.
            TensorType::Q4_K if cols.is_multiple_of(256) => {
                let (mut d, mut m, mut qs) = (
                    Vec::with_capacity(nb),
                    Vec::with_capacity(nb),
                    Vec::with_capacity(nb * 16),
                );
                for b in bytes.chunks_exact(ty.block_bytes() as usize) {
                    let block = quant::unpack_q4_k(b);
                    d.extend_from_slice(&block.scale);
                    m.extend(block.min.iter().map(|v| -v));
                    for sub in block.q.chunks_exact(BLOCK) {
                        qs.extend((0..16).map(|j| sub[j] | (sub[j + 16] << 4)));
                    }
                }
                QMatrix::Q4_1 {
                    rows,
                    cols,
                    d,
                    m,
                    qs,
                }
            }
            TensorType::Q6_K if cols.is_multiple_of(256) => {
                let (mut d, mut qs) = (Vec::with_capacity(nb * 2), Vec::with_capacity(nb * 32));
                for b in bytes.chunks_exact(ty.block_bytes() as usize) {
                    let block = quant::unpack_q6_k(b);
                    d.extend_from_slice(&block.scale);
                    qs.extend_from_slice(&block.q);
                }
                QMatrix::Q6K { rows, cols, d, qs }
            }
            TensorType::Q4_0 if cols.is_multiple_of(BLOCK) => {
                let (mut d, mut qs) = (Vec::with_capacity(nb), Vec::with_capacity(nb * 16));
                for b in bytes.chunks_exact(18) {
                    d.push(f16_at(b, 0));
                    qs.extend_from_slice(&b[2..18]);
                }
                QMatrix::Q4_0 { rows, cols, d, qs }
            }
            TensorType::Q8_0 if cols.is_multiple_of(BLOCK) => {
                let (mut d, mut qs) = (Vec::with_capacity(nb), Vec::with_capacity(nb * 32));
                for b in bytes.chunks_exact(34) {
                    d.push(f16_at(b, 0));
                    qs.extend(b[2..34].iter().map(|&v| v as i8));
                }
                QMatrix::Q8_0 { rows, cols, d, qs }
            }
            other => QMatrix::F32 {
                rows,
                cols,
                w: quant::dequantize(other, bytes)?,
            },
        })
    }

    /// `(rows, cols)`.
    pub fn shape(&self) -> (usize, usize) {
        match self {
            QMatrix::Q4_1 { rows, cols, .. }
            | QMatrix::Q4_0 { rows, cols, .. }
            | QMatrix::Q8_0 { rows, cols, .. }
            | QMatrix::Q6K { rows, cols, .. }
            | QMatrix::F32 { rows, cols, .. } => (*rows, *cols),
        }
    }

    /// Bytes held in memory.
    pub fn bytes(&self) -> usize {
        match self {
            QMatrix::Q4_1 { d, m, qs, .. } => 4 * (d.len() + m.len()) + qs.len(),
            QMatrix::Q4_0 { d, qs, .. } => 4 * d.len() + qs.len(),
            QMatrix::Q8_0 { d, qs, .. } | QMatrix::Q6K { d, qs, .. } => 4 * d.len() + qs.len(),
            QMatrix::F32 { w, .. } => 4 * w.len(),
        }
    }

    /// Row `r` dequantized into `out` (used for embedding lookups).
    pub fn row(&self, r: usize, out: &mut [f32]) {
        let (_, cols) = self.shape();
        let nb = cols / BLOCK;
        match self {
            QMatrix::Q4_1 { d, m, qs, .. } => {
                for b in 0..nb {
                    let i = r * nb + b;
                    let q = &qs[i * 16..i * 16 + 16];
                    for j in 0..16 {
                        out[b * BLOCK + j] = d[i] * f32::from(q[j] & 15) + m[i];
                        out[b * BLOCK + j + 16] = d[i] * f32::from(q[j] >> 4) + m[i];
                    }
                }
            }
            QMatrix::Q4_0 { d, qs, .. } => {
                for b in 0..nb {
                    let i = r * nb + b;
                    let q = &qs[i * 16..i * 16 + 16];
                    for j in 0..16 {
                        out[b * BLOCK + j] = d[i] * (f32::from(q[j] & 15) - 8.0);
                        out[b * BLOCK + j + 16] = d[i] * (f32::from(q[j] >> 4) - 8.0);
                    }
                }
            }
            QMatrix::Q8_0 { d, qs, .. } => {
                for b in 0..nb {
                    let i = r * nb + b;
                    for j in 0..BLOCK {
                        out[b * BLOCK + j] = d[i] * f32::from(qs[i * BLOCK + j]);
                    }
                }
            }
            QMatrix::Q6K { d, qs, .. } => {
                let row = r * cols..(r + 1) * cols;
                for (j, (o, &q)) in out.iter_mut().zip(&qs[row.clone()]).enumerate() {
                    *o = d[(row.start + j) / 16] * f32::from(q);
                }
            }
            QMatrix::F32 { w, .. } => out[..cols].copy_from_slice(&w[r * cols..(r + 1) * cols]),
        }
    }

    /// Row `r`'s blocks: what the SIMD kernels take.
    #[inline]
    #[allow(dead_code)] // on targets without a kernel
    fn row_blocks(&self, r: usize) -> RowBlocks<'_> {
        let nb = self.shape().1 / BLOCK;
        let blocks = r * nb..(r + 1) * nb;
        let nibbles = r * nb * 16..(r + 1) * nb * 16;
        match self {
            QMatrix::Q4_1 { d, m, qs, .. } => RowBlocks::Q4_1 {
                d: &d[blocks.clone()],
                m: &m[blocks],
                qs: &qs[nibbles],
            },
            QMatrix::Q4_0 { d, qs, .. } => RowBlocks::Q4_0 {
                d: &d[blocks],
                qs: &qs[nibbles],
            },
            QMatrix::Q8_0 { d, qs, .. } => RowBlocks::Q8_0 {
                d: &d[blocks],
                qs: &qs[r * nb * BLOCK..(r + 1) * nb * BLOCK],
            },
            QMatrix::Q6K { .. } | QMatrix::F32 { .. } => RowBlocks::Other,
        }
    }

    /// Dot product of row `r` with the quantized activations `x`.
    #[inline]
    pub fn dot_row(&self, r: usize, x: &QActs) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if avx2::available() {
            // SAFETY (each call): AVX2 and FMA were detected at run time; the slices hold
            // the row's blocks, and `x` as many.
            match self.row_blocks(r) {
                RowBlocks::Q4_1 { d, m, qs } => return unsafe { avx2::dot_q4_1(d, m, qs, x) },
                RowBlocks::Q4_0 { d, qs } => return unsafe { avx2::dot_q4_0(d, qs, x) },
                RowBlocks::Q8_0 { d, qs } => return unsafe { avx2::dot_q8_0(d, qs, x) },
                RowBlocks::Other => {}
            }
        }
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
        match self.row_blocks(r) {
            RowBlocks::Q4_1 { d, m, qs } => return simd128::dot_q4_1(d, m, qs, x),
            RowBlocks::Q8_0 { d, qs } => return simd128::dot_q8_0(d, qs, x),
            _ => {}
        }
        self.dot_row_portable(r, x)
    }

    /// Row `r` against four activation vectors at once, each weight block unpacked once for
    /// all four; exactly what four [`Self::dot_row`] calls give. `None` where no such kernel
    /// exists for this format or machine.
    #[inline]
    pub fn dot_row_x4(&self, r: usize, xs: [&QActs; 4]) -> Option<[f32; 4]> {
        #[cfg(target_arch = "x86_64")]
        if avx2::available() {
            // SAFETY (each call): as in `dot_row`.
            match self.row_blocks(r) {
                RowBlocks::Q4_1 { d, m, qs } => {
                    return Some(unsafe { avx2::dot_q4_1_x4(d, m, qs, xs) });
                }
                RowBlocks::Q8_0 { d, qs } => return Some(unsafe { avx2::dot_q8_0_x4(d, qs, xs) }),
                _ => {}
            }
        }
        let _ = (r, xs);
        None
    }

    /// Rows `first..first + out.len()` against one activation vector in one kernel call,
    /// exactly what [`Self::dot_row`] gives row by row: a decoded token's rows are short
    /// (576 values here), and choosing the kernel and slicing the row cost a fifth of one.
    /// `false` where no such kernel exists for this format or machine.
    fn dot_rows(&self, first: usize, x: &QActs, out: &mut [f32]) -> bool {
        #[cfg(target_arch = "x86_64")]
        if avx2::available() {
            let nb = self.shape().1 / BLOCK;
            let blocks = first * nb..(first + out.len()) * nb;
            // SAFETY (each call): AVX2 and FMA were detected at run time; the slices hold
            // `out.len()` rows of `nb` blocks, and `x` holds `nb` blocks.
            match self {
                QMatrix::Q4_1 { d, m, qs, .. } => {
                    let qs = &qs[blocks.start * 16..blocks.end * 16];
                    let (d, m) = (&d[blocks.clone()], &m[blocks]);
                    unsafe { avx2::dot_rows_q4_1(nb, d, m, qs, x, out) };
                    return true;
                }
                QMatrix::Q8_0 { d, qs, .. } => {
                    let qs = &qs[blocks.start * BLOCK..blocks.end * BLOCK];
                    unsafe { avx2::dot_rows_q8_0(nb, &d[blocks], qs, x, out) };
                    return true;
                }
                _ => {}
            }
        }
        let _ = (first, x, out);
        false
    }

    /// The portable dot product, the reference for the SIMD kernels.
    pub fn dot_row_portable(&self, r: usize, x: &QActs) -> f32 {
        let (_, cols) = self.shape();
        let nb = cols / BLOCK;
        match self {
            QMatrix::Q4_1 { d, m, qs, .. } => {
                let mut acc = 0f32;
                for b in 0..nb {
                    let i = r * nb + b;
                    let s = dot_nibbles(
                        &qs[i * 16..i * 16 + 16],
                        &x.qs[b * BLOCK..b * BLOCK + BLOCK],
                    );
                    acc += d[i] * x.d[b] * s as f32 + m[i] * x.sum[b];
                }
                acc
            }
            QMatrix::Q4_0 { d, qs, .. } => {
                let mut acc = 0f32;
                for b in 0..nb {
                    let i = r * nb + b;
                    let s = dot_nibbles(
                        &qs[i * 16..i * 16 + 16],
                        &x.qs[b * BLOCK..b * BLOCK + BLOCK],
                    );
                    // Σ (q − 8)·x = Σ q·x − 8·Σ x
                    let xs: i32 = x.qs[b * BLOCK..b * BLOCK + BLOCK]
                        .iter()
                        .map(|&v| i32::from(v))
                        .sum();
                    acc += d[i] * x.d[b] * (s - 8 * xs) as f32;
                }
                acc
            }
            QMatrix::Q8_0 { d, qs, .. } => {
                let mut acc = 0f32;
                for b in 0..nb {
                    let i = r * nb + b;
                    let s = dot_i8(
                        &qs[i * BLOCK..i * BLOCK + BLOCK],
                        &x.qs[b * BLOCK..b * BLOCK + BLOCK],
                    );
                    acc += d[i] * x.d[b] * s as f32;
                }
                acc
            }
            QMatrix::Q6K { d, qs, .. } => {
                // Two sub-blocks of 16, each with its own scale, per block of activations.
                let mut acc = 0f32;
                for b in 0..nb {
                    let i = r * nb + b;
                    let w = &qs[i * BLOCK..i * BLOCK + BLOCK];
                    let xq = &x.qs[b * BLOCK..b * BLOCK + BLOCK];
                    let lo = dot_i8(&w[..16], &xq[..16]);
                    let hi = dot_i8(&w[16..], &xq[16..]);
                    acc += x.d[b] * (d[2 * i] * lo as f32 + d[2 * i + 1] * hi as f32);
                }
                acc
            }
            QMatrix::F32 { w, .. } => w[r * cols..(r + 1) * cols]
                .iter()
                .zip(&x.f)
                .map(|(a, b)| a * b)
                .sum(),
        }
    }

    /// `out[t][r] = row r · x[t]` for each activation vector in `xs`, rows split across threads.
    pub fn matmul(&self, xs: &[QActs], out: &mut [f32]) {
        matmul_many(&mut [(self, out)], xs);
    }

    /// Rows `first..` of a one-token product into `chunk`: a kernel call for the whole chunk
    /// where there is one.
    fn rows_into(&self, first: usize, x: &QActs, chunk: &mut [f32]) {
        if self.dot_rows(first, x, chunk) {
            return;
        }
        for (k, slot) in chunk.iter_mut().enumerate() {
            *slot = self.dot_row(first + k, x);
        }
    }

    /// Row `r` of the product for every token of `xs`, into `out[t]`.
    fn row_into(&self, r: usize, xs: &[QActs], out: &mut [f32]) {
        // Four activations a pass where a kernel reads each weight block once for them
        // (batched decode, prefill); the rest one at a time.
        let mut t = 0;
        while t + 4 <= xs.len() {
            let four = [&xs[t], &xs[t + 1], &xs[t + 2], &xs[t + 3]];
            match self.dot_row_x4(r, four) {
                Some(v) => out[t..t + 4].copy_from_slice(&v),
                None => break,
            }
            t += 4;
        }
        for (slot, x) in out[t..].iter_mut().zip(&xs[t..]) {
            *slot = self.dot_row(r, x);
        }
    }
}

/// A product's output `[tokens, rows]` shared by the threads that fill it: each task writes
/// only its own rows, for every token.
#[derive(Clone, Copy)]
struct SharedRows {
    ptr: *mut f32,
    len: usize,
    rows: usize,
}

// SAFETY: the pointer comes from a `&mut [f32]` that outlives the parallel region, and the
// tasks write disjoint elements (row `r` of token `t` is `t * rows + r`, each row one task's).
unsafe impl Send for SharedRows {}
unsafe impl Sync for SharedRows {}

/// Where one task of [`matmul_many`] writes.
enum Dest<'a> {
    /// One token: the task's rows are a contiguous run of the output.
    Run(&'a mut [f32]),
    /// Several tokens: `count` rows from the task's first, written token by token.
    Rows(SharedRows, usize),
}

/// [`QMatrix::matmul`] for several matrices that read the same activations (q, k and v;
/// gate and up) in one parallel region: on two cores, handing work to the other thread
/// costs about as much as a small matrix's product for one token, so one hand-off serves
/// them all.
pub fn matmul_many(parts: &mut [(&QMatrix, &mut [f32])], xs: &[QActs]) {
    let n = xs.len();
    if n == 0 {
        return;
    }
    // Threads take chunks of rows. With several tokens each chunk's values go straight to their
    // places in the token-major output from a block of the chunk's size; a whole row-major
    // scratch copy transposed afterwards had cost 7 % of a 512-token prefill, on one thread.
    const CHUNK: usize = 64;
    let mut tasks: Vec<(&QMatrix, usize, Dest<'_>)> = Vec::new();
    for (m, out) in parts.iter_mut() {
        let rows = m.shape().0;
        assert_eq!(out.len(), rows * n, "output of {rows} rows × {n} tokens");
        if n == 1 {
            for (ci, chunk) in out.chunks_mut(CHUNK).enumerate() {
                tasks.push((*m, ci * CHUNK, Dest::Run(chunk)));
            }
        } else {
            let shared = SharedRows {
                ptr: out.as_mut_ptr(),
                len: out.len(),
                rows,
            };
            for first in (0..rows).step_by(CHUNK) {
                tasks.push((*m, first, Dest::Rows(shared, CHUNK.min(rows - first))));
            }
        }
    }
    let work = |(m, first, dest): (&QMatrix, usize, Dest<'_>)| match dest {
        Dest::Run(chunk) => m.rows_into(first, &xs[0], chunk),
        Dest::Rows(out, count) => {
            // Row by row here, then each token's run of these rows written in one piece: the
            // reads stride over a block that stays in L1, the writes are contiguous.
            let mut block = vec![0f32; count * n];
            for (k, values) in block.chunks_mut(n).enumerate() {
                m.row_into(first + k, xs, values);
            }
            for t in 0..n {
                let start = t * out.rows + first;
                assert!(start + count <= out.len);
                // SAFETY: in bounds (checked), and rows `first..first + count` of every token
                // are this task's alone, so no other thread touches this run.
                let run = unsafe { std::slice::from_raw_parts_mut(out.ptr.add(start), count) };
                for (k, slot) in run.iter_mut().enumerate() {
                    *slot = block[k * n + t];
                }
            }
        }
    };
    crate::parallel::for_each(tasks, work);
}

/// AVX2 kernels for the formats of the default model (the portable loops above are the
/// reference they are tested against).
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;
    use std::sync::OnceLock;

    use super::{BLOCK, QActs};

    pub fn available() -> bool {
        static AVAILABLE: OnceLock<bool> = OnceLock::new();
        *AVAILABLE
            .get_or_init(|| is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"))
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
    /// when asked for, and the kernel waits on memory (measured: about 15 % faster decode).
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
                let xv = unsafe {
                    _mm256_loadu_si256(x[j].qs.as_ptr().add(b * BLOCK) as *const __m256i)
                };
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
                let xv = unsafe {
                    _mm256_loadu_si256(x[j].qs.as_ptr().add(b * BLOCK) as *const __m256i)
                };
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
        let ones = _mm256_set1_epi16(1);
        let mut acc = _mm256_setzero_ps();
        for (b, &db) in d.iter().enumerate() {
            prefetch_ahead(qs, b * BLOCK);
            // SAFETY: block b lies inside `qs` and `x.qs` (32 bytes a block each).
            let (w, xv) = unsafe {
                (
                    _mm256_loadu_si256(qs.as_ptr().add(b * BLOCK) as *const __m256i),
                    _mm256_loadu_si256(x.qs.as_ptr().add(b * BLOCK) as *const __m256i),
                )
            };
            // maddubs needs an unsigned operand: |w| times x with w's sign moved onto x.
            let sum16 = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(xv, w));
            let sum32 = _mm256_madd_epi16(sum16, ones);
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum32), _mm256_set1_ps(db * x.d[b]), acc);
        }
        hsum(acc)
    }
}

/// wasm SIMD128 kernels for the formats of the default model: what every browser we target
/// runs (the page's CPU path, and the engine on a software WebGPU adapter). LLVM does not
/// turn the portable loops' i8 widening products into `i32x4.dot_i16x8`; these do.
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
mod simd128 {
    use core::arch::wasm32::*;

    use super::{BLOCK, QActs};

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
        let nb = d.len();
        assert!(m.len() == nb && qs.len() == nb * 16 && x.qs.len() >= nb * BLOCK);
        let mask = u8x16_splat(0x0F);
        let mut acc = f32x4_splat(0.0);
        let mut mins = 0f32;
        for b in 0..nb {
            // SAFETY: the assert above puts block b inside `qs` (16 bytes a block) and
            // `x.qs` (32 a block); v128_load has no alignment requirement.
            let (raw, x0, x1) = unsafe {
                (
                    v128_load(qs.as_ptr().add(b * 16) as *const v128),
                    v128_load(x.qs.as_ptr().add(b * BLOCK) as *const v128),
                    v128_load(x.qs.as_ptr().add(b * BLOCK + 16) as *const v128),
                )
            };
            // Low nibbles are elements 0..16, high nibbles 16..32; both fit in i8.
            let s = i32x4_add(dot16(v128_and(raw, mask), x0), dot16(u8x16_shr(raw, 4), x1));
            acc = f32x4_add(
                acc,
                f32x4_mul(f32x4_convert_i32x4(s), f32x4_splat(d[b] * x.d[b])),
            );
            mins += m[b] * x.sum[b];
        }
        hsum(acc) + mins
    }

    /// Σ over blocks of d·dx·Σ(q·qx), for one Q8_0 row.
    pub fn dot_q8_0(d: &[f32], qs: &[i8], x: &QActs) -> f32 {
        let nb = d.len();
        assert!(qs.len() == nb * BLOCK && x.qs.len() >= nb * BLOCK);
        let mut acc = f32x4_splat(0.0);
        for (b, &db) in d.iter().enumerate() {
            // SAFETY: the assert above puts block b inside `qs` and `x.qs` (32 bytes a block).
            let (w0, w1, x0, x1) = unsafe {
                (
                    v128_load(qs.as_ptr().add(b * BLOCK) as *const v128),
                    v128_load(qs.as_ptr().add(b * BLOCK + 16) as *const v128),
                    v128_load(x.qs.as_ptr().add(b * BLOCK) as *const v128),
                    v128_load(x.qs.as_ptr().add(b * BLOCK + 16) as *const v128),
                )
            };
            let s = i32x4_add(dot16(w0, x0), dot16(w1, x1));
            acc = f32x4_add(
                acc,
                f32x4_mul(f32x4_convert_i32x4(s), f32x4_splat(db * x.d[b])),
            );
        }
        hsum(acc)
    }
}

/// Σ nibble·x over one block: low nibbles pair with x[0..16], high with x[16..32].
#[inline(always)]
fn dot_nibbles(q: &[u8], x: &[i8]) -> i32 {
    let mut lo = [0i8; 16];
    let mut hi = [0i8; 16];
    for j in 0..16 {
        lo[j] = (q[j] & 15) as i8;
        hi[j] = (q[j] >> 4) as i8;
    }
    dot_i8(&lo, &x[..16]) + dot_i8(&hi, &x[16..32])
}

#[inline(always)]
fn dot_i8(a: &[i8], b: &[i8]) -> i32 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| i32::from(x) * i32::from(y))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::encode;

    fn reference(w: &[f32], x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
        (0..rows)
            .map(|r| (0..cols).map(|c| w[r * cols + c] * x[c]).sum())
            .collect()
    }

    #[test]
    fn quantized_matmul_matches_dequantized_reference() {
        let rows = 70;
        // Magnitudes that change every 16 values, so sub-block scales differ.
        let weights = |cols: usize| -> Vec<f32> {
            (0..rows * cols)
                .map(|i| ((i * 7919 % 211) as f32 - 105.0) / 100.0 * (1 + i / 16 % 5) as f32)
                .collect()
        };
        for (ty, cols, encoder) in [
            (TensorType::Q4_1, 96, encode::q4_1 as fn(&[f32]) -> Vec<u8>),
            (TensorType::Q4_0, 96, encode::q4_0),
            (TensorType::Q8_0, 96, encode::q8_0),
            (TensorType::Q4_K, 512, encode::q4_k),
            (TensorType::Q6_K, 512, encode::q6_k),
        ] {
            let bytes = encoder(&weights(cols));
            let xs: Vec<Vec<f32>> = (0..3)
                .map(|t| {
                    (0..cols)
                        .map(|i| ((i * 31 + t * 17) % 23) as f32 / 10.0 - 1.1)
                        .collect()
                })
                .collect();
            let m = QMatrix::from_gguf(ty, &bytes, rows, cols).expect("build");
            let deq = quant::dequantize(ty, &bytes).expect("dequant");
            let acts: Vec<QActs> = xs.iter().map(|x| QActs::quantize(x)).collect();
            let mut out = vec![0f32; rows * xs.len()];
            m.matmul(&acts, &mut out);
            for (t, x) in xs.iter().enumerate() {
                let want = reference(&deq, x, rows, cols);
                for r in 0..rows {
                    let got = out[t * rows + r];
                    // 8-bit activations: error ≤ ~1 % of the row's magnitude.
                    let scale: f32 = deq[r * cols..(r + 1) * cols]
                        .iter()
                        .zip(x)
                        .map(|(a, b)| (a * b).abs())
                        .sum();
                    assert!(
                        (got - want[r]).abs() <= 0.01 * scale + 1e-4,
                        "{ty:?} t{t} r{r}: {got} vs {}",
                        want[r]
                    );
                }
            }
            for r in 0..rows {
                let (fast, portable) = (m.dot_row(r, &acts[0]), m.dot_row_portable(r, &acts[0]));
                assert!(
                    (fast - portable).abs() <= 1e-4 * portable.abs().max(1.0),
                    "{ty:?} row {r}: {fast} vs {portable}"
                );
            }
            let mut row = vec![0f32; cols];
            m.row(5, &mut row);
            assert_eq!(row, deq[5 * cols..6 * cols]);
        }
    }

    #[test]
    fn four_at_a_time_is_exactly_one_at_a_time() {
        // Batched and alone must give the same bits, or a batch could change a greedy answer.
        let (rows, cols) = (9, 128);
        let w: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 4099 % 257) as f32 - 128.0) / 64.0)
            .collect();
        let acts: Vec<QActs> = (0..7)
            .map(|t| {
                let x: Vec<f32> = (0..cols)
                    .map(|i| ((i * 13 + t * 29) % 31) as f32 / 8.0 - 1.9)
                    .collect();
                QActs::quantize(&x)
            })
            .collect();
        for (ty, bytes) in [
            (TensorType::Q4_1, encode::q4_1(&w)),
            (TensorType::Q4_0, encode::q4_0(&w)),
            (TensorType::Q8_0, encode::q8_0(&w)),
        ] {
            let m = QMatrix::from_gguf(ty, &bytes, rows, cols).expect("build");
            let mut out = vec![0f32; rows * acts.len()];
            m.matmul(&acts, &mut out);
            for (t, x) in acts.iter().enumerate() {
                for r in 0..rows {
                    assert_eq!(
                        out[t * rows + r].to_bits(),
                        m.dot_row(r, x).to_bits(),
                        "{ty:?} t{t} r{r}"
                    );
                }
            }
            // One token: whole chunks of rows go to the kernel at once (more rows than a
            // chunk, and a chunk cut short), with the same bits as row by row.
            let tall = 150;
            let w: Vec<f32> = (0..tall * cols)
                .map(|i| ((i * 613 % 239) as f32 - 119.0) / 50.0)
                .collect();
            let bytes = match ty {
                TensorType::Q4_1 => encode::q4_1(&w),
                TensorType::Q4_0 => encode::q4_0(&w),
                _ => encode::q8_0(&w),
            };
            let m = QMatrix::from_gguf(ty, &bytes, tall, cols).expect("build");
            // Several tokens over several chunks of rows: every value in its token's row.
            let mut all = vec![0f32; tall * acts.len()];
            m.matmul(&acts, &mut all);
            for (t, x) in acts.iter().enumerate() {
                for r in 0..tall {
                    assert_eq!(
                        all[t * tall + r].to_bits(),
                        m.dot_row(r, x).to_bits(),
                        "{ty:?} tall t{t} r{r}"
                    );
                }
            }
            let mut one = vec![0f32; tall];
            m.matmul(&acts[..1], &mut one);
            for (r, got) in one.iter().enumerate() {
                assert_eq!(
                    got.to_bits(),
                    m.dot_row(r, &acts[0]).to_bits(),
                    "{ty:?} one token r{r}"
                );
            }
        }
    }
}
