//! `/v1/verify`: one forward pass over an edge draft, greedy or sampled, with sessions that
//! keep a generation's KV cache between calls so each call carries only the new draft.
//!
//! A session's token list outlives its KV cache: the cache (tens of MB) is dropped after
//! `kv_idle` or when more than `max_live` sessions hold one, and the next call re-prefills it
//! from the tokens without the client noticing. Only when the session itself is gone (idle
//! for `token_idle`, or the server restarted) does a continuing call get a 409
//! `session_unknown`, on which the client re-sends its prefix.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::response::{IntoResponse, Response};
use straddle_engine::ChatMessage;
use straddle_engine::Tokenizer;
use straddle_engine::sample::Rng;
use straddle_engine::sample::SamplingParams;
use straddle_engine::speculative;
use straddle_protocol::{ApiError, ErrorKind, Usage, VerifyRequest, VerifyResponse};

use crate::backend::{Served, ServedModel};
use crate::error::ErrorResponse;

/// Drafts longer than this are refused: the verify pass is one batched forward.
const MAX_DRAFT: usize = 64;
/// Positions a session's cache grows by beyond what it needs now.
const HEADROOM: usize = 64;

/// One generation's state between verify calls.
struct Session<C> {
    /// Prefix and every token emitted so far; the last is pending (not in the cache yet).
    tokens: Vec<u32>,
    /// How many of `tokens` are the prefix the session began with: the prompt, which plain
    /// generation computes in one pass, where it decodes each emitted token alone.
    prompt_len: usize,
    /// Holds `tokens` but the last, while live.
    cache: Option<C>,
    params: SamplingParams,
    rng: Rng,
    last_used: Instant,
}

/// The verify sessions of a server.
pub struct Sessions<C> {
    map: Mutex<HashMap<String, Session<C>>>,
    kv_idle: Duration,
    token_idle: Duration,
    max_live: usize,
}

impl<C> std::fmt::Debug for Sessions<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions")
            .field("kv_idle", &self.kv_idle)
            .field("max_live", &self.max_live)
            .finish_non_exhaustive()
    }
}

impl<C> Default for Sessions<C> {
    fn default() -> Self {
        Self::new(Duration::from_secs(60), 16)
    }
}

impl<C> Sessions<C> {
    /// Sessions whose caches are dropped after `kv_idle` or beyond `max_live` live ones; their
    /// token lists are kept ten times longer.
    pub fn new(kv_idle: Duration, max_live: usize) -> Self {
        Self {
            map: Mutex::new(HashMap::new()),
            kv_idle,
            token_idle: kv_idle * 10,
            max_live: max_live.max(1),
        }
    }

