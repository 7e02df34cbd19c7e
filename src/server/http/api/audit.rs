//! The audit API: `GET /api/audit` (one page of events and the cursor of the next),
//! `GET /api/audit/export` (every matching event as NDJSON), and the transparency log's
//! `GET /api/audit/checkpoint` (the newest signed checkpoint with its cosignatures),
//! `GET /api/audit/proof?event=ID` (an event's inclusion proof) and
//! `GET /api/audit/consistency?old=N` (the consistency proof from a kept size to the newest
//! checkpoint), and `GET /api/audit/activity` (events, calls, refusals and approvals per
//! time bucket, counted by the store). Behind `http::door::bearer_auth`, like all of `/api/*`.
//!
//! Invariants: the query string is parsed into the shared `audit::AuditFilter`, and a bad
//! one is a 400 naming the problem; an export is streamed and holds one page of events in
//! memory, however many match; a store failure is answered with a fixed sentence, never its
//! cause.

use axum::Json;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::server::http::api::error::{ApiError, Code};
use crate::server::http::state::HttpState;

/// The query string of `GET /api/audit`: the shared audit params.
pub(crate) type AuditQuery = crate::server::audit::AuditParams;

/// The longest page the API returns.
const MAX_PAGE: i64 = crate::server::audit::MAX_PAGE;

type AuditQueryResult =
    Result<axum::extract::Query<AuditQuery>, axum::extract::rejection::QueryRejection>;

/// `GET /api/audit`: one page of the events the filters match.
pub(crate) async fn page(State(state): State<HttpState>, query: AuditQueryResult) -> Response {
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

/// `GET /api/audit/export`: every event the filters match, one JSON object per line, oldest
/// first. The answer is streamed a page at a time (`MAX_PAGE` events, each page its own
/// query after the last seq sent), so the server holds one page however many events match
/// and holds no store connection between pages. The first page is read before the answer
/// starts, so a store that is down is a 503; a store that fails later cuts the answer off
/// (the client sees a transfer error, never a short export that looks complete).
pub(crate) async fn export(State(state): State<HttpState>, query: AuditQueryResult) -> Response {
    let mut filter = match audit_filter(query, MAX_PAGE) {
        Ok(f) => f,
        Err(e) => return ApiError::bad_request(e).into_response(),
    };
    filter.limit = MAX_PAGE;
    let first = match crate::server::audit::query(&state.db, &filter).await {
        Ok(events) => events,
        Err(e) => return audit_unavailable(e),
    };
    let pages = futures::stream::try_unfold(
        (state.db.clone(), filter, Next::Page(first)),
        |(db, mut filter, next)| async move {
            let events = match next {
                Next::Done => return Ok(None),
                Next::Page(events) => events,
                Next::Query => crate::server::audit::query(&db, &filter)
                    .await
                    .map_err(|e| {
                        tracing::error!(error = %e, "audit export failed after it started");
                        std::io::Error::other("the audit store failed during the export")
                    })?,
            };
            let Some(last) = events.last() else {
                return Ok(None);
            };
            filter.after_seq = Some(last.seq);
            let next = if events.len() as i64 == MAX_PAGE {
                Next::Query
            } else {
                Next::Done
            };
            let mut chunk = String::new();
            for e in &events {
                chunk.push_str(&serde_json::to_string(e).expect("events are JSON"));
                chunk.push('\n');
            }
            Ok::<_, std::io::Error>(Some((chunk, (db, filter, next))))
        },
    );
    (
        [
            (header::CONTENT_TYPE, "application/x-ndjson"),
            (
                header::CONTENT_DISPOSITION,
                "attachment; filename=\"emisar-audit.ndjson\"",
            ),
        ],
        axum::body::Body::from_stream(pages),
    )
        .into_response()
}

/// What an export sends next: a page already read, the page after the last one sent, or
/// nothing (the last page was short).
enum Next {
    Page(Vec<crate::server::audit::Event>),
    Query,
    Done,
}

/// The query string of `GET /api/audit/activity`.
pub(crate) type ActivityQuery = crate::server::audit::activity::ActivityParams;

/// `GET /api/audit/activity?buckets=N&bucket_seconds=S`: the counts per bucket of the last
/// `N × S` seconds, or a 400 naming the parameter and its bound.
pub(crate) async fn activity(
    State(state): State<HttpState>,
    query: Result<axum::extract::Query<ActivityQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    use crate::server::audit::activity;
    let window = match query {
        Ok(axum::extract::Query(q)) => activity::Window::from_params(&q, chrono::Utc::now()),
        Err(e) => Err(format!("invalid query: {}", e.body_text())),
    };
    let window = match window {
        Ok(w) => w,
        Err(e) => return ApiError::bad_request(e).into_response(),
    };
    match activity::activity(&state.db, window).await {
        Ok(counts) => Json(counts).into_response(),
        Err(e) => audit_unavailable(e),
    }
}

/// `?cosigned_by=N`: the newest checkpoint with at least N cosignatures.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CheckpointQuery {
    #[serde(default)]
    cosigned_by: usize,
}

