//! The provider's metadata: OpenID Connect Discovery (`/.well-known/openid-configuration`) and,
//! for a plain OAuth authorization server, RFC 8414 (`/.well-known/oauth-authorization-server`).
//!
//! *Invariant:* a document is accepted only when its `issuer` is exactly the configured issuer
//! (OpenID Connect Discovery §4.3, RFC 8414 §3.3), so a document fetched from one place cannot
//! make the server trust keys or endpoints of another issuer; and every endpoint it names is
//! `https://` (or loopback `http://`).

use serde::Deserialize;

use super::config::check_url;
use super::fetch::{FetchError, METADATA_LIMIT, get_json};

/// The fields of the metadata emisar uses. Unknown fields are ignored (providers add many).
#[derive(Debug, Clone, Deserialize)]
pub struct ProviderMetadata {
    pub issuer: String,
    #[serde(default)]
    pub authorization_endpoint: Option<String>,
    #[serde(default)]
    pub token_endpoint: Option<String>,
    pub jwks_uri: String,
    #[serde(default)]
    pub userinfo_endpoint: Option<String>,
    #[serde(default)]
    pub end_session_endpoint: Option<String>,
    #[serde(default)]
    pub registration_endpoint: Option<String>,
    #[serde(default)]
    pub scopes_supported: Option<Vec<String>>,
    #[serde(default)]
    pub code_challenge_methods_supported: Option<Vec<String>>,
    #[serde(default)]
    pub token_endpoint_auth_methods_supported: Option<Vec<String>>,
    #[serde(default)]
    pub id_token_signing_alg_values_supported: Option<Vec<String>>,
    /// RFC 9207: when true the provider names itself in every authorization response, and a
    /// response without `iss` must be refused.
    #[serde(default)]
    pub authorization_response_iss_parameter_supported: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    #[error("failed to fetch the provider's metadata: {0}")]
    Fetch(#[from] FetchError),
    #[error("the metadata at {url} names issuer `{found}`, not the configured issuer `{expected}`")]
    IssuerMismatch {
        url: String,
        expected: String,
        found: String,
    },
    #[error("the provider's metadata is unusable: {0}")]
    Invalid(String),
    #[error("no metadata found for issuer `{issuer}`: {tried}")]
    NotFound { issuer: String, tried: String },
}

/// `issuer` + `/.well-known/openid-configuration` (OpenID Connect Discovery §4: appended).
pub(crate) fn openid_configuration_url(issuer: &str) -> String {
    format!(
        "{}/.well-known/openid-configuration",
        issuer.trim_end_matches('/')
    )
}

/// RFC 8414 §3.1: the well-known segment goes between the host and the issuer's path.
pub(crate) fn oauth_authorization_server_url(issuer: &str) -> String {
    well_known_inserted(issuer, "oauth-authorization-server")
}

/// `scheme://host[:port]/.well-known/<name><path>`: the RFC 8414 / RFC 9728 construction.
pub(crate) fn well_known_inserted(url: &str, name: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("https", url));
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let path = path.trim_end_matches('/');
    format!("{scheme}://{authority}/.well-known/{name}{path}")
}

impl ProviderMetadata {
    /// Checks the document against the configured issuer and for usable endpoints.
    pub(crate) fn check(&self, url: &str, expected_issuer: &str) -> Result<(), DiscoveryError> {
        if self.issuer != expected_issuer {
            return Err(DiscoveryError::IssuerMismatch {
                url: url.to_owned(),
                expected: expected_issuer.to_owned(),
                found: self.issuer.clone(),
            });
        }
        let invalid = |e: anyhow::Error| DiscoveryError::Invalid(format!("{e:#}"));
        check_url("jwks_uri", &self.jwks_uri).map_err(invalid)?;
        for (name, value) in [
            ("authorization_endpoint", &self.authorization_endpoint),
            ("token_endpoint", &self.token_endpoint),
            ("userinfo_endpoint", &self.userinfo_endpoint),
            ("end_session_endpoint", &self.end_session_endpoint),
        ] {
            if let Some(v) = value {
                check_url(name, v).map_err(invalid)?;
            }
        }
        Ok(())
    }

