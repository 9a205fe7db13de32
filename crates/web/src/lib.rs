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
    // In order of first appearance, each class once (spans of one class need not be adjacent).
    let mut kinds: Vec<String> = Vec::new();
    for span in straddle_router::pii::detect(text) {
        let name = span.kind.as_str();
        if !kinds.iter().any(|k| k == name) {
            kinds.push(name.to_string());
        }
    }
    kinds
}

/// Decides where a prompt should run: `context_json` is a router `Context`, `policy_json`
/// a `Policy` (the default when absent). Returns the `Decision` as JSON, trace included.
#[wasm_bindgen]
pub fn route(
    prompt: &str,
    max_tokens: Option<u32>,
    context_json: &str,
    policy_json: Option<String>,
) -> Result<String, JsError> {
    route_json(prompt, max_tokens, context_json, policy_json.as_deref())
        .map_err(|e| JsError::new(&e))
}

fn route_json(
    prompt: &str,
    max_tokens: Option<u32>,
    context_json: &str,
    policy_json: Option<&str>,
) -> Result<String, String> {
    use straddle_router::policy::{self, Context, Policy};
    let ctx: Context =
        serde_json::from_str(context_json).map_err(|e| format!("invalid context: {e}"))?;
    let policy = match policy_json {
        Some(p) => Policy::from_json(p).map_err(|e| e.to_string())?,
        None => Policy::default(),
    };
    serde_json::to_string(&policy::decide(prompt, max_tokens, &ctx, &policy))
        .map_err(|e| e.to_string())
}

/// A prompt with its personal data replaced by typed placeholders (`[EMAIL_1]`) for upload;
/// the originals stay inside this object, on the device.
#[wasm_bindgen]
pub struct Redacted {
    inner: straddle_router::redact::Redaction,
}

#[wasm_bindgen]
impl Redacted {
    /// The text to send to the cloud.
    #[wasm_bindgen(getter)]
    pub fn text(&self) -> String {
        self.inner.text.clone()
    }

    /// The placeholders used, in order (no values).
    pub fn placeholders(&self) -> Vec<String> {
        self.inner.placeholders().map(str::to_string).collect()
    }

    /// Puts the originals back into the cloud's whole answer.
    pub fn reidentify(&self, answer: &str) -> String {
        self.inner.reidentify(answer)
    }

    /// A re-identifier for an answer that streams in: `push(chunk)` returns the text safe to
    /// show (never half a placeholder), `finish()` the rest.
    pub fn stream(&self) -> ReidentifyStream {
        ReidentifyStream {
            inner: self.inner.stream(),
        }
    }
}

/// Re-identifies a streamed answer chunk by chunk.
#[wasm_bindgen]
pub struct ReidentifyStream {
    inner: straddle_router::redact::StreamReidentifier,
}

#[wasm_bindgen]
impl ReidentifyStream {
    /// Takes the next chunk; returns what is now safe to show.
    pub fn push(&mut self, chunk: &str) -> String {
        self.inner.push(chunk)
    }

    /// Ends the stream; returns whatever was held back.
    pub fn finish(&mut self) -> String {
        self.inner.finish()
    }
}

/// Redacts the personal data in `text` whose classes are listed in `kinds` (wire names such
/// as `"email"`, `"payment_card"`; empty = every class).
#[wasm_bindgen]
pub fn redact(text: &str, kinds: Vec<String>) -> Redacted {
    Redacted {
        inner: straddle_router::redact::redact(text, |k| {
            kinds.is_empty() || kinds.iter().any(|n| n == k.as_str())
        }),
    }
}

/// Where the on-device model runs.
enum Backend {
    /// burn on WebGPU: the weights stay quantized in GPU memory.
    WebGpu(Box<straddle_engine::DeviceEngine>),
    /// Our wasm-SIMD CPU kernels, for browsers without WebGPU.
    Cpu(Box<straddle_engine::Engine>),
}

/// The on-device model: on WebGPU through burn when the browser has it, else on the CPU.
/// Generation is asynchronous on both; on the CPU it still occupies the thread, so pages
/// should host the engine in a Web Worker.
#[wasm_bindgen]
pub struct EdgeEngine {
    backend: std::rc::Rc<Backend>,
}

#[wasm_bindgen]
impl EdgeEngine {
    /// Loads a GGUF model from its bytes onto the CPU backend.
    #[wasm_bindgen(constructor)]
    pub fn new(bytes: Vec<u8>) -> Result<EdgeEngine, JsError> {
        let engine = straddle_engine::Engine::load(bytes, EDGE_CONTEXT)
            .map_err(|e| JsError::new(&e.to_string()))?;
        Ok(EdgeEngine {
            backend: std::rc::Rc::new(Backend::Cpu(Box::new(engine))),
        })
    }

    /// Loads a GGUF model onto WebGPU; rejects when the browser has no usable adapter (the
    /// caller then falls back to `new EdgeEngine(bytes)`).
    #[wasm_bindgen(js_name = loadWebGpu)]
    pub async fn load_webgpu(bytes: Vec<u8>) -> Result<EdgeEngine, JsError> {
        let device = straddle_engine::Device::wgpu_options()
            .init_async()
            .await
            .map_err(|e| JsError::new(&format!("WebGPU unavailable: {e}")))?;
        let engine = straddle_engine::DeviceEngine::load(bytes, EDGE_CONTEXT, &device)
            .map_err(|e| JsError::new(&e.to_string()))?;
        Ok(EdgeEngine {
            backend: std::rc::Rc::new(Backend::WebGpu(Box::new(engine))),
        })
    }

