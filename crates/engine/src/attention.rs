//! Attention on the CPU: each (row, head) scores its query against every cached key, takes
//! the softmax and sums the values, on the pool; a prompt's task takes all the heads that
//! share a key head, so each key and value is read once for them. The keys are stored
//! dimension by dimension (`kv.rs`), so the scores run vector-wide over positions and stay
//! bit-identical to one position and one head at a time.
//!
//! Queries, keys, values and the softmax's weights are held at f16 precision (in f32
//! storage), as llama.cpp's default f16 cache and its f16 products hold them: agreeing with
//! it to the bit in these roundings is what keeps greedy choices at near-ties the same.

use std::cell::RefCell;
use std::ops::Range;

use crate::config::Config;
use crate::kv::KvCache;
use crate::lanes::{LaneKernel, Lanes, on_widest};
use crate::qmatrix::{Place, round_slice_to_f16};

/// Attention of layer `li` for every row's query heads in `q` (`[n, q_dim]`, rounded to f16
/// by the caller), against the cache of its sequence: `rows[t]` is row `t`'s (sequence,
/// position), and `places[t]` its place in the pass, which decides the order of its sums. A
/// sliding-window layer sees only the last `window` positions. Writes `out` (`[n, q_dim]`).
pub(crate) fn attend_rows(
    c: &Config,
    li: usize,
    q: &[f32],
    (rows, places): (&[(usize, usize)], &[Place]),
    caches: &[&KvCache],
    out: &mut [f32],
) {
    let (qd, hd) = (c.q_dim(), c.head_dim);
    let group = c.n_heads / c.n_kv_heads;
    // A prompt has rows enough for every thread, so one task takes every query head that
    // shares a key head and reads each key and value once for all of them; a decoded token
    // has one row, so its heads go to the threads one by one.
    let heads_per_task = if rows.len() > 1 { group } else { 1 };
    let tasks_per_row = c.n_heads / heads_per_task;
    let scale = c.score_scale();
    let attend = |(i, out): (usize, &mut [f32])| {
        let (t, h) = (i / tasks_per_row, i % tasks_per_row * heads_per_task);
        let (ci, pos) = rows[t];
        let order = SumOrder::of(places[t]);
        let first = c.window(li).map_or(0, |w| (pos + 1).saturating_sub(w));
        let span = Span::new(
            caches[ci],
            li,
            h / group * hd..(h / group + 1) * hd,
            first..pos + 1,
        );
        let q = &q[t * qd + h * hd..t * qd + (h + heads_per_task) * hd];
        for (q, out) in q.chunks(HEADS * hd).zip(out.chunks_mut(HEADS * hd)) {
            match q.len() / hd {
                4 => attend_heads::<4, 2>(q, &span, (scale, order), out),
                3 => attend_heads::<3, 2>(q, &span, (scale, order), out),
                2 => attend_heads::<2, 4>(q, &span, (scale, order), out),
                _ => attend_heads::<1, 4>(q, &span, (scale, order), out),
            }
        }
    };
    let tasks = out.chunks_mut(heads_per_task * hd).enumerate();
    crate::parallel::for_each(tasks.collect(), attend);
}

/// Query heads attended together at most: each key and value is read once for all of them,
/// and four heads' sums fill the registers.
const HEADS: usize = 4;

/// Which of llama.cpp's f16 products an attention sum follows: its CPU backend takes a
/// product over several tokens through tinyBLAS, and one over a single token through
/// `ggml_vec_dot_f16` (llamafile's `sgemm` declines fewer than two columns).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SumOrder {
    /// Terms in 8 classes by index, the class sums added as AVX's `hsum` adds lanes.
    TinyBlas,
    /// Terms in 32 classes by index (4 vectors of 8), reduced as `GGML_F32x8_REDUCE` does.
    VecDot,
}

impl SumOrder {
    /// The order of a row at `place` in its pass.
    fn of(place: Place) -> SumOrder {
        if place.batched() {
            SumOrder::TinyBlas
        } else {
            SumOrder::VecDot
        }
    }
}

/// What one task reads of a layer's cache: one key head's channels over a run of positions,
/// which a sliding-window layer's ring may hold in two runs of slots (`near`, then `far`);
/// each position's score and weight are the same however the runs are cut.
struct Span<'a> {
    cache: &'a KvCache,
    layer: usize,
    channels: Range<usize>,
    near: Range<usize>,
    far: Range<usize>,
}

