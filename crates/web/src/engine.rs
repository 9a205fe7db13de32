//! The on-device model for JavaScript: model bytes streamed into wasm memory once (with their
//! SHA-256 computed on the way), then generation one token per call, so the Web Worker that
//! hosts it can answer a cancel or an escalation between tokens.

use std::cell::RefCell;
use std::rc::Rc;

use sha2::{Digest, Sha256};
use straddle_chat::{AnswerStream, Conversation, Defaults};
#[cfg(feature = "webgpu")]
use straddle_engine::DeviceModel;
use straddle_engine::Model;
use straddle_engine::{
    CausalLm, Constraint, Engine, EngineError, GenerateParams, GrammarError, Look, OutputFormat,
    Prompt, Sequence, TokenEvent,
};
use straddle_protocol::ChatRequest;
use wasm_bindgen::prelude::*;

/// wasm32 addresses 4 GiB; a model must leave room for the engine's own buffers.
const MAX_MODEL_BYTES: f64 = 3.0 * (1u64 << 30) as f64;

/// A model file arriving in chunks, kept in wasm memory (the only full copy) and hashed as
/// it comes, unless it is a stored copy already verified.
#[wasm_bindgen]
pub struct ModelBuffer {
    bytes: Vec<u8>,
    /// The running hash, or the digest the store recorded when it verified these bytes.
    digest: Digesting,
    /// The length the server announced, when it did; more bytes than this are an error.
    declared: Option<usize>,
}

/// Where a [`ModelBuffer`]'s SHA-256 comes from.
enum Digesting {
    /// Hashed as the bytes arrive.
    Hashing(Sha256),
    /// Recorded by the store when it verified the same bytes.
    Recorded(String),
}

#[wasm_bindgen]
impl ModelBuffer {
    /// A buffer for a file of `declared_len` bytes (0 when the length is unknown).
    #[wasm_bindgen(constructor)]
    pub fn new(declared_len: f64) -> Result<ModelBuffer, JsError> {
        Self::with_len(declared_len).map_err(|e| JsError::new(&e))
    }

    fn with_len(declared_len: f64) -> Result<ModelBuffer, String> {
        if !(0.0..=MAX_MODEL_BYTES).contains(&declared_len) {
            return Err(format!(
                "a model of {declared_len} bytes does not fit in this browser's wasm memory"
            ));
        }
        let declared = (declared_len > 0.0).then_some(declared_len as usize);
        let mut bytes = Vec::new();
        bytes
            .try_reserve_exact(declared.unwrap_or(0))
            .map_err(|_| format!("out of memory reserving {declared_len} bytes for the model"))?;
        Ok(ModelBuffer {
            bytes,
            digest: Digesting::Hashing(Sha256::new()),
            declared,
        })
    }

    /// Takes the store's word that these bytes hash to `sha256` (it hashed them when it kept
    /// them, and they have not changed since), so a warm load skips the second of hashing.
    pub fn trust(&mut self, sha256: String) {
        self.digest = Digesting::Recorded(sha256);
    }

    /// Appends the next chunk.
    pub fn push(&mut self, chunk: &[u8]) -> Result<(), JsError> {
        self.append(chunk).map_err(|e| JsError::new(&e))
    }

    fn append(&mut self, chunk: &[u8]) -> Result<(), String> {
        let total = self.bytes.len() + chunk.len();
        if let Some(declared) = self.declared
            && total > declared
        {
            return Err(format!(
                "the model is longer than the {declared} bytes announced"
            ));
        }
        if total as f64 > MAX_MODEL_BYTES {
            return Err("the model does not fit in this browser's wasm memory".into());
        }
        self.bytes
            .try_reserve(chunk.len())
            .map_err(|_| "out of memory while receiving the model".to_string())?;
        self.bytes.extend_from_slice(chunk);
        if let Digesting::Hashing(hasher) = &mut self.digest {
            hasher.update(chunk);
        }
        Ok(())
    }