/// `GET /api/audit/checkpoint`: the newest signed checkpoint and its cosignatures, as the
/// signed note (text/plain), the file an auditor keeps.
pub(crate) async fn checkpoint(
    State(state): State<HttpState>,
    axum::extract::Query(q): axum::extract::Query<CheckpointQuery>,
) -> Response {
    match crate::server::audit::checkpoints::latest(&state.db, q.cosigned_by).await {
        Ok(Some(cp)) => (
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            cp.cosigned(),
        )
            .into_response(),
        Ok(None) => ApiError::new(
            Code::NotFound,
            format!(
                "no checkpoint with {} cosignatures yet: is [transparency] set in emisar.toml?",
                q.cosigned_by
            ),
        )
        .into_response(),
        Err(e) => audit_unavailable(e),
    }
}

/// `?event=ID[&cosigned_by=N]`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ProofQuery {
    event: String,
    #[serde(default)]
    cosigned_by: usize,
}

/// `GET /api/audit/proof?event=ID`: the event, its leaf and audit path in the newest
/// checkpoint that covers it (JSON, as `emisar audit prove` prints it).
pub(crate) async fn proof(
    State(state): State<HttpState>,
    axum::extract::Query(q): axum::extract::Query<ProofQuery>,
) -> Response {
    match crate::server::audit::proofs::prove(&state.db, &q.event, q.cosigned_by).await {
        Ok(p) => Json(p).into_response(),
        Err(e) if e.downcast_ref::<sqlx::Error>().is_some() => audit_unavailable(e),
        Err(e) => ApiError::new(Code::NotFound, e.to_string()).into_response(),
    }
}

/// `?old=N`: the size of the checkpoint the caller kept.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ConsistencyQuery {
    old: u64,
}

/// `GET /api/audit/consistency?old=N`: the newest checkpoint and the consistency proof from
/// the tree of `old` events to it (base64 hashes, RFC 9162 §2.1.4.1).
pub(crate) async fn consistency(
    State(state): State<HttpState>,
    axum::extract::Query(q): axum::extract::Query<ConsistencyQuery>,
) -> Response {
    let latest = match crate::server::audit::checkpoints::latest(&state.db, 0).await {
        Ok(Some(cp)) => cp,
        Ok(None) => {
            return ApiError::new(Code::NotFound, "no checkpoint yet").into_response();
        }
        Err(e) => return audit_unavailable(e),
    };
    if q.old > latest.size {
        return ApiError::bad_request(format!(
            "`old`: {} is larger than the newest checkpoint's size {}",
            q.old, latest.size
        ))
        .into_response();
    }
    match crate::server::audit::tree::consistency_proof(&state.db, q.old, latest.size).await {
        Ok(proof) => {
            use base64::Engine;
            let proof: Vec<String> = proof
                .iter()
                .map(|h| base64::engine::general_purpose::STANDARD.encode(h.0))
                .collect();
            Json(json!({
                "old": q.old,
                "new": latest.size,
                "checkpoint": latest.cosigned(),
                "proof": proof,
            }))
            .into_response()
        }
        Err(e) => audit_unavailable(e),
    }
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
