//! The layers of [`crate::block`] (every [`crate::Arch`]; their tensors read by
//! [`crate::weights`], as for the CPU model), run on a burn [`Device`] chosen at run time:
//! WebGPU in the browser, Vulkan (Mesa lavapipe on a machine without a GPU) or burn's
//! pure-Rust `flex` CPU backend natively.
//!
//! Weights stay quantized on the device, as [`matrix`] maps GGUF's blocks onto burn's.
//!
//! A sliding-window layer (Gemma 3's local layers) sees only its last `window` positions, and
//! its cache holds only those plus one pass's rows, as the CPU model's ring does (`kv.rs`):
//! position `p` lives in slot `p % slots`, and a longer pass goes in parts.
//! The embedding table stays on the host: a prompt needs a handful of rows, not a 49k-row
//! gather on the device.
//!
//! Readback is asynchronous (`into_data_async`) because a browser cannot block on the GPU.

use std::ops::Range;

use burn::tensor::{Device, Tensor, TensorData, activation};

use crate::block;
#[cfg(not(target_arch = "wasm32"))]
use crate::causal_lm::BlockingLm;
use crate::causal_lm::{CausalLm, ModelCache};
use crate::chunk::Chunk;
use crate::config::{Config, ModelError};
use crate::gguf::{ByteSource, Gguf};
use crate::kernels;
use crate::kernels::matvec::MatvecKernel;
use crate::kv::{self, PASS_ROWS};
use crate::model::{GELU_CUBIC, GELU_SQRT_2_OVER_PI, Host, rope_angles};
use crate::qmatrix::QMatrix;
use crate::weights::{self, LayerWeights};

mod matrix;

use matrix::{Matrix, OnDevice};

type Layer = LayerWeights<Matrix, Tensor<2>>;