    /// Bytes received so far.
    #[wasm_bindgen(getter)]
    pub fn received(&self) -> f64 {
        self.bytes.len() as f64
    }

    /// Lowercase hex SHA-256 of the bytes received so far (the recorded one if trusted).
    pub fn sha256(&self) -> String {
        match &self.digest {
            Digesting::Hashing(hasher) => hex::encode(hasher.clone().finalize()),
            Digesting::Recorded(sha256) => sha256.to_lowercase(),
        }
    }

    /// Fails unless every announced byte arrived (a cut download must not reach the parser
    /// as a "truncated GGUF").
    fn complete(self) -> Result<Vec<u8>, String> {
        match self.declared {
            Some(d) if d != self.bytes.len() => Err(format!(
                "the model download stopped at {} of {d} bytes",
                self.bytes.len()
            )),
            _ => Ok(self.bytes),
        }
    }
}

/// Runs `$body` with `$x` bound to what `$value` holds for the backend that runs the model
/// (an enum with a `WebGpu` arm, behind the `webgpu` feature, and a `Cpu` arm), so each
/// operation is written once, generically over the model.
macro_rules! on_backend {
    ($enum:ident, $value:expr, $x:ident => $body:expr) => {
        match $value {
            #[cfg(feature = "webgpu")]
            $enum::WebGpu($x) => $body,
            $enum::Cpu($x) => $body,
        }
    };
}
pub(crate) use on_backend;

/// [`on_backend!`] into another such enum: `$body` becomes the same arm of `$to`.
macro_rules! map_backend {
    ($from:ident => $to:ident, $value:expr, $x:ident => $body:expr) => {
        match $value {
            #[cfg(feature = "webgpu")]
            $from::WebGpu($x) => $to::WebGpu($body),
            $from::Cpu($x) => $to::Cpu($body),
        }
    };
}
pub(crate) use map_backend;

/// Where the on-device model runs.
#[derive(Clone)]
pub(crate) enum Backend {
    /// burn on WebGPU: the weights stay quantized in GPU memory.
    #[cfg(feature = "webgpu")]
    WebGpu(Rc<Engine<DeviceModel>>),
    /// Our wasm-SIMD CPU kernels, for browsers without (a fast) WebGPU.
    Cpu(Rc<Engine<Model>>),
}

/// The on-device model: on WebGPU through burn when the browser has it, else on the CPU.
#[wasm_bindgen]
pub struct EdgeEngine {
    pub(crate) backend: Backend,
    /// Positions its KV cache holds: the page's choice, which its memory check may shorten.
    pub(crate) context: usize,
}

#[wasm_bindgen]
impl EdgeEngine {
    /// Loads a GGUF model from a filled buffer onto the CPU backend (the buffer is consumed),
    /// for conversations of up to `context` tokens.
    #[wasm_bindgen(js_name = loadCpu)]
    pub fn load_cpu(buffer: ModelBuffer, context: u32) -> Result<EdgeEngine, JsError> {
        let bytes = buffer.complete().map_err(|e| JsError::new(&e))?;
        let context = context as usize;
        let engine = straddle_engine::Engine::load(bytes, context)
            .map_err(|e| JsError::new(&e.to_string()))?;
        Ok(EdgeEngine {
            backend: Backend::Cpu(Rc::new(engine)),
            context,
        })
    }

    /// `"webgpu"` or `"cpu"`.
    pub fn backend(&self) -> String {
        match &self.backend {
            #[cfg(feature = "webgpu")]
            Backend::WebGpu(_) => "webgpu".into(),
            Backend::Cpu(_) => "cpu".into(),
        }
    }

    /// Languages the model declares (GGUF `general.languages`), for the router's context.
    pub fn languages(&self) -> Vec<String> {
        on_backend!(Backend, &self.backend, e => e.languages.clone())
    }

    /// The longest conversation the engine holds (its KV cache), for the router's context.
    #[wasm_bindgen(js_name = contextTokens)]
    pub fn context_tokens(&self) -> u32 {
        self.context as u32
    }

