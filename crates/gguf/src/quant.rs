//! GGML tensor types: their block geometry and dequantization to f32.
//!
//! Block layouts follow ggml's `ggml-common.h`; each dequantizer is checked against a
//! block computed by hand in the tests below.

use half::{bf16, f16};

/// A GGML tensor element type.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TensorType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    BF16,
}

/// A type the reader knows the size of but cannot dequantize.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum QuantError {
    #[error(
        "dequantization of {0:?} is not supported (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K)"
    )]
    Unsupported(TensorType),
    #[error("{ty:?} data of {bytes} bytes is not a whole number of {block}-byte blocks")]
    Ragged {
        ty: TensorType,
        bytes: usize,
        block: usize,
    },
}

impl TensorType {
    /// The type for a GGML type id, if known.
    pub fn from_id(id: u32) -> Option<Self> {
        Some(match id {
            0 => Self::F32,
            1 => Self::F16,
            2 => Self::Q4_0,
            3 => Self::Q4_1,
            6 => Self::Q5_0,
            7 => Self::Q5_1,
            8 => Self::Q8_0,
            9 => Self::Q8_1,
            10 => Self::Q2_K,
            11 => Self::Q3_K,
            12 => Self::Q4_K,
            13 => Self::Q5_K,
            14 => Self::Q6_K,
            15 => Self::Q8_K,
            30 => Self::BF16,
            _ => return None,
        })
    }

    /// The GGML type id.
    pub fn id(self) -> u32 {
        match self {
            Self::F32 => 0,
            Self::F16 => 1,
            Self::Q4_0 => 2,
            Self::Q4_1 => 3,
            Self::Q5_0 => 6,
            Self::Q5_1 => 7,
            Self::Q8_0 => 8,
            Self::Q8_1 => 9,
            Self::Q2_K => 10,
            Self::Q3_K => 11,
            Self::Q4_K => 12,
            Self::Q5_K => 13,
            Self::Q6_K => 14,
            Self::Q8_K => 15,
            Self::BF16 => 30,
        }
    }

