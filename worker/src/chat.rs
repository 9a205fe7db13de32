//! `POST /v1/chat/completions`: authenticate the tenant, validate, re-check privacy, hold the
//! worst-case cost in the tenant's budget, forward, stream the answer back untouched while
//! counting it (and ending it at the upstream's total timeout), then settle the hold from the
//! real usage and write the cost record.

use std::cell::RefCell;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context as TaskContext, Poll};

use futures_util::Stream;
use straddle_protocol::sse::{self, Parser};
use straddle_protocol::{ApiError, ChatChunk, ChatRequest, ChatResponse, ErrorKind};
use worker::{ByteStream, Context, Env, Headers, Request, Response, Result};

use crate::admission::{Bill, Caller, caller, dearest_prices, json_body, prompt_tokens_bound};
use crate::budget::{self, Hold, Record};
use crate::clock::now_ms;
use crate::deadline::Deadline;
use crate::error::{Refusal, respond};
use crate::forward::{
    Answered, Outgoing, forward, relay_failure, remaining, text_within, total_timeout,
    upstream_list,
};
use crate::grow::{CHUNK_TOKENS, Gated, Grown, Growth, content_tokens};
use crate::upstreams::Upstream;

const CHAT_PATH: &str = "/v1/chat/completions";

/// `max_tokens` assumed when a request gives none (the hold must have a bound).
const DEFAULT_MAX_TOKENS: u32 = 1024;

/// `POST /v1/chat/completions`.
pub async fn chat(req: Request, env: &Env, ctx: &Context) -> Result<Response> {
    respond(serve(req, env, ctx).await)
}

/// Admits the request, holds its cost, forwards it and answers: whole or streamed.
async fn serve(
    mut req: Request,
    env: &Env,
    ctx: &Context,
) -> std::result::Result<Response, Refusal> {
    let caller = caller(&req, env).await?;
    let (body, parsed) = json_body::<ChatRequest>(&mut req).await?;
    parsed
        .validate()
        .and_then(|()| caller.permits(&parsed.model, &parsed.messages))?;
    let list = upstreams_serving(env, &parsed.model)?;
    let max_tokens = max_tokens(&caller, &parsed)?;
    let prompt_bound = prompt_tokens_bound(&parsed.messages, parsed.tools.as_deref());
    // A growing hold starts with a first chunk of output; the stream extends it.
    let growing = parsed.stream && caller.tenant.growing_holds();
    let held_out = match growing {
        true => CHUNK_TOKENS.min(i64::from(max_tokens)),
        false => i64::from(max_tokens),
    };
    let hold = caller.hold(env, &list, prompt_bound, held_out).await?;
    let bill = Bill {
        held: (prompt_bound, held_out),
        held_prices: dearest_prices(&list),
        started: hold.now_ms,
        template: record_template(&hold, &caller, &parsed),
        hold,
        stub: caller.stub,
    };
    let outgoing = Outgoing {
        path: CHAT_PATH,
        body: &body,
        model: &parsed.model,
        strip_envelope: true,
        affinity: None,
    };
    let answered = match forward(env, &list, &outgoing).await {
        Ok(answered) => answered,
        Err(failure) => {
            let r = bill.record(None, failure.outcome(), 0, 0, 0);
            bill.settle(r).await;
            return Err(failure.into_api_error().into());
        }
    };
    let ttfb = now_ms() - bill.started;
    if answered.response.status_code() != 200 {
        let r = bill.record(Some(&answered), "upstream_status", 0, 0, ttfb);
        bill.settle(r).await;
        return Ok(relay_failure(answered.response).await?);
    }
    if !parsed.stream {
        return whole(answered, bill, ttfb).await;
    }
    let stream = Streamed {
        growing,
        max_out: i64::from(max_tokens),
        tenant: caller.claims.ten.clone(),
        ttfb,
    };
    stream.answer(answered, bill, env, ctx)
}

/// The configured upstreams that serve `model`.
fn upstreams_serving(env: &Env, model: &str) -> std::result::Result<Vec<Upstream>, Refusal> {
    let list: Vec<Upstream> = upstream_list(env)
        .map_err(|message| ApiError::new(ErrorKind::Unavailable, message))?
        .into_iter()
        .filter(|u| u.serves(model))
        .collect();
    if list.is_empty() {
        return Err(no_upstream_serves(model).into());
    }
    Ok(list)
}

/// The request's `max_tokens` (a default when it gives none), within the tenant's cap.
fn max_tokens(caller: &Caller, req: &ChatRequest) -> std::result::Result<u32, ApiError> {
    let max_tokens = req.token_limit().unwrap_or(DEFAULT_MAX_TOKENS);
    match caller.tenant.max_tokens_cap {
        Some(cap) if i64::from(max_tokens) > cap => Err(ApiError::invalid(
            "max_tokens",
            format!("this tenant allows at most {cap}"),
        )),
        _ => Ok(max_tokens),
    }
}

