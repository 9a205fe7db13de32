//! The generation loop: prompt → prefill → decode one token at a time, with stops,
//! streaming callbacks, cancellation between tokens, usage and timings.

use web_time::Instant;

use crate::causal_lm::{BlockingLm, CausalLm, ModelCache, ready};
use crate::gguf::{ByteSource, Gguf};
use crate::grammar::{Constraint, GrammarError, Grammars, OutputFormat};
use crate::kv::KvCache;
use crate::model::{Model, ModelError};
use crate::sample::{self, Rng, SamplingParams};
use crate::template::{ChatMessage, ChatTemplate, TemplateError};
use crate::tokenizer::{Tokenizer, TokenizerError};

/// Default context the KV cache is sized for.
pub const DEFAULT_CONTEXT: usize = 2048;

/// Anything that can go wrong loading or running the engine.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Template(#[from] TemplateError),
    #[error(transparent)]
    Gguf(#[from] crate::gguf::GgufError),
    #[error("prompt is empty")]
    EmptyPrompt,
    #[error("prompt of {prompt} tokens leaves no room in a context of {context}")]
    PromptTooLong { prompt: usize, context: usize },
    #[error(transparent)]
    Grammar(#[from] GrammarError),
}

/// What to generate from.
#[derive(Debug, Clone, Copy)]
pub enum Prompt<'a> {
    /// Raw text, tokenized as is (special-token text included).
    Text(&'a str),
    /// A conversation, rendered with the model's chat template and a generation prompt.
    Messages(&'a [ChatMessage]),
    /// A conversation that offers tools (OpenAI's `{"type": "function", …}` objects), rendered
    /// as [`ChatTemplate::render_with_tools`] does.
    WithTools(&'a [ChatMessage], &'a [serde_json::Value]),
    /// A conversation whose last turn, the assistant's, is continued rather than closed (a
    /// reply handed over part-way, e.g. from speculation to plain streaming).
    Continue(&'a [ChatMessage]),
    /// Token ids.
    Tokens(&'a [u32]),
}

/// Settings of one generation.
#[derive(Debug, Clone)]
pub struct GenerateParams {
    pub sampling: SamplingParams,
    pub max_tokens: usize,
    /// Text that ends generation; it is not included in the output.
    pub stop: Vec<String>,
    /// Extra token ids that end generation (the model's end-of-turn ids always do).
    pub stop_tokens: Vec<u32>,
    /// KV cache size in positions.
    pub context: usize,
    /// The grammar the answer must follow ([`Engine::constrain`]), if any.
    pub constraint: Option<Constraint>,
}

impl Default for GenerateParams {
    fn default() -> Self {
        Self {
            sampling: SamplingParams::default(),
            max_tokens: 256,
            stop: Vec::new(),
            stop_tokens: Vec::new(),
            context: DEFAULT_CONTEXT,
            constraint: None,
        }
    }
}

/// One streamed token.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenEvent {
    pub token: u32,
    /// Text this token completes (may be empty while a multi-byte character or a possible
    /// stop string is pending).
    pub text: String,
    pub logprob: f32,
    pub entropy: f32,
}

/// Whether the caller wants more tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Continue,
    Cancel,
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// An end-of-turn token or a stop string.
    Stop,
    /// `max_tokens` or the context limit.
    Length,
    /// The callback asked to stop.
    Cancelled,
}

/// A finished generation.
#[derive(Debug, Clone)]
pub struct Completion {
    pub text: String,
    pub tokens: Vec<u32>,
    pub logprobs: Vec<f32>,
    pub entropies: Vec<f32>,
    pub finish: Finish,
    pub prompt_tokens: usize,
    pub prefill_ms: f64,
    pub decode_ms: f64,
    /// Of `decode_ms`, the time the grammar spent computing masks and advancing (0 when
    /// unconstrained).
    pub grammar_ms: f64,
}

impl Completion {
    /// Decode speed in tokens per second (0 when nothing was decoded).
    pub fn decode_tokens_per_s(&self) -> f64 {
        let n = self.tokens.len().saturating_sub(1);
        if self.decode_ms > 0.0 {
            n as f64 / (self.decode_ms / 1000.0)
        } else {
            0.0
        }
    }
}

/// A prompt's keys and values, kept to start later prompts that begin the same way (the
/// chat template's system prompt, a shared document) without computing them again.
#[derive(Debug, Clone)]
pub struct PromptPrefix<C = KvCache> {
    tokens: Vec<u32>,
    cache: C,
}

impl<C> PromptPrefix<C> {
    /// Tokens covered.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether it covers nothing.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Leading tokens of `ids` it holds, leaving `ids`' last (whose logits are needed).
    fn shared_with(&self, ids: &[u32]) -> usize {
        let same = self.tokens.iter().zip(ids).take_while(|(a, b)| a == b);
        same.count().min(ids.len().saturating_sub(1))
    }
}

/// One generation in progress: its cache (of type `C`: the CPU model's [`KvCache`] or a
/// device model's cache), its next-token logits and what it produced.
pub struct Sequence<C = KvCache> {
    cache: C,
    logits: Vec<f32>,
    rng: Rng,
    params: GenerateParams,
    context: Vec<u32>,
    /// How many tokens of `context` the cache holds: all but the last sampled one while
    /// decoding, fewer while a queued prompt is being prefilled.
    fed: usize,
    /// When a queued sequence was created, for its prefill time.
    queued_at: Instant,
    /// Prompt tokens taken from a [`PromptPrefix`] instead of being computed.
    reused: usize,
    out: Completion,
    /// Bytes of `out.text` already streamed.
    emitted: usize,
    finished: bool,
    decode_started: Instant,
    /// The grammar state of a constrained answer.
    constraint: Option<Constraint>,
}

impl<C> std::fmt::Debug for Sequence<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sequence")
            .field("tokens", &self.out.tokens.len())
            .field("finished", &self.finished)
            .finish()
    }
}

