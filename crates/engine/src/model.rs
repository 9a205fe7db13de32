//! The transformer on the CPU: weights in their quantized block formats in host memory, and
//! the operations of a layer ([`block::Ops`]) on a pass's rows, which [`block::layers`]
//! sequences for every architecture (its config is in `config.rs`).

use crate::block;
use crate::chunk::Chunk;
use crate::config::{Config, ModelError};
use crate::gguf::{ByteSource, Gguf};
use crate::kv::{KvCache, PASS_ROWS};
use crate::lanes::silu_in_place;
use crate::qmatrix::{
    Place, QActs, QMatrix, f16_bits, fused, matmul_many, round_slice_to_f16, round_to_f16,
};
use crate::quant::TensorType;
use crate::weights::{self, LayerWeights, WeightStore};

/// RoPE's angles for every position of one base: `cos[pos · half + i]`, `sin` alike.
struct RopeTable {
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl RopeTable {
    /// The angles of [`rope_angles`] for `positions` positions.
    fn new(theta: f32, head_dim: usize, positions: usize) -> Self {
        let half = head_dim / 2;
        let (mut cos, mut sin) = (
            Vec::with_capacity(positions * half),
            Vec::with_capacity(positions * half),
        );
        for pos in 0..positions {
            for a in rope_angles(theta, head_dim, pos) {
                cos.push(a.cos());
                sin.push(a.sin());
            }
        }
        Self { cos, sin }
    }
}

/// RoPE's angle at `pos` for each pair `i` of a head, pos · θ^(−2i/head_dim), computed as
/// ggml does: the position multiplied by θ^(−2/head_dim) once per pair, so the angles (and
/// the keys rounded to f16 after them) agree with llama.cpp's to the bit.
pub(crate) fn rope_angles(theta: f32, head_dim: usize, pos: usize) -> impl Iterator<Item = f32> {
    let step = theta.powf(-2.0 / head_dim as f32);
    std::iter::successors(Some(pos as f32), move |a| Some(a * step)).take(head_dim / 2)
}

/// The loaded model: weights stay in their quantized block format.
pub struct Model {
    pub config: Config,
    embed: QMatrix,
    layers: Vec<Layer>,
    norm: Vec<f32>,
    head: Option<QMatrix>,
    rope_global: RopeTable,
    /// The sliding-window layers' table, where their base differs.
    rope_local: Option<RopeTable>,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("config", &self.config)
            .field("weight_bytes", &self.weight_bytes())
            .finish()
    }
}

/// The CPU model's weights: quantized blocks in host memory, vectors as f32.
pub(crate) struct Host;

impl WeightStore for Host {
    type Matrix = QMatrix;
    type Vector = Vec<f32>;

    fn matrix(
        &self,
        ty: TensorType,
        bytes: &[u8],
        rows: usize,
        cols: usize,
    ) -> Result<QMatrix, ModelError> {
        Ok(QMatrix::from_gguf(ty, bytes, rows, cols)?)
    }

    fn vector(&self, values: Vec<f32>) -> Vec<f32> {
        values
    }
}

type Layer = LayerWeights<QMatrix, Vec<f32>>;

/// The result a task of [`crate::parallel::run_all`] left in its place.
fn ran<T>(place: Option<T>) -> T {
    place.expect("run_all runs every task or panics")
}

impl Model {
    /// Loads the weights of a GGUF of one of the [`crate::Arch`]s; RoPE tables cover `max_context`
    /// positions.
    pub fn load<S: ByteSource + Sync>(g: &Gguf<S>, max_context: usize) -> Result<Self, ModelError> {
        Ok(Self::load_alongside(g, max_context, || ())?.0)
    }