    /// Sessions currently holding a KV cache.
    pub fn live(&self) -> usize {
        self.lock().values().filter(|s| s.cache.is_some()).count()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Session<C>>> {
        // A panic elsewhere while holding the lock leaves a map that is still consistent.
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn take(&self, id: &str) -> Option<Session<C>> {
        self.lock().remove(id)
    }

    fn put(&self, id: String, session: Session<C>) {
        let now = Instant::now();
        let mut map = self.lock();
        map.insert(id, session);
        map.retain(|_, s| now.duration_since(s.last_used) < self.token_idle);
        for s in map.values_mut() {
            if now.duration_since(s.last_used) >= self.kv_idle {
                s.cache = None;
            }
        }
        let mut live: Vec<(Instant, &mut Session<C>)> = map
            .values_mut()
            .filter(|s| s.cache.is_some())
            .map(|s| (s.last_used, s))
            .collect();
        if live.len() > self.max_live {
            live.sort_by_key(|(t, _)| *t);
            let excess = live.len() - self.max_live;
            for (_, s) in live.into_iter().take(excess) {
                s.cache = None;
            }
        }
    }
}

/// `/v1/verify` over a served model, whatever its backend.
pub trait Verify: Send + Sync + 'static {
    /// Runs one verify call (blocking: a forward pass).
    fn run(&self, req: VerifyRequest) -> Result<VerifyResponse, ApiError>;
}

/// A model and its verify sessions.
pub struct Verifier<M: ServedModel> {
    served: Arc<Served<M>>,
    sessions: Sessions<M::Cache>,
}

impl<M: ServedModel> Verifier<M> {
    /// Verifies against `served`, keeping sessions in `sessions`.
    pub fn new(served: Arc<Served<M>>, sessions: Sessions<M::Cache>) -> Self {
        Self { served, sessions }
    }
}

impl<M: ServedModel> Verify for Verifier<M> {
    fn run(&self, req: VerifyRequest) -> Result<VerifyResponse, ApiError> {
        run(&*self.served, &self.sessions, req)
    }
}

/// Checks a draft against the served model.
pub async fn verify(verifier: Arc<dyn Verify>, req: VerifyRequest) -> Response {
    if let Err(e) = check(&req) {
        return ErrorResponse(e).into_response();
    }
    let result = tokio::task::spawn_blocking(move || verifier.run(req)).await;
    match result {
        Ok(Ok(v)) => axum::Json(v).into_response(),
        Ok(Err(e)) => ErrorResponse(e).into_response(),
        Err(_) => ErrorResponse(ApiError::new(
            ErrorKind::Internal,
            "verification task failed",
        ))
        .into_response(),
    }
}

fn check(req: &VerifyRequest) -> Result<(), ApiError> {
    if req
        .temperature
        .is_some_and(|t| !t.is_finite() || !(0.0..=2.0).contains(&t))
    {
        return Err(ApiError::invalid("temperature", "must be between 0 and 2"));
    }
    if req
        .top_p
        .is_some_and(|p| !p.is_finite() || p <= 0.0 || p > 1.0)
    {
        return Err(ApiError::invalid("top_p", "must be in (0, 1]"));
    }
    if req.draft_tokens.is_empty() || req.draft_tokens.len() > MAX_DRAFT {
        return Err(ApiError::invalid(
            "draft_tokens",
            format!("must hold 1 to {MAX_DRAFT} tokens"),
        ));
    }
    // Exactness at temperature > 0 rests on a deterministic draft (see the engine's
    // `speculative` module); a sampled draft would need its whole distribution.
    if req.temperature.is_some_and(|t| t > 0.0) && req.draft_probs.iter().any(|&p| p < 1.0) {
        return Err(ApiError::invalid(
            "draft_probs",
            "sampled verification needs a greedy draft: leave draft_probs empty or all 1.0",
        ));
    }
    if req
        .session
        .as_ref()
        .is_some_and(|s| s.is_empty() || s.len() > 128)
    {
        return Err(ApiError::invalid("session", "must be 1 to 128 characters"));
    }
    if req.continues_session() && req.session_length.is_none() {
        return Err(ApiError::invalid(
            "session_length",
            "a call that continues a session must say how many tokens it holds",
        ));
    }
    Ok(())
}

fn internal(err: impl std::fmt::Display) -> ApiError {
    ApiError::new(ErrorKind::Internal, err.to_string())
}

fn session_error(code: &str, message: String) -> ApiError {
    ApiError::new(ErrorKind::Conflict, message).with_code(code)
}

fn run<M: ServedModel>(
    e: &Served<M>,
    sessions: &Sessions<M::Cache>,
    req: VerifyRequest,
) -> Result<VerifyResponse, ApiError> {
    let vocab = check_drafts(e.tokenizer(), &req)?;
    let context = straddle_engine::DEFAULT_CONTEXT;
    let draft = &req.draft_tokens;
    let fresh = !req.continues_session();
    let mut session = match fresh {
        true => new_session(e, &req, vocab)?,
        false => continued_session(sessions, &req)?,
    };
    if session.tokens.len() + draft.len() + 1 > context {
        return Err(
            ApiError::invalid("draft_tokens", "prefix and draft exceed the context")
                .with_code("context_length_exceeded"),
        );
    }
    let needed = (session.tokens.len() + draft.len() + 1 + HEADROOM).min(context);
    // Tokens this call brings to the model (what it is billed for): the prefix of a fresh
    // session, or the pending token of a continuing one, and the draft.
    let forwarded = if fresh {
        session.tokens.len() + draft.len()
    } else {
        1 + draft.len()
    };
    let (cache, verdict) = if fresh {
        // The prompt in one pass, as plain generation prefills it, its last logits judging
        // the draft's first token: the same bits as the cloud's own greedy answer.
        let mut cache = e.new_cache(needed);
        let logits = e
            .prefill_logits(&session.tokens, &mut cache)
            .map_err(internal)?;
        let verdict = speculative::verify(
            &e.engine.model,
            &mut cache,
            &logits,
            draft,
            &session.params,
            &session.tokens,
            &mut session.rng,
        )
        .map_err(internal)?;
        (cache, verdict)
    } else {
        // A continuing call brings the previous verdict's token, pending, and verifies it
        // with the draft in one pass.
        let (pending, held) = session
            .tokens
            .split_last()
            .ok_or_else(|| internal("empty session"))?;
        let held = (held, session.prompt_len.min(held.len()));
        let mut cache = session_cache(e, session.cache.take(), held, needed)?;
        let verdict = speculative::verify_after(
            &e.engine.model,
            &mut cache,
            *pending,
            draft,
            &session.params,
            held.0,
            &mut session.rng,
        )
        .map_err(internal)?;
        (cache, verdict)
    };
    session.cache = Some(cache);
    session.tokens.extend_from_slice(&draft[..verdict.accepted]);
    session.tokens.push(verdict.next_token);
    session.last_used = Instant::now();
    let session_length = req.session.as_ref().map(|_| session.tokens.len() as u32);
    if let Some(id) = req.session {
        sessions.put(id, session);
    }
    Ok(VerifyResponse {
        accepted: verdict.accepted as u32,
        next_token: verdict.next_token,
        session_length,
        usage: Usage::new(forwarded as u32, 1),
    })
}

/// Refuses drafts made with another tokenizer (409) or ids outside the vocabulary (400);
/// returns the vocabulary's size.
fn check_drafts(tokenizer: &Tokenizer, req: &VerifyRequest) -> Result<u32, ApiError> {
    if let Some(theirs) = req
        .tokenizer_hash
        .as_ref()
        .filter(|h| **h != tokenizer.hash)
    {
        let message = format!(
            "tokenizer mismatch: request {theirs}, server {}",
            tokenizer.hash
        );
        return Err(ApiError::new(ErrorKind::Conflict, message).with_code("tokenizer_mismatch"));
    }
    let vocab = tokenizer.vocab_size() as u32;
    if let Some(bad) = req.draft_tokens.iter().find(|&&t| t >= vocab) {
        return Err(ApiError::invalid(
            "draft_tokens",
            format!("token id {bad} is outside the vocabulary of {vocab}"),
        ));
    }
    Ok(vocab)
}

/// The session a continuing call names, if it is known and holds as many tokens as the
/// client says.
fn continued_session<C>(
    sessions: &Sessions<C>,
    req: &VerifyRequest,
) -> Result<Session<C>, ApiError> {
    let id = req.session.as_deref().unwrap_or_default();
    let s = sessions.take(id).ok_or_else(|| {
        session_error(
            "session_unknown",
            format!("no verify session {id:?} (expired or never started): send the prefix"),
        )
    })?;
    let theirs = req.session_length.unwrap_or_default() as usize;
    if theirs != s.tokens.len() {
        // The session is dropped: after a lost response the client's view and ours differ,
        // and only a restart from the client's prefix is exact.
        return Err(session_error(
            "session_out_of_sync",
            format!(
                "session holds {} tokens, request says {theirs}: send the prefix",
                s.tokens.len()
            ),
        ));
    }
    Ok(s)
}

/// A session from the request's prefix and sampling settings, its cache still to be built.
fn new_session<M: ServedModel>(
    e: &Served<M>,
    req: &VerifyRequest,
    vocab: u32,
) -> Result<Session<M::Cache>, ApiError> {
    let prefix = prefix_tokens(e, req)?;
    if let Some(bad) = prefix.iter().find(|&&t| t >= vocab) {
        return Err(ApiError::invalid(
            "prefix_tokens",
            format!("token id {bad} is outside the vocabulary of {vocab}"),
        ));
    }
    let params = SamplingParams {
        temperature: req.temperature.unwrap_or(0.0),
        top_p: req.top_p.unwrap_or(1.0),
        seed: req.seed.unwrap_or(0),
        ..Default::default()
    };
    Ok(Session {
        prompt_len: prefix.len(),
        tokens: prefix,
        cache: None,
        rng: Rng::new(params.seed),
        params,
        last_used: Instant::now(),
    })
}

/// The session's cache grown to `needed`, or, for a session whose cache was dropped for
/// memory or idleness, one rebuilt from `held` (its first `prompt_len` tokens the prompt, in
/// one pass, the rest as each was decoded), transparently. A rebuild is not
/// billed: the caller asked for a continuation, and a budget holds only its new tokens.
fn session_cache<M: ServedModel>(
    e: &Served<M>,
    cache: Option<M::Cache>,
    (held, prompt_len): (&[u32], usize),
    needed: usize,
) -> Result<M::Cache, ApiError> {
    let mut cache = match cache {
        Some(c) => c,
        None => {
            let mut c = e.new_cache(needed);
            let (prompt, emitted) = held.split_at(prompt_len);
            if !prompt.is_empty() {
                e.prefill(prompt, &mut c).map_err(internal)?;
            }
            if !emitted.is_empty() {
                e.extend_decoded(emitted, &mut c).map_err(internal)?;
            }
            tracing::debug!(tokens = held.len(), "verify session re-prefilled");
            c
        }
    };
    e.reserve(&mut cache, needed);
    Ok(cache)
}

fn prefix_tokens<M: ServedModel>(e: &Served<M>, req: &VerifyRequest) -> Result<Vec<u32>, ApiError> {
    let prefix = match &req.prefix_tokens {
        Some(t) => t.clone(),
        None => {
            let msgs: Vec<ChatMessage> = req
                .messages
                .iter()
                .map(|m| ChatMessage::new(m.role.as_str(), m.content.clone()))
                .collect();
            e.prompt_tokens(&msgs)
                .map_err(|err| ApiError::invalid("messages", err.to_string()))?
        }
    };
    if prefix.is_empty() {
        return Err(ApiError::invalid(
            "prefix_tokens",
            "give the prefix as prefix_tokens or messages (or continue a session)",
        ));
    }
    Ok(prefix)
}
