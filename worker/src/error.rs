//! Errors become responses in one place: OpenAI's JSON error body with the contract's status.

use straddle_protocol::ApiError;
use worker::{Response, Result};

/// The JSON response for `err`.
pub fn error_response(err: &ApiError) -> Result<Response> {
    let mut resp = Response::ok(err.to_body())?.with_status(err.status());
    resp.headers_mut().set("content-type", "application/json")?;
    Ok(resp)
}