    /// Elements per block.
    pub fn block_elements(self) -> u64 {
        match self {
            Self::F32 | Self::F16 | Self::BF16 => 1,
            Self::Q4_0 | Self::Q4_1 | Self::Q5_0 | Self::Q5_1 | Self::Q8_0 | Self::Q8_1 => 32,
            Self::Q2_K | Self::Q3_K | Self::Q4_K | Self::Q5_K | Self::Q6_K | Self::Q8_K => 256,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> u64 {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::BF16 => 2,
            Self::Q4_0 => 18,
            Self::Q4_1 => 20,
            Self::Q5_0 => 22,
            Self::Q5_1 => 24,
            Self::Q8_0 => 34,
            Self::Q8_1 => 36,
            Self::Q2_K => 84,
            Self::Q3_K => 110,
            Self::Q4_K => 144,
            Self::Q5_K => 176,
            Self::Q6_K => 210,
            Self::Q8_K => 292,
        }
    }
}

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Dequantizes `bytes` of type `ty` to f32.
pub fn dequantize(ty: TensorType, bytes: &[u8]) -> Result<Vec<f32>, QuantError> {
    let block = ty.block_bytes() as usize;
    if !bytes.len().is_multiple_of(block) {
        return Err(QuantError::Ragged {
            ty,
            bytes: bytes.len(),
            block,
        });
    }
    let n = bytes.len() / block * ty.block_elements() as usize;
    let mut out = vec![0f32; n];
    let per = ty.block_elements() as usize;
    let blocks = bytes.chunks_exact(block).zip(out.chunks_exact_mut(per));
    match ty {
        TensorType::F32 => {
            blocks.for_each(|(b, o)| o[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        }
        TensorType::F16 => blocks.for_each(|(b, o)| o[0] = f16_at(b, 0)),
        TensorType::BF16 => {
            blocks.for_each(|(b, o)| o[0] = bf16::from_le_bytes([b[0], b[1]]).to_f32())
        }
        TensorType::Q8_0 => blocks.for_each(|(b, o)| dequant_q8_0(b, o)),
        TensorType::Q4_0 => blocks.for_each(|(b, o)| dequant_q4_0(b, o)),
        TensorType::Q4_1 => blocks.for_each(|(b, o)| dequant_q4_1(b, o)),
        TensorType::Q5_0 => blocks.for_each(|(b, o)| dequant_q5_0(b, o)),
        TensorType::Q5_1 => blocks.for_each(|(b, o)| dequant_q5_1(b, o)),
        TensorType::Q5_K => blocks.for_each(|(b, o)| dequant_q5_k(b, o)),
        TensorType::Q4_K => blocks.for_each(|(b, o)| dequant_q4_k(b, o)),
        TensorType::Q6_K => blocks.for_each(|(b, o)| dequant_q6_k(b, o)),
        other => return Err(QuantError::Unsupported(other)),
    }
    Ok(out)
}

/// The blocks of `bytes` of type `ty`, one slice each; a ragged tail is left out (the GGUF
/// reader has already checked each tensor's byte count against its shape).
pub fn blocks(ty: TensorType, bytes: &[u8]) -> std::slice::ChunksExact<'_, u8> {
    bytes.chunks_exact(ty.block_bytes() as usize)
}

/// A Q8_0 block unpacked: `x[i] = d · q[i]`.
pub fn unpack_q8_0(b: &[u8]) -> (f32, [i8; 32]) {
    let (d, q) = split_q8_0(b);
    (f16_to_f32(d), q)
}

/// A Q8_0 block with its scale left as f16 bits, the way a matrix that keeps the file's
/// size holds it.
pub fn split_q8_0(b: &[u8]) -> (u16, [i8; 32]) {
    let mut q = [0i8; 32];
    for (v, &byte) in q.iter_mut().zip(&b[2..34]) {
        *v = byte as i8;
    }
    (u16::from_le_bytes([b[0], b[1]]), q)
}

/// An f16's value from its bits, exact for every finite f16 and without a branch, so a
/// product kernel can afford it once per block on every target (infinities and NaNs, which
/// no valid block scale holds, come out as large finite values).
#[inline(always)]
pub fn f16_to_f32(h: u16) -> f32 {
    // The exponent and mantissa moved into f32's fields read as 2^-112 times the value
    // (subnormals included, as f32 subnormals); one exact multiply rebiases it.
    let magnitude = f32::from_bits(u32::from(h & 0x7FFF) << 13) * f32::from_bits(0x7780_0000);
    f32::from_bits(magnitude.to_bits() | (u32::from(h & 0x8000) << 16))
}

/// Q8_0: f16 scale `d`, 32 signed bytes; x = d·q.
pub fn dequant_q8_0(b: &[u8], out: &mut [f32]) {
    let (d, q) = unpack_q8_0(b);
    for (o, &v) in out.iter_mut().zip(&q) {
        *o = d * f32::from(v);
    }
}

/// Sixteen bytes of nibbles as GGUF packs a block of 32: byte `j` holds element `j` in its low
/// nibble and element `j + 16` in its high one.
pub type Nibbles = [u8; 16];

fn nibbles_at(b: &[u8], at: usize) -> Nibbles {
    let mut q = [0u8; 16];
    q.copy_from_slice(&b[at..at + 16]);
    q
}

/// A Q4_0 block unpacked: `x[i] = d · (q[i] − 8)`.
pub fn unpack_q4_0(b: &[u8]) -> (f32, Nibbles) {
    (f16_at(b, 0), nibbles_at(b, 2))
}

/// Q4_0: f16 scale `d`, 16 bytes of nibbles; x = d·(q−8).
pub fn dequant_q4_0(b: &[u8], out: &mut [f32]) {
    let (d, q) = unpack_q4_0(b);
    for (j, &q) in q.iter().enumerate() {
        out[j] = d * (f32::from(q & 0x0F) - 8.0);
        out[j + 16] = d * (f32::from(q >> 4) - 8.0);
    }
}

/// A Q4_1 block unpacked: `x[i] = d · q[i] + m`, as `(d, m, nibbles)`.
pub fn unpack_q4_1(b: &[u8]) -> (f32, f32, Nibbles) {
    (f16_at(b, 0), f16_at(b, 2), nibbles_at(b, 4))
}

/// Q4_1: f16 scale `d`, f16 minimum `m`, 16 bytes of nibbles; x = d·q + m.
pub fn dequant_q4_1(b: &[u8], out: &mut [f32]) {
    let (d, m, q) = unpack_q4_1(b);
    for (j, &q) in q.iter().enumerate() {
        out[j] = d * f32::from(q & 0x0F) + m;
        out[j + 16] = d * f32::from(q >> 4) + m;
    }
}

/// The 32 five-bit values of a Q5_0/Q5_1 block's `qh` (4 bytes, bit `j` the high bit of
/// element `j`) and `qs` (16 bytes of nibbles, low nibbles elements 0–15), in `0..32`.
fn five_bits(qh: &[u8], qs: &[u8]) -> [u8; 32] {
    let qh = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    let mut q = [0u8; 32];
    for (j, &byte) in qs[..16].iter().enumerate() {
        let high = |bit: usize| (((qh >> bit) & 1) as u8) << 4;
        q[j] = (byte & 0x0F) | high(j);
        q[j + 16] = (byte >> 4) | high(j + 16);
    }
    q
}

/// A Q5_0 block's parts as the file holds them: the f16 scale's bits, the 32 high bits (bit
/// `j` for element `j`) and the nibbles.
pub fn split_q5_0(b: &[u8]) -> (u16, u32, Nibbles) {
    (
        u16::from_le_bytes([b[0], b[1]]),
        u32::from_le_bytes([b[2], b[3], b[4], b[5]]),
        nibbles_at(b, 6),
    )
}

/// A Q5_0 block unpacked: `x[i] = d · q[i]`, with `q` in `−16..16`.
pub fn unpack_q5_0(b: &[u8]) -> (f32, [i8; 32]) {
    let (d, qh, qs) = split_q5_0(b);
    (f16_to_f32(d), q5_0_values(qh, &qs))
}

/// The 32 values `q − 16` of a Q5_0 block's high bits and nibbles.
pub fn q5_0_values(qh: u32, qs: &Nibbles) -> [i8; 32] {
    five_bits(&qh.to_le_bytes(), qs).map(|v| v as i8 - 16)
}

/// Q5_0: f16 scale `d`, 32 high bits, 16 bytes of nibbles; x = d·(q−16).
pub fn dequant_q5_0(b: &[u8], out: &mut [f32]) {
    let (d, q) = unpack_q5_0(b);
    for (o, &v) in out.iter_mut().zip(&q) {
        *o = d * f32::from(v);
    }
}

/// A Q5_1 block unpacked: `x[i] = d · q[i] + m`, with `q` in `0..32`.
pub fn unpack_q5_1(b: &[u8]) -> (f32, f32, [u8; 32]) {
    (f16_at(b, 0), f16_at(b, 2), five_bits(&b[4..8], &b[8..24]))
}

/// Q5_1: f16 scale `d`, f16 minimum `m`, 32 high bits, 16 bytes of nibbles; x = d·q + m.
pub fn dequant_q5_1(b: &[u8], out: &mut [f32]) {
    let (d, m, q) = unpack_q5_1(b);
    for (o, &v) in out.iter_mut().zip(&q) {
        *o = d * f32::from(v) + m;
    }
}

/// The 6-bit scale and minimum of sub-block `j` of a Q4_K/Q5_K block.
fn scale_min_k4(j: usize, q: &[u8]) -> (f32, f32) {
    let (sc, m) = if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    };
    (f32::from(sc), f32::from(m))
}

/// A Q4_K block unpacked: `x[i] = scale[i / 32] · q[i] − min[i / 32]`, with `q` in `0..16`.
#[derive(Clone, Debug, PartialEq)]
pub struct Q4KBlock {
    pub q: [u8; 256],
    pub scale: [f32; 8],
    pub min: [f32; 8],
    /// The super-block's scale and minimum scale, widened from f16.
    pub d: f32,
    pub dmin: f32,
    /// The sub-blocks' 6-bit scales and minimums, as integers.
    pub sc: [u8; 8],
    pub m: [u8; 8],
}

/// Unpacks a 144-byte Q4_K block (super-block of 256 as 8 sub-blocks of 32, each with a 6-bit
/// scale and minimum) without dequantizing, so a device can keep it as 4-bit blocks of 32.
pub fn unpack_q4_k(b: &[u8]) -> Q4KBlock {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let scales = &b[4..16];
    let qs = &b[16..144];
    let mut block = Q4KBlock {
        q: [0; 256],
        scale: [0.0; 8],
        min: [0.0; 8],
        d,
        dmin,
        sc: [0; 8],
        m: [0; 8],
    };
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, scales);
        block.scale[j] = d * sc;
        block.min[j] = dmin * m;
        (block.sc[j], block.m[j]) = (sc as u8, m as u8);
    }
    // Each 32 bytes hold two sub-blocks: the first in the low nibbles, the second in the high.
    for chunk in 0..4 {
        for (l, &byte) in qs[32 * chunk..32 * chunk + 32].iter().enumerate() {
            block.q[64 * chunk + l] = byte & 0x0F;
            block.q[64 * chunk + 32 + l] = byte >> 4;
        }
    }
    block
}

