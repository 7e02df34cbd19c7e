//! The server's HTTP surface: `/mcp` behind bearer auth, and `/healthz`.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::db::Db;
use crate::gateway::Gateway;
use crate::mcp::EmisarMcp;

#[derive(Clone)]
pub struct HttpState {
    pub db: Db,
}

pub fn router(
    gateway: Arc<Gateway>,
    db: Db,
    allowed_hosts: Vec<String>,
    shutdown: CancellationToken,
) -> Router {
    let mut sessions = LocalSessionManager::default();
    // Long enough for a slow fan-out; sessions idle longer than this are reaped.
    sessions.session_config.keep_alive = Some(Duration::from_secs(3600));
    let config = StreamableHttpServerConfig::default()
        .with_allowed_hosts(allowed_hosts)
        .with_cancellation_token(shutdown.child_token());
    let handler = EmisarMcp::new(gateway);
    let mcp: StreamableHttpService<EmisarMcp, LocalSessionManager> =
        StreamableHttpService::new(move || Ok(handler.clone()), Arc::new(sessions), config);
    let state = HttpState { db };
    let protected =
        Router::new()
            .nest_service("/mcp", mcp)
            .layer(axum::middleware::from_fn_with_state(
                state.clone(),
                bearer_auth,
            ));
    Router::new()
        .route("/healthz", get(|| async { Json(json!({"status": "ok"})) }))
        .merge(protected)
        .with_state(state)
}

/// Authenticates the agent's bearer token and attaches its [`Principal`](crate::tokens::Principal).
async fn bearer_auth(State(state): State<HttpState>, mut req: Request, next: Next) -> Response {
    let unauthorized = |message: &'static str| {
        (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            Json(json!({"error": message})),
        )
            .into_response()
    };
    let Some(token) = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    else {
        return unauthorized("an agent bearer token is required");
    };
    match crate::tokens::authenticate(&state.db, token).await {
        Ok(Some(principal)) => {
            req.extensions_mut().insert(principal);
            next.run(req).await
        }
        Ok(None) => unauthorized("the bearer token is unknown, expired or revoked"),
        Err(e) => {
            tracing::error!(error = %e, "token lookup failed");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(json!({"error": "the token store is unavailable"})),
            )
                .into_response()
        }
    }
}
