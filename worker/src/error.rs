//! Errors become responses in one place: OpenAI's JSON error body with the contract's status.

use straddle_protocol::ApiError;
use worker::{Response, Result};

/// The JSON response for `err`.
pub fn error_response(err: &ApiError) -> Result<Response> {
    let mut resp = Response::ok(err.to_body())?.with_status(err.status());
    resp.headers_mut().set("content-type", "application/json")?;
    Ok(resp)
}

/// Why a request is not served: an answer for the client, or the runtime's own failure.
#[derive(Debug)]
pub enum Refusal {
    /// OpenAI's error body, with a `retry-after` in seconds where waiting helps.
    Client(ApiError, Option<i64>),
    /// A binding or the budget object failed.
    Runtime(worker::Error),
}

impl From<ApiError> for Refusal {
    fn from(e: ApiError) -> Self {
        Self::Client(e, None)
    }
}

impl From<worker::Error> for Refusal {
    fn from(e: worker::Error) -> Self {
        Self::Runtime(e)
    }
}

impl From<serde_json::Error> for Refusal {
    fn from(e: serde_json::Error) -> Self {
        Self::Runtime(e.into())
    }
}

/// A handler's outcome as the runtime takes it: its answer, or its refusal as a response.
pub fn respond(outcome: std::result::Result<Response, Refusal>) -> Result<Response> {
    match outcome {
        Ok(resp) => Ok(resp),
        Err(Refusal::Client(e, retry_after)) => {
            let mut resp = error_response(&e)?;
            if let Some(s) = retry_after {
                resp.headers_mut().set("retry-after", &s.to_string())?;
            }
            Ok(resp)
        }
        Err(Refusal::Runtime(e)) => Err(e),
    }
}
