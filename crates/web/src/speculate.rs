//! Speculative decoding's drafting side for JavaScript, on either backend (WebGPU or the CPU
//! kernels): the engine Web Worker drafts with [`Speculative::draft`], sends the draft to the worker's `/v1/verify`, and hands the verdict
//! to [`Speculative::settle`]; if verification fails it goes on with
//! [`Speculative::step_alone`] from exactly the tokens shown so far.

use std::rc::Rc;

use straddle_chat::finish_reason;
#[cfg(feature = "webgpu")]
use straddle_engine::DeviceModel;
use straddle_engine::Model;
use straddle_engine::speculative::{DraftLength, Speculation, Verdict};
use straddle_engine::{CausalLm, Engine, Finish, ModelCache, OutputFormat};
use wasm_bindgen::prelude::*;

use crate::engine::{Backend, EdgeEngine, map_backend, on_backend, parse_request};

/// The drafting state on the backend that holds the model.
enum Drafting {
    #[cfg(feature = "webgpu")]
    WebGpu(Drafter<DeviceModel>),
    Cpu(Drafter<Model>),
}

/// A speculation with the engine that drafts it.
struct Drafter<M: CausalLm> {
    engine: Rc<Engine<M>>,
    spec: Speculation<M::Cache>,
}

/// One speculative reply in progress.
#[wasm_bindgen]
pub struct Speculative {
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
        let constrain = |f: &OutputFormat| on_backend!(Backend, &self.backend, e => e.constrain(f));
        let (request, params) =
            parse_request(&messages_json, &params_json, self.context, constrain)
                .map_err(|e| JsError::new(&e))?;
        let prompt = request.prompt();
        let lengths = DraftLength::default();
        let spec = map_backend!(Backend => Drafting, self.backend.clone(), engine => Drafter {
            spec: Speculation::start_with(&engine, prompt, &params, lengths)
                .await
                .map_err(js)?,
            engine,
        });
        Ok(Speculative { spec })
    }
}

#[wasm_bindgen]
impl Speculative {
    /// The prompt's token ids: the first verify call's prefix.
    pub fn prompt(&self) -> Vec<u32> {
        on_backend!(Drafting, &self.spec, d => d.spec.prompt().to_vec())
    }

    /// Tokens shown so far.
    pub fn tokens(&self) -> Vec<u32> {
        on_backend!(Drafting, &self.spec, d => d.spec.tokens().to_vec())
    }

    /// Resolves to the tokens to verify next (the same draft again until it is settled), or
    /// `undefined` once the reply has ended.
    pub async fn draft(&mut self) -> Result<Option<Vec<u32>>, JsError> {
        on_backend!(Drafting, &mut self.spec, d => Ok(d
            .spec
            .draft_with(&d.engine.model)
            .await
            .map_err(js)?
            .map(<[u32]>::to_vec)))
    }

    /// Takes the verifier's verdict (`accepted` draft tokens, then its `next_token`) and
    /// resolves to the new text to show.
    pub async fn settle(&mut self, accepted: u32, next_token: u32) -> Result<String, JsError> {
        let verdict = Verdict {
            accepted: accepted as usize,
            next_token,
        };
        on_backend!(Drafting, &mut self.spec, d => d
            .spec
            .settle_with(&d.engine.model, &d.engine.tokenizer, verdict)
            .await
            .map_err(js))
    }

    /// One token from the edge model alone (the verifier failed): resolves to its text, or
    /// `undefined` once the reply has ended.
    #[wasm_bindgen(js_name = stepAlone)]
    pub async fn step_alone(&mut self) -> Result<Option<String>, JsError> {
        on_backend!(Drafting, &mut self.spec, d => d
            .spec
            .step_alone_with(&d.engine.model, &d.engine.tokenizer)
            .await
            .map_err(js))
    }

    /// Whether speculation has stopped paying: after a few verify calls the drafts' running
    /// acceptance stayed below `threshold`, so the caller hands the rest of the reply to plain
    /// cloud streaming.
    #[wasm_bindgen(js_name = shouldHandOff)]
    pub fn should_hand_off(&self, threshold: f32) -> bool {
        on_backend!(Drafting, &self.spec, d => d.spec.lengths().should_fall_back(threshold))
    }

    /// How the reply ended and what speculation did, as JSON: `{text, tokens, finish, finished,
    /// prompt_tokens, calls, drafted, accepted, edge_alone, acceptance}`.
    pub fn summary(&self) -> String {
        on_backend!(Drafting, &self.spec, d => summary(&d.spec))
    }
}

fn summary<C: ModelCache>(spec: &Speculation<C>) -> String {
    let s = spec.stats();
    let finish = finish_reason(spec.finish().unwrap_or(Finish::Length));
    serde_json::json!({
        "text": spec.text(), "tokens": spec.tokens().len(), "finish": finish,
        "finished": spec.finish().is_some(),
        "prompt_tokens": spec.prompt().len(), "calls": s.calls, "drafted": s.drafted,
        "accepted": s.accepted, "edge_alone": s.edge_alone,
        "acceptance": spec.lengths().acceptance(),
    })
    .to_string()
}
