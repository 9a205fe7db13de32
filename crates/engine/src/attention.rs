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
use crate::lanes::Lanes;
use crate::model::Config;
use crate::qmatrix::round_slice_to_f16;

/// Attention of layer `li` for every row's query heads in `q` (`[n, q_dim]`, rounded to f16
/// by the caller), against the cache of its sequence: `rows[t]` is row `t`'s (sequence,
/// position). A sliding-window layer sees only the last `window` positions. Writes `out`
/// (`[n, q_dim]`).
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
                4 => attend_heads::<4, 2>(q, &span, out),
                3 => attend_heads::<3, 2>(q, &span, out),
                2 => attend_heads::<2, 4>(q, &span, out),
                _ => attend_heads::<1, 4>(q, &span, out),
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
/// into `out` (`[G, head_dim]`); the kernels sum blocks of `L` vectors a head, sized so `G`
/// heads' sums fit the registers.
fn attend_heads<const G: usize, const L: usize>(q: &[f32], span: &Span<'_>, out: &mut [f32]) {
    let hd = q.len() / G;
    let scale = 1.0 / (hd as f32).sqrt();
    let (n, near) = (span.len(), span.near.len());
    SCORES.with_borrow_mut(|sc| {
        sc.clear();
        sc.resize(G * n, 0.0);
        attention_scores::<G, L>(q, &span.keys(span.near.clone()), scale, (sc, 0..near));
        if !span.far.is_empty() {
            attention_scores::<G, L>(q, &span.keys(span.far.clone()), scale, (sc, near..n));
        }
        for head in sc.chunks_mut(n) {
            softmax(head);
            round_slice_to_f16(head);
        }
        weighted_values::<G, L>(sc, &span.values(), out);
    });
}

thread_local! {
    /// The heads' scores, kept per thread so a pass allocates none per task.
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// A last, short block's rows padded to a whole one, kept per thread as the scores are.
    static PADDED: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Runs `$kernel::<lanes, G, L>($args)` on the widest [`Lanes`] this machine has.
macro_rules! on_widest_lanes {
    ($kernel:ident, $avx:ident, ($($arg:ident),*)) => {{
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the feature was detected just now.
            return unsafe { $avx::<G, L>($($arg),*) };
        }
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
        // SAFETY: the module is built with wasm SIMD, which every engine it runs on has.
        return unsafe { $kernel::<core::arch::wasm32::v128, G, L>($($arg),*) };
        #[allow(unreachable_code)]
        // SAFETY: plain floats run anywhere.
        unsafe { $kernel::<f32, G, L>($($arg),*) }
    }};
}

/// `out[g][p] = (q[g] · key(p)) × scale` for each of the `G` heads of `q` and every position
/// `p` of `cols` (`out` holds `G` rows of scores, the columns `cols` this call's, one for
/// each slot of `keys`), the keys held dimension by dimension.
///
/// The positions are independent lanes, so the loop runs vector-wide, and a block of `L`
/// vectors of them stays in registers for every head across all of q's dimensions (each key
/// read once for the `G` heads), while each sum still adds its products in order from −0.0,
/// exactly as `iter().sum()` over one position's key does — the scores are bit-identical to
/// one position and one head at a time (the golden tests pin logits that a reordered sum
/// would move).
fn attention_scores<const G: usize, const L: usize>(
    q: &[f32],
    keys: &Keys<'_>,
    scale: f32,
    out: (&mut [f32], Range<usize>),
) {
    on_widest_lanes!(scores, scores_avx2, (q, keys, scale, out))
}

/// [`scores`] on AVX's eight lanes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn scores_avx2<const G: usize, const L: usize>(
    q: &[f32],
    keys: &Keys<'_>,
    scale: f32,
    out: (&mut [f32], Range<usize>),
) {
    // SAFETY: AVX runs here.
    unsafe { scores::<std::arch::x86_64::__m256, G, L>(q, keys, scale, out) }
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
    scale: f32,
    (out, cols): (&mut [f32], Range<usize>),
) {
    let (hd, stride, block) = (q.len() / G, out.len() / G, L * V::WIDTH);
    let rows = keys.rows.chunks_exact(keys.stride).take(hd);
    let mut write = |start: usize, sums: Sums| {
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
        let rows = rows.clone().map(|row| &row[first..]);
        // SAFETY: the caller's guarantee.
        write(start, unsafe { sum_block::<V, G, L>(q, hd, rows, -0.0) });
    }
    if whole < cols.len() {
        let first = keys.slots.start + whole;
        let mut padded = PADDED.take();
        pad_rows(
            rows.map(|row| &row[first..keys.slots.end]),
            block,
            &mut padded,
        );
        let rows = padded.chunks_exact(block);
        // SAFETY: the caller's guarantee.
        write(whole, unsafe { sum_block::<V, G, L>(q, hd, rows, -0.0) });
        PADDED.set(padded);
    }
}

/// The most floats one head's block sums: `L` vectors of the widest lanes.
const MAX_BLOCK: usize = 32;

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

