//! `POST /v1/chat/completions`: authenticate the tenant, validate, re-check privacy, hold the
//! worst-case cost in the tenant's budget, forward, stream the answer back untouched while
//! counting it, then settle the hold from the real usage and write the cost record.
//!
//! Upstreams are tried in `upstreams::order`; a connect error, a 5xx, a 429 or a first-byte
//! timeout moves on to the next — always before a byte has reached the client.

use std::cell::RefCell;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context as TaskContext, Poll};

use futures_util::Stream;
use straddle_protocol::sse::{self, Parser};
use straddle_protocol::{ApiError, ChatChunk, ChatRequest, ChatResponse, ErrorKind};
use worker::{
    AbortController, ByteStream, Context, Delay, Env, Fetch, Headers, Method, Request, RequestInit,
    Response, Result,
};

use crate::admission::{Caller, caller, json_body, now_ms, settle};
use crate::budget::Record;
use crate::error::error_response;
use crate::upstreams::{self, Breakers, Upstream};

thread_local! {
    /// Circuit breakers live per isolate: each isolate learns on its own which upstreams fail.
    static BREAKERS: RefCell<Breakers> = RefCell::new(Breakers::default());
}

/// `max_tokens` assumed when a request gives none (the hold must have a bound).
const DEFAULT_MAX_TOKENS: u32 = 1024;

/// A conservative prompt size: two bytes a token (real tokenizers average three to four on
/// English, about one a character on Chinese — which is three bytes) plus framing per message.
fn prompt_tokens_bound(req: &ChatRequest) -> i64 {
    req.messages
        .iter()
        .map(|m| m.content.len().div_ceil(2) as i64 + 8)
        .sum()
}

/// USD per 1,000 tokens from a var, 0 when unset.
fn price(env: &Env, name: &str) -> f64 {
    env.var(name)
        .ok()
        .and_then(|v| v.to_string().parse().ok())
        .filter(|p: &f64| p.is_finite() && *p >= 0.0)
        .unwrap_or(0.0)
}

/// The configured upstreams. A single `UPSTREAM_URL` serves `/v1/verify` when
/// `UPSTREAM_SUPPORTS_VERIFY` is `true` (Straddle's cloud server does).
pub(crate) fn upstream_list(env: &Env) -> std::result::Result<Vec<Upstream>, String> {
    let var = |name: &str| env.var(name).map(|v| v.to_string()).ok();
    let mut list = upstreams::configured(
        var("UPSTREAMS").as_deref(),
        var("UPSTREAM_URL").as_deref(),
        price(env, "PRICE_IN_PER_1K"),
        price(env, "PRICE_OUT_PER_1K"),
    )?;
    if var("UPSTREAMS").is_none_or(|u| u.trim().is_empty())
        && var("UPSTREAM_SUPPORTS_VERIFY").as_deref() == Some("true")
    {
        for u in &mut list {
            u.supports_verify = true;
        }
    }
    Ok(list)
}

