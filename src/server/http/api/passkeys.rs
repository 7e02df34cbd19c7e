//! The passkeys API: `POST /api/passkeys/register/start` and `/register/finish` (the WebAuthn
//! registration ceremony, the browser's `navigator.credentials.create` in between),
//! `GET /api/passkeys` (one's own; an admin may ask for `?user=NAME`) and
//! `DELETE /api/passkeys/{id}`. Behind `http::door::bearer_auth`, like all of `/api/*`: a
//! cookie's change carries its CSRF token.
//!
//! Invariants: only people who approve (role approver or admin) register passkeys, each
//! their own; a registration finishes only with the challenge its own session started
//! (`server::passkeys`); a person sees and removes only their own passkeys, an admin
//! anyone's.

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::json;
use sha2::Digest;

use crate::protocol::approval::webauthn::CoseAlg;
use crate::server::http::api::error::{ApiError, Code};
use crate::server::http::state::HttpState;
use crate::server::passkeys::{self, PasskeyError, Registration};
use crate::server::principal::{Principal, Role};
use crate::server::users::Session;

impl From<PasskeyError> for ApiError {
    fn from(e: PasskeyError) -> Self {
        let code = match &e {
            PasskeyError::Invalid(_) | PasskeyError::Refused(_) | PasskeyError::NoChallenge => {
                Code::InvalidRequest
            }
            PasskeyError::Forbidden(_) => Code::Forbidden,
            PasskeyError::NotFound(_) => Code::NotFound,
            PasskeyError::Duplicate | PasskeyError::NotConfigured(_) => Code::Conflict,
            PasskeyError::Store(_) => {
                return ApiError::unavailable(
                    "a passkey request failed",
                    &e,
                    "the store is unavailable; try again later",
                );
            }
            PasskeyError::Audit(_) => {
                return ApiError::unavailable(
                    "a passkey request failed",
                    &e,
                    "the audit log cannot record this; try again later",
                );
            }
        };
        ApiError::new(code, e.to_string())
    }
}

/// Passkeys sign approvals: only people who approve register them.
fn approves(who: &Principal) -> Result<(), PasskeyError> {
    if who
        .roles
        .iter()
        .any(|r| matches!(r, Role::Approver | Role::Admin))
    {
        return Ok(());
    }
    Err(PasskeyError::Forbidden(
        "passkeys sign approvals: only people with role approver or admin register them".into(),
    ))
}

/// Which session (or API token) a registration belongs to: the challenge one session
/// started is no other's.
fn owner(who: &Principal, session: Option<&Session>) -> String {
    match session {
        Some(s) => format!("session:{}", s.id_hash),
        None => format!("token:{}", who.token_id),
    }
}

fn relying_party(
    state: &HttpState,
) -> Result<&crate::protocol::approval::webauthn::RelyingParty, PasskeyError> {
    state
        .webauthn
        .as_ref()
        .as_ref()
        .map_err(|why| PasskeyError::NotConfigured(why.clone()))
}

