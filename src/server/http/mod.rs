//! The server's HTTP surface, one router and the rooms behind it:
//!
//! - the door (`door`): `/mcp`, the `/api/*` operations the document puts behind it and
//!   `/metrics` pass `door::bearer_auth` first (who is calling, CSRF, role, MCP session
//!   ownership);
//! - MCP (`mcp`): the rmcp adapter at `/mcp`, over the gateway;
//! - the API (`api`): every path under `/api`, mounted from the OpenAPI document's
//!   operations (`api::routes`), its one error type `api::error::ApiError`;
//! - the portal (`portal`): the page and assets at `/` and `/assets/*` (from `web/`,
//!   embedded), and with `[oidc]` the sign-in routes under `/login/oidc` (`portal::oidc`);
//! - what they all share (`state`: `HttpState`, and the MCP sessions' bindings to tokens).
//!
//! Here: the router itself, `/healthz` and `/readyz` for probes, `/metrics`, and with
//! `[oauth]` the protected-resource metadata, served unauthenticated at
//! `/.well-known/oauth-protected-resource` and its path-suffixed form (a 401 from `/mcp`
//! points to it). Every request first passes the DNS-rebinding check (`rebinding`: `Host` on
//! every route, `Origin` on `/mcp`), whose refusal is answered here (`refuse_rebinding`).
//!
//! Callers authenticate with a bearer token (agents, and people who live in a terminal) or
//! with the portal's session cookie. Each role reaches only its paths: agents `/mcp` and
//! `/api/runners`; people every `/api/*` path but never `/mcp`; auditors and admins
//! `/metrics` (Prometheus scrapes with an auditor's token); a person the OpenID provider
//! signed in with no role only `/api/session` and `/api/logout`. With `[oauth]`, a bearer
//! token that is not emisar's own (`emt_…`) is an OAuth access token (`oidc::bearer`).
//!
//! Invariants: the rooms share `state` and never import the router (this file); the router
//! imports their handlers, never the other way round. Every response carries a strict
//! Content-Security-Policy; the portal inserts all data as text, never as HTML. The door's and
//! the rebinding check's refusals are `ApiError`s with their codes, as the API's are (but
//! with `[oauth]`, a missing or refused credential on `/mcp` is answered by `oidc::bearer`,
//! with the OAuth challenge and no code). The door's own invariants (MCP sessions, CSRF) are
//! in `door`.

pub mod api;
mod door;
pub mod mcp;
pub mod portal;
pub mod state;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::server::db::Db;
use crate::server::gateway::Gateway;
use crate::server::http::api::error::{ApiError, Code};
use crate::server::http::mcp::GatewaySource;
use crate::server::http::state::HttpState;
use crate::server::oidc::identity::Identity;

/// How long a readiness check may wait for the store.
const READY_TIMEOUT: Duration = Duration::from_secs(2);

/// How often idle login buckets are forgotten.
const LOGIN_SWEEP: Duration = Duration::from_secs(60);

/// The router. Serve it with `into_make_service_with_connect_info::<SocketAddr>()`: login
/// limits count attempts per client address. Must be called within a tokio runtime (it
/// starts the login limits' sweeper, which stops with `shutdown`).
// Each argument is a separate piece the composition root built; a struct would only
// rename them.
#[allow(clippy::too_many_arguments)]
pub(crate) fn router(
    gateway: Arc<Gateway>,
    db: Db,
    server_public_key: String,
    allowed_hosts: Vec<String>,
    allowed_origins: Vec<String>,
    secure_cookies: bool,
    login: &crate::server::login_limits::LoginLimitsConfig,
    joins_per_minute: u32,
    identity: Arc<Identity>,
    webauthn: Result<crate::protocol::approval::webauthn::RelyingParty, String>,
    shutdown: CancellationToken,
) -> Router {
    let logins = Arc::new(
        crate::server::login_limits::LoginLimits::new(login).shared_through(&db, login, &shutdown),
    );
    logins.spawn_sweeper(LOGIN_SWEEP, shutdown.clone());
    let rebinding = Arc::new(crate::server::rebinding::Allowed::new(
        &allowed_hosts,
        &allowed_origins,
    ));
    let mcp_sessions = crate::server::http::mcp::sessions();
    let mcp = crate::server::http::mcp::service_with_sessions(
        Arc::new(GatewaySource(gateway.clone())),
        allowed_hosts,
        shutdown,
        mcp_sessions.clone(),
    );
    let fleet = Arc::new(crate::server::fleet::Fleet::new(
        db.clone(),
        gateway.audit().clone(),
        gateway.runners().clone(),
        server_public_key,
        joins_per_minute,
    ));
    let state = HttpState::new(
        db,
        logins,
        secure_cookies,
        gateway,
        identity.clone(),
        fleet,
        mcp_sessions,
        webauthn,
    );
    // Every path under /api, mounted from the OpenAPI document (`api::routes`).
    let (api_open, api_door) = crate::server::http::api::routes();
    let protected = Router::new()
        .nest_service(
            "/mcp",
            Router::new()
                .fallback_service(mcp)
                .layer(axum::middleware::from_fn(
                    crate::server::http::mcp::coalesce_sse,
                )),
        )
        .route("/metrics", get(metrics))
        .merge(api_door)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            door::bearer_auth,
        ));
    let mut public = Router::new()
        .merge(api_open)
        .route(
            crate::server::http::portal::oidc::START_PATH,
            get(crate::server::http::portal::oidc::start),
        )
        .route(
            crate::server::http::portal::oidc::CALLBACK,
            get(crate::server::http::portal::oidc::callback),
        )
        .route(
            crate::server::http::portal::oidc::BACKCHANNEL_LOGOUT_PATH,
            axum::routing::post(crate::server::http::portal::oidc::backchannel_logout),
        );
    if let Some(agents) = &identity.agents {
        // RFC 9728 §3.1: the path-suffixed form for `/mcp` is where MCP clients look first;
        // the root form serves clients that try it when the challenge names no document.
        let suffixed = crate::server::oidc::resource::metadata_path(&agents.config.resource);
        let root = "/.well-known/oauth-protected-resource";
        for path in std::iter::once(root).chain((suffixed != root).then_some(suffixed.as_str())) {
            public = public.route(path, get(protected_resource_metadata));
        }
    }
    Router::new()
        .merge(public)
        .route("/", get(crate::server::http::portal::index))
        .route("/assets/{file}", get(crate::server::http::portal::asset))
        .route("/healthz", get(|| async { Json(json!({"status": "ok"})) }))
        .route("/readyz", get(readyz))
        .merge(protected)
        .fallback(crate::server::http::portal::not_found)
        .layer(axum::middleware::from_fn_with_state(
            rebinding,
            refuse_rebinding,
        ))
        .layer(axum::middleware::from_fn(
            crate::server::http::portal::security_headers,
        ))
        .with_state(state)
}

