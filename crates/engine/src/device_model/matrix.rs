//! Weight matrices on a burn device, and their products. Weights stay quantized: GGUF blocks
//! map onto burn's block-quantized tensors without loss (each mapping is checked against the
//! CPU's dequantization in the tests below):
//! - Q8_0 `x = d·q` is Q8F per block of 32 with an f32 scale;
//! - Q5_0 `x = d·q`, `q` in −16..16, is the same, a byte a value;
//! - Q4_0 `x = d·(q − 8)` is Q4F per block of 32;
//! - Q4_1 `x = d·q + m` is `d·(q − 8) + (m + 8d)`: a Q4F tensor plus one bias per block, applied
//!   as `blocksum32(x) · biasᵀ` after the quantized product;
//! - Q4_K `x = s·q − m` per sub-block of 32 (6-bit `s`, `m` times the super-block's `d`, `dmin`)
//!   is the same: `s·(q − 8) + (8s − m)`, Q4F plus one bias per block of 32;
//! - Q5_1 `x = d·q + m`, `q` in 0..32, is `d·(q − 16) + (m + 16d)`: Q8F per block of 32 plus
//!   one bias per block, as Q4_1; Q5_K's sub-blocks of 32 are Q5_1 blocks;
//! - Q6_K `x = (d·sc)·q`, `q` in −32..32 with a signed 8-bit `sc` per sub-block of 16, is Q8F per
//!   block of 16.
//!
//! Other tensor types are dequantized to f32 once at load (stated in [`super::DeviceModel::weight_bytes`]).

use burn::tensor::quantization::{QuantScheme, QuantStore, QuantValue};
use burn::tensor::{DType, Device, Tensor, TensorData};

use crate::config::ModelError;
use crate::kernels;
use crate::kernels::matvec::MatvecKernel;
use crate::memory::DEVICE_PART_VALUES;
use crate::quant::{self, Nibbles, TensorType};
use crate::weights::WeightStore;

const BLOCK: usize = 32;
/// Values in a K-quant super-block (Q4_K, Q6_K): a row must hold whole ones.
const K_BLOCK: usize = 256;

/// Activation rows up to which a product runs as our matrix–vector kernel rather than burn's
/// GEMM (decode is one row; a speculative verification a handful).
const MATVEC_MAX_ROWS: usize = 16;

/// A weight matrix `[out, in]` on the device; `x [n, in] → [n, out]`.
struct Linear {
    /// Quantized (or, for types burn cannot hold quantized, f32) weights `[out, in]`.
    weight: Tensor<2>,
    /// The per-block offsets of the types with a minimum (Q4_1, Q5_1, Q4_K, Q5_K) `[out, in/32]`, applied to the block sums of `x`.
    block_bias: Option<Tensor<2>>,
    in_dim: usize,
    quantized: bool,
    device_bytes: usize,
}

impl Linear {
    /// `matvec`: our kernel for few-row products, or `None` for burn's product only.
    fn forward(&self, x: Tensor<2>, matvec: Option<MatvecKernel>) -> Tensor<2> {
        let [n, _] = x.dims();
        if let Some(kernel) = matvec.filter(|_| self.quantized && n <= MATVEC_MAX_ROWS)
            && let Some(y) = kernels::matvec::quantized_matvec(
                &x,
                &self.weight,
                self.block_bias.as_ref(),
                kernel,
            )
        {
            return y;
        }
        self.forward_burn(x)
    }

