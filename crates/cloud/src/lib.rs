//! The cloud tier's HTTP surface: OpenAI-compatible routes over the engine.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use straddle_protocol::{ApiError, ErrorKind, ModelInfo, ModelList};

mod chat;
pub mod scheduler;
pub mod verify;

/// What the server knows about the model it serves.
#[derive(Debug, Clone)]
pub struct ModelCard {
    pub id: String,
    pub context_length: Option<u32>,
    pub architecture: String,
}

/// Shared state of the routes.
#[derive(Debug)]
pub struct AppState {
    pub model: ModelCard,
    /// The engine, when the server was started with one (tests of the HTTP surface run without).
    pub engine: Option<Arc<straddle_engine::Engine>>,
    /// The batching decode loop over `engine`.
    pub scheduler: Option<scheduler::Scheduler>,
    /// Speculative-decoding sessions of `/v1/verify`.
    pub verify_sessions: Arc<verify::Sessions>,
}

impl ModelCard {
    /// The card of a loaded engine (`fallback_id` when the GGUF has no `general.name`).
    pub fn of(engine: &straddle_engine::Engine, fallback_id: &str) -> Self {
        Self {
            id: engine
                .name
                .clone()
                .unwrap_or_else(|| fallback_id.to_string()),
            context_length: u32::try_from(engine.model.config.context_length).ok(),
            // The engine loads only `llama`-architecture files.
            architecture: "llama".into(),
        }
    }
}

/// The server's routes.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/verify", post(verify_route))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .with_state(state)
}

/// An [`ApiError`] as an HTTP response.
pub struct ErrorResponse(pub ApiError);

impl IntoResponse for ErrorResponse {
    fn into_response(self) -> Response {
        let status =
            StatusCode::from_u16(self.0.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (
            status,
            [("content-type", "application/json")],
            self.0.to_body(),
        )
            .into_response()
    }
}

async fn health(State(state): State<Arc<AppState>>) -> Json<serde_json::Value> {
    Json(
        serde_json::json!({"status": "ok", "model": state.model.id, "generation": state.engine.is_some()}),
    )
}

async fn models(State(state): State<Arc<AppState>>) -> Json<ModelList> {
    Json(ModelList {
        object: "list".into(),
        data: vec![ModelInfo {
            id: state.model.id.clone(),
            object: "model".into(),
            owned_by: "straddle".into(),
            tokenizer_hash: state.engine.as_ref().map(|e| e.tokenizer.hash.clone()),
            context_length: state.model.context_length,
        }],
    })
}

async fn chat(State(state): State<Arc<AppState>>, body: axum::body::Bytes) -> Response {
    let req = match serde_json::from_slice::<straddle_protocol::ChatRequest>(&body) {
        Err(e) => return ErrorResponse(ApiError::from_json_error(&e)).into_response(),
        Ok(req) => req,
    };
    if let Err(e) = req.validate() {
        return ErrorResponse(e).into_response();
    }
    let context = straddle_engine::generate::DEFAULT_CONTEXT;
    if req.token_limit().is_some_and(|n| n as usize >= context) {
        return ErrorResponse(
            ApiError::invalid(
                "max_tokens",
                format!("must be below the context of {context} tokens"),
            )
            .with_code("context_length_exceeded"),
        )
        .into_response();
    }
    let Some(scheduler) = state.scheduler.as_ref() else {
        return ErrorResponse(
            ApiError::new(ErrorKind::Unavailable, "no model loaded").with_code("engine_not_ready"),
        )
        .into_response();
    };
    crate::chat::complete(scheduler, state.model.id.clone(), req).await
}

async fn verify_route(State(state): State<Arc<AppState>>, body: axum::body::Bytes) -> Response {
    let req = match serde_json::from_slice::<straddle_protocol::VerifyRequest>(&body) {
        Err(e) => return ErrorResponse(ApiError::from_json_error(&e)).into_response(),
        Ok(req) => req,
    };
    let Some(engine) = state.engine.clone() else {
        return ErrorResponse(
            ApiError::new(ErrorKind::Unavailable, "no model loaded").with_code("engine_not_ready"),
        )
        .into_response();
    };
    crate::verify::verify(engine, state.verify_sessions.clone(), req).await
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let body = state
        .scheduler
        .as_ref()
        .map(|s| s.metrics.render())
        .unwrap_or_default();
    ([("content-type", "text/plain; version=0.0.4")], body).into_response()
}

async fn not_found() -> ErrorResponse {
    ErrorResponse(ApiError::new(ErrorKind::NotFound, "no such route"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    fn app() -> Router {
        router(Arc::new(AppState {
            model: ModelCard {
                id: "m".into(),
                context_length: Some(8192),
                architecture: "llama".into(),
            },
            engine: None,
            scheduler: None,
            verify_sessions: Default::default(),
        }))
    }

    async fn call(method: &str, uri: &str, body: &str) -> (u16, serde_json::Value) {
        let req = Request::builder()
            .method(method)
            .uri(uri)
            .body(Body::from(body.to_string()))
            .expect("request");
        let resp = app().oneshot(req).await.expect("response");
        let status = resp.status().as_u16();
        let bytes = resp.into_body().collect().await.expect("body").to_bytes();
        (status, serde_json::from_slice(&bytes).expect("json body"))
    }

    #[tokio::test]
    async fn malformed_json_is_a_400_with_openai_error_shape() {
        let (status, body) = call("POST", "/v1/chat/completions", "{not json").await;
        assert_eq!(status, 400);
        assert_eq!(body["error"]["type"], "invalid_request");
    }

    #[tokio::test]
    async fn models_lists_the_served_model() {
        let (status, body) = call("GET", "/v1/models", "").await;
        assert_eq!(status, 200);
        assert_eq!(body["data"][0]["id"], "m");
        assert_eq!(body["data"][0]["context_length"], 8192);
    }
}
