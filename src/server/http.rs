//! The server's HTTP surface: `/mcp`, `/api/*` (mounted from `api::routes`, the OpenAPI
//! document's operations) and `/metrics` behind auth; the portal (`/`,
//! `/assets/*`, from `web/`, embedded); `/healthz` and `/readyz` for probes. Every request
//! first passes the DNS-rebinding door (`rebinding`: `Host` on every route, `Origin` on
//! `/mcp`).
//!
//! Callers authenticate with a bearer token (agents, and people who live in a terminal) or
//! with the portal's session cookie. Each role reaches only its paths: agents `/mcp` and
//! `/api/runners`; people every `/api/*` path but never `/mcp`; auditors and admins
//! `/metrics` (Prometheus scrapes with an auditor's token); a person the OpenID provider
//! signed in with no role only `/api/session` and `/api/logout`. With `[oauth]`, a bearer
//! token that is not emisar's own (`emt_…`) is an OAuth access token (`oidc::bearer`), and a
//! 401 from `/mcp` points to the protected-resource metadata, served unauthenticated at
//! `/.well-known/oauth-protected-resource` and its path-suffixed form. With `[oidc]`, the
//! portal's sign-in routes live under `/login/oidc` (`portal_oidc`).
//!
//! Invariants: an MCP session belongs to the token that opened it, and only the server opens
//! one; the same session id presented with another token, or an id the server never
//! issued, is answered 404, as if it did not exist (rmcp routes on the session id alone). A request authenticated by cookie changes nothing unless it carries
//! the session's CSRF token in `X-CSRF-Token`. Every response carries a strict
//! Content-Security-Policy; the portal inserts all data as text, never as HTML.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::server::api_error::ApiError;
use crate::server::db::Db;
use crate::server::gateway::Gateway;
use crate::server::http_state::{HttpState, Owner};
use crate::server::mcp::GatewaySource;
use crate::server::oidc::identity::Identity;
use crate::server::principal::{Principal, Role};

/// The longest MCP session id accepted (the ones this server issues are UUIDs).
const MAX_SESSION_ID: usize = 128;
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
pub fn router(
    gateway: Arc<Gateway>,
    db: Db,
    server_public_key: String,
    allowed_hosts: Vec<String>,
    allowed_origins: Vec<String>,
    secure_cookies: bool,
    login: &crate::server::login_limits::LoginLimitsConfig,
    identity: Arc<Identity>,
    webauthn: Result<crate::protocol::approval::webauthn::RelyingParty, String>,
    shutdown: CancellationToken,
) -> Router {
    let logins = Arc::new(crate::server::login_limits::LoginLimits::new(login));
    logins.spawn_sweeper(LOGIN_SWEEP, shutdown.clone());
    let rebinding = Arc::new(crate::server::rebinding::Allowed::new(
        &allowed_hosts,
        &allowed_origins,
    ));
    let mcp_sessions = crate::server::mcp::sessions();
    let mcp = crate::server::mcp::service_with_sessions(
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
    let (api_open, api_door) = crate::server::api::routes();
    let protected = Router::new()
        .nest_service("/mcp", mcp)
        .route("/metrics", get(metrics))
        .merge(api_door)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            bearer_auth,
        ));
    let mut public = Router::new()
        .merge(api_open)
        .route(
            crate::server::portal_oidc::START_PATH,
            get(crate::server::portal_oidc::start),
        )
        .route(
            crate::server::portal_oidc::CALLBACK,
            get(crate::server::portal_oidc::callback),
        )
        .route(
            crate::server::portal_oidc::BACKCHANNEL_LOGOUT_PATH,
            axum::routing::post(crate::server::portal_oidc::backchannel_logout),
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
        .route("/", get(crate::server::portal::index))
        .route("/assets/{file}", get(crate::server::portal::asset))
        .route("/healthz", get(|| async { Json(json!({"status": "ok"})) }))
        .route("/readyz", get(readyz))
        .merge(protected)
        .fallback(crate::server::portal::not_found)
        .layer(axum::middleware::from_fn_with_state(
            rebinding,
            crate::server::rebinding::check,
        ))
        .layer(axum::middleware::from_fn(
            crate::server::portal::security_headers,
        ))
        .with_state(state)
}