    /// The tokenizer's hash, to compare with the verifier's before speculating.
    #[wasm_bindgen(js_name = tokenizerHash)]
    pub fn tokenizer_hash(&self) -> String {
        on_backend!(Backend, &self.backend, e => e.tokenizer.hash.clone())
    }

    /// The model's name (GGUF `general.name`), for `model_versions`.
    pub fn name(&self) -> Option<String> {
        on_backend!(Backend, &self.backend, e => e.name.clone())
    }

    /// Starts a reply to `messages_json` (OpenAI-style `[{role, content}]`) with the settings
    /// in `params_json` (the rest of an OpenAI request: `max_tokens`, `temperature`, `top_p`,
    /// `top_k`, `seed`, `stop`, the penalties, `logit_bias`, `response_format`, `tools`,
    /// `tool_choice`): tokenizes and prefills, then resolves to a [`Generation`].
    pub fn start(&self, messages_json: String, params_json: String) -> js_sys::Promise {
        let (backend, context) = (self.backend.clone(), self.context);
        wasm_bindgen_futures::future_to_promise(async move {
            let constrain = |f: &OutputFormat| on_backend!(Backend, &backend, e => e.constrain(f));
            let (request, params) = parse_request(&messages_json, &params_json, context, constrain)
                .map_err(|e| invalid_request(&e))?;
            let prompt = request.prompt();
            let answer = request.answer_stream();
            let reply = map_backend!(Backend => Reply, backend, e => Running::start(e, prompt, &params, answer)
                .await
                .map_err(|e| JsValue::from(JsError::new(&e.to_string())))?);
            Ok(Generation {
                state: Rc::new(RefCell::new(Slot::Idle(Box::new(reply)))),
            }
            .into())
        })
    }
}

#[cfg(feature = "webgpu")]
#[wasm_bindgen]
impl EdgeEngine {
    /// Loads a GGUF model onto WebGPU for conversations of up to `context` tokens; rejects
    /// when the browser has no usable adapter (the caller then falls back to the CPU with a
    /// fresh buffer).
    #[wasm_bindgen(js_name = loadWebGpu)]
    pub async fn load_webgpu(buffer: ModelBuffer, context: u32) -> Result<EdgeEngine, JsError> {
        let context = context as usize;
        let bytes = buffer.complete().map_err(|e| JsError::new(&e))?;
        let device = straddle_engine::Device::wgpu_options()
            .init_async()
            .await
            .map_err(|e| JsError::new(&format!("WebGPU unavailable: {e}")))?;
        let engine =
            Engine::load_on(bytes, context, &device).map_err(|e| JsError::new(&e.to_string()))?;
        // A software adapter runs workgroup barriers as context switches: one invocation per
        // output row is faster there (see `MatvecKernel`).
        #[cfg(target_arch = "wasm32")]
        let engine = {
            let mut engine = engine;
            if crate::device::probe_device().await.software {
                engine
                    .model
                    .set_matvec_kernel(straddle_engine::MatvecKernel::PerRow);
            }
            engine
        };
        Ok(EdgeEngine {
            backend: Backend::WebGpu(Rc::new(engine)),
            context,
        })
    }
}

/// A request refused before any work, named so that JavaScript reports it as
/// `invalid_request` rather than as a failure of the device.
fn invalid_request(message: &str) -> JsValue {
    let e = js_sys::Error::new(message);
    e.set_name("InvalidRequest");
    e.into()
}

/// The answer's length when JavaScript does not say.
const DEFAULT_MAX_TOKENS: u32 = 256;

