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

/// The on-device model. Runs on the CPU in wasm for now (WebGPU through burn is the engine
/// issue's open part); generation is synchronous, so pages should call it from a Web Worker.
#[wasm_bindgen]
pub struct EdgeEngine {
    engine: straddle_engine::Engine,
}

#[wasm_bindgen]
impl EdgeEngine {
    /// Loads a GGUF model from its bytes.
    #[wasm_bindgen(constructor)]
    pub fn new(bytes: Vec<u8>) -> Result<EdgeEngine, JsError> {
        let engine = straddle_engine::Engine::load(bytes, EDGE_CONTEXT)
            .map_err(|e| JsError::new(&e.to_string()))?;
        Ok(EdgeEngine { engine })
    }

    /// Languages the model declares (GGUF `general.languages`), for the router's context.
    pub fn languages(&self) -> Vec<String> {
        self.engine.languages.clone()
    }

    /// Generates a reply to `messages_json` (OpenAI-style `[{role, content}]`), calling
    /// `on_token(text, logprob, entropy)` per token; a `false` return cancels. Returns the
    /// completion as JSON: `{text, tokens, finish, prompt_tokens, prefill_ms, decode_ms}`.
    pub fn generate(
        &self,
        messages_json: &str,
        max_tokens: u32,
        on_token: &js_sys::Function,
    ) -> Result<String, JsError> {
        generate_json(
            &self.engine,
            messages_json,
            max_tokens,
            |text, logprob, entropy| {
                let keep = on_token.call3(
                    &JsValue::NULL,
                    &JsValue::from_str(text),
                    &JsValue::from_f64(logprob.into()),
                    &JsValue::from_f64(entropy.into()),
                );
                !matches!(keep, Ok(v) if v == JsValue::FALSE)
            },
        )
        .map_err(|e| JsError::new(&e))
    }
}

/// Context the browser engine is sized for: an f32 KV cache of 1,024 positions is 47 MB.
const EDGE_CONTEXT: usize = 1024;

fn generate_json(
    engine: &straddle_engine::Engine,
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
    let c = engine
        .generate(Prompt::Messages(&msgs), &params, |ev| {
            if on_token(&ev.text, ev.logprob, ev.entropy) {
                Flow::Continue
            } else {
                Flow::Cancel
            }
        })
        .map_err(|e| e.to_string())?;
    let finish = match c.finish {
        Finish::Stop => "stop",
        Finish::Length => "length",
        Finish::Cancelled => "cancelled",
    };
    Ok(serde_json::json!({
        "text": c.text, "tokens": c.tokens, "finish": finish, "prompt_tokens": c.prompt_tokens,
        "prefill_ms": c.prefill_ms, "decode_ms": c.decode_ms,
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
    fn pii_kinds_names_classes_not_values() {
        assert_eq!(pii_kind_names("write to a@b.io"), vec!["email".to_string()]);
        assert!(pii_kind_names("nothing here").is_empty());
        assert_eq!(
            pii_kind_names("a@b.io, 4111 1111 1111 1111, c@d.io"),
            vec!["email".to_string(), "payment_card".to_string()]
        );
    }
}