impl<C: ModelCache> Sequence<C> {
    /// A sequence whose prompt `prompt_ids` has been prefilled into `cache`, leaving `logits`.
    pub(crate) fn prefilled(
        cache: C,
        logits: Vec<f32>,
        prompt_ids: Vec<u32>,
        params: &GenerateParams,
        prefill_ms: f64,
    ) -> Self {
        let mut params = params.clone();
        let constraint = params.constraint.take();
        Sequence {
            cache,
            logits,
            rng: Rng::new(params.sampling.seed),
            params,
            constraint,
            out: Completion {
                text: String::new(),
                tokens: Vec::new(),
                logprobs: Vec::new(),
                entropies: Vec::new(),
                finish: Finish::Length,
                prompt_tokens: prompt_ids.len(),
                prefill_ms,
                decode_ms: 0.0,
                grammar_ms: 0.0,
            },
            fed: prompt_ids.len(),
            context: prompt_ids,
            queued_at: Instant::now(),
            reused: 0,
            emitted: 0,
            finished: false,
            decode_started: Instant::now(),
        }
    }

    /// A sequence whose prompt is still to be prefilled (by [`Engine::step`]).
    pub(crate) fn queued(cache: C, prompt_ids: Vec<u32>, params: &GenerateParams) -> Self {
        let mut seq = Self::prefilled(cache, Vec::new(), prompt_ids, params, 0.0);
        seq.fed = 0;
        seq
    }

    /// Whether the sequence has sampled a token (its prompt is in the cache).
    fn is_decoding(&self) -> bool {
        !self.out.tokens.is_empty()
    }

    /// Prompt tokens taken from a [`PromptPrefix`] rather than computed.
    pub fn prompt_reused(&self) -> usize {
        self.reused
    }

    /// Prompt tokens still to be prefilled.
    pub fn prompt_unfed(&self) -> usize {
        if self.is_decoding() {
            0
        } else {
            self.context.len().saturating_sub(self.fed)
        }
    }

    /// Whether everything sampled so far is in the cache: the next token can be sampled.
    fn logits_current(&self) -> bool {
        self.fed >= self.context.len()
    }

    /// Whether generation has ended.
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// Stops the sequence (the client went away, or asked to stop).
    pub fn cancel(&mut self) {
        if !self.finished {
            self.finish(Finish::Cancelled);
        }
    }

