//! `ApiError`: the one error type of the HTTP API (`/api/*`, the portal's endpoints and the
//! runners' join, registration and heartbeat). Handlers return it, or turn a domain error
//! into it with `From`, instead of building their own error responses.
//!
//! Invariants: every error body is `{"error": "<message>"}`, the shape the portal and the
//! command line read; a store or audit failure is logged here with its cause and answered
//! with a fixed sentence (503), never with the cause itself.

use std::fmt::Display;

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::server::approvals::ApprovalError;

/// An error answer: its status and the sentence the caller reads.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
        }
    }

    /// 400: the request broke a rule; `message` names the field and the rule.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    /// 503 for an internal failure: `cause` is logged under `what`, and the caller reads
    /// only `message`.
    pub fn unavailable(what: &str, cause: &dyn Display, message: impl Into<String>) -> Self {
        tracing::error!(error = %cause, "{what}");
        Self::new(StatusCode::SERVICE_UNAVAILABLE, message)
    }

    pub fn status(&self) -> StatusCode {
        self.status
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(json!({"error": self.message}))).into_response()
    }
}

impl From<ApprovalError> for ApiError {
    fn from(e: ApprovalError) -> Self {
        let status = match &e {
            ApprovalError::NotFound(_) => StatusCode::NOT_FOUND,
            ApprovalError::Refused(_) => StatusCode::FORBIDDEN,
            ApprovalError::WrongState { .. } => StatusCode::CONFLICT,
            ApprovalError::Audit(_) | ApprovalError::Store(_) => {
                tracing::error!(error = %e, "approval request failed");
                StatusCode::SERVICE_UNAVAILABLE
            }
        };
        ApiError::new(status, e.to_string())
    }
}
