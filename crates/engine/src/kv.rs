//! The key/value cache: one f32 slab per layer, sized once from the caller's context limit.

/// Keys and values of every position seen so far, per layer.
#[derive(Debug, Clone)]
pub struct KvCache {
    keys: Vec<Vec<f32>>,
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
        for slab in self.keys.iter_mut().chain(self.values.iter_mut()) {
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
            keys: self.keys.iter().map(|k| k[..rows].to_vec()).collect(),
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
            dst[..rows].copy_from_slice(&src[..rows]);
        }
        for (dst, src) in self.values.iter_mut().zip(&other.values) {
            dst[..rows].copy_from_slice(&src[..rows]);
        }
        self.len = n;
    }

    pub(crate) fn write(&mut self, layer: usize, pos: usize, k: &[f32], v: &[f32]) {
        let r = pos * self.kv_dim..(pos + 1) * self.kv_dim;
        self.keys[layer][r.clone()].copy_from_slice(k);
        self.values[layer][r].copy_from_slice(v);
    }

    pub(crate) fn key(&self, layer: usize, pos: usize) -> &[f32] {
        &self.keys[layer][pos * self.kv_dim..(pos + 1) * self.kv_dim]
    }

    pub(crate) fn value(&self, layer: usize, pos: usize) -> &[f32] {
        &self.values[layer][pos * self.kv_dim..(pos + 1) * self.kv_dim]
    }

    pub(crate) fn advance(&mut self, n: usize) {
        self.len += n;
    }
}
