//! The model the server runs, on the backend chosen at start: the engine's CPU kernels, or the
//! device model on a GPU through wgpu. Continuous batching and `/v1/verify` are written once,
//! over [`Served`]'s model type.

use std::sync::{Mutex, MutexGuard};

use straddle_engine::ModelError;
use straddle_engine::Tokenizer;
use straddle_engine::{
    BlockingLm, ChatMessage, Engine, EngineError, GenerateParams, Prompt, PromptPrefix, Sequence,
    TokenEvent,
};

/// A model the server can run: synchronously, from its decode and verify threads.
pub trait ServedModel: BlockingLm<Cache: Send + 'static> + Send + Sync + 'static {}

impl<M> ServedModel for M where M: BlockingLm<Cache: Send + 'static> + Send + Sync + 'static {}

/// The engine the server runs, with the latest prompt's keys and values kept for the next
/// prompt that shares its start (the chat template's system prompt at least), as llama.cpp's
/// server does, where the model's cache is worth copying (see `ModelCache::prefix`).
pub struct Served<M: ServedModel> {
    pub engine: Engine<M>,
    prefix: Mutex<Option<PromptPrefix<M::Cache>>>,
}

impl<M: ServedModel + std::fmt::Debug> std::fmt::Debug for Served<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Served")
            .field("engine", &self.engine)
            .finish_non_exhaustive()
    }
}

impl<M: ServedModel> Served<M> {
    /// Serves `engine`.
    pub fn new(engine: Engine<M>) -> Self {
        Self {
            engine,
            prefix: Mutex::new(None),
        }
    }

    fn prefix(&self) -> MutexGuard<'_, Option<PromptPrefix<M::Cache>>> {
        // The slot holds a whole value or none; a panic elsewhere cannot leave it half-set.
        self.prefix.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The tokenizer (its hash tells clients whether their drafts are compatible).
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.engine.tokenizer
    }

    /// A conversation's prompt ids, chat template applied.
    pub fn prompt_tokens(&self, messages: &[ChatMessage]) -> Result<Vec<u32>, EngineError> {
        self.engine.prompt_tokens(Prompt::Messages(messages))
    }

    /// A sequence for `prompt`, to be prefilled by the following [`Served::step`]s, starting
    /// from the part of the prompt it shares with the latest one offered.
    pub fn queue(
        &self,
        prompt: Prompt<'_>,
        params: &GenerateParams,
    ) -> Result<Sequence<M::Cache>, EngineError> {
        let prefix = self.prefix();
        self.engine.queue_after(prompt, params, prefix.as_ref())
    }

    /// Offers a sequence whose prompt is in its cache as the start of later prompts.
    pub fn offer_prefix(&self, seq: &Sequence<M::Cache>) {
        if let Some(p) = seq.prompt_prefix() {
            *self.prefix() = Some(p);
        }
    }

    /// Samples the sequence's next token from its current logits.
    pub fn next_token(
        &self,
        seq: &mut Sequence<M::Cache>,
    ) -> Result<Option<TokenEvent>, EngineError> {
        self.engine.next_token(seq)
    }

    /// One batched forward pass (continuous batching with chunked prefill).
    pub fn step(
        &self,
        seqs: &mut [&mut Sequence<M::Cache>],
        prefill_budget: usize,
    ) -> Result<(), EngineError> {
        self.engine.step(seqs, prefill_budget)
    }

    /// An empty cache for `positions`.
    pub fn new_cache(&self, positions: usize) -> M::Cache {
        self.engine.new_cache(positions)
    }

    /// Grows `cache` to `positions`, keeping what it holds.
    pub fn reserve(&self, cache: &mut M::Cache, positions: usize) {
        self.engine.model.reserve(cache, positions);
    }

    /// Runs `tokens` into `cache` (logits unused).
    pub fn prefill(&self, tokens: &[u32], cache: &mut M::Cache) -> Result<(), ModelError> {
        self.prefill_logits(tokens, cache).map(drop)
    }

    /// Runs `tokens` into `cache` in one pass and returns the last position's logits.
    pub fn prefill_logits(
        &self,
        tokens: &[u32],
        cache: &mut M::Cache,
    ) -> Result<Vec<f32>, ModelError> {
        self.engine.model.forward_last_blocking(tokens, cache)
    }

    /// Runs `tokens` into `cache`, each computed as decoding it alone would (logits unused):
    /// what emitted tokens were.
    pub fn extend_decoded(&self, tokens: &[u32], cache: &mut M::Cache) -> Result<(), ModelError> {
        self.engine
            .model
            .forward_all_blocking(tokens, cache)
            .map(drop)
    }
}
