//! `/mcp` as an OAuth 2.1 protected resource (MCP authorization): the protected-resource
//! metadata document (RFC 9728), the `WWW-Authenticate` challenge that points to it, and the
//! verification of a JWT access token (RFC 9068) into an agent name and, optionally, the
//! person the agent acts for.
//!
//! *Invariants:* a token is accepted only when its signature verifies against the
//! authorization server's key set, its `iss` is the configured issuer, its `aud` contains
//! emisar's resource identifier (a token obtained for another resource, or an ID token, is
//! refused), it is within `exp`/`nbf`, it carries the required scope when one is configured,
//! and its agent claim is an agent name the policy can know.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

use super::claims::{ClaimError, agent_name, on_behalf_of};
use super::config::OAuthConfig;
use super::discovery::{
    DiscoveryError, ProviderMetadata, discover_authorization_server, well_known_inserted,
};
use super::fetch::client;
use super::jwks::JwksCache;
use super::jwt::{Claims, Expected, TokenError, check_claims, verify_signature};

/// The RFC 9728 protected-resource metadata document.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ProtectedResourceMetadata {
    pub resource: String,
    pub authorization_servers: Vec<String>,
    pub scopes_supported: Vec<String>,
    pub bearer_methods_supported: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource_name: Option<String>,
}

/// The agent an access token speaks for.
#[derive(Debug, Clone, PartialEq)]
pub struct OAuthAgent {
    /// The agent name from `agent_claim`; the policy governs it like a token agent's name.
    pub agent: String,
    /// `person:<value>` from `on_behalf_of_claim`, when configured and present.
    pub on_behalf_of: Option<String>,
    /// The token's `sub` (for a client-credentials token, usually the client id).
    pub subject: Option<String>,
    pub client_id: Option<String>,
    pub scopes: Vec<String>,
    /// Unix seconds; a session bound to this token should not outlive it.
    pub expires_at: i64,
    /// The token's `jti`, when it has one: what an MCP session can be bound to.
    pub token_id: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    #[error("{0}")]
    Token(#[from] TokenError),
    #[error("the token cannot name an agent: {0}")]
    Claim(#[from] ClaimError),
}

impl AccessError {
    /// A short, stable name for metrics and logs.
    pub(crate) fn code(&self) -> &'static str {
        match self {
            AccessError::Token(t) => t.code(),
            AccessError::Claim(_) => "agent_claim",
        }
    }

    /// RFC 6750 §3.1: a missing scope is `insufficient_scope` (403); every other refusal of
    /// a presented token is `invalid_token` (401).
    pub fn oauth_error(&self) -> &'static str {
        match self {
            AccessError::Token(TokenError::MissingScope(_)) => "insufficient_scope",
            _ => "invalid_token",
        }
    }
}

/// Where the metadata of `resource` is served: RFC 9728 §3.1 inserts the well-known segment
/// between the host and the resource's path (`/.well-known/oauth-protected-resource/mcp`).
pub(crate) fn metadata_url(resource: &str) -> String {
    well_known_inserted(resource, "oauth-protected-resource")
}

/// The path part of [`metadata_url`], for the router.
pub(crate) fn metadata_path(resource: &str) -> String {
    let url = metadata_url(resource);
    let after_scheme = url.split_once("://").map_or(url.as_str(), |(_, r)| r);
    after_scheme
        .find('/')
        .map_or_else(|| "/".to_owned(), |i| after_scheme[i..].to_owned())
}

/// A quoted-string for an HTTP header parameter (RFC 9110 §5.6.4): `"` and `\` escaped,
/// control characters dropped and anything outside printable ASCII replaced by `?`, so any
/// text makes one valid header value.
fn quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars().filter(|c| !c.is_control()) {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(if c.is_ascii() { c } else { '?' });
    }
    out.push('"');
    out
}

/// The `WWW-Authenticate` value of a 401 (or 403) from `/mcp`: `Bearer
/// resource_metadata="…"`, plus `error`, `error_description` and `scope` when a token was
/// presented and refused. (A request without a token gets no `error`: RFC 6750 §3.1.)
pub(crate) fn www_authenticate(
    resource_metadata_url: &str,
    refusal: Option<&AccessError>,
    scope: Option<&str>,
) -> String {
    let mut v = format!("Bearer resource_metadata={}", quoted(resource_metadata_url));
    if let Some(e) = refusal {
        v.push_str(&format!(
            ", error={}, error_description={}",
            quoted(e.oauth_error()),
            quoted(&e.to_string())
        ));
    }
    if let Some(scope) = scope {
        v.push_str(&format!(", scope={}", quoted(scope)));
    }
    v
}

