//! The key/value cache: one f32 slab per layer, sized once from the caller's context limit.
//!
//! Values are stored position by position; keys dimension by dimension (`[kv_dim][capacity]`),
//! so a query's scores against every position are `kv_dim` passes over contiguous rows,
//! each adding one product per position — vector-wide, in the same order as a dot product.

/// Keys and values of every position seen so far, per layer.
#[derive(Debug, Clone)]
pub struct KvCache {
    /// Per layer, `kv_dim` rows of `capacity` positions.
    keys: Vec<Vec<f32>>,
    /// Per layer, `capacity` rows of `kv_dim` values.
    values: Vec<Vec<f32>>,
    kv_dim: usize,
    capacity: usize,
    len: usize,
}

impl KvCache {
    /// A cache for `capacity` positions of `kv_dim` floats in each of `layers` layers.
    pub fn new(layers: usize, capacity: usize, kv_dim: usize) -> Self {
        Self {
            keys: (0..layers).map(|_| vec![0.0; capacity * kv_dim]).collect(),
            values: (0..layers).map(|_| vec![0.0; capacity * kv_dim]).collect(),
            kv_dim,
            capacity,
            len: 0,
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

    /// Bytes allocated.
    pub fn bytes(&self) -> usize {
        2 * self.keys.len() * self.capacity * self.kv_dim * 4
    }

    /// Grows the cache to hold at least `capacity` positions, keeping what it holds (a
    /// speculative session starts small and grows with its generation).
    pub fn reserve(&mut self, capacity: usize) {
        if capacity <= self.capacity {
            return;
        }
        for slab in self.keys.iter_mut() {
            *slab = relayout(slab, self.kv_dim, self.capacity, capacity, self.len);
        }
        for slab in self.values.iter_mut() {
            slab.resize(capacity * self.kv_dim, 0.0);
        }
        self.capacity = capacity;
    }

    /// Forgets positions from `len` on (after a rejected speculative draft, or a new prompt
    /// that shares only a prefix with the old one).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// A copy of the first `n` positions, in a cache of exactly that capacity.
    pub fn prefix(&self, n: usize) -> KvCache {
        let n = n.min(self.len);
        let rows = n * self.kv_dim;
        KvCache {
            keys: self
                .keys
                .iter()
                .map(|k| relayout(k, self.kv_dim, self.capacity, n, n))
                .collect(),
            values: self.values.iter().map(|v| v[..rows].to_vec()).collect(),
            kv_dim: self.kv_dim,
            capacity: n,
            len: n,
        }
    }

    /// Replaces what this cache holds with the first `n` positions of `other` (a prompt
    /// prefix computed before, for the same model).
    pub fn start_from(&mut self, other: &KvCache, n: usize) {
        let n = n.min(other.len).min(self.capacity);
        let rows = n * self.kv_dim;
        for (dst, src) in self.keys.iter_mut().zip(&other.keys) {
            for (d, s) in dst
                .chunks_exact_mut(self.capacity)
                .zip(src.chunks_exact(other.capacity))
            {
                d[..n].copy_from_slice(&s[..n]);
            }
        }
        for (dst, src) in self.values.iter_mut().zip(&other.values) {
            dst[..rows].copy_from_slice(&src[..rows]);
        }
        self.len = n;
    }

    pub(crate) fn write(&mut self, layer: usize, pos: usize, k: &[f32], v: &[f32]) {
        let keys = &mut self.keys[layer];
        for (c, &kc) in k.iter().enumerate() {
            keys[c * self.capacity + pos] = kc;
        }
        self.values[layer][pos * self.kv_dim..(pos + 1) * self.kv_dim].copy_from_slice(v);
    }

    /// Key dimension `c` (of `kv_dim`) at every position the cache can hold.
    pub(crate) fn key_row(&self, layer: usize, c: usize) -> &[f32] {
        &self.keys[layer][c * self.capacity..(c + 1) * self.capacity]
    }

    pub(crate) fn value(&self, layer: usize, pos: usize) -> &[f32] {
        &self.values[layer][pos * self.kv_dim..(pos + 1) * self.kv_dim]
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
    fn keys_by_dimension_survive_growth_prefixes_and_restarts() {
        let mut cache = filled(4, 4);
        assert_holds(&cache, 4);
        cache.reserve(9);
        assert_eq!(cache.capacity(), 9);
        assert_holds(&cache, 4);
        let prefix = cache.prefix(3);
        assert_eq!((prefix.len(), prefix.capacity()), (3, 3));
        assert_holds(&prefix, 3);
        let mut other = KvCache::new(2, 16, 3);
        other.start_from(&cache, 2);
        assert_eq!(other.len(), 2);
        assert_holds(&other, 2);
    }
}
