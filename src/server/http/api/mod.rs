//! The JSON API under `/api`: the approvals (`approvals`), people's grants to agents
//! (`grants`), break-glass windows and their reviews (`break_glass`), the audit (`audit`), people's
//! passkeys (`passkeys`), the runners and their enrolment (`runners`), the portal's sign-in, mounted from one
//! table ([`HANDLERS`]) by the operations of the OpenAPI document (`openapi`), which the
//! server also serves at `GET /api/openapi.json`.
//!
//! Invariants: every path under `/api` is an operation of `openapi.yaml`, and every
//! operation is served, with the method the document gives it: [`routes`] mounts exactly
//! the document's operations, each from its `operationId`, and refuses (at build, which
//! `cargo test --lib api::` does) an operation without a handler, a handler without an
//! operation, and a door (`Access`) the document does not say; no other file mounts a path
//! under `/api` (a unit test reads the sources). The `Door` routes are mounted by
//! `http::router` behind `bearer_auth`, so each of their handlers runs only for an
//! authenticated caller whose role may use the path (and, for a cookie-authenticated change,
//! with its CSRF token checked).

use axum::Router;
use axum::routing::{MethodFilter, MethodRouter, on};

use crate::server::http::state::HttpState;

pub mod approvals;
pub mod audit;
pub mod break_glass;
pub mod error;
pub mod grants;
pub mod openapi;
pub mod passkeys;
pub mod runners;

/// Who may reach a handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Anyone: the handler checks what it needs itself (a password, a join token, a
    /// runner's credential), or there is nothing to protect.
    Open,
    /// Behind `http::door::bearer_auth`: a person's or agent's token, or the portal's session.
    Door,
}

/// How a handler reads its input, for the tests that check the document's examples against
/// the handler's own types: `Err` says what the handler would refuse.
pub(crate) type BodyCheck = fn(&serde_json::Value) -> Result<(), String>;
pub(crate) type QueryCheck = fn(&axum::http::Uri) -> Result<(), String>;

/// One handler of the table: the document's `operationId`, its door, the route (for the
/// method the document gives), and how it reads a body or a query string.
pub struct Handler {
    pub operation: &'static str,
    pub access: Access,
    pub route: fn(MethodFilter) -> MethodRouter<HttpState>,
    pub body: Option<BodyCheck>,
    pub query: Option<QueryCheck>,
}

/// `T` as the handler deserializes a JSON body.
fn body<T: serde::de::DeserializeOwned>(v: &serde_json::Value) -> Result<(), String> {
    serde_json::from_value::<T>(v.clone())
        .map(drop)
        .map_err(|e| e.to_string())
}

/// `T` as the handler's `Query` extractor reads the query string.
fn query<T: serde::de::DeserializeOwned>(uri: &axum::http::Uri) -> Result<(), String> {
    axum::extract::Query::<T>::try_from_uri(uri)
        .map(drop)
        .map_err(|e| e.body_text())
}