/// The conversation in `messages_json` (OpenAI-style `[{role, content}]`) and the settings in
/// `params_json` (the rest of an OpenAI request), checked as the cloud checks them before any
/// work, for an engine of `context` positions; `constrain` compiles a `response_format` for
/// the model.
pub(crate) fn parse_request(
    messages_json: &str,
    params_json: &str,
    context: usize,
    constrain: impl FnOnce(&OutputFormat) -> Result<Constraint, GrammarError>,
) -> Result<(Conversation, GenerateParams), String> {
    let messages: serde_json::Value =
        serde_json::from_str(messages_json).map_err(|e| format!("invalid messages: {e}"))?;
    let mut fields: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(params_json).map_err(|e| format!("invalid parameters: {e}"))?;
    fields.insert("messages".into(), messages);
    let req: ChatRequest = serde_json::from_value(serde_json::Value::Object(fields))
        .map_err(|e| format!("invalid request: {e}"))?;
    let defaults = Defaults {
        max_tokens: DEFAULT_MAX_TOKENS,
        context,
    };
    let params = req
        .validate()
        .and_then(|()| straddle_chat::params(&req, defaults, constrain))
        .map_err(|e| format!("{}: {}", e.param.as_deref().unwrap_or("request"), e.message))?;
    Ok((Conversation::of(&req), params))
}

/// A reply on the backend that runs it: the engine and the sequence together.
enum Reply {
    #[cfg(feature = "webgpu")]
    WebGpu(Running<DeviceModel>),
    Cpu(Running<Model>),
}

/// Where a reply stands between calls.
enum Slot {
    Idle(Box<Reply>),
    /// A step holds the reply.
    Busy,
    /// `finish` took it.
    Done,
}

/// One reply's sequence on its engine.
struct Running<M: CausalLm> {
    engine: Rc<Engine<M>>,
    seq: Sequence<M::Cache>,
    /// The last sampled token has not been fed through the model yet: that forward pass
    /// runs at the start of the next `step`, so each token is handed out as soon as it is
    /// sampled.
    needs_forward: bool,
    /// What of the answer is content, and the tool call it may be.
    answer: AnswerStream,
    /// What the model's state said right after prefill, for the router's check.
    look: Look,
}

impl<M: CausalLm> Running<M> {
    /// Tokenizes and prefills `prompt`.
    async fn start(
        engine: Rc<Engine<M>>,
        prompt: Prompt<'_>,
        params: &GenerateParams,
        answer: AnswerStream,
    ) -> Result<Self, EngineError> {
        let seq = engine.start_async(prompt, params).await?;
        let look = engine.look_async(&seq).await?;
        Ok(Self {
            engine,
            seq,
            needs_forward: false,
            answer,
            look,
        })
    }

    /// Feeds the last sampled token, then samples the next one that completes some text;
    /// `None` once the reply has ended.
    async fn next_event(&mut self) -> Result<Option<TokenEvent>, EngineError> {
        loop {
            if std::mem::replace(&mut self.needs_forward, false) {
                let seqs = &mut [&mut self.seq];
                self.engine.step_async(seqs, usize::MAX).await?;
            }
            let Some(mut ev) = self.engine.next_token(&mut self.seq)? else {
                return Ok(None);
            };
            self.needs_forward = true;
            ev.text = self.answer.push(&ev.text);
            // A token whose text is still pending (half a character, a possible stop string,
            // a tool call being written) is not worth a round trip to JavaScript.
            match (ev.text.is_empty(), self.seq.is_finished()) {
                (true, false) => continue,
                (true, true) => return Ok(None),
                (false, _) => return Ok(Some(ev)),
            }
        }
    }
}

/// One reply in progress.
#[wasm_bindgen]
pub struct Generation {
    state: Rc<RefCell<Slot>>,
}

#[wasm_bindgen]
impl Generation {
    /// Resolves to the next token as `{text, logprob, entropy}`, or `null` once the reply
    /// has ended. Calls must not overlap.
    pub fn step(&self) -> js_sys::Promise {
        let state = self.state.clone();
        wasm_bindgen_futures::future_to_promise(async move {
            let event = next_event(&state)
                .await
                .map_err(|e| JsValue::from(JsError::new(&e)))?;
            Ok(match event {
                None => JsValue::NULL,
                Some(ev) => {
                    let o = js_sys::Object::new();
                    let set = |k: &str, v: JsValue| js_sys::Reflect::set(&o, &k.into(), &v);
                    set("text", JsValue::from_str(&ev.text))?;
                    set("logprob", JsValue::from_f64(ev.logprob.into()))?;
                    set("entropy", JsValue::from_f64(ev.entropy.into()))?;
                    o.into()
                }
            })
        })
    }