impl Q4KBlock {
    /// The eight sub-blocks as Q4_1 blocks: `s·q − min` is `d·q + m` with `d = s`, `m = −min`.
    pub fn as_q4_1(&self) -> [(f32, f32, Nibbles); 8] {
        std::array::from_fn(|s| {
            let q = &self.q[32 * s..32 * s + 32];
            let nibbles = std::array::from_fn(|j| q[j] | (q[j + 16] << 4));
            (self.scale[s], -self.min[s], nibbles)
        })
    }
}

/// Q4_K: super-block of 256 as 8 sub-blocks of 32, each with a 6-bit scale and minimum.
pub fn dequant_q4_k(b: &[u8], out: &mut [f32]) {
    let block = unpack_q4_k(b);
    for (i, o) in out.iter_mut().enumerate().take(256) {
        *o = block.scale[i / 32] * f32::from(block.q[i]) - block.min[i / 32];
    }
}

/// A 176-byte Q5_K block unpacked into its eight sub-blocks of 32, each as Q5_1's `(d, m, q)`:
/// `x = d·q + m` with `d` the sub-block's scale, `m` minus its minimum, `q` in `0..32`. Q4_K's
/// layout with a fifth bit per value in 32 bytes of `qh` (bit `j` of byte `l` is the high bit
/// of element `l` of sub-block `j`).
pub fn unpack_q5_k(b: &[u8]) -> [(f32, f32, [u8; 32]); 8] {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let (scales, qh, qs) = (&b[4..16], &b[16..48], &b[48..176]);
    std::array::from_fn(|j| {
        let (sc, m) = scale_min_k4(j, scales);
        let low = &qs[32 * (j / 2)..32 * (j / 2) + 32];
        let q = std::array::from_fn(|l| {
            let nibble = if j % 2 == 0 {
                low[l] & 0x0F
            } else {
                low[l] >> 4
            };
            nibble | (((qh[l] >> j) & 1) << 4)
        });
        (d * sc, -(dmin * m), q)
    })
}