/// Keys and values of every layer for one sequence, preallocated for `capacity` positions
/// (`[kv_heads, slots, head_dim]` a layer: every position, or a sliding-window layer's ring).
pub struct DeviceCache {
    keys: Vec<Tensor<3>>,
    values: Vec<Tensor<3>>,
    len: usize,
    capacity: usize,
    /// The final hidden state `[1, dim]` of the last position whose logits a pass computed,
    /// left on the device until someone reads it (boxed: a cache is moved often, the state
    /// read once a request).
    state: Option<Box<Tensor<2>>>,
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
        if len < self.len {
            self.state = None;
        }
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

/// What the layers of one kind (global, or sliding-window) share in a pass: the RoPE angles
/// of their base for every row (`[rows, hd/2]`), and their window.
struct LayerKind {
    cos: Tensor<2>,
    sin: Tensor<2>,
    window: Option<usize>,
}

/// What every layer of one pass shares: where each chunk's rows sit, and each kind of layer's
/// angles and window.
struct Pass {
    spans: Vec<Span>,
    rows: usize,
    global: LayerKind,
    /// The sliding-window layers', where the model has them.
    local: Option<LayerKind>,
}

impl Pass {
    /// What layer `li` of the model `c` shares with the layers of its kind.
    fn kind(&self, c: &Config, li: usize) -> &LayerKind {
        match (c.window(li), &self.local) {
            (Some(_), Some(local)) => local,
            _ => &self.global,
        }
    }

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

/// A model of any [`crate::Arch`] whose weights live, quantized, on a burn device.
pub struct DeviceModel {
    pub config: Config,
    device: Device,
    embed: QMatrix,
    layers: Vec<Layer>,
    norm: Tensor<2>,
    head: Matrix,
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
    /// Uploads the weights of a GGUF of one of the [`crate::Arch`]s to `device`; caches it
    /// creates hold at most `max_context` positions.
    pub fn load<S: ByteSource>(
        g: &Gguf<S>,
        max_context: usize,
        device: &Device,
    ) -> Result<Self, ModelError> {
        let c = Config::from_gguf(g)?;
        let store = OnDevice(device);
        let layers = (0..c.n_layers)
            .map(|i| weights::load_layer(&store, g, &c, i))
            .collect::<Result<_, _>>()?;
        let embed = weights::matrix(&Host, g, "token_embd.weight", c.vocab, c.dim)?;
        // A tied head is the embedding matrix, uploaded once for the product.
        let head_name = if g.tensor("output.weight").is_some() {
            "output.weight"
        } else {
            "token_embd.weight"
        };
        let head = weights::matrix(&store, g, head_name, c.vocab, c.dim)?;
        let norm = weights::vector(&store, g, "output_norm.weight", c.dim)?;
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

    /// Bytes of weights held on the device (quantized values, scales, block offsets, norms,
    /// biases).
    pub fn weight_bytes(&self) -> usize {
        let f32s = |v: &Tensor<2>| v.shape().num_elements() * 4;
        let layers: usize = self
            .layers
            .iter()
            .map(|l| {
                l.matrices().iter().map(|m| m.device_bytes()).sum::<usize>()
                    + l.vectors().map(f32s).sum::<usize>()
            })
            .sum();
        layers + f32s(&self.norm) + self.head.device_bytes()
    }

    /// Bytes an f32 KV cache of `capacity` positions takes on the device.
    pub fn cache_bytes(&self, capacity: usize) -> usize {
        let slots: usize = (0..self.config.n_layers)
            .map(|li| self.slots(li, capacity))
            .sum();
        2 * slots * self.config.kv_dim() * 4
    }

    /// Slots layer `li` of a cache for `capacity` positions holds: a sliding-window layer's
    /// ring of its window plus one pass's rows, every position on a global layer.
    fn slots(&self, li: usize, capacity: usize) -> usize {
        capacity.min(kv::ring(self.config.window(li)))
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
        let zeros = || -> Vec<Tensor<3>> {
            (0..c.n_layers)
                .map(|li| {
                    let shape = [c.n_kv_heads, self.slots(li, capacity), c.head_dim];
                    Tensor::<3>::zeros(shape, &self.device)
                })
                .collect()
        };
        DeviceCache {
            keys: zeros(),
            values: zeros(),
            len: 0,
            capacity,
            state: None,
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
        // A layer that can still grow has not wrapped: position p is in slot p.
        let grow = |li: usize, old: Tensor<3>| {
            let slots = self.slots(li, capacity);
            if old.dims()[1] == slots {
                return old;
            }
            let fresh = Tensor::<3>::zeros([kv, slots, hd], &self.device);
            if len == 0 {
                fresh
            } else {
                fresh.slice_assign([0..kv, 0..len, 0..hd], old.slice([0..kv, 0..len, 0..hd]))
            }
        };
        let grown = |layers: Vec<Tensor<3>>| {
            layers
                .into_iter()
                .enumerate()
                .map(|(li, t)| grow(li, t))
                .collect()
        };
        cache.keys = grown(std::mem::take(&mut cache.keys));
        cache.values = grown(std::mem::take(&mut cache.values));
        cache.capacity = capacity;
    }

    /// Runs `tokens` at positions `cache.len()..` and returns the logits, still on the device,
    /// of the last token (`[1, vocab]`) or of every token (`[n, vocab]`) when `all_logits`.
    fn logits(
        &self,
        tokens: &[u32],
        cache: &mut DeviceCache,
        all_logits: bool,
    ) -> Result<Tensor<2>, ModelError> {
        let (n, d) = (tokens.len(), self.config.dim);
        let x = self.forward_hidden(&[tokens], &mut [&mut *cache])?;
        let x = if all_logits {
            x
        } else {
            x.slice([n - 1..n, 0..d])
        };
        let states = self.final_norm(x);
        let rows = states.dims()[0];
        cache.state = Some(Box::new(states.clone().slice([rows - 1..rows, 0..d])));
        Ok(self.head.forward(states, self.matvec()))
    }

    /// Runs several sequences at once (continuous batching): `chunks[i]` at positions
    /// `caches[i].len()..`, every product over all their rows together. Returns, still on the
    /// device, the logits of the last token of each chunk whose `want_logits` is set, in order
    /// (`None` when none is).
    fn chunk_logits(
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
        let states = self.final_norm(rows);
        let wanting = caches.iter_mut().zip(want_logits).filter(|(_, w)| **w);
        for (row, (cache, _)) in wanting.enumerate() {
            cache.state = Some(Box::new(states.clone().slice([row..row + 1, 0..d])));
        }
        Ok(Some(self.head.forward(states, self.matvec())))
    }

    /// The final hidden state (after the output norm) at the last position of `cache` whose
    /// logits a pass computed, read back: what a probe of the model's own state reads.
    async fn read_state(&self, cache: &DeviceCache) -> Result<Option<Vec<f32>>, ModelError> {
        let Some(state) = cache.state.as_deref() else {
            return Ok(None);
        };
        Ok(self
            .read_rows_of(state.clone(), self.config.dim)
            .await?
            .pop())
    }

    /// [`Self::chunk_logits`] with the logits read back: one entry per chunk, the logits
    /// where they were wanted.
    async fn forward_chunks_read(
        &self,
        chunks: &[&[u32]],
        caches: &mut [&mut DeviceCache],
        want_logits: &[bool],
    ) -> Result<Vec<Option<Vec<f32>>>, ModelError> {
        let rows = match self.chunk_logits(chunks, caches, want_logits)? {
            Some(logits) => self.read_rows(logits).await?,
            None => Vec::new(),
        };
        let mut rows = rows.into_iter();
        Ok(want_logits
            .iter()
            .map(|&want| if want { rows.next() } else { None })
            .collect())
    }

    /// Reads logits `[n, vocab]` back as rows: awaited in a browser, which cannot block;
    /// blocking elsewhere, so a native pass never waits (the model is a `BlockingLm` there).
    async fn read_rows(&self, logits: Tensor<2>) -> Result<Vec<Vec<f32>>, ModelError> {
        self.read_rows_of(logits, self.config.vocab).await
    }

    /// Reads `[n, width]` back as rows, as [`Self::read_rows`] does.
    async fn read_rows_of(&self, t: Tensor<2>, width: usize) -> Result<Vec<Vec<f32>>, ModelError> {
        #[cfg(target_arch = "wasm32")]
        let data = t.into_data_async().await;
        #[cfg(not(target_arch = "wasm32"))]
        let data = t.try_into_data();
        rows_of(
            data.map_err(|e| ModelError::Device(format!("{e:?}")))?,
            width,
        )
    }

    /// The output norm over final hidden rows: what the head reads.
    fn final_norm(&self, x: Tensor<2>) -> Tensor<2> {
        rms_norm(x, &self.norm, self.config.rms_eps, self.own_kernels)
    }

    /// The transformer over every chunk's tokens: the final hidden rows `[Σ n_i, dim]`, chunk
    /// after chunk. Products, norms and the MLP see all rows at once; RoPE positions and
    /// attention are each sequence's own.
    fn forward_hidden(
        &self,
        chunks: &[&[u32]],
        caches: &mut [&mut DeviceCache],
    ) -> Result<Tensor<2>, ModelError> {
        let part = match self.config.sliding_window {
            Some(_) => PASS_ROWS,
            None => usize::MAX,
        };
        if chunks.iter().all(|chunk| chunk.len() <= part) {
            return self.forward_pass(chunks, caches);
        }
        // A sliding-window layer's ring holds one pass's rows beyond its window, so a longer
        // chunk goes in parts of `PASS_ROWS`, every chunk's next part in one pass; each row's
        // values are the same either way. Every chunk is checked before the first part.
        self.spans(chunks, caches)?;
        let mut parts: Vec<Vec<Tensor<2>>> = vec![Vec::new(); chunks.len()];
        let longest = chunks.iter().map(|chunk| chunk.len()).max().unwrap_or(0);
        for from in (0..longest).step_by(part) {
            let live: Vec<usize> = (0..chunks.len())
                .filter(|&i| from < chunks[i].len())
                .collect();
            let pieces: Vec<&[u32]> = live
                .iter()
                .map(|&i| &chunks[i][from..(from + part).min(chunks[i].len())])
                .collect();
            let mut taken: Vec<&mut DeviceCache> = caches
                .iter_mut()
                .enumerate()
                .filter(|(i, _)| live.contains(i))
                .map(|(_, cache)| &mut **cache)
                .collect();
            let x = self.forward_pass(&pieces, &mut taken)?;
            let d = self.config.dim;
            let mut row = 0;
            for (&i, piece) in live.iter().zip(&pieces) {
                parts[i].push(x.clone().slice([row..row + piece.len(), 0..d]));
                row += piece.len();
            }
        }
        Ok(Tensor::cat(parts.into_iter().flatten().collect(), 0))
    }

    /// [`Self::forward_hidden`] in one pass.
    fn forward_pass(
        &self,
        chunks: &[&[u32]],
        caches: &mut [&mut DeviceCache],
    ) -> Result<Tensor<2>, ModelError> {
        let pass = self.pass(chunks, caches)?;
        let x = self.embed_rows(chunks, pass.rows)?;
        // Each layer's cache tensors are moved out and back so that burn holds the only handle
        // and writes the new positions in place; a clone would make it copy the whole cache.
        let taken: Vec<TakenLayers> = caches
            .iter_mut()
            .map(|cache| {
                (
                    std::mem::take(&mut cache.keys).into_iter(),
                    std::mem::take(&mut cache.values).into_iter(),
                )
            })
            .collect();
        let mut ops = DevicePass {
            model: self,
            pass,
            taken,
            caches: &mut *caches,
        };
        let x = block::layers(&mut ops, &self.config, &self.layers, x)?;
        let spans = ops.pass.spans;
        for (cache, span) in caches.iter_mut().zip(&spans) {
            cache.len += span.n;
        }
        Ok(x)
    }

    /// Checks each chunk against its cache, and lays the chunks' rows end to end.
    fn pass(&self, chunks: &[&[u32]], caches: &[&mut DeviceCache]) -> Result<Pass, ModelError> {
        let c = &self.config;
        let spans = self.spans(chunks, caches)?;
        let rows = spans.iter().map(|s| s.n).sum();
        let global = self.layer_kind(&spans, c.rope_theta, None);
        let local = c
            .sliding_window
            .map(|w| self.layer_kind(&spans, c.rope_theta_local, Some(w)));
        Ok(Pass {
            spans,
            rows,
            global,
            local,
        })
    }

    /// Where each chunk's rows go, once each is checked against its cache.
    fn spans(
        &self,
        chunks: &[&[u32]],
        caches: &[&mut DeviceCache],
    ) -> Result<Vec<Span>, ModelError> {
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
        Ok(spans)
    }

    /// The angles of RoPE base `theta` for every row of `spans`, under `window`.
    fn layer_kind(&self, spans: &[Span], theta: f32, window: Option<usize>) -> LayerKind {
        let half = self.config.head_dim / 2;
        let rows: usize = spans.iter().map(|s| s.n).sum();
        let (mut cos, mut sin) = (Vec::with_capacity(rows * half), Vec::new());
        for pos in spans.iter().flat_map(|s| s.start..s.start + s.n) {
            for angle in rope_angles(theta, self.config.head_dim, pos) {
                cos.push(angle.cos());
                sin.push(angle.sin());
            }
        }
        let t = |v| Tensor::<2>::from_data(TensorData::new(v, [rows, half]), &self.device);
        LayerKind {
            cos: t(cos),
            sin: t(sin),
            window,
        }
    }

    /// `[n, keys.len()]` for `span` against the key positions `keys`: 0 where query `i` (at
    /// `start+i`) may see a key, −∞ after it or, under a window, before its last `window`
    /// positions. `None` when every query sees every key.
    fn mask(&self, span: Span, window: Option<usize>, keys: Range<usize>) -> Option<Tensor<2>> {
        let (start, n, len) = (span.start, span.n, keys.len());
        let window = window.unwrap_or(start + n);
        if n == 1 && len <= window {
            return None;
        }
        let mut mask = vec![0f32; n * len];
        for (i, row) in mask.chunks_mut(len).enumerate() {
            let pos = start + i;
            let first = (pos + 1).saturating_sub(window).saturating_sub(keys.start);
            row[..first].fill(f32::NEG_INFINITY);
            row[pos + 1 - keys.start..].fill(f32::NEG_INFINITY);
        }
        Some(Tensor::<2>::from_data(
            TensorData::new(mask, [n, len]),
            &self.device,
        ))
    }

    /// The chunks' token embeddings, end to end: `[rows, dim]`.
    fn embed_rows(&self, chunks: &[&[u32]], rows: usize) -> Result<Tensor<2>, ModelError> {
        let d = self.config.dim;
        let mut values = vec![0f32; rows * d];
        block::embed(&self.embed, &self.config, &chunks.concat(), &mut values)?;
        Ok(Tensor::<2>::from_data(
            TensorData::new(values, [rows, d]),
            &self.device,
        ))
    }

    /// RMSNorm of each row of `x` by `weight`.
    fn norm(&self, x: Tensor<2>, weight: &Tensor<2>) -> Tensor<2> {
        rms_norm(x, weight, self.config.rms_eps, self.own_kernels)
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
        let (kv, hd) = (c.n_kv_heads, c.head_dim);
        let (k, v) = (pass.rows_of(k, span), pass.rows_of(v, span));
        // The span's slots: one run, or two where its positions wrap around a ring.
        let [near, far] = kv::slot_runs(old_keys.dims()[1], span.start..span.start + span.n);
        let runs = [(0..near.len(), near.clone()), (near.len()..span.n, far)];
        let (mut keys, mut values) = (old_keys, old_values);
        for (rows, at) in runs.into_iter().filter(|(rows, _)| !rows.is_empty()) {
            let at = [0..kv, at, 0..hd];
            let of = |t: &Tensor<3>| {
                t.clone()
                    .slice([rows.clone(), 0..kv, 0..hd])
                    .swap_dims(0, 1)
            };
            keys = keys.slice_assign(at.clone(), of(&k));
            values = values.slice_assign(at, of(&v));
        }
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
        kind: &LayerKind,
        span: Span,
    ) -> Tensor<2> {
        let scale = self.config.score_scale();
        let fused = self
            .own_kernels
            .then(|| {
                kernels::attention::causal_attention_rows(
                    &q,
                    &keys,
                    &values,
                    span.start,
                    scale,
                    kind.window,
                )
            })
            .flatten();
        match fused {
            Some(a) => a,
            None => self.attention_burn(q, keys, values, kind.window, span),
        }
    }

    /// Attention composed from burn's operations (the `flex` backend, contexts longer than the
    /// fused kernel holds): `[n, heads·hd]` for queries `q [n, heads, hd]` of `span`, under
    /// `window`. The mask is built here, so a pass our kernel serves uploads none.
    fn attention_burn(
        &self,
        q: Tensor<3>,
        keys: Tensor<3>,
        values: Tensor<3>,
        window: Option<usize>,
        span: Span,
    ) -> Tensor<2> {
        let c = &self.config;
        let (n, hd) = (span.n, c.head_dim);
        let total = span.start + n;
        let group = c.n_heads / c.n_kv_heads;
        let scale = c.score_scale();
        let (keys, held) = in_order(keys, total);
        let (values, _) = in_order(values, total);
        let total = held.len();

        // Query heads h = kv·group + g share key/value head kv: fold the group into rows.
        let q = q.swap_dims(0, 1).reshape([c.n_kv_heads, group * n, hd]);
        let mut scores = q.matmul(keys.swap_dims(1, 2)).mul_scalar(scale);
        if let Some(mask) = self.mask(span, window, held) {
            scores = (scores.reshape([c.n_kv_heads, group, n, total])
                + mask.clone().reshape([1, 1, n, total]))
            .reshape([c.n_kv_heads, group * n, total]);
        }
        let probs = activation::softmax(scores, 2);
        probs
            .matmul(values)
            .reshape([c.n_heads, n, hd])
            .swap_dims(0, 1)
            .reshape([n, c.q_dim()])
    }

    /// Runs `tokens` and reads back the logits of the last token (or every token).
    async fn forward_read(
        &self,
        tokens: &[u32],
        cache: &mut DeviceCache,
        all_logits: bool,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let logits = self.logits(tokens, cache, all_logits)?;
        self.read_rows(logits).await
    }
}

/// One pass of the device model over its chunks' rows, for [`block::layers`]: where each
/// chunk's rows sit, each kind of layer's angles, and the caches.
struct DevicePass<'p, 'c> {
    model: &'p DeviceModel,
    pass: Pass,
    /// Each cache's per-layer tensors, moved out for the pass (see `forward_pass`).
    taken: Vec<TakenLayers>,
    caches: &'p mut [&'c mut DeviceCache],
}

impl DevicePass<'_, '_> {
    /// `x [rows, heads·hd]` as `[rows, heads, hd]`.
    fn heads(&self, x: Tensor<2>) -> Tensor<3> {
        let ([rows, width], hd) = (x.dims(), self.model.config.head_dim);
        x.reshape([rows, width / hd, hd])
    }
}

impl block::Ops for DevicePass<'_, '_> {
    type Matrix = Matrix;
    type Vector = Tensor<2>;
    type Rows = Tensor<2>;