/// Every handler under `/api`, by the `operationId` that documents it.
pub(crate) const HANDLERS: &[Handler] = &[
    Handler {
        operation: "openapi",
        access: Access::Open,
        route: |m| on(m, openapi::serve),
        body: None,
        query: None,
    },
    Handler {
        operation: "login",
        access: Access::Open,
        route: |m| on(m, crate::server::http::portal::login),
        body: Some(body::<crate::server::http::portal::Login>),
        query: None,
    },
    Handler {
        operation: "login_options",
        access: Access::Open,
        route: |m| on(m, crate::server::http::portal::oidc::options),
        body: None,
        query: None,
    },
    Handler {
        operation: "session",
        access: Access::Door,
        route: |m| on(m, crate::server::http::portal::session),
        body: None,
        query: None,
    },
    Handler {
        operation: "logout",
        access: Access::Door,
        route: |m| on(m, crate::server::http::portal::logout),
        body: None,
        query: None,
    },
    Handler {
        operation: "approvals_list",
        access: Access::Door,
        route: |m| on(m, approvals::list),
        body: None,
        query: Some(query::<approvals::ListQuery>),
    },
    Handler {
        operation: "approvals_show",
        access: Access::Door,
        route: |m| on(m, approvals::show),
        body: None,
        query: None,
    },
    Handler {
        operation: "approvals_approve",
        access: Access::Door,
        route: |m| on(m, approvals::approve),
        body: Some(body::<approvals::Decision>),
        query: None,
    },
    Handler {
        operation: "approvals_deny",
        access: Access::Door,
        route: |m| on(m, approvals::deny),
        body: Some(body::<approvals::Decision>),
        query: None,
    },
    Handler {
        operation: "approvals_decision_propose",
        access: Access::Door,
        route: |m| on(m, approvals::propose),
        body: Some(body::<approvals::Proposal>),
        query: None,
    },
    Handler {
        operation: "approvals_decision_vote",
        access: Access::Door,
        route: |m| on(m, approvals::vote),
        body: Some(body::<approvals::DecisionVote>),
        query: None,
    },
    Handler {
        operation: "approvals_events",
        access: Access::Door,
        route: |m| on(m, approvals::events),
        body: None,
        query: None,
    },
    Handler {
        operation: "grants_list",
        access: Access::Door,
        route: |m| on(m, grants::list),
        body: None,
        query: Some(query::<grants::ListQuery>),
    },
    Handler {
        operation: "grants_show",
        access: Access::Door,
        route: |m| on(m, grants::show),
        body: None,
        query: None,
    },
    Handler {
        operation: "grants_approve",
        access: Access::Door,
        route: |m| on(m, grants::approve),
        body: Some(body::<grants::Approve>),
        query: None,
    },
    Handler {
        operation: "grants_revoke",
        access: Access::Door,
        route: |m| on(m, grants::revoke),
        body: Some(body::<grants::Revoke>),
        query: None,
    },
    Handler {
        operation: "audit_query",
        access: Access::Door,
        route: |m| on(m, audit::page),
        body: None,
        query: Some(query::<audit::AuditQuery>),
    },
    Handler {
        operation: "audit_export",
        access: Access::Door,
        route: |m| on(m, audit::export),
        body: None,
        query: Some(query::<audit::AuditQuery>),
    },
    Handler {
        operation: "audit_checkpoint",
        access: Access::Door,
        route: |m| on(m, audit::checkpoint),
        body: None,
        query: Some(query::<audit::CheckpointQuery>),
    },
    Handler {
        operation: "audit_proof",
        access: Access::Door,
        route: |m| on(m, audit::proof),
        body: None,
        query: Some(query::<audit::ProofQuery>),
    },
    Handler {
        operation: "audit_consistency",
        access: Access::Door,
        route: |m| on(m, audit::consistency),
        body: None,
        query: Some(query::<audit::ConsistencyQuery>),
    },
    Handler {
        operation: "audit_activity",
        access: Access::Door,
        route: |m| on(m, audit::activity),
        body: None,
        query: Some(query::<audit::ActivityQuery>),
    },
    Handler {
        operation: "break_glass_list",
        access: Access::Door,
        route: |m| on(m, break_glass::list),
        body: None,
        query: Some(query::<break_glass::ListQuery>),
    },
    Handler {
        operation: "break_glass_open",
        access: Access::Door,
        route: |m| on(m, break_glass::open),
        body: Some(body::<break_glass::Open>),
        query: None,
    },
    Handler {
        operation: "break_glass_show",
        access: Access::Door,
        route: |m| on(m, break_glass::show),
        body: None,
        query: None,
    },
    Handler {
        operation: "break_glass_review",
        access: Access::Door,
        route: |m| on(m, break_glass::review),
        body: Some(body::<break_glass::ReviewSignature>),
        query: None,
    },
    Handler {
        operation: "runners_list",
        access: Access::Door,
        route: |m| on(m, runners::list),
        body: None,
        query: None,
    },
    Handler {
        operation: "runners_join",
        access: Access::Open,
        route: |m| on(m, runners::join),
        body: Some(body::<crate::protocol::JoinRequest>),
        query: None,
    },
    Handler {
        operation: "runners_register",
        access: Access::Open,
        route: |m| on(m, runners::register),
        body: Some(body::<crate::protocol::RegisterRequest>),
        query: None,
    },
    Handler {
        operation: "runners_heartbeat",
        access: Access::Open,
        route: |m| on(m, runners::heartbeat),
        body: None,
        query: None,
    },
    Handler {
        operation: "passkeys_list",
        access: Access::Door,
        route: |m| on(m, passkeys::list),
        body: None,
        query: Some(query::<passkeys::ListQuery>),
    },
    Handler {
        operation: "passkeys_register_start",
        access: Access::Door,
        route: |m| on(m, passkeys::register_start),
        body: None,
        query: None,
    },
    Handler {
        operation: "passkeys_register_finish",
        access: Access::Door,
        route: |m| on(m, passkeys::register_finish),
        body: Some(body::<passkeys::Finish>),
        query: None,
    },
    Handler {
        operation: "passkeys_remove",
        access: Access::Door,
        route: |m| on(m, passkeys::remove),
        body: None,
        query: None,
    },
];

/// The handler of `operation`.
pub(crate) fn handler(operation: &str) -> Option<&'static Handler> {
    HANDLERS.iter().find(|h| h.operation == operation)
}

/// The open routes and the routes behind the door, mounted from the document's operations;
/// or why the table and the document disagree.
pub(crate) fn try_routes() -> Result<(Router<HttpState>, Router<HttpState>), String> {
    let mut open = Router::new();
    let mut door = Router::new();
    let mut used = std::collections::BTreeSet::new();
    for op in openapi::operations() {
        let h = handler(&op.id).ok_or_else(|| {
            format!(
                "openapi.yaml: {} {} (`{}`) has no handler in api::HANDLERS",
                op.method, op.path, op.id
            )
        })?;
        if !used.insert(h.operation) {
            return Err(format!(
                "openapi.yaml: operationId `{}` is used twice",
                op.id
            ));
        }
        if h.access != op.access {
            return Err(format!(
                "openapi.yaml: {} {} (`{}`) says {:?}, api::HANDLERS says {:?}",
                op.method, op.path, op.id, op.access, h.access
            ));
        }
        let route = (h.route)(op.filter);
        match h.access {
            Access::Open => open = open.route(&op.path, route),
            Access::Door => door = door.route(&op.path, route),
        }
    }
    if let Some(h) = HANDLERS.iter().find(|h| !used.contains(h.operation)) {
        return Err(format!(
            "api::HANDLERS: `{}` is no operation of openapi.yaml: document it",
            h.operation
        ));
    }
    Ok((open, door))
}

/// [`try_routes`], which `cargo test --lib api::` proves consistent.
pub(crate) fn routes() -> (Router<HttpState>, Router<HttpState>) {
    try_routes().expect("the API table and openapi.yaml agree (tested)")
}
