//! A Llama-family transformer: config from GGUF metadata, quantized weights, forward pass.
//!
//! Reads top to bottom like the paper's diagram: embedding → N × (RMSNorm → attention with
//! RoPE and grouped-query heads → residual → RMSNorm → SwiGLU MLP → residual) → RMSNorm →
//! output head (tied to the embedding when the file has no `output.weight`).

use crate::gguf::{ByteSource, Gguf, GgufError, TensorInfo};
use crate::kv::KvCache;
use crate::qmatrix::{QActs, QMatrix, matmul_many};
use crate::quant::{self, QuantError};

/// Why a model could not be loaded or run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Quant(#[from] QuantError),
    #[error("architecture `{0}` is not supported (supported: llama)")]
    UnsupportedArch(String),
    #[error("tensor `{name}` has shape {got:?}, expected {want:?}")]
    Shape {
        name: String,
        got: Vec<u64>,
        want: Vec<u64>,
    },
    #[error("invalid config: {0}")]
    Config(String),
    #[error("context full: {needed} positions needed, cache holds {capacity}")]
    ContextFull { needed: usize, capacity: usize },
    #[error("token id {0} is outside the vocabulary")]
    BadToken(u32),
    #[error("device error: {0}")]
    Device(String),
}

/// Hyper-parameters read from the GGUF metadata.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub n_layers: usize,
    pub dim: usize,
    pub ffn_dim: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub vocab: usize,
    pub rope_theta: f32,
    pub rms_eps: f32,
    pub context_length: usize,
}

impl Config {
    /// Reads the config of a `llama`-architecture GGUF.
    pub fn from_gguf<S: ByteSource>(g: &Gguf<S>) -> Result<Self, ModelError> {
        let arch = g.get_str("general.architecture")?;
        if arch != "llama" {
            return Err(ModelError::UnsupportedArch(arch.into()));
        }
        let key = |k: &str| format!("{arch}.{k}");
        let u = |k: &str| -> Result<usize, ModelError> {
            usize::try_from(g.get_u64(&key(k))?).map_err(|_| ModelError::Config(k.into()))
        };
        let n_heads = u("attention.head_count")?;
        let dim = u("embedding_length")?;
        let n_kv_heads = u("attention.head_count_kv").unwrap_or(n_heads);
        let vocab = g
            .tensor("token_embd.weight")
            .and_then(|t| t.shape.get(1))
            .copied()
            .ok_or_else(|| GgufError::MissingTensor("token_embd.weight".into()))?;
        let cfg = Config {
            n_layers: u("block_count")?,
            dim,
            ffn_dim: u("feed_forward_length")?,
            n_heads,
            n_kv_heads,
            head_dim: dim.checked_div(n_heads).unwrap_or(0),
            vocab: vocab as usize,
            rope_theta: g.get_f64(&key("rope.freq_base")).unwrap_or(10_000.0) as f32,
            rms_eps: g
                .get_f64(&key("attention.layer_norm_rms_epsilon"))
                .unwrap_or(1e-5) as f32,
            context_length: u("context_length").unwrap_or(2048),
        };
        let bad = |why: &str| Err(ModelError::Config(why.into()));
        if cfg.n_layers == 0 || cfg.n_layers > 1024 {
            return bad("block_count must be 1..=1024");
        }
        if n_heads == 0 || n_kv_heads == 0 || n_heads % n_kv_heads != 0 || dim % n_heads != 0 {
            return bad("head counts must divide the embedding length and each other");
        }
        if !cfg.head_dim.is_multiple_of(2) || dim % 32 != 0 || !cfg.ffn_dim.is_multiple_of(32) {
            return bad("dimensions must be multiples of 32 with an even head size");
        }
        Ok(cfg)
    }

    /// Width of the key/value projections.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
}

struct Layer {
    attn_norm: Vec<f32>,
    wq: QMatrix,
    wk: QMatrix,
    wv: QMatrix,
    wo: QMatrix,
    ffn_norm: Vec<f32>,
    w_gate: QMatrix,
    w_up: QMatrix,
    w_down: QMatrix,
}

