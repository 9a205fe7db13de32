//! The key/value cache: one f32 slab per layer, sized once from the caller's context limit,
//! holding each key and value rounded to f16 (llama.cpp's default cache type, whose
//! rounding the attention matches; see `attention.rs`).
//!
//! Values are stored position by position; keys dimension by dimension (`[kv_dim][slots]`),
//! so a query's scores against every position are `kv_dim` passes over contiguous rows,
//! each adding one product per position — vector-wide, in the same order as a dot product.
//!
//! A sliding-window layer (Gemma 3's local layers) attends only to its last `window`
//! positions, so its slab is a ring of `window + PASS_ROWS` slots: position `p` lives in slot
//! `p % slots`. The extra rows let a pass write all its keys before any of its rows attends,
//! and let a rejected draft be rewound, without overwriting a position still in a window.
//! Until a sequence outgrows its ring the layout is the plain one.

use crate::qmatrix::{round_slice_to_f16, round_to_f16};

/// The most rows of one sequence a forward pass may add when the model has sliding-window
/// layers (longer passes are split): the slack of their rings beyond the window.
pub(crate) const PASS_ROWS: usize = 128;

/// The most slots a layer with sliding window `window` ever holds: its window plus one pass's
/// rows, or every position (`usize::MAX`) for a global layer. The device cache sizes its
/// rings by this too.
pub(crate) fn ring(window: Option<usize>) -> usize {
    window.map_or(usize::MAX, |w| w.saturating_add(PASS_ROWS))
}

/// The slots of a ring of `slots` that hold `positions` (at most `slots` of them), in order:
/// one run, or two where they wrap around (the second then starts at slot 0).
pub(crate) fn slot_runs(
    slots: usize,
    positions: std::ops::Range<usize>,
) -> [std::ops::Range<usize>; 2] {
    let (first, count) = (positions.start % slots.max(1), positions.len());
    if first + count <= slots {
        [first..first + count, 0..0]
    } else {
        [first..slots, 0..first + count - slots]
    }
}

/// Keys and values of every position seen so far, per layer.
#[derive(Debug, Clone)]
pub struct KvCache {
    /// Per layer, `kv_dim` rows of `slots(layer)` positions.
    keys: Vec<Vec<f32>>,
    /// Per layer, `slots(layer)` rows of `kv_dim` values.
    values: Vec<Vec<f32>>,
    /// Per layer, the most slots it ever holds: its ring, or `usize::MAX` for every position.
    rings: Vec<usize>,
    kv_dim: usize,
    capacity: usize,
    len: usize,
    /// The final hidden state (what the output head reads) of the last position whose logits
    /// a pass computed; empty when there is none, or the positions after it were forgotten.
    state: Vec<f32>,
}

impl KvCache {
    /// A cache for `capacity` positions of `kv_dim` floats in each of `layers` layers.
    pub fn new(layers: usize, capacity: usize, kv_dim: usize) -> Self {
        Self::with_windows(&vec![None; layers], capacity, kv_dim)
    }

    /// A cache whose layer `l` keeps only the last `windows[l]` positions (plus a pass's rows)
    /// where that is `Some`.
    pub fn with_windows(windows: &[Option<usize>], capacity: usize, kv_dim: usize) -> Self {
        let rings: Vec<usize> = windows.iter().map(|&w| ring(w)).collect();
        let slots = |ring: &usize| capacity.min(*ring) * kv_dim;
        Self {
            keys: rings.iter().map(|r| vec![0.0; slots(r)]).collect(),
            values: rings.iter().map(|r| vec![0.0; slots(r)]).collect(),
            rings,
            kv_dim,
            capacity,
            len: 0,
            state: Vec::new(),
        }
    }

    /// Positions filled.
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

    /// Bytes [`Self::with_windows`] allocates for these arguments, without allocating them.
    pub fn bytes_for(windows: &[Option<usize>], capacity: usize, kv_dim: usize) -> usize {
        let floats: usize = windows
            .iter()
            .map(|&w| capacity.min(ring(w)) * kv_dim)
            .sum();
        2 * floats * 4
    }

    /// Bytes allocated.
    pub fn bytes(&self) -> usize {
        let floats: usize = self.keys.iter().chain(&self.values).map(Vec::len).sum();
        floats * 4
    }

    /// Slots layer `layer` holds now.
    fn slots(&self, layer: usize) -> usize {
        self.capacity.min(self.rings[layer])
    }

    /// Grows the cache to hold at least `capacity` positions, keeping what it holds (a
    /// speculative session starts small and grows with its generation).
    pub fn reserve(&mut self, capacity: usize) {
        if capacity <= self.capacity {
            return;
        }
        for layer in 0..self.keys.len() {
            let (from, to) = (self.slots(layer), capacity.min(self.rings[layer]));
            if from == to {
                continue;
            }
            // A layer that can still grow has not wrapped: position p is in slot p.
            self.keys[layer] = relayout(&self.keys[layer], self.kv_dim, from, to, self.len);
            self.values[layer].resize(to * self.kv_dim, 0.0);
        }
        self.capacity = capacity;
    }