/// Q5_K: super-block of 256 as 8 sub-blocks of 32 of 5 bits, each with a 6-bit scale and
/// minimum.
pub fn dequant_q5_k(b: &[u8], out: &mut [f32]) {
    for ((d, m, q), out) in unpack_q5_k(b).iter().zip(out.chunks_mut(32)) {
        for (o, &v) in out.iter_mut().zip(q) {
            *o = d * f32::from(v) + m;
        }
    }
}

/// A Q6_K block unpacked: `x[i] = scale[i / 16] · q[i]`, with `q` in `−32..32`.
#[derive(Clone, Debug, PartialEq)]
pub struct Q6KBlock {
    pub q: [i8; 256],
    pub scale: [f32; 16],
    /// The super-block's scale, widened from f16.
    pub d: f32,
    /// The sub-blocks' signed 8-bit scales.
    pub sc: [i8; 16],
}

/// Unpacks a 210-byte Q6_K block (256 values of 6 bits, 4 low in `ql` and 2 high in `qh`, 16
/// signed 8-bit scales of sub-blocks of 16, f16 `d`) without dequantizing.
pub fn unpack_q6_k(b: &[u8]) -> Q6KBlock {
    let (ql_all, rest) = b.split_at(128);
    let (qh_all, rest) = rest.split_at(64);
    let (sc_all, d_bytes) = rest.split_at(16);
    let d = f16_at(d_bytes, 0);
    let mut block = Q6KBlock {
        q: [0; 256],
        scale: [0.0; 16],
        d,
        sc: [0; 16],
    };
    for ((s, i), &sc) in block.scale.iter_mut().zip(&mut block.sc).zip(sc_all) {
        *s = d * f32::from(sc as i8);
        *i = sc as i8;
    }
    let six = |low: u8, high: u8| ((low | (high << 4)) as i8) - 32;
    for half in 0..2 {
        let ql = &ql_all[64 * half..];
        let qh = &qh_all[32 * half..];
        let q = &mut block.q[128 * half..128 * half + 128];
        for l in 0..32 {
            q[l] = six(ql[l] & 0x0F, qh[l] & 3);
            q[l + 32] = six(ql[l + 32] & 0x0F, (qh[l] >> 2) & 3);
            q[l + 64] = six(ql[l] >> 4, (qh[l] >> 4) & 3);
            q[l + 96] = six(ql[l + 32] >> 4, (qh[l] >> 6) & 3);
        }
    }
    block
}

/// Q6_K: 256 values of 6 bits (4 low in `ql`, 2 high in `qh`), 16 signed 8-bit scales, f16 `d`.
pub fn dequant_q6_k(b: &[u8], out: &mut [f32]) {
    let block = unpack_q6_k(b);
    for (i, o) in out.iter_mut().enumerate().take(256) {
        *o = block.scale[i / 16] * f32::from(block.q[i]);
    }
}

/// Quantizers used by tests to build tiny models (round to nearest; not tuned for quality).
pub mod encode {
    use half::f16;

    /// f32 → Q8_0 blocks (`values.len()` a multiple of 32).
    pub fn q8_0(values: &[f32]) -> Vec<u8> {
        let mut out = Vec::new();
        for block in values.chunks_exact(32) {
            let amax = block.iter().fold(0f32, |a, v| a.max(v.abs()));
            let d = f16::from_f32(amax / 127.0);
            let inv = if d.to_f32() == 0.0 {
                0.0
            } else {
                1.0 / d.to_f32()
            };
            out.extend_from_slice(&d.to_le_bytes());
            out.extend(
                block
                    .iter()
                    .map(|v| (v * inv).round().clamp(-127.0, 127.0) as i8 as u8),
            );
        }
        out
    }

