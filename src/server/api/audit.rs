//! The audit API: `GET /api/audit` (one page of events and the cursor of the next) and
//! `GET /api/audit/export` (every matching event as NDJSON). Behind `http::bearer_auth`,
//! like all of `/api/*`.
//!
//! Invariants: the query string is parsed into the shared `audit::AuditFilter`, and a bad
//! one is a 400 naming the problem; an export holds at most `MAX_EXPORT` events; a store
//! failure is answered with a fixed sentence, never its cause.

use axum::Json;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::server::api_error::ApiError;
use crate::server::http_state::HttpState;

/// The query string of `GET /api/audit`: the shared audit params.
pub type AuditQuery = crate::server::audit::AuditParams;

/// The longest page the API returns.
const MAX_PAGE: i64 = crate::server::audit::MAX_PAGE;

type AuditQueryResult =
    Result<axum::extract::Query<AuditQuery>, axum::extract::rejection::QueryRejection>;

/// `GET /api/audit`: one page of the events the filters match.
pub async fn page(State(state): State<HttpState>, query: AuditQueryResult) -> Response {
    let filter = match audit_filter(query, 100) {
        Ok(f) => f,
        Err(e) => return ApiError::bad_request(e).into_response(),
    };
    let limit = filter.limit;
    match crate::server::audit::query(&state.db, &filter).await {
        Ok(events) => {
            let next_cursor = (events.len() as i64 == limit)
                .then(|| events.last().map(|e| e.seq.to_string()))
                .flatten();
            Json(json!({"events": events, "next_cursor": next_cursor})).into_response()
        }
        Err(e) => audit_unavailable(e),
    }
}

/// The most events one export holds; narrow the filters for more.
const MAX_EXPORT: usize = 100_000;

/// `GET /api/audit/export`: every event the filters match, one JSON object per line.
pub async fn export(State(state): State<HttpState>, query: AuditQueryResult) -> Response {
    let mut filter = match audit_filter(query, MAX_PAGE) {
        Ok(f) => f,
        Err(e) => return ApiError::bad_request(e).into_response(),
    };
    filter.limit = MAX_PAGE;
    let mut out = String::new();
    let mut count = 0;
    loop {
        let events = match crate::server::audit::query(&state.db, &filter).await {
            Ok(events) => events,
            Err(e) => return audit_unavailable(e),
        };
        let Some(last) = events.last() else { break };
        filter.after_seq = Some(last.seq);
        let full = events.len() as i64 == MAX_PAGE;
        for e in &events {
            out.push_str(&serde_json::to_string(e).expect("events are JSON"));
            out.push('\n');
        }
        count += events.len();
        if !full {
            break;
        }
        if count >= MAX_EXPORT {
            return ApiError::bad_request(format!(
                "more than {MAX_EXPORT} events match: narrow the filters (since/until, kind, tool)"
            ))
            .into_response();
        }
    }
    (
        [
            (header::CONTENT_TYPE, "application/x-ndjson"),
            (
                header::CONTENT_DISPOSITION,
                "attachment; filename=\"emisar-audit.ndjson\"",
            ),
        ],
        out,
    )
        .into_response()
}

fn audit_unavailable(e: impl std::fmt::Display) -> Response {
    ApiError::unavailable("audit query failed", &e, "the audit store is unavailable")
        .into_response()
}

/// The filter a `GET /api/audit` query string asks for, or the 400 that says what is wrong.
fn audit_filter(
    query: AuditQueryResult,
    default_limit: i64,
) -> Result<crate::server::audit::AuditFilter, String> {
    match query {
        Ok(axum::extract::Query(q)) => {
            crate::server::audit::AuditFilter::from_params(q, default_limit)
        }
        Err(e) => Err(format!("invalid query: {}", e.body_text())),
    }
}