    /// [`Model::load`], with `alongside` run as one more task of the same parallel region
    /// (the tokenizer's tables, built from the same file, take about as long as a few
    /// layers): the weights' layouts are built a tensor a task, spread over the pool.
    pub fn load_alongside<S: ByteSource + Sync, T: Send>(
        g: &Gguf<S>,
        max_context: usize,
        alongside: impl FnOnce() -> T + Send,
    ) -> Result<(Self, T), ModelError> {
        let c = Config::from_gguf(g)?;
        let (mut other, mut embed, mut head) = (None, None, None);
        let mut layers: Vec<Option<Result<Layer, ModelError>>> =
            (0..c.n_layers).map(|_| None).collect();
        let config = &c;
        // The largest tasks first, so the last ones to start are short.
        let mut tasks: Vec<Box<dyn FnOnce() + Send + '_>> = vec![
            Box::new(|| other = Some(alongside())),
            Box::new(|| {
                embed = Some(weights::matrix(
                    &Host,
                    g,
                    "token_embd.weight",
                    c.vocab,
                    c.dim,
                ))
            }),
            Box::new(|| {
                head = g
                    .tensor("output.weight")
                    .map(|_| weights::matrix(&Host, g, "output.weight", c.vocab, c.dim));
            }),
        ];
        tasks.extend(layers.iter_mut().enumerate().map(|(i, slot)| {
            Box::new(move || *slot = Some(weights::load_layer(&Host, g, config, i)))
                as Box<dyn FnOnce() + Send + '_>
        }));
        crate::parallel::run_all(tasks);
        let layers = layers.into_iter().map(ran).collect::<Result<_, _>>()?;
        let embed = ran(embed)?;
        let head = head.transpose()?;
        let norm = weights::vector(&Host, g, "output_norm.weight", c.dim)?;
        let rope_global = RopeTable::new(c.rope_theta, c.head_dim, max_context);
        let rope_local = (c.sliding_window.is_some() && c.rope_theta_local != c.rope_theta)
            .then(|| RopeTable::new(c.rope_theta_local, c.head_dim, max_context));
        let model = Self {
            config: c,
            embed,
            layers,
            norm,
            head,
            rope_global,
            rope_local,
        };
        Ok((model, ran(other)))
    }

    /// Bytes of weights held (quantized).
    pub fn weight_bytes(&self) -> usize {
        let l: usize = self
            .layers
            .iter()
            .map(|l| {
                l.matrices().iter().map(|m| m.bytes()).sum::<usize>()
                    + l.vectors().map(|v| 4 * v.len()).sum::<usize>()
            })
            .sum();
        l + self.embed.bytes() + self.head.as_ref().map_or(0, QMatrix::bytes)
    }

    /// Largest context the RoPE tables cover.
    pub fn max_context(&self) -> usize {
        self.rope_global.cos.len() / (self.config.head_dim / 2).max(1)
    }

    /// A KV cache for `capacity` positions.
    pub fn new_cache(&self, capacity: usize) -> KvCache {
        let c = &self.config;
        let windows: Vec<Option<usize>> = (0..c.n_layers).map(|l| c.window(l)).collect();
        KvCache::with_windows(&windows, capacity.min(self.max_context()), c.kv_dim())
    }

    /// Runs `tokens` at positions `cache.len()..`, appending to the cache. Returns the logits of
    /// the last token, or of every token when `all_logits` (speculative verification needs them).
    pub fn forward(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        all_logits: bool,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let n = tokens.len();
        let places: Vec<Place> = (0..n).map(|t| Place::in_pass(t, n)).collect();
        self.forward_sequence(tokens, cache, (all_logits, &places))
    }

    /// Every position's logits for `tokens` after the cache's contents, each position
    /// computed to the bits decoding it alone gives (in one pass): what verifying a draft
    /// needs, so that speculation reproduces plain greedy decoding exactly.
    pub(crate) fn forward_decoded(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        self.forward_sequence(tokens, cache, (true, &vec![Place::ALONE; tokens.len()]))
    }

    /// One sequence's `tokens` after the cache's contents, each at its place: every
    /// position's logits, or the last one's.
    fn forward_sequence(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        (all_logits, places): (bool, &[Place]),
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let (start, n) = (cache.len(), tokens.len());
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
        let outputs = (&wanted[..], !all_logits);
        self.forward_rows(tokens, (&rows, places), &mut [cache], outputs)
    }

    /// One forward pass over a chunk of tokens for each of several sequences: `chunks[i]`
    /// goes to `caches[i]` at its next positions (a prompt being prefilled, or one token
    /// being decoded), each token at its place in its chunk's pass. The weights are read once
    /// for every row of every chunk. Returns the logits of each chunk's last token where it
    /// wants them.
    pub(crate) fn forward_chunks(
        &self,
        chunks: &[Chunk<'_>],
        caches: &mut [&mut KvCache],
    ) -> Result<Vec<Option<Vec<f32>>>, ModelError> {
        debug_assert_eq!(chunks.len(), caches.len());
        let (mut tokens, mut rows, mut places, mut wanted) = (vec![], vec![], vec![], vec![]);
        for (i, (chunk, cache)) in chunks.iter().zip(caches.iter()).enumerate() {
            let (start, n) = (cache.len(), chunk.tokens.len());
            if start + n > cache.capacity() {
                return Err(ModelError::ContextFull {
                    needed: start + n,
                    capacity: cache.capacity(),
                });
            }
            tokens.extend_from_slice(chunk.tokens);
            rows.extend((start..start + n).map(|at| (i, at)));
            places.extend(chunk.places(start));
            if chunk.want_logits && n > 0 {
                wanted.push(rows.len() - 1);
            }
        }
        if tokens.is_empty() {
            return Ok(vec![None; chunks.len()]);
        }
        let mut logits = self
            .forward_rows(&tokens, (&rows, &places), caches, (&wanted, true))?
            .into_iter();
        Ok(chunks
            .iter()
            .map(|c| match c.want_logits && !c.tokens.is_empty() {
                true => logits.next(),
                false => None,
            })
            .collect())
    }

    /// The transformer over rows of (sequence, position): row `t` is `tokens[t]` at position
    /// `rows[t].1` of `caches[rows[t].0]`, a sequence's rows consecutive, computed at
    /// `places[t]`. Advances each cache by its rows; returns the logits of the rows in
    /// `wanted`, each as its sequence's one output where `alone` (see [`Self::forward_pass`]).
    fn forward_rows(
        &self,
        tokens: &[u32],
        (rows, places): (&[(usize, usize)], &[Place]),
        caches: &mut [&mut KvCache],
        (wanted, alone): (&[usize], bool),
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        // A sliding-window layer's ring holds a pass's rows beyond its window (`kv.rs`), so a
        // longer pass goes in parts; the rows' values are the same either way.
        let part = match self.config.sliding_window {
            Some(_) => PASS_ROWS,
            None => rows.len().max(1),
        };
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= self.config.vocab) {
            return Err(ModelError::BadToken(bad));
        }
        let mut logits = Vec::with_capacity(wanted.len());
        for start in (0..rows.len()).step_by(part) {
            let end = (start + part).min(rows.len());
            let want: Vec<usize> = wanted
                .iter()
                .filter(|t| (start..end).contains(*t))
                .map(|t| t - start)
                .collect();
            let part_rows = (&rows[start..end], &places[start..end]);
            let outputs = (&want[..], alone);
            let pass = self.forward_pass(&tokens[start..end], part_rows, caches, outputs)?;
            logits.extend(pass);
        }
        Ok(logits)
    }

    /// [`Self::forward_rows`] in one pass.
    fn forward_pass(
        &self,
        tokens: &[u32],
        (rows, places): (&[(usize, usize)], &[Place]),
        caches: &mut [&mut KvCache],
        (wanted, alone): (&[usize], bool),
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let c = &self.config;
        let mut x = vec![0.0; tokens.len() * c.dim];
        block::embed(&self.embed, c, tokens, &mut x)?;
        let mut pass = HostPass {
            model: self,
            rows: rows.to_vec(),
            places: places.to_vec(),
            acts: places
                .iter()
                .map(|&place| QActs {
                    place,
                    ..QActs::default()
                })
                .collect(),
            caches: &mut *caches,
            // As llama.cpp: the last layer's MLP runs on the rows whose logits are wanted
            // only, each as its sequence's one output (which is also where its sums are
            // ordered as a server's are), unless every row's are wanted. A chunk's last
            // token is its prompt's one output even when the chunk holds only it.
            outputs: alone.then(|| wanted.to_vec()),
            spare: Vec::new(),
        };
        let x = block::layers(&mut pass, c, &self.layers, x)?;
        let out_rows = pass.rows;
        for &(ci, _) in rows {
            caches[ci].advance(1);
        }
        let wanted: Vec<usize> = match alone {
            true => (0..wanted.len()).collect(),
            false => wanted.to_vec(),
        };
        Ok(self.head_logits(&x, (&out_rows, &wanted), caches))
    }

    /// The final RMSNorm and the output head over the `wanted` rows of `x`; each row's
    /// normalised state is also kept in its sequence's cache (the last one a sequence has
    /// stays).
    fn head_logits(
        &self,
        x: &[f32],
        (rows, wanted): (&[(usize, usize)], &[usize]),
        caches: &mut [&mut KvCache],
    ) -> Vec<Vec<f32>> {
        let c = &self.config;
        let d = c.dim;
        let head = self.head.as_ref().unwrap_or(&self.embed);
        let mut normed = vec![0f32; d];
        let mut head_acts = Vec::with_capacity(wanted.len());
        for &t in wanted {
            rms_norm(&x[t * d..(t + 1) * d], &self.norm, c.rms_eps, &mut normed);
            caches[rows[t].0].set_state(&normed);
            head_acts.push(QActs::quantize_as(&normed, head.act_format()));
        }
        let mut logits = vec![0f32; wanted.len() * c.vocab];
        head.matmul(&head_acts, &mut logits);
        logits.chunks_exact(c.vocab).map(<[f32]>::to_vec).collect()
    }

    /// Rotates one head's vector by the angles of `pos` in layer `li`'s RoPE: pairs of
    /// adjacent elements, or (GPT-NeoX's layout) element `i` with `i + half`.
    fn rope(&self, li: usize, x: &mut [f32], pos: usize) {
        let half = x.len() / 2;
        let local = self.config.window(li).and(self.rope_local.as_ref());
        let table = local.unwrap_or(&self.rope_global);
        let cos = &table.cos[pos * half..(pos + 1) * half];
        let sin = &table.sin[pos * half..(pos + 1) * half];
        let (step, pair) = if self.config.arch.rope_halves() {
            (1, half)
        } else {
            (2, 1)
        };
        // As GCC compiles ggml's `x0*cos - x1*sin` with FMA on: the first product fused.
        for i in 0..half {
            let (a, b) = (x[step * i], x[step * i + pair]);
            x[step * i] = fused(a, cos[i], -(b * sin[i]));
            x[step * i + pair] = fused(a, sin[i], b * cos[i]);
        }
    }
}

