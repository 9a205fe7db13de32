//! Weight matrices that stay quantized in memory, and the matrix × vector products over
//! them. Activations are quantized to 8 bits the way llama.cpp rounds them for each weight
//! format ([`ActFormat`]), so the inner loop is an integer dot product that the compiler
//! vectorizes; every family sums in the order of llama.cpp's AVX2 build (`super_blocks` for the
//! K-quants), so the products equal its bits.

use std::sync::OnceLock;

use crate::quant::{self, Nibbles, QuantError, TensorType, f16_to_f32};
use super_blocks::{Q4KGroup, Q4KRow, WOVEN, WOVEN_BYTES, woven_place};

const BLOCK: usize = 32;
/// Values in a K-quant's super-block.
const QK_K: usize = 256;

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
        acts: ActFormat,
    },
    /// Q4_0 repacked: per-block f32 scale, 16 bytes of nibbles per block (value − 8).
    Q4_0 {
        rows: usize,
        cols: usize,
        d: Vec<f32>,
        qs: Vec<u8>,
    },
    /// Q8_0 repacked: per-block f16 scale (the file's bits), 32 signed bytes per block.
    Q8_0 {
        rows: usize,
        cols: usize,
        d: Vec<u16>,
        qs: Vec<i8>,
    },
    /// Q5_0 at the file's size: per-block f16 scale, the 32 high bits, 16 bytes of nibbles;
    /// x = d·(q − 16), widened to Q8_0's signed bytes inside the kernels.
    Q5_0 {
        rows: usize,
        cols: usize,
        d: Vec<u16>,
        qh: Vec<u32>,
        qs: Vec<u8>,
    },
    /// Q5_1 and Q5_K's sub-blocks widened: per-block f32 scale and minimum, one byte per
    /// value (`0..32`); x = d·q + m, read as Q4_1 is.
    Q5_1 {
        rows: usize,
        cols: usize,
        d: Vec<f32>,
        m: Vec<f32>,
        qs: Vec<u8>,
        acts: ActFormat,
    },
    /// Q4_K with its integer scales, as llama.cpp's sums need them: per super-block of 256
    /// its scale and minimum scale widened to f32 and the eight sub-blocks' 6-bit scales and
    /// minimums, then Q4_1's 16 bytes of nibbles per 32 values; x = d·sc·q − dmin·m. Rows
    /// are woven in groups of eight (`super_blocks::Q4KGroup`), the last group padded with
    /// zeros.
    Q4K {
        rows: usize,
        cols: usize,
        d: Vec<f32>,
        dmin: Vec<f32>,
        sc: Vec<u8>,
        m: Vec<u8>,
        qs: Vec<u8>,
    },
    /// Q6_K with its integer scales: per super-block its scale widened to f32 and sixteen
    /// signed scales of 16 values, then the values (`q` in `0..64`) packed as the file packs
    /// them, four low bits and two high (`super_blocks::Q6KRow`); x = d·sc·(q − 32).
    Q6K {
        rows: usize,
        cols: usize,
        d: Vec<f32>,
        sc: Vec<i8>,
        ql: Vec<u8>,
        qh: Vec<u8>,
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
        d: &'a [u16],
        qs: &'a [i8],
    },
    Q5_0 {
        d: &'a [u16],
        qh: &'a [u32],
        qs: &'a [u8],
    },
    Q5_1 {
        d: &'a [f32],
        m: &'a [f32],
        qs: &'a [u8],
    },
    /// A row of eight woven together.
    Q4K(Q4KRow<'a>),
    /// Per super-block of 256: a scale and 16 sub-block scales, then the packed values.
    Q6K {
        d: &'a [f32],
        sc: &'a [i8],
        ql: &'a [u8],
        qh: &'a [u8],
    },
    Other,
}

/// How llama.cpp rounds the activations that meet a weight format (its `vec_dot_type`).
/// Every format is held as blocks of 32 (a scale, the block's sum, 32 values), so each
/// kernel reads all three; they differ in where the scale comes from and how it is rounded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ActFormat {
    /// Q8_0, for Q4_0, Q5_0 and Q8_0 weights: a scale per 32 values rounded to f16.
    #[default]
    Q8_0,
    /// Q8_1, for Q4_1 and Q5_1 weights: Q8_0 with the block's sum, also rounded to f16.
    Q8_1,
    /// Q8_K, for the K-quants: one f32 scale per 256 values, set by the value of largest
    /// magnitude (which becomes −127).
    Q8K,
}

/// Where a token stands among the tokens of its sequence that a forward pass computes
/// together: llama.cpp picks some products' kernels (and so their order of sums) by the
/// number of tokens in its batch and a token's index in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    /// The token's index among them.
    pub index: usize,
    /// How many there are.
    pub of: usize,
}

/// The tokens llama.cpp computes in one batch at most (its default `n_ubatch`, the
/// reference's).
pub(crate) const UBATCH: usize = 512;

impl Place {
    /// A token computed alone (decoding).
    pub const ALONE: Place = Place { index: 0, of: 1 };

    /// Where the token `at` of a pass over `len` tokens stands: llama.cpp cuts a pass into
    /// batches of [`UBATCH`].
    pub(crate) fn in_pass(at: usize, len: usize) -> Place {
        let first = at - at % UBATCH;
        Place {
            index: at - first,
            of: (len - first).min(UBATCH),
        }
    }

    /// Whether the token shares its batch with others, which takes llama.cpp's attention
    /// products through tinyBLAS.
    pub(crate) fn batched(self) -> bool {
        self.of > 1
    }

    /// Whether a token here sums every product in the order it would at `other`: the two
    /// places differ only in what no kernel reads.
    pub(crate) fn sums_as(self, other: Place) -> bool {
        self.batched() == other.batched()
            && super_blocks::q4k_in_fours(self) == super_blocks::q4k_in_fours(other)
            && super_blocks::q6k_tiled(self) == super_blocks::q6k_tiled(other)
    }
}

impl Default for Place {
    fn default() -> Self {
        Place::ALONE
    }
}

/// Activations quantized to 8 bits per block of 32: scale, block sum (for Q4_1's minimum), values.
#[derive(Debug, Clone, Default)]
pub struct QActs {
    pub d: Vec<f32>,
    pub sum: Vec<f32>,
    pub qs: Vec<i8>,
    pub f: Vec<f32>,
    /// The rounding these values were made with.
    pub format: ActFormat,
    /// In Q8_K, the sum of each 16 values (llama.cpp's `bsums`), which the K-quants' minimums
    /// and offsets multiply; empty in the other formats.
    pub bsums: Vec<i32>,
    /// The token's place in its pass, which decides the K-quants' order of sums.
    pub place: Place,
}

impl QActs {
    /// Quantizes `x` (length a multiple of 32) as Q8_0; keeps the f32 copy for f32 weights.
    pub fn quantize(x: &[f32]) -> Self {
        Self::quantize_as(x, ActFormat::Q8_0)
    }

    /// Quantizes `x` in `format`.
    pub fn quantize_as(x: &[f32], format: ActFormat) -> Self {
        let mut a = QActs::default();
        a.fill(x, format);
        a
    }