/// `POST /v1/chat/completions`.
pub async fn chat(mut req: Request, env: &Env, ctx: &Context) -> Result<Response> {
    let caller = match caller(&req, env).await? {
        Ok(c) => c,
        Err(refusal) => return Ok(refusal),
    };
    let (body, parsed) = match json_body::<ChatRequest>(&mut req).await? {
        Ok(got) => got,
        Err(refusal) => return Ok(refusal),
    };
    if let Err(e) = parsed
        .validate()
        .and_then(|()| caller.permits(&parsed.model, &parsed.messages))
    {
        return error_response(&e);
    }
    let list = match upstream_list(env) {
        Ok(l) => l,
        Err(message) => return error_response(&ApiError::new(ErrorKind::Unavailable, message)),
    };

    let max_tokens = parsed.token_limit().unwrap_or(DEFAULT_MAX_TOKENS);
    if let Some(cap) = caller.tenant.max_tokens_cap
        && i64::from(max_tokens) > cap
    {
        return error_response(&ApiError::invalid(
            "max_tokens",
            format!("this tenant allows at most {cap}"),
        ));
    }
    let prompt_bound = prompt_tokens_bound(&parsed);
    let hold = match caller
        .hold_worst_case(env, &list, prompt_bound, i64::from(max_tokens))
        .await?
    {
        Ok(h) => h,
        Err(refusal) => return Ok(refusal),
    };
    let Caller { claims, stub, .. } = caller;
    let started = hold.now_ms;
    let envelope = parsed.straddle.as_ref();

    let record =
        |upstream: &Upstream, outcome: &str, tokens_in: i64, tokens_out: i64, ttfb_ms: i64| {
            Record {
                id: hold.id.clone(),
                ts_ms: started,
                user: claims.sub.clone(),
                session: claims.sid.clone(),
                feature: claims.feat.clone().unwrap_or_default(),
                model: parsed.model.clone(),
                upstream: upstream.name.clone(),
                // What the page's router said, for the tenant's cost report (the envelope
                // is the page's claim; the worker's own checks do not depend on it).
                route_reason: envelope.map(|e| e.reasons.join("; ")).unwrap_or_default(),
                policy_version: envelope
                    .and_then(|e| e.policy_version.clone())
                    .unwrap_or_default(),
                tokens_in,
                tokens_out,
                usd: tokens_in as f64 / 1000.0 * upstream.price_in_per_1k
                    + tokens_out as f64 / 1000.0 * upstream.price_out_per_1k,
                ttfb_ms,
                total_ms: now_ms() - started,
                outcome: outcome.into(),
            }
        };

    let (upstream, mut resp) = match forward(&list, &body, CHAT_PATH, None).await {
        Ok(found) => found,
        Err(failure) => {
            let nobody = Upstream {
                name: "none".into(),
                ..list[0].clone()
            };
            settle(
                stub,
                hold.id.clone(),
                record(&nobody, failure.outcome(), 0, 0, 0),
            )
            .await;
            return error_response(&failure.into_api_error());
        }
    };
    let ttfb = now_ms() - started;
    let status = resp.status_code();
    if status != 200 {
        settle(
            stub,
            hold.id.clone(),
            record(&upstream, "upstream_status", 0, 0, ttfb),
        )
        .await;
        return relay_failure(resp).await;
    }
    if !parsed.stream {
        let text = resp.text().await?;
        let usage = serde_json::from_str::<ChatResponse>(&text)
            .map(|r| r.usage)
            .unwrap_or_default();
        settle(
            stub,
            hold.id.clone(),
            record(
                &upstream,
                "ok",
                i64::from(usage.prompt_tokens),
                i64::from(usage.completion_tokens),
                ttfb,
            ),
        )
        .await;
        let mut out = Response::ok(text)?;
        out.headers_mut().set("content-type", "application/json")?;
        return Ok(out);
    }

    // Streamed: pass the bytes through as they come, count on the way, settle at the end —
    // or when the client goes away and the runtime drops the stream.
    let tally = Rc::new(RefCell::new(Tally::default()));
    let (done_tx, done_rx) = futures_channel::oneshot::channel::<()>();
    let counting = Counting {
        inner: Box::pin(resp.stream()?),
        parser: Parser::new(1 << 20),
        tally: tally.clone(),
        done: Some(done_tx),
    };
    let base_record = record(&upstream, "ok", 0, 0, ttfb);
    let (up_in, up_out) = (upstream.price_in_per_1k, upstream.price_out_per_1k);
    let hold_id = hold.id.clone();
    ctx.wait_until(async move {
        let finished = done_rx.await.is_ok();
        let t = tally.borrow().clone();
        let outcome = match (finished, t.cut) {
            (true, false) => "ok",
            (true, true) => "upstream_cut",
            (false, _) => "client_gone",
        };
        let (tokens_in, tokens_out) = match t.usage {
            Some((p, c)) => (p, c),
            // No usage from the upstream: the prompt bound and the content chunks counted.
            None => (prompt_bound, t.content_chunks),
        };
        let r = Record {
            outcome: outcome.into(),
            tokens_in,
            tokens_out,
            usd: tokens_in as f64 / 1000.0 * up_in + tokens_out as f64 / 1000.0 * up_out,
            total_ms: now_ms() - started,
            ..base_record
        };
        settle(stub, hold_id, r).await;
    });
    let headers = Headers::new();
    headers.set("content-type", "text/event-stream")?;
    headers.set("cache-control", "no-cache")?;
    Ok(Response::from_stream(counting)?.with_headers(headers))
}

/// What to answer for an upstream's non-200: its own 4xx (a request it refused) is the
/// caller's to see; its 5xx and 429 are ours to report as a bad gateway.
pub(crate) async fn relay_failure(resp: Response) -> Result<Response> {
    let status = resp.status_code();
    if (400..500).contains(&status) && status != 429 {
        return passthrough(resp).await;
    }
    error_response(&ApiError::new(
        ErrorKind::UpstreamError,
        format!("upstream answered {status}"),
    ))
}

