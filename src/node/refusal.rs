//! How the runner's HTTP endpoints refuse: a [`Refused`] is the status and the reason a caller
//! reads, [`refuse`] answers with it (and logs it), [`bearer`] reads the token a request
//! carries, and [`ledger_refusal`] turns the ledger's refusal ([`super::executed::Refused`])
//! into the call's.
//!
//! *Invariant:* this module sits below `agent` and `grants` (both take their refusals from here)
//! and imports neither, so the runner's modules stay a tree; a refusal's answer is
//! `{"error": reason}`, never more.

use axum::Json;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::executed::Refused as LedgerRefused;

/// A refusal: the status it answers with and the reason the caller reads.
pub(super) type Refused = (StatusCode, String);

/// The answer to a refused request: `status` with `{"error": message}`, logged at WARN.
pub(super) fn refuse(status: StatusCode, message: impl Into<String>) -> Response {
    let message = message.into();
    tracing::warn!(%status, %message, "call refused");
    (status, Json(json!({"error": message}))).into_response()
}

/// A refusal with 403: the call is well formed, and this runner will not run it.
pub(super) fn forbidden(why: String) -> Refused {
    (StatusCode::FORBIDDEN, why)
}

/// The bearer token of a request, if it carries one.
pub(super) fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
}

/// The ledger's refusal as the call's: a key used before is a conflict (409), anything else
/// forbidden (403).
pub(super) fn ledger_refusal(why: LedgerRefused) -> Refused {
    match why {
        LedgerRefused::Reused(why) => (StatusCode::CONFLICT, why),
        LedgerRefused::Forbidden(why) => forbidden(why),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reused_ledger_key_conflicts_and_any_other_ledger_refusal_is_forbidden() {
        assert_eq!(
            ledger_refusal(LedgerRefused::Reused("ran".into())),
            (StatusCode::CONFLICT, "ran".to_owned())
        );
        assert_eq!(
            ledger_refusal(LedgerRefused::Forbidden("no".into())),
            (StatusCode::FORBIDDEN, "no".to_owned())
        );
    }

    #[test]
    fn only_a_bearer_authorization_carries_a_token() {
        let mut headers = HeaderMap::new();
        assert_eq!(bearer(&headers), None);
        headers.insert(header::AUTHORIZATION, "Basic abc".parse().unwrap());
        assert_eq!(bearer(&headers), None);
        headers.insert(header::AUTHORIZATION, "Bearer abc".parse().unwrap());
        assert_eq!(bearer(&headers), Some("abc"));
    }
}