    /// f32 → Q4_0 blocks.
    pub fn q4_0(values: &[f32]) -> Vec<u8> {
        let mut out = Vec::new();
        for block in values.chunks_exact(32) {
            let max = block
                .iter()
                .fold(0f32, |a, &v| if v.abs() > a.abs() { v } else { a });
            let d = f16::from_f32(max / -8.0);
            let inv = if d.to_f32() == 0.0 {
                0.0
            } else {
                1.0 / d.to_f32()
            };
            out.extend_from_slice(&d.to_le_bytes());
            let q = |v: f32| ((v * inv + 8.5) as i32).clamp(0, 15) as u8;
            out.extend((0..16).map(|j| q(block[j]) | (q(block[j + 16]) << 4)));
        }
        out
    }

    /// f32 → Q5_0 blocks (`values.len()` a multiple of 32), ggml's reference rounding.
    pub fn q5_0(values: &[f32]) -> Vec<u8> {
        let mut out = Vec::new();
        for block in values.chunks_exact(32) {
            let max = block
                .iter()
                .fold(0f32, |a, &v| if v.abs() > a.abs() { v } else { a });
            let d = f16::from_f32(max / -16.0);
            let inv = if d.to_f32() == 0.0 {
                0.0
            } else {
                1.0 / d.to_f32()
            };
            let q: Vec<u32> = block
                .iter()
                .map(|&v| ((v * inv + 16.5) as i32).clamp(0, 31) as u32)
                .collect();
            let qh = q
                .iter()
                .enumerate()
                .fold(0u32, |h, (j, &v)| h | ((v >> 4) << j));
            out.extend_from_slice(&d.to_le_bytes());
            out.extend_from_slice(&qh.to_le_bytes());
            out.extend((0..16).map(|j| (q[j] & 15) as u8 | (((q[j + 16] & 15) as u8) << 4)));
        }
        out
    }

    /// A block's f16 step `d` and minimum `m` for `levels` steps from its minimum to its
    /// maximum, and each value's step.
    fn steps_from_min(block: &[f32], levels: f32) -> (f16, f16, Vec<u8>) {
        let min = block.iter().copied().fold(f32::INFINITY, f32::min);
        let max = block.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let d = f16::from_f32((max - min) / levels);
        let m = f16::from_f32(min);
        let inv = if d.to_f32() == 0.0 {
            0.0
        } else {
            1.0 / d.to_f32()
        };
        let q = block
            .iter()
            .map(|&v| ((v - m.to_f32()) * inv).round().clamp(0.0, levels) as u8)
            .collect();
        (d, m, q)
    }

    /// f32 → Q4_1 blocks.
    pub fn q4_1(values: &[f32]) -> Vec<u8> {
        let mut out = Vec::new();
        for block in values.chunks_exact(32) {
            let (d, m, q) = steps_from_min(block, 15.0);
            out.extend_from_slice(&d.to_le_bytes());
            out.extend_from_slice(&m.to_le_bytes());
            out.extend((0..16).map(|j| q[j] | (q[j + 16] << 4)));
        }
        out
    }

    /// f32 → Q5_1 blocks: Q4_1's with 5-bit steps, the fifth bits in 32 high bits.
    pub fn q5_1(values: &[f32]) -> Vec<u8> {
        let mut out = Vec::new();
        for block in values.chunks_exact(32) {
            let (d, m, q) = steps_from_min(block, 31.0);
            let qh = q
                .iter()
                .enumerate()
                .fold(0u32, |h, (j, &v)| h | (u32::from(v >> 4) << j));
            out.extend_from_slice(&d.to_le_bytes());
            out.extend_from_slice(&m.to_le_bytes());
            out.extend_from_slice(&qh.to_le_bytes());
            out.extend((0..16).map(|j| (q[j] & 15) | ((q[j + 16] & 15) << 4)));
        }
        out
    }

    /// The smallest f16 at least `v`, so 63 units of it cover the largest of 63 steps.
    fn unit_covering(v: f32) -> f16 {
        let h = f16::from_f32(v);
        if h.to_f32() < v {
            f16::from_bits(h.to_bits() + 1)
        } else {
            h
        }
    }