    /// Prompt tokens and tokens generated so far.
    pub fn usage(&self) -> (usize, usize) {
        (self.out.prompt_tokens, self.out.tokens.len())
    }

    fn finish(&mut self, why: Finish) {
        self.finished = true;
        self.out.finish = why;
        self.out.decode_ms = self.decode_started.elapsed().as_secs_f64() * 1000.0;
    }

    /// The finished completion.
    pub fn into_completion(mut self) -> Completion {
        if !self.finished {
            self.finish(Finish::Length);
        }
        self.out
    }

    /// Samples the next token from the current logits (see [`Engine::next_token`]).
    pub(crate) fn sample_next(
        &mut self,
        tokenizer: &Tokenizer,
    ) -> Result<Option<TokenEvent>, EngineError> {
        // A queued prompt has no logits yet: nothing to sample, and not finished.
        if self.finished || !self.logits_current() {
            return Ok(None);
        }
        if self.out.tokens.len() >= self.params.max_tokens {
            self.finish(Finish::Length);
            return Ok(None);
        }
        let s = self.choose()?;
        if tokenizer.stop_ids.contains(&s.token) || self.params.stop_tokens.contains(&s.token) {
            self.finish(Finish::Stop);
            return Ok(None);
        }
        let complete = self.follow_grammar(s.token)?;
        self.out.tokens.push(s.token);
        self.out.logprobs.push(s.logprob);
        self.out.entropies.push(s.entropy);
        self.context.push(s.token);
        let text = self.settle_text(tokenizer, complete)?;
        Ok(Some(TokenEvent {
            token: s.token,
            text,
            logprob: s.logprob,
            entropy: s.entropy,
        }))
    }

    /// The next token, drawn from the logits under the grammar's mask when constrained (so
    /// its log-probability and entropy are those of the tokens the grammar allows).
    fn choose(&mut self) -> Result<sample::Sampled, GrammarError> {
        let sampling = &self.params.sampling;
        let Some(c) = &mut self.constraint else {
            return Ok(sample::sample(
                &self.logits,
                sampling,
                &self.context,
                &mut self.rng,
            ));
        };
        let mut allowed = self.logits.clone();
        let masking = Instant::now();
        c.mask(&mut allowed)?;
        self.out.grammar_ms += masking.elapsed().as_secs_f64() * 1000.0;
        Ok(sample::sample(
            &allowed,
            sampling,
            &self.context,
            &mut self.rng,
        ))
    }

    /// Advances the grammar past `token`; whether the answer is now complete.
    fn follow_grammar(&mut self, token: u32) -> Result<bool, GrammarError> {
        let Some(c) = &mut self.constraint else {
            return Ok(false);
        };
        let advancing = Instant::now();
        c.accept(token)?;
        self.out.grammar_ms += advancing.elapsed().as_secs_f64() * 1000.0;
        Ok(c.is_complete())
    }

    /// Decodes the answer so far, ends it at a stop string, a complete grammar or a limit,
    /// and returns the text that became safe to show.
    fn settle_text(
        &mut self,
        tokenizer: &Tokenizer,
        complete: bool,
    ) -> Result<String, EngineError> {
        let full = tokenizer.decode(&self.out.tokens)?;
        let (stable, stopped) = stable_text(&full, &self.params.stop);
        // A finished grammar holds nothing back: no later text can complete a stop string.
        let shown = if complete && !stopped {
            full.len()
        } else {
            stable
        };
        let text = full.get(self.emitted..shown).unwrap_or("").to_string();
        self.emitted = shown.max(self.emitted);
        if stopped {
            self.out.text = full[..stable].to_string();
            self.finish(Finish::Stop);
            return Ok(text);
        }
        self.out.text = full;
        // The token just sampled still needs a cache position before it can be fed.
        let cache_full = self.context.len() > self.cache.room();
        if complete {
            self.finish(Finish::Stop);
        } else if cache_full || self.out.tokens.len() >= self.params.max_tokens {
            self.finish(Finish::Length);
        }
        Ok(text)
    }

