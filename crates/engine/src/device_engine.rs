//! The generation loop over a [`DeviceModel`]: the same sampling, stops, streaming and
//! usage as [`crate::Engine`], with the forward passes awaited, because a browser reads GPU
//! results back asynchronously.

use web_time::Instant;

use crate::Device;
use crate::device_model::{DeviceCache, DeviceModel};
use crate::generate::{
    Completion, EngineError, Flow, GenerateParams, Prompt, Sequence, TextParts, TokenEvent,
    encode_prompt, with_room,
};
use crate::gguf::{ByteSource, Gguf};
use crate::template::ChatTemplate;
use crate::tokenizer::Tokenizer;

/// A model on a burn device with its tokenizer and chat template.
pub struct DeviceEngine {
    pub model: DeviceModel,
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
    /// `general.languages` of the GGUF (empty when unspecified).
    pub languages: Vec<String>,
    /// `general.name` of the GGUF, when it has one.
    pub name: Option<String>,
}

impl std::fmt::Debug for DeviceEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceEngine")
            .field("name", &self.name)
            .field("model", &self.model)
            .finish()
    }
}

impl DeviceEngine {
    /// Loads tokenizer and template from a GGUF source and uploads its weights to `device`;
    /// caches hold at most `max_context` positions.
    pub fn load<S: ByteSource>(
        source: S,
        max_context: usize,
        device: &Device,
    ) -> Result<Self, EngineError> {
        let g = Gguf::read(source)?;
        let text = TextParts::from_gguf(&g)?;
        let model = DeviceModel::load(&g, max_context, device)?;
        Ok(Self {
            model,
            tokenizer: text.tokenizer,
            template: text.template,
            languages: text.languages,
            name: text.name,
        })
    }

    /// The prompt's token ids.
    pub fn prompt_tokens(&self, prompt: Prompt<'_>) -> Result<Vec<u32>, EngineError> {
        encode_prompt(&self.tokenizer, &self.template, prompt)
    }

    /// Generates a completion, calling `on_token` after every token; `on_token` returning
    /// [`Flow::Cancel`] stops before the next forward pass.
    pub async fn generate(
        &self,
        prompt: Prompt<'_>,
        params: &GenerateParams,
        mut on_token: impl FnMut(&TokenEvent) -> Flow,
    ) -> Result<Completion, EngineError> {
        let mut seq = self.start(prompt, params).await?;
        while let Some(ev) = seq.sample_next(&self.tokenizer)? {
            if (!ev.text.is_empty() || !seq.is_finished()) && on_token(&ev) == Flow::Cancel {
                seq.cancel();
            }
            self.advance(&mut seq).await?;
        }
        Ok(seq.into_completion())
    }

    /// Starts a sequence: tokenizes and prefills the prompt.
    pub async fn start(
        &self,
        prompt: Prompt<'_>,
        params: &GenerateParams,
    ) -> Result<Sequence<DeviceCache>, EngineError> {
        let (prompt_ids, mut cache) = self.prompt_and_cache(prompt, params.context)?;
        let t0 = Instant::now();
        let logits = self
            .model
            .forward_read(&prompt_ids, &mut cache, false)
            .await?
            .pop()
            .unwrap_or_default();
        let prefill_ms = t0.elapsed().as_secs_f64() * 1000.0;
        let capacity = cache.capacity();
        Ok(Sequence::prefilled(
            cache, capacity, logits, prompt_ids, params, prefill_ms,
        ))
    }

    /// Tokenizes the prompt and sets up its cache without running the model: the sequence is
    /// prefilled by the following [`Self::step`]s, batched with the others.
    pub fn queue(
        &self,
        prompt: Prompt<'_>,
        params: &GenerateParams,
    ) -> Result<Sequence<DeviceCache>, EngineError> {
        let (prompt_ids, cache) = self.prompt_and_cache(prompt, params.context)?;
        let capacity = cache.capacity();
        Ok(Sequence::queued(cache, capacity, prompt_ids, params))
    }

    /// The prompt's ids and a fresh cache of `context` positions that has room after them.
    pub(crate) fn prompt_and_cache(
        &self,
        prompt: Prompt<'_>,
        context: usize,
    ) -> Result<(Vec<u32>, DeviceCache), EngineError> {
        let ids = self.prompt_tokens(prompt)?;
        let cache = self.model.new_cache(context);
        let capacity = cache.capacity();
        with_room(ids, cache, capacity)
    }

    /// One forward pass for a batch of sequences (see [`crate::Engine::step`]), blocking on
    /// the readback: the native server's continuous batching on a GPU.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn step(
        &self,
        seqs: &mut [&mut Sequence<DeviceCache>],
        prefill_budget: usize,
    ) -> Result<(), EngineError> {
        crate::generate::step_sequences(seqs, prefill_budget, |chunks, caches, want| {
            self.model.forward_chunks_blocking(chunks, caches, want)
        })
    }

    /// Samples the sequence's next token (see [`crate::Engine::next_token`]).
    pub fn next_token(
        &self,
        seq: &mut Sequence<DeviceCache>,
    ) -> Result<Option<TokenEvent>, EngineError> {
        seq.sample_next(&self.tokenizer)
    }

    /// Feeds the sequence's last sampled token through the model.
    pub async fn advance(&self, seq: &mut Sequence<DeviceCache>) -> Result<(), EngineError> {
        let Some((token, cache)) = seq.pending() else {
            return Ok(());
        };
        let logits = self
            .model
            .forward_read(&[token], cache, false)
            .await?
            .pop()
            .unwrap_or_default();
        seq.set_logits(logits);
        Ok(())
    }
}