/// In front of every route: refuses a request whose `Host` or `Origin` is not this server's
/// (`rebinding`), before any handler or the door.
async fn refuse_rebinding(
    State(allowed): State<Arc<crate::server::rebinding::Allowed>>,
    req: Request,
    next: Next,
) -> Response {
    use crate::server::rebinding::Refusal;
    if let Err(refusal) = allowed.check(req.uri(), req.headers()) {
        tracing::warn!(
            path = %req.uri().path(),
            "refused a request whose Host or Origin is not this server's (possible DNS rebinding)"
        );
        let (code, why) = match refusal {
            Refusal::Host(why) => (Code::HostNotAllowed, why),
            Refusal::Origin(why) => (Code::OriginNotAllowed, why),
        };
        return ApiError::new(code, why).into_response();
    }
    next.run(req).await
}

/// `GET /.well-known/oauth-protected-resource[/…]` (only with `[oauth]`).
async fn protected_resource_metadata(State(state): State<HttpState>) -> Response {
    match &state.identity.agents {
        Some(agents) => agents.metadata(),
        None => crate::server::http::portal::not_found().await,
    }
}

/// Ready when the store answers and the audit writer is writing; otherwise 503 with reasons.
async fn readyz(State(state): State<HttpState>) -> Response {
    let problems = readiness_problems(&state).await;
    if problems.is_empty() {
        Json(json!({"status": "ready"})).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "degraded", "problems": problems})),
        )
            .into_response()
    }
}

/// Why this server is not ready: the store does not answer within [`READY_TIMEOUT`], or the
/// audit writer's last batch failed. Empty when it is ready.
async fn readiness_problems(state: &HttpState) -> Vec<String> {
    let mut problems = Vec::new();
    let ping = tokio::time::timeout(
        READY_TIMEOUT,
        state
            .db
            .guard(async { crate::with_pool!(&state.db, pool => sqlx::query("SELECT 1").execute(pool).await.map(|_| ())) }),
    )
    .await;
    match ping {
        Ok(Ok(())) => {}
        Ok(Err(e)) => problems.push(format!("store: {e}")),
        Err(_) => problems.push(format!(
            "store: no answer within {} s",
            READY_TIMEOUT.as_secs()
        )),
    }
    if let Some(p) = state.gateway.audit().problem() {
        problems.push(format!("audit: {p}"));
    }
    problems
}

/// The recorder's series, then this server's own: `emisar_ready` from the same check as
/// `/readyz`, and the approval backlog counted in the store.
async fn metrics(State(state): State<HttpState>) -> Response {
    let (problems, approvals_pending) =
        tokio::join!(readiness_problems(&state), approval_backlog(&state));
    let scraped = crate::server::metrics::Scraped {
        ready: problems.is_empty(),
        approvals_pending,
    };
    let handle = crate::server::metrics::handle();
    handle.run_upkeep();
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        crate::server::metrics::with_scraped(handle.render(), &scraped),
    )
        .into_response()
}

/// Requests waiting for people now, or `None` when the store does not answer within
/// [`READY_TIMEOUT`] (`emisar_ready` then says so).
async fn approval_backlog(state: &HttpState) -> Option<u64> {
    let count = state.gateway.approvals().backlog(chrono::Utc::now());
    match tokio::time::timeout(READY_TIMEOUT, count).await {
        Ok(Ok(n)) => Some(n),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "could not count the approval backlog for /metrics");
            None
        }
        Err(_) => None,
    }
}