/// `GET /.well-known/oauth-protected-resource[/…]` (only with `[oauth]`).
async fn protected_resource_metadata(State(state): State<HttpState>) -> Response {
    match &state.identity.agents {
        Some(agents) => agents.metadata(),
        None => crate::server::portal::not_found().await,
    }
}

/// The door of `/mcp` and `/api/*`, one step a function: who is calling
/// ([`authenticate`]), whether a cookie's change carries its CSRF token ([`check_csrf`]),
/// whether the caller's role may use the path ([`check_role`]), and whether the MCP session
/// is the caller's own ([`check_mcp_session`], [`remember_mcp_session`]).
async fn bearer_auth(State(state): State<HttpState>, mut req: Request, next: Next) -> Response {
    let principal = match authenticate(&state, &mut req).await {
        Ok(principal) => principal,
        Err(refusal) => return refusal,
    };
    if let Err(refusal) = check_csrf(&req) {
        return refusal.into_response();
    }
    if let Err(refusal) = check_role(&principal, req.uri().path()) {
        return refusal.into_response();
    }
    let session = match check_mcp_session(&state, &req, &principal) {
        Ok(session) => session,
        Err(refusal) => return refusal.into_response(),
    };
    let closing = req.method() == Method::DELETE;
    let opening = session.is_none() && req.uri().path().starts_with("/mcp");
    if opening && req.method() == Method::POST && !state.sessions.has_room() {
        return ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "too many MCP sessions are open on this server: try again later",
        )
        .into_response();
    }
    req.extensions_mut().insert(principal.clone());
    let response = next.run(req).await;
    remember_mcp_session(
        &state,
        &response,
        &principal,
        opening,
        session.filter(|_| closing),
    );
    response
}

/// Who the request comes from: its bearer token (emisar's own, or with `[oauth]` an OAuth
/// access token) or its portal session cookie, whose [`Session`](crate::server::users::Session)
/// is attached to the request. The refusal is a whole response: with `[oauth]`, a 401 from
/// `/mcp` says where an MCP client can get a token.
async fn authenticate(state: &HttpState, req: &mut Request) -> Result<Principal, Response> {
    let oauth_challenge = req.uri().path().starts_with("/mcp");
    let unauthorized = |message: &'static str| match &state.identity.agents {
        Some(agents) if oauth_challenge => agents.unauthorized(message),
        _ => (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            Json(json!({"error": message})),
        )
            .into_response(),
    };
    let unavailable = |e: &dyn std::fmt::Display| {
        let why = state
            .db
            .outage()
            .unwrap_or_else(|| "the token store is unavailable".into());
        ApiError::unavailable("credential lookup failed", e, why).into_response()
    };
    match (
        crate::server::api::runners::bearer(req.headers()).map(str::to_owned),
        crate::server::portal::session_cookie(req.headers()),
    ) {
        (Some(token), _) => match &state.identity.agents {
            Some(agents) if !crate::server::tokens::is_emisar_token(&token) => agents
                .principal(&token)
                .await
                .map_err(|r| agents.refused(r)),
            _ => match state.tokens.authenticate(&state.db, &token).await {
                Ok(Some(principal)) => Ok(principal),
                Ok(None) => Err(unauthorized(
                    "the bearer token is unknown, expired or revoked",
                )),
                Err(e) => Err(unavailable(&e)),
            },
        },
        (None, Some(cookie)) => match portal_session(state, &cookie).await {
            Ok(Some(session)) => {
                let principal = Principal {
                    name: session.user.clone(),
                    token_id: format!("session:{}", &session.id_hash[..16]),
                    role: session.role,
                    roles: session.roles.clone(),
                    selector: None,
                    on_behalf_of: None,
                };
                req.extensions_mut().insert(session);
                Ok(principal)
            }
            Ok(None) => Err(unauthorized("the session has ended: log in again")),
            Err(e) => Err(unavailable(&e)),
        },
        (None, None) => Err(unauthorized(
            "a bearer token or a portal session is required",
        )),
    }
}

