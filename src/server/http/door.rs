//! The door of `/mcp`, the `/api/*` operations behind it (`api::Access::Door`) and
//! `/metrics`: the middleware ([`bearer_auth`]) every request to them passes before its
//! handler. It says who is calling (a bearer token,
//! emisar's own or with `[oauth]` an OAuth access token, or the portal's session cookie),
//! whether a cookie's change carries its CSRF token, whether the caller's role may use the
//! path, and whether an MCP session is the caller's own; it binds the sessions the server
//! opens to the token that asked, and refuses a new one past the server's limit.
//!
//! Invariants: an MCP session belongs to the token that opened it, and only the server opens
//! one; the same session id presented with another token, or an id the server never
//! issued, is answered 404, as if it did not exist (rmcp routes on the session id alone). A
//! request authenticated by cookie changes nothing unless it carries the session's CSRF
//! token in `X-CSRF-Token`.

use axum::extract::{Request, State};
use axum::http::{Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::server::http::api::error::{ApiError, Code};
use crate::server::http::state::{HttpState, Owner};
use crate::server::principal::{Principal, Role};

/// The longest MCP session id accepted (the ones this server issues are UUIDs).
const MAX_SESSION_ID: usize = 128;

/// The door of `/mcp` and `/api/*`, one step a function: who is calling
/// ([`authenticate`]), whether a cookie's change carries its CSRF token ([`check_csrf`]),
/// whether the caller's role may use the path ([`check_role`]), and whether the MCP session
/// is the caller's own ([`check_mcp_session`], [`remember_mcp_session`]).
pub(super) async fn bearer_auth(
    State(state): State<HttpState>,
    mut req: Request,
    next: Next,
) -> Response {
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
            Code::Busy,
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
            [(header::WWW_AUTHENTICATE, "Bearer")],
            ApiError::new(Code::Unauthenticated, message),
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
        crate::server::http::api::runners::bearer(req.headers()).map(str::to_owned),
        crate::server::http::portal::session_cookie(req.headers()),
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
        Code::CsrfRequired,
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
    Err(if principal.role == Role::None {
        ApiError::new(
            Code::NoRole,
            format!(
                "{} is signed in but holds no role in emisar (none of their groups at the provider is mapped to one): ask an administrator",
                principal.name
            ),
        )
    } else {
        ApiError::new(
            Code::Forbidden,
            format!(
                "a token with role `{}` may not use {path}",
                principal.role.as_str()
            ),
        )
    })
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
        return Err(ApiError::new(Code::NotFound, "session not found"));
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