/// One pass of the CPU model over its rows, for [`block::layers`]: each row's (sequence,
/// position) and place in its pass, and the caches its keys and values go to.
struct HostPass<'p, 'c> {
    model: &'p Model,
    rows: Vec<(usize, usize)>,
    places: Vec<Place>,
    /// Each row's activations rounded to 8 bits for a product, at its place.
    acts: Vec<QActs>,
    caches: &'p mut [&'c mut KvCache],
    /// The rows whose logits the pass returns, where the last layer's MLP runs on them alone.
    outputs: Option<Vec<usize>>,
    /// Buffers a finished operation left, for the next to fill: a prompt's rows are
    /// megabytes a layer, and fresh pages cost more than the per-row work on them.
    spare: Vec<Vec<f32>>,
}

impl HostPass<'_, '_> {
    /// The width of a row of `x`, one of the pass's rows (at least 1, for a pass that keeps
    /// no row to its end).
    fn width(&self, x: &[f32]) -> usize {
        (x.len() / self.rows.len().max(1)).max(1)
    }

    /// A buffer of `len` values, from the spares where one is large enough; its contents are
    /// whatever they were (each caller writes every value).
    fn buffer(&mut self, len: usize) -> Vec<f32> {
        let fits = (0..self.spare.len())
            .filter(|&i| self.spare[i].capacity() >= len)
            .min_by_key(|&i| self.spare[i].capacity());
        let mut buffer = fits.map_or_else(Vec::new, |i| self.spare.swap_remove(i));
        buffer.resize(len, 0.0);
        buffer
    }