/// The request's cost record with nothing used yet: who asked, for what, and what the
/// page's router said.
fn record_template(hold: &Hold, caller: &Caller, req: &ChatRequest) -> Record {
    Record {
        id: hold.id.clone(),
        ts_ms: hold.now_ms,
        user: caller.claims.sub.clone(),
        session: caller.claims.sid.clone(),
        feature: caller.claims.feat.clone().unwrap_or_default(),
        model: req.model.clone(),
        ..Record::default()
    }
    .claimed_by(req.straddle.as_ref())
}

/// A whole (non-streamed) answer: read within the upstream's total timeout, billed from its
/// usage.
async fn whole(
    mut answered: Answered,
    bill: Bill,
    ttfb: i64,
) -> std::result::Result<Response, Refusal> {
    let text = text_within(&mut answered.response, &answered.upstream, bill.started).await?;
    let Some(text) = text else {
        let r = bill.record(Some(&answered), "upstream_timeout", bill.held.0, 0, ttfb);
        bill.settle(r).await;
        return Err(total_timeout(&answered.upstream).into());
    };
    let answer = serde_json::from_str::<ChatResponse>(&text).ok();
    let usage = answer.as_ref().map(|r| r.usage).unwrap_or_default();
    let used = (
        i64::from(usage.prompt_tokens),
        i64::from(usage.completion_tokens),
    );
    let r = Record {
        upstream_model: answer.map(|a| a.model).unwrap_or_default(),
        ..bill.record(Some(&answered), "ok", 0, 0, ttfb)
    };
    let r = bill.billed(r, used, answered.upstream.price(), bill.held.1);
    bill.settle(r).await;
    let mut out = Response::ok(text)?;
    out.headers_mut().set("content-type", "application/json")?;
    Ok(out)
}

/// A streamed answer: the upstream's bytes passed through as they come, counted on the way
/// (and for a growing hold, extended chunk by chunk), settled at the end, or once the client
/// has neither read nor waited for [`stream_idle_ms`]. Local workerd neither pulls nor drops
/// a Rust response stream whose client went away, so the runtime cannot be relied on to end
/// it.
struct Streamed {
    growing: bool,
    max_out: i64,
    tenant: String,
    ttfb: i64,
}

impl Streamed {
    fn answer(
        self,
        answered: Answered,
        bill: Bill,
        env: &Env,
        ctx: &Context,
    ) -> std::result::Result<Response, Refusal> {
        let upstream = answered.upstream.clone();
        let base = bill.record(Some(&answered), "ok", 0, 0, self.ttfb);
        let tally = Rc::new(RefCell::new(Tally {
            last_pull_ms: now_ms(),
            ..Tally::default()
        }));
        let grown = Rc::new(std::cell::Cell::new(Grown::default()));
        let (done_tx, done_rx) = futures_channel::oneshot::channel::<()>();
        let idle_ms = stream_idle_ms(env);
        let mut resp = answered.response;
        let counting = Counting {
            inner: Box::pin(resp.stream()?),
            parser: Parser::new(1 << 20),
            tally: tally.clone(),
            done: Some(done_tx),
            deadline: Deadline::after(remaining(&upstream, bill.started))?,
            timeout_event: Some(timeout_event(&upstream)),
        };
        let body = match self.growing {
            true => {
                let growth = Growth {
                    stub: Rc::new(budget::stub(env, &self.tenant)?),
                    hold: bill.hold.clone(),
                    prices: bill.held_prices,
                    held_out: bill.held.1,
                    max_out: self.max_out,
                };
                Response::from_stream(Gated::new(counting, growth, grown.clone()))?
            }
            false => Response::from_stream(counting)?,
        };
        let growing = self.growing;
        ctx.wait_until(async move {
            let abandoned = Box::pin(abandoned(tally.clone(), idle_ms));
            let finished = match futures_util::future::select(done_rx, abandoned).await {
                futures_util::future::Either::Left((done, _)) => done.is_ok(),
                futures_util::future::Either::Right(_) => false,
            };
            let t = tally.borrow().clone();
            let g = grown.get();
            // A growing hold bills at most what it grew to; what was read past it never
            // reached the client.
            let held_out = if growing { g.held_out } else { bill.held.1 };
            let r = Record {
                upstream_model: t.model.clone(),
                outcome: t.outcome(finished, growing && g.exhausted).into(),
                total_ms: now_ms() - bill.started,
                ..base
            };
            let used = t.used(bill.held.0);
            let r = bill.billed(r, used, upstream.price(), held_out);
            bill.settle(r).await;
        });
        let headers = Headers::new();
        headers.set("content-type", "text/event-stream")?;
        headers.set("cache-control", "no-cache")?;
        Ok(body.with_headers(headers))
    }
}