/// The loaded model: weights stay in their quantized block format.
pub struct Model {
    pub config: Config,
    embed: QMatrix,
    layers: Vec<Layer>,
    norm: Vec<f32>,
    head: Option<QMatrix>,
    rope_cos: Vec<f32>,
    rope_sin: Vec<f32>,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("config", &self.config)
            .field("weight_bytes", &self.weight_bytes())
            .finish()
    }
}

fn check_shape(t: &TensorInfo, want: &[u64]) -> Result<(), ModelError> {
    if t.shape != want {
        return Err(ModelError::Shape {
            name: t.name.clone(),
            got: t.shape.clone(),
            want: want.to_vec(),
        });
    }
    Ok(())
}

fn matrix<S: ByteSource>(
    g: &Gguf<S>,
    name: &str,
    rows: usize,
    cols: usize,
) -> Result<QMatrix, ModelError> {
    let t = g
        .tensor(name)
        .ok_or_else(|| GgufError::MissingTensor(name.into()))?;
    // GGUF lists the input (column) dimension first.
    check_shape(t, &[cols as u64, rows as u64])?;
    Ok(QMatrix::from_gguf(
        t.ty,
        &g.tensor_bytes(name)?,
        rows,
        cols,
    )?)
}

fn vector<S: ByteSource>(g: &Gguf<S>, name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
    let t = g
        .tensor(name)
        .ok_or_else(|| GgufError::MissingTensor(name.into()))?;
    check_shape(t, &[len as u64])?;
    Ok(quant::dequantize(t.ty, &g.tensor_bytes(name)?)?)
}

impl Model {
    /// Loads the weights of a Llama-family GGUF; RoPE tables cover `max_context` positions.
    pub fn load<S: ByteSource>(g: &Gguf<S>, max_context: usize) -> Result<Self, ModelError> {
        let c = Config::from_gguf(g)?;
        let (d, kv, f) = (c.dim, c.kv_dim(), c.ffn_dim);
        let mut layers = Vec::with_capacity(c.n_layers);
        for i in 0..c.n_layers {
            let n = |s: &str| format!("blk.{i}.{s}.weight");
            layers.push(Layer {
                attn_norm: vector(g, &n("attn_norm"), d)?,
                wq: matrix(g, &n("attn_q"), d, d)?,
                wk: matrix(g, &n("attn_k"), kv, d)?,
                wv: matrix(g, &n("attn_v"), kv, d)?,
                wo: matrix(g, &n("attn_output"), d, d)?,
                ffn_norm: vector(g, &n("ffn_norm"), d)?,
                w_gate: matrix(g, &n("ffn_gate"), f, d)?,
                w_up: matrix(g, &n("ffn_up"), f, d)?,
                w_down: matrix(g, &n("ffn_down"), d, f)?,
            });
        }
        let embed = matrix(g, "token_embd.weight", c.vocab, d)?;
        let head = match g.tensor("output.weight") {
            Some(_) => Some(matrix(g, "output.weight", c.vocab, d)?),
            None => None,
        };
        let norm = vector(g, "output_norm.weight", d)?;
        // RoPE tables: angle(pos, i) = pos · θ^(−2i/head_dim), for adjacent pairs (GGUF's
        // llama layout has Q/K rows permuted for this "normal" mode).
        let half = c.head_dim / 2;
        let mut rope_cos = Vec::with_capacity(max_context * half);
        let mut rope_sin = Vec::with_capacity(max_context * half);
        for pos in 0..max_context {
            for i in 0..half {
                let freq = c.rope_theta.powf(-2.0 * i as f32 / c.head_dim as f32);
                let a = pos as f32 * freq;
                rope_cos.push(a.cos());
                rope_sin.push(a.sin());
            }
        }
        Ok(Self {
            config: c,
            embed,
            layers,
            norm,
            head,
            rope_cos,
            rope_sin,
        })
    }

    /// Bytes of weights held (quantized).
    pub fn weight_bytes(&self) -> usize {
        let l: usize = self
            .layers
            .iter()
            .map(|l| {
                [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down]
                    .iter()
                    .map(|m| m.bytes())
                    .sum::<usize>()
                    + 4 * (l.attn_norm.len() + l.ffn_norm.len())
            })
            .sum();
        l + self.embed.bytes() + self.head.as_ref().map_or(0, QMatrix::bytes)
    }

