//! The break-glass API: `POST /api/break-glass` (people open a window: a grant flagged
//! `break_glass`, signed afterwards like any grant), `GET /api/break-glass` (the windows the
//! audit log shows, with their
//! state, calls, who opened and who reviewed; `?unreviewed=true` for those people still owe a
//! review), `/api/break-glass/{id}` (one window and the review being signed), and
//! `/api/break-glass/{id}/review` (a person's signature of the review). `emisar audit
//! break-glass`, `emisar break-glass review` and the portal call it.
//!
//! Invariants: the windows and their state come from the audit log (`server/break_glass/`),
//! a review event counting only when it verifies against the server's approvers file (a window
//! whose review event does not says why in `review_refused`);
//! only approvers and admins sign a review, with a signature the server verifies against its
//! approvers file before it stores it.

use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::json;

use crate::protocol::approval::Signature;
use crate::server::break_glass::{ReviewError, Reviews, Signer};
use crate::server::http::api::error::{ApiError, Code};
use crate::server::http::state::HttpState;
use crate::server::principal::{Principal, Role};

fn reviews(state: &HttpState) -> Reviews {
    Reviews::new(
        state.db.clone(),
        state.gateway.audit().clone(),
        state.gateway.approvers().cloned(),
    )
}

fn now_secs() -> u64 {
    chrono::Utc::now().timestamp().max(0) as u64
}

impl From<ReviewError> for ApiError {
    fn from(e: ReviewError) -> Self {
        let code = match &e {
            ReviewError::NotFound(_) => Code::NotFound,
            ReviewError::Refused(_) => Code::InvalidRequest,
            ReviewError::Conflict(_) => Code::Conflict,
            ReviewError::Store(_) | ReviewError::Audit(_) => {
                return ApiError::unavailable(
                    "a break-glass review failed",
                    &e,
                    "the store or the audit log is unavailable; nothing changed",
                );
            }
        };
        ApiError::new(code, e.to_string())
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListQuery {
    /// Only the windows people still owe a review.
    #[serde(default)]
    unreviewed: bool,
}

/// `GET /api/break-glass`.
pub(crate) async fn list(
    State(state): State<HttpState>,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let q = match query {
        Ok(Query(q)) => q,
        Err(e) => {
            return ApiError::bad_request(format!("invalid query: {}", e.body_text()))
                .into_response();
        }
    };
    match reviews(&state).windows(now_secs()).await {
        Ok(windows) => {
            let windows: Vec<_> = windows
                .into_iter()
                .filter(|w| !q.unreviewed || w.state.unreviewed())
                .collect();
            Json(json!({"windows": windows})).into_response()
        }
        Err(e) => ApiError::from(ReviewError::Store(e)).into_response(),
    }
}

/// `GET /api/break-glass/{id}`: the window and the review being signed, if any.
pub(crate) async fn show(State(state): State<HttpState>, Path(id): Path<String>) -> Response {
    let reviews = reviews(&state);
    let window = match reviews.window(&id, now_secs()).await {
        Ok(w) => w,
        Err(e) => return ApiError::from(e).into_response(),
    };
    match reviews.row(&id).await {
        Ok(row) => Json(json!({"window": window, "review": row})).into_response(),
        Err(e) => ApiError::from(ReviewError::Store(e)).into_response(),
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReviewSignature {
    /// The review's text (`emisar-review/v1`), as the signer built or read it.
    text: String,
    signature: Signature,
}

/// `POST /api/break-glass/{id}/review`: a person signs the review of a closed window.
pub(crate) async fn review(
    State(state): State<HttpState>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
    body: Result<Json<ReviewSignature>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let body = match body {
        Ok(Json(b)) => b,
        Err(e) => {
            return ApiError::unreadable_body(&e, format!("invalid review: {}", e.body_text()))
                .into_response();
        }
    };
    if !matches!(who.role, Role::Approver | Role::Admin) {
        return ApiError::new(
            Code::Forbidden,
            "only approvers and admins sign the review of a break-glass window",
        )
        .into_response();
    }
    if state.gateway.approvers().is_none() {
        return ApiError::new(
            Code::Conflict,
            "the server has no approvers_file: a break-glass review is signed by its people",
        )
        .into_response();
    }
    let signer = Signer {
        user: &who.name,
        actor: &who.actor(),
    };
    let signed = reviews(&state)
        .sign(&signer, &id, &body.text, body.signature, chrono::Utc::now())
        .await;
    match signed {
        Ok(row) => Json(json!({"review": row})).into_response(),
        Err(e) => ApiError::from(e).into_response(),
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Open {
    runners: Vec<String>,
    agent: String,
    ttl_secs: u64,
    reason: String,
}

/// `POST /api/break-glass`: an approver or admin opens a window; it runs nothing until enough
/// people signed it (`POST /api/grants/{id}/approve`).
pub(crate) async fn open(
    State(state): State<HttpState>,
    Extension(who): Extension<Principal>,
    body: Result<Json<Open>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let ask = match body {
        Ok(Json(b)) => crate::server::gateway::WindowAsk {
            runners: b.runners,
            agent: b.agent,
            ttl_secs: b.ttl_secs,
            reason: b.reason,
        },
        Err(e) => {
            return ApiError::unreadable_body(&e, format!("invalid window: {}", e.body_text()))
                .into_response();
        }
    };
    match state.gateway.open_break_glass(&who, ask).await {
        Ok(v) => Json(v).into_response(),
        Err(e) => ApiError::from(e).into_response(),
    }
}