impl<'a> Span<'a> {
    fn new(
        cache: &'a KvCache,
        layer: usize,
        channels: Range<usize>,
        positions: Range<usize>,
    ) -> Self {
        let [near, far] = cache.slot_ranges(layer, positions);
        Span {
            cache,
            layer,
            channels,
            near,
            far,
        }
    }

    /// Positions covered.
    fn len(&self) -> usize {
        self.near.len() + self.far.len()
    }

    /// The key head over one run of slots: its channels' rows, and the run.
    fn keys(&self, slots: Range<usize>) -> Keys<'a> {
        let (rows, stride) = self.cache.key_rows(self.layer, self.channels.clone());
        Keys {
            rows,
            stride,
            slots,
        }
    }

    /// The value head over the two runs, in position order.
    fn values(&self) -> [Values<'a>; 2] {
        [&self.near, &self.far].map(|slots| Values {
            rows: self.cache.value_rows(self.layer, slots.clone()),
            stride: self.cache.kv_dim(),
            channel: self.channels.start,
        })
    }
}

/// One key head over a run of slots: channel `i`'s row is `rows[i * stride..]`, of which
/// the run is `slots`.
struct Keys<'a> {
    rows: &'a [f32],
    stride: usize,
    slots: Range<usize>,
}

/// One value head over a run of slots: slot `p` of the run holds its head at
/// `rows[p * stride + channel..]`.
struct Values<'a> {
    rows: &'a [f32],
    stride: usize,
    channel: usize,
}

/// Attention of `G` query heads (`q`, `[G, head_dim]`) that share the key head of `span`,
/// their scores multiplied by `scale` and every sum in `order`, into `out` (`[G, head_dim]`); the kernels sum blocks of `L` vectors a head, sized so `G`
/// heads' sums fit the registers.
fn attend_heads<const G: usize, const L: usize>(
    q: &[f32],
    span: &Span<'_>,
    (scale, order): (f32, SumOrder),
    out: &mut [f32],
) {
    let (n, near) = (span.len(), span.near.len());
    SCORES.with_borrow_mut(|sc| {
        sc.clear();
        sc.resize(G * n, 0.0);
        let keys = span.keys(span.near.clone());
        attention_scores::<G, L>(q, &keys, (scale, order), (sc, 0..near));
        if !span.far.is_empty() {
            let keys = span.keys(span.far.clone());
            attention_scores::<G, L>(q, &keys, (scale, order), (sc, near..n));
        }
        for head in sc.chunks_mut(n) {
            softmax(head);
            round_slice_to_f16(head);
        }
        weighted_values::<G, L>(sc, &span.values(), order, out);
    });
}