    /// Largest context the RoPE tables cover.
    pub fn max_context(&self) -> usize {
        self.rope_cos.len() / (self.config.head_dim / 2).max(1)
    }

    /// A KV cache for `capacity` positions.
    pub fn new_cache(&self, capacity: usize) -> KvCache {
        KvCache::new(
            self.config.n_layers,
            capacity.min(self.max_context()),
            self.config.kv_dim(),
        )
    }

    /// Runs `tokens` at positions `cache.len()..`, appending to the cache. Returns the logits of
    /// the last token, or of every token when `all_logits` (speculative verification needs them).
    pub fn forward(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        all_logits: bool,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let start = cache.len();
        let n = tokens.len();
        if n == 0 {
            return Ok(Vec::new());
        }
        if start + n > cache.capacity() {
            return Err(ModelError::ContextFull {
                needed: start + n,
                capacity: cache.capacity(),
            });
        }
        let rows: Vec<(usize, usize)> = (0..n).map(|t| (0, start + t)).collect();
        let wanted: Vec<usize> = if all_logits {
            (0..n).collect()
        } else {
            vec![n - 1]
        };
        let logits = self.forward_rows(tokens, &rows, &mut [cache], &wanted)?;
        Ok(logits)
    }

    /// One decode step for several sequences at once: token `i` goes to `caches[i]` at its next
    /// position. The weights are read once for the whole batch, which is what makes batching
    /// pay. Returns each sequence's logits.
    pub fn forward_batch(
        &self,
        tokens: &[u32],
        caches: &mut [&mut KvCache],
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        debug_assert_eq!(tokens.len(), caches.len());
        for c in caches.iter() {
            if c.len() + 1 > c.capacity() {
                return Err(ModelError::ContextFull {
                    needed: c.len() + 1,
                    capacity: c.capacity(),
                });
            }
        }
        let rows: Vec<(usize, usize)> = caches
            .iter()
            .enumerate()
            .map(|(i, c)| (i, c.len()))
            .collect();
        let wanted: Vec<usize> = (0..tokens.len()).collect();
        self.forward_rows(tokens, &rows, caches, &wanted)
    }

    /// One forward pass over a chunk of tokens for each of several sequences: `chunks[i]`
    /// goes to `caches[i]` at its next positions (a prompt being prefilled, or one token
    /// being decoded). The weights are read once for every row of every chunk. Returns the
    /// logits of each chunk's last token where `want_logits[i]`.
    pub fn forward_chunks(
        &self,
        chunks: &[&[u32]],
        caches: &mut [&mut KvCache],
        want_logits: &[bool],
    ) -> Result<Vec<Option<Vec<f32>>>, ModelError> {
        debug_assert_eq!(chunks.len(), caches.len());
        debug_assert_eq!(chunks.len(), want_logits.len());
        let mut tokens = Vec::new();
        let mut rows = Vec::new();
        let mut wanted = Vec::new();
        for (i, (chunk, cache)) in chunks.iter().zip(caches.iter()).enumerate() {
            if cache.len() + chunk.len() > cache.capacity() {
                return Err(ModelError::ContextFull {
                    needed: cache.len() + chunk.len(),
                    capacity: cache.capacity(),
                });
            }
            tokens.extend_from_slice(chunk);
            rows.extend((0..chunk.len()).map(|j| (i, cache.len() + j)));
            if want_logits[i] && !chunk.is_empty() {
                wanted.push(rows.len() - 1);
            }
        }
        if tokens.is_empty() {
            return Ok(vec![None; chunks.len()]);
        }
        let mut logits = self
            .forward_rows(&tokens, &rows, caches, &wanted)?
            .into_iter();
        Ok(chunks
            .iter()
            .zip(want_logits)
            .map(|(chunk, &want)| {
                if want && !chunk.is_empty() {
                    logits.next()
                } else {
                    None
                }
            })
            .collect())
    }

