//! How the server answers what went wrong: every failure is an OpenAI-shaped [`ApiError`],
//! and request bodies are read by [`AppJson`], whose rejection is one too (axum's
//! error-handling example).

use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use straddle_engine::EngineError;
use straddle_protocol::{ApiError, ErrorKind};

/// An [`ApiError`] as an HTTP response.
#[derive(Debug)]
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

impl From<ApiError> for ErrorResponse {
    fn from(e: ApiError) -> Self {
        Self(e)
    }
}

/// A JSON request body; one that does not parse is answered with the field and the reason,
/// whatever its content type (clients often send none).
#[derive(Debug)]
pub struct AppJson<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> FromRequest<S> for AppJson<T> {
    type Rejection = ErrorResponse;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let body = axum::body::Bytes::from_request(req, state)
            .await
            .map_err(|e| ApiError::invalid("body", e.body_text()))?;
        serde_json::from_slice(&body)
            .map(AppJson)
            .map_err(|e| ApiError::from_json_error(&e).into())
    }
}

/// The answer when no model is loaded.
pub fn not_ready() -> ErrorResponse {
    ApiError::new(ErrorKind::Unavailable, "no model loaded")
        .with_code("engine_not_ready")
        .into()
}

/// An engine failure as the client sees it: its own fault (a prompt too long, a conversation
/// the template cannot render) or the server's.
pub fn engine_error(e: EngineError) -> ApiError {
    use straddle_engine::EngineError as E;
    match e {
        E::PromptTooLong { .. } => ApiError::new(ErrorKind::InvalidRequest, e.to_string())
            .with_code("context_length_exceeded"),
        // The conversation cannot be rendered (or continued) with the model's template.
        E::EmptyPrompt | E::Template(_) => ApiError::invalid("messages", e.to_string()),
        other => ApiError::new(ErrorKind::Internal, other.to_string()),
    }
}
