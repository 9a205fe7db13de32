//! The threaded build's pool: Web Workers that instantiate this same module over its shared
//! memory and join the engine's fork-join pool (`straddle_engine::parallel::pool`), so the
//! CPU kernels use every core as they do natively.

use straddle_engine::parallel::pool;
use wasm_bindgen::prelude::*;

/// `[module, memory]`: what a pool Web Worker instantiates the package with.
#[wasm_bindgen(js_name = poolShared)]
pub fn pool_shared() -> js_sys::Array {
    js_sys::Array::of2(&wasm_bindgen::module(), &wasm_bindgen::memory())
}

/// Makes the calling Web Worker one of the pool's threads; never returns.
#[wasm_bindgen(js_name = joinPool)]
pub fn join_pool() {
    pool::join()
}

/// Threads the CPU kernels run on: the engine's Web Worker and the pool workers that joined.
#[wasm_bindgen(js_name = poolThreads)]
pub fn pool_threads() -> usize {
    pool::threads()
}
