//! `/v1/chat/completions` over the engine: OpenAI's response and SSE chunk formats.

use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use straddle_chat::{AnswerStream, Conversation, Defaults, Ending};
use straddle_protocol::{
    ApiError, ChatChunk, ChatRequest, ChatResponse, Choice, ChunkChoice, Delta, ErrorKind,
    FinishReason, Message, Role, ToolCallDelta, Usage,
};

use crate::error::ErrorResponse;
use crate::scheduler::{Job, Scheduler, SeqEvent};

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The answer's length when a request does not say.
const DEFAULT_MAX_TOKENS: u32 = 512;

/// Answers one request, streamed or whole, through the batching scheduler.
pub async fn complete(
    scheduler: &Scheduler,
    model: String,
    req: ChatRequest,
) -> Result<Response, ErrorResponse> {
    let defaults = Defaults {
        max_tokens: DEFAULT_MAX_TOKENS,
        context: straddle_engine::DEFAULT_CONTEXT,
    };
    let params = straddle_chat::params(&req, defaults, |f| scheduler.constrain(f))?;
    let created = now_secs();
    let id = format!(
        "chatcmpl-{created:x}{:x}",
        scheduler
            .metrics
            .requests
            .load(std::sync::atomic::Ordering::Relaxed)
    );
    let conversation = Conversation::of(&req);
    let reply = Reply {
        id,
        created,
        model,
        answer: conversation.answer_stream(),
    };
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    if let Err(e) = scheduler.submit(Job {
        conversation,
        params,
        events: tx,
    }) {
        let mut resp = ErrorResponse(e).into_response();
        resp.headers_mut()
            .insert("retry-after", axum::http::HeaderValue::from_static("1"));
        return Ok(resp);
    }
    Ok(if req.stream {
        let include_usage = req.stream_options.as_ref().is_some_and(|o| o.include_usage);
        reply.streamed(rx, include_usage)
    } else {
        reply.whole(rx).await.into_response()
    })
}

/// What every response or chunk of one reply carries, and the answer as it streams.
struct Reply {
    id: String,
    created: u64,
    model: String,
    answer: AnswerStream,
}

impl Reply {
    /// The whole answer once the sequence is done.
    async fn whole(mut self, mut rx: Events) -> Result<axum::Json<ChatResponse>, ErrorResponse> {
        while let Some(ev) = rx.recv().await {
            match ev {
                SeqEvent::Token(_) => {}
                SeqEvent::Error(e) => return Err(ErrorResponse(e)),
                SeqEvent::Done {
                    text,
                    finish,
                    prompt_tokens,
                    completion_tokens,
                } => {
                    let usage = Usage::new(prompt_tokens, completion_tokens);
                    let mut answer = std::mem::take(&mut self.answer);
                    let shown = answer.push(&text);
                    let mut ending = answer.finish(finish, &self.call_id());
                    ending.content.insert_str(0, &shown);
                    return Ok(axum::Json(self.response(ending, usage)));
                }
            }
        }
        let e = ApiError::new(ErrorKind::Internal, "generation ended without a result");
        Err(ErrorResponse(e))
    }

    /// The id of the tool call this reply may make.
    fn call_id(&self) -> String {
        format!("call_{}", self.id.trim_start_matches("chatcmpl-"))
    }

    /// The non-streamed response body.
    fn response(self, ending: Ending, usage: Usage) -> ChatResponse {
        let mut message = Message::new(Role::Assistant, ending.content);
        message.tool_calls = (!ending.tool_calls.is_empty()).then_some(ending.tool_calls);
        ChatResponse {
            id: self.id,
            object: "chat.completion".into(),
            created: self.created,
            model: self.model,
            choices: vec![Choice {
                index: 0,
                message,
                finish_reason: Some(ending.reason),
                logprobs: None,
            }],
            usage,
            straddle: None,
        }
    }

    /// The answer as OpenAI's SSE chunks: the role first, a chunk a token, a tool call whole
    /// once it is complete, the finish reason, the usage when asked for, then `[DONE]`.
    fn streamed(mut self, mut rx: Events, include_usage: bool) -> Response {
        let stream = async_stream(move |out| async move {
            let role = Delta {
                role: Some(Role::Assistant),
                content: Some(String::new()),
                tool_calls: None,
            };
            let _ = out.send(self.chunk(role, None, None)).await;
            while let Some(ev) = rx.recv().await {
                let events = self.events_of(ev, include_usage);
                let last = events.last().is_some_and(|(_, last)| *last);
                for (event, _) in events {
                    if out.send(event).await.is_err() {
                        return;
                    }
                }
                if last {
                    break;
                }
            }
            let _ = out.send(Event::default().data("[DONE]")).await;
        });
        Sse::new(stream).into_response()
    }

    /// The SSE events a sequence event becomes, each with whether it ends the stream.
    fn events_of(&mut self, ev: SeqEvent, include_usage: bool) -> Vec<(Event, bool)> {
        match ev {
            SeqEvent::Token(text) => {
                let shown = self.answer.push(&text);
                if shown.is_empty() {
                    return Vec::new();
                }
                vec![(self.chunk(content(shown), None, None), false)]
            }
            SeqEvent::Error(e) => vec![(Event::default().data(e.to_body()), true)],
            SeqEvent::Done {
                finish,
                prompt_tokens,
                completion_tokens,
                ..
            } => {
                let ending = std::mem::take(&mut self.answer).finish(finish, &self.call_id());
                let mut events = Vec::new();
                if !ending.content.is_empty() {
                    events.push((self.chunk(content(ending.content), None, None), false));
                }
                if !ending.tool_calls.is_empty() {
                    let calls = ending.tool_calls.iter().zip(0..);
                    let delta = Delta {
                        tool_calls: Some(calls.map(|(c, i)| ToolCallDelta::whole(i, c)).collect()),
                        ..Delta::default()
                    };
                    events.push((self.chunk(delta, None, None), false));
                }
                let reason = Some(ending.reason);
                events.push((self.chunk(Delta::default(), reason, None), true));
                if include_usage {
                    let usage = Some(Usage::new(prompt_tokens, completion_tokens));
                    events.push((self.chunk(Delta::default(), None, usage), true));
                }
                events
            }
        }
    }

    /// One chunk: a delta with its finish reason, or (with `usage`) the usage alone.
    fn chunk(&self, delta: Delta, finish: Option<FinishReason>, usage: Option<Usage>) -> Event {
        let choices = match usage {
            Some(_) => vec![],
            None => vec![ChunkChoice {
                index: 0,
                delta,
                finish_reason: finish,
                logprobs: None,
            }],
        };
        let c = ChatChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk".into(),
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
            straddle: None,
        };
        Event::default().data(serde_json::to_string(&c).unwrap_or_default())
    }
}

/// A delta of answer text.
fn content(text: String) -> Delta {
    Delta {
        content: Some(text),
        ..Delta::default()
    }
}

/// The scheduler's events for one sequence.
type Events = tokio::sync::mpsc::UnboundedReceiver<SeqEvent>;

/// A stream fed by an async task; dropping the stream (client gone) drops the receiver, which
/// closes the scheduler's channel and cancels the sequence.
fn async_stream<F, Fut>(
    producer: F,
) -> impl futures_util::Stream<Item = Result<Event, std::convert::Infallible>>
where
    F: FnOnce(tokio::sync::mpsc::Sender<Event>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(producer(tx));
    futures_util::StreamExt::map(tokio_stream::wrappers::ReceiverStream::new(rx), Ok)
}