    /// The prompt's keys and values, once they are all computed, to start later prompts
    /// that share a beginning with this one; `None` also where the cache is not worth copying.
    pub fn prompt_prefix(&self) -> Option<PromptPrefix<C>> {
        let n = self.out.prompt_tokens;
        if self.fed < n || self.cache.filled() < n {
            return None;
        }
        Some(PromptPrefix {
            tokens: self.context[..n].to_vec(),
            cache: self.cache.prefix(n)?,
        })
    }
}

/// The text side of a GGUF: tokenizer, chat template and the model's declared identity.
pub(crate) struct TextParts {
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
    pub languages: Vec<String>,
    pub name: Option<String>,
}

impl TextParts {
    pub(crate) fn from_gguf<S: ByteSource>(g: &Gguf<S>) -> Result<Self, EngineError> {
        let tokenizer = Tokenizer::from_gguf(g)?;
        let piece = |id: Option<u32>| id.and_then(|i| tokenizer.piece(i)).unwrap_or_default();
        let template = match g.get("tokenizer.chat_template").and_then(|v| v.as_str()) {
            Some(src) => {
                ChatTemplate::new(src, &piece(tokenizer.bos), &piece(Some(tokenizer.eos)))?
            }
            // No template in the file: the turn format its vocabulary has tokens for.
            None if tokenizer.token_id("<start_of_turn>").is_some() => ChatTemplate::gemma(),
            None => ChatTemplate::chatml(),
        };
        let languages = g
            .get("general.languages")
            .and_then(|v| v.as_array())
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        let name = g
            .get("general.name")
            .and_then(|v| v.as_str())
            .map(str::to_string);
        Ok(Self {
            tokenizer,
            template,
            languages,
            name,
        })
    }
}

/// The prompt's token ids under `tokenizer` and `template`.
pub(crate) fn encode_prompt(
    tokenizer: &Tokenizer,
    template: &ChatTemplate,
    prompt: Prompt<'_>,
) -> Result<Vec<u32>, EngineError> {
    let ids = match prompt {
        Prompt::Text(t) => tokenizer.encode(t)?,
        Prompt::Messages(m) => tokenizer.encode(&template.render(m, true)?)?,
        Prompt::WithTools(m, tools) => {
            tokenizer.encode(&template.render_with_tools(m, tools, true)?)?
        }
        Prompt::Continue(m) => tokenizer.encode(&template.render_continuing(m)?)?,
        Prompt::Tokens(t) => t.to_vec(),
    };
    if ids.is_empty() {
        return Err(EngineError::EmptyPrompt);
    }
    Ok(ids)
}

/// The prompt's ids with their cache, if it has room after them for at least one generated
/// token.
fn with_room<C: ModelCache>(ids: Vec<u32>, cache: C) -> Result<(Vec<u32>, C), EngineError> {
    if ids.len() >= cache.room() {
        return Err(EngineError::PromptTooLong {
            prompt: ids.len(),
            context: cache.room(),
        });
    }
    Ok((ids, cache))
}

/// A prefilled prompt: its ids, its cache, and the logits of its last position.
pub type Prefilled<C> = (Vec<u32>, C, Vec<f32>);

/// A loaded model with its tokenizer and chat template: the CPU [`Model`] (the default) or a
/// model on a burn device (`Engine<DeviceModel>`). Everything but the forward pass is written
/// here once, over [`CausalLm`].
pub struct Engine<M = Model> {
    pub model: M,
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
    /// `general.languages` of the GGUF (empty when unspecified).
    pub languages: Vec<String>,
    /// `general.name` of the GGUF, when it has one.
    pub name: Option<String>,
    /// The grammar compiler for this vocabulary, built on the first constrained request.
    grammars: std::sync::OnceLock<Result<Grammars, GrammarError>>,
}

impl<M: std::fmt::Debug> std::fmt::Debug for Engine<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("name", &self.name)
            .field("model", &self.model)
            .finish()
    }
}

impl Engine<Model> {
    /// Loads model, tokenizer and template from a GGUF source; RoPE covers `max_context`.
    pub fn load<S: ByteSource>(source: S, max_context: usize) -> Result<Self, EngineError> {
        let g = Gguf::read(source)?;
        let model = Model::load(&g, max_context)?;
        Self::with_model(&g, model)
    }
}

