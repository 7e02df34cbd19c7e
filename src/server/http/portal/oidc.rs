//! The portal's routes for people who sign in through the organisation's OpenID provider:
//!
//! - `GET /api/login/options`: what the login page offers (password login, "Sign in with …"
//!   and whether the provider can be reached).
//! - `GET /login/oidc?return_to=/…`: starts a sign-in; sets the browser-binding cookie and
//!   sends the browser to the provider.
//! - `GET /login/oidc/callback`: the provider sends the browser back here; on success a portal
//!   session is opened and the browser goes back to where it was.
//! - `POST /login/oidc/backchannel-logout`: the provider says a person's session ended.
//!
//! *Invariants:* a refusal is a small HTML page that says why, in text (every value escaped;
//! no script, so the portal's CSP holds); refusals of a token the provider handed over (a
//! tampered, expired, misaddressed ID token) are audited as `login.failed`, while answers that
//! never reached the provider's token endpoint (an unknown `state`, another browser) are only
//! logged and counted, since anyone can send those. The binding cookie is `SameSite=Lax`
//! because the provider's redirect back is a cross-site navigation; the session cookie is the
//! portal's own (`SameSite=Strict`).

use axum::Json;
use axum::extract::{Form, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::server::audit::{NewEvent, kind};
use crate::server::http::portal::cookie_value;
use crate::server::http::state::HttpState;
use crate::server::oidc::config::OidcConfig;
use crate::server::oidc::jwt::unix_now;
use crate::server::oidc::login::{CALLBACK_PATH, Callback, LoginError};

/// Where a sign-in starts.
pub(crate) const START_PATH: &str = "/login/oidc";
/// Where the provider's back-channel logout posts (register it at the provider).
pub(crate) const BACKCHANNEL_LOGOUT_PATH: &str = "/login/oidc/backchannel-logout";
/// Binds a sign-in to the browser that started it.
const BINDING_COOKIE: &str = "emisar_oidc";

/// `GET /api/login/options`.
pub(crate) async fn options(State(state): State<HttpState>) -> Response {
    let identity = &state.identity;
    let oidc = identity.people.as_ref().map(|p| {
        let status = p.login.get();
        json!({
            "name": p.config.display_name,
            "url": START_PATH,
            "available": status.is_ok(),
            "problem": status.err(),
        })
    });
    Json(json!({"local_login": identity.local_login, "oidc": oidc})).into_response()
}

#[derive(serde::Deserialize)]
pub(crate) struct StartQuery {
    #[serde(default)]
    return_to: Option<String>,
}

/// `GET /login/oidc`.
pub(crate) async fn start(
    State(state): State<HttpState>,
    query: Result<Query<StartQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Some(people) = &state.identity.people else {
        return crate::server::http::portal::not_found().await;
    };
    let return_to = query.ok().and_then(|Query(q)| q.return_to);
    let login = match people.login.get() {
        Ok(login) => login,
        Err(problem) => {
            return unavailable(&people.config, state.identity.local_login, &problem);
        }
    };
    match login.start(return_to.as_deref()) {
        Ok(start) => {
            let mut response = (
                StatusCode::SEE_OTHER,
                [(header::LOCATION, start.authorization_url)],
            )
                .into_response();
            response.headers_mut().append(
                header::SET_COOKIE,
                binding_cookie(
                    &state,
                    &start.browser_binding,
                    people.config.login_timeout_secs,
                ),
            );
            response
        }
        Err(e @ LoginError::TooManyPending) => page(
            StatusCode::TOO_MANY_REQUESTS,
            "Sign-in unavailable",
            &e.to_string(),
        ),
        Err(e) => {
            tracing::error!(error = %e, "could not start a sign-in");
            page(
                StatusCode::SERVICE_UNAVAILABLE,
                "Sign-in unavailable",
                &format!("the sign-in could not be started: {e}"),
            )
        }
    }
}

/// `GET /login/oidc/callback`.
pub(crate) async fn callback(
    State(state): State<HttpState>,
    headers: HeaderMap,
    query: Result<Query<Callback>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Some(people) = &state.identity.people else {
        return crate::server::http::portal::not_found().await;
    };
    let mut response = match query {
        Err(e) => refused_page(
            StatusCode::BAD_REQUEST,
            &format!(
                "the provider's answer is not a valid query: {}",
                e.body_text()
            ),
        ),
        Ok(Query(answer)) => match people.login.get() {
            Err(problem) => unavailable(&people.config, state.identity.local_login, &problem),
            Ok(login) => {
                let binding = cookie_value(&headers, BINDING_COOKIE);
                match login.finish(&answer, binding.as_deref()).await {
                    Ok(person) => signed_in(&state, person).await,
                    Err(e) => refused(&state, &people.config, e).await,
                }
            }
        },
    };
    // The binding is single use, whatever happened.
    response
        .headers_mut()
        .append(header::SET_COOKIE, binding_cookie(&state, "", 0));
    response
}

/// Opens the portal session and sends the browser back to where it was.
async fn signed_in(
    state: &HttpState,
    person: crate::server::oidc::login::SignedInPerson,
) -> Response {
    match crate::server::oidc::sessions::open(&state.db, state.gateway.audit(), &person).await {
        Ok((_, id)) => {
            crate::server::metrics::oidc_sign_in("ok");
            tracing::info!(person = %person.identity, "signed in through the OpenID provider");
            let to = person.return_to.as_deref().unwrap_or("/");
            let lifetime = (person.session_expires_at - unix_now()).max(0) as u64;
            let mut response = (StatusCode::SEE_OTHER, [(header::LOCATION, to)]).into_response();
            response.headers_mut().append(
                header::SET_COOKIE,
                crate::server::http::portal::session_cookie_header(state, &id, lifetime),
            );
            response
        }
        Err(e) => {
            tracing::error!(error = %e, "could not open a session for a signed-in person");
            crate::server::metrics::oidc_sign_in("store_unavailable");
            page(
                StatusCode::SERVICE_UNAVAILABLE,
                "Sign-in failed",
                "the provider vouched for you, but emisar's session store is unavailable; try again in a moment",
            )
        }
    }
}

/// A stable name for each way a sign-in can fail, for metrics and logs.
fn code(e: &LoginError) -> &'static str {
    match e {
        LoginError::Provider { .. } => "provider_refused",
        LoginError::MissingParameter(_) => "bad_answer",
        LoginError::UnknownState => "unknown_state",
        LoginError::Expired => "expired_sign_in",
        LoginError::BrowserMismatch => "browser_mismatch",
        LoginError::IssuerMismatch { .. } | LoginError::MissingIssuer => "issuer_mismatch",
        LoginError::TooManyPending => "too_many_pending",
        LoginError::TokenEndpoint(_) => "token_endpoint_refused",
        LoginError::Fetch(_) => "provider_unreachable",
        LoginError::NoIdToken => "no_id_token",
        LoginError::IdToken(t) => t.code(),
        LoginError::Claim(_) => "identity_claim",
        LoginError::Randomness(_) => "no_randomness",
    }
}