    /// What the authorization code flow needs: both endpoints, and PKCE with S256 when the
    /// provider lists its PKCE methods at all (many that support it do not say so).
    pub fn code_flow_endpoints(&self) -> Result<(&str, &str), DiscoveryError> {
        let (Some(auth), Some(token)) = (&self.authorization_endpoint, &self.token_endpoint) else {
            return Err(DiscoveryError::Invalid(
                "authorization_endpoint and token_endpoint are required for sign-in".into(),
            ));
        };
        if let Some(methods) = &self.code_challenge_methods_supported
            && !methods.iter().any(|m| m == "S256")
        {
            return Err(DiscoveryError::Invalid(format!(
                "code_challenge_methods_supported is {methods:?}: PKCE with S256 is required"
            )));
        }
        Ok((auth, token))
    }
}

/// Fetches and checks the OpenID Connect discovery document of `issuer`.
pub async fn discover_openid(
    http: &reqwest::Client,
    issuer: &str,
) -> Result<ProviderMetadata, DiscoveryError> {
    let url = openid_configuration_url(issuer);
    let meta: ProviderMetadata = get_json(http, &url, METADATA_LIMIT).await?;
    meta.check(&url, issuer)?;
    Ok(meta)
}

/// Metadata of an OAuth authorization server: OpenID Connect Discovery first (Keycloak, Okta,
/// Entra ID, oidc-provider all serve it), then RFC 8414's path-inserted document. Only a 404
/// moves on to the next; any other failure is the answer.
pub(crate) async fn discover_authorization_server(
    http: &reqwest::Client,
    issuer: &str,
) -> Result<ProviderMetadata, DiscoveryError> {
    let mut tried = Vec::new();
    for url in [
        openid_configuration_url(issuer),
        oauth_authorization_server_url(issuer),
    ] {
        match get_json::<ProviderMetadata>(http, &url, METADATA_LIMIT).await {
            Ok(meta) => {
                meta.check(&url, issuer)?;
                return Ok(meta);
            }
            Err(FetchError::Status { status: 404, .. }) => tried.push(format!("{url} (404)")),
            Err(e) => return Err(e.into()),
        }
    }
    Err(DiscoveryError::NotFound {
        issuer: issuer.to_owned(),
        tried: tried.join(", "),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(issuer: &str) -> ProviderMetadata {
        serde_json::from_value(serde_json::json!({
            "issuer": issuer,
            "authorization_endpoint": "https://sso.example.com/auth",
            "token_endpoint": "https://sso.example.com/token",
            "jwks_uri": "https://sso.example.com/jwks",
            "code_challenge_methods_supported": ["plain", "S256"],
            "unknown_field": 1,
        }))
        .unwrap()
    }

    #[test]
    fn well_known_urls() {
        assert_eq!(
            openid_configuration_url("https://sso.example.com/realms/ops/"),
            "https://sso.example.com/realms/ops/.well-known/openid-configuration"
        );
        assert_eq!(
            oauth_authorization_server_url("https://sso.example.com/tenant1"),
            "https://sso.example.com/.well-known/oauth-authorization-server/tenant1"
        );
        assert_eq!(
            well_known_inserted("http://127.0.0.1:7700/mcp", "oauth-protected-resource"),
            "http://127.0.0.1:7700/.well-known/oauth-protected-resource/mcp"
        );
        assert_eq!(
            well_known_inserted("https://emisar.example.com", "oauth-protected-resource"),
            "https://emisar.example.com/.well-known/oauth-protected-resource"
        );
    }

    #[test]
    fn the_issuer_must_match_exactly() {
        let m = meta("https://sso.example.com");
        m.check("u", "https://sso.example.com").unwrap();
        let e = m.check("u", "https://sso.example.com/").unwrap_err();
        assert!(
            e.to_string()
                .contains("names issuer `https://sso.example.com`, not the configured issuer `https://sso.example.com/`"),
            "{e}"
        );
    }

    #[test]
    fn endpoints_must_be_https() {
        let mut m = meta("https://sso.example.com");
        m.token_endpoint = Some("http://sso.example.com/token".into());
        let e = m.check("u", "https://sso.example.com").unwrap_err();
        assert!(e.to_string().contains("token_endpoint"), "{e}");
    }

    #[test]
    fn pkce_s256_is_required_when_listed() {
        let mut m = meta("https://sso.example.com");
        m.code_flow_endpoints().unwrap();
        m.code_challenge_methods_supported = Some(vec!["plain".into()]);
        let e = m.code_flow_endpoints().unwrap_err();
        assert!(e.to_string().contains("S256"), "{e}");
        m.code_challenge_methods_supported = None;
        m.code_flow_endpoints().unwrap();
        m.token_endpoint = None;
        assert!(m.code_flow_endpoints().is_err());
    }
}