#[cfg(feature = "device")]
impl Engine<crate::device_model::DeviceModel> {
    /// Loads tokenizer and template from a GGUF source and uploads its weights to `device`;
    /// caches hold at most `max_context` positions.
    pub fn load_on<S: ByteSource>(
        source: S,
        max_context: usize,
        device: &crate::Device,
    ) -> Result<Self, EngineError> {
        let g = Gguf::read(source)?;
        let model = crate::device_model::DeviceModel::load(&g, max_context, device)?;
        Self::with_model(&g, model)
    }
}

impl<M: CausalLm> Engine<M> {
    /// `model` with the tokenizer, template and identity of the GGUF it was loaded from.
    fn with_model<S: ByteSource>(g: &Gguf<S>, model: M) -> Result<Self, EngineError> {
        let text = TextParts::from_gguf(g)?;
        Ok(Self {
            model,
            tokenizer: text.tokenizer,
            template: text.template,
            languages: text.languages,
            name: text.name,
            grammars: std::sync::OnceLock::new(),
        })
    }

    /// The grammar state for one answer in `format` (for [`GenerateParams::constraint`]);
    /// an invalid schema is an error here, before anything is generated.
    pub fn constrain(&self, format: &OutputFormat) -> Result<Constraint, GrammarError> {
        let grammars = self.grammars.get_or_init(|| Grammars::new(&self.tokenizer));
        grammars.as_ref().map_err(Clone::clone)?.compile(format)
    }

    /// The prompt's token ids.
    pub fn prompt_tokens(&self, prompt: Prompt<'_>) -> Result<Vec<u32>, EngineError> {
        encode_prompt(&self.tokenizer, &self.template, prompt)
    }

    /// A fresh cache sized for `context` positions.
    pub fn new_cache(&self, context: usize) -> M::Cache {
        self.model.new_cache(context)
    }

    /// The prompt's ids and an empty cache of `context` positions with room for them and
    /// at least one generated token.
    fn prompt_and_cache(
        &self,
        prompt: Prompt<'_>,
        context: usize,
    ) -> Result<(Vec<u32>, M::Cache), EngineError> {
        with_room(self.prompt_tokens(prompt)?, self.model.new_cache(context))
    }

    /// Samples the sequence's next token from its current logits. Returns the event to stream
    /// (its text may be empty while a character or a possible stop string is pending), or
    /// `None` once the sequence has finished. Does not run the model: see [`Engine::advance`].
    pub fn next_token(
        &self,
        seq: &mut Sequence<M::Cache>,
    ) -> Result<Option<TokenEvent>, EngineError> {
        seq.sample_next(&self.tokenizer)
    }

    /// Tokenizes the prompt and sets up its cache without running the model: the sequence
    /// is prefilled by the following [`Engine::step`]s, batched with the others.
    pub fn queue(
        &self,
        prompt: Prompt<'_>,
        params: &GenerateParams,
    ) -> Result<Sequence<M::Cache>, EngineError> {
        self.queue_after(prompt, params, None)
    }

    /// [`Engine::queue`], starting from `prefix`'s keys and values for as many leading
    /// tokens as the prompt shares with it (all but the prompt's last, whose logits are
    /// needed). The answer is the same as without it, bit for bit.
    pub fn queue_after(
        &self,
        prompt: Prompt<'_>,
        params: &GenerateParams,
        prefix: Option<&PromptPrefix<M::Cache>>,
    ) -> Result<Sequence<M::Cache>, EngineError> {
        let ids = self.prompt_tokens(prompt)?;
        let shared = prefix.map_or(0, |p| p.shared_with(&ids));
        let reused = prefix
            .filter(|_| shared > 0)
            .and_then(|p| p.cache.prefix(shared));
        let (cache, shared) = match reused {
            Some(mut cache) => {
                self.model.reserve(&mut cache, params.context);
                (cache, shared)
            }
            None => (self.model.new_cache(params.context), 0),
        };
        let (ids, cache) = with_room(ids, cache)?;
        let mut seq = Sequence::queued(cache, ids, params);
        seq.fed = shared;
        seq.reused = shared;
        Ok(seq)
    }