/// Every head's sums over a block of `L` vectors, from `init`: `Σ_i x[g][i] · row_i` over the
/// rows `rows` (each starting with the block's floats, in order), `x` holding `G` rows of
/// `stride` factors. Both kernels are this step: the scores sum over a query's dimensions,
/// the values over the positions.
///
/// # Safety
/// The machine runs `V`'s instruction set.
#[inline(always)]
unsafe fn sum_block<'a, V: Lanes, const G: usize, const L: usize>(
    x: &[f32],
    stride: usize,
    rows: impl Iterator<Item = &'a [f32]>,
    init: f32,
) -> Sums {
    // SAFETY (each call): the caller's guarantee.
    let mut acc = [[unsafe { V::splat(init) }; L]; G];
    for (i, row) in rows.enumerate() {
        let v: [V; L] = std::array::from_fn(|l| unsafe { V::load(&row[l * V::WIDTH..]) });
        for (g, acc) in acc.iter_mut().enumerate() {
            let f = unsafe { V::splat(x[g * stride + i]) };
            for (a, &v) in acc.iter_mut().zip(&v) {
                *a = unsafe { a.add_product(f, v) };
            }
        }
    }
    let mut sums = [0f32; HEADS * MAX_BLOCK];
    let block = L * V::WIDTH;
    for (g, acc) in acc.iter().enumerate() {
        for (l, a) in acc.iter().enumerate() {
            unsafe { a.store(&mut sums[g * block + l * V::WIDTH..]) };
        }
    }
    sums
}

/// `out[g] = Σ_p weights[g][p] · value(p)` for each of the `G` heads (`weights` holds `G`
/// rows, one column per position of the two runs of `values` in order; `out` is
/// `[G, head_dim]`): a block of `L` vectors of dimensions stays in registers for every head
/// across all positions (each value read once for the `G` heads, one store per dimension),
/// each dimension summed over the positions in order.
fn weighted_values<const G: usize, const L: usize>(
    weights: &[f32],
    values: &[Values<'_>; 2],
    out: &mut [f32],
) {
    on_widest_lanes!(weigh_values, values_avx2, (weights, values, out))
}

/// [`weigh_values`] on AVX's eight lanes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn values_avx2<const G: usize, const L: usize>(
    weights: &[f32],
    values: &[Values<'_>; 2],
    out: &mut [f32],
) {
    // SAFETY: AVX runs here.
    unsafe { weigh_values::<std::arch::x86_64::__m256, G, L>(weights, values, out) }
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
    out: &mut [f32],
) {
    let (n, hd, block) = (weights.len() / G, out.len() / G, L * V::WIDTH);
    let slots = || {
        values
            .iter()
            .flat_map(|run| run.rows.chunks_exact(run.stride).map(|s| &s[run.channel..]))
    };
    let mut write = |start: usize, sums: Sums| {
        let width = block.min(hd - start);
        for (g, sums) in sums.chunks_exact(block).take(G).enumerate() {
            out[g * hd + start..][..width].copy_from_slice(&sums[..width]);
        }
    };
    let whole = hd / block * block;
    for start in (0..whole).step_by(block) {
        let rows = slots().map(|v| &v[start..]);
        // SAFETY: the caller's guarantee.
        write(start, unsafe {
            sum_block::<V, G, L>(weights, n, rows, 0.0)
        });
    }
    if whole < hd {
        let mut padded = PADDED.take();
        pad_rows(slots().map(|v| &v[whole..hd]), block, &mut padded);
        let rows = padded.chunks_exact(block);
        // SAFETY: the caller's guarantee.
        write(whole, unsafe {
            sum_block::<V, G, L>(weights, n, rows, 0.0)
        });
        PADDED.set(padded);
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
            let mut fast = vec![f32::NAN; G * positions];
            let run = |slots| Keys {
                rows: &rows,
                stride,
                slots,
            };
            attention_scores::<G, L>(&q, &run(0..cut), 0.125, (&mut fast, 0..cut));
            let rest = cut..positions;
            attention_scores::<G, L>(&q, &run(rest.clone()), 0.125, (&mut fast, rest.clone()));
            // The portable lanes too, which the machine's widest ones would hide.
            let mut plain = vec![f32::NAN; G * positions];
            // SAFETY: plain floats run anywhere.
            unsafe {
                scores::<f32, G, L>(&q, &run(0..cut), 0.125, (&mut plain, 0..cut));
                scores::<f32, G, L>(&q, &run(rest.clone()), 0.125, (&mut plain, rest));
            }
            for (i, (got, plain)) in fast.iter().zip(&plain).enumerate() {
                let (g, p) = (i / positions, i % positions);
                let qg = &q[g * hd..(g + 1) * hd];
                let want = qg.iter().zip(key(p)).map(|(a, b)| a * b).sum::<f32>() * 0.125;
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "head {g}, position {p} of {positions}"
                );
                assert_eq!(
                    plain.to_bits(),
                    want.to_bits(),
                    "portable, head {g}, position {p}"
                );
            }
        }
    }

    #[test]
    fn attention_scores_by_dimension_are_bit_identical_to_one_position_at_a_time() {
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
            let mut got = vec![f32::NAN; G * hd];
            weighted_values::<G, L>(&weights, &runs, &mut got);
            // The portable lanes too, which the machine's widest ones would hide.
            let mut plain = vec![f32::NAN; G * hd];
            // SAFETY: plain floats run anywhere.
            unsafe { weigh_values::<f32, G, L>(&weights, &runs, &mut plain) };
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
            assert_eq!(bits(&plain), bits(&want), "portable, {G} heads of {hd}");
        }
    }

    #[test]
    fn weighted_values_in_blocks_are_bit_identical_to_one_position_at_a_time() {
        values_match_one_at_a_time::<1, 4>();
        values_match_one_at_a_time::<2, 4>();
        values_match_one_at_a_time::<3, 2>();
        values_match_one_at_a_time::<4, 2>();
    }
}