    /// Re-quantizes into the existing buffers.
    pub fn fill(&mut self, x: &[f32], format: ActFormat) {
        let blocks = x.len() / BLOCK;
        self.d.resize(blocks, 0.0);
        self.sum.resize(blocks, 0.0);
        self.qs.resize(blocks * BLOCK, 0);
        self.f.clear();
        self.f.extend_from_slice(x);
        self.format = format;
        self.bsums.clear();
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the feature was detected just now.
            return unsafe { self.quantize_avx2(x) };
        }
        self.quantize_blocks(x);
    }

    /// [`Self::quantize_blocks`] compiled for AVX2: it runs on every activation of every
    /// product, and the baseline target's four lanes leave it a tenth of a prompt's time.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn quantize_avx2(&mut self, x: &[f32]) {
        self.quantize_blocks(x);
    }

    /// Fills the sized buffers from `x` in `self.format`, a group (one scale) at a time.
    #[inline(always)]
    fn quantize_blocks(&mut self, x: &[f32]) {
        let format = self.format;
        let group = if format == ActFormat::Q8K && x.len().is_multiple_of(256) {
            256
        } else {
            BLOCK
        };
        let blocks_per_group = group / BLOCK;
        let groups = x
            .chunks_exact(group)
            .zip(self.qs.chunks_exact_mut(group))
            .zip(self.d.chunks_exact_mut(blocks_per_group))
            .zip(self.sum.chunks_exact_mut(blocks_per_group));
        for (((values, qs), d), sums) in groups {
            let (unrounded, inverse) = act_scale(values, format);
            let scale = match format {
                ActFormat::Q8_0 | ActFormat::Q8_1 => round_to_f16(unrounded),
                ActFormat::Q8K => unrounded,
            };
            let blocks = values.chunks_exact(BLOCK).zip(qs.chunks_exact_mut(BLOCK));
            for (((block, q), d), sum) in blocks.zip(d).zip(sums.iter_mut()) {
                let s = quantize_block(block, inverse, q);
                if format == ActFormat::Q8K {
                    let halves = q.chunks_exact(16);
                    self.bsums
                        .extend(halves.map(|h| h.iter().map(|&v| i32::from(v)).sum::<i32>()));
                }
                *d = scale;
                // Q8_1's sum is the unrounded scale's, then rounded (`quantize_row_q8_1`).
                *sum = match format {
                    ActFormat::Q8_1 => round_to_f16(unrounded * s as f32),
                    ActFormat::Q8_0 | ActFormat::Q8K => scale * s as f32,
                };
            }
        }
    }
}

/// Rounds one block's `values × inverse` to integers into `out` (at most 127, as Q8_K's
/// `MIN(127, …)` has it: −127/max can round a value to 128) and returns their sum. Integer
/// steps throughout, so the loops run vector-wide.
#[inline(always)]
fn quantize_block(values: &[f32], inverse: f32, out: &mut [i8]) -> i32 {
    let mut q = [0i32; BLOCK];
    for (q, &v) in q.iter_mut().zip(values) {
        *q = nearest_int(v * inverse).min(127);
    }
    for (o, &q) in out.iter_mut().zip(&q) {
        *o = q as i8;
    }
    q.iter().sum()
}

/// `x` (|x| ≤ 2²²) rounded to the nearest integer, ties to even, as ggml's `nearest_int` does
/// it: adding 1.5·2²³ leaves no fraction bits, and the integer is read from the mantissa.
#[inline(always)]
fn nearest_int(x: f32) -> i32 {
    const MAGIC: f32 = 12_582_912.0;
    ((x + MAGIC).to_bits() & 0x007F_FFFF) as i32 - 0x0040_0000
}

/// A group's scale before it is stored (Q8_0 and Q8_1 store it rounded to f16) and the
/// factor its values are multiplied by before rounding, each computed as llama.cpp's
/// quantizer computes it.
fn act_scale(values: &[f32], format: ActFormat) -> (f32, f32) {
    let amax = values.iter().fold(0f32, |a, v| a.max(v.abs()));
    match format {
        ActFormat::Q8_0 | ActFormat::Q8_1 => {
            let inverse = if amax > 0.0 { 127.0 / amax } else { 0.0 };
            (amax / 127.0, inverse)
        }
        ActFormat::Q8K => {
            // The first value of largest magnitude, with its sign, as Q8_K's scan keeps it.
            let max = values.iter().copied().find(|v| v.abs() == amax);
            let Some(max) = max.filter(|&m| m != 0.0) else {
                return (0.0, 0.0);
            };
            let inverse = -127.0 / max;
            (1.0 / inverse, inverse)
        }
    }
}

/// `x` rounded to the nearest f16 (ties to even), back as f32. This runs for every cached key
/// and value, every query and every attention weight, so f16's normal range is rounded here
/// by dropping mantissa bits, inline and vector-wide; `half`'s conversion (a call that checks
/// for F16C each time) takes the rest: subnormals, overflow, NaN.
#[inline]
pub(crate) fn round_to_f16(x: f32) -> f32 {
    let bits = x.to_bits();
    if rounds_to_f16_normal(bits) {
        let lsb = (bits >> 13) & 1;
        f32::from_bits((bits + 0x0FFF + lsb) & !0x1FFF)
    } else {
        half::f16::from_f32(x).to_f32()
    }
}

/// Every value of `x` rounded to the nearest f16 as [`round_to_f16`] rounds it, eight at a
/// time through F16C's conversions where the machine has them (a query's and a softmax's
/// every value pass through here).
pub(crate) fn round_slice_to_f16(x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("f16c") {
        // SAFETY: the feature was detected just now.
        return unsafe { round_slice_f16c(x) };
    }
    x.iter_mut().for_each(|v| *v = round_to_f16(*v));
}

/// [`round_slice_to_f16`] by F16C: to f16 with round-to-nearest-even and back, exact.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,f16c")]
fn round_slice_f16c(x: &mut [f32]) {
    use std::arch::x86_64::*;
    let mut chunks = x.chunks_exact_mut(8);
    for chunk in &mut chunks {
        // SAFETY: the chunk holds eight floats; unaligned loads and stores.
        unsafe {
            let v = _mm256_loadu_ps(chunk.as_ptr());
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
            _mm256_storeu_ps(chunk.as_mut_ptr(), _mm256_cvtph_ps(h));
        }
    }
    for v in chunks.into_remainder() {
        *v = round_to_f16(*v);
    }
}

/// The bits of `x` rounded to the nearest f16, as [`round_to_f16`] rounds it.
#[inline]
pub(crate) fn f16_bits(x: f32) -> u16 {
    if rounds_to_f16_normal(x.to_bits()) {
        let r = round_to_f16(x).to_bits();
        let exponent = ((r >> 23) & 0xFF) - 112;
        (((r >> 16) & 0x8000) | (exponent << 10) | ((r >> 13) & 0x3FF)) as u16
    } else {
        half::f16::from_f32(x).to_bits()
    }
}

/// Whether the f32 with these bits lies in f16's normal range (from 2⁻¹⁴ to below 65520),
/// where rounding is dropping mantissa bits.
#[inline]
fn rounds_to_f16_normal(bits: u32) -> bool {
    (F16_MIN_NORMAL_BITS..F16_OVERFLOW_BITS).contains(&(bits & 0x7FFF_FFFF))
}

/// 2⁻¹⁴ as f32 bits: f16's least normal magnitude.
const F16_MIN_NORMAL_BITS: u32 = 0x3880_0000;
/// 65520 as f32 bits: the least magnitude that rounds to f16's infinity.
const F16_OVERFLOW_BITS: u32 = 0x477F_F000;

