//! The portal: the page and assets from `web/` (embedded in the binary), login and logout.
//! The approvals API the page calls lives in `api::approvals`.
//!
//! Invariants: the page is one static HTML file with two scripts (`statement.js`, the check
//! before a passkey signs, then `app.js`) and one stylesheet from this origin, under a CSP
//! that allows nothing else (no inline script or style), and the scripts insert every piece
//! of data as text. The session cookie is HttpOnly and
//! SameSite=Strict (Secure under TLS); the CSRF check lives in `http::door::bearer_auth`.

pub mod oidc;

use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::{Value, json};

use crate::server::http::api::error::{ApiError, Code};
use crate::server::http::state::HttpState;
use crate::server::users::{Session, UserError};

const COOKIE: &str = "emisar_session";
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

const INDEX_HTML: &str = include_str!("../../../../web/index.html");
const APP_JS: &str = include_str!("../../../../web/app.js");
const STATEMENT_JS: &str = include_str!("../../../../web/statement.js");
const APP_CSS: &str = include_str!("../../../../web/app.css");

pub(crate) async fn index() -> Response {
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        INDEX_HTML,
    )
        .into_response()
}

pub(crate) async fn asset(Path(file): Path<String>) -> Response {
    match file.as_str() {
        "app.js" => (
            [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
            APP_JS,
        )
            .into_response(),
        "statement.js" => (
            [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
            STATEMENT_JS,
        )
            .into_response(),
        "app.css" => ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], APP_CSS).into_response(),
        _ => not_found().await,
    }
}

pub(crate) async fn not_found() -> Response {
    ApiError::new(Code::NotFound, "not found").into_response()
}

/// Headers every response carries.
pub(crate) async fn security_headers(req: Request, next: Next) -> Response {
    let mut response = next.run(req).await;
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    response
}

/// The session id from the `Cookie` header, if any.
pub(crate) fn session_cookie(headers: &HeaderMap) -> Option<String> {
    cookie_value(headers, COOKIE)
}

/// The non-empty value of cookie `name` in the request, if present. (A few cookies of ours;
/// parsing the header by hand is shorter than a cookie-jar dependency.)
pub(crate) fn cookie_value(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|pair| {
            let (n, value) = pair.trim().split_once('=')?;
            (n == name && !value.is_empty()).then(|| value.to_owned())
        })
}

/// The `Set-Cookie` value of a portal session (an empty value and 0 clear it).
pub(crate) fn session_cookie_header(state: &HttpState, value: &str, max_age: u64) -> HeaderValue {
    let secure = if state.secure_cookies { "; Secure" } else { "" };
    HeaderValue::from_str(&format!(
        "{COOKIE}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age}{secure}"
    ))
    .expect("cookie values are URL-safe base64")
}

