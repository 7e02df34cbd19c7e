//! Identity from the organisation's own provider: OpenID Connect sign-in for people, and MCP's
//! OAuth authorization (emisar as a protected resource) for agents.
//!
//! - [`config`]: `[oidc]` and `[oauth]` in emisar.toml, with `check()`.
//! - [`fetch`]: HTTP to the provider (timeouts, no redirects, bounded bodies).
//! - [`discovery`]: the provider's metadata, its issuer checked.
//! - [`jwks`]: the provider's signing keys, cached, refreshed on an unknown `kid` (rate
//!   limited).
//! - [`jwt`]: signature and registered-claim checks shared by both token kinds.
//! - [`id_token`]: ID token checks (audience = client id, `azp`, `nonce`).
//! - [`login`]: the authorization code flow with PKCE, state and nonce.
//! - [`claims`]: claims → a person's audit identity and roles, an agent's name.
//! - [`resource`]: RFC 9728 metadata, the `WWW-Authenticate` challenge, access-token checks.
//! - [`logout`]: back-channel logout tokens (the provider ends a person's session).
//! - [`startup`]: a provider that is down at start is discovered later, in the background.
//!
//! Wired into the server:
//! - [`identity`]: what `[oidc]` and `[oauth]` in emisar.toml switch on, built at start.
//! - [`sessions`]: portal sessions of people signed in through the provider.
//! - [`web`]: the portal's sign-in routes (start, callback, back-channel logout, options).
//! - [`bearer`]: OAuth access tokens on `/mcp` → the agent they name.

pub mod bearer;
pub mod claims;
pub mod config;
pub mod discovery;
pub mod fetch;
pub mod id_token;
pub mod identity;
pub mod jwks;
pub mod jwt;
pub mod login;
pub mod logout;
pub mod resource;
pub mod sessions;
pub mod startup;