    /// `"webgpu"` or `"cpu"`.
    pub fn backend(&self) -> String {
        match &*self.backend {
            Backend::WebGpu(_) => "webgpu".into(),
            Backend::Cpu(_) => "cpu".into(),
        }
    }

    /// Languages the model declares (GGUF `general.languages`), for the router's context.
    pub fn languages(&self) -> Vec<String> {
        match &*self.backend {
            Backend::WebGpu(e) => e.languages.clone(),
            Backend::Cpu(e) => e.languages.clone(),
        }
    }

    /// Generates a reply to `messages_json` (OpenAI-style `[{role, content}]`), calling
    /// `on_token(text, logprob, entropy)` per token; a `false` return cancels. Resolves to the
    /// completion as JSON: `{text, tokens, finish, prompt_tokens, prefill_ms, decode_ms,
    /// mean_logprob, backend}`.
    pub fn generate(
        &self,
        messages_json: String,
        max_tokens: u32,
        on_token: js_sys::Function,
    ) -> js_sys::Promise {
        let backend = self.backend.clone();
        wasm_bindgen_futures::future_to_promise(async move {
            let on_token = |text: &str, logprob: f32, entropy: f32| {
                let keep = on_token.call3(
                    &JsValue::NULL,
                    &JsValue::from_str(text),
                    &JsValue::from_f64(logprob.into()),
                    &JsValue::from_f64(entropy.into()),
                );
                !matches!(keep, Ok(v) if v == JsValue::FALSE)
            };
            generate_json(&backend, &messages_json, max_tokens, on_token)
                .await
                .map(|json| JsValue::from_str(&json))
                .map_err(|e| JsError::new(&e).into())
        })
    }
}

/// Context the browser engine is sized for: an f32 KV cache of 1,024 positions is 47 MB.
const EDGE_CONTEXT: usize = 1024;

async fn generate_json(
    backend: &Backend,
    messages_json: &str,
    max_tokens: u32,
    mut on_token: impl FnMut(&str, f32, f32) -> bool,
) -> Result<String, String> {
    use straddle_engine::{ChatMessage, Finish, Flow, GenerateParams, Prompt};
    let messages: Vec<straddle_protocol::Message> =
        serde_json::from_str(messages_json).map_err(|e| format!("invalid messages: {e}"))?;
    if messages.is_empty() {
        return Err("invalid messages: at least one message is required".into());
    }
    let msgs: Vec<ChatMessage> = messages
        .iter()
        .map(|m| ChatMessage::new(m.role.as_str(), m.content.clone()))
        .collect();
    let params = GenerateParams {
        max_tokens: max_tokens as usize,
        context: EDGE_CONTEXT,
        ..Default::default()
    };
    let stream = |ev: &straddle_engine::TokenEvent| {
        if on_token(&ev.text, ev.logprob, ev.entropy) {
            Flow::Continue
        } else {
            Flow::Cancel
        }
    };
    let (c, backend_name) = match backend {
        Backend::WebGpu(e) => (
            e.generate(Prompt::Messages(&msgs), &params, stream).await,
            "webgpu",
        ),
        Backend::Cpu(e) => (e.generate(Prompt::Messages(&msgs), &params, stream), "cpu"),
    };
    let c = c.map_err(|e| e.to_string())?;
    let finish = match c.finish {
        Finish::Stop => "stop",
        Finish::Length => "length",
        Finish::Cancelled => "cancelled",
    };
    Ok(serde_json::json!({
        "text": c.text, "tokens": c.tokens, "finish": finish, "prompt_tokens": c.prompt_tokens,
        "prefill_ms": c.prefill_ms, "decode_ms": c.decode_ms, "backend": backend_name,
        "mean_logprob": if c.logprobs.is_empty() { 0.0 } else { c.logprobs.iter().sum::<f32>() / c.logprobs.len() as f32 },
    })
    .to_string())
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
        max_invocations_per_workgroup: get(&limits, "maxComputeInvocationsPerWorkgroup")
            .as_f64()
            .unwrap_or(0.0) as u32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_returns_a_decision_with_its_trace_and_rejects_bad_context() {
        let ctx = r#"{"online":false,"edge_available":true,"edge_tokens_per_s":30,"rtt_ms":50,"edge_languages":["en"]}"#;
        let d: serde_json::Value =
            serde_json::from_str(&route_json("hello", None, ctx, None).expect("decision"))
                .expect("json");
        assert_eq!(d["target"], "edge");
        assert_eq!(d["trace"]["rule"], "offline");
        assert!(
            route_json("hello", None, "{}", None)
                .unwrap_err()
                .contains("invalid context")
        );
    }

    #[test]
    fn redaction_keeps_values_on_the_device_and_restores_them() {
        let r = redact("mail jane@example.com, card 4111 1111 1111 1111", vec![]);
        assert_eq!(r.text(), "mail [EMAIL_1], card [PAYMENT_CARD_1]");
        assert_eq!(r.placeholders(), ["[EMAIL_1]", "[PAYMENT_CARD_1]"]);
        let mut s = r.stream();
        let shown = s.push("Wrote to [EMA") + &s.push("IL_1].") + &s.finish();
        assert_eq!(shown, "Wrote to jane@example.com.");
        let only_cards = redact("mail jane@example.com", vec!["payment_card".into()]);
        assert_eq!(only_cards.text(), "mail jane@example.com");
    }

    #[test]
    fn pii_kinds_names_classes_not_values() {
        assert_eq!(pii_kind_names("write to a@b.io"), vec!["email".to_string()]);
        assert!(pii_kind_names("nothing here").is_empty());
        assert_eq!(
            pii_kind_names("a@b.io, 4111 1111 1111 1111, c@d.io"),
            vec!["email".to_string(), "payment_card".to_string()]
        );
    }
}
