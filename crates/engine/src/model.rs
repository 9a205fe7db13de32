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
        let c = &self.config;
        let (d, kv_dim, hd) = (c.dim, c.kv_dim(), c.head_dim);
        let n = tokens.len();
        // x: [n, d]
        let mut x = vec![0f32; n * d];
        for (t, &tok) in tokens.iter().enumerate() {
            if tok as usize >= c.vocab {
                return Err(ModelError::BadToken(tok));
            }
            self.embed.row(tok as usize, &mut x[t * d..(t + 1) * d]);
        }
        let mut xn = vec![0f32; n * d];
        let mut acts: Vec<QActs> = vec![QActs::default(); n];
        let (mut q, mut k, mut v) = (
            vec![0f32; n * d],
            vec![0f32; n * kv_dim],
            vec![0f32; n * kv_dim],
        );
        let mut attn = vec![0f32; n * d];
        let mut proj = vec![0f32; n * d];
        let (mut gate, mut up) = (vec![0f32; n * c.ffn_dim], vec![0f32; n * c.ffn_dim]);
        let mut ffn_acts: Vec<QActs> = vec![QActs::default(); n];
        let group = c.n_heads / c.n_kv_heads;
        let scale = 1.0 / (hd as f32).sqrt();

        for (li, layer) in self.layers.iter().enumerate() {
            // Attention block.
            let normed = x.chunks(d).zip(xn.chunks_mut(d)).zip(acts.iter_mut());
            per_token(normed, |((x, xn), act)| {
                rms_norm(x, &layer.attn_norm, c.rms_eps, xn);
                act.fill(xn);
            });
            matmul_many(
                &mut [
                    (&layer.wq, &mut q[..]),
                    (&layer.wk, &mut k[..]),
                    (&layer.wv, &mut v[..]),
                ],
                &acts,
            );
            let rotated = q.chunks_mut(d).zip(k.chunks_mut(kv_dim)).zip(rows);
            per_token(rotated, |((q, k), &(_, pos))| {
                for head in q.chunks_mut(hd).chain(k.chunks_mut(hd)) {
                    self.rope(head, pos);
                }
            });
            for (t, &(ci, pos)) in rows.iter().enumerate() {
                caches[ci].write(
                    li,
                    pos,
                    &k[t * kv_dim..(t + 1) * kv_dim],
                    &v[t * kv_dim..(t + 1) * kv_dim],
                );
            }
            // Each (row, head) attends on its own, so the pairs are split across threads: a
            // long prompt's attention grows with the square of its length, and even one
            // decoded token has a head per thread to give.
            let readonly: Vec<&KvCache> = caches.iter().map(|c| &**c).collect();
            let attend = |(i, out): (usize, &mut [f32])| {
                let (t, h) = (i / c.n_heads, i % c.n_heads);
                let (ci, pos) = rows[t];
                let cache = readonly[ci];
                let kvh = h / group;
                let qh = &q[t * d + h * hd..t * d + (h + 1) * hd];
                let mut sc = vec![0f32; pos + 1];
                attention_scores(qh, |i| cache.key_row(li, kvh * hd + i), scale, &mut sc);
                softmax(&mut sc);
                weighted_values(&sc, |p| &cache.value(li, p)[kvh * hd..(kvh + 1) * hd], out);
            };
            crate::parallel::for_each(attn.chunks_mut(hd).enumerate().collect(), attend);
            per_token(acts.iter_mut().zip(attn.chunks(d)), |(act, row)| {
                act.fill(row);
            });
            layer.wo.matmul(&acts, &mut proj);
            x.iter_mut().zip(&proj).for_each(|(a, b)| *a += b);

            // MLP block: down(silu(gate(x)) · up(x)).
            let normed = x.chunks(d).zip(xn.chunks_mut(d)).zip(acts.iter_mut());
            per_token(normed, |((x, xn), act)| {
                rms_norm(x, &layer.ffn_norm, c.rms_eps, xn);
                act.fill(xn);
            });
            matmul_many(
                &mut [(&layer.w_gate, &mut gate[..]), (&layer.w_up, &mut up[..])],
                &acts,
            );
            let f = c.ffn_dim;
            let gated = gate.chunks(f).zip(up.chunks(f)).zip(ffn_acts.iter_mut());
            per_token(gated, |((gate, up), act)| {
                let h: Vec<f32> = gate.iter().zip(up).map(|(&g, &u)| silu(g) * u).collect();
                act.fill(&h);
            });
            layer.w_down.matmul(&ffn_acts, &mut proj);
            x.iter_mut().zip(&proj).for_each(|(a, b)| *a += b);
        }
        for &(ci, _) in rows {
            caches[ci].advance(1);
        }
        let head = self.head.as_ref().unwrap_or(&self.embed);
        let mut head_acts = Vec::with_capacity(wanted.len());
        for &t in wanted {
            rms_norm(&x[t * d..(t + 1) * d], &self.norm, c.rms_eps, &mut xn[..d]);
            head_acts.push(QActs::quantize(&xn[..d]));
        }
        let mut logits = vec![0f32; wanted.len() * c.vocab];
        head.matmul(&head_acts, &mut logits);
        Ok(logits.chunks_exact(c.vocab).map(<[f32]>::to_vec).collect())
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