    /// Runs `work` on each row of `x` with its index: on the pool for a prompt.
    fn each_row(&self, x: &mut [f32], work: impl Fn(usize, &mut [f32]) + Sync) {
        let width = self.width(x);
        per_token(x.chunks_mut(width).enumerate(), |(t, row)| work(t, row));
    }
}

impl block::Ops for HostPass<'_, '_> {
    type Matrix = QMatrix;
    type Vector = Vec<f32>;
    type Rows = Vec<f32>;

    fn norm(&mut self, x: &Vec<f32>, weight: &Vec<f32>) -> Vec<f32> {
        let eps = self.model.config.rms_eps;
        let mut out = self.buffer(x.len());
        out.copy_from_slice(x);
        self.each_row(&mut out, |_, row| rms_norm_in_place(row, weight, eps));
        out
    }

    fn head_norm(&mut self, mut x: Vec<f32>, weight: &Vec<f32>) -> Vec<f32> {
        let eps = self.model.config.rms_eps;
        self.each_row(&mut x, |_, row| {
            row.chunks_mut(weight.len())
                .for_each(|head| rms_norm_in_place(head, weight, eps))
        });
        x
    }

    fn products<const N: usize>(&mut self, x: Vec<f32>, w: [&QMatrix; N]) -> [Vec<f32>; N] {
        let n = self.rows.len();
        let format = w[0].act_format();
        let width = self.width(&x);
        let rounded = self.acts.iter_mut().zip(x.chunks(width));
        per_token(rounded, |(act, row)| act.fill(row, format));
        let mut out = w.map(|m| self.buffer(n * m.shape().0));
        let mut parts: Vec<(&QMatrix, &mut [f32])> = w
            .into_iter()
            .zip(out.iter_mut().map(Vec::as_mut_slice))
            .collect();
        matmul_many(&mut parts, &self.acts);
        drop(parts);
        self.spare.push(x);
        out
    }

