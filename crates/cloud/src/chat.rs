//! `/v1/chat/completions` over the engine: OpenAI's response and SSE chunk formats.

use std::sync::{Arc, Mutex};

use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use straddle_engine::{ChatMessage, Engine, Finish, Flow, GenerateParams, Prompt, SamplingParams};
use straddle_protocol::{
    ApiError, ChatChunk, ChatRequest, ChatResponse, Choice, ChunkChoice, Delta, ErrorKind,
    FinishReason, Message, Role, Usage,
};

use crate::ErrorResponse;

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

/// Answers one request, streamed or whole.
pub async fn complete(engine: Arc<Mutex<Engine>>, model: String, req: ChatRequest) -> Response {
    let messages: Vec<ChatMessage> = req
        .messages
        .iter()
        .map(|m| ChatMessage::new(m.role.as_str(), m.content.clone()))
        .collect();
    let id = format!(
        "chatcmpl-{:x}",
        now_secs() ^ (std::ptr::addr_of!(req) as u64)
    );
    let created = now_secs();
    let include_usage = req.stream_options.as_ref().is_some_and(|o| o.include_usage);
    let gen_params = params(&req, straddle_engine::generate::DEFAULT_CONTEXT);
    if !req.stream {
        let result = tokio::task::spawn_blocking(move || {
            let e = engine
                .lock()
                .map_err(|_| ApiError::new(ErrorKind::Internal, "engine poisoned"))?;
            e.generate(Prompt::Messages(&messages), &gen_params, |_| Flow::Continue)
                .map_err(engine_error)
        })
        .await;
        return match result {
            Ok(Ok(c)) => axum::Json(ChatResponse {
                id,
                object: "chat.completion".into(),
                created,
                model,
                choices: vec![Choice {
                    index: 0,
                    message: Message::new(Role::Assistant, c.text.clone()),
                    finish_reason: Some(finish_reason(c.finish)),
                    logprobs: None,
                }],
                usage: Usage::new(c.prompt_tokens as u32, c.tokens.len() as u32),
                straddle: None,
            })
            .into_response(),
            Ok(Err(e)) => ErrorResponse(e).into_response(),
            Err(_) => ErrorResponse(ApiError::new(ErrorKind::Internal, "generation task failed"))
                .into_response(),
        };
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Event, std::convert::Infallible>>(64);
    tokio::task::spawn_blocking(move || {
        let chunk = |delta: Delta, finish: Option<FinishReason>, usage: Option<Usage>| {
            let c = ChatChunk {
                id: id.clone(),
                object: "chat.completion.chunk".into(),
                created,
                model: model.clone(),
                choices: if usage.is_some() && finish.is_none() {
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
        let _ = tx.blocking_send(Ok(chunk(
            Delta {
                role: Some(Role::Assistant),
                content: Some(String::new()),
            },
            None,
            None,
        )));
        let Ok(e) = engine.lock() else { return };
        let result = e.generate(Prompt::Messages(&messages), &gen_params, |ev| {
            if ev.text.is_empty() {
                return Flow::Continue;
            }
            // A closed channel means the client went away: stop spending compute on it.
            match tx.blocking_send(Ok(chunk(
                Delta {
                    role: None,
                    content: Some(ev.text.clone()),
                },
                None,
                None,
            ))) {
                Ok(()) => Flow::Continue,
                Err(_) => Flow::Cancel,
            }
        });
        match result {
            Ok(c) => {
                let _ = tx.blocking_send(Ok(chunk(
                    Delta::default(),
                    Some(finish_reason(c.finish)),
                    None,
                )));
                if include_usage {
                    let _ = tx.blocking_send(Ok(chunk(
                        Delta::default(),
                        None,
                        Some(Usage::new(c.prompt_tokens as u32, c.tokens.len() as u32)),
                    )));
                }
            }
            Err(err) => {
                let _ = tx.blocking_send(Ok(Event::default().data(engine_error(err).to_body())));
            }
        }
        let _ = tx.blocking_send(Ok(Event::default().data("[DONE]")));
    });
    Sse::new(tokio_stream::wrappers::ReceiverStream::new(rx)).into_response()
}

fn engine_error(e: straddle_engine::EngineError) -> ApiError {
    use straddle_engine::EngineError as E;
    match e {
        E::PromptTooLong { .. } | E::EmptyPrompt | E::Template(_) => {
            ApiError::new(ErrorKind::InvalidRequest, e.to_string())
                .with_code("context_length_exceeded")
        }
        other => ApiError::new(ErrorKind::Internal, other.to_string()),
    }
}
