//! `/v1/verify`: one forward pass over an edge draft; greedy verification only.
//!
//! Each call prefills the prefix afresh; keeping a sequence's KV cache between calls of one
//! generation (sessions) is future work of the speculative-decoding issue.

use std::sync::Arc;

use axum::response::{IntoResponse, Response};
use straddle_engine::{ChatMessage, Engine, Prompt};
use straddle_protocol::{ApiError, ErrorKind, Usage, VerifyRequest, VerifyResponse};

use crate::ErrorResponse;

/// Checks a draft against the served model.
pub async fn verify(engine: Arc<Engine>, req: VerifyRequest) -> Response {
    if req.temperature.is_some_and(|t| t > 0.0) {
        return ErrorResponse(ApiError::invalid(
            "temperature",
            "only greedy verification (temperature 0) is supported",
        ))
        .into_response();
    }
    if req.draft_tokens.is_empty() || req.draft_tokens.len() > 64 {
        return ErrorResponse(ApiError::invalid(
            "draft_tokens",
            "must hold 1 to 64 tokens",
        ))
        .into_response();
    }
    let result = tokio::task::spawn_blocking(move || -> Result<VerifyResponse, ApiError> {
        let e = &*engine;
        if let Some(theirs) = req
            .tokenizer_hash
            .as_ref()
            .filter(|h| **h != e.tokenizer.hash)
        {
            return Err(ApiError::new(
                ErrorKind::Conflict,
                format!(
                    "tokenizer mismatch: request {theirs}, server {}",
                    e.tokenizer.hash
                ),
            )
            .with_code("tokenizer_mismatch"));
        }
        let vocab = e.tokenizer.vocab_size() as u32;
        let prefix = match &req.prefix_tokens {
            Some(t) => t.clone(),
            None => {
                let msgs: Vec<ChatMessage> = req
                    .messages
                    .iter()
                    .map(|m| ChatMessage::new(m.role.as_str(), m.content.clone()))
                    .collect();
                e.prompt_tokens(Prompt::Messages(&msgs))
                    .map_err(|err| ApiError::invalid("messages", err.to_string()))?
            }
        };
        if prefix.is_empty() {
            return Err(ApiError::invalid("prefix_tokens", "must not be empty"));
        }
        if let Some(bad) = prefix
            .iter()
            .chain(&req.draft_tokens)
            .find(|&&t| t >= vocab)
        {
            return Err(ApiError::invalid(
                "draft_tokens",
                format!("token id {bad} is outside the vocabulary of {vocab}"),
            ));
        }
        let context = prefix.len() + req.draft_tokens.len() + 1;
        if context > straddle_engine::generate::DEFAULT_CONTEXT {
            return Err(
                ApiError::invalid("prefix_tokens", "prefix and draft exceed the context")
                    .with_code("context_length_exceeded"),
            );
        }
        let mut cache = e.new_cache(context);
        let logits = e
            .model
            .forward(&prefix, &mut cache, false)
            .map_err(|err| ApiError::new(ErrorKind::Internal, err.to_string()))?;
        let last = logits
            .last()
            .ok_or_else(|| ApiError::new(ErrorKind::Internal, "no logits"))?;
        let v = e
            .verify(&mut cache, last, &req.draft_tokens, &Default::default())
            .map_err(|err| ApiError::new(ErrorKind::Internal, err.to_string()))?;
        Ok(VerifyResponse {
            accepted: v.accepted as u32,
            next_token: v.next_token,
            usage: Usage::new((prefix.len() + req.draft_tokens.len()) as u32, 1),
        })
    })
    .await;
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
