//! The same Llama-family transformer as [`crate::model`], run on a burn [`Device`] chosen at
//! run time: WebGPU in the browser, Vulkan (Mesa lavapipe on a machine without a GPU) or
//! burn's pure-Rust `flex` CPU backend natively.
//!
//! Weights stay quantized on the device. GGUF blocks map onto burn's block-quantized tensors
//! without loss (each mapping is checked against the CPU's dequantization in the tests below):
//! - Q8_0 `x = d·q` is Q8F per block of 32 with an f32 scale;
//! - Q4_0 `x = d·(q − 8)` is Q4F per block of 32;
//! - Q4_1 `x = d·q + m` is `d·(q − 8) + (m + 8d)`: a Q4F tensor plus one bias per block, applied
//!   as `blocksum32(x) · biasᵀ` after the quantized product;
//! - Q4_K `x = s·q − m` per sub-block of 32 (6-bit `s`, `m` times the super-block's `d`, `dmin`)
//!   is the same: `s·(q − 8) + (8s − m)`, Q4F plus one bias per block of 32;
//! - Q6_K `x = (d·sc)·q`, `q` in −32..32 with a signed 8-bit `sc` per sub-block of 16, is Q8F per
//!   block of 16.
//!
//! Other tensor types are dequantized to f32 once at load (stated in [`DeviceModel::weight_bytes`]).
//! The embedding table stays on the host: a prompt needs a handful of rows, not a 49k-row
//! gather on the device.
//!
//! Readback is asynchronous (`into_data_async`) because a browser cannot block on the GPU.

use burn::tensor::quantization::{QuantScheme, QuantStore, QuantValue};
use burn::tensor::{DType, Device, Tensor, TensorData, activation};

#[cfg(not(target_arch = "wasm32"))]
use crate::causal_lm::ready;
use crate::gguf::{ByteSource, Gguf, GgufError};
use crate::kernels;
use crate::kernels::matvec::MatvecKernel;
use crate::model::{Arch, Config, ModelError};
use crate::qmatrix::QMatrix;
use crate::quant::{self, Nibbles, TensorType};

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
    /// Q4_1's per-block offsets `[out, in/32]`, applied to the block sums of `x`.
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

struct Layer {
    attn_norm: Tensor<2>,
    wq: Linear,
    wk: Linear,
    wv: Linear,
    wo: Linear,
    ffn_norm: Tensor<2>,
    w_gate: Linear,
    w_up: Linear,
    w_down: Linear,
}

/// Keys and values of every layer for one sequence, preallocated for `capacity` positions.
pub struct DeviceCache {
    keys: Vec<Tensor<3>>,
    values: Vec<Tensor<3>>,
    len: usize,
    capacity: usize,
}

impl DeviceCache {
    /// Positions filled so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no position is filled.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Positions the cache can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Forgets positions from `len` on (a rejected speculative draft, a reused prefix).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }
}

/// Where one chunk's rows sit in a pass.
#[derive(Clone, Copy)]
struct Span {
    /// Its first row among the pass's rows.
    first: usize,
    /// Its tokens.
    n: usize,
    /// The position of its first token in its sequence.
    start: usize,
}

/// What every layer of one pass shares: where each chunk's rows sit, their RoPE angles and
/// their causal masks (none for a single token).
struct Pass {
    spans: Vec<Span>,
    rows: usize,
    cos: Tensor<4>,
    sin: Tensor<4>,
    masks: Vec<Option<Tensor<2>>>,
}

impl Pass {
    /// `t`'s rows `[n, heads, hd]` that belong to `span` (all of them when it is the only one).
    fn rows_of(&self, t: &Tensor<3>, span: Span) -> Tensor<3> {
        if self.spans.len() == 1 {
            return t.clone();
        }
        let [_, heads, hd] = t.dims();
        t.clone()
            .slice([span.first..span.first + span.n, 0..heads, 0..hd])
    }
}

/// One sequence's per-layer keys and values, moved out of its cache for a pass.
type TakenLayers = (std::vec::IntoIter<Tensor<3>>, std::vec::IntoIter<Tensor<3>>);

/// A Llama-family model whose weights live, quantized, on a burn device.
pub struct DeviceModel {
    pub config: Config,
    device: Device,
    embed: QMatrix,
    layers: Vec<Layer>,
    norm: Tensor<2>,
    head: Linear,
    max_context: usize,
    own_kernels: bool,
    matvec: MatvecKernel,
}

