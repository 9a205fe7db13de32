//! Attention on the CPU: each (row, head) scores its query against every cached key, takes
//! the softmax and sums the values, on the pool. The keys are stored dimension by dimension
//! (`kv.rs`), so the scores run vector-wide over positions and stay bit-identical to one
//! position at a time.
//!
//! Queries, keys, values and the softmax's weights are held at f16 precision (in f32
//! storage), as llama.cpp's default f16 cache and its f16 products hold them: agreeing with
//! it to the bit in these roundings is what keeps greedy choices at near-ties the same.

use std::cell::RefCell;

use crate::kv::KvCache;
use crate::model::Config;
use crate::qmatrix::round_to_f16;

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
    let scale = 1.0 / (hd as f32).sqrt();
    let window = c.window(li);
    // Each (row, head) attends on its own, so the pairs are split across threads: a long
    // prompt's attention grows with the square of its length, and even one decoded token has
    // a head per thread to give.
    let attend = |(i, out): (usize, &mut [f32])| {
        let (t, h) = (i / c.n_heads, i % c.n_heads);
        let (ci, pos) = rows[t];
        let first = window.map_or(0, |w| (pos + 1).saturating_sub(w));
        let cache = caches[ci];
        let kvh = h / group;
        let qh = &q[t * qd + h * hd..t * qd + (h + 1) * hd];
        // A sliding-window layer's ring may hold the window in two runs of slots; each
        // position's score and weight are the same however the runs are cut.
        let [near, far] = cache.slot_ranges(li, first..pos + 1);
        let keys = |slots: std::ops::Range<usize>| {
            move |i| &cache.key_row(li, kvh * hd + i)[slots.clone()]
        };
        let slot = |p: usize| match p.checked_sub(near.len()) {
            None => near.start + p,
            Some(past) => far.start + past,
        };
        SCORES.with_borrow_mut(|sc| {
            sc.clear();
            sc.resize(pos + 1 - first, 0.0);
            let (near_scores, far_scores) = sc.split_at_mut(near.len());
            attention_scores(qh, keys(near.clone()), scale, near_scores);
            if !far.is_empty() {
                attention_scores(qh, keys(far.clone()), scale, far_scores);
            }
            softmax(sc);
            sc.iter_mut().for_each(|p| *p = round_to_f16(*p));
            let value = |p| &cache.value_slot(li, slot(p))[kvh * hd..(kvh + 1) * hd];
            weighted_values(sc, value, out);
        });
    };
    crate::parallel::for_each(out.chunks_mut(hd).enumerate().collect(), attend);
}

thread_local! {
    /// One head's scores, kept per thread so a pass allocates none per (row, head).
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Positions summed in registers at a time by [`attention_scores`]: four AVX vectors, the
/// fastest of the block sizes tried (more spill, fewer leave the adds' latency exposed).
const SCORE_BLOCK: usize = 32;

/// Dimensions summed in registers at a time by [`weighted_values`]: eight AVX vectors, one
/// head of 64, faster than one position at a time.
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
/// x86-64 target has SSE2's four lanes only, and AVX2's eight are faster (an AVX-512 copy was
/// not, with 32 or 128 positions a block, and 64 spilled). Rust never
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

/// The body of [`weighted_values`], inlined into a copy per instruction set, as [`scores`].
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