    fn add_bias(&mut self, mut x: Vec<f32>, bias: &Vec<f32>) -> Vec<f32> {
        x.chunks_mut(bias.len())
            .for_each(|row| row.iter_mut().zip(bias).for_each(|(v, b)| *v += b));
        x
    }

    fn rope(&mut self, mut x: Vec<f32>, li: usize) -> Vec<f32> {
        let (model, rows) = (self.model, &self.rows);
        let hd = model.config.head_dim;
        self.each_row(&mut x, |t, row| {
            row.chunks_mut(hd)
                .for_each(|head| model.rope(li, head, rows[t].1))
        });
        x
    }

    fn scale(&mut self, mut x: Vec<f32>, by: f32) -> Vec<f32> {
        x.iter_mut().for_each(|v| *v *= by);
        x
    }

    fn attend(
        &mut self,
        li: usize,
        mut q: Vec<f32>,
        k: Vec<f32>,
        v: Vec<f32>,
    ) -> Result<Vec<f32>, ModelError> {
        let c = &self.model.config;
        self.each_row(&mut q, |_, row| round_slice_to_f16(row));
        let kv_dim = c.kv_dim();
        for (t, &(ci, pos)) in self.rows.iter().enumerate() {
            let span = t * kv_dim..(t + 1) * kv_dim;
            self.caches[ci].write(li, pos, &k[span.clone()], &v[span]);
        }
        let mut out = self.buffer(q.len());
        let readonly: Vec<&KvCache> = self.caches.iter().map(|c| &**c).collect();
        let rows = (&self.rows[..], &self.places[..]);
        crate::attention::attend_rows(c, li, &q, rows, &readonly, &mut out);
        self.spare.extend([q, k, v]);
        Ok(out)
    }

