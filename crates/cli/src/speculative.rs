//! The client side of edge-draft / cloud-verify: drafts on the local engine, verifies each
//! draft with one `/v1/verify` call (to the worker or straight to a cloud server), hands the
//! rest of the answer to plain cloud streaming when drafts keep being rejected, and goes on
//! with the edge alone if the verifier fails.

use std::time::{Duration, Instant};

use straddle_engine::speculative::{DraftLength, Speculation, SpeculationStats, Verdict};
use straddle_engine::{ChatMessage, Engine, GenerateParams, Prompt};
use straddle_protocol::{VerifyRequest, VerifyResponse};

/// Why a verify call failed.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error("verifier unreachable: {0}")]
    Transport(String),
    #[error("verifier answered {status}: {message}")]
    Status { status: u16, message: String },
    #[error("verifier sent an unreadable answer: {0}")]
    Body(String),
}

/// A `/v1/verify` endpoint with one session for one generation.
pub struct RemoteVerifier {
    agent: ureq::Agent,
    url: String,
    token: Option<String>,
    session: String,
    tokenizer_hash: String,
    temperature: f32,
    top_p: f32,
    seed: u64,
    /// Whether the server holds our session (after the first answer).
    started: bool,
    /// Calls that had to re-send the prefix after the server lost the session.
    pub restarts: usize,
}

impl RemoteVerifier {
    /// A verifier at `base` (the worker or cloud URL, without `/v1/verify`).
    pub fn new(
        base: &str,
        token: Option<String>,
        engine: &Engine,
        params: &GenerateParams,
        timeout: Duration,
    ) -> Self {
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(timeout))
            .http_status_as_error(false)
            .build()
            .new_agent();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        Self {
            agent,
            url: format!("{}/v1/verify", base.trim_end_matches('/')),
            token,
            session: format!("cli-{}-{nanos:x}", std::process::id()),
            tokenizer_hash: engine.tokenizer.hash.clone(),
            temperature: params.sampling.temperature,
            top_p: params.sampling.top_p,
            seed: params.sampling.seed,
            started: false,
            restarts: 0,
        }
    }

    /// Verifies `draft` after `prompt` and the `emitted` tokens.
    pub fn verify(
        &mut self,
        prompt: &[u32],
        emitted: &[u32],
        draft: &[u32],
    ) -> Result<Verdict, VerifyError> {
        match self.call(prompt, emitted, draft) {
            Err(VerifyError::Status {
                status: 409,
                message,
            }) if self.started => {
                // The server dropped the session (restart, expiry, a lost answer): once more
                // with the whole prefix, which is exact whatever it had.
                tracing::debug!(%message, "verify session lost; re-sending the prefix");
                self.started = false;
                self.restarts += 1;
                self.call(prompt, emitted, draft)
            }
            other => other,
        }
    }

    fn call(
        &mut self,
        prompt: &[u32],
        emitted: &[u32],
        draft: &[u32],
    ) -> Result<Verdict, VerifyError> {
        let mut req = VerifyRequest {
            draft_tokens: draft.to_vec(),
            temperature: Some(self.temperature),
            top_p: (self.top_p < 1.0).then_some(self.top_p),
            seed: Some(self.seed),
            tokenizer_hash: Some(self.tokenizer_hash.clone()),
            session: Some(self.session.clone()),
            ..Default::default()
        };
        if self.started {
            req.session_length = Some((prompt.len() + emitted.len()) as u32);
        } else {
            let mut prefix = prompt.to_vec();
            prefix.extend_from_slice(emitted);
            req.prefix_tokens = Some(prefix);
        }
        let body = serde_json::to_vec(&req).map_err(|e| VerifyError::Body(e.to_string()))?;
        let mut request = self
            .agent
            .post(&self.url)
            .header("content-type", "application/json");
        if let Some(t) = &self.token {
            request = request.header("authorization", &format!("Bearer {t}"));
        }
        let mut resp = request
            .send(&body[..])
            .map_err(|e| VerifyError::Transport(e.to_string()))?;
        let status = resp.status().as_u16();
        let text = resp
            .body_mut()
            .read_to_string()
            .map_err(|e| VerifyError::Transport(e.to_string()))?;
        if status != 200 {
            let message = serde_json::from_str::<serde_json::Value>(&text)
                .ok()
                .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
                .unwrap_or(text);
            return Err(VerifyError::Status { status, message });
        }
        let v: VerifyResponse =
            serde_json::from_str(&text).map_err(|e| VerifyError::Body(e.to_string()))?;
        self.started = true;
        Ok(Verdict {
            accepted: v.accepted as usize,
            next_token: v.next_token,
        })
    }
}

/// Where and when speculation gives way to plain cloud streaming.
#[derive(Debug, Clone, Copy)]
pub struct HandOff<'a> {
    /// Draft acceptance below which, after four verify calls, the cloud streams the rest.
    pub below: f32,
    /// The worker or cloud URL.
    pub base: &'a str,
    pub token: Option<&'a str>,
    pub timeout: Duration,
}