    /// The product as burn's own (tiled GEMM) kernels compute it.
    fn forward_burn(&self, x: Tensor<2>) -> Tensor<2> {
        let [n, _] = x.dims();
        // `w.matmul(xᵀ)ᵀ` is the orientation burn's quantized matmul gets right on every
        // backend (x.matmul(wᵀ) gave wrong values on flex; see NOTES-toolchain.md).
        let y = if self.quantized {
            self.weight
                .clone()
                .matmul(x.clone().transpose())
                .transpose()
        } else {
            x.clone().matmul(self.weight.clone().transpose())
        };
        match &self.block_bias {
            None => y,
            Some(bias) => {
                let sums = x
                    .reshape([n, self.in_dim / BLOCK, BLOCK])
                    .sum_dim(2)
                    .reshape([n, self.in_dim / BLOCK]);
                y + sums.matmul(bias.clone().transpose())
            }
        }
    }
}

/// A weight matrix `[out, in]` on the device, in blocks of rows that each fit one buffer (an
/// output head of a large vocabulary does not).
pub(super) struct Matrix {
    parts: Vec<Linear>,
}

impl Matrix {
    /// Uploads GGUF blocks of type `ty` holding an `[out_dim, in_dim]` matrix, row after row.
    fn upload(
        ty: TensorType,
        bytes: &[u8],
        out_dim: usize,
        in_dim: usize,
        device: &Device,
    ) -> Result<Self, ModelError> {
        Self::upload_in_parts(ty, bytes, [out_dim, in_dim], DEVICE_PART_VALUES, device)
    }

    /// [`Self::upload`] in parts of at most `part_values` values (whole rows, at least one).
    fn upload_in_parts(
        ty: TensorType,
        bytes: &[u8],
        [out_dim, in_dim]: [usize; 2],
        part_values: usize,
        device: &Device,
    ) -> Result<Self, ModelError> {
        let row_bytes = bytes.len() / out_dim.max(1);
        if row_bytes == 0 || row_bytes * out_dim != bytes.len() {
            return Err(ModelError::Config(format!(
                "{} bytes of {ty:?} do not hold {out_dim} rows",
                bytes.len()
            )));
        }
        let rows_per_part = (part_values / in_dim.max(1)).max(1);
        let parts = bytes
            .chunks(rows_per_part * row_bytes)
            .map(|part| Linear::upload(ty, part, part.len() / row_bytes, in_dim, device))
            .collect::<Result<_, _>>()?;
        Ok(Self { parts })
    }

    /// `x [n, in] → [n, out]`, the parts' outputs side by side.
    pub(super) fn forward(&self, x: Tensor<2>, matvec: Option<MatvecKernel>) -> Tensor<2> {
        match &self.parts[..] {
            [one] => one.forward(x, matvec),
            parts => Tensor::cat(
                parts.iter().map(|p| p.forward(x.clone(), matvec)).collect(),
                1,
            ),
        }
    }

    /// Bytes it takes on the device.
    pub(super) fn device_bytes(&self) -> usize {
        self.parts.iter().map(|p| p.device_bytes).sum()
    }
}

/// The device model's weights: matrices uploaded as [`Matrix`]es, vectors as `[1, len]` rows.
pub(super) struct OnDevice<'a>(pub(super) &'a Device);

impl WeightStore for OnDevice<'_> {
    type Matrix = Matrix;
    type Vector = Tensor<2>;

    fn matrix(
        &self,
        ty: TensorType,
        bytes: &[u8],
        rows: usize,
        cols: usize,
    ) -> Result<Matrix, ModelError> {
        Matrix::upload(ty, bytes, rows, cols, self.0)
    }

    fn vector(&self, values: Vec<f32>) -> Tensor<2> {
        let len = values.len();
        Tensor::<2>::from_data(TensorData::new(values, [1, len]), self.0)
    }
}

/// Packs signed 4-bit values eight to a little-endian `u32`, lowest nibble first (burn's
/// `PackedU32` layout), then appends the f32 block scales.
fn packed_q4(nibbles: &[i8], scales: &[f32]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(nibbles.len() / 2 + scales.len() * 4);
    for word in nibbles.chunks(8) {
        let mut w = 0u32;
        for (i, &q) in word.iter().enumerate() {
            w |= ((q as u32) & 0xF) << (4 * i);
        }
        bytes.extend_from_slice(&w.to_ne_bytes());
    }
    for s in scales {
        bytes.extend_from_slice(&s.to_ne_bytes());
    }
    bytes
}