    /// Forgets positions from `len` on (after a rejected speculative draft, or a new prompt
    /// that shares only a prefix with the old one).
    pub fn truncate(&mut self, len: usize) {
        if len < self.len {
            self.state.clear();
        }
        self.len = self.len.min(len);
    }

    /// The final hidden state (after the output norm) at the last position whose logits the
    /// model computed: what a probe of the model's own state reads after prefill.
    pub fn last_state(&self) -> Option<&[f32]> {
        (!self.state.is_empty()).then_some(&self.state[..])
    }

    /// Keeps `state` as the last position's final hidden state.
    pub(crate) fn set_state(&mut self, state: &[f32]) {
        self.state.clear();
        self.state.extend_from_slice(state);
    }

    /// A copy of the first `n` positions in a cache of exactly that capacity, or `None`
    /// where a ring no longer holds what the copy's layers need (a window before `n` that
    /// later positions overwrote).
    pub fn prefix(&self, n: usize) -> Option<KvCache> {
        let n = n.min(self.len);
        let mut copy = KvCache {
            keys: Vec::with_capacity(self.keys.len()),
            values: Vec::with_capacity(self.keys.len()),
            rings: self.rings.clone(),
            kv_dim: self.kv_dim,
            capacity: n,
            len: n,
            state: Vec::new(),
        };
        for layer in 0..self.keys.len() {
            let (from, to) = (self.slots(layer), copy.slots(layer));
            // The positions the copy keeps, and whether this cache still holds them.
            let kept = n - to..n;
            if kept.start < self.len.saturating_sub(from) {
                return None;
            }
            let mut keys = vec![0.0; to * self.kv_dim];
            let mut values = vec![0.0; to * self.kv_dim];
            for p in kept {
                let (src, dst) = (p % from, p % to);
                for c in 0..self.kv_dim {
                    keys[c * to + dst] = self.keys[layer][c * from + src];
                }
                values[dst * self.kv_dim..(dst + 1) * self.kv_dim]
                    .copy_from_slice(self.value(layer, p));
            }
            copy.keys.push(keys);
            copy.values.push(values);
        }
        Some(copy)
    }

    /// Writes position `pos`'s key and value, rounded to f16 as llama.cpp's cache holds them.
    pub(crate) fn write(&mut self, layer: usize, pos: usize, k: &[f32], v: &[f32]) {
        let slots = self.slots(layer);
        let slot = pos % slots;
        let keys = &mut self.keys[layer];
        for (c, &kc) in k.iter().enumerate() {
            keys[c * slots + slot] = round_to_f16(kc);
        }
        let values = &mut self.values[layer][slot * self.kv_dim..(slot + 1) * self.kv_dim];
        values.copy_from_slice(v);
        round_slice_to_f16(values);
    }

    /// The slots that hold `positions`, in order: one range, or two where the positions
    /// wrap around a ring (the second then starts at slot 0).
    pub(crate) fn slot_ranges(
        &self,
        layer: usize,
        positions: std::ops::Range<usize>,
    ) -> [std::ops::Range<usize>; 2] {
        slot_runs(self.slots(layer), positions)
    }

    /// Key dimension `c` (of `kv_dim`) in every slot.
    #[cfg(test)]
    fn key_row(&self, layer: usize, c: usize) -> &[f32] {
        let slots = self.slots(layer);
        &self.keys[layer][c * slots..(c + 1) * slots]
    }

    /// The values in slot `slot`.
    pub(crate) fn value_slot(&self, layer: usize, slot: usize) -> &[f32] {
        &self.values[layer][slot * self.kv_dim..(slot + 1) * self.kv_dim]
    }

    /// Key dimensions `channels`, each a row of every slot: the rows and their length.
    pub(crate) fn key_rows(
        &self,
        layer: usize,
        channels: std::ops::Range<usize>,
    ) -> (&[f32], usize) {
        let slots = self.slots(layer);
        (
            &self.keys[layer][channels.start * slots..channels.end * slots],
            slots,
        )
    }

    /// The values in slots `slots`, a row of `kv_dim` each.
    pub(crate) fn value_rows(&self, layer: usize, slots: std::ops::Range<usize>) -> &[f32] {
        &self.values[layer][slots.start * self.kv_dim..slots.end * self.kv_dim]
    }

    /// Floats in one position's key or value.
    pub(crate) fn kv_dim(&self) -> usize {
        self.kv_dim
    }

    /// The values of position `pos`.
    pub(crate) fn value(&self, layer: usize, pos: usize) -> &[f32] {
        self.value_slot(layer, pos % self.slots(layer))
    }

