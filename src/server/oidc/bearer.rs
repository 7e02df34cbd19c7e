//! OAuth access tokens on `/mcp`: a bearer token that is not one of emisar's own (`emt_…`) is
//! verified as a JWT from the configured authorization server, and the agent its claim names
//! becomes the request's [`Principal`], governed by the policy exactly like a token agent of
//! that name (same tools, runners, rate limit bucket and audit actor `agent:<name>`).
//!
//! *Invariants:* a refused or missing token gets a 401 whose `WWW-Authenticate` points to the
//! protected-resource metadata (403 for a missing scope, RFC 6750 §3.1), with the check that
//! failed named; no part of the token is logged. An MCP session opened with an access token is
//! bound to the client and subject it came from (not to the token, which the client refreshes
//! every few minutes), so another client or person cannot take it over.

use axum::Json;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::identity::AgentTokens;
use super::jwt::{TokenError, unix_now};
use super::resource::{AccessError, OAuthAgent, challenge, metadata_document};
use crate::digest::{canonical_json, sha256_hex};
use crate::server::principal::{Principal, Role};

/// Why a bearer token did not name an agent.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// The token was checked and refused.
    Token(AccessError),
    /// The authorization server's metadata or keys cannot be had: nothing can be verified.
    Unavailable(String),
}

/// What an MCP session opened with an access token is bound to: the issuer, the agent, the
/// client and the subject (and the person acted for), hashed to a fixed length.
fn binding(issuer: &str, agent: &OAuthAgent) -> String {
    let who = json!([
        issuer,
        agent.agent,
        agent.client_id,
        agent.subject,
        agent.on_behalf_of
    ]);
    format!(
        "oauth:{}",
        &sha256_hex(canonical_json(&who).as_bytes())[..32]
    )
}

/// The caller an accepted access token stands for.
pub(crate) fn principal_of(issuer: &str, agent: OAuthAgent) -> Principal {
    Principal {
        token_id: binding(issuer, &agent),
        name: agent.agent,
        role: Role::Agent,
        roles: vec![Role::Agent],
        selector: None,
        on_behalf_of: agent.on_behalf_of,
    }
}

impl AgentTokens {
    /// The agent `token` names, if the authorization server issued it for emisar.
    pub(crate) async fn principal(&self, token: &str) -> Result<Principal, Refusal> {
        let rs = self.resource.get().map_err(Refusal::Unavailable)?;
        match rs.authenticate(token, unix_now()).await {
            Ok(agent) => Ok(principal_of(&self.config.issuer, agent)),
            Err(AccessError::Token(TokenError::KeySet(e))) => Err(Refusal::Unavailable(format!(
                "the authorization server's keys cannot be fetched: {e}"
            ))),
            Err(e) => Err(Refusal::Token(e)),
        }
    }

    /// 401 for a request to `/mcp` without a usable credential: the challenge says where the
    /// metadata is, so an MCP client can go and get a token.
    pub(crate) fn unauthorized(&self, message: &str) -> Response {
        (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, challenge(&self.config, None))],
            Json(json!({"error": message})),
        )
            .into_response()
    }

    /// The answer to a refused token.
    pub(crate) fn refused(&self, refusal: Refusal) -> Response {
        match refusal {
            Refusal::Token(e) => {
                crate::server::metrics::oauth_refused(e.code());
                tracing::info!(check = e.code(), error = %e, "an OAuth access token was refused");
                let status = if e.oauth_error() == "insufficient_scope" {
                    StatusCode::FORBIDDEN
                } else {
                    StatusCode::UNAUTHORIZED
                };
                (
                    status,
                    [(header::WWW_AUTHENTICATE, challenge(&self.config, Some(&e)))],
                    Json(json!({"error": format!("the access token was refused: {e}")})),
                )
                    .into_response()
            }
            Refusal::Unavailable(problem) => {
                crate::server::metrics::oauth_refused("authorization_server_unavailable");
                tracing::warn!(error = %problem, "an OAuth access token could not be checked");
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    [(header::RETRY_AFTER, "5")],
                    Json(json!({"error": format!("the access token cannot be checked now: {problem}")})),
                )
                    .into_response()
            }
        }
    }

    /// `GET /.well-known/oauth-protected-resource[/…]`: the RFC 9728 document.
    pub(crate) fn metadata(&self) -> Response {
        Json(metadata_document(&self.config)).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(client: &str, sub: &str) -> OAuthAgent {
        OAuthAgent {
            agent: "deploy-bot".into(),
            on_behalf_of: None,
            subject: Some(sub.into()),
            client_id: Some(client.into()),
            scopes: vec![],
            expires_at: 0,
            token_id: Some("j1".into()),
        }
    }

    #[test]
    fn sessions_bind_to_the_client_and_subject_not_the_token() {
        let a = principal_of("https://sso", agent("c1", "s1"));
        let mut refreshed = agent("c1", "s1");
        refreshed.token_id = Some("j2".into());
        refreshed.expires_at = 99;
        assert_eq!(a.token_id, principal_of("https://sso", refreshed).token_id);
        assert_ne!(
            a.token_id,
            principal_of("https://sso", agent("c2", "s1")).token_id
        );
        assert_ne!(
            a.token_id,
            principal_of("https://sso", agent("c1", "s2")).token_id
        );
        assert_ne!(
            a.token_id,
            principal_of("https://other", agent("c1", "s1")).token_id
        );
        assert!(a.token_id.starts_with("oauth:") && a.token_id.len() == 38);
        assert_eq!(a.actor(), "agent:deploy-bot");
    }
}