/// Q8 values are stored one per byte (four to a `u32`), then the f32 block scales.
fn packed_q8(values: &[i8], scales: &[f32]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(values.len() + scales.len() * 4);
    bytes.extend(values.iter().map(|&q| q as u8));
    for s in scales {
        bytes.extend_from_slice(&s.to_ne_bytes());
    }
    bytes
}

fn block_scheme(value: QuantValue, block: usize) -> QuantScheme {
    QuantScheme::default()
        .with_value(value)
        .with_store(QuantStore::PackedU32(0))
        .per_block([block as u8], burn::tensor::quantization::ScaleDtype::F32)
}

impl Linear {
    /// Uploads GGUF blocks of type `ty` holding an `[out_dim, in_dim]` matrix.
    fn upload(
        ty: TensorType,
        bytes: &[u8],
        out_dim: usize,
        in_dim: usize,
        device: &Device,
    ) -> Result<Self, ModelError> {
        let shape = [out_dim, in_dim];
        let blocks = quant::blocks(ty, bytes);
        let whole = |block: usize| in_dim.is_multiple_of(block);
        let no_min = |(d, nibbles): (f32, Nibbles)| (d, None, nibbles);
        Ok(match ty {
            TensorType::Q8_0 | TensorType::Q5_0 if whole(BLOCK) => {
                let unpack = match ty {
                    TensorType::Q8_0 => quant::unpack_q8_0,
                    _ => quant::unpack_q5_0,
                };
                let (values, scales) = eight_bit(blocks.map(unpack).map(|(d, q)| ([d], q)));
                Self::q8(shape, &values, &scales, BLOCK, device)
            }
            // x = (d·sc)·q with q in −32..32: 8-bit values, one scale per sub-block of 16.
            TensorType::Q6_K if whole(K_BLOCK) => {
                let (values, scales) =
                    eight_bit(blocks.map(quant::unpack_q6_k).map(|b| (b.scale, b.q)));
                Self::q8(shape, &values, &scales, 16, device)
            }
            TensorType::Q4_0 if whole(BLOCK) => {
                Self::q4(shape, blocks.map(quant::unpack_q4_0).map(no_min), device)
            }
            TensorType::Q4_1 if whole(BLOCK) => {
                let with_min = |(d, m, nibbles)| (d, Some(m), nibbles);
                Self::q4(shape, blocks.map(quant::unpack_q4_1).map(with_min), device)
            }
            // x = s·q − m per sub-block of 32 is a Q4_1 block: Q4_1's device layout.
            TensorType::Q5_1 if whole(BLOCK) => {
                Self::q8_with_min(shape, blocks.map(quant::unpack_q5_1), device)
            }
            TensorType::Q5_K if whole(K_BLOCK) => {
                Self::q8_with_min(shape, blocks.flat_map(quant::unpack_q5_k), device)
            }
            TensorType::Q4_K if whole(K_BLOCK) => {
                let subs = blocks.flat_map(|b| quant::unpack_q4_k(b).as_q4_1());
                Self::q4(shape, subs.map(|(d, m, q)| (d, Some(m), q)), device)
            }
            ty => Self::f32(shape, quant::dequantize(ty, bytes)?, device),
        })
    }

    /// 8-bit values with one scale per `block`; no offsets.
    fn q8(shape: [usize; 2], values: &[i8], scales: &[f32], block: usize, device: &Device) -> Self {
        let (weight, device_bytes) = quantized(
            shape,
            packed_q8(values, scales),
            QuantValue::Q8F,
            block,
            device,
        );
        Linear {
            weight,
            block_bias: None,
            in_dim: shape[1],
            quantized: true,
            device_bytes,
        }
    }