    /// One super-block of 256 as 8 sub-blocks of 32, each `levels` steps up from its minimum:
    /// the K-quants' header (f16 `d`, f16 `dmin`, the sub-blocks' scales and minimums as 6-bit
    /// multiples of them, 12 bytes) and each value's step.
    fn k_with_min(block: &[f32], levels: f32) -> (Vec<u8>, [u8; 256]) {
        // Minimums rounded up and then scales rounded up to cover the rounded ranges, so
        // every value lands in 0..=levels without clamping.
        let mut sub_min = [0f32; 8];
        let mut sub_max = [0f32; 8];
        for (j, sub) in block.chunks_exact(32).enumerate() {
            sub_min[j] = -sub.iter().copied().fold(0f32, f32::min);
            sub_max[j] = sub.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        }
        let dmin = unit_covering(sub_min.iter().copied().fold(0f32, f32::max) / 63.0);
        let six_up = |v: f32, unit: f16| {
            if unit.to_f32() == 0.0 {
                0u8
            } else {
                (v / unit.to_f32()).ceil().clamp(0.0, 63.0) as u8
            }
        };
        let m: Vec<u8> = sub_min.iter().map(|&v| six_up(v, dmin)).collect();
        let sub_scale: Vec<f32> = (0..8)
            .map(|j| (sub_max[j] + dmin.to_f32() * f32::from(m[j])) / levels)
            .collect();
        let d = unit_covering(sub_scale.iter().copied().fold(0f32, f32::max) / 63.0);
        let sc: Vec<u8> = sub_scale.iter().map(|&v| six_up(v, d)).collect();
        let mut header = Vec::with_capacity(16);
        header.extend_from_slice(&d.to_le_bytes());
        header.extend_from_slice(&dmin.to_le_bytes());
        for j in 0..4 {
            header.push(sc[j] | ((sc[j + 4] >> 4) << 6));
        }
        for j in 0..4 {
            header.push(m[j] | ((m[j + 4] >> 4) << 6));
        }
        for j in 0..4 {
            header.push((sc[j + 4] & 0x0F) | ((m[j + 4] & 0x0F) << 4));
        }
        let q = std::array::from_fn(|i| {
            let j = i / 32;
            let scale = d.to_f32() * f32::from(sc[j]);
            if scale == 0.0 {
                return 0u8;
            }
            let min = dmin.to_f32() * f32::from(m[j]);
            ((block[i] + min) / scale).round().clamp(0.0, levels) as u8
        });
        (header, q)
    }

    /// The low four bits of a super-block's steps as the K-quants pack them: each 32 bytes
    /// hold two sub-blocks, the first in the low nibbles.
    fn k_nibbles(q: &[u8; 256], out: &mut Vec<u8>) {
        for chunk in 0..4 {
            out.extend(
                (0..32)
                    .map(|l| (q[64 * chunk + l] & 0x0F) | ((q[64 * chunk + 32 + l] & 0x0F) << 4)),
            );
        }
    }

    /// f32 → Q4_K blocks (`values.len()` a multiple of 256): per sub-block of 32 a 4-bit range
    /// from its minimum, the sub-blocks' scales and minimums as 6-bit multiples of `d`, `dmin`.
    pub fn q4_k(values: &[f32]) -> Vec<u8> {
        let mut out = Vec::new();
        for block in values.chunks_exact(256) {
            let (header, q) = k_with_min(block, 15.0);
            out.extend_from_slice(&header);
            k_nibbles(&q, &mut out);
        }
        out
    }

    /// f32 → Q5_K blocks: Q4_K's with 5-bit ranges, the fifth bits in 32 bytes of `qh`.
    pub fn q5_k(values: &[f32]) -> Vec<u8> {
        let mut out = Vec::new();
        for block in values.chunks_exact(256) {
            let (header, q) = k_with_min(block, 31.0);
            out.extend_from_slice(&header);
            out.extend(
                (0..32).map(|l| (0..8).fold(0u8, |h, j| h | (((q[32 * j + l] >> 4) & 1) << j))),
            );
            k_nibbles(&q, &mut out);
        }
        out
    }

