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

use crate::kv::KvCache;
use crate::model::Config;
use crate::qmatrix::round_slice_to_f16;

/// Attention of layer `li` for every row's query heads in `q` (`[n, q_dim]`, rounded to f16
/// by the caller), against the
/// cache of its sequence: `rows[t]` is row `t`'s (sequence, position). A sliding-window layer
/// sees only the last `window` positions. Writes `out` (`[n, q_dim]`).
pub(crate) fn attend_rows(
    c: &Config,
    li: usize,
    q: &[f32],
    rows: &[(usize, usize)],
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
    let attend = |(i, out): (usize, &mut [f32])| {
        let (t, h) = (i / tasks_per_row, i % tasks_per_row * heads_per_task);
        let (ci, pos) = rows[t];
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
                4 => attend_heads::<4, 16>(q, &span, out),
                3 => attend_heads::<3, 16>(q, &span, out),
                2 => attend_heads::<2, 32>(q, &span, out),
                _ => attend_heads::<1, 32>(q, &span, out),
            }
        }
    };
    let tasks = out.chunks_mut(heads_per_task * hd).enumerate();
    crate::parallel::for_each(tasks.collect(), attend);
}

/// Query heads attended together at most: each key and value is read once for all of them,
/// and four heads' sums fill the registers.
const HEADS: usize = 4;

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
/// into `out` (`[G, head_dim]`); `B` is the kernels' block, sized so `G` heads' sums fit
/// the registers.
fn attend_heads<const G: usize, const B: usize>(q: &[f32], span: &Span<'_>, out: &mut [f32]) {
    let hd = q.len() / G;
    let scale = 1.0 / (hd as f32).sqrt();
    let (n, near) = (span.len(), span.near.len());
    SCORES.with_borrow_mut(|sc| {
        sc.clear();
        sc.resize(G * n, 0.0);
        attention_scores::<G, B>(q, &span.keys(span.near.clone()), scale, (sc, 0..near));
        if !span.far.is_empty() {
            attention_scores::<G, B>(q, &span.keys(span.far.clone()), scale, (sc, near..n));
        }
        for head in sc.chunks_mut(n) {
            softmax(head);
            round_slice_to_f16(head);
        }
        weighted_values::<G, B>(sc, &span.values(), out);
    });
}

thread_local! {
    /// The heads' scores, kept per thread so a pass allocates none per task.
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// `out[g][p] = (q[g] · key(p)) × scale` for each of the `G` heads of `q` and every position
/// `p` of `cols` (`out` holds `G` rows of scores, the columns `cols` this call's, one for
/// each slot of `keys`), the keys held dimension by dimension.
///
/// The positions are independent lanes, so the loop runs vector-wide, and a block of `B` of
/// them stays in registers for every head across all of q's dimensions (each key read once
/// for the `G` heads), while each sum still adds its products in order from −0.0, exactly as
/// `iter().sum()` over one position's key does — the scores are bit-identical to one position
/// and one head at a time (the golden tests pin logits that a reordered sum would move).
fn attention_scores<const G: usize, const B: usize>(
    q: &[f32],
    keys: &Keys<'_>,
    scale: f32,
    out: (&mut [f32], Range<usize>),
) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the feature was detected just now.
        return unsafe { scores_avx2::<G, B>(q, keys, scale, out) };
    }
    scores::<G, B>(q, keys, scale, out);
}

/// [`scores`] compiled for AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn scores_avx2<const G: usize, const B: usize>(
    q: &[f32],
    keys: &Keys<'_>,
    scale: f32,
    out: (&mut [f32], Range<usize>),
) {
    scores::<G, B>(q, keys, scale, out);
}

/// The body of [`attention_scores`], inlined into a copy per instruction set: the default
/// x86-64 target has SSE2's four lanes only, and AVX2's eight are faster. Rust never fuses a
/// multiply and an add on its own, so every copy gives the same bits. The last block, short
/// of `B` positions, is read through a zero-padded copy so it runs the same code.
#[inline(always)]
fn scores<const G: usize, const B: usize>(
    q: &[f32],
    keys: &Keys<'_>,
    scale: f32,
    (out, cols): (&mut [f32], Range<usize>),
) {
    let hd = q.len() / G;
    let stride = out.len() / G;
    let rows = keys.rows.chunks_exact(keys.stride).take(hd);
    let mut write = |start: usize, acc: [[f32; B]; G]| {
        let width = B.min(cols.len() - start);
        for (g, acc) in acc.iter().enumerate() {
            let o = &mut out[g * stride + cols.start + start..][..width];
            for (o, a) in o.iter_mut().zip(acc) {
                *o = a * scale;
            }
        }
    };
    let blocks = cols.len() / B * B;
    for start in (0..blocks).step_by(B) {
        let first = keys.slots.start + start;
        let block = rows.clone().map(|row| &row[first..first + B]);
        write(start, sum_block(q, hd, block, -0.0));
    }
    if blocks < cols.len() {
        let first = keys.slots.start + blocks;
        let padded: Vec<f32> = rows
            .flat_map(|row| pad::<B>(&row[first..keys.slots.end]))
            .collect();
        write(blocks, sum_block(q, hd, padded.chunks_exact(B), -0.0));
    }
}

/// `x` (at most `B` floats) followed by zeros, to `B`.
fn pad<const B: usize>(x: &[f32]) -> [f32; B] {
    let mut padded = [0f32; B];
    padded[..x.len()].copy_from_slice(x);
    padded
}