/// An upstream's answer re-made as the worker's own: a fetched response's headers are
/// immutable, and CORS must still be added to it.
async fn passthrough(mut resp: Response) -> Result<Response> {
    let status = resp.status_code();
    let content_type = resp.headers().get("content-type")?;
    let mut out = Response::from_bytes(resp.bytes().await?)?.with_status(status);
    if let Some(ct) = content_type {
        out.headers_mut().set("content-type", &ct)?;
    }
    Ok(out)
}

/// Why no upstream answered.
pub(crate) struct Failure {
    attempts: Vec<String>,
    all_timed_out: bool,
}

impl Failure {
    pub(crate) fn outcome(&self) -> &'static str {
        if self.all_timed_out {
            "upstream_timeout"
        } else {
            "upstream_failed"
        }
    }

    pub(crate) fn into_api_error(self) -> ApiError {
        let kind = if self.all_timed_out {
            ErrorKind::UpstreamTimeout
        } else {
            ErrorKind::UpstreamError
        };
        let tried = if self.attempts.is_empty() {
            "every upstream's circuit breaker is open".to_owned()
        } else {
            self.attempts.join("; ")
        };
        ApiError::new(kind, format!("no upstream answered: {tried}"))
    }
}

const CHAT_PATH: &str = "/v1/chat/completions";

/// Tries the upstreams in order until one answers `path` with headers that are not a 5xx or
/// 429. Requests with an `affinity` key (a verify session) draw the same order every time, so
/// they reach the upstream that holds their state while it is healthy.
pub(crate) async fn forward(
    list: &[Upstream],
    body: &[u8],
    path: &str,
    affinity: Option<&str>,
) -> std::result::Result<(Upstream, Response), Failure> {
    let mut failure = Failure {
        attempts: Vec::new(),
        all_timed_out: true,
    };
    let order = match affinity {
        Some(key) => upstreams::order(list, upstreams::keyed_random(key)),
        None => upstreams::order(list, js_sys::Math::random),
    };
    for i in order {
        let up = &list[i];
        if !BREAKERS.with(|b| b.borrow_mut().allow(&up.name, now_ms())) {
            continue;
        }
        let problem = match send(up, body, path).await {
            Ok(resp) if resp.status_code() >= 500 || resp.status_code() == 429 => {
                failure.all_timed_out = false;
                format!("{} answered {}", up.name, resp.status_code())
            }
            Ok(resp) => {
                BREAKERS.with(|b| b.borrow_mut().success(&up.name));
                return Ok((up.clone(), resp));
            }
            Err(Sent::TimedOut) => format!(
                "{} sent no headers within {} ms",
                up.name, up.first_byte_timeout_ms
            ),
            Err(Sent::Error(e)) => {
                failure.all_timed_out = false;
                format!("{} unreachable ({e})", up.name)
            }
        };
        BREAKERS.with(|b| b.borrow_mut().failure(&up.name, now_ms()));
        failure.attempts.push(problem);
    }
    if failure.attempts.is_empty() {
        failure.all_timed_out = false;
    }
    Err(failure)
}

enum Sent {
    TimedOut,
    Error(String),
}

/// One attempt, abandoned (and aborted) when the headers take too long.
async fn send(up: &Upstream, body: &[u8], path: &str) -> std::result::Result<Response, Sent> {
    let build = || -> Result<Request> {
        let headers = Headers::new();
        headers.set("content-type", "application/json")?;
        let mut init = RequestInit::new();
        init.with_method(Method::Post)
            .with_headers(headers)
            .with_body(Some(js_sys::Uint8Array::from(body).into()));
        Request::new_with_init(&format!("{}{path}", up.url.trim_end_matches('/')), &init)
    };
    let request = build().map_err(|e| Sent::Error(e.to_string()))?;
    fetch_within(request, up.first_byte_timeout_ms).await
}

/// Sends `request`, abandoning (and aborting) it when no headers came within `timeout_ms`.
async fn fetch_within(request: Request, timeout_ms: u64) -> std::result::Result<Response, Sent> {
    let controller = AbortController::default();
    let signal = controller.signal();
    let fetch = Fetch::Request(request);
    let sending = Box::pin(fetch.send_with_signal(&signal));
    let timer = Box::pin(Delay::from(std::time::Duration::from_millis(timeout_ms)));
    match futures_util::future::select(sending, timer).await {
        futures_util::future::Either::Left((result, _)) => {
            result.map_err(|e| Sent::Error(e.to_string()))
        }
        futures_util::future::Either::Right(_) => {
            controller.abort();
            Err(Sent::TimedOut)
        }
    }
}