/// A request authenticated by the portal's cookie changes nothing unless it carries the
/// session's CSRF token; a bearer token's request needs none (no browser sends it by itself).
fn check_csrf(req: &Request) -> Result<(), ApiError> {
    let Some(session) = req.extensions().get::<crate::server::users::Session>() else {
        return Ok(());
    };
    let safe = matches!(*req.method(), Method::GET | Method::HEAD);
    let csrf_ok = req
        .headers()
        .get("x-csrf-token")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| crate::server::users::same_secret(t, &session.csrf));
    if safe || csrf_ok {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::FORBIDDEN,
        "refused: a change made with the portal's session needs its CSRF token (X-CSRF-Token); reload the page",
    ))
}

/// Each role reaches only its paths: agents `/mcp` and `/api/runners`; people every `/api/*`
/// path, and auditors and admins `/metrics` too; a person with no role only `/api/session`
/// and `/api/logout`.
fn check_role(principal: &Principal, path: &str) -> Result<(), ApiError> {
    let allowed = match principal.role {
        Role::Agent => path.starts_with("/mcp") || path == "/api/runners",
        // The metrics name every agent and runner and count what each does: an inventory for
        // those who may read the audit log, not for everyone who reaches the port.
        Role::Auditor | Role::Admin => path.starts_with("/api/") || path == "/metrics",
        Role::Approver => path.starts_with("/api/"),
        Role::None => path == "/api/session" || path == "/api/logout",
    };
    if allowed {
        return Ok(());
    }
    let why = if principal.role == Role::None {
        format!(
            "{} is signed in but holds no role in emisar (none of their groups at the provider is mapped to one): ask an administrator",
            principal.name
        )
    } else {
        format!(
            "a token with role `{}` may not use {path}",
            principal.role.as_str()
        )
    };
    Err(ApiError::new(StatusCode::FORBIDDEN, why))
}

/// The request's MCP session id, if it has one, once it is known to belong to `principal`'s
/// token. An id this server did not open for that token (another token's, or one it never
/// issued) is answered 404, as if it did not exist, and is never bound: only the server
/// opens sessions ([`remember_mcp_session`]).
fn check_mcp_session(
    state: &HttpState,
    req: &Request,
    principal: &Principal,
) -> Result<Option<String>, ApiError> {
    let Some(v) = req.headers().get("mcp-session-id") else {
        return Ok(None);
    };
    // Bound sessions are remembered, so an id is checked at the door: the ids this server
    // hands out are short and printable, and anything else cannot be one of them.
    let id = match v.to_str() {
        Ok(id) if !id.is_empty() && id.len() <= MAX_SESSION_ID => id.to_owned(),
        _ => {
            return Err(ApiError::bad_request(format!(
                "`Mcp-Session-Id` must be 1 to {MAX_SESSION_ID} printable ASCII characters, as this server issued it"
            )));
        }
    };
    if state.sessions.owner(&id, &principal.token_id) != Owner::Caller {
        return Err(ApiError::new(StatusCode::NOT_FOUND, "session not found"));
    }
    Ok(Some(id))
}

/// After the MCP answer: a session the server just opened (its answer names a session id,
/// and the request, `opening`, carried none) is bound to `principal`'s token, and a session
/// the request `closed` is forgotten.
fn remember_mcp_session(
    state: &HttpState,
    response: &Response,
    principal: &Principal,
    opening: bool,
    closed: Option<String>,
) {
    if opening
        && let Some(id) = response
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
    {
        state.sessions.opened(id, &principal.token_id);
    }
    if let Some(id) = closed {
        state.sessions.closed(&id);
    }
}

/// The portal session with this id: a local user's, or a provider person's.
async fn portal_session(
    state: &HttpState,
    id: &str,
) -> Result<Option<crate::server::users::Session>, crate::server::users::UserError> {
    if let Some(session) = crate::server::users::session(&state.db, id).await? {
        return Ok(Some(session));
    }
    if state.identity.people.is_none() {
        return Ok(None);
    }
    crate::server::oidc::sessions::find(&state.db, id).await
}

/// Ready when the store answers and the audit writer is writing; otherwise 503 with reasons.
async fn readyz(State(state): State<HttpState>) -> Response {
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

async fn metrics() -> Response {
    let handle = crate::server::metrics::handle();
    handle.run_upkeep();
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        handle.render(),
    )
        .into_response()
}