    /// [`Engine::prefill`], awaited.
    pub async fn prefill_async(
        &self,
        prompt: Prompt<'_>,
        context: usize,
    ) -> Result<Prefilled<M::Cache>, EngineError> {
        let (ids, mut cache) = self.prompt_and_cache(prompt, context)?;
        let logits = self.model.forward_last(&ids, &mut cache).await?;
        Ok((ids, cache, logits))
    }

    /// [`Engine::start`], awaited.
    pub async fn start_async(
        &self,
        prompt: Prompt<'_>,
        params: &GenerateParams,
    ) -> Result<Sequence<M::Cache>, EngineError> {
        let t0 = Instant::now();
        let (prompt_ids, cache, logits) = self.prefill_async(prompt, params.context).await?;
        let prefill_ms = t0.elapsed().as_secs_f64() * 1000.0;
        Ok(Sequence::prefilled(
            cache, logits, prompt_ids, params, prefill_ms,
        ))
    }

    /// [`Engine::step`], awaited.
    pub async fn step_async(
        &self,
        seqs: &mut [&mut Sequence<M::Cache>],
        prefill_budget: usize,
    ) -> Result<(), EngineError> {
        let Some(feed) = Feed::plan(seqs, prefill_budget) else {
            return Ok(());
        };
        let logits = {
            let mut caches = feed.caches(seqs);
            let chunks: Vec<&[u32]> = feed.chunks.iter().map(Vec::as_slice).collect();
            self.model
                .forward_chunks(&chunks, &mut caches, &feed.want)
                .await?
        };
        feed.apply(seqs, logits);
        Ok(())
    }

    /// [`Engine::generate`], awaited.
    pub async fn generate_async(
        &self,
        prompt: Prompt<'_>,
        params: &GenerateParams,
        mut on_token: impl FnMut(&TokenEvent) -> Flow,
    ) -> Result<Completion, EngineError> {
        let mut seq = self.start_async(prompt, params).await?;
        while let Some(ev) = self.next_token(&mut seq)? {
            if (!ev.text.is_empty() || !seq.is_finished()) && on_token(&ev) == Flow::Cancel {
                seq.cancel();
            }
            self.step_async(&mut [&mut seq], usize::MAX).await?;
        }
        Ok(seq.into_completion())
    }
}

impl<M: BlockingLm> Engine<M> {
    /// Generates a completion, calling `on_token` after every token; `on_token` returning
    /// [`Flow::Cancel`] stops before the next forward pass.
    pub fn generate(
        &self,
        prompt: Prompt<'_>,
        params: &GenerateParams,
        on_token: impl FnMut(&TokenEvent) -> Flow,
    ) -> Result<Completion, EngineError> {
        ready(self.generate_async(prompt, params, on_token))
    }

    /// Starts a sequence: tokenizes and prefills the prompt.
    pub fn start(
        &self,
        prompt: Prompt<'_>,
        params: &GenerateParams,
    ) -> Result<Sequence<M::Cache>, EngineError> {
        ready(self.start_async(prompt, params))
    }

    /// Tokenizes `prompt` and runs it through a fresh cache of `context` positions: the
    /// prompt's ids, the cache, and the logits of its last position.
    pub fn prefill(
        &self,
        prompt: Prompt<'_>,
        context: usize,
    ) -> Result<Prefilled<M::Cache>, EngineError> {
        ready(self.prefill_async(prompt, context))
    }

    /// Runs one decode step for every unfinished sequence in one batched forward pass,
    /// feeding each its last sampled token (and any queued prompt whole).
    pub fn advance(&self, seqs: &mut [&mut Sequence<M::Cache>]) -> Result<(), EngineError> {
        self.step(seqs, usize::MAX)
    }

    /// One forward pass for a batch (continuous batching): every decoding sequence feeds its
    /// last sampled token, and sequences still prefilling feed their prompts, in order, up to
    /// `prefill_budget` prompt tokens in all — so a long prompt never stalls the others'
    /// streams for longer than one chunk.
    pub fn step(
        &self,
        seqs: &mut [&mut Sequence<M::Cache>],
        prefill_budget: usize,
    ) -> Result<(), EngineError> {
        ready(self.step_async(seqs, prefill_budget))
    }
}

