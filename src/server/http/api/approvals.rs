//! The approvals API: `/api/approvals` (list, show, approve, deny, and people's decision on
//! a halted rollout: propose, vote) and `/api/events` (the approval changes as server-sent
//! events), which both the portal's page and
//! `emisar approvals` call. Behind `http::door::bearer_auth`, like all of `/api/*`.
//!
//! Invariants: an approval id from a path is checked to be a UUID before it reaches the
//! store; a denial's note is bounded text; every approval shown carries its tool's
//! description, the pack's reason when the tool has no preview, and the values each runner's
//! execution will use.

use axum::extract::{Path, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::{Value, json};

use crate::server::approvals::{State as ApprovalState, Verdict};
use crate::server::http::api::error::ApiError;
use crate::server::http::state::HttpState;
use crate::server::principal::Principal;

/// The longest note, in characters.
const MAX_NOTE_CHARS: usize = 2000;

/// An approval as people see it: the request plus its tool's description (and, for a write
/// without a preview, its pack's reason).
fn view(state: &HttpState, a: &crate::server::approvals::Approval) -> Value {
    let mut v = serde_json::to_value(a).expect("approvals are JSON");
    let tool = state.gateway.packs().tool(&a.tool);
    v["tool_description"] = json!(tool.map(|t| t.description.clone()));
    // A write without a preview says why, in its pack's words; the portal shows it where the
    // preview would be.
    v["no_preview_reason"] = json!(tool.and_then(|t| t.no_preview.clone()));
    // The request's own note under its old name, which meant two things next to the votes'
    // notes; kept for one release (docs/api.md, "Deprecated").
    v["note"] = v["outcome_note"].clone();
    // The values each runner's execution will use, which people approve along with the args.
    v["execution_vars"] = json!(a.execution_vars());
    // What people sign, when the request's runners check signatures: the text, its SHA-256
    // (what the portal shows), the WebAuthn challenge (the same hash, base64url) and the
    // arguments its `args` digest covers (secret params as commitments). A signer recomputes
    // every digest from what it shows and trusts none of these.
    v["statement"] = match &a.statement {
        Some(text) => {
            use base64::Engine;
            let hash = crate::protocol::approval::statement::hash_text(text);
            let args = state.gateway.signed_args(&a.id, &a.tool, &a.args);
            json!({
                "text": text,
                "sha256": hex::encode(hash),
                "challenge": base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(hash),
                "args": args.ok(),
            })
        }
        None => Value::Null,
    };
    // A decision on a halted rollout: its text, SHA-256 and WebAuthn challenge, as for the
    // statement; a signer recomputes them from the text.
    if let Some(d) = &a.decision {
        use base64::Engine;
        let hash = crate::protocol::approval::statement::hash_text(&d.text);
        v["decision"]["sha256"] = json!(hex::encode(hash));
        v["decision"]["challenge"] =
            json!(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(hash));
    }
    v
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListQuery {
    state: Option<String>,
    limit: Option<i64>,
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
    let wanted = match q.state.as_deref().map(ApprovalState::parse).transpose() {
        Ok(s) => s,
        Err(e) => return ApiError::bad_request(e).into_response(),
    };
    let limit = q.limit.unwrap_or(200);
    if !(1..=1000).contains(&limit) {
        return ApiError::bad_request("`limit` must be between 1 and 1000").into_response();
    }
    match state.gateway.approvals().list(wanted, None, limit).await {
        Ok(rows) => {
            let rows: Vec<Value> = rows.iter().map(|a| view(&state, a)).collect();
            Json(json!({"approvals": rows})).into_response()
        }
        Err(e) => ApiError::from(e).into_response(),
    }
}

/// An approval id from a path is checked before it reaches the store: every id this server
/// hands out is a UUID in its hyphenated lowercase form.
fn bad_id(id: &str) -> Option<Response> {
    let is_uuid = id.len() == 36
        && id.char_indices().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == '-',
            _ => matches!(c, '0'..='9' | 'a'..='f'),
        });
    (!is_uuid).then(|| {
        ApiError::bad_request(
            "`id` must be an approval id: a UUID such as 0b7e1c2a-5d4f-4e3b-9a8c-1f2e3d4c5b6a",
        )
        .into_response()
    })
}

pub(crate) async fn show(State(state): State<HttpState>, Path(id): Path<String>) -> Response {
    if let Some(refused) = bad_id(&id) {
        return refused;
    }
    match state.gateway.approvals().get(&id).await {
        Ok(a) => Json(view(&state, &a)).into_response(),
        Err(e) => ApiError::from(e).into_response(),
    }
}

#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct Decision {
    #[serde(default)]
    note: Option<String>,
    /// The person's signature over the request's statement (approve only).
    #[serde(default)]
    signature: Option<crate::protocol::approval::Signature>,
}

