//! The cloud tier's HTTP surface: OpenAI-compatible routes over the engine.

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use straddle_protocol::{
    ApiError, ChatRequest, ErrorKind, LoadReport, ModelInfo, ModelList, VerifyRequest,
};

pub mod backend;
mod chat;
pub mod error;
pub mod scheduler;
pub mod verify;

pub use error::ErrorResponse;
use error::{AppJson, not_ready};

/// What the server knows about the model it serves.
#[derive(Debug, Clone)]
pub struct ModelCard {
    pub id: String,
    pub context_length: Option<u32>,
    pub architecture: String,
    /// The tokenizer's hash: clients draft for `/v1/verify` only with the same tokenizer.
    pub tokenizer_hash: Option<String>,
    /// Where the model runs (`cpu`, or `wgpu` with the adapter's name), reported by `/health`.
    pub backend: String,
}

/// Shared state of the routes.
pub struct AppState {
    pub model: ModelCard,
    /// The batching decode loop (absent in tests of the HTTP surface alone).
    pub scheduler: Option<scheduler::Scheduler>,
    /// `/v1/verify` over the same model, with its sessions.
    pub verifier: Option<Arc<dyn verify::Verify>>,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("model", &self.model)
            .field("scheduler", &self.scheduler)
            .field("verifier", &self.verifier.is_some())
            .finish()
    }
}

impl ModelCard {
    /// The card of a loaded model: its GGUF `general.name` (else `fallback_id`), its
    /// `general.architecture`, context length and tokenizer, running on `backend`.
    pub fn new(
        name: Option<&str>,
        fallback_id: &str,
        architecture: &str,
        context_length: usize,
        tokenizer_hash: &str,
        backend: &str,
    ) -> Self {
        Self {
            id: name.unwrap_or(fallback_id).to_string(),
            context_length: u32::try_from(context_length).ok(),
            architecture: architecture.into(),
            tokenizer_hash: Some(tokenizer_hash.to_string()),
            backend: backend.to_string(),
        }
    }
}

/// The server's routes.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/v1/load", get(load))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/verify", post(verify_route))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .with_state(state)
}

async fn health(State(state): State<Arc<AppState>>) -> Json<serde_json::Value> {
    Json(serde_json::json!({
        "status": "ok",
        "model": state.model.id,
        "backend": state.model.backend,
        "generation": state.scheduler.is_some(),
    }))
}

/// How loaded the server is, for the page's router (relayed by the worker).
async fn load(State(state): State<Arc<AppState>>) -> Result<Json<LoadReport>, ErrorResponse> {
    let scheduler = state.scheduler.as_ref().ok_or_else(not_ready)?;
    Ok(Json(scheduler.load()))
}

async fn models(State(state): State<Arc<AppState>>) -> Json<ModelList> {
    Json(ModelList {
        object: "list".into(),
        data: vec![ModelInfo {
            id: state.model.id.clone(),
            object: "model".into(),
            owned_by: "straddle".into(),
            tokenizer_hash: state.model.tokenizer_hash.clone(),
            context_length: state.model.context_length,
        }],
    })
}

async fn chat(
    State(state): State<Arc<AppState>>,
    AppJson(req): AppJson<ChatRequest>,
) -> Result<Response, ErrorResponse> {
    req.validate()?;
    let context = straddle_engine::DEFAULT_CONTEXT;
    if req.token_limit().is_some_and(|n| n as usize >= context) {
        let e = ApiError::invalid(
            "max_tokens",
            format!("must be below the context of {context} tokens"),
        );
        return Err(e.with_code("context_length_exceeded").into());
    }
    let scheduler = state.scheduler.as_ref().ok_or_else(not_ready)?;
    crate::chat::complete(scheduler, state.model.id.clone(), req).await
}

async fn verify_route(
    State(state): State<Arc<AppState>>,
    AppJson(req): AppJson<VerifyRequest>,
) -> Result<Response, ErrorResponse> {
    let verifier = state.verifier.clone().ok_or_else(not_ready)?;
    Ok(crate::verify::verify(verifier, req).await)
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
                tokenizer_hash: None,
                backend: "none".into(),
            },
            scheduler: None,
            verifier: None,
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
