//! What `[oidc]` and `[oauth]` in emisar.toml switch on, built once when the server starts:
//! the portal's "Sign in with …" (people), `/mcp` as an OAuth protected resource (agents), and
//! whether password login stays on.
//!
//! *Invariants:* a configuration mistake (a missing client secret, no redirect URL) stops the
//! server at start with the field named; a provider that cannot be reached does not: start
//! waits for one discovery attempt at most (bounded by `http_timeout_ms`), then keeps trying
//! in the background ([`Discovered`]) while local login and emisar's own tokens work.

use std::sync::Arc;

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use super::config::{OAuthConfig, OidcConfig};
use super::login::{OidcLogin, SetupError, redirect_url};
use super::resource::{ProtectedResource, ResourceSetupError};
use super::startup::Discovered;

/// People sign in through the organisation's OpenID provider.
pub struct PeopleSignIn {
    pub config: OidcConfig,
    /// Where the provider sends the browser back (registered at the provider).
    pub redirect_url: String,
    pub login: Arc<Discovered<OidcLogin>>,
}

/// Agents present access tokens from the authorization server on `/mcp`.
pub struct AgentTokens {
    pub config: OAuthConfig,
    pub resource: Arc<Discovered<ProtectedResource>>,
}

/// The server's identity providers, if any.
pub struct Identity {
    /// Whether the portal offers password login; off only when `oidc.local_login = false`.
    pub local_login: bool,
    pub people: Option<PeopleSignIn>,
    pub agents: Option<AgentTokens>,
}

impl Identity {
    /// Local users and emisar tokens only.
    pub fn local_only() -> Identity {
        Identity {
            local_login: true,
            people: None,
            agents: None,
        }
    }

    /// Builds what the config asks for and discovers the providers (see the module invariants).
    pub(crate) async fn start(
        oidc: Option<&OidcConfig>,
        oauth: Option<&OAuthConfig>,
        public_url: Option<&str>,
        shutdown: &CancellationToken,
    ) -> anyhow::Result<Identity> {
        let people = match oidc {
            None => None,
            Some(cfg) => Some(start_people(cfg.clone(), public_url, shutdown).await?),
        };
        let agents = match oauth {
            None => None,
            Some(cfg) => Some(start_agents(cfg.clone(), shutdown).await?),
        };
        Ok(Identity {
            local_login: oidc.is_none_or(|c| c.local_login),
            people,
            agents,
        })
    }
}

async fn start_people(
    config: OidcConfig,
    public_url: Option<&str>,
    shutdown: &CancellationToken,
) -> anyhow::Result<PeopleSignIn> {
    config.check()?;
    let redirect = redirect_url(&config, public_url)?;
    // Read now, so a missing secret stops the start instead of every later discovery.
    config.client_secret()?;
    let what = "the OpenID provider";
    let login = match OidcLogin::discover(config.clone(), redirect.clone()).await {
        Ok(login) => Discovered::ready(what, login),
        Err(SetupError::Config(e)) => return Err(e.context("[oidc]")),
        Err(SetupError::Discovery(e)) => {
            let (cfg, url) = (config.clone(), redirect.clone());
            Discovered::retrying(
                what,
                format!("{}: {e}", config.issuer),
                move || {
                    let (cfg, url) = (cfg.clone(), url.clone());
                    async move {
                        let issuer = cfg.issuer.clone();
                        OidcLogin::discover(cfg, url)
                            .await
                            .map_err(|e| format!("{issuer}: {e}"))
                    }
                },
                shutdown.clone(),
            )
        }
    };
    Ok(PeopleSignIn {
        config,
        redirect_url: redirect,
        login,
    })
}

async fn start_agents(
    config: OAuthConfig,
    shutdown: &CancellationToken,
) -> anyhow::Result<AgentTokens> {
    config.check()?;
    let what = "the OAuth authorization server";
    let resource = match ProtectedResource::discover(config.clone()).await {
        Ok(rs) => Discovered::ready(what, rs),
        Err(ResourceSetupError::Config(e)) => return Err(e).context("[oauth]"),
        Err(ResourceSetupError::Discovery(e)) => {
            let cfg = config.clone();
            Discovered::retrying(
                what,
                format!("{}: {e}", config.issuer),
                move || {
                    let cfg = cfg.clone();
                    async move {
                        let issuer = cfg.issuer.clone();
                        ProtectedResource::discover(cfg)
                            .await
                            .map_err(|e| format!("{issuer}: {e}"))
                    }
                },
                shutdown.clone(),
            )
        }
    };
    Ok(AgentTokens { config, resource })
}