fn session_json(s: &Session) -> Value {
    json!({"user": s.user, "role": s.role.as_str(), "csrf": s.csrf,
           "roles": s.roles.iter().map(|r| r.as_str()).collect::<Vec<_>>(),
           "display_name": s.display_name})
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Login {
    name: String,
    password: String,
}

/// `POST /api/login`. In order: the body's shape, the name's and password's shape (400,
/// naming the field; nothing counted, stored or hashed), the limits (429 only for the
/// address: per address and per name and address; an address that failed for the name
/// waits its turn under the per-name and server-wide pace), then the store and the hash. A
/// wrong password marks the address as failed for the name; a right one clears it.
pub(crate) async fn login(
    State(state): State<HttpState>,
    // Absent when the router is driven without a socket (in-process tests).
    connect: Option<Extension<axum::extract::ConnectInfo<std::net::SocketAddr>>>,
    headers: HeaderMap,
    body: Result<Json<Login>, axum::extract::rejection::JsonRejection>,
) -> Response {
    if !state.identity.local_login {
        let provider = state
            .identity
            .people
            .as_ref()
            .map_or("the OpenID provider", |p| p.config.display_name.as_str());
        return ApiError::new(
            Code::PasswordLoginOff,
            format!(
                "password login is switched off here (oidc.local_login = false): sign in with {provider}"
            ),
        ).into_response();
    }
    let Json(login) = match body {
        Ok(b) => b,
        Err(e) => {
            return ApiError::unreadable_body(
                &e,
                format!(
                    "invalid login: {} (send {{\"name\": ..., \"password\": ...}} as JSON)",
                    e.body_text()
                ),
            )
            .into_response();
        }
    };
    if let Err(e) = crate::server::users::check_login(&login.name, &login.password) {
        return ApiError::bad_request(e.to_string()).into_response();
    }
    let client = state.logins.client(connect.map(|c| (c.0).0), &headers);
    let paced = match state.logins.admit(client, &login.name).await {
        Ok(waited) => waited,
        Err(refusal) => {
            return ApiError::new(Code::RateLimited, refusal.message()).into_response();
        }
    };
    let mut response = check_password(&state, client, &login).await;
    // How long the attempt waited for its turn, as W3C Server-Timing: the client learns it
    // was paced (an attacker knows that anyway), and a test reads the server's own measure
    // rather than the wall clock of a busy machine.
    if !paced.is_zero()
        && let Ok(value) = header::HeaderValue::from_str(&format!(
            "pace;dur={};desc=\"login pacing\"",
            paced.as_millis()
        ))
    {
        response.headers_mut().insert("server-timing", value);
    }
    response
}

/// `login`'s second half, once the attempt's turn has come: the store and the hash.
async fn check_password(state: &HttpState, client: std::net::IpAddr, login: &Login) -> Response {
    let outcome = crate::server::users::login(
        &state.db,
        state.gateway.audit(),
        &login.name,
        &login.password,
    )
    .await;
    match &outcome {
        Ok(_) => state.logins.succeeded(client, &login.name),
        Err(UserError::BadLogin) => state.logins.failed(client, &login.name),
        Err(_) => {}
    }
    match outcome {
        Ok((session, id)) => {
            let ttl = crate::server::users::SESSION_TTL.as_secs();
            let mut response = Json(session_json(&session)).into_response();
            response
                .headers_mut()
                .insert(header::SET_COOKIE, session_cookie_header(state, &id, ttl));
            response
        }
        Err(UserError::BadLogin) => {
            ApiError::new(Code::Unauthenticated, UserError::BadLogin.to_string()).into_response()
        }
        Err(e @ UserError::Invalid(_)) => ApiError::bad_request(e.to_string()).into_response(),
        Err(e @ UserError::Busy) => ApiError::new(Code::Busy, e.to_string()).into_response(),
        Err(e) => ApiError::unavailable("login failed", &e, "the user store is unavailable")
            .into_response(),
    }
}

pub(crate) async fn session(session: Option<Extension<Session>>) -> Response {
    match session {
        Some(Extension(s)) => Json(session_json(&s)).into_response(),
        None => ApiError::bad_request("this request carries a bearer token, not a portal session")
            .into_response(),
    }
}

pub(crate) async fn logout(
    State(state): State<HttpState>,
    session: Option<Extension<Session>>,
) -> Response {
    let Some(Extension(s)) = session else {
        return ApiError::bad_request("this request carries a bearer token, not a portal session")
            .into_response();
    };
    let ended = if s.display_name.is_some() {
        crate::server::oidc::sessions::close(&state.db, state.gateway.audit(), &s).await
    } else {
        crate::server::users::logout(&state.db, state.gateway.audit(), &s).await
    };
    if let Err(e) = ended {
        return ApiError::unavailable("logout failed", &e, "the user store is unavailable")
            .into_response();
    }
    let mut response = Json(json!({"ok": true})).into_response();
    response
        .headers_mut()
        .insert(header::SET_COOKIE, session_cookie_header(&state, "", 0));
    response
}