/// A family of product kernels. Each family gives the same bits for a row and token however
/// it batches the product (the order is set by the token's [`Place`] in its pass alone), and
/// the x86 and portable families the same bits as one another: llama.cpp's AVX2 build's
/// (Q4_0 aside, which llama.cpp repacks; wasm SIMD has no fused multiply-add).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernels {
    /// The portable loops, on any machine.
    Portable,
    /// x86-64 with AVX2 and FMA.
    Avx2,
    /// x86-64 with AVX-512 F, BW and VNNI: tiles of rows × tokens (AVX2 for Q4_0).
    Avx512Vnni,
    /// wasm32 with SIMD128.
    Simd128,
}

/// `a·b + c` rounded once, as llama.cpp's x86 build computes the expressions its compiler
/// fuses; in two roundings on wasm, whose fused multiply-add exists only in software, at
/// many times the cost (its results are the browser's own, not llama.cpp's to the bit).
#[inline(always)]
pub(crate) fn fused(a: f32, b: f32, c: f32) -> f32 {
    if cfg!(target_arch = "wasm32") {
        a * b + c
    } else {
        a.mul_add(b, c)
    }
}

impl Kernels {
    /// Every family, best first.
    const ALL: [Kernels; 4] = [
        Kernels::Avx512Vnni,
        Kernels::Avx2,
        Kernels::Simd128,
        Kernels::Portable,
    ];

    /// The name `STRADDLE_CPU_KERNELS` takes and benchmarks print.
    pub fn name(self) -> &'static str {
        match self {
            Kernels::Portable => "portable",
            Kernels::Avx2 => "avx2",
            Kernels::Avx512Vnni => "avx512-vnni",
            Kernels::Simd128 => "simd128",
        }
    }

    /// Whether this machine runs them.
    pub fn runs_here(self) -> bool {
        match self {
            Kernels::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Kernels::Avx2 => avx2::available(),
            #[cfg(target_arch = "x86_64")]
            Kernels::Avx512Vnni => avx512::available() && avx2::available(),
            #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
            Kernels::Simd128 => true,
            #[allow(unreachable_patterns)] // on targets with every family
            _ => false,
        }
    }

    /// The families this machine runs, best first.
    pub fn available() -> Vec<Kernels> {
        Self::ALL.into_iter().filter(|k| k.runs_here()).collect()
    }

    /// The family every product uses: the best this machine runs, or the one named by
    /// `STRADDLE_CPU_KERNELS` (to compare them) when it runs here.
    pub fn detected() -> Kernels {
        static DETECTED: OnceLock<Kernels> = OnceLock::new();
        *DETECTED.get_or_init(|| {
            let best = Self::available()[0];
            let Ok(wanted) = std::env::var("STRADDLE_CPU_KERNELS") else {
                return best;
            };
            match Self::ALL.into_iter().find(|k| k.name() == wanted) {
                Some(k) if k.runs_here() => k,
                _ => {
                    tracing::warn!(
                        "STRADDLE_CPU_KERNELS={wanted:?} is not one this machine runs ({}); using {}",
                        Self::available().iter().map(|k| k.name()).collect::<Vec<_>>().join(", "),
                        best.name()
                    );
                    best
                }
            }
        })
    }
}

impl Kernels {
    /// This family's kernel for each format, or the portable ones where it does not run here.
    fn table(self) -> &'static KernelTable {
        if !self.runs_here() {
            return &PORTABLE;
        }
        match self {
            #[cfg(target_arch = "x86_64")]
            Kernels::Avx2 => &avx2::TABLE,
            #[cfg(target_arch = "x86_64")]
            Kernels::Avx512Vnni => &avx512::TABLE,
            #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
            Kernels::Simd128 => &simd128::TABLE,
            _ => &PORTABLE,
        }
    }
}

/// Row `r` · `x`.
type DotFn = fn(&QMatrix, usize, &QActs) -> f32;
/// Rows `first..first + count` × every token of `xs`, into `out[k * xs.len() + t]`.
type RowsFn = fn(&QMatrix, usize, usize, &[QActs], &mut [f32]);

/// One format's products in one kernel family (llama.cpp's `type_traits_cpu` entry): the
/// family is resolved once, so a product looks its kernel up instead of testing features.
#[derive(Clone, Copy)]
struct FormatKernels {
    dot: DotFn,
    /// A kernel for several rows or tokens at once; `None`: `dot` for each pair.
    rows: Option<RowsFn>,
}

/// Each format's kernels in one family.
struct KernelTable {
    q4_1: FormatKernels,
    q4_0: FormatKernels,
    q8_0: FormatKernels,
    q5_0: FormatKernels,
    q5_1: FormatKernels,
    q4k: FormatKernels,
    q6k: FormatKernels,
    f32: FormatKernels,
}

impl KernelTable {
    /// The kernels for `w`'s format.
    fn of(&self, w: &QMatrix) -> FormatKernels {
        match w {
            QMatrix::Q4_1 { .. } => self.q4_1,
            QMatrix::Q4_0 { .. } => self.q4_0,
            QMatrix::Q8_0 { .. } => self.q8_0,
            QMatrix::Q5_0 { .. } => self.q5_0,
            QMatrix::Q5_1 { .. } => self.q5_1,
            QMatrix::Q4K { .. } => self.q4k,
            QMatrix::Q6K { .. } => self.q6k,
            QMatrix::F32 { .. } => self.f32,
        }
    }
}

/// The portable loops, for a format a family has no kernel for.
const PORTABLE_FORMAT: FormatKernels = FormatKernels {
    dot: QMatrix::dot_row_portable,
    rows: None,
};

/// The portable loops for every format.
const PORTABLE: KernelTable = KernelTable {
    q4_1: PORTABLE_FORMAT,
    q4_0: PORTABLE_FORMAT,
    q8_0: PORTABLE_FORMAT,
    q5_0: PORTABLE_FORMAT,
    q5_1: PORTABLE_FORMAT,
    q4k: PORTABLE_FORMAT,
    q6k: PORTABLE_FORMAT,
    f32: PORTABLE_FORMAT,
};