    /// Signed 4-bit values with one scale per block of 32 and, for the types with a minimum,
    /// one offset per block: `d·q + m = d·(q − 8) + (m + 8d)`.
    fn q4(
        shape: [usize; 2],
        blocks: impl Iterator<Item = (f32, Option<f32>, Nibbles)>,
        device: &Device,
    ) -> Self {
        let [out_dim, in_dim] = shape;
        let mut nibbles = Vec::with_capacity(out_dim * in_dim);
        let mut scales = Vec::with_capacity(out_dim * in_dim / BLOCK);
        let mut bias = Vec::new();
        for (d, m, packed) in blocks {
            scales.push(d);
            if let Some(m) = m {
                bias.push(m + 8.0 * d);
            }
            // GGUF packs element j in the low nibble of byte j and element j+16 in its high.
            nibbles.extend(packed.iter().map(|&byte| (byte & 0xF) as i8 - 8));
            nibbles.extend(packed.iter().map(|&byte| (byte >> 4) as i8 - 8));
        }
        let (weight, device_bytes) = quantized(
            shape,
            packed_q4(&nibbles, &scales),
            QuantValue::Q4F,
            BLOCK,
            device,
        );
        Linear {
            weight,
            block_bias: None,
            in_dim,
            quantized: true,
            device_bytes,
        }
        .with_block_bias(bias, device)
    }

    /// 5-bit values with a minimum, `x = d·q + m` with `q` in `0..32` per block of 32 (Q5_1,
    /// Q5_K's sub-blocks): 8-bit values `q − 16` with one scale `d` and one offset `m + 16d`.
    fn q8_with_min(
        shape: [usize; 2],
        blocks: impl Iterator<Item = (f32, f32, [u8; 32])>,
        device: &Device,
    ) -> Self {
        let (mut values, mut scales, mut bias) = (Vec::new(), Vec::new(), Vec::new());
        for (d, m, q) in blocks {
            scales.push(d);
            bias.push(m + 16.0 * d);
            values.extend(q.iter().map(|&v| v as i8 - 16));
        }
        Self::q8(shape, &values, &scales, BLOCK, device).with_block_bias(bias, device)
    }

    /// The matrix with one offset per block of 32 (`[out, in/32]`, row after row) added to each
    /// block's product; none when `bias` is empty.
    fn with_block_bias(mut self, bias: Vec<f32>, device: &Device) -> Self {
        if !bias.is_empty() {
            self.device_bytes += bias.len() * 4;
            let shape = [bias.len() / (self.in_dim / BLOCK), self.in_dim / BLOCK];
            self.block_bias = Some(Tensor::<2>::from_data(TensorData::new(bias, shape), device));
        }
        self
    }

    /// Weights burn cannot hold quantized, as f32.
    fn f32(shape: [usize; 2], values: Vec<f32>, device: &Device) -> Self {
        let device_bytes = values.len() * 4;
        Linear {
            weight: Tensor::<2>::from_data(TensorData::new(values, shape), device),
            block_bias: None,
            in_dim: shape[1],
            quantized: false,
            device_bytes,
        }
    }
}

/// A quantized tensor `shape` from burn's packed bytes, and its size on the device.
fn quantized(
    shape: [usize; 2],
    data: Vec<u8>,
    value: QuantValue,
    block: usize,
    device: &Device,
) -> (Tensor<2>, usize) {
    let len = data.len();
    let scheme = DType::QFloat(block_scheme(value, block));
    let t = Tensor::<2>::from_data(TensorData::from_bytes_vec(data, shape, scheme), device);
    (t, len)
}