    pub(crate) fn advance(&mut self, n: usize) {
        self.len += n;
    }
}

/// A key slab of `kv_dim` rows of `from` positions copied into rows of `to` positions,
/// keeping the first `keep` positions of each.
fn relayout(slab: &[f32], kv_dim: usize, from: usize, to: usize, keep: usize) -> Vec<f32> {
    let keep = keep.min(from).min(to);
    let mut out = vec![0.0; kv_dim * to];
    for (dst, src) in out
        .chunks_exact_mut(to.max(1))
        .zip(slab.chunks_exact(from.max(1)))
    {
        dst[..keep].copy_from_slice(&src[..keep]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Key dimension `c` of position `p` in the test pattern.
    fn key(p: usize, c: usize) -> f32 {
        (p * 10 + c) as f32
    }

    fn filled(capacity: usize, positions: usize) -> KvCache {
        let mut cache = KvCache::new(2, capacity, 3);
        for p in 0..positions {
            let k: Vec<f32> = (0..3).map(|c| key(p, c)).collect();
            let v: Vec<f32> = k.iter().map(|x| -x).collect();
            for layer in 0..2 {
                cache.write(layer, p, &k, &v);
            }
            cache.advance(1);
        }
        cache
    }

    fn assert_holds(cache: &KvCache, positions: usize) {
        for layer in 0..2 {
            for c in 0..3 {
                let row = cache.key_row(layer, c);
                assert_eq!(row.len(), cache.capacity());
                for (p, &k) in row.iter().enumerate().take(positions) {
                    assert_eq!(k, key(p, c), "layer {layer} dim {c} position {p}");
                    assert_eq!(cache.value(layer, p)[c], -key(p, c));
                }
            }
        }
    }

    #[test]
    fn keys_by_dimension_survive_growth_and_prefixes() {
        let mut cache = filled(4, 4);
        assert_holds(&cache, 4);
        cache.reserve(9);
        assert_eq!(cache.capacity(), 9);
        assert_holds(&cache, 4);
        let prefix = cache.prefix(3).expect("every position is held");
        assert_eq!((prefix.len(), prefix.capacity()), (3, 3));
        assert_holds(&prefix, 3);
    }

    /// The keys and values layer `layer` gives for `positions`, read through the slots.
    fn read(cache: &KvCache, layer: usize, positions: std::ops::Range<usize>) -> Vec<f32> {
        let [near, far] = cache.slot_ranges(layer, positions.clone());
        let keys = (0..3).flat_map(|c| {
            let row = cache.key_row(layer, c);
            row[near.clone()].iter().chain(&row[far.clone()]).copied()
        });
        let values = positions.flat_map(|p| cache.value(layer, p).to_vec());
        keys.chain(values).collect()
    }

    fn expected(positions: std::ops::Range<usize>) -> Vec<f32> {
        let keys = (0..3).flat_map(|c| positions.clone().map(move |p| key(p, c)));
        let values = positions
            .clone()
            .flat_map(|p| (0..3).map(move |c| -key(p, c)));
        keys.chain(values).collect()
    }

    #[test]
    fn a_window_layer_keeps_its_window_in_a_ring_and_the_other_every_position() {
        let window = 5;
        let ring = window + PASS_ROWS;
        let mut cache = KvCache::with_windows(&[Some(window), None], 40, 3);
        for p in 0..40 {
            let k: Vec<f32> = (0..3).map(|c| key(p, c)).collect();
            let v: Vec<f32> = k.iter().map(|x| -x).collect();
            cache.write(0, p, &k, &v);
            cache.write(1, p, &k, &v);
            cache.advance(1);
        }
        // Short of its ring, a window layer is laid out like any other.
        assert_eq!(read(&cache, 0, 0..40), expected(0..40));
        // Grown past it, the ring wraps, and a window across the seam reads in order.
        cache.reserve(ring + 60);
        for p in 40..ring + 60 {
            let k: Vec<f32> = (0..3).map(|c| key(p, c)).collect();
            let v: Vec<f32> = k.iter().map(|x| -x).collect();
            cache.write(0, p, &k, &v);
            cache.write(1, p, &k, &v);
            cache.advance(1);
        }
        let last = cache.len();
        assert_eq!(
            read(&cache, 0, last - window..last),
            expected(last - window..last)
        );
        assert_eq!(read(&cache, 1, 0..last), expected(0..last));
        assert_eq!(cache.bytes(), 2 * 4 * 3 * (ring + last));
        // A copy of the whole keeps the ring's positions; an early one is no longer there.
        let whole = cache
            .prefix(last)
            .expect("the ring holds the last positions");
        assert_eq!(
            read(&whole, 0, last - window..last),
            expected(last - window..last)
        );
        assert!(cache.prefix(10).is_none(), "position 0 was overwritten");
    }
}