/// How long a stream's client may neither read nor wait before it counts as gone: a
/// deployment's `STREAM_IDLE_MS`, else a minute.
fn stream_idle_ms(env: &Env) -> i64 {
    env.var("STREAM_IDLE_MS")
        .ok()
        .and_then(|v| v.to_string().parse().ok())
        .filter(|ms: &i64| *ms > 0)
        .unwrap_or(60_000)
}

/// Resolves once the stream's client has gone: it last asked for bytes over `idle_ms` ago
/// and is not waiting for any.
async fn abandoned(tally: Rc<RefCell<Tally>>, idle_ms: i64) {
    let every = std::time::Duration::from_millis(idle_ms.clamp(1, 1_000) as u64);
    loop {
        worker::Delay::from(every).await;
        let t = tally.borrow();
        if !t.awaiting && now_ms() - t.last_pull_ms > idle_ms {
            return;
        }
    }
}

/// The answer to a request no upstream may serve.
fn no_upstream_serves(model: &str) -> ApiError {
    ApiError::new(
        ErrorKind::NotFound,
        format!("no configured upstream serves the model {model:?}"),
    )
    .with_code("model_not_found")
}

/// The SSE event that ends a stream cut at its upstream's total timeout: OpenAI's clients
/// raise an `error` field met mid-stream as an API error.
fn timeout_event(up: &Upstream) -> Vec<u8> {
    format!("data: {}\n\n", total_timeout(up).to_body()).into_bytes()
}

/// What a streamed answer held.
#[derive(Debug, Clone, Default)]
struct Tally {
    /// (prompt, completion) tokens from the upstream's usage chunk.
    usage: Option<(i64, i64)>,
    /// The model the upstream's first chunk names.
    model: String,
    content_chunks: i64,
    /// The upstream's stream failed midway.
    cut: bool,
    /// The upstream's total timeout ended it.
    timed_out: bool,
    /// When the client last asked for bytes, and whether it is waiting for some now.
    last_pull_ms: i64,
    awaiting: bool,
}

impl Tally {
    /// How the stream ended: `finished` unless the client went away first.
    fn outcome(&self, finished: bool, budget_exhausted: bool) -> &'static str {
        if budget_exhausted {
            return "budget_exhausted";
        }
        match (finished, self.cut, self.timed_out) {
            (true, _, true) => "upstream_timeout",
            (true, false, false) => "ok",
            (true, true, false) => "upstream_cut",
            (false, _, _) => "client_gone",
        }
    }

    /// (prompt, completion) tokens used: the upstream's usage, or without it the prompt
    /// bound and the content chunks counted.
    fn used(&self, prompt_bound: i64) -> (i64, i64) {
        self.usage.unwrap_or((prompt_bound, self.content_chunks))
    }
}

/// The upstream's bytes, unchanged, with a tally kept on the way, until the deadline.
struct Counting {
    inner: Pin<Box<ByteStream>>,
    parser: Parser,
    tally: Rc<RefCell<Tally>>,
    done: Option<futures_channel::oneshot::Sender<()>>,
    deadline: Deadline,
    /// Sent once when the deadline passes, before the stream ends.
    timeout_event: Option<Vec<u8>>,
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
            if t.model.is_empty() {
                t.model.clone_from(&chunk.model);
            }
            if let Some(u) = chunk.usage {
                t.usage = Some((i64::from(u.prompt_tokens), i64::from(u.completion_tokens)));
            }
            t.content_chunks += content_tokens(&chunk);
        }
    }

    fn finish(&mut self) {
        if let Some(tx) = self.done.take() {
            let _ = tx.send(());
        }
    }
}

impl Stream for Counting {
    type Item = Result<Vec<u8>>;

    /// The next bytes, noting that the client asked and whether it now waits.
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Option<Self::Item>> {
        let polled = self.as_mut().poll_upstream(cx);
        let mut t = self.tally.borrow_mut();
        t.last_pull_ms = now_ms();
        t.awaiting = polled.is_pending();
        polled
    }
}

impl Counting {
    fn poll_upstream(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<Option<Result<Vec<u8>>>> {
        if self.tally.borrow().timed_out {
            // The upstream's body is dropped with this stream, which cancels its fetch.
            return match self.timeout_event.take() {
                Some(event) => Poll::Ready(Some(Ok(event))),
                None => {
                    self.finish();
                    Poll::Ready(None)
                }
            };
        }
        match self.inner.as_mut().poll_next(cx) {
            Poll::Ready(Some(Ok(bytes))) => {
                self.observe(&bytes);
                Poll::Ready(Some(Ok(bytes)))
            }
            Poll::Ready(Some(Err(e))) => {
                self.tally.borrow_mut().cut = true;
                self.finish();
                Poll::Ready(Some(Err(e)))
            }
            Poll::Ready(None) => {
                self.finish();
                Poll::Ready(None)
            }
            Poll::Pending => match self.deadline.poll(cx) {
                Poll::Ready(()) => {
                    self.tally.borrow_mut().timed_out = true;
                    self.poll_upstream(cx)
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }
}
