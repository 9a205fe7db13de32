//! The browser boundary: `#[wasm_bindgen]` exports that the npm package wraps.
//!
//! Thin on purpose: routing logic lives in `straddle-router`, generation in
//! `straddle-engine`; this file converts between them and JavaScript values.

use wasm_bindgen::prelude::*;

/// The package version, so the JS side can report `model_versions`.
#[wasm_bindgen]
pub fn version() -> String {
    env!("CARGO_PKG_VERSION").to_string()
}

/// Scans `text` for personal data and returns the entity classes found (never the values).
#[wasm_bindgen(js_name = piiKinds)]
pub fn pii_kinds(text: &str) -> Vec<String> {
    pii_kind_names(text)
}

fn pii_kind_names(text: &str) -> Vec<String> {
    let mut kinds: Vec<String> = straddle_router::pii::detect(text)
        .into_iter()
        .filter_map(|s| serde_json::to_value(s.kind).ok())
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect();
    kinds.dedup();
    kinds
}

/// What this browser offers for on-device inference.
#[wasm_bindgen(getter_with_clone)]
pub struct DeviceInfo {
    /// Whether `navigator.gpu` returned an adapter.
    pub webgpu: bool,
    /// The adapter's largest storage buffer, in bytes (0 without WebGPU).
    pub max_storage_buffer_bytes: f64,
    /// The adapter's invocation limit per workgroup (0 without WebGPU).
    pub max_invocations_per_workgroup: u32,
}

/// Probes WebGPU: requests an adapter and reads the limits the engine must respect.
///
/// Uses reflection rather than web-sys's WebGPU bindings, which need an unstable cfg flag.
#[cfg(target_arch = "wasm32")]
#[wasm_bindgen(js_name = probeDevice)]
pub async fn probe_device() -> DeviceInfo {
    let none = DeviceInfo {
        webgpu: false,
        max_storage_buffer_bytes: 0.0,
        max_invocations_per_workgroup: 0,
    };
    let get = |obj: &JsValue, key: &str| {
        js_sys::Reflect::get(obj, &JsValue::from_str(key)).unwrap_or(JsValue::UNDEFINED)
    };
    let navigator = get(&js_sys::global().into(), "navigator");
    let gpu = get(&navigator, "gpu");
    let Some(request) = get(&gpu, "requestAdapter")
        .dyn_ref::<js_sys::Function>()
        .cloned()
    else {
        return none;
    };
    let Ok(promise) = request
        .call0(&gpu)
        .and_then(|p| p.dyn_into::<js_sys::Promise>())
    else {
        return none;
    };
    let adapter = match wasm_bindgen_futures::JsFuture::from(promise).await {
        Ok(a) if !a.is_null() && !a.is_undefined() => a,
        _ => return none,
    };
    let limits = get(&adapter, "limits");
    DeviceInfo {
        webgpu: true,
        max_storage_buffer_bytes: get(&limits, "maxStorageBufferBindingSize")
            .as_f64()
            .unwrap_or(0.0),
        max_invocations_per_workgroup: get(&limits, "maxComputeInvocationsPerWorkgroup")
            .as_f64()
            .unwrap_or(0.0) as u32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pii_kinds_names_classes_not_values() {
        assert_eq!(pii_kind_names("write to a@b.io"), vec!["email".to_string()]);
        assert!(pii_kind_names("nothing here").is_empty());
    }
}