/// Every head's sums over a block of `B` lanes, from `init`: `Σ_i x[g][i] · row_i` over the
/// rows `rows` (`B` floats each, in order), `x` holding `G` rows of `stride` factors. Both
/// kernels are this step: the scores sum over a query's dimensions, the values over the
/// positions.
#[inline(always)]
fn sum_block<'a, const G: usize, const B: usize>(
    x: &[f32],
    stride: usize,
    rows: impl Iterator<Item = &'a [f32]>,
    init: f32,
) -> [[f32; B]; G] {
    let mut acc = [[init; B]; G];
    for (i, row) in rows.enumerate() {
        for (g, acc) in acc.iter_mut().enumerate() {
            let f = x[g * stride + i];
            for (a, &v) in acc.iter_mut().zip(row) {
                *a += f * v;
            }
        }
    }
    acc
}

/// `out[g] = Σ_p weights[g][p] · value(p)` for each of the `G` heads (`weights` holds `G`
/// rows, one column per position of the two runs of `values` in order; `out` is
/// `[G, head_dim]`): a block of `B` dimensions stays in registers for every head across all
/// positions (each value read once for the `G` heads, one store per dimension), each
/// dimension summed over the positions in order.
fn weighted_values<const G: usize, const B: usize>(
    weights: &[f32],
    values: &[Values<'_>; 2],
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the feature was detected just now.
        return unsafe { values_avx2::<G, B>(weights, values, out) };
    }
    weigh_values::<G, B>(weights, values, out);
}

/// [`weigh_values`] compiled for AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn values_avx2<const G: usize, const B: usize>(
    weights: &[f32],
    values: &[Values<'_>; 2],
    out: &mut [f32],
) {
    weigh_values::<G, B>(weights, values, out);
}

/// The body of [`weighted_values`], inlined into a copy per instruction set, as [`scores`].
/// A head size short of a whole block leaves a last block that is summed through a
/// zero-padded copy of each value.
#[inline(always)]
fn weigh_values<const G: usize, const B: usize>(
    weights: &[f32],
    values: &[Values<'_>; 2],
    out: &mut [f32],
) {
    let (n, hd) = (weights.len() / G, out.len() / G);
    let slots = || {
        values
            .iter()
            .flat_map(|run| run.rows.chunks_exact(run.stride).map(|s| &s[run.channel..]))
    };
    let mut write = |start: usize, acc: [[f32; B]; G]| {
        let width = B.min(hd - start);
        for (g, acc) in acc.iter().enumerate() {
            out[g * hd + start..][..width].copy_from_slice(&acc[..width]);
        }
    };
    let blocks = hd / B * B;
    for start in (0..blocks).step_by(B) {
        let block = slots().map(|v| &v[start..start + B]);
        write(start, sum_block(weights, n, block, 0.0));
    }
    if blocks < hd {
        let padded: Vec<f32> = slots().flat_map(|v| pad::<B>(&v[blocks..hd])).collect();
        write(blocks, sum_block(weights, n, padded.chunks_exact(B), 0.0));
    }
}

/// In-place softmax, normalized as ggml normalizes it (an f64 sum, then one multiply by its
/// reciprocal).
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f64;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += f64::from(*v);
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

    /// `G` heads' scores in blocks of `B`, against one head and one position at a time.
    fn scores_match_one_at_a_time<const G: usize, const B: usize>() {
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
            let mut fast = vec![f32::NAN; G * positions];
            let run = |slots| Keys {
                rows: &rows,
                stride,
                slots,
            };
            attention_scores::<G, B>(&q, &run(0..cut), 0.125, (&mut fast, 0..cut));
            let rest = cut..positions;
            attention_scores::<G, B>(&q, &run(rest.clone()), 0.125, (&mut fast, rest));
            for (i, got) in fast.iter().enumerate() {
                let (g, p) = (i / positions, i % positions);
                let qg = &q[g * hd..(g + 1) * hd];
                let want = qg.iter().zip(key(p)).map(|(a, b)| a * b).sum::<f32>() * 0.125;
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "head {g}, position {p} of {positions}"
                );
            }
        }
    }

    #[test]
    fn attention_scores_by_dimension_are_bit_identical_to_one_position_at_a_time() {
        scores_match_one_at_a_time::<1, 32>();
        scores_match_one_at_a_time::<2, 32>();
        scores_match_one_at_a_time::<3, 16>();
        scores_match_one_at_a_time::<4, 16>();
    }

    /// `G` heads' weighted values in blocks of `B`, against one position at a time.
    fn values_match_one_at_a_time<const G: usize, const B: usize>() {
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
            let mut got = vec![f32::NAN; G * hd];
            weighted_values::<G, B>(
                &weights,
                &[run(&slots[..cut]), run(&slots[cut..])],
                &mut got,
            );
            let mut want = vec![0f32; G * hd];
            for (g, want) in want.chunks_mut(hd).enumerate() {
                for (p, &w) in weights[g * positions..(g + 1) * positions]
                    .iter()
                    .enumerate()
                {
                    for (o, &x) in want.iter_mut().zip(value(p)) {
                        *o += w * x;
                    }
                }
            }
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&got),
                bits(&want),
                "{G} heads of {hd}, {positions} positions"
            );
        }
    }

    #[test]
    fn weighted_values_in_blocks_are_bit_identical_to_one_position_at_a_time() {
        values_match_one_at_a_time::<1, 32>();
        values_match_one_at_a_time::<2, 32>();
        values_match_one_at_a_time::<3, 16>();
        values_match_one_at_a_time::<4, 16>();
    }
}
