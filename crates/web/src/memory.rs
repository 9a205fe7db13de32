//! What a model needs in memory, from the first bytes of its file: the page's check before
//! it downloads the rest.

use straddle_engine::MemoryNeed;
use straddle_engine::gguf::Gguf;
use wasm_bindgen::prelude::*;

/// What a model needs at the context chosen for it, in bytes.
#[wasm_bindgen]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MemoryPlan {
    /// Positions its KV cache holds: the longest wanted that fits the budget, or the
    /// shortest tried when none does.
    pub context: u32,
    /// The file, held while the weights are laid out from it.
    pub file: f64,
    /// The weights as the engine keeps them.
    pub weights: f64,
    /// The KV cache at `context` positions.
    #[wasm_bindgen(js_name = kvCache)]
    pub kv_cache: f64,
    /// One pass over the whole context.
    pub scratch: f64,
    /// The largest single GPU buffer.
    #[wasm_bindgen(js_name = largestBuffer)]
    pub largest_buffer: f64,
    /// All of it at once: the most the page holds while it loads and runs the model.
    pub total: f64,
}

/// The plan for the model whose file (`file_bytes` long) begins with `head`: the longest
/// context from `wanted` down (halving) whose need is at most `budget` bytes, or the
/// shortest tried. `undefined` when `head` ends before the header does: read more. An error
/// names a file that is not a model the engine runs.
#[wasm_bindgen(js_name = planMemory)]
pub fn plan_memory(
    head: Vec<u8>,
    file_bytes: f64,
    wanted: u32,
    budget: f64,
) -> Result<Option<MemoryPlan>, JsError> {
    let refuse = |e: &dyn std::fmt::Display| JsError::new(&e.to_string());
    let Some(g) = Gguf::read_prefix(head, file_bytes as u64).map_err(|e| refuse(&e))? else {
        return Ok(None);
    };
    let need = MemoryNeed::fitting(&g, wanted as usize, budget as u64).map_err(|e| refuse(&e))?;
    Ok(Some(MemoryPlan {
        context: need.context as u32,
        file: need.file as f64,
        weights: need.weights as f64,
        kv_cache: need.kv_cache as f64,
        scratch: need.scratch as f64,
        largest_buffer: need.largest_buffer as f64,
        total: need.total() as f64,
    }))
}