/// Positions summed in registers at a time by [`attention_scores`] (four AVX vectors; more
/// spilled, fewer left the adds' latency exposed: 2.4 µs for 512 positions against 2.6 µs one
/// dimension at a time, 3.0 µs with 64 and 3.6 µs with 16).
const SCORE_BLOCK: usize = 32;

/// Dimensions summed in registers at a time by [`weighted_values`] (eight AVX vectors: one
/// head of 64; 1.8 µs for 512 positions against 2.9 µs one position at a time).
const VALUE_BLOCK: usize = 64;

/// `out[p] = (q · key(p)) × scale` for every position `p`, given the keys dimension by
/// dimension (`key_row(i)[p]` is dimension `i` of position `p`).
///
/// The positions are independent lanes, so the loop runs vector-wide, and a block of them
/// stays in registers across all of q's dimensions (each position stored once, not once per
/// dimension), while each sum still adds its products in order from −0.0, exactly as
/// `iter().sum()` over one position's key does — the scores are bit-identical to one position
/// at a time (the golden tests pin logits that a reordered sum would move).
fn attention_scores<'a>(
    q: &[f32],
    key_row: impl Fn(usize) -> &'a [f32],
    scale: f32,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the feature was detected just now.
        return unsafe { scores_avx2(q, key_row, scale, out) };
    }
    scores(q, key_row, scale, out);
}

/// [`scores`] compiled for AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn scores_avx2<'a>(q: &[f32], key_row: impl Fn(usize) -> &'a [f32], scale: f32, out: &mut [f32]) {
    scores(q, key_row, scale, out);
}

/// The body of [`attention_scores`], inlined into a copy per instruction set: the default
/// x86-64 target has SSE2's four lanes only (512 positions: 2.5 µs, 1.8 with AVX2; an
/// AVX-512 copy was no faster, with 32 or 128 positions a block, and 64 spilled). Rust never
/// fuses a multiply and an add on its own, so every copy gives the same bits.
#[inline(always)]
fn scores<'a>(q: &[f32], key_row: impl Fn(usize) -> &'a [f32], scale: f32, out: &mut [f32]) {
    let blocks = out.len() / SCORE_BLOCK * SCORE_BLOCK;
    for (b, chunk) in out[..blocks].chunks_exact_mut(SCORE_BLOCK).enumerate() {
        let start = b * SCORE_BLOCK;
        let mut acc = [-0.0f32; SCORE_BLOCK];
        for (i, &qi) in q.iter().enumerate() {
            let row = &key_row(i)[start..start + SCORE_BLOCK];
            for (a, &k) in acc.iter_mut().zip(row) {
                *a += qi * k;
            }
        }
        for (o, a) in chunk.iter_mut().zip(acc) {
            *o = a * scale;
        }
    }
    let tail = &mut out[blocks..];
    tail.fill(-0.0);
    for (i, &qi) in q.iter().enumerate() {
        let row = &key_row(i)[blocks..blocks + tail.len()];
        for (o, &k) in tail.iter_mut().zip(row) {
            *o += qi * k;
        }
    }
    for o in tail.iter_mut() {
        *o *= scale;
    }
}