/// `GET /v1/models`: the model the worker serves, and whether it can verify edge drafts: when
/// an upstream supports `/v1/verify`, its own `/v1/models` supplies the tokenizer hash a
/// browser compares with its edge model's before it speculates.
pub async fn models(env: &Env) -> Result<Response> {
    let id = env
        .var("UPSTREAM_MODEL")
        .map(|v| v.to_string())
        .unwrap_or_else(|_| "default".into());
    let verifier = upstream_list(env)
        .ok()
        .and_then(|l| l.into_iter().find(|u| u.supports_verify));
    let mut tokenizer_hash = None;
    if let Some(up) = &verifier {
        match get_json::<straddle_protocol::ModelList>(up, "/v1/models").await {
            Ok(list) => tokenizer_hash = list.data.into_iter().find_map(|m| m.tokenizer_hash),
            Err(e) => worker::console_warn!("verify upstream {} has no model list: {e}", up.name),
        }
    }
    Response::from_json(&serde_json::json!({
        "object": "list",
        "data": [{
            "id": id, "object": "model", "owned_by": "straddle",
            // Speculation needs both: a verifier, and its tokenizer to compare.
            "supports_verify": verifier.is_some() && tokenizer_hash.is_some(),
            "tokenizer_hash": tokenizer_hash,
        }],
    }))
}

/// GETs `path` from `up` as JSON, within the upstream's first-byte timeout.
async fn get_json<T: serde::de::DeserializeOwned>(
    up: &Upstream,
    path: &str,
) -> std::result::Result<T, String> {
    let url = format!("{}{path}", up.url.trim_end_matches('/'));
    let request = Request::new(&url, Method::Get).map_err(|e| e.to_string())?;
    let mut resp = match fetch_within(request, up.first_byte_timeout_ms).await {
        Ok(resp) => resp,
        Err(Sent::Error(e)) => return Err(e),
        Err(Sent::TimedOut) => {
            return Err(format!("no answer within {} ms", up.first_byte_timeout_ms));
        }
    };
    if resp.status_code() != 200 {
        return Err(format!("answered {}", resp.status_code()));
    }
    resp.json::<T>().await.map_err(|e| e.to_string())
}

/// What a streamed answer held.
#[derive(Debug, Clone, Default)]
struct Tally {
    /// (prompt, completion) tokens from the upstream's usage chunk.
    usage: Option<(i64, i64)>,
    content_chunks: i64,
    /// The upstream's stream failed midway.
    cut: bool,
}

/// The upstream's bytes, unchanged, with a tally kept on the way.
struct Counting {
    inner: Pin<Box<ByteStream>>,
    parser: Parser,
    tally: Rc<RefCell<Tally>>,
    done: Option<futures_channel::oneshot::Sender<()>>,
}

impl Counting {
    fn observe(&mut self, bytes: &[u8]) {
        let Ok(events) = self.parser.push(bytes) else {
            return;
        };
        let mut t = self.tally.borrow_mut();
        for e in events.iter().filter(|e| e.data != sse::DONE) {
            let Ok(chunk) = serde_json::from_str::<ChatChunk>(&e.data) else {
                continue;
            };
            if let Some(u) = chunk.usage {
                t.usage = Some((i64::from(u.prompt_tokens), i64::from(u.completion_tokens)));
            }
            let has_content = chunk
                .choices
                .iter()
                .any(|c| c.delta.content.as_deref().is_some_and(|s| !s.is_empty()));
            t.content_chunks += i64::from(has_content);
        }
    }
}

impl Stream for Counting {
    type Item = Result<Vec<u8>>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Option<Self::Item>> {
        match self.inner.as_mut().poll_next(cx) {
            Poll::Ready(Some(Ok(bytes))) => {
                self.observe(&bytes);
                Poll::Ready(Some(Ok(bytes)))
            }
            Poll::Ready(Some(Err(e))) => {
                self.tally.borrow_mut().cut = true;
                if let Some(tx) = self.done.take() {
                    let _ = tx.send(());
                }
                Poll::Ready(Some(Err(e)))
            }
            Poll::Ready(None) => {
                if let Some(tx) = self.done.take() {
                    let _ = tx.send(());
                }
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }
}
