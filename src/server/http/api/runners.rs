//! The runners' side of the API: `GET /api/runners` (the runners a caller may see, behind
//! the door) and the enrolment a runner makes itself with its own credential, outside the
//! door: `POST /api/runners/join` (a join token), `/register` and `/heartbeat` (the
//! runner's credential).
//!
//! Invariant: a runner's credential or join token is read only from `Authorization:
//! Bearer …`, and the fleet (`server::fleet`) decides what it may do.

use axum::Json;
use axum::extract::State;
use axum::http::header;

use crate::server::http::api::error::ApiError;
use crate::server::http::state::HttpState;
use crate::server::principal::Principal;

/// `GET /api/runners`' answer.
#[derive(serde::Serialize)]
pub(crate) struct RunnerList {
    runners: Vec<crate::server::gateway::RunnerStatus>,
}

/// `GET /api/runners`: the runners the caller may see. A token limited to a selector sees
/// only the runners it matches, as in `emisar.runners` and everywhere else. Serialized
/// straight from the statuses, not through a `serde_json::Value` (a tree with an allocation
/// for every field of every runner).
pub(crate) async fn list(
    State(state): State<HttpState>,
    axum::Extension(principal): axum::Extension<Principal>,
) -> Json<RunnerList> {
    Json(RunnerList {
        runners: state.gateway.runners_visible_to(&principal),
    })
}

/// The bearer token of a request, when it has one.
pub(crate) fn bearer(headers: &axum::http::HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
}

fn no_bearer(what: &str) -> ApiError {
    crate::server::fleet::FleetError::Unauthorized(format!(
        "{what} is required as `Authorization: Bearer …`"
    ))
    .into()
}

/// `POST /api/runners/join` with a join token's secret: registers a new runner. Attempts
/// are limited per client address (counted as the login limits count it, trusted proxies
/// included) before the store is asked: past the limit, 429.
pub(crate) async fn join(
    State(state): State<HttpState>,
    // Absent when the router is driven without a socket (in-process tests).
    connect: Option<axum::Extension<axum::extract::ConnectInfo<std::net::SocketAddr>>>,
    headers: axum::http::HeaderMap,
    body: Result<Json<crate::protocol::JoinRequest>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<crate::protocol::JoinResponse>, ApiError> {
    let token = bearer(&headers).ok_or_else(|| no_bearer("a join token"))?;
    let Json(request) = body.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let client = state.logins.client(connect.map(|c| (c.0).0), &headers);
    Ok(Json(state.fleet.join(client, token, request).await?))
}

/// `POST /api/runners/register` with a runner token: a runner that joined before is back.
pub(crate) async fn register(
    State(state): State<HttpState>,
    headers: axum::http::HeaderMap,
    body: Result<Json<crate::protocol::RegisterRequest>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<crate::protocol::RegisterResponse>, ApiError> {
    let token = bearer(&headers).ok_or_else(|| no_bearer("the runner's credential"))?;
    let Json(request) = body.map_err(|e| ApiError::bad_request(e.body_text()))?;
    Ok(Json(state.fleet.register(token, request).await?))
}

/// `POST /api/runners/heartbeat` with a runner token: the runner's name, and the interval
/// it is to keep.
pub(crate) async fn heartbeat(
    State(state): State<HttpState>,
    headers: axum::http::HeaderMap,
) -> Result<Json<crate::protocol::HeartbeatResponse>, ApiError> {
    let token = bearer(&headers).ok_or_else(|| no_bearer("the runner's credential"))?;
    Ok(Json(state.fleet.heartbeat(token).await?))
}
