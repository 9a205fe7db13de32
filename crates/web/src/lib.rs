//! The browser boundary: `#[wasm_bindgen]` exports that the npm package wraps.
//!
//! Thin on purpose: routing logic lives in `straddle-router`, generation in
//! `straddle-engine`; these modules convert between them and JavaScript values.

use wasm_bindgen::prelude::*;

mod device;
mod engine;
mod routing;

pub use device::DeviceInfo;
#[cfg(target_arch = "wasm32")]
pub use device::probe_device;
pub use engine::{EdgeEngine, Generation, ModelBuffer};
pub use routing::{
    Cascade, Learner, Redacted, ReidentifyStream, pii_kinds, policy_preset, redact, redact_all,
    route, router_version,
};

/// The package version, so the JS side can report `model_versions`.
#[wasm_bindgen]
pub fn version() -> String {
    env!("CARGO_PKG_VERSION").to_string()
}
