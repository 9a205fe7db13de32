//! The model the server runs, on the backend chosen at start: the engine's CPU kernels, or the
//! device model on a GPU through wgpu. Continuous batching and `/v1/verify` are written once,
//! against [`Served`].

use straddle_engine::kv::KvCache;
use straddle_engine::model::ModelError;
use straddle_engine::sample::Rng;
use straddle_engine::speculative::Verdict;
use straddle_engine::tokenizer::Tokenizer;
use straddle_engine::{
    ChatMessage, DeviceCache, DeviceEngine, Engine, EngineError, GenerateParams, Prompt,
    PromptPrefix, SamplingParams, Sequence, TokenEvent,
};

/// What the scheduler and the verify sessions need of a model.
pub trait Served: Send + Sync + 'static {
    /// One sequence's keys and values.
    type Cache: Send + 'static;

    /// The tokenizer (its hash tells clients whether their drafts are compatible).
    fn tokenizer(&self) -> &Tokenizer;
    /// A conversation's prompt ids, chat template applied.
    fn prompt_tokens(&self, messages: &[ChatMessage]) -> Result<Vec<u32>, EngineError>;
    /// A sequence for `prompt`, to be prefilled by the following [`Served::step`]s; the CPU
    /// engine starts from the part of the prompt it shares with the latest one.
    fn queue(
        &self,
        prompt: Prompt<'_>,
        params: &GenerateParams,
    ) -> Result<Sequence<Self::Cache>, EngineError>;
    /// Offers a sequence whose prompt is in its cache as the start of later prompts.
    fn offer_prefix(&self, seq: &Sequence<Self::Cache>);
    /// Samples the sequence's next token from its current logits.
    fn next_token(
        &self,
        seq: &mut Sequence<Self::Cache>,
    ) -> Result<Option<TokenEvent>, EngineError>;
    /// One batched forward pass (continuous batching with chunked prefill).
    fn step(
        &self,
        seqs: &mut [&mut Sequence<Self::Cache>],
        prefill_budget: usize,
    ) -> Result<(), EngineError>;

    /// An empty cache for `positions`.
    fn new_cache(&self, positions: usize) -> Self::Cache;
    /// Grows `cache` to `positions`, keeping what it holds.
    fn reserve(&self, cache: &mut Self::Cache, positions: usize);
    /// Runs `tokens` into `cache` (logits unused).
    fn prefill(&self, tokens: &[u32], cache: &mut Self::Cache) -> Result<(), ModelError>;
    /// Verifies `draft` after `pending` (see the engine's `verify_after`).
    fn verify_after(
        &self,
        cache: &mut Self::Cache,
        pending: u32,
        draft: &[u32],
        params: &SamplingParams,
        context: &[u32],
        rng: &mut Rng,
    ) -> Result<Verdict, ModelError>;
}

/// The CPU engine, with the latest prompt's keys and values kept for the next prompt that
/// shares its start (the chat template's system prompt at least), as llama.cpp's server does.
#[derive(Debug)]
pub struct Cpu {
    pub engine: Engine,
    prefix: std::sync::Mutex<Option<PromptPrefix>>,
}

impl Cpu {
    /// Serves `engine`.
    pub fn new(engine: Engine) -> Self {
        Self {
            engine,
            prefix: std::sync::Mutex::new(None),
        }
    }

    fn prefix(&self) -> std::sync::MutexGuard<'_, Option<PromptPrefix>> {
        // The slot holds a whole value or none; a panic elsewhere cannot leave it half-set.
        self.prefix.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Served for Cpu {
    type Cache = KvCache;

    fn tokenizer(&self) -> &Tokenizer {
        &self.engine.tokenizer
    }

    fn prompt_tokens(&self, messages: &[ChatMessage]) -> Result<Vec<u32>, EngineError> {
        self.engine.prompt_tokens(Prompt::Messages(messages))
    }

    fn queue(
        &self,
        prompt: Prompt<'_>,
        params: &GenerateParams,
    ) -> Result<Sequence<KvCache>, EngineError> {
        let prefix = self.prefix();
        self.engine.queue_after(prompt, params, prefix.as_ref())
    }

    fn offer_prefix(&self, seq: &Sequence<KvCache>) {
        if let Some(p) = seq.prompt_prefix() {
            *self.prefix() = Some(p);
        }
    }

    fn next_token(&self, seq: &mut Sequence<KvCache>) -> Result<Option<TokenEvent>, EngineError> {
        self.engine.next_token(seq)
    }

    fn step(
        &self,
        seqs: &mut [&mut Sequence<KvCache>],
        prefill_budget: usize,
    ) -> Result<(), EngineError> {
        self.engine.step(seqs, prefill_budget)
    }

    fn new_cache(&self, positions: usize) -> KvCache {
        self.engine.model.new_cache(positions)
    }

    fn reserve(&self, cache: &mut KvCache, positions: usize) {
        cache.reserve(positions);
    }

    fn prefill(&self, tokens: &[u32], cache: &mut KvCache) -> Result<(), ModelError> {
        self.engine.model.forward(tokens, cache, false).map(drop)
    }

    fn verify_after(
        &self,
        cache: &mut KvCache,
        pending: u32,
        draft: &[u32],
        params: &SamplingParams,
        context: &[u32],
        rng: &mut Rng,
    ) -> Result<Verdict, ModelError> {
        self.engine
            .model
            .verify_after(cache, pending, draft, params, context, rng)
    }
}

impl Served for DeviceEngine {
    type Cache = DeviceCache;

    fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    fn prompt_tokens(&self, messages: &[ChatMessage]) -> Result<Vec<u32>, EngineError> {
        DeviceEngine::prompt_tokens(self, Prompt::Messages(messages))
    }

    fn queue(
        &self,
        prompt: Prompt<'_>,
        params: &GenerateParams,
    ) -> Result<Sequence<DeviceCache>, EngineError> {
        DeviceEngine::queue(self, prompt, params)
    }

    // Prefix reuse would copy keys and values on the device; a GPU prefills the template's
    // few dozen tokens in about one step, so it is not worth a copy of every layer's cache.
    fn offer_prefix(&self, _seq: &Sequence<DeviceCache>) {}

    fn next_token(
        &self,
        seq: &mut Sequence<DeviceCache>,
    ) -> Result<Option<TokenEvent>, EngineError> {
        DeviceEngine::next_token(self, seq)
    }

    fn step(
        &self,
        seqs: &mut [&mut Sequence<DeviceCache>],
        prefill_budget: usize,
    ) -> Result<(), EngineError> {
        DeviceEngine::step(self, seqs, prefill_budget)
    }

    fn new_cache(&self, positions: usize) -> DeviceCache {
        self.model.new_cache(positions)
    }

    fn reserve(&self, cache: &mut DeviceCache, positions: usize) {
        self.model.reserve(cache, positions);
    }

    fn prefill(&self, tokens: &[u32], cache: &mut DeviceCache) -> Result<(), ModelError> {
        self.model.forward_blocking(tokens, cache, false).map(drop)
    }

    fn verify_after(
        &self,
        cache: &mut DeviceCache,
        pending: u32,
        draft: &[u32],
        params: &SamplingParams,
        context: &[u32],
        rng: &mut Rng,
    ) -> Result<Verdict, ModelError> {
        self.model
            .verify_after(cache, pending, draft, params, context, rng)
    }
}
