//! Holds that grow with the stream (a tenant's `holds: "growing"`): a streamed request is
//! admitted with its prompt and a first chunk of output held, and its hold is extended in the
//! tenant's budget a chunk at a time, a little before the tokens already held run out. No
//! token passes to the client unheld: while an extension is pending the stream waits, and
//! when one is refused the stream ends cleanly, with `finish_reason: "length"` and
//! `straddle.budget_exhausted`, and the upstream's body is dropped, which cancels it. What
//! the upstream generated past the hold is at most the one network read that was parsed and
//! not passed; it is never billed ([`within_hold`](crate::admission::within_hold)).

use std::cell::Cell;
use std::collections::VecDeque;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context as TaskContext, Poll};

use futures_util::future::LocalBoxFuture;
use futures_util::{FutureExt, Stream};
use straddle_protocol::sse::{self, Event, Parser};
use straddle_protocol::{ChatChunk, ChunkChoice, Cost, Delta, FinishReason, Route, StraddleMeta};
use straddle_router::price::Price;
use worker::{Result, Stub};

use crate::admission::cost_usd;
use crate::budget::{self, BudgetCall, Hold, HoldAnswer};
use crate::clock::now_ms;

/// Output tokens held at admission and added by each extension.
pub const CHUNK_TOKENS: i64 = 32;

/// What the stream's growth came to, for the settlement.
#[derive(Debug, Clone, Copy, Default)]
pub struct Grown {
    /// Output tokens held when the stream ended: the most it may be billed.
    pub held_out: i64,
    /// The budget refused an extension and the stream was ended for it.
    pub exhausted: bool,
}

/// The hold a stream grows and what a chunk of output costs at the dearest upstream.
pub struct Growth {
    pub stub: Rc<Stub>,
    pub hold: Hold,
    /// The dearest upstream's prices per 1,000 tokens, in and out, at which it is held.
    pub prices: Price,
    /// Output tokens held now, and the request's `max_tokens`.
    pub held_out: i64,
    pub max_out: i64,
}

/// `inner`'s SSE events passed on whole, each content event only once it is held.
pub struct Gated<S> {
    inner: Pin<Box<S>>,
    parser: Parser,
    queue: VecDeque<Event>,
    passed_tokens: i64,
    growth: Growth,
    /// An extension asked for: resolves to the tokens granted, 0 when refused.
    extension: Option<LocalBoxFuture<'static, i64>>,
    /// The budget refused an extension: the stream ends where the hold does.
    refused: bool,
    last: Option<ChatChunk>,
    report: Rc<Cell<Grown>>,
    ending: Option<VecDeque<Vec<u8>>>,
}

impl<S> Gated<S> {
    /// Gates `inner` by `growth`; `report` is kept current for the settlement.
    pub fn new(inner: S, growth: Growth, report: Rc<Cell<Grown>>) -> Self {
        report.set(Grown {
            held_out: growth.held_out,
            exhausted: false,
        });
        Gated {
            inner: Box::pin(inner),
            parser: Parser::new(1 << 20),
            queue: VecDeque::new(),
            passed_tokens: 0,
            growth,
            extension: None,
            refused: false,
            last: None,
            report,
            ending: None,
        }
    }

    /// Asks the budget for one more chunk, unless asked already, refused, or the request's
    /// bound is held in full.
    fn request_extension(&mut self) {
        let more = CHUNK_TOKENS.min(self.growth.max_out - self.growth.held_out);
        if self.extension.is_some() || self.refused || more <= 0 {
            return;
        }
        let body = Hold {
            usd: cost_usd(self.growth.prices, 0, more),
            tokens: more,
            now_ms: now_ms(),
            ..self.growth.hold.clone()
        };
        let stub = self.growth.stub.clone();
        self.extension = Some(
            async move {
                let tokens = body.tokens;
                let call = BudgetCall::Extend(body);
                match budget::call::<HoldAnswer>(&stub, &call).await {
                    Ok(a) if a.admitted => tokens,
                    _ => 0,
                }
            }
            .boxed_local(),
        );
    }