/// [`RowsFn`] from a family's dot product alone: each row against each token.
fn each_row_and_token(dot: DotFn, w: &QMatrix, first: usize, xs: &[QActs], out: &mut [f32]) {
    if xs.is_empty() {
        return;
    }
    for (k, values) in out.chunks_mut(xs.len()).enumerate() {
        for (slot, x) in values.iter_mut().zip(xs) {
            *slot = dot(w, first + k, x);
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
        let blocks = quant::blocks(ty, bytes);
        let whole = |block: usize| cols.is_multiple_of(block);
        Ok(match ty {
            TensorType::Q4_1 if whole(BLOCK) => {
                Self::q4_1(rows, cols, ActFormat::Q8_1, blocks.map(quant::unpack_q4_1))
            }
            TensorType::Q4_K if whole(256) => Self::q4_k(rows, cols, blocks),
            TensorType::Q4_0 if whole(BLOCK) => {
                Self::q4_0(rows, cols, blocks.map(quant::unpack_q4_0))
            }
            TensorType::Q5_0 if whole(BLOCK) => {
                Self::q5_0(rows, cols, blocks.map(quant::split_q5_0))
            }
            TensorType::Q8_0 if whole(BLOCK) => {
                Self::q8_0(rows, cols, blocks.map(quant::split_q8_0))
            }
            TensorType::Q5_1 if whole(BLOCK) => {
                Self::q5_1(rows, cols, ActFormat::Q8_1, blocks.map(quant::unpack_q5_1))
            }
            TensorType::Q5_K if whole(256) => Self::q5_1(
                rows,
                cols,
                ActFormat::Q8K,
                blocks.flat_map(quant::unpack_q5_k),
            ),
            TensorType::Q6_K if whole(256) => Self::q6_k(rows, cols, blocks),
            other => QMatrix::F32 {
                rows,
                cols,
                w: quant::dequantize(other, bytes)?,
            },
        })
    }

    /// Q4_1's layout from blocks of `(d, m, nibbles)`.
    fn q4_1(
        rows: usize,
        cols: usize,
        acts: ActFormat,
        blocks: impl Iterator<Item = (f32, f32, Nibbles)>,
    ) -> Self {
        let nb = rows * cols / BLOCK;
        let (mut d, mut m, mut qs) = (
            Vec::with_capacity(nb),
            Vec::with_capacity(nb),
            Vec::with_capacity(nb * 16),
        );
        for (scale, min, nibbles) in blocks {
            d.push(scale);
            m.push(min);
            qs.extend_from_slice(&nibbles);
        }
        QMatrix::Q4_1 {
            rows,
            cols,
            d,
            m,
            qs,
            acts,
        }
    }

    /// Q4_0's layout from blocks of `(d, nibbles)`.
    fn q4_0(rows: usize, cols: usize, blocks: impl Iterator<Item = (f32, Nibbles)>) -> Self {
        let nb = rows * cols / BLOCK;
        let (mut d, mut qs) = (Vec::with_capacity(nb), Vec::with_capacity(nb * 16));
        for (scale, nibbles) in blocks {
            d.push(scale);
            qs.extend_from_slice(&nibbles);
        }
        QMatrix::Q4_0 { rows, cols, d, qs }
    }

    /// Q5_0's layout from blocks of `(d, high bits, nibbles)`.
    fn q5_0(rows: usize, cols: usize, blocks: impl Iterator<Item = (u16, u32, Nibbles)>) -> Self {
        let nb = rows * cols / BLOCK;
        let (mut d, mut qh, mut qs) = (
            Vec::with_capacity(nb),
            Vec::with_capacity(nb),
            Vec::with_capacity(nb * 16),
        );
        for (scale, high, nibbles) in blocks {
            d.push(scale);
            qh.push(high);
            qs.extend_from_slice(&nibbles);
        }
        QMatrix::Q5_0 {
            rows,
            cols,
            d,
            qh,
            qs,
        }
    }

    /// The widened Q5_1 layout from blocks of `(d, m, values)`.
    fn q5_1(
        rows: usize,
        cols: usize,
        acts: ActFormat,
        blocks: impl Iterator<Item = (f32, f32, [u8; 32])>,
    ) -> Self {
        let nb = rows * cols / BLOCK;
        let (mut d, mut m, mut qs) = (
            Vec::with_capacity(nb),
            Vec::with_capacity(nb),
            Vec::with_capacity(nb * BLOCK),
        );
        for (scale, min, values) in blocks {
            d.push(scale);
            m.push(min);
            qs.extend_from_slice(&values);
        }
        QMatrix::Q5_1 {
            rows,
            cols,
            d,
            m,
            qs,
            acts,
        }
    }

    /// Q8_0's layout from blocks of `(d, values)`.
    fn q8_0(rows: usize, cols: usize, blocks: impl Iterator<Item = (u16, [i8; 32])>) -> Self {
        let nb = rows * cols / BLOCK;
        let (mut d, mut qs) = (Vec::with_capacity(nb), Vec::with_capacity(nb * BLOCK));
        for (scale, values) in blocks {
            d.push(scale);
            qs.extend_from_slice(&values);
        }
        QMatrix::Q8_0 { rows, cols, d, qs }
    }

    /// Q4_K's layout: integer scales and nibbles, eight rows woven together.
    fn q4_k<'a>(rows: usize, cols: usize, blocks: impl Iterator<Item = &'a [u8]>) -> Self {
        let (supers, nb) = (cols / QK_K, cols / BLOCK);
        let padded = rows.next_multiple_of(WOVEN);
        let (mut d, mut dmin) = (vec![0f32; padded * supers], vec![0f32; padded * supers]);
        let (mut sc, mut m) = (vec![0u8; padded * nb], vec![0u8; padded * nb]);
        let mut qs = vec![0u8; padded * nb * 16];
        for (i, b) in blocks.enumerate().take(rows * supers) {
            let (r, s) = (i / supers, i % supers);
            let (group, lane) = woven_place(r);
            let block = quant::unpack_q4_k(b);
            let at = (group * supers + s) * WOVEN + lane;
            (d[at], dmin[at]) = (block.d, block.dmin);
            for (j, (_, _, nibbles)) in block.as_q4_1().iter().enumerate() {
                let sub = group * nb + s * 8 + j;
                (sc[sub * WOVEN + lane], m[sub * WOVEN + lane]) = (block.sc[j], block.m[j]);
                for (g, four) in nibbles.chunks_exact(4).enumerate() {
                    let at = sub * WOVEN_BYTES + 4 * WOVEN * g + 4 * lane;
                    qs[at..at + 4].copy_from_slice(four);
                }
            }
        }
        QMatrix::Q4K {
            rows,
            cols,
            d,
            dmin,
            sc,
            m,
            qs,
        }
    }

    /// Q6_K's layout: integer scales, the values packed as in the file.
    fn q6_k<'a>(rows: usize, cols: usize, blocks: impl Iterator<Item = &'a [u8]>) -> Self {
        let nb = rows * cols / QK_K;
        let (mut d, mut sc) = (Vec::with_capacity(nb), Vec::with_capacity(nb * 16));
        let (mut ql, mut qh) = (Vec::with_capacity(nb * 128), Vec::with_capacity(nb * 64));
        for b in blocks {
            let block = quant::unpack_q6_k(b);
            d.push(block.d);
            sc.extend_from_slice(&block.sc);
            ql.extend_from_slice(&b[..128]);
            qh.extend_from_slice(&b[128..192]);
        }
        QMatrix::Q6K {
            rows,
            cols,
            d,
            sc,
            ql,
            qh,
        }
    }

    /// The activation rounding llama.cpp pairs with this matrix's format in the file.
    pub fn act_format(&self) -> ActFormat {
        match self {
            QMatrix::Q4_1 { acts, .. } | QMatrix::Q5_1 { acts, .. } => *acts,
            QMatrix::Q4K { .. } | QMatrix::Q6K { .. } => ActFormat::Q8K,
            QMatrix::Q4_0 { .. } | QMatrix::Q8_0 { .. } | QMatrix::Q5_0 { .. } => ActFormat::Q8_0,
            QMatrix::F32 { .. } => ActFormat::Q8_0,
        }
    }

    /// `(rows, cols)`.
    pub fn shape(&self) -> (usize, usize) {
        match self {
            QMatrix::Q4_1 { rows, cols, .. }
            | QMatrix::Q4_0 { rows, cols, .. }
            | QMatrix::Q8_0 { rows, cols, .. }
            | QMatrix::Q5_0 { rows, cols, .. }
            | QMatrix::Q5_1 { rows, cols, .. }
            | QMatrix::Q4K { rows, cols, .. }
            | QMatrix::Q6K { rows, cols, .. }
            | QMatrix::F32 { rows, cols, .. } => (*rows, *cols),
        }
    }

    /// Bytes held in memory.
    pub fn bytes(&self) -> usize {
        match self {
            QMatrix::Q4_1 { d, m, qs, .. } => 4 * (d.len() + m.len()) + qs.len(),
            QMatrix::Q4_0 { d, qs, .. } => 4 * d.len() + qs.len(),
            QMatrix::Q8_0 { d, qs, .. } => 2 * d.len() + qs.len(),
            QMatrix::Q5_0 { d, qh, qs, .. } => 2 * d.len() + 4 * qh.len() + qs.len(),
            QMatrix::Q5_1 { d, m, qs, .. } => 4 * (d.len() + m.len()) + qs.len(),
            QMatrix::Q4K {
                d, dmin, sc, m, qs, ..
            } => 4 * (d.len() + dmin.len()) + sc.len() + m.len() + qs.len(),
            QMatrix::Q6K { d, sc, ql, qh, .. } => 4 * d.len() + sc.len() + ql.len() + qh.len(),
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
                    let d = f16_to_f32(d[i]);
                    for j in 0..BLOCK {
                        out[b * BLOCK + j] = d * f32::from(qs[i * BLOCK + j]);
                    }
                }
            }
            QMatrix::Q5_0 { d, qh, qs, .. } => {
                for b in 0..nb {
                    let i = r * nb + b;
                    let (d, q) = (f16_to_f32(d[i]), q5_0_block(qh, qs, i));
                    for (o, &v) in out[b * BLOCK..(b + 1) * BLOCK].iter_mut().zip(&q) {
                        *o = d * f32::from(v);
                    }
                }
            }
            QMatrix::Q5_1 { d, m, qs, .. } => {
                let row = r * cols..(r + 1) * cols;
                for (j, (o, &q)) in out.iter_mut().zip(&qs[row.clone()]).enumerate() {
                    let i = (row.start + j) / BLOCK;
                    *o = d[i] * f32::from(q) + m[i];
                }
            }
            QMatrix::Q4K { .. } => {
                let row = self.q4k_row(r);
                for b in 0..nb {
                    let s = b / 8;
                    let scale = row.d(s) * f32::from(row.sc(b));
                    let min = row.dmin(s) * f32::from(row.m(b));
                    let q = row.nibbles(b);
                    for j in 0..16 {
                        out[b * BLOCK + j] = scale * f32::from(q[j] & 15) - min;
                        out[b * BLOCK + j + 16] = scale * f32::from(q[j] >> 4) - min;
                    }
                }
            }
            QMatrix::Q6K { .. } => {
                let RowBlocks::Q6K { d, sc, ql, qh } = self.row_blocks(r) else {
                    unreachable!("a Q6_K row")
                };
                let row = super_blocks::Q6KRow { d, sc, ql, qh };
                for (s, values) in out[..cols].chunks_exact_mut(QK_K).enumerate() {
                    for (c, run) in values.chunks_exact_mut(32).enumerate() {
                        for (j, (o, q)) in run.iter_mut().zip(row.run(s, c)).enumerate() {
                            let scale = f32::from(sc[s * 16 + (32 * c + j) / 16]);
                            *o = d[s] * scale * (f32::from(q) - 32.0);
                        }
                    }
                }
            }
            QMatrix::F32 { w, .. } => out[..cols].copy_from_slice(&w[r * cols..(r + 1) * cols]),
        }
    }

    /// Row `r`'s blocks: what the SIMD kernels take.
    #[inline]
    #[allow(dead_code)] // on targets without a kernel
    fn row_blocks(&self, r: usize) -> RowBlocks<'_> {
        self.rows_blocks(r, 1)
    }

    /// Group `g` of a Q4_K matrix's woven rows.
    fn q4k_group(&self, g: usize) -> Q4KGroup<'_> {
        let QMatrix::Q4K {
            cols,
            d,
            dmin,
            sc,
            m,
            qs,
            ..
        } = self
        else {
            unreachable!("a Q4_K matrix")
        };
        let (supers, nb) = (cols / QK_K, cols / BLOCK);
        let scales = g * supers * WOVEN..(g + 1) * supers * WOVEN;
        let subs = g * nb * WOVEN..(g + 1) * nb * WOVEN;
        Q4KGroup {
            d: &d[scales.clone()],
            dmin: &dmin[scales],
            sc: &sc[subs.clone()],
            m: &m[subs],
            qs: &qs[g * nb * WOVEN_BYTES..(g + 1) * nb * WOVEN_BYTES],
        }
    }

    /// Row `r` of a Q4_K matrix: a lane of its woven group.
    fn q4k_row(&self, r: usize) -> Q4KRow<'_> {
        let (group, lane) = woven_place(r);
        Q4KRow {
            group: self.q4k_group(group),
            lane,
        }
    }

    /// The blocks of rows `r..r + count`, one row's after another's.
    #[inline]
    #[allow(dead_code)] // on targets without a kernel
    fn rows_blocks(&self, r: usize, count: usize) -> RowBlocks<'_> {
        let nb = self.shape().1 / BLOCK;
        let end = r + count;
        let blocks = r * nb..end * nb;
        let nibbles = r * nb * 16..end * nb * 16;
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
                qs: &qs[r * nb * BLOCK..end * nb * BLOCK],
            },
            QMatrix::Q5_0 { d, qh, qs, .. } => RowBlocks::Q5_0 {
                d: &d[blocks.clone()],
                qh: &qh[blocks],
                qs: &qs[nibbles],
            },
            QMatrix::Q5_1 { d, m, qs, .. } => RowBlocks::Q5_1 {
                d: &d[blocks.clone()],
                m: &m[blocks],
                qs: &qs[r * nb * BLOCK..end * nb * BLOCK],
            },
            QMatrix::Q4K { .. } => {
                assert_eq!(count, 1, "Q4_K's rows are woven: one at a time");
                RowBlocks::Q4K(self.q4k_row(r))
            }
            QMatrix::Q6K { d, sc, ql, qh, .. } => RowBlocks::Q6K {
                d: &d[blocks.start / 8..blocks.end / 8],
                sc: &sc[2 * blocks.start..2 * blocks.end],
                ql: &ql[nibbles],
                qh: &qh[r * nb * 8..end * nb * 8],
            },
            QMatrix::F32 { .. } => RowBlocks::Other,
        }
    }

    /// Dot product of row `r` with the quantized activations `x` (rounded in
    /// [`Self::act_format`] for the products to agree with llama.cpp's; the batched products
    /// round them so themselves).
    #[inline]
    pub fn dot_row(&self, r: usize, x: &QActs) -> f32 {
        self.dot_row_with(Kernels::detected(), r, x)
    }

    /// [`Self::dot_row`] with the given kernels (the portable ones where `kernels` does not
    /// run here: see [`Kernels::available`]).
    pub fn dot_row_with(&self, kernels: Kernels, r: usize, x: &QActs) -> f32 {
        (kernels.table().of(self).dot)(self, r, x)
    }

    /// Rows `first..first + count` against every token of `xs` into `out[k * xs.len() + t]`,
    /// each value exactly what [`Self::dot_row_with`] gives for its row and token: a kernel
    /// that reads a weight block once for several tokens (and on AVX-512, an activation
    /// block once for several rows) where the family has one.
    fn rows_with(
        &self,
        kernels: Kernels,
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
        let format = kernels.table().of(self);
        match format.rows {
            Some(rows) => rows(self, first, count, xs, out),
            None => each_row_and_token(format.dot, self, first, xs, out),
        }
    }

    /// The portable dot product, the reference for the SIMD kernels.
    pub fn dot_row_portable(&self, r: usize, x: &QActs) -> f32 {
        let (_, cols) = self.shape();
        let nb = cols / BLOCK;
        match self {
            QMatrix::Q4_1 { d, m, qs, .. } => {
                let row = r * nb..(r + 1) * nb;
                let values = |b: usize| {
                    let q = &qs[(r * nb + b) * 16..][..16];
                    std::array::from_fn(|j| if j < 16 { q[j] & 15 } else { q[j - 16] >> 4 })
                };
                dot_with_min_in_lanes((&d[row.clone()], &m[row]), values, x)
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
                let values = |b: usize| {
                    let q = &qs[(r * nb + b) * BLOCK..][..BLOCK];
                    std::array::from_fn(|j| q[j])
                };
                dot_signed_in_lanes(&d[r * nb..(r + 1) * nb], values, x)
            }
            QMatrix::Q5_0 { d, qh, qs, .. } => {
                let values = |b: usize| q5_0_block(qh, qs, r * nb + b);
                dot_signed_in_lanes(&d[r * nb..(r + 1) * nb], values, x)
            }
            QMatrix::Q5_1 { d, m, qs, .. } => {
                let row = r * nb..(r + 1) * nb;
                let values = |b: usize| {
                    let q = &qs[(r * nb + b) * BLOCK..][..BLOCK];
                    std::array::from_fn(|j| q[j])
                };
                dot_with_min_in_lanes((&d[row.clone()], &m[row]), values, x)
            }
            QMatrix::Q4K { .. } | QMatrix::Q6K { .. } => {
                super_blocks::portable_sums(self.row_blocks(r), x)
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

    /// [`Self::matmul`] with the given kernels.
    pub fn matmul_with(&self, kernels: Kernels, xs: &[QActs], out: &mut [f32]) {
        matmul_many_with(kernels, &mut [(self, out)], xs);
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
    matmul_many_with(Kernels::detected(), parts, xs);
}

/// [`matmul_many`] with the given kernels.
pub fn matmul_many_with(kernels: Kernels, parts: &mut [(&QMatrix, &mut [f32])], xs: &[QActs]) {
    let n = xs.len();
    if n == 0 {
        return;
    }
    // Threads take chunks of rows. With several tokens each chunk's values go straight to their
    // places in the token-major output from a block of the chunk's size; a whole row-major
    // scratch copy transposed afterwards cost a visible share of a long prefill.
    const CHUNK: usize = 64;
    let requantized = requantized(parts, xs);
    let mut tasks: Vec<(&QMatrix, &[QActs], usize, Dest<'_>)> = Vec::new();
    for ((m, out), own) in parts.iter_mut().zip(&requantized) {
        let xs = own.as_deref().unwrap_or(xs);
        let rows = m.shape().0;
        assert_eq!(out.len(), rows * n, "output of {rows} rows × {n} tokens");
        if n == 1 {
            for (ci, chunk) in out.chunks_mut(CHUNK).enumerate() {
                tasks.push((*m, xs, ci * CHUNK, Dest::Run(chunk)));
            }
        } else {
            let shared = SharedRows {
                ptr: out.as_mut_ptr(),
                len: out.len(),
                rows,
            };
            for first in (0..rows).step_by(CHUNK) {
                tasks.push((*m, xs, first, Dest::Rows(shared, CHUNK.min(rows - first))));
            }
        }
    }
    let work = |(m, xs, first, dest): (&QMatrix, &[QActs], usize, Dest<'_>)| match dest {
        Dest::Run(chunk) => m.rows_with(kernels, first, chunk.len(), xs, chunk),
        Dest::Rows(out, count) => {
            // Row-major here, then each token's run of these rows written in one piece: the
            // reads stride over a block that stays in L1, the writes are contiguous.
            let mut block = vec![0f32; count * n];
            m.rows_with(kernels, first, count, xs, &mut block);
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

/// For each matrix whose format pairs with another activation rounding than `xs` has, `xs`
/// rounded its way (a group whose matrices came from different block types in the file).
fn requantized(parts: &[(&QMatrix, &mut [f32])], xs: &[QActs]) -> Vec<Option<Vec<QActs>>> {
    parts
        .iter()
        .map(|(m, _)| {
            let format = m.act_format();
            let reads_quantized = !matches!(m, QMatrix::F32 { .. });
            (reads_quantized && xs.iter().any(|x| x.format != format)).then(|| {
                xs.iter()
                    .map(|x| QActs {
                        place: x.place,
                        ..QActs::quantize_as(&x.f, format)
                    })
                    .collect()
            })
        })
        .collect()
}

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx2_k_quants;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod avx512_k_quants;
#[cfg(target_arch = "x86_64")]
mod lane_tiles;
mod super_blocks;

#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
mod simd128;

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

/// A row of a signed format (per block `b` an f16 scale `d[b]` and `values(b)`) · `x`, summed
/// as llama.cpp's AVX2 tinyBLAS and `ggml_vec_dot_q8_0_q8_0` sum it: eight lanes of four
/// products a block, one fused multiply-add a lane a block, then `hsum`.
fn dot_signed_in_lanes(d: &[u16], values: impl Fn(usize) -> [i8; BLOCK], x: &QActs) -> f32 {
    let mut lanes = [0f32; 8];
    for (b, &d) in d.iter().enumerate() {
        let (q, a) = (values(b), &x.qs[b * BLOCK..(b + 1) * BLOCK]);
        let scale = f16_to_f32(d) * x.d[b];
        for (k, lane) in lanes.iter_mut().enumerate() {
            let four: i32 = (4 * k..4 * k + 4)
                .map(|i| i32::from(q[i]) * i32::from(a[i]))
                .sum();
            *lane = fused(scale, four as f32, *lane);
        }
    }
    hsum_lanes(lanes)
}

/// Eight lanes added as ggml's `hsum_float_8` adds them.
fn hsum_lanes(l: [f32; 8]) -> f32 {
    ((l[4] + l[0]) + (l[6] + l[2])) + ((l[5] + l[1]) + (l[7] + l[3]))
}

/// A row of a format with a minimum (per block `b` a scale `d[b]`, a minimum `m[b]` and
/// `values(b)`) · `x`, summed as llama.cpp's AVX2 `ggml_vec_dot_q4_1_q8_1` sums it: eight
/// lanes of four products a block, one fused multiply-add a lane a block, and the minimums
/// times the blocks' sums in a fused chain of their own, added after the lanes' `hsum`.
fn dot_with_min_in_lanes(
    (d, m): (&[f32], &[f32]),
    values: impl Fn(usize) -> [u8; BLOCK],
    x: &QActs,
) -> f32 {
    let (mut lanes, mut mins) = ([0f32; 8], 0f32);
    for (b, (&d, &m)) in d.iter().zip(m).enumerate() {
        let (q, a) = (values(b), &x.qs[b * BLOCK..(b + 1) * BLOCK]);
        let scale = d * x.d[b];
        for (k, lane) in lanes.iter_mut().enumerate() {
            let four: i32 = (4 * k..4 * k + 4)
                .map(|i| i32::from(q[i]) * i32::from(a[i]))
                .sum();
            *lane = fused(four as f32, scale, *lane);
        }
        mins = fused(m, x.sum[b], mins);
    }
    hsum_lanes(lanes) + mins
}

/// Block `i`'s values `q − 16` of a Q5_0 matrix's high bits and nibbles.
fn q5_0_block(qh: &[u32], qs: &[u8], i: usize) -> [i8; 32] {
    let mut nibbles = [0u8; 16];
    nibbles.copy_from_slice(&qs[i * 16..i * 16 + 16]);
    quant::q5_0_values(qh[i], &nibbles)
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

    #[test]
    fn f16_rounding_matches_half_on_every_kind_of_value() {
        let mut seed = 0x2545_F491_4F6C_DD1Du64;
        let edges = [
            0.0f32,
            -0.0,
            6.1035156e-5,
            6.1e-5,
            65504.0,
            65519.0,
            65520.0,
            1e9,
            0.5,
            1.0005,
            f32::INFINITY,
            f32::MIN_POSITIVE,
        ];
        let random = (0..200_000).map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            f32::from_bits(seed as u32)
        });
        let values: Vec<f32> = edges
            .into_iter()
            .chain(random)
            .filter(|x| !x.is_nan())
            .collect();
        let mut rounded = values.clone();
        round_slice_to_f16(&mut rounded);
        for (&x, r) in values.iter().zip(rounded) {
            let want = half::f16::from_f32(x);
            assert_eq!(round_to_f16(x).to_bits(), want.to_f32().to_bits(), "{x:e}");
            assert_eq!(
                r.to_bits(),
                want.to_f32().to_bits(),
                "{x:e}, a slice at a time"
            );
            assert_eq!(f16_bits(x), want.to_bits(), "{x:e}");
        }
    }

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
            (TensorType::Q5_0, 96, encode::q5_0),
            (TensorType::Q5_1, 96, encode::q5_1),
            (TensorType::Q5_K, 512, encode::q5_k),
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
            let acts: Vec<QActs> = xs
                .iter()
                .map(|x| QActs::quantize_as(x, m.act_format()))
                .collect();
            for kernels in Kernels::available() {
                let mut out = vec![0f32; rows * xs.len()];
                m.matmul_with(kernels, &acts, &mut out);
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
                            "{ty:?} {kernels:?} t{t} r{r}: {got} vs {}",
                            want[r]
                        );
                    }
                }
                for r in 0..rows {
                    let fast = m.dot_row_with(kernels, r, &acts[0]);
                    let portable = m.dot_row_portable(r, &acts[0]);
                    assert!(
                        (fast - portable).abs() <= 1e-4 * portable.abs().max(1.0),
                        "{ty:?} {kernels:?} row {r}: {fast} vs {portable}"
                    );
                }
            }
            let mut row = vec![0f32; cols];
            m.row(5, &mut row);
            assert_eq!(row, deq[5 * cols..6 * cols]);
        }
    }

    #[test]
    fn five_bit_formats_with_a_minimum_stay_quantized_at_a_byte_a_value() {
        let (rows, cols) = (8, 512);
        let w: Vec<f32> = (0..rows * cols).map(|i| (i as f32 * 0.61).sin()).collect();
        for (ty, bytes) in [
            (TensorType::Q5_1, encode::q5_1(&w)),
            (TensorType::Q5_K, encode::q5_k(&w)),
        ] {
            let m = QMatrix::from_gguf(ty, &bytes, rows, cols).expect("build");
            assert!(matches!(m, QMatrix::Q5_1 { .. }), "{ty:?} kept quantized");
            // A byte a value and an f32 scale and minimum a block of 32: 1.25 bytes a value.
            assert_eq!(m.bytes(), rows * cols * 5 / 4, "{ty:?}");
        }
    }

    #[test]
    fn batched_products_are_exactly_one_at_a_time_for_every_kernel_family() {
        // Batched and alone must give the same bits, or a batch could change a greedy answer;
        // and every family the same bits.
        // Rows of 4, 3 (an odd last pair) and 19 blocks (past the 16 a minimum step takes).
        // 7 tokens leave three after the kernels that take four; 8 leave none.
        for (cols, tokens) in [(128, 7), (96, 7), (608, 7), (128, 8)] {
            let acts: Vec<QActs> = (0..tokens)
                .map(|t| {
                    let x: Vec<f32> = (0..cols)
                        .map(|i| ((i * 13 + t * 29) % 31) as f32 / 8.0 - 1.9)
                        .collect();
                    QActs::quantize(&x)
                })
                .collect();
            // 9 rows (tiles and a remainder); 150 (more than a chunk, and one cut short).
            for rows in [9, 150] {
                let w: Vec<f32> = (0..rows * cols)
                    .map(|i| ((i * 4099 % 257) as f32 - 128.0) / 64.0)
                    .collect();
                for (ty, bytes) in [
                    (TensorType::Q4_1, encode::q4_1(&w)),
                    (TensorType::Q4_0, encode::q4_0(&w)),
                    (TensorType::Q8_0, encode::q8_0(&w)),
                    (TensorType::Q5_0, encode::q5_0(&w)),
                    (TensorType::Q5_1, encode::q5_1(&w)),
                ] {
                    let m = QMatrix::from_gguf(ty, &bytes, rows, cols).expect("build");
                    // In the matrix's own format, which the batched product rounds to.
                    let acts: Vec<QActs> = acts
                        .iter()
                        .map(|a| QActs::quantize_as(&a.f, m.act_format()))
                        .collect();
                    for kernels in Kernels::available() {
                        let case = format!("{ty:?} {kernels:?} {rows}×{cols}");
                        // Several tokens over several chunks of rows: every value in its
                        // token's row.
                        let mut all = vec![0f32; rows * acts.len()];
                        m.matmul_with(kernels, &acts, &mut all);
                        for (t, x) in acts.iter().enumerate() {
                            for r in 0..rows {
                                assert_eq!(
                                    all[t * rows + r].to_bits(),
                                    m.dot_row_with(kernels, r, x).to_bits(),
                                    "{case} t{t} r{r}"
                                );
                            }
                        }
                        // One token: whole chunks of rows go to the kernel at once.
                        let mut one = vec![0f32; rows];
                        m.matmul_with(kernels, &acts[..1], &mut one);
                        for (r, got) in one.iter().enumerate() {
                            assert_eq!(
                                got.to_bits(),
                                m.dot_row_with(kernels, r, &acts[0]).to_bits(),
                                "{case} one token r{r}"
                            );
                        }
                        // Every family sums as llama.cpp's AVX2 build does (Q4_0 aside, which
                        // it repacks), so each gives the portable loops' bits.
                        if ty != TensorType::Q4_0 {
                            for r in 0..rows {
                                assert_eq!(
                                    m.dot_row_with(kernels, r, &acts[0]).to_bits(),
                                    m.dot_row_with(Kernels::Portable, r, &acts[0]).to_bits(),
                                    "{case} r{r}: the portable loops' bits"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    /// llama.cpp's AVX2 sums of a Q4_K row against token `t` of `n`, from the file's blocks:
    /// `gemm` (a link per pair of sub-blocks) for the tokens it takes in fours, `gemv` (a link
    /// per super-block) for the rest.
    fn llama_q4_k(blocks: &[&[u8]], x: &QActs, t: usize, n: usize) -> f32 {
        let (mut acc, mut acc_min) = (0f32, 0f32);
        for (s, b) in blocks.iter().enumerate() {
            let block = quant::unpack_q4_k(b);
            let (scale, min) = (block.d * x.d[s * 8], block.dmin * x.d[s * 8]);
            let pairs: Vec<(i32, i32)> = (0..4)
                .map(|p| {
                    (2 * p..2 * p + 2).fold((0, 0), |(sum, mins), j| {
                        let q = &block.q[32 * j..32 * j + 32];
                        let a = &x.qs[s * 256 + 32 * j..][..32];
                        let dot: i32 = q
                            .iter()
                            .zip(a)
                            .map(|(&q, &a)| i32::from(q) * i32::from(a))
                            .sum();
                        let bsum: i32 = a.iter().map(|&a| i32::from(a)).sum();
                        (
                            sum + i32::from(block.sc[j]) * dot,
                            mins + i32::from(block.m[j]) * bsum,
                        )
                    })
                })
                .collect();
            if t < n - n % 4 {
                for (sum, mins) in pairs {
                    acc = (sum as f32).mul_add(scale, acc);
                    acc_min = (mins as f32).mul_add(min, acc_min);
                }
            } else {
                let (sum, mins) = pairs.iter().fold((0, 0), |(a, b), (c, d)| (a + c, b + d));
                acc = (sum as f32).mul_add(scale, acc);
                acc_min = (mins as f32).mul_add(min, acc_min);
            }
        }
        acc - acc_min
    }

    /// llama.cpp's AVX2 sums of a Q6_K row against a token of a product of `n`: the tiled
    /// kernel's one integer a super-block from 8 tokens, `ggml_vec_dot_q6_K_q8_K`'s eight
    /// lanes below.
    fn llama_q6_k(blocks: &[&[u8]], x: &QActs, n: usize) -> f32 {
        let mut lanes = [0f32; 8];
        let mut tiled = 0f32;
        for (s, b) in blocks.iter().enumerate() {
            let block = quant::unpack_q6_k(b);
            let a = &x.qs[s * 256..][..256];
            let sum16 = |g: usize| {
                a[16 * g..16 * g + 16]
                    .iter()
                    .map(|&v| i32::from(v))
                    .sum::<i32>()
            };
            let lane = |l: usize| -> i32 {
                let products: i32 = (0..8)
                    .map(|c| {
                        let four: i32 = (0..4)
                            .map(|i| 32 * c + 4 * l + i)
                            .map(|i| (i32::from(block.q[i]) + 32) * i32::from(a[i]))
                            .sum();
                        i32::from(block.sc[2 * c + l / 4]) * four
                    })
                    .sum();
                let offsets = i32::from(block.sc[2 * l]) * sum16(2 * l)
                    + i32::from(block.sc[2 * l + 1]) * sum16(2 * l + 1);
                products - 32 * offsets
            };
            let total: i32 = (0..8).map(lane).sum();
            tiled = (block.d * total as f32).mul_add(x.d[s * 8], tiled);
            let d = x.d[s * 8] * block.d;
            for (l, acc) in lanes.iter_mut().enumerate() {
                *acc = d.mul_add(lane(l) as f32, *acc);
            }
        }
        let a = lanes;
        if n >= 8 {
            tiled
        } else {
            ((a[4] + a[0]) + (a[6] + a[2])) + ((a[5] + a[1]) + (a[7] + a[3]))
        }
    }

    #[test]
    fn k_quants_sum_as_llama_cpp_s_avx2_build_does_for_every_family_and_batch() {
        // Batch sizes either side of Q4_K's fours and Q6_K's tiled threshold of 8.
        let (rows, cols) = (19, 768);
        let w: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 4099 % 257) as f32 - 128.0) / 64.0 * (1 + i / 16 % 7) as f32)
            .collect();
        for (ty, bytes, size) in [
            (TensorType::Q4_K, encode::q4_k(&w), 144),
            (TensorType::Q6_K, encode::q6_k(&w), 210),
        ] {
            let m = QMatrix::from_gguf(ty, &bytes, rows, cols).expect("build");
            let row_blocks = |r: usize| -> Vec<&[u8]> {
                bytes
                    .chunks_exact(size)
                    .skip(r * cols / 256)
                    .take(cols / 256)
                    .collect()
            };
            for n in [1, 3, 4, 6, 7, 8, 9] {
                let acts: Vec<QActs> = (0..n)
                    .map(|t| {
                        let x: Vec<f32> = (0..cols)
                            .map(|i| ((i * 13 + t * 29) % 31) as f32 / 8.0 - 1.9)
                            .collect();
                        QActs {
                            place: Place { index: t, of: n },
                            ..QActs::quantize_as(&x, ActFormat::Q8K)
                        }
                    })
                    .collect();
                for kernels in Kernels::available() {
                    let mut out = vec![0f32; rows * n];
                    m.matmul_with(kernels, &acts, &mut out);
                    for (t, x) in acts.iter().enumerate() {
                        for r in 0..rows {
                            let want = match ty {
                                TensorType::Q4_K => llama_q4_k(&row_blocks(r), x, t, n),
                                _ => llama_q6_k(&row_blocks(r), x, n),
                            };
                            assert_eq!(
                                out[t * rows + r].to_bits(),
                                want.to_bits(),
                                "{ty:?} {kernels:?} token {t} of {n}, row {r}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn q5_0_at_the_file_s_size_gives_the_bits_of_its_values_widened_to_q8_0() {
        // Q5_0's x = d·(q − 16) is a Q8_0 block with the same scale: each family's Q5_0
        // kernel must give exactly what its Q8_0 kernel gives for that twin, batched or not.
        let (rows, cols) = (9, 608);
        let w: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 4099 % 257) as f32 - 128.0) / 64.0)
            .collect();
        let five = encode::q5_0(&w);
        let twin: Vec<u8> = quant::blocks(TensorType::Q5_0, &five)
            .flat_map(|b| {
                let (d, qh, qs) = quant::split_q5_0(b);
                let values = quant::q5_0_values(qh, &qs).map(|v| v as u8);
                d.to_le_bytes().into_iter().chain(values)
            })
            .collect();
        let q5 = QMatrix::from_gguf(TensorType::Q5_0, &five, rows, cols).expect("q5_0");
        let q8 = QMatrix::from_gguf(TensorType::Q8_0, &twin, rows, cols).expect("q8_0");
        assert_eq!(q5.bytes(), five.len(), "held at the file's size");
        let acts: Vec<QActs> = (0..7)
            .map(|t| {
                let x: Vec<f32> = (0..cols)
                    .map(|i| ((i * 13 + t * 29) % 31) as f32 / 8.0 - 1.9)
                    .collect();
                QActs::quantize(&x)
            })
            .collect();
        for kernels in Kernels::available() {
            let (mut got, mut want) = (vec![0f32; rows * 7], vec![0f32; rows * 7]);
            q5.matmul_with(kernels, &acts, &mut got);
            q8.matmul_with(kernels, &acts, &mut want);
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{kernels:?}, 7 tokens");
            for r in 0..rows {
                assert_eq!(
                    q5.dot_row_with(kernels, r, &acts[0]).to_bits(),
                    q8.dot_row_with(kernels, r, &acts[0]).to_bits(),
                    "{kernels:?} row {r}"
                );
            }
        }
        let (mut a, mut b) = (vec![0f32; cols], vec![0f32; cols]);
        q5.row(4, &mut a);
        q8.row(4, &mut b);
        assert_eq!(a, b);
    }

    #[test]
    fn the_chosen_kernels_run_here() {
        let chosen = Kernels::detected();
        assert!(chosen.runs_here(), "{chosen:?}");
        assert!(Kernels::available().contains(&Kernels::Portable));
        #[cfg(target_arch = "x86_64")]
        if std::env::var_os("STRADDLE_CPU_KERNELS").is_none() {
            assert_eq!(chosen, Kernels::available()[0], "the best is the default");
        }
    }
}
