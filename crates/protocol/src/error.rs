//! The JSON error body `{error:{type, message, code, param}}` and its HTTP status.

use serde::{Deserialize, Serialize};

/// Classes of failure, each with one HTTP status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    InvalidRequest,
    Authentication,
    /// Authenticated, but this tenant may not do this (an origin or model it does not allow).
    Forbidden,
    BudgetExceeded,
    TooLarge,
    RateLimited,
    PrivacyRefused,
    Conflict,
    UpstreamError,
    Unavailable,
    UpstreamTimeout,
    NotFound,
    Internal,
}

impl ErrorKind {
    /// The HTTP status that goes with this kind (see DESIGN.md's contract).
    pub fn status(self) -> u16 {
        match self {
            ErrorKind::InvalidRequest => 400,
            ErrorKind::Authentication => 401,
            ErrorKind::BudgetExceeded => 402,
            ErrorKind::Forbidden => 403,
            ErrorKind::NotFound => 404,
            ErrorKind::Conflict => 409,
            ErrorKind::TooLarge => 413,
            ErrorKind::RateLimited => 429,
            ErrorKind::PrivacyRefused => 451,
            ErrorKind::Internal => 500,
            ErrorKind::UpstreamError => 502,
            ErrorKind::Unavailable => 503,
            ErrorKind::UpstreamTimeout => 504,
        }
    }
}

/// An API error as it travels on the wire.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, thiserror::Error)]
#[error("{kind:?}: {message}")]
pub struct ApiError {
    #[serde(rename = "type")]
    pub kind: ErrorKind,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// The request field at fault, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub param: Option<String>,
}

/// The envelope OpenAI clients expect: `{"error": {...}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ApiError,
}

impl ApiError {
    /// An error of `kind` with a message.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            code: None,
            param: None,
        }
    }

    /// A 400 naming the offending field.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        let param = param.into();
        Self {
            kind: ErrorKind::InvalidRequest,
            message: format!("{param}: {}", message.into()),
            code: Some("invalid_value".into()),
            param: Some(param),
        }
    }

    /// Sets the machine-readable code.
    pub fn with_code(mut self, code: impl Into<String>) -> Self {
        self.code = Some(code.into());
        self
    }

    /// The HTTP status of this error.
    pub fn status(&self) -> u16 {
        self.kind.status()
    }

    /// The JSON body to send.
    pub fn to_body(&self) -> String {
        serde_json::to_string(&ErrorBody {
            error: self.clone(),
        })
        .unwrap_or_else(|_| {
            r#"{"error":{"type":"internal","message":"error serialisation failed"}}"#.into()
        })
    }

    /// A 400 from a serde error, naming the field when serde says which; a standard OpenAI
    /// field this server does not implement is said to be unsupported, not misspelt.
    pub fn from_json_error(err: &serde_json::Error) -> Self {
        let text = err.to_string();
        let named = text
            .split('`')
            .nth(1)
            .filter(|_| text.starts_with("unknown field") || text.starts_with("missing field"));
        let param = if text.starts_with("unsupported content part") {
            Some("messages")
        } else {
            named
        };
        let message = match named {
            Some(field) if UNSUPPORTED_FIELDS.contains(&field) => {
                format!("`{field}` is not supported by this server")
            }
            _ => format!("malformed JSON body: {text}"),
        };
        Self {
            kind: ErrorKind::InvalidRequest,
            message,
            code: Some("invalid_json".into()),
            param: param.map(str::to_string),
        }
    }
}

/// Fields of OpenAI's chat request that Straddle does not implement: refused by name (the
/// README lists what is supported).
pub const UNSUPPORTED_FIELDS: &[&str] = &[
    "functions",
    "function_call",
    "modalities",
    "audio",
    "prediction",
    "reasoning_effort",
    "web_search_options",
    "service_tier",
    "store",
    "metadata",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_follow_the_contract() {
        let pairs = [
            (ErrorKind::InvalidRequest, 400),
            (ErrorKind::Authentication, 401),
            (ErrorKind::BudgetExceeded, 402),
            (ErrorKind::Forbidden, 403),
            (ErrorKind::TooLarge, 413),
            (ErrorKind::RateLimited, 429),
            (ErrorKind::PrivacyRefused, 451),
            (ErrorKind::UpstreamError, 502),
            (ErrorKind::Unavailable, 503),
            (ErrorKind::UpstreamTimeout, 504),
        ];
        for (kind, status) in pairs {
            assert_eq!(kind.status(), status, "{kind:?}");
        }
    }

    #[test]
    fn json_error_names_the_unknown_field() {
        let err = serde_json::from_str::<crate::ChatRequest>(r#"{"messages":[],"tempreature":1}"#)
            .unwrap_err();
        let api = ApiError::from_json_error(&err);
        assert_eq!(api.param.as_deref(), Some("tempreature"));
        let body: serde_json::Value = serde_json::from_str(&api.to_body()).expect("json");
        assert_eq!(body["error"]["type"], "invalid_request");
    }

    #[test]
    fn a_standard_field_not_implemented_is_called_unsupported() {
        let body = r#"{"messages":[{"role":"user","content":"hi"}],"modalities":["audio"]}"#;
        let err = serde_json::from_str::<crate::ChatRequest>(body).unwrap_err();
        let api = ApiError::from_json_error(&err);
        assert_eq!(api.param.as_deref(), Some("modalities"));
        assert!(api.message.contains("not supported"), "{}", api.message);
    }
}