/// What one continuous-batching step feeds (see [`Engine::step`]): for every sequence that
/// feeds any tokens, its index, its chunk and whether its logits are wanted.
struct Feed {
    seqs: Vec<usize>,
    chunks: Vec<Vec<u32>>,
    want: Vec<bool>,
}

impl Feed {
    /// Decoding sequences feed their last sampled token; prefilling ones feed their prompts,
    /// in order, up to `prefill_budget` tokens in all. `None` when nothing feeds.
    fn plan<C: ModelCache>(seqs: &[&mut Sequence<C>], prefill_budget: usize) -> Option<Self> {
        let mut budget = prefill_budget;
        let mut feed = Feed {
            seqs: Vec::new(),
            chunks: Vec::new(),
            want: Vec::new(),
        };
        for (i, s) in seqs.iter().enumerate() {
            let unfed = s.context.len().saturating_sub(s.fed);
            if s.finished || unfed == 0 {
                continue;
            }
            let take = if s.is_decoding() {
                unfed
            } else {
                let take = unfed.min(budget);
                budget -= take;
                take
            };
            if take > 0 {
                feed.seqs.push(i);
                feed.chunks.push(s.context[s.fed..s.fed + take].to_vec());
                feed.want.push(s.fed + take == s.context.len());
            }
        }
        (!feed.seqs.is_empty()).then_some(feed)
    }

    /// The fed sequences' caches, in feed order.
    fn caches<'a, C: ModelCache>(&self, seqs: &'a mut [&mut Sequence<C>]) -> Vec<&'a mut C> {
        let mut next = self.seqs.iter().peekable();
        let mut caches = Vec::with_capacity(self.seqs.len());
        for (i, s) in seqs.iter_mut().enumerate() {
            if next.peek() == Some(&&i) {
                next.next();
                caches.push(&mut s.cache);
            }
        }
        caches
    }

    /// Marks the chunks fed and installs the logits that came back.
    fn apply<C: ModelCache>(self, seqs: &mut [&mut Sequence<C>], logits: Vec<Option<Vec<f32>>>) {
        for ((&i, chunk), l) in self.seqs.iter().zip(&self.chunks).zip(logits) {
            let s = &mut *seqs[i];
            let prefilling = !s.is_decoding();
            s.fed += chunk.len();
            if let Some(l) = l {
                s.logits = l;
                if prefilling {
                    s.out.prefill_ms = s.queued_at.elapsed().as_secs_f64() * 1000.0;
                    s.decode_started = Instant::now();
                }
            }
        }
    }
}

/// How much of `text` is safe to show: up to a stop string (and whether one was found),
/// holding back an incomplete UTF-8 character or a possible start of a stop string.
pub(crate) fn stable_text(text: &str, stops: &[String]) -> (usize, bool) {
    let mut first_stop = None;
    for s in stops.iter().filter(|s| !s.is_empty()) {
        if let Some(i) = text.find(s.as_str()) {
            first_stop = Some(first_stop.map_or(i, |f: usize| f.min(i)));
        }
    }
    if let Some(i) = first_stop {
        return (i, true);
    }
    let mut end = text.len();
    if text.ends_with('\u{FFFD}') {
        end -= '\u{FFFD}'.len_utf8();
    }
    for s in stops {
        for k in (1..s.len()).rev() {
            if s.is_char_boundary(k) && text[..end].ends_with(&s[..k]) {
                end = end.min(text[..end].len() - k);
                break;
            }
        }
    }
    (end, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_strings_cut_and_partial_stops_are_held_back() {
        let stops = vec!["\n\nUser:".to_string()];
        assert_eq!(stable_text("Hello\n\nUser: hi", &stops), (5, true));
        assert_eq!(stable_text("Hello\n\nUs", &stops), (5, false));
        assert_eq!(stable_text("Hello", &stops), (5, false));
        assert_eq!(stable_text("caf\u{FFFD}", &[]), (3, false));
    }
}
