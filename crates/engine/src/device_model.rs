//! The same Llama-family transformer as [`crate::model`], run on a burn [`Device`] chosen at
//! run time: WebGPU in the browser, Vulkan (Mesa lavapipe on a machine without a GPU) or
//! burn's pure-Rust `flex` CPU backend natively.
//!
//! Weights stay quantized on the device. GGUF blocks map onto burn's block-quantized tensors
//! without loss (see `../shared/NOTES-toolchain.md`):
//! - Q8_0 `x = d·q` is Q8F per block of 32 with an f32 scale;
//! - Q4_0 `x = d·(q − 8)` is Q4F per block of 32;
//! - Q4_1 `x = d·q + m` is `d·(q − 8) + (m + 8d)`: a Q4F tensor plus one bias per block, applied
//!   as `blocksum32(x) · biasᵀ` after the quantized product.
//!
//! Other tensor types are dequantized to f32 once at load (stated in [`DeviceModel::weight_bytes`]).
//! The embedding table stays on the host: a prompt needs a handful of rows, not a 49k-row
//! gather on the device.
//!
//! Readback is asynchronous (`into_data_async`) because a browser cannot block on the GPU.

use burn::tensor::quantization::{QuantScheme, QuantStore, QuantValue};
use burn::tensor::{DType, Device, Tensor, TensorData, activation};

use crate::gguf::{ByteSource, Gguf, GgufError};
use crate::model::{Config, ModelError};
use crate::qmatrix::QMatrix;
use crate::quant::{self, TensorType};

const BLOCK: usize = 32;

/// A weight matrix `[out, in]` on the device; `x [n, in] → [n, out]`.
struct Linear {
    /// Quantized (or, for types burn cannot hold quantized, f32) weights `[out, in]`.
    weight: Tensor<2>,
    /// Q4_1's per-block offsets as `[in/32, out]`, applied to the block sums of `x`.
    block_bias: Option<Tensor<2>>,
    in_dim: usize,
    quantized: bool,
    device_bytes: usize,
}