    fn norm(&mut self, x: &Tensor<2>, weight: &Tensor<2>) -> Tensor<2> {
        self.model.norm(x.clone(), weight)
    }

    fn head_norm(&mut self, x: Tensor<2>, weight: &Tensor<2>) -> Tensor<2> {
        let ([rows, width], hd) = (x.dims(), self.model.config.head_dim);
        let normed = self.model.norm(x.reshape([rows * width / hd, hd]), weight);
        normed.reshape([rows, width])
    }

    fn products<const N: usize>(&mut self, x: Tensor<2>, w: [&Matrix; N]) -> [Tensor<2>; N] {
        let matvec = self.model.matvec();
        w.map(|m| m.forward(x.clone(), matvec))
    }

    fn add_bias(&mut self, x: Tensor<2>, bias: &Tensor<2>) -> Tensor<2> {
        x + bias.clone()
    }

    fn rope(&mut self, x: Tensor<2>, li: usize) -> Tensor<2> {
        let (c, dims) = (&self.model.config, x.dims());
        let kind = self.pass.kind(c, li);
        let halves = c.arch.rope_halves();
        rope(self.heads(x), kind, halves, self.model.own_kernels).reshape(dims)
    }

    fn scale(&mut self, x: Tensor<2>, by: f32) -> Tensor<2> {
        x.mul_scalar(by)
    }