/// The values and scales of 8-bit blocks, each laid end to end.
fn eight_bit<const S: usize, const N: usize>(
    blocks: impl Iterator<Item = ([f32; S], [i8; N])>,
) -> (Vec<i8>, Vec<f32>) {
    let (mut values, mut scales) = (Vec::new(), Vec::new());
    for (s, q) in blocks {
        scales.extend_from_slice(&s);
        values.extend_from_slice(&q);
    }
    (values, scales)
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;

    /// The wgpu device, initialised once per test process (burn refuses a second init);
    /// without an adapter, [`straddle_testkit::no_wgpu_adapter`].
    fn wgpu_device() -> Option<Device> {
        static DEVICE: std::sync::OnceLock<Option<Device>> = std::sync::OnceLock::new();
        DEVICE
            .get_or_init(|| match Device::wgpu_options().init() {
                Ok(device) => Some(device),
                Err(e) => straddle_testkit::no_wgpu_adapter(&e.to_string()),
            })
            .clone()
    }

    /// Random GGUF blocks of `ty` for an `[out, in]` matrix (scales kept small and positive).
    fn random_blocks(ty: TensorType, out_dim: usize, in_dim: usize, seed: u64) -> Vec<u8> {
        let mut state = seed;
        let mut byte = || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 56) as u8
        };
        let mut value = || (f32::from(byte()) / 255.0 - 0.5) * 0.2;
        match ty {
            TensorType::Q4_K => {
                return quant::encode::q4_k(
                    &(0..out_dim * in_dim).map(|_| value()).collect::<Vec<_>>(),
                );
            }
            TensorType::Q6_K => {
                return quant::encode::q6_k(
                    &(0..out_dim * in_dim).map(|_| value()).collect::<Vec<_>>(),
                );
            }
            TensorType::Q5_0 | TensorType::Q5_1 | TensorType::Q5_K => {
                let encode = match ty {
                    TensorType::Q5_0 => quant::encode::q5_0,
                    TensorType::Q5_1 => quant::encode::q5_1,
                    _ => quant::encode::q5_k,
                };
                return encode(&(0..out_dim * in_dim).map(|_| value()).collect::<Vec<_>>());
            }
            _ => {}
        }
        let (block_bytes, halves) = match ty {
            TensorType::Q8_0 => (34, 1),
            TensorType::Q4_0 => (18, 1),
            TensorType::Q4_1 => (20, 2),
            other => panic!("no random blocks for {other:?}"),
        };
        let mut bytes = Vec::new();
        for _ in 0..out_dim * in_dim / BLOCK {
            for h in 0..halves {
                let v = (f32::from(byte()) / 255.0 - if h == 1 { 0.5 } else { 0.0 }) * 0.05;
                bytes.extend_from_slice(&half::f16::from_f32(v).to_le_bytes());
            }
            for _ in 2 * halves..block_bytes {
                bytes.push(byte());
            }
        }
        bytes
    }

    /// A matrix uploaded in parts of a few rows (an output head too large for one buffer)
    /// gives the product of the matrix uploaded whole, on every backend and both paths.
    #[test]
    fn a_matrix_in_parts_gives_the_whole_matrix_s_product() {
        let (out_dim, in_dim) = (37, 64);
        let bytes = random_blocks(TensorType::Q8_0, out_dim, in_dim, 5);
        let mut devices = vec![Device::flex()];
        devices.extend(wgpu_device());
        for device in devices {
            let shape = [out_dim, in_dim];
            let whole = Matrix::upload_in_parts(TensorType::Q8_0, &bytes, shape, 1 << 20, &device)
                .expect("whole");
            let parts =
                Matrix::upload_in_parts(TensorType::Q8_0, &bytes, shape, 10 * in_dim, &device)
                    .expect("parts");
            assert_eq!((whole.parts.len(), parts.parts.len()), (1, 4));
            assert_eq!(whole.device_bytes(), parts.device_bytes());
            for n in [1, 5] {
                let xs: Vec<f32> = (0..n * in_dim)
                    .map(|i| (i % 13) as f32 / 7.0 - 0.9)
                    .collect();
                let x = Tensor::<2>::from_data(TensorData::new(xs, [n, in_dim]), &device);
                for matvec in [None, Some(MatvecKernel::PerRow)] {
                    let rows = |m: &Matrix| {
                        m.forward(x.clone(), matvec)
                            .into_data()
                            .try_into_vec::<f32>()
                            .expect("f32")
                    };
                    let (want, got) = (rows(&whole), rows(&parts));
                    assert_eq!(got.len(), n * out_dim);
                    for (g, w) in got.iter().zip(&want) {
                        assert!((g - w).abs() <= 1e-5 * (1.0 + w.abs()), "{g} vs {w}");
                    }
                }
            }
        }
        let short = Matrix::upload(
            TensorType::Q8_0,
            &bytes[..bytes.len() - 1],
            out_dim,
            in_dim,
            &Device::flex(),
        );
        assert!(
            matches!(short, Err(ModelError::Config(_))),
            "a short tensor is a typed error"
        );
    }

    /// Both matrix–vector kernels on the device against the dequantized product on the host, for
    /// every quantized type, row counts that do not fill a cube, inputs shorter than one word
    /// per lane and longer than several, and one to a few activation rows.
    #[test]
    fn matvec_kernels_equal_the_dequantized_product() {
        let Some(device) = wgpu_device() else {
            return;
        };
        for ty in [
            TensorType::Q4_0,
            TensorType::Q4_1,
            TensorType::Q8_0,
            TensorType::Q5_0,
            TensorType::Q5_1,
            TensorType::Q4_K,
            TensorType::Q5_K,
            TensorType::Q6_K,
        ] {
            let shapes: &[(usize, usize)] = if ty.block_elements() == 256 {
                &[(37, 256), (64, 1024), (3, 512)]
            } else {
                &[(37, 96), (64, 1024), (3, 32)]
            };
            for &(out_dim, in_dim) in shapes {
                let bytes = random_blocks(ty, out_dim, in_dim, out_dim as u64 * 31 + in_dim as u64);
                let w = quant::dequantize(ty, &bytes).expect("dequantize");
                let linear = Linear::upload(ty, &bytes, out_dim, in_dim, &device).expect("upload");
                assert!(linear.quantized, "{ty:?} stays quantized on the device");
                for n in [1, 3, MATVEC_MAX_ROWS] {
                    let xs: Vec<f32> = (0..n * in_dim)
                        .map(|i| ((i * 7919) % 201) as f32 / 100.0 - 1.0)
                        .collect();
                    let x =
                        Tensor::<2>::from_data(TensorData::new(xs.clone(), [n, in_dim]), &device);
                    let run = |kernel| {
                        kernels::matvec::quantized_matvec(
                            &x,
                            &linear.weight,
                            linear.block_bias.as_ref(),
                            kernel,
                        )
                        .expect("the kernel runs on a wgpu device")
                        .into_data()
                        .try_into_vec::<f32>()
                        .expect("f32 output")
                    };
                    let cooperative = run(MatvecKernel::Cooperative);
                    let per_row = run(MatvecKernel::PerRow);
                    let burn = linear
                        .forward_burn(x)
                        .into_data()
                        .try_into_vec::<f32>()
                        .expect("f32 output");
                    for t in 0..n {
                        for r in 0..out_dim {
                            let want: f64 = (0..in_dim)
                                .map(|i| {
                                    f64::from(w[r * in_dim + i]) * f64::from(xs[t * in_dim + i])
                                })
                                .sum();
                            let tol = 1e-4 * (1.0 + want.abs());
                            let what = format!("{ty:?} [{out_dim}, {in_dim}] n {n} row {t},{r}");
                            for (name, got) in [
                                ("cooperative", &cooperative),
                                ("per-row", &per_row),
                                ("burn", &burn),
                            ] {
                                let got = f64::from(got[t * out_dim + r]);
                                assert!(
                                    (got - want).abs() <= tol,
                                    "{what}: {name} {got}, exact {want}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}