/// Which button the person pressed; a denial needs a note, an approval may keep one.
#[derive(Clone, Copy)]
enum Choice {
    Approve,
    Deny,
}

async fn decide(
    state: HttpState,
    who: Principal,
    id: String,
    body: Result<Json<Decision>, axum::extract::rejection::JsonRejection>,
    choice: Choice,
) -> Response {
    let (note, signature) = match body {
        Ok(Json(d)) => (d.note.unwrap_or_default(), d.signature),
        Err(e) => {
            return ApiError::bad_request(format!("invalid decision: {}", e.body_text()))
                .into_response();
        }
    };
    if let Some(refused) = bad_id(&id) {
        return refused;
    }
    if let Err(e) = crate::util::input::text("note", &note, MAX_NOTE_CHARS) {
        return ApiError::bad_request(e).into_response();
    }
    let verdict = match choice {
        Choice::Approve => Verdict::Approve {
            note: (!note.trim().is_empty()).then_some(note),
            signature,
            signed: None,
        },
        Choice::Deny if signature.is_some() => {
            return ApiError::bad_request("`signature`: a denial is not signed; send only a note")
                .into_response();
        }
        Choice::Deny => Verdict::Deny { note },
    };
    match state.gateway.decide(&who, &id, verdict).await {
        Ok(a) => Json(view(&state, &a)).into_response(),
        Err(e) => ApiError::from(e).into_response(),
    }
}

pub(crate) async fn approve(
    State(state): State<HttpState>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
    body: Result<Json<Decision>, axum::extract::rejection::JsonRejection>,
) -> Response {
    decide(state, who, id, body, Choice::Approve).await
}

pub(crate) async fn deny(
    State(state): State<HttpState>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
    body: Result<Json<Decision>, axum::extract::rejection::JsonRejection>,
) -> Response {
    decide(state, who, id, body, Choice::Deny).await
}

/// `GET /api/events`: every approval creation and state change, as server-sent events.
pub(crate) async fn events(State(state): State<HttpState>) -> Response {
    let changes = state.gateway.approvals().subscribe();
    let stream = futures::stream::unfold(changes, |mut rx| async move {
        let event = match rx.recv().await {
            Ok(changed) => Event::default()
                .event("approval")
                .json_data(&changed)
                .expect("changes are JSON"),
            // A slow reader missed some: tell it to refresh everything.
            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                Event::default().event("resync").data("{}")
            }
            Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
        };
        Some((Ok::<_, std::convert::Infallible>(event), rx))
    });
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// `POST /api/approvals/{id}/decision`: a person proposes what happens to a halted rollout.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Proposal {
    /// `resume`, `retry` or `abort`.
    choice: String,
}

pub(crate) async fn propose(
    State(state): State<HttpState>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
    body: Result<Json<Proposal>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let choice = match body {
        Ok(Json(p)) => p.choice,
        Err(e) => {
            return ApiError::bad_request(format!("invalid proposal: {}", e.body_text()))
                .into_response();
        }
    };
    if let Some(refused) = bad_id(&id) {
        return refused;
    }
    let choice = match crate::protocol::approval::Choice::parse(&choice) {
        Ok(c) => c,
        Err(e) => return ApiError::bad_request(e).into_response(),
    };
    match state.gateway.propose_decision(&who, &id, choice).await {
        Ok(a) => Json(view(&state, &a)).into_response(),
        Err(e) => ApiError::from(e).into_response(),
    }
}

/// `POST /api/approvals/{id}/decision/vote`: a person's vote for the pending decision they
/// read, signed where people sign.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DecisionVote {
    /// The id of the decision voted for (`decision.id`).
    decision_id: String,
    #[serde(default)]
    note: Option<String>,
    /// The person's signature over the decision's `text`.
    #[serde(default)]
    signature: Option<crate::protocol::approval::Signature>,
}

pub(crate) async fn vote(
    State(state): State<HttpState>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
    body: Result<Json<DecisionVote>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let vote = match body {
        Ok(Json(v)) => v,
        Err(e) => {
            return ApiError::bad_request(format!("invalid vote: {}", e.body_text()))
                .into_response();
        }
    };
    if let Some(refused) = bad_id(&id) {
        return refused;
    }
    if bad_id(&vote.decision_id).is_some() {
        return ApiError::bad_request("`decision_id` must be a decision id: a UUID")
            .into_response();
    }
    let note = vote.note.unwrap_or_default();
    if let Err(e) = crate::util::input::text("note", &note, MAX_NOTE_CHARS) {
        return ApiError::bad_request(e).into_response();
    }
    let verdict = Verdict::Approve {
        note: (!note.trim().is_empty()).then_some(note),
        signature: vote.signature,
        signed: None,
    };
    match state
        .gateway
        .vote_decision(&who, &id, &vote.decision_id, verdict)
        .await
    {
        Ok(a) => Json(view(&state, &a)).into_response(),
        Err(e) => ApiError::from(e).into_response(),
    }
}