/// What one speculative generation did.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub text: String,
    /// The tokens settled by speculation (and the edge alone); see `streamed_tokens`.
    pub tokens: Vec<u32>,
    /// Tokens shown when the answer was handed to plain cloud streaming, if it was.
    pub handed_off_after: Option<usize>,
    /// Tokens streamed after the hand-off (by the cloud, or the edge if the cloud failed).
    pub streamed_tokens: usize,
    pub stats: SpeculationStats,
    /// Why the edge went on alone, if it did.
    pub degraded: Option<String>,
    pub elapsed: Duration,
    /// Running acceptance rate and draft length at the end.
    pub acceptance: f32,
    pub final_k: usize,
}

impl Outcome {
    /// Tokens in the whole answer.
    pub fn total_tokens(&self) -> usize {
        self.tokens.len() + self.streamed_tokens
    }
}

/// Generates an answer to `messages`: the local engine drafts, `verifier` verifies; `on_text`
/// gets the text as it is settled.
pub fn generate(
    engine: &Engine,
    messages: &[ChatMessage],
    params: &GenerateParams,
    lengths: DraftLength,
    verifier: &mut RemoteVerifier,
    hand_off: Option<HandOff<'_>>,
    mut on_text: impl FnMut(&str),
) -> anyhow::Result<Outcome> {
    let started = Instant::now();
    let mut spec = Speculation::start(engine, Prompt::Messages(messages), params, lengths)?;
    let mut degraded: Option<String> = None;
    let mut handed_off = false;
    loop {
        if degraded.is_none() {
            let Some(draft) = spec.draft(engine)? else {
                break;
            };
            let draft = draft.to_vec();
            match verifier.verify(spec.prompt(), spec.tokens(), &draft) {
                Ok(v) => {
                    on_text(&spec.settle(engine, v)?);
                    if let Some(h) = hand_off
                        && spec.finish().is_none()
                        && spec.lengths().should_fall_back(h.below)
                    {
                        handed_off = true;
                        break;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "verification failed; the edge goes on alone");
                    degraded = Some(e.to_string());
                }
            }
        } else {
            match spec.step_alone(engine)? {
                Some(t) => on_text(&t),
                None => break,
            }
        }
    }
    let mut text = spec.text().to_string();
    let mut streamed_tokens = 0;
    if let Some(h) = hand_off.filter(|_| handed_off) {
        let rest = GenerateParams {
            max_tokens: params.max_tokens - spec.tokens().len(),
            ..params.clone()
        };
        let (more, tokens, failed) =
            continue_elsewhere(engine, messages, &text, &rest, h, &mut on_text);
        text.push_str(&more);
        streamed_tokens = tokens;
        degraded = failed;
    }
    Ok(Outcome {
        text,
        handed_off_after: handed_off.then(|| spec.tokens().len()),
        streamed_tokens,
        tokens: spec.tokens().to_vec(),
        stats: spec.stats(),
        degraded,
        elapsed: started.elapsed(),
        acceptance: spec.lengths().acceptance(),
        final_k: spec.lengths().k(),
    })
}

/// The rest of an answer after a hand-off: streamed by the cloud, continuing the text shown;
/// if the cloud fails part-way, the edge continues the same turn from everything shown.
/// Returns the new text, its token count and why it is degraded, if it is.
fn continue_elsewhere(
    engine: &Engine,
    messages: &[ChatMessage],
    shown: &str,
    params: &GenerateParams,
    h: HandOff<'_>,
    on_text: &mut impl FnMut(&str),
) -> (String, usize, Option<String>) {
    let turn = |text: &str| {
        let mut m = messages.to_vec();
        m.push(ChatMessage::new("assistant", text));
        m
    };
    let mut more = String::new();
    let streamed = crate::cloud_client::stream_cloud(
        h.base,
        h.token,
        &turn(shown),
        params,
        h.timeout,
        true,
        |t| {
            more.push_str(t);
            on_text(t);
        },
    );
    let failure = match streamed {
        Ok(s) => return (more, s.completion_tokens as usize, None),
        Err(e) => e,
    };
    tracing::warn!(error = %failure, "the hand-off to the cloud failed; the edge finishes");
    let so_far = format!("{shown}{more}");
    let mut tokens = 0;
    let edge = engine.generate(Prompt::Continue(&turn(&so_far)), params, |ev| {
        tokens += 1;
        more.push_str(&ev.text);
        on_text(&ev.text);
        straddle_engine::Flow::Continue
    });
    let why = match edge {
        Ok(_) => format!("the hand-off to the cloud failed ({failure}); the edge finished"),
        Err(e) => format!("the hand-off to the cloud failed ({failure}) and so did the edge ({e})"),
    };
    (more, tokens, Some(why))
}