/// The RFC 9728 document of the resource `config` describes. It needs no discovery, so it is
/// served even while the authorization server cannot be reached.
pub(crate) fn metadata_document(config: &OAuthConfig) -> ProtectedResourceMetadata {
    ProtectedResourceMetadata {
        resource: config.resource.clone(),
        authorization_servers: vec![config.issuer.clone()],
        scopes_supported: config.scopes_supported.clone(),
        bearer_methods_supported: vec!["header".into()],
        resource_name: Some("emisar".into()),
    }
}

/// The challenge of a 401 from the resource `config` describes (no discovery needed).
pub(crate) fn challenge(config: &OAuthConfig, refusal: Option<&AccessError>) -> String {
    www_authenticate(
        &metadata_url(&config.resource),
        refusal,
        config.required_scope.as_deref(),
    )
}

/// The scopes of an access token: `scope` (RFC 9068, space-separated) or `scp` (a string or
/// an array, as some providers send).
pub(crate) fn token_scopes(claims: &Claims) -> Vec<String> {
    let from = |v: &Value| match v {
        Value::String(s) => s
            .split(' ')
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect(),
        Value::Array(a) => a
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect(),
        _ => Vec::new(),
    };
    claims
        .get("scope")
        .or_else(|| claims.get("scp"))
        .map(from)
        .unwrap_or_default()
}

/// The checks after the signature, and the agent the claims name. Pure.
pub(crate) fn agent_from_claims(
    claims: &Claims,
    config: &OAuthConfig,
    now: i64,
) -> Result<OAuthAgent, AccessError> {
    check_claims(
        claims,
        &Expected {
            issuer: &config.issuer,
            audience: &config.resource,
            now,
            leeway_secs: config.leeway_secs,
            require_iat: false,
        },
    )?;
    let scopes = token_scopes(claims);
    if let Some(required) = &config.required_scope
        && !scopes.iter().any(|s| s == required)
    {
        return Err(TokenError::MissingScope(required.clone()).into());
    }
    let text = |k: &str| claims.get(k).and_then(Value::as_str).map(str::to_owned);
    Ok(OAuthAgent {
        agent: agent_name(claims, &config.agent_claim)?,
        on_behalf_of: on_behalf_of(claims, config.on_behalf_of_claim.as_deref())?,
        subject: text("sub"),
        client_id: text("client_id").or_else(|| text("azp")),
        scopes,
        expires_at: claims
            .get("exp")
            .and_then(Value::as_i64)
            .unwrap_or_default(),
        token_id: text("jti"),
    })
}

/// The protected resource: config, the authorization server's metadata and key set.
pub struct ProtectedResource {
    config: OAuthConfig,
    metadata: ProviderMetadata,
    jwks: Arc<JwksCache>,
}

impl ProtectedResource {
    /// Checks the config and discovers the authorization server.
    pub async fn discover(config: OAuthConfig) -> Result<Self, ResourceSetupError> {
        config.check().map_err(ResourceSetupError::Config)?;
        let http = client(Duration::from_millis(config.http_timeout_ms));
        let metadata = discover_authorization_server(&http, &config.issuer).await?;
        let jwks = Arc::new(JwksCache::new(
            http,
            metadata.jwks_uri.clone(),
            Duration::from_secs(config.jwks_min_refresh_secs),
        ));
        Ok(ProtectedResource {
            config,
            metadata,
            jwks,
        })
    }

    pub fn config(&self) -> &OAuthConfig {
        &self.config
    }

    pub fn authorization_server(&self) -> &ProviderMetadata {
        &self.metadata
    }

    pub fn jwks(&self) -> &Arc<JwksCache> {
        &self.jwks
    }

    /// The RFC 9728 document served at [`metadata_url`].
    pub fn metadata_document(&self) -> ProtectedResourceMetadata {
        metadata_document(&self.config)
    }

    pub fn metadata_url(&self) -> String {
        metadata_url(&self.config.resource)
    }

    /// The challenge for a request to `/mcp` without a usable token.
    pub fn challenge(&self, refusal: Option<&AccessError>) -> String {
        challenge(&self.config, refusal)
    }

