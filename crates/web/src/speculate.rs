//! Speculative decoding's drafting side for JavaScript: the engine Web Worker drafts with
//! [`Speculative::draft`], sends the draft to the worker's `/v1/verify`, and hands the verdict
//! to [`Speculative::settle`]; if verification fails it goes on with
//! [`Speculative::step_alone`] from exactly the tokens shown so far.

use straddle_engine::speculative::{DraftLength, Speculation, Verdict};
use straddle_engine::{Engine, Finish, Prompt};
use wasm_bindgen::prelude::*;

use crate::engine::{Backend, EdgeEngine, parse_request};

/// One speculative reply in progress.
#[wasm_bindgen]
pub struct Speculative {
    backend: std::rc::Rc<Backend>,
    spec: Speculation,
}

#[wasm_bindgen]
impl EdgeEngine {
    /// Starts a speculative reply to `messages_json` with `params_json` (as for `start`):
    /// tokenizes and prefills on the drafting model. Drafting runs on the CPU backend.
    pub fn speculate(
        &self,
        messages_json: String,
        params_json: String,
    ) -> Result<Speculative, JsError> {
        let (msgs, params) =
            parse_request(&messages_json, &params_json).map_err(|e| JsError::new(&e))?;
        let spec = Speculation::start(
            cpu(&self.backend)?,
            Prompt::Messages(&msgs),
            &params,
            DraftLength::default(),
        )
        .map_err(|e| JsError::new(&e.to_string()))?;
        Ok(Speculative {
            backend: self.backend.clone(),
            spec,
        })
    }
}

fn cpu(backend: &Backend) -> Result<&Engine, JsError> {
    match backend {
        Backend::Cpu(e) => Ok(e),
        // The verify loop needs the draft model's cache rewound to the accepted prefix; the
        // device model has no such step yet.
        Backend::WebGpu(_) => Err(JsError::new(
            "speculative drafting runs on the CPU backend; this model is loaded on WebGPU",
        )),
    }
}

#[wasm_bindgen]
impl Speculative {
    /// The prompt's token ids: the first verify call's prefix.
    pub fn prompt(&self) -> Vec<u32> {
        self.spec.prompt().to_vec()
    }

    /// Tokens shown so far.
    pub fn tokens(&self) -> Vec<u32> {
        self.spec.tokens().to_vec()
    }

    /// Drafts the tokens to verify next (the same draft again until it is settled), or
    /// `undefined` once the reply has ended.
    pub fn draft(&mut self) -> Result<Option<Vec<u32>>, JsError> {
        let engine = cpu(&self.backend)?;
        Ok(self
            .spec
            .draft(engine)
            .map_err(|e| JsError::new(&e.to_string()))?
            .map(<[u32]>::to_vec))
    }

    /// Takes the verifier's verdict (`accepted` draft tokens, then its `next_token`) and
    /// returns the new text to show.
    pub fn settle(&mut self, accepted: u32, next_token: u32) -> Result<String, JsError> {
        let engine = cpu(&self.backend)?;
        self.spec
            .settle(
                engine,
                Verdict {
                    accepted: accepted as usize,
                    next_token,
                },
            )
            .map_err(|e| JsError::new(&e.to_string()))
    }

    /// One token from the edge model alone (the verifier failed): its text, or `undefined`
    /// once the reply has ended.
    #[wasm_bindgen(js_name = stepAlone)]
    pub fn step_alone(&mut self) -> Result<Option<String>, JsError> {
        let engine = cpu(&self.backend)?;
        self.spec
            .step_alone(engine)
            .map_err(|e| JsError::new(&e.to_string()))
    }

    /// How the reply ended and what speculation did, as JSON: `{text, tokens, finish,
    /// prompt_tokens, calls, drafted, accepted, edge_alone, acceptance}`.
    pub fn summary(&self) -> String {
        let s = self.spec.stats();
        let finish = match self.spec.finish() {
            Some(Finish::Stop) => "stop",
            Some(Finish::Length) | None => "length",
            Some(Finish::Cancelled) => "cancelled",
        };
        serde_json::json!({
            "text": self.spec.text(), "tokens": self.spec.tokens().len(), "finish": finish,
            "prompt_tokens": self.spec.prompt().len(), "calls": s.calls, "drafted": s.drafted,
            "accepted": s.accepted, "edge_alone": s.edge_alone,
            "acceptance": self.spec.lengths().acceptance(),
        })
        .to_string()
    }
}
