//! The browser boundary: `#[wasm_bindgen]` exports that the npm package wraps.
//!
//! Thin on purpose: routing logic lives in `straddle-router`, generation in
//! `straddle-engine`; these modules convert between them and JavaScript values.

use wasm_bindgen::prelude::*;

mod device;
mod engine;
mod memory;
mod routing;
mod speculate;
#[cfg(all(target_arch = "wasm32", feature = "threads"))]
mod threads;

pub use device::DeviceInfo;
#[cfg(target_arch = "wasm32")]
pub use device::probe_device;
pub use engine::{EdgeEngine, Generation, ModelBuffer};
pub use memory::{MemoryPlan, plan_memory};
pub use routing::{
    Cascade, Learner, Redacted, ReidentifyStream, first_token, pii_kinds, policy_preset, redact,
    redact_all, route, router_version,
};

// Some dependency registers static constructors. Unless the module calls them itself,
// wasm-ld wraps *every* export in a call to `__wasm_call_ctors` (its "command" model): each
// call into the package re-ran them, which cost more than the routing decision itself.
// Calling them once at start-up makes it a reactor.
#[cfg(target_arch = "wasm32")]
unsafe extern "C" {
    fn __wasm_call_ctors();
}

#[cfg(target_arch = "wasm32")]
#[wasm_bindgen(start)]
fn start() {
    run_constructors_once();
}

/// Runs the module's static constructors (burn's kernel registry is filled by them), once.
/// The start function calls it; wasm-bindgen-test does not run start functions, so tests
/// that use the engine call it themselves.
#[cfg(target_arch = "wasm32")]
pub fn run_constructors_once() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    // SAFETY: wasm-ld synthesizes this function; it runs each constructor, and the `Once`
    // keeps it to a single run before the engine is used.
    ONCE.call_once(|| unsafe { __wasm_call_ctors() });
}

/// The package version, so the JS side can report `model_versions`.
#[wasm_bindgen]
pub fn version() -> String {
    env!("CARGO_PKG_VERSION").to_string()
}
