//! What a model needs in memory, read from its GGUF header alone: a page checks it against
//! the device before it downloads anything, and picks a shorter context where that fits and
//! the longer one does not.

use straddle_gguf::{ByteSource, Gguf, TensorInfo};

use crate::config::{Config, ModelError};
use crate::kv::KvCache;

/// The fewest positions a context is cut to before a model is refused instead.
pub const MIN_CONTEXT: usize = 256;

/// Values one part of a weight matrix on a GPU may hold (a larger matrix is split into parts
/// of whole rows): its largest form (f32) then fits in 96 MiB, under the 128 MiB that WebGPU
/// guarantees one storage buffer (Mesa's lavapipe grants no more).
pub(crate) const DEVICE_PART_VALUES: usize = 24 << 20;

/// Bytes a model needs to run with a context of `context` positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryNeed {
    /// Positions the KV cache holds.
    pub context: usize,
    /// The file: its bytes are held while the weights are laid out from them, and memory a
    /// wasm module has grown to is never given back.
    pub file: u64,
    /// The weights as the engine keeps them: quantized, at the file's size.
    pub weights: u64,
    /// The KV cache at `context` positions.
    pub kv_cache: u64,
    /// One pass over a whole context: its activations and the logits.
    pub scratch: u64,
    /// The largest single GPU buffer: a part of a weight matrix, or one layer's keys.
    pub largest_buffer: u64,
}

impl MemoryNeed {
    /// What the model of header `g` needs at `context` positions (at most its trained
    /// context).
    pub fn of<S: ByteSource>(g: &Gguf<S>, context: usize) -> Result<Self, ModelError> {
        let c = Config::from_gguf(g)?;
        let context = context.min(c.context_length).max(1);
        let windows: Vec<Option<usize>> = (0..c.n_layers).map(|l| c.window(l)).collect();
        let kv_cache = KvCache::bytes_for(&windows, context, c.kv_dim()) as u64;
        let activations = 4 * c.dim + 3 * c.ffn_dim + c.n_heads * context;
        let scratch = (context * activations + c.vocab) as u64 * 4;
        let weights: u64 = g.tensors.iter().map(|t| t.size).sum();
        let largest_part = g.tensors.iter().map(device_part_bytes).max().unwrap_or(0);
        let layer_keys = (context * c.kv_dim() * 4) as u64;
        Ok(Self {
            context,
            file: g.source().len(),
            weights,
            kv_cache,
            scratch,
            largest_buffer: largest_part.max(layer_keys),
        })
    }

    /// The most memory the page holds at once while it loads and runs the model.
    pub fn total(&self) -> u64 {
        self.file + self.weights + self.kv_cache + self.scratch
    }

    /// The need at the longest context, from `wanted` halved down to [`MIN_CONTEXT`], that
    /// is at most `budget` bytes; when none is, the need at the shortest tried, whose
    /// [`Self::total`] says by how much it is over.
    pub fn fitting<S: ByteSource>(
        g: &Gguf<S>,
        wanted: usize,
        budget: u64,
    ) -> Result<Self, ModelError> {
        let mut context = wanted;
        loop {
            let need = Self::of(g, context)?;
            if need.total() <= budget || context <= MIN_CONTEXT {
                return Ok(need);
            }
            context = (context / 2).max(MIN_CONTEXT);
        }
    }
}

/// The bytes of the largest part a GPU holds of tensor `t`, in its largest form (f32).
fn device_part_bytes(t: &TensorInfo) -> u64 {
    let row_values = t.shape.first().copied().unwrap_or(1).max(1);
    let rows = t.shape.iter().skip(1).product::<u64>().max(1);
    let rows_per_part = (DEVICE_PART_VALUES as u64 / row_values).clamp(1, rows);
    rows_per_part * row_values * 4
}