impl std::fmt::Debug for DeviceModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceModel")
            .field("config", &self.config)
            .field("device_weight_bytes", &self.weight_bytes())
            .finish()
    }
}

fn tensor_info<'g, S: ByteSource>(
    g: &'g Gguf<S>,
    name: &str,
) -> Result<&'g crate::gguf::TensorInfo, ModelError> {
    g.tensor(name)
        .ok_or_else(|| GgufError::MissingTensor(name.into()).into())
}

fn check_shape(name: &str, got: &[u64], want: &[u64]) -> Result<(), ModelError> {
    if got != want {
        return Err(ModelError::Shape {
            name: name.into(),
            got: got.to_vec(),
            want: want.to_vec(),
        });
    }
    Ok(())
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

fn linear<S: ByteSource>(
    g: &Gguf<S>,
    name: &str,
    out_dim: usize,
    in_dim: usize,
    device: &Device,
) -> Result<Linear, ModelError> {
    let info = tensor_info(g, name)?;
    // GGUF lists the input dimension first.
    check_shape(name, &info.shape, &[in_dim as u64, out_dim as u64])?;
    Linear::upload(info.ty, &g.tensor_bytes(name)?, out_dim, in_dim, device)
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
            TensorType::Q8_0 if whole(BLOCK) => {
                let (values, scales) =
                    eight_bit(blocks.map(quant::unpack_q8_0).map(|(d, q)| ([d], q)));
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
        let (weight, mut device_bytes) = quantized(
            shape,
            packed_q4(&nibbles, &scales),
            QuantValue::Q4F,
            BLOCK,
            device,
        );
        let block_bias = (!bias.is_empty()).then(|| {
            device_bytes += bias.len() * 4;
            Tensor::<2>::from_data(TensorData::new(bias, [out_dim, in_dim / BLOCK]), device)
        });
        Linear {
            weight,
            block_bias,
            in_dim,
            quantized: true,
            device_bytes,
        }
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

fn norm_weight<S: ByteSource>(
    g: &Gguf<S>,
    name: &str,
    len: usize,
    device: &Device,
) -> Result<Tensor<2>, ModelError> {
    let info = tensor_info(g, name)?;
    check_shape(name, &info.shape, &[len as u64])?;
    let values = quant::dequantize(info.ty, &g.tensor_bytes(name)?)?;
    Ok(Tensor::<2>::from_data(
        TensorData::new(values, [1, len]),
        device,
    ))
}

fn rms_norm(x: Tensor<2>, weight: &Tensor<2>, eps: f32, own_kernels: bool) -> Tensor<2> {
    if let Some(y) = own_kernels
        .then(|| kernels::norm::rms_norm(&x, weight, eps))
        .flatten()
    {
        return y;
    }
    rms_norm_burn(x, weight, eps)
}

/// RMSNorm composed from burn's operations (the `flex` backend; the fused kernel's reference).
fn rms_norm_burn(x: Tensor<2>, weight: &Tensor<2>, eps: f32) -> Tensor<2> {
    let inv_rms = x
        .clone()
        .square()
        .mean_dim(1)
        .add_scalar(eps)
        .sqrt()
        .recip();
    x * inv_rms * weight.clone()
}

impl DeviceModel {
    /// Uploads the weights of a Llama-family GGUF to `device`; caches it creates hold at most
    /// `max_context` positions.
    pub fn load<S: ByteSource>(
        g: &Gguf<S>,
        max_context: usize,
        device: &Device,
    ) -> Result<Self, ModelError> {
        let c = Config::from_gguf(g)?;
        if c.arch != Arch::Llama {
            return Err(ModelError::UnsupportedOnDevice(c.arch.name()));
        }
        let (d, kv, f) = (c.dim, c.kv_dim(), c.ffn_dim);
        let mut layers = Vec::with_capacity(c.n_layers);
        for i in 0..c.n_layers {
            let n = |s: &str| format!("blk.{i}.{s}.weight");
            layers.push(Layer {
                attn_norm: norm_weight(g, &n("attn_norm"), d, device)?,
                wq: linear(g, &n("attn_q"), d, d, device)?,
                wk: linear(g, &n("attn_k"), kv, d, device)?,
                wv: linear(g, &n("attn_v"), kv, d, device)?,
                wo: linear(g, &n("attn_output"), d, d, device)?,
                ffn_norm: norm_weight(g, &n("ffn_norm"), d, device)?,
                w_gate: linear(g, &n("ffn_gate"), f, d, device)?,
                w_up: linear(g, &n("ffn_up"), f, d, device)?,
                w_down: linear(g, &n("ffn_down"), d, f, device)?,
            });
        }
        let embed_info = tensor_info(g, "token_embd.weight")?;
        check_shape(
            "token_embd.weight",
            &embed_info.shape,
            &[d as u64, c.vocab as u64],
        )?;
        let embed = QMatrix::from_gguf(
            embed_info.ty,
            &g.tensor_bytes("token_embd.weight")?,
            c.vocab,
            d,
        )?;
        // A tied head is the embedding matrix, uploaded once for the product.
        let head_name = if g.tensor("output.weight").is_some() {
            "output.weight"
        } else {
            "token_embd.weight"
        };
        let head = linear(g, head_name, c.vocab, d, device)?;
        let norm = norm_weight(g, "output_norm.weight", d, device)?;
        Ok(Self {
            max_context: max_context.min(c.context_length.max(1)),
            config: c,
            device: device.clone(),
            embed,
            layers,
            norm,
            head,
            own_kernels: true,
            matvec: MatvecKernel::default(),
        })
    }

    /// Bytes of weights held on the device (quantized values, scales, Q4_1 offsets, norms).
    pub fn weight_bytes(&self) -> usize {
        let norms = (2 * self.layers.len() + 1) * self.config.dim * 4;
        let linears: usize = self
            .layers
            .iter()
            .map(|l| {
                [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down]
                    .iter()
                    .map(|m| m.device_bytes)
                    .sum::<usize>()
            })
            .sum();
        norms + linears + self.head.device_bytes
    }

    /// Bytes an f32 KV cache of `capacity` positions takes on the device.
    pub fn cache_bytes(&self, capacity: usize) -> usize {
        2 * self.config.n_layers * capacity * self.config.kv_dim() * 4
    }

    /// Whether cubecl devices run our own kernels (see `kernels`: products of up to 16 rows,
    /// RMSNorm, RoPE, attention, the SwiGLU gate; on by default) or only burn's operations; a
    /// switch for benchmarks and for comparing the two.
    pub fn set_own_kernels(&mut self, on: bool) {
        self.own_kernels = on;
    }

    /// How our product kernel shares out a row (see [`MatvecKernel`]); software adapters want
    /// [`MatvecKernel::PerRow`].
    pub fn set_matvec_kernel(&mut self, kernel: MatvecKernel) {
        self.matvec = kernel;
    }

    fn matvec(&self) -> Option<MatvecKernel> {
        self.own_kernels.then_some(self.matvec)
    }

    /// Largest context a cache may hold.
    pub fn max_context(&self) -> usize {
        self.max_context
    }

    /// The device the weights live on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// A zeroed KV cache for `capacity` positions (capped at [`Self::max_context`]).
    pub fn new_cache(&self, capacity: usize) -> DeviceCache {
        let capacity = capacity.min(self.max_context).max(1);
        let c = &self.config;
        let shape = [c.n_kv_heads, capacity, c.head_dim];
        let zeros = || -> Vec<Tensor<3>> {
            (0..c.n_layers)
                .map(|_| Tensor::<3>::zeros(shape, &self.device))
                .collect()
        };
        DeviceCache {
            keys: zeros(),
            values: zeros(),
            len: 0,
            capacity,
        }
    }

    /// Grows `cache` to hold `capacity` positions (capped at [`Self::max_context`]), keeping
    /// what it holds: a verify session's cache grows with its answer.
    pub fn reserve(&self, cache: &mut DeviceCache, capacity: usize) {
        let capacity = capacity.min(self.max_context);
        if capacity <= cache.capacity {
            return;
        }
        let c = &self.config;
        let (kv, hd, len) = (c.n_kv_heads, c.head_dim, cache.len);
        let grow = |old: Tensor<3>| {
            let fresh = Tensor::<3>::zeros([kv, capacity, hd], &self.device);
            if len == 0 {
                fresh
            } else {
                fresh.slice_assign([0..kv, 0..len, 0..hd], old.slice([0..kv, 0..len, 0..hd]))
            }
        };
        cache.keys = std::mem::take(&mut cache.keys)
            .into_iter()
            .map(grow)
            .collect();
        cache.values = std::mem::take(&mut cache.values)
            .into_iter()
            .map(grow)
            .collect();
        cache.capacity = capacity;
    }

    /// Runs `tokens` at positions `cache.len()..` and returns the logits, still on the device,
    /// of the last token (`[1, vocab]`) or of every token (`[n, vocab]`) when `all_logits`.
    pub fn forward(
        &self,
        tokens: &[u32],
        cache: &mut DeviceCache,
        all_logits: bool,
    ) -> Result<Tensor<2>, ModelError> {
        let n = tokens.len();
        let x = self.forward_hidden(&[tokens], &mut [cache])?;
        let x = if all_logits {
            x
        } else {
            x.slice([n - 1..n, 0..self.config.dim])
        };
        Ok(self.logits(x))
    }

    /// Runs several sequences at once (continuous batching): `chunks[i]` at positions
    /// `caches[i].len()..`, every product over all their rows together. Returns, still on the
    /// device, the logits of the last token of each chunk whose `want_logits` is set, in order
    /// (`None` when none is).
    pub fn forward_chunks(
        &self,
        chunks: &[&[u32]],
        caches: &mut [&mut DeviceCache],
        want_logits: &[bool],
    ) -> Result<Option<Tensor<2>>, ModelError> {
        let x = self.forward_hidden(chunks, caches)?;
        let d = self.config.dim;
        let mut end = 0;
        let mut last_rows = Vec::new();
        for (chunk, &want) in chunks.iter().zip(want_logits) {
            end += chunk.len();
            if want {
                last_rows.push(x.clone().slice([end - 1..end, 0..d]));
            }
        }
        if last_rows.is_empty() {
            return Ok(None);
        }
        // One sequence (a page's decode step) needs no concatenation.
        let rows = if last_rows.len() == 1 {
            last_rows.swap_remove(0)
        } else {
            Tensor::cat(last_rows, 0)
        };
        Ok(Some(self.logits(rows)))
    }

    /// [`Self::forward_chunks`] with the logits read back: one entry per chunk, the logits
    /// where they were wanted.
    pub(crate) async fn forward_chunks_read(
        &self,
        chunks: &[&[u32]],
        caches: &mut [&mut DeviceCache],
        want_logits: &[bool],
    ) -> Result<Vec<Option<Vec<f32>>>, ModelError> {
        let rows = match self.forward_chunks(chunks, caches, want_logits)? {
            Some(logits) => self.read_rows(logits).await?,
            None => Vec::new(),
        };
        let mut rows = rows.into_iter();
        Ok(want_logits
            .iter()
            .map(|&want| if want { rows.next() } else { None })
            .collect())
    }

    /// [`Self::forward_chunks`] for native callers, blocking on the readback.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn forward_chunks_blocking(
        &self,
        chunks: &[&[u32]],
        caches: &mut [&mut DeviceCache],
        want_logits: &[bool],
    ) -> Result<Vec<Option<Vec<f32>>>, ModelError> {
        ready(self.forward_chunks_read(chunks, caches, want_logits))
    }

    /// Reads logits `[n, vocab]` back as rows: awaited in a browser, which cannot block;
    /// blocking elsewhere, so a native pass never waits (the model is a `BlockingLm` there).
    async fn read_rows(&self, logits: Tensor<2>) -> Result<Vec<Vec<f32>>, ModelError> {
        #[cfg(target_arch = "wasm32")]
        let data = logits.into_data_async().await;
        #[cfg(not(target_arch = "wasm32"))]
        let data = logits.try_into_data();
        rows_of(
            data.map_err(|e| ModelError::Device(format!("{e:?}")))?,
            self.config.vocab,
        )
    }

    /// The output head over final hidden rows `[n, dim] → [n, vocab]`.
    fn logits(&self, x: Tensor<2>) -> Tensor<2> {
        let c = &self.config;
        self.head.forward(
            rms_norm(x, &self.norm, c.rms_eps, self.own_kernels),
            self.matvec(),
        )
    }

    /// The transformer over every chunk's tokens: the final hidden rows `[Σ n_i, dim]`, chunk
    /// after chunk. Products, norms and the MLP see all rows at once; RoPE positions and
    /// attention are each sequence's own.
    fn forward_hidden(
        &self,
        chunks: &[&[u32]],
        caches: &mut [&mut DeviceCache],
    ) -> Result<Tensor<2>, ModelError> {
        let pass = self.pass(chunks, caches)?;
        let mut x = self.embed_rows(chunks, pass.rows)?;
        // Each layer's cache tensors are moved out and back so that burn holds the only handle
        // and writes the new positions in place; a clone would make it copy the whole cache.
        let mut taken: Vec<TakenLayers> = caches
            .iter_mut()
            .map(|cache| {
                (
                    std::mem::take(&mut cache.keys).into_iter(),
                    std::mem::take(&mut cache.values).into_iter(),
                )
            })
            .collect();
        for layer in &self.layers {
            let attention = self.attention(layer, &x, &pass, &mut taken, caches)?;
            x = x + attention;
            let mlp = self.mlp(layer, &x);
            x = x + mlp;
        }
        for (cache, span) in caches.iter_mut().zip(&pass.spans) {
            cache.len += span.n;
        }
        Ok(x)
    }

    /// Checks each chunk against its cache, and lays the chunks' rows end to end.
    fn pass(&self, chunks: &[&[u32]], caches: &[&mut DeviceCache]) -> Result<Pass, ModelError> {
        let c = &self.config;
        if chunks.is_empty() || chunks.len() != caches.len() {
            return Err(ModelError::Config(format!(
                "{} chunks for {} caches",
                chunks.len(),
                caches.len()
            )));
        }
        let mut spans = Vec::with_capacity(chunks.len());
        let mut rows = 0;
        for (tokens, cache) in chunks.iter().zip(caches.iter()) {
            let (n, start) = (tokens.len(), cache.len);
            if n == 0 || start + n > cache.capacity {
                return Err(ModelError::ContextFull {
                    needed: start + n.max(1),
                    capacity: cache.capacity,
                });
            }
            if cache.keys.len() != c.n_layers || cache.values.len() != c.n_layers {
                return Err(ModelError::Config(
                    "the cache was made for a model with a different number of layers".into(),
                ));
            }
            spans.push(Span {
                first: rows,
                n,
                start,
            });
            rows += n;
        }
        let (cos, sin) = self.rope_tables(&spans);
        let masks = spans
            .iter()
            .map(|s| (s.n > 1).then(|| self.causal_mask(s.start, s.n)))
            .collect();
        Ok(Pass {
            spans,
            rows,
            cos,
            sin,
            masks,
        })
    }

    /// The chunks' token embeddings, end to end: `[rows, dim]`.
    fn embed_rows(&self, chunks: &[&[u32]], rows: usize) -> Result<Tensor<2>, ModelError> {
        let (d, vocab) = (self.config.dim, self.config.vocab);
        let mut values = vec![0f32; rows * d];
        for (t, &tok) in chunks.iter().flat_map(|ch| ch.iter()).enumerate() {
            if tok as usize >= vocab {
                return Err(ModelError::BadToken(tok));
            }
            self.embed
                .row(tok as usize, &mut values[t * d..(t + 1) * d]);
        }
        Ok(Tensor::<2>::from_data(
            TensorData::new(values, [rows, d]),
            &self.device,
        ))
    }

    /// The attention block's output `[rows, dim]` for the residual `x`: each chunk against
    /// its own cache, which gains the chunk's keys and values.
    fn attention(
        &self,
        layer: &Layer,
        x: &Tensor<2>,
        pass: &Pass,
        taken: &mut [TakenLayers],
        caches: &mut [&mut DeviceCache],
    ) -> Result<Tensor<2>, ModelError> {
        let c = &self.config;
        let h = rms_norm(x.clone(), &layer.attn_norm, c.rms_eps, self.own_kernels);
        let heads = |w: &Linear, h: Tensor<2>, heads: usize| {
            w.forward(h, self.matvec())
                .reshape([pass.rows, heads, c.head_dim])
        };
        let rotated = |t: Tensor<3>| rope(t, &pass.cos, &pass.sin, self.own_kernels);
        let q = rotated(heads(&layer.wq, h.clone(), c.n_heads));
        let k = rotated(heads(&layer.wk, h.clone(), c.n_kv_heads));
        let v = heads(&layer.wv, h, c.n_kv_heads);
        let mut attn = Vec::with_capacity(pass.spans.len());
        for (i, &span) in pass.spans.iter().enumerate() {
            let (keys, values) = self.append(pass, span, (&k, &v), &mut taken[i], caches[i])?;
            let q = pass.rows_of(&q, span);
            attn.push(self.span_attention(q, keys, values, pass.masks[i].as_ref(), span));
        }
        let attn = if attn.len() == 1 {
            attn.swap_remove(0)
        } else {
            Tensor::cat(attn, 0)
        };
        Ok(layer.wo.forward(attn, self.matvec()))
    }

    /// Writes `span`'s new keys and values into this layer's cache tensors, hands them back to
    /// the cache, and returns them.
    fn append(
        &self,
        pass: &Pass,
        span: Span,
        (k, v): (&Tensor<3>, &Tensor<3>),
        taken: &mut TakenLayers,
        cache: &mut DeviceCache,
    ) -> Result<(Tensor<3>, Tensor<3>), ModelError> {
        let c = &self.config;
        let (Some(old_keys), Some(old_values)) = (taken.0.next(), taken.1.next()) else {
            return Err(ModelError::Config("the cache lost a layer".into()));
        };
        let at = [
            0..c.n_kv_heads,
            span.start..span.start + span.n,
            0..c.head_dim,
        ];
        let keys = old_keys.slice_assign(at.clone(), pass.rows_of(k, span).swap_dims(0, 1));
        let values = old_values.slice_assign(at, pass.rows_of(v, span).swap_dims(0, 1));
        cache.keys.push(keys.clone());
        cache.values.push(values.clone());
        Ok((keys, values))
    }

    /// One chunk's attention `[n, heads·hd]`: the fused kernel where it runs, burn's
    /// operations otherwise.
    fn span_attention(
        &self,
        q: Tensor<3>,
        keys: Tensor<3>,
        values: Tensor<3>,
        mask: Option<&Tensor<2>>,
        span: Span,
    ) -> Tensor<2> {
        let scale = 1.0 / (self.config.head_dim as f32).sqrt();
        let fused = self
            .own_kernels
            .then(|| {
                kernels::attention::causal_attention_rows(&q, &keys, &values, span.start, scale)
            })
            .flatten();
        match fused {
            Some(a) => a,
            None => self.attention_burn(q, keys, values, mask, span.start, span.n),
        }
    }

    /// The MLP block's output for the residual `x`: down(silu(gate(h)) · up(h)).
    fn mlp(&self, layer: &Layer, x: &Tensor<2>) -> Tensor<2> {
        let h = rms_norm(
            x.clone(),
            &layer.ffn_norm,
            self.config.rms_eps,
            self.own_kernels,
        );
        let gate = layer.w_gate.forward(h.clone(), self.matvec());
        let up = layer.w_up.forward(h, self.matvec());
        let gated = match self
            .own_kernels
            .then(|| kernels::elementwise::swiglu(&gate, &up))
            .flatten()
        {
            Some(gated) => gated,
            None => activation::silu(gate) * up,
        };
        layer.w_down.forward(gated, self.matvec())
    }

    /// Attention composed from burn's operations (the `flex` backend, contexts longer than the
    /// fused kernel holds): `[n, heads·hd]` for queries `q [n, heads, hd]` at `start..start+n`.
    fn attention_burn(
        &self,
        q: Tensor<3>,
        keys: Tensor<3>,
        values: Tensor<3>,
        mask: Option<&Tensor<2>>,
        start: usize,
        n: usize,
    ) -> Tensor<2> {
        let c = &self.config;
        let (d, hd) = (c.dim, c.head_dim);
        let total = start + n;
        let group = c.n_heads / c.n_kv_heads;
        let scale = 1.0 / (hd as f32).sqrt();
        let keys = keys.slice([0..c.n_kv_heads, 0..total, 0..hd]);
        let values = values.slice([0..c.n_kv_heads, 0..total, 0..hd]);

        // Query heads h = kv·group + g share key/value head kv: fold the group into rows.
        let q = q.swap_dims(0, 1).reshape([c.n_kv_heads, group * n, hd]);
        let mut scores = q.matmul(keys.swap_dims(1, 2)).mul_scalar(scale);
        if let Some(mask) = mask {
            scores = (scores.reshape([c.n_kv_heads, group, n, total])
                + mask.clone().reshape([1, 1, n, total]))
            .reshape([c.n_kv_heads, group * n, total]);
        }
        let probs = activation::softmax(scores, 2);
        probs
            .matmul(values)
            .reshape([c.n_heads, n, hd])
            .swap_dims(0, 1)
            .reshape([n, d])
    }

    /// Runs `tokens` and reads back the logits of the last token (or every token).
    pub async fn forward_read(
        &self,
        tokens: &[u32],
        cache: &mut DeviceCache,
        all_logits: bool,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let logits = self.forward(tokens, cache, all_logits)?;
        self.read_rows(logits).await
    }

    /// [`Self::forward_read`] for native callers, blocking on the readback.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn forward_blocking(
        &self,
        tokens: &[u32],
        cache: &mut DeviceCache,
        all_logits: bool,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        ready(self.forward_read(tokens, cache, all_logits))
    }

    /// cos/sin of the RoPE angles for every row of `spans` (first row, rows, first position),
    /// shaped `[rows, 1, hd/2, 1]` to broadcast over heads and the (even, odd) pair axis.
    fn rope_tables(&self, spans: &[Span]) -> (Tensor<4>, Tensor<4>) {
        let c = &self.config;
        let half = c.head_dim / 2;
        let n: usize = spans.iter().map(|s| s.n).sum();
        let mut cos = Vec::with_capacity(n * half);
        let mut sin = Vec::with_capacity(n * half);
        for pos in spans.iter().flat_map(|s| s.start..s.start + s.n) {
            for i in 0..half {
                let angle = pos as f32 * c.rope_theta.powf(-2.0 * i as f32 / c.head_dim as f32);
                cos.push(angle.cos());
                sin.push(angle.sin());
            }
        }
        let t = |v| Tensor::<4>::from_data(TensorData::new(v, [n, 1, half, 1]), &self.device);
        (t(cos), t(sin))
    }

    /// `[n, start+n]`: 0 where query `i` (at `start+i`) may see key `j`, −∞ after it.
    fn causal_mask(&self, start: usize, n: usize) -> Tensor<2> {
        let total = start + n;
        let mut mask = vec![0f32; n * total];
        for i in 0..n {
            for j in start + i + 1..total {
                mask[i * total + j] = f32::NEG_INFINITY;
            }
        }
        Tensor::<2>::from_data(TensorData::new(mask, [n, total]), &self.device)
    }
}

/// Rotates adjacent pairs of each head's vector (`[n, heads, hd]`) by its position's angles
/// (GGUF's llama layout permutes Q/K rows for this "normal" RoPE mode).
fn rope(x: Tensor<3>, cos: &Tensor<4>, sin: &Tensor<4>, own_kernels: bool) -> Tensor<3> {
    if let Some(y) = own_kernels
        .then(|| kernels::elementwise::rope(&x, cos, sin))
        .flatten()
    {
        return y;
    }
    let [n, heads, hd] = x.dims();
    let pairs = x.reshape([n, heads, hd / 2, 2]);
    let even = pairs.clone().slice([0..n, 0..heads, 0..hd / 2, 0..1]);
    let odd = pairs.slice([0..n, 0..heads, 0..hd / 2, 1..2]);
    let rotated_even = even.clone() * cos.clone() - odd.clone() * sin.clone();
    let rotated_odd = even * sin.clone() + odd * cos.clone();
    Tensor::cat(vec![rotated_even, rotated_odd], 3).reshape([n, heads, hd])
}

fn rows_of(data: TensorData, vocab: usize) -> Result<Vec<Vec<f32>>, ModelError> {
    let values = data
        .try_into_vec::<f32>()
        .map_err(|e| ModelError::Device(format!("{e:?}")))?;
    Ok(values.chunks_exact(vocab).map(<[f32]>::to_vec).collect())
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;

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

    /// Both matrix–vector kernels on the device against the dequantized product on the host, for
    /// every quantized type, row counts that do not fill a cube, inputs shorter than one word
    /// per lane and longer than several, and one to a few activation rows.
    #[test]
    fn matvec_kernels_equal_the_dequantized_product() {
        let device = match Device::wgpu_options().init() {
            Ok(d) => d,
            Err(e) if std::env::var_os("STRADDLE_REQUIRE_WGPU").is_none() => {
                eprintln!("skipping: no wgpu device ({e})");
                return;
            }
            Err(e) => panic!("wgpu device required but unavailable: {e}"),
        };
        for ty in [
            TensorType::Q4_0,
            TensorType::Q4_1,
            TensorType::Q8_0,
            TensorType::Q4_K,
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