thread_local! {
    /// The heads' scores, kept per thread so a pass allocates none per task.
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// A last, short block's rows padded to a whole one, kept per thread as the scores are.
    static PADDED: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// `out[g][p] = (q[g] · key(p)) × scale` for each of the `G` heads of `q` and every position
/// `p` of `cols` (`out` holds `G` rows of scores, the columns `cols` this call's, one for
/// each slot of `keys`), the keys held dimension by dimension.
///
/// The positions are independent lanes, so the loop runs vector-wide, and a block of `L`
/// vectors of them stays in registers for every head (each key read once for the `G` heads),
/// while each position's sum over q's dimensions is the one llama.cpp makes ([`sum_block`]):
/// the golden tests pin logits that another order would move.
fn attention_scores<const G: usize, const L: usize>(
    q: &[f32],
    keys: &Keys<'_>,
    scale: (f32, SumOrder),
    out: (&mut [f32], Range<usize>),
) {
    on_widest(Scores::<G, L> {
        q,
        keys,
        scale,
        out,
    })
}

/// [`attention_scores`]' arguments, for [`on_widest`].
struct Scores<'a, 'k, const G: usize, const L: usize> {
    q: &'a [f32],
    keys: &'a Keys<'k>,
    scale: (f32, SumOrder),
    out: (&'a mut [f32], Range<usize>),
}

impl<const G: usize, const L: usize> LaneKernel for Scores<'_, '_, G, L> {
    type Output = ();
    const WIDEST: usize = 16;

    #[inline(always)]
    unsafe fn run<V: Lanes>(self) {
        // SAFETY: the caller's guarantee.
        unsafe { scores::<V, G, L>(self.q, self.keys, self.scale, self.out) }
    }
}

/// The body of [`attention_scores`] on lanes `V`. The last block, short of a whole one, is
/// read through a zero-padded copy so it runs the same code.
///
/// # Safety
/// The machine runs `V`'s instruction set.
#[inline(always)]
unsafe fn scores<V: Lanes, const G: usize, const L: usize>(
    q: &[f32],
    keys: &Keys<'_>,
    (scale, order): (f32, SumOrder),
    (out, cols): (&mut [f32], Range<usize>),
) {
    let (hd, stride, block) = (q.len() / G, out.len() / G, L * V::WIDTH);
    let mut sums: Sums = [0.0; HEADS * MAX_BLOCK];
    let mut write = |start: usize, sums: &Sums| {
        let width = block.min(cols.len() - start);
        for (g, sums) in sums.chunks_exact(block).take(G).enumerate() {
            let o = &mut out[g * stride + cols.start + start..][..width];
            for (o, a) in o.iter_mut().zip(sums) {
                *o = a * scale;
            }
        }
    };
    let whole = cols.len() / block * block;
    for start in (0..whole).step_by(block) {
        let first = keys.slots.start + start;
        let row = |i: usize| &keys.rows[i * keys.stride + first..];
        // SAFETY: the caller's guarantee.
        unsafe { sum_block::<V, G, L>(q, (hd, row), order, &mut sums) };
        write(start, &sums);
    }
    if whole < cols.len() {
        let first = keys.slots.start + whole;
        let mut padded = PADDED.take();
        let rows = keys.rows.chunks_exact(keys.stride).take(hd);
        pad_rows(
            rows.map(|row| &row[first..keys.slots.end]),
            block,
            &mut padded,
        );
        let row = |i: usize| &padded[i * block..];
        // SAFETY: the caller's guarantee.
        unsafe { sum_block::<V, G, L>(q, (hd, row), order, &mut sums) };
        write(whole, &sums);
        PADDED.set(padded);
    }
}

/// The most floats one head's block sums: `L` vectors of the widest lanes (AVX-512's).
const MAX_BLOCK: usize = 64;

/// The `G` heads' sums of one block, `G` runs of `L × WIDTH` floats.
type Sums = [f32; HEADS * MAX_BLOCK];

/// Each of `rows` (short of `block` floats) followed by zeros to `block`, one after another,
/// into `padded`.
fn pad_rows<'a>(rows: impl Iterator<Item = &'a [f32]>, block: usize, padded: &mut Vec<f32>) {
    padded.clear();
    for row in rows {
        padded.extend_from_slice(row);
        padded.resize(padded.len() + block - row.len(), 0.0);
    }
}

/// Every head's sums over a block of `L` vectors into `sums`: `Σ_i x[g][i] · row(i)` over the `n` rows
/// (each starting with the block's floats), `x` holding `G` rows of `n` factors. Both kernels are this step: the scores sum over a query's dimensions, the values
/// over the positions.
///
/// The sums are the ones llama.cpp's f16 products make on AVX2 ([`SumOrder`]): row `i` goes
/// to a class by `i` mod 8 (tinyBLAS) or mod 32 (`ggml_vec_dot_f16`), each class is summed in
/// order by fused multiply-adds from zero, and the class sums are added as the product adds
/// its accumulators. Vector lanes here run over the block, so the order holds whatever their
/// width. (Rows past the last are zeros to both, as llama.cpp's masked positions are; a
/// head size that is not a multiple of 32 would leave `ggml_vec_dot_f16` a tail it sums in
/// f64, which none of the architectures has.)
///
/// # Safety
/// The machine runs `V`'s instruction set.
#[inline(always)]
unsafe fn sum_block<'a, V: Lanes, const G: usize, const L: usize>(
    x: &[f32],
    rows: (usize, impl Fn(usize) -> &'a [f32]),
    order: SumOrder,
    sums: &mut Sums,
) {
    // Each class is summed when the reduction needs it, so only a few sets are live. (No
    // closures: a closure would not carry the caller's target features to the lanes' adds.)
    macro_rules! class {
        ($k:expr, $of:expr) => {
            class_sum::<V, G, L>(x, &rows, $k, $of)
        };
    }
    macro_rules! add {
        ($a:expr, $b:expr) => {
            add_sets::<V, G, L>($a, $b)
        };
    }
    // SAFETY (every call in the reduction): the caller's guarantee.
    let total = unsafe {
        match order {
            SumOrder::TinyBlas => {
                // `hsum`: the upper four lanes onto the lower, then 2 and 3 onto 0 and 1, then 1
                // onto 0.
                let even = add!(
                    add!(class!(4, 8), class!(0, 8)),
                    add!(class!(6, 8), class!(2, 8))
                );
                let odd = add!(
                    add!(class!(5, 8), class!(1, 8)),
                    add!(class!(7, 8), class!(3, 8))
                );
                add!(even, odd)
            }
            SumOrder::VecDot => {
                // `GGML_F32x8_REDUCE` over four vectors of eight lanes: the third onto the first
                // and the fourth onto the second, the second onto the first; then the upper half
                // onto the lower, and two horizontal adds.
                let zero = [[V::splat(0.0); L]; G];
                let mut half = [zero; 4];
                for (k, half) in half.iter_mut().enumerate() {
                    let mut pair = [zero; 2];
                    for (j, lane) in pair.iter_mut().enumerate() {
                        let k = k + 4 * j;
                        let low = add!(class!(k, 32), class!(16 + k, 32));
                        *lane = add!(low, add!(class!(8 + k, 32), class!(24 + k, 32)));
                    }
                    *half = add!(pair[0], pair[1]);
                }
                add!(add!(half[0], half[1]), add!(half[2], half[3]))
            }
        }
    };
    let block = L * V::WIDTH;
    for (g, set) in total.iter().enumerate() {
        for (l, v) in set.iter().enumerate() {
            // SAFETY: the caller's guarantee.
            unsafe { v.store(&mut sums[g * block + l * V::WIDTH..]) };
        }
    }
}

/// Each head's `L` vectors of sums.
type Set<V, const G: usize, const L: usize> = [[V; L]; G];

/// Two sets of sums added lane by lane.
///
/// # Safety
/// The machine runs `V`'s instruction set.
#[inline(always)]
unsafe fn add_sets<V: Lanes, const G: usize, const L: usize>(
    mut a: Set<V, G, L>,
    b: Set<V, G, L>,
) -> Set<V, G, L> {
    for (a, b) in a.iter_mut().zip(&b) {
        for (a, &b) in a.iter_mut().zip(b) {
            // SAFETY: the caller's guarantee.
            *a = unsafe { a.add(b) };
        }
    }
    a
}

/// Each head's sums over the block of class `class` of `classes` (the rows `i` with
/// `i mod classes == class`), in order by fused multiply-adds from zero.
///
/// # Safety
/// The machine runs `V`'s instruction set.
#[inline(always)]
unsafe fn class_sum<'a, V: Lanes, const G: usize, const L: usize>(
    x: &[f32],
    (n, row): &(usize, impl Fn(usize) -> &'a [f32]),
    class: usize,
    classes: usize,
) -> Set<V, G, L> {
    let stride = *n;
    assert!(x.len() >= G * stride, "a factor for every head and row");
    // SAFETY (each call): the caller's guarantee.
    let mut acc = [[unsafe { V::splat(0.0) }; L]; G];
    for i in (class..stride).step_by(classes) {
        let row = row(i);
        assert!(row.len() >= L * V::WIDTH, "the block's floats in every row");
        let p = row.as_ptr();
        // SAFETY: the row holds the block's `L × WIDTH` floats (asserted above).
        let v: [V; L] = std::array::from_fn(|l| unsafe { V::load_ptr(p.add(l * V::WIDTH)) });
        for (g, acc) in acc.iter_mut().enumerate() {
            // SAFETY: `x` holds `G` rows of `stride` (asserted above).
            let f = unsafe { V::splat(*x.get_unchecked(g * stride + i)) };
            for (a, &v) in acc.iter_mut().zip(&v) {
                *a = unsafe { a.add_product(f, v) };
            }
        }
    }
    acc
}

/// The eight class sums added as ggml's `hsum` adds an AVX vector's lanes: the upper four onto
/// the lower, then lanes 2 and 3 onto 0 and 1, then lane 1 onto 0.
///
/// # Safety
/// The machine runs `V`'s instruction set.
#[inline(always)]
unsafe fn hsum_classes<V: Lanes>(p: [V; 8]) -> V {
    // SAFETY (each call): the caller's guarantee.
    unsafe {
        let even = p[4].add(p[0]).add(p[6].add(p[2]));
        let odd = p[5].add(p[1]).add(p[7].add(p[3]));
        even.add(odd)
    }
}

/// `out[g] = Σ_p weights[g][p] · value(p)` for each of the `G` heads (`weights` holds `G`
/// rows, one column per position of the two runs of `values` in order; `out` is
/// `[G, head_dim]`): a block of `L` vectors of dimensions stays in registers for every head
/// across all positions (each value read once for the `G` heads, one store per dimension),
/// each dimension summed over the positions as llama.cpp sums them ([`sum_block`]).
fn weighted_values<const G: usize, const L: usize>(
    weights: &[f32],
    values: &[Values<'_>; 2],
    order: SumOrder,
    out: &mut [f32],
) {
    on_widest(WeighValues::<G, L> {
        weights,
        values,
        order,
        out,
    })
}

/// [`weighted_values`]' arguments, for [`on_widest`].
struct WeighValues<'a, 'v, const G: usize, const L: usize> {
    weights: &'a [f32],
    values: &'a [Values<'v>; 2],
    order: SumOrder,
    out: &'a mut [f32],
}

impl<const G: usize, const L: usize> LaneKernel for WeighValues<'_, '_, G, L> {
    type Output = ();
    const WIDEST: usize = 16;

    #[inline(always)]
    unsafe fn run<V: Lanes>(self) {
        // SAFETY: the caller's guarantee.
        unsafe { weigh_values::<V, G, L>(self.weights, self.values, self.order, self.out) }
    }
}

/// The body of [`weighted_values`] on lanes `V`. A head size short of a whole block leaves a
/// last block that is summed through zero-padded copies of the values.
///
/// # Safety
/// The machine runs `V`'s instruction set.
#[inline(always)]
unsafe fn weigh_values<V: Lanes, const G: usize, const L: usize>(
    weights: &[f32],
    values: &[Values<'_>; 2],
    order: SumOrder,
    out: &mut [f32],
) {
    let (n, hd, block) = (weights.len() / G, out.len() / G, L * V::WIDTH);
    let slots = || {
        values
            .iter()
            .flat_map(|run| run.rows.chunks_exact(run.stride).map(|s| &s[run.channel..]))
    };
    let near = values[0].rows.len() / values[0].stride;
    // Position `p`'s value head from dimension `start` on.
    let slot = |p: usize, start: usize| {
        let (run, p) = if p < near {
            (&values[0], p)
        } else {
            (&values[1], p - near)
        };
        &run.rows[p * run.stride + run.channel + start..]
    };
    let mut sums: Sums = [0.0; HEADS * MAX_BLOCK];
    let mut write = |start: usize, sums: &Sums| {
        let width = block.min(hd - start);
        for (g, sums) in sums.chunks_exact(block).take(G).enumerate() {
            out[g * hd + start..][..width].copy_from_slice(&sums[..width]);
        }
    };
    let whole = hd / block * block;
    for start in (0..whole).step_by(block) {
        let row = |p: usize| slot(p, start);
        // SAFETY: the caller's guarantee.
        unsafe { sum_block::<V, G, L>(weights, (n, row), order, &mut sums) };
        write(start, &sums);
    }
    if whole < hd {
        let mut padded = PADDED.take();
        pad_rows(slots().map(|v| &v[whole..hd]), block, &mut padded);
        let row = |p: usize| &padded[p * block..];
        // SAFETY: the caller's guarantee.
        unsafe { sum_block::<V, G, L>(weights, (n, row), order, &mut sums) };
        write(whole, &sums);
        PADDED.set(padded);
    }
}

/// How many exponentials ggml's softmax sums at a time: an AVX vector.
const SOFTMAX_BLOCK: usize = 8;

/// In-place softmax as ggml's CPU backend takes it: eˣ by `ggml_v_expf`, summed eight at a
/// time in f32 (the positions short of a last whole eight counting as masked ones, zero) and
/// those sums in f64, then one multiply by the reciprocal.
pub fn softmax(x: &mut [f32]) {
    on_widest(Softmax(x));
}

/// [`softmax`]'s loop.
struct Softmax<'a>(&'a mut [f32]);

impl LaneKernel for Softmax<'_> {
    type Output = ();
    const WIDEST: usize = SOFTMAX_BLOCK;

    #[inline(always)]
    unsafe fn run<V: Lanes>(self) {
        // SAFETY: the caller's guarantee.
        unsafe { softmax_on::<V>(self.0) }
    }
}

