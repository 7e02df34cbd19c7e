//! `ApiError`: the one error type of the HTTP API (`/api/*`, the portal's endpoints, the
//! runners' join, registration and heartbeat) and of the refusals in front of every route
//! (the door's, the DNS-rebinding check's). Handlers return it, or turn a domain error into
//! it with `From`, instead of building their own error responses.
//!
//! Invariants: every error body is `{"error": "<message>", "code": "<code>"}`, the shape the
//! portal and the command line read: `message` is for people and may change, `code` is a
//! [`Code`], stable, for programs to branch on. Each code has one status (but a login body
//! that is not JSON keeps the status the JSON reader gives it); docs/api.md tables the codes
//! and openapi.yaml's `Error` schema lists them, and a test holds the three together. A store
//! or audit failure is logged here with its cause and answered with a fixed sentence (503),
//! never with the cause itself.

use std::fmt::Display;

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::server::approvals::ApprovalError;
use crate::server::fleet::FleetError;

/// Declares [`Code`] with each code's name and status, and (for the tests) `Code::ALL` from
/// the same list, so no code can be left out of what the docs test reads.
macro_rules! codes {
    ($($(#[doc = $doc:literal])* $variant:ident = $name:literal, $status:ident;)*) => {
        /// What went wrong, as a program branches on it: the `code` of every error body.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub(crate) enum Code {
            $($(#[doc = $doc])* $variant,)*
        }

        impl Code {
            /// Every code, in the order docs/api.md tables them (for the test that holds
            /// the two together).
            #[cfg(test)]
            pub(crate) const ALL: &[Code] = &[$(Code::$variant,)*];

            /// The stable name, as the body carries it.
            pub(crate) fn as_str(self) -> &'static str {
                match self {
                    $(Code::$variant => $name,)*
                }
            }

            /// The HTTP status it is answered with.
            pub(crate) fn status(self) -> StatusCode {
                match self {
                    $(Code::$variant => StatusCode::$status,)*
                }
            }
        }
    };
}

codes! {
    /// The request broke a rule; the message names the field and the rule.
    InvalidRequest = "invalid_request", BAD_REQUEST;
    /// No credential, or one that is unknown, expired or revoked.
    Unauthenticated = "unauthenticated", UNAUTHORIZED;
    /// The caller may not do this (its role, or the rules of the decision).
    Forbidden = "forbidden", FORBIDDEN;
    /// A person signed in through the OpenID provider holds no role in emisar.
    NoRole = "no_role", FORBIDDEN;
    /// A change made with the portal's cookie without its CSRF token.
    CsrfRequired = "csrf_required", FORBIDDEN;
    /// The `Host` header does not name this server (DNS-rebinding protection).
    HostNotAllowed = "host_not_allowed", FORBIDDEN;
    /// The `Origin` of a request to `/mcp` is not this server's nor an allowed one.
    OriginNotAllowed = "origin_not_allowed", FORBIDDEN;
    /// Password login is switched off (`oidc.local_login = false`).
    PasswordLoginOff = "password_login_off", FORBIDDEN;
    /// No such thing (or not one this caller may see).
    NotFound = "not_found", NOT_FOUND;
    /// Not in a state that allows this.
    Conflict = "conflict", CONFLICT;
    /// Too many attempts; wait and try again.
    RateLimited = "rate_limited", TOO_MANY_REQUESTS;
    /// The server is doing as much of this at once as it will; try again shortly.
    Busy = "busy", SERVICE_UNAVAILABLE;
    /// The store or the audit log is unavailable; nothing changed.
    Unavailable = "unavailable", SERVICE_UNAVAILABLE;
}

/// An error answer: its status, its code and the sentence the caller reads.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    code: Code,
    message: String,
}

impl ApiError {
    pub(crate) fn new(code: Code, message: impl Into<String>) -> Self {
        ApiError {
            status: code.status(),
            code,
            message: message.into(),
        }
    }

    /// 400: the request broke a rule; `message` names the field and the rule.
    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(Code::InvalidRequest, message)
    }

    /// A body the JSON reader refused: `invalid_request`, with the reader's own status (400,
    /// or 413, 415 or 422 for a body too large, not JSON, or of the wrong shape).
    pub(crate) fn unreadable_body(rejection: &JsonRejection, message: impl Into<String>) -> Self {
        ApiError {
            status: rejection.status(),
            ..Self::bad_request(message)
        }
    }

    /// 503 for an internal failure: `cause` is logged under `what`, and the caller reads
    /// only `message`.
    pub(crate) fn unavailable(what: &str, cause: &dyn Display, message: impl Into<String>) -> Self {
        tracing::error!(error = %cause, "{what}");
        Self::new(Code::Unavailable, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": self.message, "code": self.code.as_str()});
        (self.status, Json(body)).into_response()
    }
}

impl From<ApprovalError> for ApiError {
    fn from(e: ApprovalError) -> Self {
        let code = match &e {
            ApprovalError::NotFound(_) => Code::NotFound,
            ApprovalError::Refused(_) => Code::Forbidden,
            ApprovalError::WrongState { .. } => Code::Conflict,
            ApprovalError::Audit(_) | ApprovalError::Store(_) => {
                tracing::error!(error = %e, "approval request failed");
                Code::Unavailable
            }
        };
        ApiError::new(code, e.to_string())
    }
}

impl From<crate::server::gateway::GrantError> for ApiError {
    fn from(e: crate::server::gateway::GrantError) -> Self {
        use crate::server::gateway::GrantError;
        let code = match &e {
            GrantError::NotFound(_) => Code::NotFound,
            GrantError::Invalid(_) => Code::InvalidRequest,
            GrantError::Refused(_) => Code::Forbidden,
            GrantError::Audit(_) => {
                return ApiError::unavailable(
                    "a grant operation failed",
                    &e,
                    "refused: the audit log cannot record this now, so nothing changed; try again later",
                );
            }
            GrantError::Store(_) => {
                return ApiError::unavailable(
                    "a grant operation failed",
                    &e,
                    "the grant store is unavailable; try again later",
                );
            }
        };
        ApiError::new(code, e.to_string())
    }
}

impl From<FleetError> for ApiError {
    fn from(e: FleetError) -> Self {
        let code = match &e {
            FleetError::Invalid(_) => Code::InvalidRequest,
            FleetError::Unauthorized(_) => Code::Unauthenticated,
            FleetError::Forbidden(_) => Code::Forbidden,
            FleetError::Conflict(_) => Code::Conflict,
            FleetError::TooMany(_) => Code::RateLimited,
            FleetError::Store(_) => {
                return ApiError::unavailable(
                    "a runner's join, registration or heartbeat failed",
                    &e,
                    "the store is unavailable; try again later",
                );
            }
            FleetError::Audit(_) => {
                return ApiError::unavailable(
                    "a runner's join, registration or heartbeat failed",
                    &e,
                    "the audit log cannot record this; try again later",
                );
            }
        };
        ApiError::new(code, e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// The codes docs/api.md tables under "## Errors", each with the status its row gives
    /// (the row's first number).
    fn documented() -> BTreeMap<String, u16> {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/api.md");
        let text = std::fs::read_to_string(path).unwrap();
        let section = text
            .split("\n## ")
            .find(|s| s.starts_with("Errors\n"))
            .expect("docs/api.md has a section `## Errors`");
        let mut rows = BTreeMap::new();
        // The rows under the header (`| \`code\` | Status | When |`) and its rule.
        for line in section.lines().filter(|l| l.starts_with("| `")).skip(1) {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let code = cells[1].trim_matches('`').to_owned();
            let status = cells[2].parse().unwrap_or_else(|_| {
                panic!("docs/api.md: the status of `{code}` is not a number: {line}")
            });
            assert!(
                rows.insert(code.clone(), status).is_none(),
                "docs/api.md tables `{code}` twice"
            );
        }
        rows
    }

    /// The codes the OpenAPI document's `Error` schema lists.
    fn in_openapi() -> Vec<String> {
        let schema = &crate::server::http::api::openapi::document()["components"]["schemas"]["Error"]
            ["properties"]["code"]["enum"];
        schema
            .as_array()
            .expect("openapi.yaml: `Error.code` has an `enum`")
            .iter()
            .map(|c| c.as_str().unwrap().to_owned())
            .collect()
    }

    /// Every code an `ApiError` can carry is tabled in docs/api.md with its status and listed
    /// in openapi.yaml's `Error` schema, in the same order, and neither names one it cannot.
    #[test]
    fn the_codes_are_the_documented_ones() {
        let ours: BTreeMap<String, u16> = Code::ALL
            .iter()
            .map(|c| (c.as_str().to_owned(), c.status().as_u16()))
            .collect();
        assert_eq!(ours.len(), Code::ALL.len(), "two codes share a name");
        assert_eq!(
            documented(),
            ours,
            "docs/api.md's table of error codes (code, status) differs from `Code`"
        );
        let names: Vec<String> = Code::ALL.iter().map(|c| c.as_str().to_owned()).collect();
        assert_eq!(
            in_openapi(),
            names,
            "openapi.yaml's `Error.code` enum differs from `Code::ALL`"
        );
    }

    /// The body carries the code next to the sentence, and the status is the code's.
    #[tokio::test]
    async fn the_body_carries_the_code() {
        let response = ApiError::new(Code::NotFound, "no such thing").into_response();
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
        let body = axum::body::to_bytes(response.into_body(), 1024)
            .await
            .unwrap();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body, json!({"error": "no such thing", "code": "not_found"}));
    }
}
