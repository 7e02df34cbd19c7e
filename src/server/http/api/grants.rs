//! The grants API: `/api/grants` (list, show, approve: a person's signature over the grant's
//! text, and revoke), which `emisar grants` calls. Behind `http::door::bearer_auth`, like all
//! of `/api/*`, so only people reach it (an agent reads its own grants with the
//! `emisar.grants` tool).
//!
//! Invariants: a grant id from a path is checked to be a UUID before it reaches the store;
//! an approval carries a signature, which the gateway verifies before it stores it; a
//! revocation carries a reason.

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::json;

use crate::server::grants::Status;
use crate::server::http::api::error::ApiError;
use crate::server::http::state::HttpState;
use crate::server::principal::Principal;

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListQuery {
    status: Option<String>,
}

pub(crate) async fn list(
    State(state): State<HttpState>,
    query: Result<axum::extract::Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let q = match query {
        Ok(axum::extract::Query(q)) => q,
        Err(e) => {
            return ApiError::bad_request(format!("invalid query: {}", e.body_text()))
                .into_response();
        }
    };
    let status = match q.status.as_deref().map(Status::parse).transpose() {
        Ok(s) => s,
        Err(e) => return ApiError::bad_request(e).into_response(),
    };
    let gateway = &state.gateway;
    let rows = match gateway.grants_of(None, status).await {
        Ok(rows) => rows,
        Err(e) => return ApiError::from(e).into_response(),
    };
    let mut grants = Vec::with_capacity(rows.len());
    for row in &rows {
        match gateway.grant_view(&row.id).await {
            Ok(v) => grants.push(v),
            Err(e) => return ApiError::from(e).into_response(),
        }
    }
    Json(json!({"grants": grants})).into_response()
}

/// A grant id from a path is checked before it reaches the store: a UUID in its hyphenated
/// lowercase form.
fn bad_id(id: &str) -> Option<Response> {
    let is_uuid = id.len() == 36
        && id.char_indices().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == '-',
            _ => matches!(c, '0'..='9' | 'a'..='f'),
        });
    (!is_uuid).then(|| {
        ApiError::bad_request(
            "`id` must be a grant id: a UUID such as 0193f4d0-5d4f-7e3b-9a8c-1f2e3d4c5b6a",
        )
        .into_response()
    })
}

pub(crate) async fn show(State(state): State<HttpState>, Path(id): Path<String>) -> Response {
    if let Some(refused) = bad_id(&id) {
        return refused;
    }
    match state.gateway.grant_view(&id).await {
        Ok(v) => Json(v).into_response(),
        Err(e) => ApiError::from(e).into_response(),
    }
}

/// A person's signature on a grant.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Approve {
    signature: crate::protocol::approval::Signature,
    #[serde(default)]
    note: Option<String>,
}

pub(crate) async fn approve(
    State(state): State<HttpState>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
    body: Result<Json<Approve>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let body = match body {
        Ok(Json(b)) => b,
        Err(e) => {
            return ApiError::bad_request(format!(
                "invalid approval: {} (a grant is approved with `signature`, a person's signature over its `text`)",
                e.body_text()
            ))
            .into_response();
        }
    };
    if let Some(refused) = bad_id(&id) {
        return refused;
    }
    if let Some(note) = &body.note
        && let Err(e) = crate::util::input::text("note", note, 2000)
    {
        return ApiError::bad_request(e).into_response();
    }
    match state
        .gateway
        .sign_grant(&who, &id, body.signature, body.note)
        .await
    {
        Ok(v) => Json(v).into_response(),
        Err(e) => ApiError::from(e).into_response(),
    }
}

/// Why a grant is revoked.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Revoke {
    reason: String,
}

pub(crate) async fn revoke(
    State(state): State<HttpState>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
    body: Result<Json<Revoke>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let body = match body {
        Ok(Json(b)) => b,
        Err(e) => {
            return ApiError::bad_request(format!(
                "invalid revocation: {} (it needs `reason`)",
                e.body_text()
            ))
            .into_response();
        }
    };
    if let Some(refused) = bad_id(&id) {
        return refused;
    }
    match state.gateway.revoke_grant(&who, &id, &body.reason).await {
        Ok(v) => Json(v).into_response(),
        Err(e) => ApiError::from(e).into_response(),
    }
}
