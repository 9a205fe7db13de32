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
use straddle_router::price::Price;
use worker::{ByteStream, Context, Env, Headers, Request, Response, Result};

use crate::admission::{
    Billed, Caller, budget_stub, caller, cost_usd, dearest_prices, json_body, now_ms, settle,
    within_hold,
};
use crate::budget::Record;
use crate::deadline::Deadline;
use crate::error::error_response;
use crate::forward::{
    Answered, Outgoing, forward, relay_failure, remaining, text_within, total_timeout,
    upstream_list,
};
use crate::grow::{CHUNK_TOKENS, Gated, Grown, Growth};
use crate::upstreams::Upstream;

const CHAT_PATH: &str = "/v1/chat/completions";

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
    let list: Vec<Upstream> = match upstream_list(env) {
        Ok(l) => l.into_iter().filter(|u| u.serves(&parsed.model)).collect(),
        Err(message) => return error_response(&ApiError::new(ErrorKind::Unavailable, message)),
    };
    if list.is_empty() {
        return error_response(&no_upstream_serves(&parsed.model));
    }

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
    // A growing hold starts with a first chunk of output; the stream extends it.
    let growing = parsed.stream && caller.tenant.growing_holds();
    let held_out = match growing {
        true => CHUNK_TOKENS.min(i64::from(max_tokens)),
        false => i64::from(max_tokens),
    };
    let hold = match caller.hold(env, &list, prompt_bound, held_out).await? {
        Ok(h) => h,
        Err(refusal) => return Ok(refusal),
    };
    let Caller { claims, stub, .. } = caller;
    // Settlements bill at most this, at these prices (a growing hold's output grows).
    let held = (prompt_bound, held_out);
    let held_prices = dearest_prices(&list);
    let started = hold.now_ms;
    let envelope = parsed.straddle.as_ref();

    let record =
        |upstream: &Upstream, outcome: &str, tokens_in: i64, tokens_out: i64, ttfb_ms: i64| {
            Record {
                degraded: false,
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
                router_version: envelope
                    .and_then(|e| e.router_version.clone())
                    .unwrap_or_default(),
                policy_version: envelope
                    .and_then(|e| e.policy_version.clone())
                    .unwrap_or_default(),
                quality_model_version: envelope
                    .and_then(|e| e.quality_model_version.clone())
                    .unwrap_or_default(),
                edge_model_sha256: envelope
                    .and_then(|e| e.edge_model_sha256.clone())
                    .unwrap_or_default(),
                upstream_model: String::new(),
                unbilled_tokens: 0,
                tokens_in,
                tokens_out,
                usd: cost_usd(prices_of(upstream), tokens_in, tokens_out),
                ttfb_ms,
                total_ms: now_ms() - started,
                outcome: outcome.into(),
            }
        };

    let outgoing = Outgoing {
        path: CHAT_PATH,
        body: &body,
        model: &parsed.model,
        strip_envelope: true,
        affinity: None,
    };
    let Answered {
        upstream,
        response: mut resp,
        failed_over,
    } = match forward(env, &list, &outgoing).await {
        Ok(answered) => answered,
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
    let record = |outcome: &str, tokens_in: i64, tokens_out: i64, ttfb_ms: i64| Record {
        degraded: failed_over,
        ..record(&upstream, outcome, tokens_in, tokens_out, ttfb_ms)
    };
    let ttfb = now_ms() - started;
    let status = resp.status_code();
    if status != 200 {
        settle(stub, hold.id.clone(), record("upstream_status", 0, 0, ttfb)).await;
        return relay_failure(resp).await;
    }
    if !parsed.stream {
        let Some(text) = text_within(&mut resp, &upstream, started).await? else {
            settle(
                stub,
                hold.id.clone(),
                record("upstream_timeout", prompt_bound, 0, ttfb),
            )
            .await;
            return error_response(&total_timeout(&upstream));
        };
        let answer = serde_json::from_str::<ChatResponse>(&text).ok();
        let usage = answer.as_ref().map(|r| r.usage).unwrap_or_default();
        let used = (
            i64::from(usage.prompt_tokens),
            i64::from(usage.completion_tokens),
        );
        let r = Record {
            upstream_model: answer.map(|a| a.model).unwrap_or_default(),
            ..record("ok", 0, 0, ttfb)
        };
        let billed = within_hold(used, held, prices_of(&upstream), held_prices);
        settle(stub, hold.id.clone(), billed_record(r, billed)).await;
        let mut out = Response::ok(text)?;
        out.headers_mut().set("content-type", "application/json")?;
        return Ok(out);
    }

    // Streamed: pass the bytes through as they come, count on the way, settle at the end —
    // or when the client goes away and the runtime drops the stream.
    let tally = Rc::new(RefCell::new(Tally::default()));
    let grown = Rc::new(std::cell::Cell::new(Grown::default()));
    let (done_tx, done_rx) = futures_channel::oneshot::channel::<()>();
    let counting = Counting {
        inner: Box::pin(resp.stream()?),
        parser: Parser::new(1 << 20),
        tally: tally.clone(),
        done: Some(done_tx),
        deadline: Deadline::after(remaining(&upstream, started))?,
        timeout_event: Some(timeout_event(&upstream)),
    };
    let body = match growing {
        true => {
            let growth = Growth {
                stub: Rc::new(budget_stub(env, &claims.ten)?),
                hold: hold.clone(),
                prices: held_prices,
                held_out,
                max_out: i64::from(max_tokens),
            };
            Response::from_stream(Gated::new(counting, growth, grown.clone()))?
        }
        false => Response::from_stream(counting)?,
    };
    let base_record = record("ok", 0, 0, ttfb);
    let prices = prices_of(&upstream);
    let hold_id = hold.id.clone();
    ctx.wait_until(async move {
        let finished = done_rx.await.is_ok();
        let t = tally.borrow().clone();
        let outcome = match (finished, t.cut, t.timed_out) {
            (true, _, true) => "upstream_timeout",
            (true, false, false) => "ok",
            (true, true, false) => "upstream_cut",
            (false, _, _) => "client_gone",
        };
        let (tokens_in, tokens_out) = match t.usage {
            Some((p, c)) => (p, c),
            // No usage from the upstream: the prompt bound and the content chunks counted.
            None => (prompt_bound, t.content_chunks),
        };
        let g = grown.get();
        let outcome = match growing && g.exhausted {
            true => "budget_exhausted",
            false => outcome,
        };
        // A growing hold bills at most what it grew to; what was read past it never reached
        // the client.
        let held_out = if growing { g.held_out } else { held.1 };
        let billed = within_hold(
            (tokens_in, tokens_out),
            (held.0, held_out),
            prices,
            held_prices,
        );
        let r = Record {
            upstream_model: t.model.clone(),
            outcome: outcome.into(),
            total_ms: now_ms() - started,
            ..base_record
        };
        let r = billed_record(r, billed);
        settle(stub, hold_id, r).await;
    });
    let headers = Headers::new();
    headers.set("content-type", "text/event-stream")?;
    headers.set("cache-control", "no-cache")?;
    Ok(body.with_headers(headers))
}

/// An upstream's prices per 1,000 tokens, in and out.
fn prices_of(up: &Upstream) -> Price {
    up.price()
}

/// `r` with what its request is billed.
fn billed_record(r: Record, billed: Billed) -> Record {
    Record {
        tokens_in: billed.tokens_in,
        tokens_out: billed.tokens_out,
        usd: billed.usd,
        unbilled_tokens: billed.unbilled_tokens,
        ..r
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

/// The output tokens a chunk is counted as: one for a chunk with content (servers stream a
/// token a chunk), when the upstream reports no usage.
pub(crate) fn content_tokens(chunk: &ChatChunk) -> i64 {
    let has_content = chunk
        .choices
        .iter()
        .any(|c| c.delta.content.as_deref().is_some_and(|s| !s.is_empty()));
    i64::from(has_content)
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

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Option<Self::Item>> {
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
                    self.poll_next(cx)
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }
}