    fn attend(
        &mut self,
        li: usize,
        q: Tensor<2>,
        k: Tensor<2>,
        v: Tensor<2>,
    ) -> Result<Tensor<2>, ModelError> {
        let (q, k, v) = (self.heads(q), self.heads(k), self.heads(v));
        let (model, pass) = (self.model, &self.pass);
        let kind = pass.kind(&model.config, li);
        let mut attn = Vec::with_capacity(pass.spans.len());
        for (i, &span) in pass.spans.iter().enumerate() {
            let taken = &mut self.taken[i];
            let (keys, values) = model.append(pass, span, (&k, &v), taken, self.caches[i])?;
            let q = pass.rows_of(&q, span);
            attn.push(model.span_attention(q, keys, values, kind, span));
        }
        Ok(match attn.len() {
            1 => attn.swap_remove(0),
            _ => Tensor::cat(attn, 0),
        })
    }

    fn gate(&mut self, gate: Tensor<2>, up: Tensor<2>, gelu: bool) -> Tensor<2> {
        match self
            .model
            .own_kernels
            .then(|| kernels::elementwise::gated(&gate, &up, gelu))
            .flatten()
        {
            Some(gated) => gated,
            None if gelu => gelu_tanh(gate) * up,
            None => activation::silu(gate) * up,
        }
    }