    /// The transformer over rows of (sequence, position): row `t` is `tokens[t]` at position
    /// `rows[t].1` of `caches[rows[t].0]`. Advances each cache by its rows; returns the
    /// logits of the rows in `wanted`.
    fn forward_rows(
        &self,
        tokens: &[u32],
        rows: &[(usize, usize)],
        caches: &mut [&mut KvCache],
        wanted: &[usize],
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let mut s = RunState::new(&self.config, tokens.len());
        self.embed_rows(tokens, &mut s.x)?;
        for (li, layer) in self.layers.iter().enumerate() {
            self.attention(li, layer, rows, caches, &mut s);
            self.mlp(layer, &mut s);
        }
        for &(ci, _) in rows {
            caches[ci].advance(1);
        }
        Ok(self.head_logits(&mut s, wanted))
    }

    /// The embedding of every row's token into `x` (`[n, d]`).
    fn embed_rows(&self, tokens: &[u32], x: &mut [f32]) -> Result<(), ModelError> {
        let d = self.config.dim;
        for (t, &tok) in tokens.iter().enumerate() {
            if tok as usize >= self.config.vocab {
                return Err(ModelError::BadToken(tok));
            }
            self.embed.row(tok as usize, &mut x[t * d..(t + 1) * d]);
        }
        Ok(())
    }

    /// The attention block of layer `li`: RMSNorm, the Q/K/V products, RoPE, the new keys
    /// and values into the caches, attention per (row, head), the output product, residual.
    fn attention(
        &self,
        li: usize,
        layer: &Layer,
        rows: &[(usize, usize)],
        caches: &mut [&mut KvCache],
        s: &mut RunState,
    ) {
        let c = &self.config;
        let (d, kv_dim, hd) = (c.dim, c.kv_dim(), c.head_dim);
        norm_rows(&s.x, &layer.attn_norm, c, &mut s.xn, &mut s.acts);
        matmul_many(
            &mut [
                (&layer.wq, &mut s.q[..]),
                (&layer.wk, &mut s.k[..]),
                (&layer.wv, &mut s.v[..]),
            ],
            &s.acts,
        );
        let rotated = s.q.chunks_mut(d).zip(s.k.chunks_mut(kv_dim)).zip(rows);
        per_token(rotated, |((q, k), &(_, pos))| {
            for head in q.chunks_mut(hd).chain(k.chunks_mut(hd)) {
                self.rope(head, pos);
            }
        });
        for (t, &(ci, pos)) in rows.iter().enumerate() {
            let span = t * kv_dim..(t + 1) * kv_dim;
            caches[ci].write(li, pos, &s.k[span.clone()], &s.v[span]);
        }
        let readonly: Vec<&KvCache> = caches.iter().map(|c| &**c).collect();
        crate::attention::attend_rows(c, li, &s.q, rows, &readonly, &mut s.attn);
        per_token(s.acts.iter_mut().zip(s.attn.chunks(d)), |(act, row)| {
            act.fill(row);
        });
        layer.wo.matmul(&s.acts, &mut s.proj);
        s.x.iter_mut().zip(&s.proj).for_each(|(a, b)| *a += b);
    }

    /// The MLP block: RMSNorm, then down(silu(gate(x)) · up(x)), residual.
    fn mlp(&self, layer: &Layer, s: &mut RunState) {
        let c = &self.config;
        norm_rows(&s.x, &layer.ffn_norm, c, &mut s.xn, &mut s.acts);
        matmul_many(
            &mut [
                (&layer.w_gate, &mut s.gate[..]),
                (&layer.w_up, &mut s.up[..]),
            ],
            &s.acts,
        );
        let f = c.ffn_dim;
        let gated = s
            .gate
            .chunks_mut(f)
            .zip(s.up.chunks(f))
            .zip(s.ffn_acts.iter_mut());
        per_token(gated, |((gate, up), act)| {
            gate.iter_mut()
                .zip(up)
                .for_each(|(g, &u)| *g = silu(*g) * u);
            act.fill(gate);
        });
        layer.w_down.matmul(&s.ffn_acts, &mut s.proj);
        s.x.iter_mut().zip(&s.proj).for_each(|(a, b)| *a += b);
    }