    /// What the edge model's own state said right after prefill, before any token:
    /// `{entropy, logprob, margin, state}` (`state` the final hidden state at the prompt's
    /// last position as a `Float32Array`, or `null`), for the router's check.
    pub fn look(&self) -> Result<JsValue, JsError> {
        let guard = self
            .state
            .try_borrow()
            .map_err(|_| JsError::new("a step is still running"))?;
        let Slot::Idle(reply) = &*guard else {
            return Err(JsError::new("this reply has already finished"));
        };
        let look = on_backend!(Reply, &**reply, r => r.look.clone());
        let o = js_sys::Object::new();
        let set = |k: &str, v: JsValue| js_sys::Reflect::set(&o, &k.into(), &v);
        let c = look.confidence;
        set("entropy", JsValue::from_f64(c.entropy.into()))
            .and(set("logprob", JsValue::from_f64(c.logprob.into())))
            .and(set("margin", JsValue::from_f64(c.margin.into())))
            .and(set(
                "state",
                look.state
                    .map_or(JsValue::NULL, |s| js_sys::Float32Array::from(&s[..]).into()),
            ))
            .map_err(|_| JsError::new("building the look"))?;
        Ok(o.into())
    }

    /// Stops the reply; `finish` then reports it as cancelled.
    pub fn cancel(&self) {
        if let Ok(mut guard) = self.state.try_borrow_mut()
            && let Slot::Idle(reply) = &mut *guard
        {
            on_backend!(Reply, &mut **reply, r => r.seq.cancel());
        }
    }

    /// Ends the reply and returns it as JSON: `{text, rest, tool_calls, tokens, finish,
    /// prompt_tokens, prefill_ms, decode_ms, grammar_ms, mean_logprob}`. `rest` is content `step` has not
    /// handed out (a tool call cut short); a whole call is in `tool_calls`, with `call_id`.
    pub fn finish(&self, call_id: String) -> Result<String, JsError> {
        let reply = match self.state.replace(Slot::Done) {
            Slot::Idle(reply) => reply,
            Slot::Busy => {
                self.state.replace(Slot::Busy);
                return Err(JsError::new("a step is still running"));
            }
            Slot::Done => return Err(JsError::new("this reply has already finished")),
        };
        let (c, ending) = on_backend!(Reply, *reply, r => {
            let c = r.seq.into_completion();
            let ending = r.answer.finish(c.finish, &call_id);
            (c, ending)
        });
        let mean_logprob = if c.logprobs.is_empty() {
            0.0
        } else {
            c.logprobs.iter().sum::<f32>() / c.logprobs.len() as f32
        };
        Ok(serde_json::json!({
            "text": c.text, "rest": ending.content, "tool_calls": ending.tool_calls,
            "tokens": c.tokens.len(), "finish": ending.reason,
            "prompt_tokens": c.prompt_tokens, "prefill_ms": c.prefill_ms,
            "decode_ms": c.decode_ms, "grammar_ms": c.grammar_ms,
            "decode_tokens_per_s": c.decode_tokens_per_s(),
            "mean_logprob": mean_logprob,
        })
        .to_string())
    }
}

