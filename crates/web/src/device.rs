//! Probing the browser for what on-device inference can use.

use wasm_bindgen::prelude::*;

/// What this browser offers for on-device inference.
#[wasm_bindgen(getter_with_clone)]
pub struct DeviceInfo {
    /// Whether `navigator.gpu` returned an adapter.
    pub webgpu: bool,
    /// The adapter's largest storage buffer binding, in bytes (0 without WebGPU).
    pub max_storage_buffer_bytes: f64,
    /// The adapter's largest buffer, in bytes (0 without WebGPU).
    pub max_buffer_bytes: f64,
    /// The adapter's invocation limit per workgroup (0 without WebGPU).
    pub max_invocations_per_workgroup: u32,
    /// Whether the adapter is a software fallback (SwiftShader and the like): there our wasm
    /// CPU kernels are far faster than GPU-shaped kernels run on the CPU.
    pub software: bool,
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
        max_buffer_bytes: 0.0,
        max_invocations_per_workgroup: 0,
        software: false,
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
    // `adapter.info.isFallbackAdapter` in current Chromium, `adapter.isFallbackAdapter` before;
    // the adapter's names catch software rasterisers that do not flag themselves.
    let info = get(&adapter, "info");
    let names: String = ["vendor", "architecture", "device", "description"]
        .iter()
        .filter_map(|&k| get(&info, k).as_string())
        .collect::<Vec<_>>()
        .join(" ")
        .to_ascii_lowercase();
    let software = get(&info, "isFallbackAdapter").as_bool() == Some(true)
        || get(&adapter, "isFallbackAdapter").as_bool() == Some(true)
        || ["swiftshader", "llvmpipe", "lavapipe", "software"]
            .iter()
            .any(|&s| names.contains(s));
    DeviceInfo {
        webgpu: true,
        software,
        max_storage_buffer_bytes: get(&limits, "maxStorageBufferBindingSize")
            .as_f64()
            .unwrap_or(0.0),
        max_buffer_bytes: get(&limits, "maxBufferSize").as_f64().unwrap_or(0.0),
        max_invocations_per_workgroup: get(&limits, "maxComputeInvocationsPerWorkgroup")
            .as_f64()
            .unwrap_or(0.0) as u32,
    }
}