    /// Drives the pending extension (its call to the budget starts only when polled) and
    /// applies its answer once there is one.
    fn poll_extension(&mut self, cx: &mut TaskContext<'_>) {
        let Some(pending) = self.extension.as_mut() else {
            return;
        };
        let Poll::Ready(granted) = pending.poll_unpin(cx) else {
            return;
        };
        self.extension = None;
        self.refused = granted == 0;
        self.growth.held_out += granted;
        self.report.set(Grown {
            held_out: self.growth.held_out,
            exhausted: false,
        });
    }

    /// The events that end a stream the budget cannot pay for.
    fn exhaust(&mut self) {
        self.report.set(Grown {
            held_out: self.growth.held_out,
            exhausted: true,
        });
        let last = self.last.take();
        let chunk = ChatChunk {
            id: last.as_ref().map(|c| c.id.clone()).unwrap_or_default(),
            object: "chat.completion.chunk".into(),
            created: last.as_ref().map_or(0, |c| c.created),
            model: last.map(|c| c.model).unwrap_or_default(),
            choices: vec![ChunkChoice {
                index: 0,
                delta: Delta::default(),
                finish_reason: Some(FinishReason::Length),
                logprobs: None,
            }],
            usage: None,
            straddle: Some(StraddleMeta {
                route: Route::Cloud,
                reasons: vec!["the tenant's budget pays for no more output".into()],
                confidence: None,
                degraded: None,
                cost: Cost::default(),
                latency_ms: 0.0,
                model_versions: Vec::new(),
                budget_exhausted: true,
            }),
        };
        let json = serde_json::to_string(&chunk).unwrap_or_default();
        self.ending = Some(VecDeque::from([
            sse::frame(&json).into_bytes(),
            sse::frame(sse::DONE).into_bytes(),
        ]));
    }

    /// The next queued event's bytes, if it may pass now; `Pending` while an extension it
    /// needs is asked for.
    fn next_event(&mut self, cx: &mut TaskContext<'_>) -> Poll<Option<Vec<u8>>> {
        let Some(event) = self.queue.front() else {
            return Poll::Ready(None);
        };
        let chunk = (event.data != sse::DONE)
            .then(|| serde_json::from_str::<ChatChunk>(&event.data).ok())
            .flatten();
        let tokens = chunk.as_ref().map_or(0, content_tokens);
        if self.passed_tokens + tokens + CHUNK_TOKENS / 2 > self.growth.held_out {
            self.request_extension();
        }
        self.poll_extension(cx);
        if self.passed_tokens + tokens > self.growth.held_out {
            if self.extension.is_some() {
                // Its waker is registered: the budget's answer wakes this stream.
                return Poll::Pending;
            }
            // Refused, or the request's own `max_tokens` is held in full and the upstream
            // went past it.
            self.exhaust();
            return Poll::Ready(None);
        }
        let Some(event) = self.queue.pop_front() else {
            return Poll::Ready(None);
        };
        self.passed_tokens += tokens;
        if chunk.is_some() {
            self.last = chunk;
        }
        let mut bytes = event
            .event
            .map(|name| format!("event: {name}\n"))
            .unwrap_or_default();
        bytes += &sse::frame(&event.data);
        Poll::Ready(Some(bytes.into_bytes()))
    }
}

impl<S: Stream<Item = Result<Vec<u8>>>> Stream for Gated<S> {
    type Item = Result<Vec<u8>>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Option<Self::Item>> {
        loop {
            if let Some(ending) = self.ending.as_mut() {
                // Ending drops the upstream's body with this stream, which cancels its fetch.
                return Poll::Ready(ending.pop_front().map(Ok));
            }
            match self.next_event(cx) {
                Poll::Ready(Some(bytes)) => return Poll::Ready(Some(Ok(bytes))),
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) if self.ending.is_some() => continue,
                Poll::Ready(None) => {}
            }
            match self.inner.as_mut().poll_next(cx) {
                Poll::Ready(Some(Ok(bytes))) => match self.parser.push(&bytes) {
                    Ok(events) => self.queue.extend(events),
                    // What cannot be read as events cannot be held token by token either.
                    Err(e) => {
                        let message = format!("the upstream's stream broke SSE framing: {e}");
                        return Poll::Ready(Some(Err(worker::Error::RustError(message))));
                    }
                },
                other => return other,
            }
        }
    }
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