/// `out = Σ_p weights[p] · value(p)`: a block of dimensions stays in registers across all
/// positions (one store per dimension), each dimension summed over the positions in order.
fn weighted_values<'a>(weights: &[f32], value: impl Fn(usize) -> &'a [f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the feature was detected just now.
        return unsafe { values_avx2(weights, value, out) };
    }
    values(weights, value, out);
}

/// [`values`] compiled for AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn values_avx2<'a>(weights: &[f32], value: impl Fn(usize) -> &'a [f32], out: &mut [f32]) {
    values(weights, value, out);
}

/// The body of [`weighted_values`], inlined into a copy per instruction set, as [`scores`]
/// (512 positions: 1.9 µs with SSE2, 1.3 with AVX2).
#[inline(always)]
fn values<'a>(weights: &[f32], value: impl Fn(usize) -> &'a [f32], out: &mut [f32]) {
    for (b, chunk) in out.chunks_mut(VALUE_BLOCK).enumerate() {
        let start = b * VALUE_BLOCK;
        if chunk.len() == VALUE_BLOCK {
            let mut acc = [0f32; VALUE_BLOCK];
            for (p, &w) in weights.iter().enumerate() {
                let v = &value(p)[start..start + VALUE_BLOCK];
                for (a, &x) in acc.iter_mut().zip(v) {
                    *a += w * x;
                }
            }
            chunk.copy_from_slice(&acc);
        } else {
            chunk.fill(0.0);
            for (p, &w) in weights.iter().enumerate() {
                let v = &value(p)[start..start + chunk.len()];
                for (o, &x) in chunk.iter_mut().zip(v) {
                    *o += w * x;
                }
            }
        }
    }
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

/// In-place softmax.
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    for v in x.iter_mut() {
        *v /= sum;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic values spread over magnitudes, so reordered sums would differ.
    fn spread_values(mut seed: u32) -> impl FnMut() -> f32 {
        move || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            (seed as f32 / u32::MAX as f32 - 0.5) * 10f32.powi((seed % 7) as i32 - 3)
        }
    }

    #[test]
    fn attention_scores_by_dimension_are_bit_identical_to_one_position_at_a_time() {
        let mut next = spread_values(0x9E37_79B9);
        let hd = 64;
        for positions in [1, 7, 8, 9, 63, 64, 65, 128, 200] {
            let q: Vec<f32> = (0..hd).map(|_| next()).collect();
            let keys: Vec<f32> = (0..positions * hd).map(|_| next()).collect();
            let key = |p: usize| &keys[p * hd..(p + 1) * hd];
            // The same keys dimension by dimension, as the cache holds them.
            let rows: Vec<Vec<f32>> = (0..hd)
                .map(|i| (0..positions).map(|p| keys[p * hd + i]).collect())
                .collect();
            let mut fast = vec![0f32; positions];
            attention_scores(&q, |i| &rows[i], 0.125, &mut fast);
            for (p, got) in fast.iter().enumerate() {
                let want = q.iter().zip(key(p)).map(|(a, b)| a * b).sum::<f32>() * 0.125;
                assert_eq!(got.to_bits(), want.to_bits(), "position {p} of {positions}");
            }
        }
    }

    #[test]
    fn weighted_values_in_blocks_are_bit_identical_to_one_position_at_a_time() {
        let mut next = spread_values(0x1234_5678);
        for (hd, positions) in [(64, 1), (64, 77), (128, 300), (80, 5)] {
            let weights: Vec<f32> = (0..positions).map(|_| next()).collect();
            let values: Vec<f32> = (0..positions * hd).map(|_| next()).collect();
            let value = |p: usize| &values[p * hd..(p + 1) * hd];
            let mut got = vec![f32::NAN; hd];
            weighted_values(&weights, value, &mut got);
            let mut want = vec![0f32; hd];
            for (p, &w) in weights.iter().enumerate() {
                for (o, &x) in want.iter_mut().zip(value(p)) {
                    *o += w * x;
                }
            }
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&got),
                bits(&want),
                "head size {hd}, {positions} positions"
            );
        }
    }
}