/// `POST /api/passkeys/register/start`: the options for `navigator.credentials.create`, in
/// the JSON form `PublicKeyCredential.parseCreationOptionsFromJSON` reads.
pub(crate) async fn register_start(
    State(state): State<HttpState>,
    Extension(who): Extension<Principal>,
    session: Option<Extension<Session>>,
) -> Result<Json<serde_json::Value>, ApiError> {
    approves(&who)?;
    let rp = relying_party(&state)?;
    let existing = passkeys::of_user(&state.db, &who.name).await?;
    let challenge = passkeys::start(&state.db, &owner(&who, session.as_deref()), &who.name).await?;
    // A stable handle that does not spell the name: an authenticator keeps one passkey per
    // (RP, handle), and `excludeCredentials` stops it registering the same one twice.
    let handle = sha2::Sha256::digest(format!("emisar-user:{}", who.name).as_bytes());
    let display = session
        .as_deref()
        .and_then(|s| s.display_name.clone())
        .unwrap_or_else(|| who.name.clone());
    Ok(Json(json!({"publicKey": {
        "rp": {"id": rp.rp_id, "name": "emisar"},
        "user": {
            "id": URL_SAFE_NO_PAD.encode(handle),
            "name": who.name,
            "displayName": display,
        },
        "challenge": URL_SAFE_NO_PAD.encode(challenge),
        "pubKeyCredParams": [
            {"type": "public-key", "alg": CoseAlg::ES256.cose()},
            {"type": "public-key", "alg": CoseAlg::EdDSA.cose()},
        ],
        "timeout": passkeys::CHALLENGE_TTL.as_millis() as u64,
        "excludeCredentials": existing.iter().map(|p| json!({"type": "public-key", "id": p.credential_id})).collect::<Vec<_>>(),
        "authenticatorSelection": {"residentKey": "preferred", "userVerification": "required"},
        "attestation": "none",
    }})))
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Finish {
    name: String,
    credential_id: String,
    attestation_object: String,
    client_data_json: String,
}

/// `POST /api/passkeys/register/finish`: the browser's answer, checked against the
/// challenge this session started; the passkey as stored.
pub(crate) async fn register_finish(
    State(state): State<HttpState>,
    Extension(who): Extension<Principal>,
    session: Option<Extension<Session>>,
    body: Result<Json<Finish>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<passkeys::Passkey>, ApiError> {
    let Json(f) = body
        .map_err(|e| ApiError::bad_request(format!("invalid registration: {}", e.body_text())))?;
    approves(&who)?;
    let rp = relying_party(&state)?;
    let passkey = passkeys::finish(
        &state.db,
        state.gateway.audit(),
        rp,
        &owner(&who, session.as_deref()),
        &who.name,
        &who.actor(),
        Registration {
            name: &f.name,
            credential_id: &f.credential_id,
            attestation_object: &f.attestation_object,
            client_data_json: &f.client_data_json,
        },
    )
    .await?;
    Ok(Json(passkey))
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListQuery {
    user: Option<String>,
}

/// `GET /api/passkeys`: the caller's passkeys (an admin: `?user=NAME`'s), and the relying
/// party they are registered for, which an approvers file names with them.
pub(crate) async fn list(
    State(state): State<HttpState>,
    Extension(who): Extension<Principal>,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Query(q) = match query {
        Ok(q) => q,
        Err(e) => {
            return ApiError::bad_request(format!("invalid query: {}", e.body_text()))
                .into_response();
        }
    };
    let user = match q.user {
        Some(user) if user != who.name => {
            if !who.roles.contains(&Role::Admin) {
                return ApiError::from(PasskeyError::Forbidden(
                    "`user`: only an admin lists another person's passkeys".into(),
                ))
                .into_response();
            }
            if let Err(e) = check_person("user", &user) {
                return ApiError::bad_request(e).into_response();
            }
            user
        }
        _ => who.name.clone(),
    };
    match passkeys::of_user(&state.db, &user).await {
        Ok(keys) => {
            let rp = state.webauthn.as_ref().as_ref().ok();
            Json(json!({
                "user": user,
                "passkeys": keys,
                "webauthn": rp.map(|rp| json!({"rp_id": rp.rp_id, "origins": rp.origins})),
            }))
            .into_response()
        }
        Err(e) => ApiError::from(e).into_response(),
    }
}

/// A person's name: an identifier, or `person:<claim>` for someone from the provider.
fn check_person(field: &str, name: &str) -> Result<(), String> {
    match name.strip_prefix("person:") {
        Some(claim) => crate::util::input::line(field, claim, 256).and_then(|()| {
            if claim.is_empty() {
                Err(format!("`{field}` must name a person"))
            } else {
                Ok(())
            }
        }),
        None => crate::util::input::identifier(field, name),
    }
}

/// `DELETE /api/passkeys/{id}`: one of the caller's passkeys (an admin: anyone's).
pub(crate) async fn remove(
    State(state): State<HttpState>,
    Extension(who): Extension<Principal>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Result<Json<passkeys::Passkey>, ApiError> {
    if uuid::Uuid::try_parse(&id).map(|u| u.hyphenated().to_string()) != Ok(id.clone()) {
        return Err(ApiError::bad_request(
            "`id` must be a passkey id: a UUID such as 0b7e1c2a-5d4f-4e3b-9a8c-1f2e3d4c5b6a",
        ));
    }
    let admin = who.roles.contains(&Role::Admin);
    let removed = passkeys::remove(
        &state.db,
        state.gateway.audit(),
        &id,
        &who.name,
        admin,
        &who.actor(),
    )
    .await?;
    Ok(Json(removed))
}
