//! Speculative decoding's drafting side for JavaScript, on either backend (WebGPU or the CPU
//! kernels): the engine Web Worker drafts with [`Speculative::draft`], sends the draft to the worker's `/v1/verify`, and hands the verdict
//! to [`Speculative::settle`]; if verification fails it goes on with
//! [`Speculative::step_alone`] from exactly the tokens shown so far.

#[cfg(feature = "webgpu")]
use straddle_engine::DeviceCache;
use straddle_engine::Finish;
use straddle_engine::speculative::{DraftCache, DraftLength, Speculation, Verdict};
use wasm_bindgen::prelude::*;

use crate::engine::{Backend, EdgeEngine, parse_request};

/// The drafting state on the model's backend.
enum Drafting {
    Cpu(Speculation),
    #[cfg(feature = "webgpu")]
    Gpu(Speculation<DeviceCache>),
}

/// One speculative reply in progress.
#[wasm_bindgen]
pub struct Speculative {
    backend: std::rc::Rc<Backend>,
    spec: Drafting,
}

fn js(e: impl std::fmt::Display) -> JsError {
    JsError::new(&e.to_string())
}

#[wasm_bindgen]
impl EdgeEngine {
    /// Starts a speculative reply to `messages_json` with `params_json` (as for `start`):
    /// tokenizes and prefills on the drafting model, on whichever backend holds it (WebGPU or
    /// the CPU kernels).
    pub async fn speculate(
        &self,
        messages_json: String,
        params_json: String,
    ) -> Result<Speculative, JsError> {
        let (request, params) =
            parse_request(&messages_json, &params_json).map_err(|e| JsError::new(&e))?;
        let prompt = request.prompt();
        let spec = match &*self.backend {
            Backend::Cpu(e) => Drafting::Cpu(
                Speculation::start(e, prompt, &params, DraftLength::default()).map_err(js)?,
            ),
            #[cfg(feature = "webgpu")]
            Backend::WebGpu(e) => Drafting::Gpu(
                Speculation::start_on_device(e, prompt, &params, DraftLength::default())
                    .await
                    .map_err(js)?,
            ),
        };
        Ok(Speculative {
            backend: self.backend.clone(),
            spec,
        })
    }
}

#[wasm_bindgen]
impl Speculative {
    /// The prompt's token ids: the first verify call's prefix.
    pub fn prompt(&self) -> Vec<u32> {
        match &self.spec {
            Drafting::Cpu(s) => s.prompt().to_vec(),
            #[cfg(feature = "webgpu")]
            Drafting::Gpu(s) => s.prompt().to_vec(),
        }
    }

    /// Tokens shown so far.
    pub fn tokens(&self) -> Vec<u32> {
        match &self.spec {
            Drafting::Cpu(s) => s.tokens().to_vec(),
            #[cfg(feature = "webgpu")]
            Drafting::Gpu(s) => s.tokens().to_vec(),
        }
    }

    /// Resolves to the tokens to verify next (the same draft again until it is settled), or
    /// `undefined` once the reply has ended.
    pub async fn draft(&mut self) -> Result<Option<Vec<u32>>, JsError> {
        let draft = match (&*self.backend, &mut self.spec) {
            (Backend::Cpu(e), Drafting::Cpu(s)) => s.draft(e).map_err(js)?,
            #[cfg(feature = "webgpu")]
            (Backend::WebGpu(e), Drafting::Gpu(s)) => s.draft_with(&e.model).await.map_err(js)?,
            #[cfg(feature = "webgpu")]
            _ => return Err(JsError::new("a reply outlived a change of backend")),
        };
        Ok(draft.map(<[u32]>::to_vec))
    }

    /// Takes the verifier's verdict (`accepted` draft tokens, then its `next_token`) and
    /// resolves to the new text to show.
    pub async fn settle(&mut self, accepted: u32, next_token: u32) -> Result<String, JsError> {
        let verdict = Verdict {
            accepted: accepted as usize,
            next_token,
        };
        match (&*self.backend, &mut self.spec) {
            (Backend::Cpu(e), Drafting::Cpu(s)) => s.settle(e, verdict).map_err(js),
            #[cfg(feature = "webgpu")]
            (Backend::WebGpu(e), Drafting::Gpu(s)) => s
                .settle_with(&e.model, &e.tokenizer, verdict)
                .await
                .map_err(js),
            #[cfg(feature = "webgpu")]
            _ => Err(JsError::new("a reply outlived a change of backend")),
        }
    }

    /// One token from the edge model alone (the verifier failed): resolves to its text, or
    /// `undefined` once the reply has ended.
    #[wasm_bindgen(js_name = stepAlone)]
    pub async fn step_alone(&mut self) -> Result<Option<String>, JsError> {
        match (&*self.backend, &mut self.spec) {
            (Backend::Cpu(e), Drafting::Cpu(s)) => s.step_alone(e).map_err(js),
            #[cfg(feature = "webgpu")]
            (Backend::WebGpu(e), Drafting::Gpu(s)) => {
                s.step_alone_with(&e.model, &e.tokenizer).await.map_err(js)
            }
            #[cfg(feature = "webgpu")]
            _ => Err(JsError::new("a reply outlived a change of backend")),
        }
    }

    /// Whether speculation has stopped paying: after a few verify calls the drafts' running
    /// acceptance stayed below `threshold`, so the caller hands the rest of the reply to plain
    /// cloud streaming.
    #[wasm_bindgen(js_name = shouldHandOff)]
    pub fn should_hand_off(&self, threshold: f32) -> bool {
        match &self.spec {
            Drafting::Cpu(s) => s.lengths().should_fall_back(threshold),
            #[cfg(feature = "webgpu")]
            Drafting::Gpu(s) => s.lengths().should_fall_back(threshold),
        }
    }

    /// How the reply ended and what speculation did, as JSON: `{text, tokens, finish, finished,
    /// prompt_tokens, calls, drafted, accepted, edge_alone, acceptance}`.
    pub fn summary(&self) -> String {
        match &self.spec {
            Drafting::Cpu(s) => summary(s),
            #[cfg(feature = "webgpu")]
            Drafting::Gpu(s) => summary(s),
        }
    }
}

fn summary<C: DraftCache>(spec: &Speculation<C>) -> String {
    let s = spec.stats();
    let finish = match spec.finish() {
        Some(Finish::Stop) => "stop",
        Some(Finish::Length) | None => "length",
        Some(Finish::Cancelled) => "cancelled",
    };
    serde_json::json!({
        "text": spec.text(), "tokens": spec.tokens().len(), "finish": finish,
        "finished": spec.finish().is_some(),
        "prompt_tokens": spec.prompt().len(), "calls": s.calls, "drafted": s.drafted,
        "accepted": s.accepted, "edge_alone": s.edge_alone,
        "acceptance": spec.lengths().acceptance(),
    })
    .to_string()
}