    fn add(&mut self, x: Tensor<2>, y: Tensor<2>) -> Tensor<2> {
        x + y
    }

    /// Every row goes on: the pass picks its outputs from the final rows (a pass in parts
    /// would otherwise have to know which part holds each).
    fn keep_outputs(&mut self, x: Tensor<2>) -> Tensor<2> {
        x
    }
}

// What generation needs of the device model (`causal_lm`): its passes read back
// asynchronously in a browser, and block elsewhere.

impl ModelCache for DeviceCache {
    crate::causal_lm::cache_sizes!();

    // A GPU prefills the template's few dozen tokens in about one step: not worth a copy
    // of every layer's cache.
    fn prefix(&self, _n: usize) -> Option<Self> {
        None
    }
}

impl CausalLm for DeviceModel {
    type Cache = DeviceCache;

    fn new_cache(&self, positions: usize) -> DeviceCache {
        DeviceModel::new_cache(self, positions)
    }

    fn reserve(&self, cache: &mut DeviceCache, positions: usize) {
        DeviceModel::reserve(self, cache, positions);
    }

    async fn forward_chunks(
        &self,
        chunks: &[Chunk<'_>],
        caches: &mut [&mut DeviceCache],
    ) -> Result<Vec<Option<Vec<f32>>>, ModelError> {
        // A device's sums do not follow llama.cpp's batches, so a chunk's pass changes nothing.
        let tokens: Vec<&[u32]> = chunks.iter().map(|c| c.tokens).collect();
        let want: Vec<bool> = chunks.iter().map(|c| c.want_logits).collect();
        self.forward_chunks_read(&tokens, caches, &want).await
    }

    async fn forward_last(
        &self,
        tokens: &[u32],
        cache: &mut DeviceCache,
    ) -> Result<Vec<f32>, ModelError> {
        Ok(self
            .forward_read(tokens, cache, false)
            .await?
            .pop()
            .unwrap_or_default())
    }

    async fn forward_all(
        &self,
        tokens: &[u32],
        cache: &mut DeviceCache,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        self.forward_read(tokens, cache, true).await
    }

    async fn last_state(&self, cache: &DeviceCache) -> Result<Option<Vec<f32>>, ModelError> {
        self.read_state(cache).await
    }
}

// Outside the browser the readback blocks, so the passes never wait (see
// `DeviceModel::read_logits`).
#[cfg(not(target_arch = "wasm32"))]
impl BlockingLm for DeviceModel {}

/// The positions up to `total` that a layer's cache `[kv_heads, slots, hd]` holds, in order
/// of position, and which positions they are: the first `total` slots, or the ring's one or
/// two runs of slots, oldest first.
fn in_order(cache: Tensor<3>, total: usize) -> (Tensor<3>, Range<usize>) {
    let [kv, slots, hd] = cache.dims();
    let held = total.saturating_sub(slots)..total;
    let [near, far] = kv::slot_runs(slots, held.clone());
    let run = |slots: Range<usize>| cache.clone().slice([0..kv, slots, 0..hd]);
    let turned = match far.is_empty() {
        true => run(near),
        false => Tensor::cat(vec![run(near), run(far)], 1),
    };
    (turned, held)
}

/// Rotates each head of `x [n, heads, hd]` by its row's angles in `kind`: adjacent pairs
/// (GGUF's llama layout permutes Q/K rows for this "normal" mode), or a head's two halves
/// (GPT-NeoX's mode) when `halves`.
fn rope(x: Tensor<3>, kind: &LayerKind, halves: bool, own_kernels: bool) -> Tensor<3> {
    let (cos, sin) = (&kind.cos, &kind.sin);
    if let Some(y) = own_kernels
        .then(|| kernels::elementwise::rope(&x, cos, sin, halves))
        .flatten()
    {
        return y;
    }
    let [n, heads, hd] = x.dims();
    let half = hd / 2;
    // The pair's two members lie along `axis`: [.., 2, half] for halves, [.., half, 2] else.
    let (pairs, angles, axis) = if halves {
        ([n, heads, 2, half], [n, 1, 1, half], 2)
    } else {
        ([n, heads, half, 2], [n, 1, half, 1], 3)
    };
    let (cos, sin) = (cos.clone().reshape(angles), sin.clone().reshape(angles));
    let pairs = x.reshape(pairs);
    let a = pairs.clone().narrow(axis, 0, 1);
    let b = pairs.narrow(axis, 1, 1);
    let rotated_a = a.clone() * cos.clone() - b.clone() * sin.clone();
    let rotated_b = a * sin + b * cos;
    Tensor::cat(vec![rotated_a, rotated_b], axis).reshape([n, heads, hd])
}

/// GELU's tanh approximation from burn's operations, as [`crate::model`] writes it:
/// `x / (1 + e^(−2u))`.
fn gelu_tanh(x: Tensor<2>) -> Tensor<2> {
    let u = (x.clone() * x.clone())
        .mul_scalar(GELU_CUBIC)
        .add_scalar(1.0)
        .mul(x.clone())
        .mul_scalar(GELU_SQRT_2_OVER_PI);
    x / u.mul_scalar(-2.0).exp().add_scalar(1.0)
}

fn rows_of(data: TensorData, vocab: usize) -> Result<Vec<Vec<f32>>, ModelError> {
    let values = data
        .try_into_vec::<f32>()
        .map_err(|e| ModelError::Device(format!("{e:?}")))?;
    Ok(values.chunks_exact(vocab).map(<[f32]>::to_vec).collect())
}