/// The body of [`softmax`] on lanes `V`.
///
/// # Safety
/// The machine runs `V`'s instruction set.
#[inline(always)]
unsafe fn softmax_on<V: Lanes>(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f64;
    for chunk in x.chunks_mut(SOFTMAX_BLOCK) {
        let mut block = [f32::NEG_INFINITY; SOFTMAX_BLOCK];
        block[..chunk.len()].copy_from_slice(chunk);
        for part in block.chunks_exact_mut(V::WIDTH) {
            // SAFETY (each call): the caller's guarantee.
            unsafe { V::load(part).add(V::splat(-max)).exp().store(part) };
        }
        // SAFETY: plain floats run anywhere.
        let total: f32 = unsafe { hsum_classes(block) };
        sum += f64::from(total);
        chunk.copy_from_slice(&block[..chunk.len()]);
    }
    let inverse = (1.0 / sum) as f32;
    for v in x.iter_mut() {
        *v *= inverse;
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

    /// `Σ a_i·b_i` as llama.cpp's f16 products sum on AVX2, one term at a time, written from
    /// their loops: tinyBLAS's one vector of 8 lanes with `hsum`; `ggml_vec_dot_f16`'s four
    /// vectors, reduced vector-wise, then by halves and two horizontal adds.
    fn llama_dot(order: SumOrder, terms: impl Iterator<Item = (f32, f32)>) -> f32 {
        let mut acc = [0f32; 32];
        let width = if order == SumOrder::TinyBlas { 8 } else { 32 };
        for (i, (a, b)) in terms.enumerate() {
            acc[i % width] = a.mul_add(b, acc[i % width]);
        }
        let mut v: [f32; 8] = std::array::from_fn(|k| acc[k]);
        if order == SumOrder::VecDot {
            v = std::array::from_fn(|k| (acc[k] + acc[16 + k]) + (acc[8 + k] + acc[24 + k]));
            let t: [f32; 4] = std::array::from_fn(|k| v[k] + v[k + 4]);
            return (t[0] + t[1]) + (t[2] + t[3]);
        }
        ((v[4] + v[0]) + (v[6] + v[2])) + ((v[5] + v[1]) + (v[7] + v[3]))
    }

    /// `G` heads' scores in blocks of `L` vectors, against one head and one position at a time.
    fn scores_match_one_at_a_time<const G: usize, const L: usize>() {
        let mut next = spread_values(0x9E37_79B9);
        let hd = 64;
        for positions in [1, 7, 8, 9, 15, 16, 17, 63, 64, 65, 128, 200] {
            let q: Vec<f32> = (0..G * hd).map(|_| next()).collect();
            let keys: Vec<f32> = (0..positions * hd).map(|_| next()).collect();
            let key = |p: usize| &keys[p * hd..(p + 1) * hd];
            // The same keys dimension by dimension, as the cache holds them, with slots to
            // spare past the last position.
            let stride = positions + 3;
            let rows: Vec<f32> = (0..hd)
                .flat_map(|i| (0..stride).map(move |p| (i, p)))
                .map(|(i, p)| {
                    if p < positions {
                        keys[p * hd + i]
                    } else {
                        f32::NAN
                    }
                })
                .collect();
            // Two runs of columns, as a ring's two runs of slots give them.
            let cut = positions / 3;
            for order in [SumOrder::TinyBlas, SumOrder::VecDot] {
                let mut fast = vec![f32::NAN; G * positions];
                let run = |slots| Keys {
                    rows: &rows,
                    stride,
                    slots,
                };
                let scale = (0.125, order);
                attention_scores::<G, L>(&q, &run(0..cut), scale, (&mut fast, 0..cut));
                let rest = cut..positions;
                attention_scores::<G, L>(&q, &run(rest.clone()), scale, (&mut fast, rest.clone()));
                // The portable lanes too, which the machine's widest ones would hide.
                let mut plain = vec![f32::NAN; G * positions];
                // SAFETY: plain floats run anywhere.
                unsafe {
                    scores::<f32, G, L>(&q, &run(0..cut), scale, (&mut plain, 0..cut));
                    scores::<f32, G, L>(&q, &run(rest.clone()), scale, (&mut plain, rest));
                }
                for (i, (got, plain)) in fast.iter().zip(&plain).enumerate() {
                    let (g, p) = (i / positions, i % positions);
                    let qg = &q[g * hd..(g + 1) * hd];
                    let terms = qg.iter().copied().zip(key(p).iter().copied());
                    let want = llama_dot(order, terms) * 0.125;
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "{order:?}, head {g}, position {p} of {positions}"
                    );
                    assert_eq!(
                        plain.to_bits(),
                        want.to_bits(),
                        "{order:?}, portable, head {g}, position {p}"
                    );
                }
            }
        }
    }

    #[test]
    fn attention_scores_in_blocks_sum_as_llama_cpp_does_one_position_at_a_time() {
        scores_match_one_at_a_time::<1, 4>();
        scores_match_one_at_a_time::<2, 4>();
        scores_match_one_at_a_time::<3, 2>();
        scores_match_one_at_a_time::<4, 2>();
    }

    /// `G` heads' weighted values in blocks of `L` vectors, against one position at a time.
    fn values_match_one_at_a_time<const G: usize, const L: usize>() {
        let mut next = spread_values(0x1234_5678);
        for (hd, positions) in [(64, 1), (64, 77), (128, 300), (80, 5), (256, 40)] {
            let weights: Vec<f32> = (0..G * positions).map(|_| next()).collect();
            let values: Vec<f32> = (0..positions * hd).map(|_| next()).collect();
            let value = |p: usize| &values[p * hd..(p + 1) * hd];
            // The same values in two runs of slots, with other heads' channels around them.
            let stride = hd + 5;
            let slots: Vec<f32> = (0..positions)
                .flat_map(|p| [&[f32::NAN; 2][..], value(p), &[f32::NAN; 3]].concat())
                .collect();
            let cut = positions / 2 * stride;
            let run = |rows| Values {
                rows,
                stride,
                channel: 2,
            };
            let runs = [run(&slots[..cut]), run(&slots[cut..])];
            for order in [SumOrder::TinyBlas, SumOrder::VecDot] {
                let mut got = vec![f32::NAN; G * hd];
                weighted_values::<G, L>(&weights, &runs, order, &mut got);
                // The portable lanes too, which the machine's widest ones would hide.
                let mut plain = vec![f32::NAN; G * hd];
                // SAFETY: plain floats run anywhere.
                unsafe { weigh_values::<f32, G, L>(&weights, &runs, order, &mut plain) };
                let want: Vec<f32> = (0..G * hd)
                    .map(|i| {
                        let (g, c) = (i / hd, i % hd);
                        let w = &weights[g * positions..(g + 1) * positions];
                        llama_dot(order, w.iter().enumerate().map(|(p, &w)| (w, value(p)[c])))
                    })
                    .collect();
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "{order:?}, {G} heads of {hd}, {positions} positions"
                );
                assert_eq!(
                    bits(&plain),
                    bits(&want),
                    "{order:?}, portable, {G} heads of {hd}"
                );
            }
        }
    }

    #[test]
    fn weighted_values_in_blocks_sum_as_llama_cpp_does_one_position_at_a_time() {
        values_match_one_at_a_time::<1, 4>();
        values_match_one_at_a_time::<2, 4>();
        values_match_one_at_a_time::<3, 2>();
        values_match_one_at_a_time::<4, 2>();
    }

    /// ggml's softmax one value at a time: `ggml_v_expf`, eights summed in f32 then in f64.
    #[test]
    fn softmax_matches_ggml_one_value_at_a_time() {
        let mut next = spread_values(0x0BAD_F00D);
        for n in [1, 5, 8, 13, 64, 301] {
            let x: Vec<f32> = (0..n).map(|_| next() * 40.0).collect();
            let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let e: Vec<f32> = x
                .iter()
                .map(|&v| crate::lanes::ggml_expf(v - max))
                .collect();
            let mut sum = 0f64;
            for block in e.chunks(SOFTMAX_BLOCK) {
                let mut b = [0f32; SOFTMAX_BLOCK];
                b[..block.len()].copy_from_slice(block);
                sum += f64::from(((b[4] + b[0]) + (b[6] + b[2])) + ((b[5] + b[1]) + (b[7] + b[3])));
            }
            let inverse = (1.0 / sum) as f32;
            let want: Vec<u32> = e.iter().map(|v| (v * inverse).to_bits()).collect();
            let mut got = x.clone();
            softmax(&mut got);
            let got: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
            assert_eq!(got, want, "{n} values");
            // The portable lanes too, which the machine's widest ones would hide.
            let mut plain = x.clone();
            // SAFETY: plain floats run anywhere.
            unsafe { softmax_on::<f32>(&mut plain) };
            assert_eq!(plain.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want);
        }
    }
}