async fn refused(state: &HttpState, config: &OidcConfig, e: LoginError) -> Response {
    let code = code(&e);
    crate::server::metrics::oidc_sign_in(code);
    tracing::warn!(check = code, error = %e, "a sign-in through the OpenID provider was refused");
    // Only a token the provider handed over is worth an audit event: everything before the
    // token endpoint can be sent by anyone, and would let them fill the log.
    if matches!(
        e,
        LoginError::IdToken(_) | LoginError::Claim(_) | LoginError::NoIdToken
    ) {
        let event = NewEvent {
            actor: "system:oidc".into(),
            kind: kind::LOGIN_FAILED.into(),
            outcome: Some("refused".into()),
            detail: Some(json!({"provider": config.issuer, "check": code, "error": e.to_string()})),
            ..Default::default()
        };
        if let Err(audit) = state.gateway.audit().append(event).await {
            tracing::error!(error = %audit, "could not audit a refused sign-in");
        }
    }
    let status = match e {
        LoginError::TooManyPending => StatusCode::TOO_MANY_REQUESTS,
        LoginError::TokenEndpoint(_) | LoginError::Fetch(_) | LoginError::NoIdToken => {
            StatusCode::BAD_GATEWAY
        }
        LoginError::Randomness(_) => StatusCode::INTERNAL_SERVER_ERROR,
        _ => StatusCode::BAD_REQUEST,
    };
    refused_page(status, &format!("the sign-in was refused: {e}"))
}

fn refused_page(status: StatusCode, message: &str) -> Response {
    page(status, "Sign-in refused", message)
}