    /// Verifies a bearer token (the part after `Bearer `); `now` in Unix seconds.
    pub async fn authenticate(&self, token: &str, now: i64) -> Result<OAuthAgent, AccessError> {
        let claims = verify_signature(token, &self.jwks).await?;
        agent_from_claims(&claims, &self.config, now)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ResourceSetupError {
    #[error("{0:#}")]
    Config(anyhow::Error),
    #[error(transparent)]
    Discovery(#[from] DiscoveryError),
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    const NOW: i64 = 1_800_000_000;

    fn config() -> OAuthConfig {
        toml::from_str(
            "issuer = \"https://sso.example.com\"\nresource = \"https://emisar.example.com/mcp\"\non_behalf_of_claim = \"act_for\"",
        )
        .unwrap()
    }

    fn claims(v: Value) -> Claims {
        v.as_object().unwrap().clone()
    }

    fn good() -> Claims {
        claims(
            json!({"iss": "https://sso.example.com", "aud": "https://emisar.example.com/mcp",
                      "exp": NOW + 300, "client_id": "deploy-bot", "sub": "deploy-bot",
                      "scope": "mcp:tools other", "jti": "j1"}),
        )
    }

    #[test]
    fn metadata_urls_insert_the_well_known_segment() {
        assert_eq!(
            metadata_url("https://emisar.example.com/mcp"),
            "https://emisar.example.com/.well-known/oauth-protected-resource/mcp"
        );
        assert_eq!(
            metadata_path("http://127.0.0.1:7700/mcp"),
            "/.well-known/oauth-protected-resource/mcp"
        );
        assert_eq!(
            metadata_path("https://emisar.example.com"),
            "/.well-known/oauth-protected-resource"
        );
    }

    #[test]
    fn challenge_values() {
        let url = "https://e.example.com/.well-known/oauth-protected-resource/mcp";
        assert_eq!(
            www_authenticate(url, None, None),
            format!("Bearer resource_metadata=\"{url}\"")
        );
        let refusal = AccessError::Token(TokenError::UnknownKey {
            kid: "k\"1\r\nX-Injected: 1".into(),
        });
        let v = www_authenticate(url, Some(&refusal), Some("mcp:tools"));
        assert!(v.starts_with(&format!("Bearer resource_metadata=\"{url}\", error=\"invalid_token\", error_description=\"the token is signed by key `k\\\"1X-Injected: 1`")), "{v}");
        assert!(v.ends_with(", scope=\"mcp:tools\""), "{v}");
        assert!(!v.contains('\r') && !v.contains('\n'));
        let scope = AccessError::Token(TokenError::MissingScope("mcp:tools".into()));
        assert!(www_authenticate(url, Some(&scope), None).contains("error=\"insufficient_scope\""));
    }

    #[test]
    fn a_good_token_names_its_agent_and_person() {
        let mut c = good();
        c.insert("act_for".into(), json!("alice"));
        let a = agent_from_claims(&c, &config(), NOW).unwrap();
        assert_eq!(a.agent, "deploy-bot");
        assert_eq!(a.on_behalf_of.as_deref(), Some("person:alice"));
        assert_eq!(a.scopes, ["mcp:tools", "other"]);
        assert_eq!(a.token_id.as_deref(), Some("j1"));
        assert_eq!(a.expires_at, NOW + 300);
        let headless = agent_from_claims(&good(), &config(), NOW).unwrap();
        assert_eq!(headless.on_behalf_of, None);
    }

    #[test]
    fn refusals() {
        let mut cfg = config();
        let mut c = good();
        c.insert("aud".into(), json!("https://other.example.com/mcp"));
        let e = agent_from_claims(&c, &cfg, NOW).unwrap_err();
        assert!(
            e.to_string()
                .contains("not for `https://emisar.example.com/mcp`"),
            "{e}"
        );
        assert_eq!(e.oauth_error(), "invalid_token");

        cfg.required_scope = Some("admin".into());
        let e = agent_from_claims(&good(), &cfg, NOW).unwrap_err();
        assert_eq!(e.oauth_error(), "insufficient_scope");

        let mut c = good();
        c.remove("client_id");
        let e = agent_from_claims(&c, &config(), NOW).unwrap_err();
        assert!(e.to_string().contains("has no `client_id` claim"), "{e}");
        c.insert("client_id".into(), json!("../etc"));
        assert!(
            agent_from_claims(&c, &config(), NOW)
                .unwrap_err()
                .to_string()
                .contains("agent name")
        );
    }

    #[test]
    fn scopes_from_scope_or_scp() {
        assert_eq!(
            token_scopes(&claims(json!({"scp": ["a", 1, "b"]}))),
            ["a", "b"]
        );
        assert_eq!(token_scopes(&claims(json!({"scp": "a  b"}))), ["a", "b"]);
        assert!(token_scopes(&claims(json!({}))).is_empty());
    }

    proptest! {
        /// A header value built from any refusal text never carries a line break or an
        /// unescaped quote that would end the parameter early.
        #[test]
        fn challenges_stay_one_header(kid in any::<String>()) {
            let e = AccessError::Token(TokenError::UnknownKey { kid });
            let v = www_authenticate("https://e.example.com/x", Some(&e), None);
            prop_assert!(!v.chars().any(|c| c.is_control()));
            let desc = v.split_once("error_description=\"").unwrap().1;
            let mut escaped = false;
            let mut closed_at = None;
            for (i, c) in desc.char_indices() {
                if escaped { escaped = false; continue; }
                if c == '\\' { escaped = true; continue; }
                if c == '"' { closed_at = Some(i); break; }
            }
            prop_assert_eq!(closed_at, Some(desc.len() - 1));
        }
    }
}