impl Linear {
    fn forward(&self, x: Tensor<2>) -> Tensor<2> {
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
                y + sums.matmul(bias.clone())
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

/// A Llama-family model whose weights live, quantized, on a burn device.
pub struct DeviceModel {
    pub config: Config,
    device: Device,
    embed: QMatrix,
    layers: Vec<Layer>,
    norm: Tensor<2>,
    head: Linear,
    max_context: usize,
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

fn f16_at(b: &[u8], i: usize) -> f32 {
    half::f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
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

fn block_scheme(value: QuantValue) -> QuantScheme {
    QuantScheme::default()
        .with_value(value)
        .with_store(QuantStore::PackedU32(0))
        .per_block([BLOCK as u8], burn::tensor::quantization::ScaleDtype::F32)
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
    let bytes = g.tensor_bytes(name)?;
    let blocks = out_dim * in_dim / BLOCK;
    let quantized = |data: Vec<u8>, value: QuantValue| {
        let len = data.len();
        let t = Tensor::<2>::from_data(
            TensorData::from_bytes_vec(data, [out_dim, in_dim], DType::QFloat(block_scheme(value))),
            device,
        );
        (t, len)
    };
    let linear = match info.ty {
        TensorType::Q8_0 if in_dim.is_multiple_of(BLOCK) => {
            let mut values = Vec::with_capacity(out_dim * in_dim);
            let mut scales = Vec::with_capacity(blocks);
            for b in bytes.chunks_exact(34) {
                scales.push(f16_at(b, 0));
                values.extend(b[2..].iter().map(|&q| q as i8));
            }
            let (weight, device_bytes) = quantized(packed_q8(&values, &scales), QuantValue::Q8F);
            Linear {
                weight,
                block_bias: None,
                in_dim,
                quantized: true,
                device_bytes,
            }
        }
        TensorType::Q4_0 | TensorType::Q4_1 if in_dim.is_multiple_of(BLOCK) => {
            let with_min = info.ty == TensorType::Q4_1;
            let block_bytes = if with_min { 20 } else { 18 };
            let quants_at = if with_min { 4 } else { 2 };
            let mut nibbles = vec![0i8; out_dim * in_dim];
            let mut scales = Vec::with_capacity(blocks);
            let mut bias = Vec::with_capacity(if with_min { blocks } else { 0 });
            for (bi, b) in bytes.chunks_exact(block_bytes).enumerate() {
                let d = f16_at(b, 0);
                scales.push(d);
                if with_min {
                    // d·q + m = d·(q − 8) + (m + 8d)
                    bias.push(f16_at(b, 2) + 8.0 * d);
                }
                // GGUF packs element j in the low nibble of byte j and element j+16 in its
                // high nibble.
                let out = &mut nibbles[bi * BLOCK..(bi + 1) * BLOCK];
                for (j, &byte) in b[quants_at..].iter().enumerate() {
                    out[j] = (byte & 0xF) as i8 - 8;
                    out[j + 16] = (byte >> 4) as i8 - 8;
                }
            }
            let (weight, mut device_bytes) =
                quantized(packed_q4(&nibbles, &scales), QuantValue::Q4F);
            let block_bias = with_min.then(|| {
                device_bytes += bias.len() * 4;
                // [out, in/32] → [in/32, out] so it multiplies the block sums directly.
                Tensor::<2>::from_data(TensorData::new(bias, [out_dim, in_dim / BLOCK]), device)
                    .transpose()
            });
            Linear {
                weight,
                block_bias,
                in_dim,
                quantized: true,
                device_bytes,
            }
        }
        ty => {
            let values = quant::dequantize(ty, &bytes)?;
            let device_bytes = values.len() * 4;
            Linear {
                weight: Tensor::<2>::from_data(TensorData::new(values, [out_dim, in_dim]), device),
                block_bias: None,
                in_dim,
                quantized: false,
                device_bytes,
            }
        }
    };
    Ok(linear)
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

fn rms_norm(x: Tensor<2>, weight: &Tensor<2>, eps: f32) -> Tensor<2> {
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

    /// Runs `tokens` at positions `cache.len()..` and returns the logits, still on the device,
    /// of the last token (`[1, vocab]`) or of every token (`[n, vocab]`) when `all_logits`.
    pub fn forward(
        &self,
        tokens: &[u32],
        cache: &mut DeviceCache,
        all_logits: bool,
    ) -> Result<Tensor<2>, ModelError> {
        let c = &self.config;
        let (d, hd) = (c.dim, c.head_dim);
        let n = tokens.len();
        let start = cache.len;
        if n == 0 || start + n > cache.capacity {
            return Err(ModelError::ContextFull {
                needed: start + n.max(1),
                capacity: cache.capacity,
            });
        }
        let mut rows = vec![0f32; n * d];
        for (t, &tok) in tokens.iter().enumerate() {
            if tok as usize >= c.vocab {
                return Err(ModelError::BadToken(tok));
            }
            self.embed.row(tok as usize, &mut rows[t * d..(t + 1) * d]);
        }
        let mut x = Tensor::<2>::from_data(TensorData::new(rows, [n, d]), &self.device);
        let (cos, sin) = self.rope_tables(start, n);
        let mask = (n > 1).then(|| self.causal_mask(start, n));
        let group = c.n_heads / c.n_kv_heads;
        let total = start + n;
        let scale = 1.0 / (hd as f32).sqrt();

        for (li, layer) in self.layers.iter().enumerate() {
            // Attention block.
            let h = rms_norm(x.clone(), &layer.attn_norm, c.rms_eps);
            let q = rope(
                layer.wq.forward(h.clone()).reshape([n, c.n_heads, hd]),
                &cos,
                &sin,
            );
            let k = rope(
                layer.wk.forward(h.clone()).reshape([n, c.n_kv_heads, hd]),
                &cos,
                &sin,
            );
            let v = layer.wv.forward(h).reshape([n, c.n_kv_heads, hd]);
            let keys = cache.keys[li]
                .clone()
                .slice_assign([0..c.n_kv_heads, start..total, 0..hd], k.swap_dims(0, 1));
            let values = cache.values[li]
                .clone()
                .slice_assign([0..c.n_kv_heads, start..total, 0..hd], v.swap_dims(0, 1));
            cache.keys[li] = keys.clone();
            cache.values[li] = values.clone();
            let keys = keys.slice([0..c.n_kv_heads, 0..total, 0..hd]);
            let values = values.slice([0..c.n_kv_heads, 0..total, 0..hd]);

            // Query heads h = kv·group + g share key/value head kv: fold the group into rows.
            let q = q.swap_dims(0, 1).reshape([c.n_kv_heads, group * n, hd]);
            let mut scores = q.matmul(keys.swap_dims(1, 2)).mul_scalar(scale);
            if let Some(mask) = &mask {
                scores = (scores.reshape([c.n_kv_heads, group, n, total])
                    + mask.clone().reshape([1, 1, n, total]))
                .reshape([c.n_kv_heads, group * n, total]);
            }
            let probs = activation::softmax(scores, 2);
            let attn = probs
                .matmul(values)
                .reshape([c.n_heads, n, hd])
                .swap_dims(0, 1)
                .reshape([n, d]);
            x = x + layer.wo.forward(attn);

            // MLP block: down(silu(gate(x)) · up(x)).
            let h = rms_norm(x.clone(), &layer.ffn_norm, c.rms_eps);
            let gated = activation::silu(layer.w_gate.forward(h.clone())) * layer.w_up.forward(h);
            x = x + layer.w_down.forward(gated);
        }
        cache.len = total;
        let x = if all_logits {
            x
        } else {
            x.slice([n - 1..n, 0..d])
        };
        Ok(self.head.forward(rms_norm(x, &self.norm, c.rms_eps)))
    }

    /// Runs `tokens` and reads back the logits of the last token (or every token).
    pub async fn forward_read(
        &self,
        tokens: &[u32],
        cache: &mut DeviceCache,
        all_logits: bool,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let logits = self.forward(tokens, cache, all_logits)?;
        let data = logits
            .into_data_async()
            .await
            .map_err(|e| ModelError::Device(format!("{e:?}")))?;
        rows_of(data, self.config.vocab)
    }

    /// [`Self::forward_read`] for native callers, blocking on the readback.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn forward_blocking(
        &self,
        tokens: &[u32],
        cache: &mut DeviceCache,
        all_logits: bool,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let logits = self.forward(tokens, cache, all_logits)?;
        let data = logits
            .try_into_data()
            .map_err(|e| ModelError::Device(format!("{e:?}")))?;
        rows_of(data, self.config.vocab)
    }

    /// cos/sin of the RoPE angles for positions `start..start+n`, shaped `[n, 1, hd/2, 1]` to
    /// broadcast over heads and the (even, odd) pair axis.
    fn rope_tables(&self, start: usize, n: usize) -> (Tensor<4>, Tensor<4>) {
        let c = &self.config;
        let half = c.head_dim / 2;
        let mut cos = Vec::with_capacity(n * half);
        let mut sin = Vec::with_capacity(n * half);
        for pos in start..start + n {
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
fn rope(x: Tensor<3>, cos: &Tensor<4>, sin: &Tensor<4>) -> Tensor<3> {
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
