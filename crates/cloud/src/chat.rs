//! `/v1/chat/completions` over the engine: OpenAI's response and SSE chunk formats.

use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use straddle_engine::{ChatMessage, Finish, GenerateParams, SamplingParams};
use straddle_protocol::{
    ApiError, ChatChunk, ChatRequest, ChatResponse, Choice, ChunkChoice, Delta, ErrorKind,
    FinishReason, Message, Role, Usage,
};

use crate::error::ErrorResponse;
use crate::scheduler::{Job, Scheduler, SeqEvent};

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn finish_reason(f: Finish) -> FinishReason {
    match f {
        Finish::Stop => FinishReason::Stop,
        Finish::Length => FinishReason::Length,
        Finish::Cancelled => FinishReason::Cancelled,
    }
}

fn params(req: &ChatRequest, context: usize) -> GenerateParams {
    GenerateParams {
        sampling: SamplingParams {
            temperature: req.temperature.unwrap_or(0.0),
            top_k: req.top_k.unwrap_or(0) as usize,
            top_p: req.top_p.unwrap_or(1.0),
            repetition_penalty: req.repetition_penalty.unwrap_or(1.0),
            seed: req.seed.unwrap_or(0),
        },
        max_tokens: req.token_limit().unwrap_or(512) as usize,
        stop: req.stop.clone().map(|s| s.into_vec()).unwrap_or_default(),
        stop_tokens: Vec::new(),
        context,
    }
}

/// Answers one request, streamed or whole, through the batching scheduler.
pub async fn complete(scheduler: &Scheduler, model: String, req: ChatRequest) -> Response {
    let messages: Vec<ChatMessage> = req
        .messages
        .iter()
        .map(|m| ChatMessage::new(m.role.as_str(), m.content.clone()))
        .collect();
    let created = now_secs();
    let id = format!(
        "chatcmpl-{created:x}{:x}",
        scheduler
            .metrics
            .requests
            .load(std::sync::atomic::Ordering::Relaxed)
    );
    let include_usage = req.stream_options.as_ref().is_some_and(|o| o.include_usage);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    if let Err(e) = scheduler.submit(Job {
        messages,
        continues: req.continue_final_message == Some(true),
        params: params(&req, straddle_engine::generate::DEFAULT_CONTEXT),
        events: tx,
    }) {
        let mut resp = ErrorResponse(e).into_response();
        resp.headers_mut()
            .insert("retry-after", axum::http::HeaderValue::from_static("1"));
        return resp;
    }
    if !req.stream {
        while let Some(ev) = rx.recv().await {
            match ev {
                SeqEvent::Token(_) => {}
                SeqEvent::Error(e) => return ErrorResponse(e).into_response(),
                SeqEvent::Done {
                    text,
                    finish,
                    prompt_tokens,
                    completion_tokens,
                } => {
                    return axum::Json(ChatResponse {
                        id,
                        object: "chat.completion".into(),
                        created,
                        model,
                        choices: vec![Choice {
                            index: 0,
                            message: Message::new(Role::Assistant, text),
                            finish_reason: Some(finish_reason(finish)),
                            logprobs: None,
                        }],
                        usage: Usage::new(prompt_tokens, completion_tokens),
                        straddle: None,
                    })
                    .into_response();
                }
            }
        }
        return ErrorResponse(ApiError::new(
            ErrorKind::Internal,
            "generation ended without a result",
        ))
        .into_response();
    }
    let chunk = move |delta: Delta, finish: Option<FinishReason>, usage: Option<Usage>| {
        let c = ChatChunk {
            id: id.clone(),
            object: "chat.completion.chunk".into(),
            created,
            model: model.clone(),
            choices: if usage.is_some() {
                vec![]
            } else {
                vec![ChunkChoice {
                    index: 0,
                    delta,
                    finish_reason: finish,
                    logprobs: None,
                }]
            },
            usage,
            straddle: None,
        };
        Event::default().data(serde_json::to_string(&c).unwrap_or_default())
    };
    let stream = async_stream(move |out| async move {
        let _ = out
            .send(chunk(
                Delta {
                    role: Some(Role::Assistant),
                    content: Some(String::new()),
                },
                None,
                None,
            ))
            .await;
        while let Some(ev) = rx.recv().await {
            let done = match ev {
                SeqEvent::Token(text) => out
                    .send(chunk(
                        Delta {
                            role: None,
                            content: Some(text),
                        },
                        None,
                        None,
                    ))
                    .await
                    .is_err(),
                SeqEvent::Error(e) => {
                    let _ = out.send(Event::default().data(e.to_body())).await;
                    true
                }
                SeqEvent::Done {
                    finish,
                    prompt_tokens,
                    completion_tokens,
                    ..
                } => {
                    let _ = out
                        .send(chunk(Delta::default(), Some(finish_reason(finish)), None))
                        .await;
                    if include_usage {
                        let _ = out
                            .send(chunk(
                                Delta::default(),
                                None,
                                Some(Usage::new(prompt_tokens, completion_tokens)),
                            ))
                            .await;
                    }
                    true
                }
            };
            if done {
                break;
            }
        }
        let _ = out.send(Event::default().data("[DONE]")).await;
    });
    Sse::new(stream).into_response()
}

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