fn unavailable(config: &OidcConfig, local_login: bool, problem: &str) -> Response {
    let hint = if local_login {
        " Password login still works."
    } else {
        ""
    };
    page(
        StatusCode::SERVICE_UNAVAILABLE,
        "Sign-in unavailable",
        &format!(
            "Signing in with {} is not possible right now: {problem}.{hint}",
            config.display_name
        ),
    )
}

#[derive(serde::Deserialize)]
pub(crate) struct LogoutForm {
    logout_token: String,
}

/// `POST /login/oidc/backchannel-logout` (OpenID Connect Back-Channel Logout 1.0).
pub(crate) async fn backchannel_logout(
    State(state): State<HttpState>,
    form: Result<Form<LogoutForm>, axum::extract::rejection::FormRejection>,
) -> Response {
    let Some(people) = &state.identity.people else {
        return crate::server::http::portal::not_found().await;
    };
    let bad = |description: String| {
        (
            StatusCode::BAD_REQUEST,
            Json(json!({"error": "invalid_request", "error_description": description})),
        )
            .into_response()
    };
    let Form(form) = match form {
        Ok(f) => f,
        Err(e) => {
            return bad(format!(
                "a logout_token form field is required: {}",
                e.body_text()
            ));
        }
    };
    let login = match people.login.get() {
        Ok(login) => login,
        Err(problem) => {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(json!({"error": "temporarily_unavailable", "error_description": problem})),
            )
                .into_response();
        }
    };
    let request = match login
        .verify_logout_token(&form.logout_token, unix_now())
        .await
    {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(check = e.code(), error = %e, "a back-channel logout token was refused");
            return bad(format!("the logout token was refused: {e}"));
        }
    };
    match crate::server::oidc::sessions::end_by_provider(
        &state.db,
        state.gateway.audit(),
        &people.config.issuer,
        request.sid.as_deref(),
        request.subject.as_deref(),
    )
    .await
    {
        Ok(ended) => {
            tracing::info!(ended, "the provider ended a session");
            Json(json!({"ended": ended})).into_response()
        }
        Err(e) => {
            tracing::error!(error = %e, "could not end the sessions the provider logged out");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(json!({"error": "temporarily_unavailable", "error_description": "the session store is unavailable"})),
            )
                .into_response()
        }
    }
}

fn binding_cookie(state: &HttpState, value: &str, max_age: u64) -> HeaderValue {
    let secure = if state.secure_cookies { "; Secure" } else { "" };
    HeaderValue::from_str(&format!(
        "{BINDING_COOKIE}={value}; Path={START_PATH}; HttpOnly; SameSite=Lax; Max-Age={max_age}{secure}"
    ))
    .expect("cookie values are URL-safe base64")
}

/// Text for HTML: the five characters that could end an element or an attribute, escaped.
/// Written here because it is five lines and the portal itself builds no HTML on the server.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A small page that says what happened, in the portal's style, without any script.
fn page(status: StatusCode, title: &str, message: &str) -> Response {
    let html = format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{title} · emisar</title><link rel=\"stylesheet\" href=\"/assets/app.css\"></head>\
         <body><main><section class=\"login-wrap\"><h1 id=\"title\">{title}</h1>\
         <p id=\"error\" class=\"error\" role=\"alert\">{message}</p>\
         <p class=\"buttons\"><a id=\"start-again\" class=\"button\" href=\"{START_PATH}\">Start again</a>\
         <a class=\"button secondary\" href=\"/\">Back to emisar</a></p></section></main></body></html>\n",
        title = escape(title),
        message = escape(message),
    );
    (
        status,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        html,
    )
        .into_response()
}

/// The callback path, for the router.
pub(crate) const CALLBACK: &str = CALLBACK_PATH;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_carry_text_never_markup() {
        assert_eq!(
            escape("<script>alert('x')</script> & \"q\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;q&quot;"
        );
    }

    #[test]
    fn cookies_are_found_by_name() {
        let mut h = HeaderMap::new();
        h.append(
            header::COOKIE,
            "a=1; emisar_oidc=xyz; emisar_session=s".parse().unwrap(),
        );
        assert_eq!(cookie_value(&h, "emisar_oidc").as_deref(), Some("xyz"));
        assert_eq!(cookie_value(&h, "missing"), None);
    }
}