    /// f32 → Q6_K blocks (`values.len()` a multiple of 256): per sub-block of 16 a signed 6-bit
    /// range, the sub-blocks' scales as signed 8-bit multiples of `d`.
    pub fn q6_k(values: &[f32]) -> Vec<u8> {
        let mut out = Vec::new();
        for block in values.chunks_exact(256) {
            let sub_scale: Vec<f32> = block
                .chunks_exact(16)
                .map(|sub| sub.iter().fold(0f32, |a, v| a.max(v.abs())) / 31.0)
                .collect();
            let d = f16::from_f32(sub_scale.iter().copied().fold(0f32, f32::max) / 127.0);
            let sc: Vec<i8> = sub_scale
                .iter()
                .map(|&v| {
                    if d.to_f32() == 0.0 {
                        0
                    } else {
                        (v / d.to_f32()).round().clamp(-128.0, 127.0) as i8
                    }
                })
                .collect();
            let q: Vec<u8> = block
                .iter()
                .enumerate()
                .map(|(i, &v)| {
                    let scale = d.to_f32() * f32::from(sc[i / 16]);
                    let q = if scale == 0.0 {
                        0.0
                    } else {
                        (v / scale).round()
                    };
                    (q.clamp(-32.0, 31.0) as i32 + 32) as u8
                })
                .collect();
            let mut ql = [0u8; 128];
            let mut qh = [0u8; 64];
            for half in 0..2 {
                let q = &q[128 * half..];
                for l in 0..32 {
                    ql[64 * half + l] = (q[l] & 0x0F) | ((q[l + 64] & 0x0F) << 4);
                    ql[64 * half + l + 32] = (q[l + 32] & 0x0F) | ((q[l + 96] & 0x0F) << 4);
                    qh[32 * half + l] = (q[l] >> 4)
                        | ((q[l + 32] >> 4) << 2)
                        | ((q[l + 64] >> 4) << 4)
                        | ((q[l + 96] >> 4) << 6);
                }
            }
            out.extend_from_slice(&ql);
            out.extend_from_slice(&qh);
            out.extend(sc.iter().map(|&s| s as u8));
            out.extend_from_slice(&d.to_le_bytes());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(x: f32) -> [u8; 2] {
        f16::from_f32(x).to_le_bytes()
    }

    #[test]
    fn the_branch_free_f16_conversion_agrees_with_half_on_every_finite_value() {
        for bits in 0..=u16::MAX {
            let want = f16::from_bits(bits);
            if want.is_finite() {
                assert_eq!(
                    f16_to_f32(bits).to_bits(),
                    want.to_f32().to_bits(),
                    "{bits:#06x}"
                );
            }
        }
    }

    #[test]
    fn q8_0_by_hand() {
        let mut b = h(0.5).to_vec();
        b.extend((0..32).map(|i| (i as i8 - 16) as u8));
        let out = dequantize(TensorType::Q8_0, &b).expect("q8_0");
        assert_eq!(out[0], -8.0);
        assert_eq!(out[16], 0.0);
        assert_eq!(out[31], 7.5);
    }

    #[test]
    fn q4_0_by_hand() {
        let mut b = h(2.0).to_vec();
        b.extend([0x1Fu8; 16]); // low nibble 15, high nibble 1
        let out = dequantize(TensorType::Q4_0, &b).expect("q4_0");
        assert_eq!(out[0], 14.0); // 2·(15−8)
        assert_eq!(out[16], -14.0); // 2·(1−8)
    }

    #[test]
    fn q4_1_by_hand() {
        let mut b = h(0.25).to_vec();
        b.extend(h(-1.0));
        b.extend([0x30u8; 16]); // low 0, high 3
        let out = dequantize(TensorType::Q4_1, &b).expect("q4_1");
        assert_eq!(out[5], -1.0);
        assert_eq!(out[20], -0.25);
    }

    #[test]
    fn q4_k_by_hand() {
        let mut b = h(1.0).to_vec();
        b.extend(h(0.5));
        // Sub-blocks 0..3: scale = j+1, min = 2; sub-blocks 4..7: scale 5, min 1 (split encoding).
        let mut scales = [0u8; 12];
        for j in 0..4 {
            scales[j] = (j as u8 + 1) & 63; // high two bits feed sub-block j+4's scale: 0
            scales[j + 4] = 2;
        }
        for j in 0..4 {
            scales[j + 8] = 5 | (1 << 4);
        }
        b.extend(scales);
        b.extend([0x21u8; 128]); // low nibble 1, high 2
        let out = dequantize(TensorType::Q4_K, &b).expect("q4_k");
        // Sub-block 0 (scale 1, min 2): 1·1·1 − 0.5·2 = 0
        assert_eq!(out[0], 0.0);
        // Sub-block 1 (scale 2, min 2), high nibbles: 2·2 − 1 = 3
        assert_eq!(out[32], 3.0);
        // Sub-block 4 (scale 5, min 1), low nibble: 5·1 − 0.5 = 4.5
        assert_eq!(out[128], 4.5);
        // Sub-block 7 (scale 5, min 1), high nibble: 5·2 − 0.5 = 9.5
        assert_eq!(out[255], 9.5);
    }

    #[test]
    fn q6_k_by_hand() {
        let mut b = vec![0u8; 210];
        b[0] = 0x05; // ql[0]: low 5 → element 0; high 0 → element 64
        b[128] = 0b0000_0001; // qh[0]: element 0 gets high bits 01 → 5 | 16 = 21
        for (i, s) in b[192..208].iter_mut().enumerate() {
            *s = (i as i8 - 4) as u8;
        }
        b[208..210].copy_from_slice(&h(0.5));
        let out = dequantize(TensorType::Q6_K, &b).expect("q6_k");
        assert_eq!(out[0], 0.5 * -4.0 * (21.0 - 32.0)); // scale index 0 is −4
        assert_eq!(out[64], 0.5 * 0.0 * -32.0); // scale index 4 is 0
        assert_eq!(out[96], 0.5 * 2.0 * -32.0); // scale index 6 is 2
        assert_eq!(out[255], 0.5 * 11.0 * -32.0); // second half, l=31: scale index 8+1+6 = 15 → 11
    }

    #[test]
    fn f16_bf16_f32_by_hand() {
        assert_eq!(
            dequantize(TensorType::F16, &h(-1.5)).expect("f16"),
            vec![-1.5]
        );
        assert_eq!(
            dequantize(TensorType::BF16, &bf16::from_f32(3.0).to_le_bytes()).expect("bf16"),
            vec![3.0]
        );
        assert_eq!(
            dequantize(TensorType::F32, &2.5f32.to_le_bytes()).expect("f32"),
            vec![2.5]
        );
    }

    #[test]
    fn encoders_round_trip_within_a_step() {
        let v: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 64) as f32 - 32.0) / 10.0)
            .collect();
        for (ty, bytes, tol) in [
            (TensorType::Q8_0, encode::q8_0(&v), 0.02),
            (TensorType::Q4_0, encode::q4_0(&v), 0.45),
            (TensorType::Q4_1, encode::q4_1(&v), 0.25),
            (TensorType::Q5_0, encode::q5_0(&v), 0.12),
            (TensorType::Q5_1, encode::q5_1(&v), 0.12),
        ] {
            let back = dequantize(ty, &bytes).expect("dequant");
            for (a, b) in v.iter().zip(&back) {
                assert!((a - b).abs() <= tol, "{ty:?}: {a} vs {b}");
            }
        }
    }

    #[test]
    fn k_quant_encoders_round_trip_within_a_step() {
        // Two super-blocks, sub-blocks of differing ranges (so the 6-bit scales differ).
        let spread = |i: usize| 1.0 + (i / 32) as f32 * 0.1;
        let v: Vec<f32> = (0..512)
            .map(|i| ((i * 37 % 64) as f32 - 32.0) / 10.0 * spread(i))
            .collect();
        for (ty, bytes, tol) in [
            // Half a step of each sub-block's range (6.3 · spread) over 15 and 63 levels.
            (TensorType::Q4_K, encode::q4_k(&v), 0.22),
            (TensorType::Q5_K, encode::q5_k(&v), 0.12),
            (TensorType::Q6_K, encode::q6_k(&v), 0.06),
        ] {
            assert_eq!(bytes.len() as u64, 2 * ty.block_bytes(), "{ty:?}");
            let back = dequantize(ty, &bytes).expect("dequant");
            for (i, (a, b)) in v.iter().zip(&back).enumerate() {
                assert!((a - b).abs() <= tol * spread(i), "{ty:?} [{i}]: {a} vs {b}");
            }
        }
    }

    #[test]
    fn unpacked_k_blocks_hold_the_dequantized_values() {
        let v: Vec<f32> = (0..256).map(|i| (i as f32 * 0.37).sin()).collect();
        let b4 = encode::q4_k(&v);
        let unpacked = unpack_q4_k(&b4);
        let back = dequantize(TensorType::Q4_K, &b4).expect("q4_k");
        for (i, &want) in back.iter().enumerate() {
            assert!(unpacked.q[i] < 16);
            let x = unpacked.scale[i / 32] * f32::from(unpacked.q[i]) - unpacked.min[i / 32];
            assert_eq!(x, want);
        }
        let b5 = encode::q5_k(&v);
        let back = dequantize(TensorType::Q5_K, &b5).expect("q5_k");
        for (s, (d, m, q)) in unpack_q5_k(&b5).iter().enumerate() {
            for (l, &q) in q.iter().enumerate() {
                assert!(q < 32);
                assert_eq!(d * f32::from(q) + m, back[32 * s + l]);
            }
        }
        let b6 = encode::q6_k(&v);
        let unpacked = unpack_q6_k(&b6);
        let back = dequantize(TensorType::Q6_K, &b6).expect("q6_k");
        for (i, &want) in back.iter().enumerate() {
            assert!((-32..32).contains(&unpacked.q[i]));
            assert_eq!(unpacked.scale[i / 16] * f32::from(unpacked.q[i]), want);
        }
    }

    #[test]
    fn unsupported_and_ragged() {
        assert_eq!(
            dequantize(TensorType::Q3_K, &[0; 110]),
            Err(QuantError::Unsupported(TensorType::Q3_K))
        );
        assert!(matches!(
            dequantize(TensorType::Q8_0, &[0; 35]),
            Err(QuantError::Ragged { .. })
        ));
    }
}