    fn gate(&mut self, mut gate: Vec<f32>, up: Vec<f32>, gelu: bool) -> Vec<f32> {
        let activation = if gelu { gelu_in_place } else { silu_in_place };
        let f = self.model.config.ffn_dim;
        per_token(gate.chunks_mut(f).zip(up.chunks(f)), |(gate, up)| {
            activation(gate);
            gate.iter_mut().zip(up).for_each(|(g, &u)| *g *= u);
        });
        self.spare.push(up);
        gate
    }

    fn add(&mut self, mut x: Vec<f32>, y: Vec<f32>) -> Vec<f32> {
        x.iter_mut().zip(&y).for_each(|(a, b)| *a += b);
        self.spare.push(y);
        x
    }

    fn keep_outputs(&mut self, mut x: Vec<f32>) -> Vec<f32> {
        let Some(keep) = self.outputs.take() else {
            return x;
        };
        let d = self.model.config.dim;
        // `keep` is in order, so each kept row moves down onto a row already passed.
        debug_assert!(keep.is_sorted(), "output rows out of order: {keep:?}");
        for (to, &from) in keep.iter().enumerate() {
            x.copy_within(from * d..(from + 1) * d, to * d);
        }
        x.truncate(keep.len() * d);
        self.rows = keep.iter().map(|&t| self.rows[t]).collect();
        self.places = vec![Place::ALONE; keep.len()];
        self.acts.truncate(keep.len());
        self.acts.iter_mut().for_each(|a| a.place = Place::ALONE);
        x
    }
}

fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let inv = inverse_rms(x, eps);
    for ((o, &xi), &wi) in out.iter_mut().zip(x).zip(w) {
        *o = xi * inv * wi;
    }
}

fn rms_norm_in_place(x: &mut [f32], w: &[f32], eps: f32) {
    let inv = inverse_rms(x, eps);
    for (xi, &wi) in x.iter_mut().zip(w) {
        *xi = *xi * inv * wi;
    }
}

/// 1/√(mean(x²) + ε), summed in f64 as ggml sums it: a last-bit difference here moves a
/// value that sits on a rounding tie of the 8-bit activations (common in the first layer,
/// whose inputs are quantized embeddings) to the other side.
fn inverse_rms(x: &[f32], eps: f32) -> f32 {
    let sum: f64 = x.iter().map(|&v| f64::from(v * v)).sum();
    let mean = (sum / x.len() as f64) as f32;
    1.0 / (mean + eps).sqrt()
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

/// √(2/π), GELU's tanh approximation's scale.
pub(crate) const GELU_SQRT_2_OVER_PI: f32 = 0.797_884_6;
/// The cubic term's weight in GELU's tanh approximation.
pub(crate) const GELU_CUBIC: f32 = 0.044_715;

/// GELU's tanh approximation as ggml computes it on the CPU: read from a table of every f16
/// input (so the input and the result are rounded to f16), exact beyond ±10. The rounding is
/// kept so that greedy choices agree with llama.cpp's at near-ties; the lookup is also
/// cheaper than the `tanh` it replaces.
fn gelu_in_place(x: &mut [f32]) {
    let table = gelu_table();
    for v in x {
        *v = if *v <= -10.0 {
            0.0
        } else if *v >= 10.0 {
            *v
        } else {
            table[usize::from(f16_bits(*v))]
        };
    }
}

/// ½x(1 + tanh(√(2/π)·x·(1 + 0.044715x²))) rounded to f16, for every f16 `x` (by its bits).
fn gelu_table() -> &'static [f32] {
    static TABLE: std::sync::OnceLock<Vec<f32>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|bits| {
                let x = half::f16::from_bits(bits).to_f32();
                // GCC fuses ggml's `1.0f + GELU_COEF_A*x*x` into one multiply-add.
                let u = GELU_SQRT_2_OVER_PI * x * (GELU_CUBIC * x).mul_add(x, 1.0);
                round_to_f16(0.5 * x * (1.0 + u.tanh()))
            })
            .collect()
    })
}