    /// The final RMSNorm and the output head over the `wanted` rows.
    fn head_logits(&self, s: &mut RunState, wanted: &[usize]) -> Vec<Vec<f32>> {
        let c = &self.config;
        let d = c.dim;
        let head = self.head.as_ref().unwrap_or(&self.embed);
        let mut head_acts = Vec::with_capacity(wanted.len());
        for &t in wanted {
            rms_norm(
                &s.x[t * d..(t + 1) * d],
                &self.norm,
                c.rms_eps,
                &mut s.xn[..d],
            );
            head_acts.push(QActs::quantize(&s.xn[..d]));
        }
        let mut logits = vec![0f32; wanted.len() * c.vocab];
        head.matmul(&head_acts, &mut logits);
        logits.chunks_exact(c.vocab).map(<[f32]>::to_vec).collect()
    }

    /// Rotates adjacent pairs of one head's vector by the angles of `pos`.
    fn rope(&self, x: &mut [f32], pos: usize) {
        let half = x.len() / 2;
        let cos = &self.rope_cos[pos * half..(pos + 1) * half];
        let sin = &self.rope_sin[pos * half..(pos + 1) * half];
        for i in 0..half {
            let (a, b) = (x[2 * i], x[2 * i + 1]);
            x[2 * i] = a * cos[i] - b * sin[i];
            x[2 * i + 1] = a * sin[i] + b * cos[i];
        }
    }
}

/// The buffers of one forward pass over `n` rows, allocated once per pass and reused by
/// every layer (llama2.c's `RunState`).
struct RunState {
    /// The residual stream, `[n, d]`.
    x: Vec<f32>,
    /// Its normalised copy, and the same rounded to 8 bits for the products.
    xn: Vec<f32>,
    acts: Vec<QActs>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    /// Attention's output per row, `[n, d]`.
    attn: Vec<f32>,
    /// A block's output product, added to `x`.
    proj: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    ffn_acts: Vec<QActs>,
}

impl RunState {
    fn new(c: &Config, n: usize) -> Self {
        let (d, kv_dim, f) = (c.dim, c.kv_dim(), c.ffn_dim);
        Self {
            x: vec![0.0; n * d],
            xn: vec![0.0; n * d],
            acts: vec![QActs::default(); n],
            q: vec![0.0; n * d],
            k: vec![0.0; n * kv_dim],
            v: vec![0.0; n * kv_dim],
            attn: vec![0.0; n * d],
            proj: vec![0.0; n * d],
            gate: vec![0.0; n * f],
            up: vec![0.0; n * f],
            ffn_acts: vec![QActs::default(); n],
        }
    }
}

/// RMSNorm of every row of `x` by `weight` into `xn`, and its 8-bit rounding into `acts`.
fn norm_rows(x: &[f32], weight: &[f32], c: &Config, xn: &mut [f32], acts: &mut [QActs]) {
    let normed = x
        .chunks(c.dim)
        .zip(xn.chunks_mut(c.dim))
        .zip(acts.iter_mut());
    per_token(normed, |((x, xn), act)| {
        rms_norm(x, weight, c.rms_eps, xn);
        act.fill(xn);
    });
}

fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let ms = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let inv = 1.0 / (ms + eps).sqrt();
    for ((o, &xi), &wi) in out.iter_mut().zip(x).zip(w) {
        *o = xi * inv * wi;
    }
}

/// Tokens from which a prompt's per-token work (norms, rotations, quantizing activations,
/// SwiGLU) goes to the pool: a 512-token prefill spent a tenth of its time there on one
/// thread while the other waited. A decoded token's is too small to hand off.
const PARALLEL_TOKENS: usize = 8;

/// Runs `work` on each token's item, on the pool for a prompt (a decoded token's items are
/// not even collected: this runs for every layer of every token).
fn per_token<I>(items: I, work: impl Fn(I::Item) + Sync)
where
    I: ExactSizeIterator,
    I::Item: Send,
{
    if items.len() >= PARALLEL_TOKENS {
        crate::parallel::for_each(items.collect(), work);
    } else {
        items.for_each(work);
    }
}

fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

pub use crate::attention::softmax;