async fn next_event(slot: &RefCell<Slot>) -> Result<Option<TokenEvent>, String> {
    // The reply leaves the cell for the step (which may await the GPU), so no borrow is
    // held across an await; an overlapping call finds the slot busy.
    let mut reply = match slot.replace(Slot::Busy) {
        Slot::Idle(reply) => reply,
        Slot::Busy => return Err("a step is already running".into()),
        Slot::Done => {
            slot.replace(Slot::Done);
            return Ok(None);
        }
    };
    let result = on_backend!(Reply, &mut *reply, r => r.next_event().await);
    slot.replace(Slot::Idle(reply));
    result.map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The context these requests are checked against.
    const TEST_CONTEXT: usize = 1024;

    #[test]
    fn model_buffer_hashes_and_refuses_more_than_announced() {
        let mut b = ModelBuffer::with_len(6.0).expect("buffer");
        b.append(b"abc").expect("chunk");
        assert_eq!(b.received(), 3.0);
        assert!(b.append(b"defg").is_err(), "7 bytes of 6 announced");
        b.append(b"def").expect("chunk");
        assert_eq!(
            b.sha256(),
            "bef57ec7f53a6d40beb640a780a639c83bc29ac8a9816f1fc6c5c6dcd93c4721"
        );
        assert!(b.complete().is_ok());
        let mut cut = ModelBuffer::with_len(10.0).expect("buffer");
        cut.append(b"abc").expect("chunk");
        assert!(cut.complete().unwrap_err().contains("stopped at 3 of 10"));
        assert!(ModelBuffer::with_len(1e12).is_err());
    }

    #[test]
    fn a_trusted_buffer_reports_the_recorded_digest_without_hashing() {
        let mut b = ModelBuffer::with_len(3.0).expect("buffer");
        b.trust("AB12".into());
        b.append(b"abc").expect("chunk");
        assert_eq!(b.sha256(), "ab12");
    }

    fn no_grammar(_: &OutputFormat) -> Result<Constraint, GrammarError> {
        panic!("nothing to compile")
    }

    #[test]
    fn parameters_are_checked_before_any_work() {
        let msgs = r#"[{"role":"user","content":"hi"}]"#;
        let parse = |m: &str, p: &str| parse_request(m, p, TEST_CONTEXT, no_grammar);
        let (m, p) =
            parse(msgs, r#"{"max_tokens":8,"temperature":0.7,"stop":["\n"]}"#).expect("ok");
        assert_eq!(m.messages.len(), 1);
        assert!(
            parse(msgs, r#"{"max_tokens":8,"continue_final_message":true}"#)
                .unwrap_err()
                .contains("assistant")
        );
        assert_eq!((p.max_tokens, p.sampling.temperature), (8, 0.7));
        assert!(parse("[]", r#"{"max_tokens":8}"#).is_err());
        assert!(
            parse(msgs, r#"{"max_tokens":8,"temprature":1}"#)
                .unwrap_err()
                .contains("temprature")
        );
        assert!(parse(msgs, r#"{"max_tokens":8,"top_p":0}"#).is_err());
        assert!(
            parse("{", "{}")
                .unwrap_err()
                .starts_with("invalid messages")
        );
        let (_, p) = parse(msgs, r#"{"presence_penalty":1,"logit_bias":{"5":-100}}"#).expect("ok");
        assert_eq!(p.sampling.logit_bias, vec![(5, -100.0)]);
        assert_eq!(p.max_tokens, DEFAULT_MAX_TOKENS as usize);
        let schema = r#"{"response_format":{"type":"json_object"}}"#;
        let refused = parse_request(msgs, schema, TEST_CONTEXT, |_| {
            Err(GrammarError::InvalidSchema("no".into()))
        });
        assert!(refused.unwrap_err().starts_with("response_format:"));
        let tools = r#"{"tools":[{"type":"function","function":{"name":"f"}}],
            "tool_choice":{"type":"function","function":{"name":"g"}}}"#;
        assert!(parse(msgs, tools).unwrap_err().starts_with("tool_choice:"));
        let offered = r#"{"tools":[{"type":"function","function":{"name":"f"}}]}"#;
        let mut asked = None;
        let refused = parse_request(msgs, offered, TEST_CONTEXT, |f| {
            asked = Some(f.clone());
            Err(GrammarError::InvalidSchema("no".into()))
        });
        assert!(refused.unwrap_err().starts_with("tools:"));
        assert!(matches!(
            asked,
            Some(OutputFormat::ToolCall {
                required: false,
                ..
            })
        ));
    }
}
