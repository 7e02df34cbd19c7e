//! The people's API beside the portal: the approvals (`approvals`), the audit (`audit`) and
//! people's passkeys (`passkeys`) side by side, with their routes in one place.
//!
//! Invariant: every route here is mounted by `http::router` behind `bearer_auth`, so each
//! handler runs only for an authenticated caller whose role may use the path (and, for a
//! cookie-authenticated change, with its CSRF token checked).

use axum::Router;
use axum::routing::{delete, get, post};

use crate::server::http_state::HttpState;

pub mod approvals;
pub mod audit;
pub mod passkeys;

/// The approvals and audit routes, for `http::router` to put behind its door.
pub fn routes() -> Router<HttpState> {
    Router::new()
        .route("/api/audit", get(audit::page))
        .route("/api/audit/export", get(audit::export))
        .route("/api/audit/checkpoint", get(audit::checkpoint))
        .route("/api/audit/proof", get(audit::proof))
        .route("/api/audit/consistency", get(audit::consistency))
        .route("/api/approvals", get(approvals::list))
        .route("/api/approvals/{id}", get(approvals::show))
        .route("/api/approvals/{id}/approve", post(approvals::approve))
        .route("/api/approvals/{id}/deny", post(approvals::deny))
        .route("/api/events", get(approvals::events))
        .route("/api/passkeys", get(passkeys::list))
        .route(
            "/api/passkeys/register/start",
            post(passkeys::register_start),
        )
        .route(
            "/api/passkeys/register/finish",
            post(passkeys::register_finish),
        )
        .route("/api/passkeys/{id}", delete(passkeys::remove))
}
