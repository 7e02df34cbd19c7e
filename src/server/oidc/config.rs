//! `[oidc]` (people sign in with the organisation's OpenID provider) and `[oauth]` (MCP clients
//! present access tokens from an OAuth authorization server) in emisar.toml.
//!
//! Unknown keys are errors, and `check()` names the field and the rule it broke, so a typo
//! never leaves a default silently in place. Secrets are never in the file itself: the client
//! secret is read from a file or an environment variable, and its `Debug` prints nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use anyhow::{Context, bail};
use serde::Deserialize;

/// The roles an OpenID group can grant. Agents are never made from a person's groups.
#[derive(
    schemars::JsonSchema, Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum PersonRole {
    /// Decides approval requests (and reads the audit log).
    Approver,
    /// Reads the audit log.
    Auditor,
    /// Everything an approver and an auditor may do.
    Admin,
}

impl PersonRole {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            PersonRole::Approver => "approver",
            PersonRole::Auditor => "auditor",
            PersonRole::Admin => "admin",
        }
    }
}

/// How emisar authenticates itself at the provider's token endpoint.
#[derive(
    schemars::JsonSchema, Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, Deserialize, Default,
)]
#[serde(rename_all = "snake_case")]
pub enum TokenAuthMethod {
    /// HTTP Basic with the form-encoded client id and secret (RFC 6749 §2.3.1).
    #[default]
    ClientSecretBasic,
    /// `client_id` and `client_secret` in the form body.
    ClientSecretPost,
    /// A public client: no secret, PKCE alone binds the code to this server.
    None,
}

/// `[oidc]`: people sign in to the portal with the organisation's OpenID provider.
#[derive(schemars::JsonSchema, Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OidcConfig {
    /// The provider's issuer URL, exactly as its discovery document states it (e.g.
    /// `https://sso.example.com/realms/ops`). `https://` is required except on loopback.
    /// Required.
    pub issuer: String,
    /// The client id registered for emisar at the provider. Required.
    pub client_id: String,
    /// A file holding the client secret (surrounding whitespace is ignored). At most one of
    /// `client_secret_file` and `client_secret_env`; neither means a public client, which
    /// needs `token_auth_method = "none"`. Default: none. E.g. `/etc/emisar/oidc-secret`.
    #[serde(default)]
    pub client_secret_file: Option<PathBuf>,
    /// An environment variable holding the client secret. Default: none.
    #[serde(default)]
    pub client_secret_env: Option<String>,
    /// How emisar authenticates at the token endpoint: `client_secret_basic`,
    /// `client_secret_post` or `none`. Default: `client_secret_basic`.
    #[serde(default)]
    pub token_auth_method: TokenAuthMethod,
    /// The name on the portal's "Sign in with …" button. Default: `OpenID Connect`.
    #[serde(default = "default_display_name")]
    pub display_name: String,
    /// Scopes asked for; must include `openid`. Default: `["openid", "profile", "email"]`;
    /// add the provider's group scope when it has one, e.g.
    /// `scopes = ["openid", "profile", "email", "groups"]`.
    #[serde(default = "default_scopes")]
    pub scopes: Vec<String>,
    /// Where the provider sends the browser back, registered at the provider. Default:
    /// `<public_url>/login/oidc/callback`, e.g. `https://emisar.example.internal/login/oidc/callback`.
    #[serde(default)]
    pub redirect_url: Option<String>,
    /// The ID token claim that lists the person's groups: a claim name, or a dotted path into
    /// nested objects (`realm_access.roles`); a name that exists as a whole (such as a URL)
    /// wins over the path reading. A string counts as one group. Default: `groups`.
    #[serde(default = "default_roles_claim")]
    pub roles_claim: String,
    /// Group → roles: `approver = ["ops-approvers"]`, `auditor = [...]`, `admin = [...]`. A
    /// person in none of the listed groups is signed in with no role and can approve nothing.
    /// Default: empty (nobody gets a role from the provider).
    #[serde(default)]
    pub roles: BTreeMap<PersonRole, Vec<String>>,
    /// The claim that names the person in the audit log, as `person:<value>`. `sub` is stable
    /// for the life of the account at this provider; `preferred_username` reads better but
    /// some providers let people change it. Default: `sub`.
    #[serde(default = "default_identity_claim")]
    pub identity_claim: String,
    /// Whether the portal still offers local (password) login next to the provider. Default:
    /// `true`.
    #[serde(default = "default_true")]
    pub local_login: bool,
    /// How long a portal session signed in through the provider lasts, in seconds (60 s to a
    /// week). A role removed at the provider takes effect at the next login at the latest.
    /// Default: 43200 (12 h).
    #[serde(default = "default_session_lifetime")]
    pub session_lifetime_secs: u64,
    /// How long a started sign-in may take before its state and nonce are forgotten, in
    /// seconds (30 to 3600). Default: 600.
    #[serde(default = "default_login_timeout")]
    pub login_timeout_secs: u64,
    /// Clock skew allowed on `exp`, `nbf` and `iat`, in seconds (0 to 300). Default: 60.
    #[serde(default = "default_leeway")]
    pub leeway_secs: u64,
    /// Timeout of each request to the provider (discovery, keys, token), in milliseconds
    /// (100 to 60000). Default: 10000.
    #[serde(default = "default_http_timeout")]
    pub http_timeout_ms: u64,
    /// The key set is fetched again on an unknown `kid` at most this often, in seconds (0 to
    /// 3600), so a flood of tokens with made-up key ids cannot hammer the provider. Default: 30.
    #[serde(default = "default_jwks_refresh")]
    pub jwks_min_refresh_secs: u64,
}

/// `[oauth]`: `/mcp` is an OAuth 2.1 protected resource (MCP authorization). Agents present a
/// JWT access token issued by the authorization server for emisar's resource identifier.
#[derive(schemars::JsonSchema, Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OAuthConfig {
    /// The authorization server's issuer URL; tokens must carry exactly this `iss`.
    /// `https://` is required except on loopback. Required.
    pub issuer: String,
    /// emisar's resource identifier (RFC 8707), normally the public URL of `/mcp`, e.g.
    /// `https://emisar.example.com/mcp`. Tokens must carry it in `aud`. Required.
    pub resource: String,
    /// Scopes named in the protected-resource metadata. Default: `["mcp:tools"]`.
    #[serde(default = "default_oauth_scopes")]
    pub scopes_supported: Vec<String>,
    /// A scope every token must carry in its `scope` claim. Default: none (the audience alone
    /// decides).
    #[serde(default)]
    pub required_scope: Option<String>,
    /// The claim that names the agent; its value must be an agent name the policy knows
    /// (letters, digits, `_ . @ -`, starting with a letter or digit, at most 128). For a
    /// headless client-credentials agent this is usually `client_id` (Keycloak: `azp`).
    /// Default: `client_id`.
    #[serde(default = "default_agent_claim")]
    pub agent_claim: String,
    /// A claim naming the person the agent acts for (e.g. `sub` or `preferred_username` on a
    /// token from the authorization code flow); audited as `on_behalf_of = person:<value>`
    /// and used to refuse self-approval. Default: none.
    #[serde(default)]
    pub on_behalf_of_claim: Option<String>,
    /// Clock skew allowed on `exp`, `nbf` and `iat`, in seconds (0 to 300). Default: 60.
    #[serde(default = "default_leeway")]
    pub leeway_secs: u64,
    /// Timeout of each request to the authorization server, in milliseconds (100 to 60000).
    /// Default: 10000.
    #[serde(default = "default_http_timeout")]
    pub http_timeout_ms: u64,
    /// The key set is fetched again on an unknown `kid` at most this often, in seconds (0 to
    /// 3600). Default: 30.
    #[serde(default = "default_jwks_refresh")]
    pub jwks_min_refresh_secs: u64,
}

fn default_display_name() -> String {
    "OpenID Connect".into()
}
fn default_scopes() -> Vec<String> {
    vec!["openid".into(), "profile".into(), "email".into()]
}
fn default_roles_claim() -> String {
    "groups".into()
}
fn default_identity_claim() -> String {
    "sub".into()
}
fn default_true() -> bool {
    true
}
fn default_session_lifetime() -> u64 {
    12 * 3600
}
fn default_login_timeout() -> u64 {
    600
}
fn default_leeway() -> u64 {
    60
}
fn default_http_timeout() -> u64 {
    10_000
}
fn default_jwks_refresh() -> u64 {
    30
}
fn default_oauth_scopes() -> Vec<String> {
    vec!["mcp:tools".into()]
}
fn default_agent_claim() -> String {
    "client_id".into()
}

/// The client secret. Its `Debug` and `Display` never show the value.
#[derive(Clone)]
pub(crate) struct ClientSecret(String);

impl std::fmt::Debug for ClientSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientSecret(..)")
    }
}

impl ClientSecret {
    /// The secret itself, for the token request only.
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

/// Where the value is allowed to be loopback-only `http://`.
fn is_loopback_http(url: &str) -> bool {
    let Some(rest) = url.strip_prefix("http://") else {
        return false;
    };
    let host = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host = match host.rsplit_once(':') {
        Some((h, port)) if !h.is_empty() && port.chars().all(|c| c.is_ascii_digit()) => h,
        _ => host,
    };
    matches!(host, "127.0.0.1" | "localhost" | "[::1]")
}

/// `https://host…`, or `http://` on loopback; no fragment; no surrounding whitespace.
pub(crate) fn check_url(field: &str, url: &str) -> anyhow::Result<()> {
    let ok_scheme = url
        .strip_prefix("https://")
        .is_some_and(|rest| !rest.is_empty() && !rest.starts_with('/'))
        || is_loopback_http(url);
    if !ok_scheme {
        bail!("{field} `{url}` must be an https:// URL (http:// only on loopback)");
    }
    if url.contains('#') || url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        bail!("{field} `{url}` must have no fragment, spaces or control characters");
    }
    Ok(())
}

fn check_claim_name(field: &str, name: &str) -> anyhow::Result<()> {
    if name.is_empty()
        || name.len() > 256
        || name.split('.').any(str::is_empty)
        || name.chars().any(|c| c.is_control() || c.is_whitespace())
    {
        bail!(
            "{field} `{name}` must be a claim name or dotted path: 1 to 256 characters, no spaces, no empty segment"
        );
    }
    Ok(())
}

fn check_range(field: &str, value: u64, min: u64, max: u64) -> anyhow::Result<()> {
    if !(min..=max).contains(&value) {
        bail!("{field} is {value}, it must be between {min} and {max}");
    }
    Ok(())
}

fn check_scope_token(field: &str, scope: &str) -> anyhow::Result<()> {
    // RFC 6749 §3.3: scope-token = 1*( %x21 / %x23-5B / %x5D-7E ).
    if scope.is_empty()
        || !scope
            .bytes()
            .all(|b| b == 0x21 || (0x23..=0x5B).contains(&b) || (0x5D..=0x7E).contains(&b))
    {
        bail!("{field} `{scope}` is not a scope token (printable ASCII, no space, `\"` or `\\`)");
    }
    Ok(())
}

impl OidcConfig {
    /// Checks what serde cannot; each error names the field and the rule.
    pub(crate) fn check(&self) -> anyhow::Result<()> {
        check_url("oidc.issuer", &self.issuer)?;
        if self.client_id.is_empty() || self.client_id.chars().any(char::is_control) {
            bail!("oidc.client_id must be non-empty and have no control characters");
        }
        match (&self.client_secret_file, &self.client_secret_env) {
            (Some(_), Some(_)) => {
                bail!("oidc.client_secret_file and oidc.client_secret_env: set at most one")
            }
            (None, None) if self.token_auth_method != TokenAuthMethod::None => bail!(
                "oidc.token_auth_method is not `none`, so oidc.client_secret_file or oidc.client_secret_env must be set"
            ),
            (Some(_), _) | (_, Some(_)) if self.token_auth_method == TokenAuthMethod::None => {
                bail!(
                    "oidc.token_auth_method is `none` (a public client): remove the client secret"
                )
            }
            _ => {}
        }
        if let Some(var) = &self.client_secret_env
            && (var.is_empty() || var.contains('=') || var.contains('\0'))
        {
            bail!("oidc.client_secret_env `{var}` must be an environment variable name");
        }
        if self.display_name.trim().is_empty() || self.display_name.chars().count() > 64 {
            bail!("oidc.display_name must be 1 to 64 characters");
        }
        if !self.scopes.iter().any(|s| s == "openid") {
            bail!("oidc.scopes must include `openid`");
        }
        for s in &self.scopes {
            check_scope_token("oidc.scopes", s)?;
        }
        if let Some(url) = &self.redirect_url {
            check_url("oidc.redirect_url", url)?;
        }
        check_claim_name("oidc.roles_claim", &self.roles_claim)?;
        check_claim_name("oidc.identity_claim", &self.identity_claim)?;
        for (role, groups) in &self.roles {
            for g in groups {
                if g.is_empty() || g.len() > 256 || g.chars().any(char::is_control) {
                    bail!(
                        "oidc.roles.{} entry `{g}` must be 1 to 256 characters without control characters",
                        role.as_str()
                    );
                }
            }
        }
        check_range(
            "oidc.session_lifetime_secs",
            self.session_lifetime_secs,
            60,
            7 * 24 * 3600,
        )?;
        check_range("oidc.login_timeout_secs", self.login_timeout_secs, 30, 3600)?;
        check_range("oidc.leeway_secs", self.leeway_secs, 0, 300)?;
        check_range("oidc.http_timeout_ms", self.http_timeout_ms, 100, 60_000)?;
        check_range(
            "oidc.jwks_min_refresh_secs",
            self.jwks_min_refresh_secs,
            0,
            3600,
        )?;
        Ok(())
    }

    /// Reads the client secret from its file or environment variable (none for a public
    /// client). The error names where it looked, never the value.
    pub(crate) fn client_secret(&self) -> anyhow::Result<Option<ClientSecret>> {
        let value = if let Some(path) = &self.client_secret_file {
            let text = std::fs::read_to_string(path).with_context(|| {
                format!("failed to read oidc.client_secret_file {}", path.display())
            })?;
            text.trim().to_owned()
        } else if let Some(var) = &self.client_secret_env {
            std::env::var(var)
                .with_context(|| format!("oidc.client_secret_env: ${var} is not set"))?
                .trim()
                .to_owned()
        } else {
            return Ok(None);
        };
        if value.is_empty() {
            bail!("the oidc client secret is empty");
        }
        Ok(Some(ClientSecret(value)))
    }

    /// Group name → the roles it grants (a group may be listed under several roles).
    pub(crate) fn group_roles(&self) -> BTreeMap<&str, BTreeSet<PersonRole>> {
        let mut map: BTreeMap<&str, BTreeSet<PersonRole>> = BTreeMap::new();
        for (role, groups) in &self.roles {
            for g in groups {
                map.entry(g.as_str()).or_default().insert(*role);
            }
        }
        map
    }
}

impl OAuthConfig {
    /// Checks what serde cannot; each error names the field and the rule.
    pub(crate) fn check(&self) -> anyhow::Result<()> {
        check_url("oauth.issuer", &self.issuer)?;
        check_url("oauth.resource", &self.resource)?;
        if self.resource.contains('?') {
            bail!(
                "oauth.resource `{}` must have no query (RFC 8707 resource indicators have none)",
                self.resource
            );
        }
        if self.scopes_supported.is_empty() {
            bail!("oauth.scopes_supported must name at least one scope");
        }
        for s in &self.scopes_supported {
            check_scope_token("oauth.scopes_supported", s)?;
        }
        if let Some(s) = &self.required_scope {
            check_scope_token("oauth.required_scope", s)?;
            if !self.scopes_supported.contains(s) {
                bail!("oauth.required_scope `{s}` must be one of oauth.scopes_supported");
            }
        }
        check_claim_name("oauth.agent_claim", &self.agent_claim)?;
        if let Some(c) = &self.on_behalf_of_claim {
            check_claim_name("oauth.on_behalf_of_claim", c)?;
        }
        check_range("oauth.leeway_secs", self.leeway_secs, 0, 300)?;
        check_range("oauth.http_timeout_ms", self.http_timeout_ms, 100, 60_000)?;
        check_range(
            "oauth.jwks_min_refresh_secs",
            self.jwks_min_refresh_secs,
            0,
            3600,
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn oidc(extra: &str) -> anyhow::Result<OidcConfig> {
        let text = format!(
            "issuer = \"https://sso.example.com/realms/ops\"\nclient_id = \"emisar\"\nclient_secret_env = \"OIDC_SECRET\"\n{extra}"
        );
        let c: OidcConfig = toml::from_str(&text)?;
        c.check()?;
        Ok(c)
    }

    fn oauth(extra: &str) -> anyhow::Result<OAuthConfig> {
        let text = format!(
            "issuer = \"https://sso.example.com\"\nresource = \"https://emisar.example.com/mcp\"\n{extra}"
        );
        let c: OAuthConfig = toml::from_str(&text)?;
        c.check()?;
        Ok(c)
    }

    fn err(r: anyhow::Result<impl std::fmt::Debug>) -> String {
        format!("{:#}", r.unwrap_err())
    }

    #[test]
    fn defaults_are_documented_values() {
        let c = oidc("").unwrap();
        assert_eq!(c.scopes, ["openid", "profile", "email"]);
        assert_eq!(c.roles_claim, "groups");
        assert_eq!(c.identity_claim, "sub");
        assert!(c.local_login);
        assert_eq!(c.session_lifetime_secs, 43_200);
        assert_eq!(c.leeway_secs, 60);
        assert_eq!(c.token_auth_method, TokenAuthMethod::ClientSecretBasic);
        let o = oauth("").unwrap();
        assert_eq!(o.scopes_supported, ["mcp:tools"]);
        assert_eq!(o.agent_claim, "client_id");
        assert_eq!(o.on_behalf_of_claim, None);
    }

    #[test]
    fn roles_map_groups_to_roles() {
        let c = oidc("[roles]\napprover = [\"ops\", \"sre\"]\nadmin = [\"sre\"]\n").unwrap();
        let map = c.group_roles();
        assert_eq!(map["ops"], BTreeSet::from([PersonRole::Approver]));
        assert_eq!(
            map["sre"],
            BTreeSet::from([PersonRole::Approver, PersonRole::Admin])
        );
        assert!(err(oidc("[roles]\nowner = [\"x\"]\n")).contains("unknown variant `owner`"));
    }

    #[test]
    fn bad_fields_are_named_with_their_rule() {
        assert!(err(oidc("typo = 1")).contains("unknown field `typo`"));
        let e = err(toml::from_str::<OidcConfig>(
            "issuer = \"http://sso.example.com\"\nclient_id = \"x\"\nclient_secret_env = \"S\"",
        )
        .map_err(anyhow::Error::from)
        .and_then(|c| c.check().map(|()| c)));
        assert!(e.contains("oidc.issuer") && e.contains("https://"), "{e}");
        assert!(err(oidc("scopes = [\"profile\"]")).contains("oidc.scopes must include `openid`"));
        assert!(err(oidc("scopes = [\"openid\", \"a b\"]")).contains("not a scope token"));
        assert!(err(oidc("client_secret_file = \"/x\"")).contains("set at most one"));
        assert!(err(oidc("token_auth_method = \"none\"")).contains("public client"));
        assert!(
            err(oidc("session_lifetime_secs = 5"))
                .contains("oidc.session_lifetime_secs is 5, it must be between 60 and 604800")
        );
        assert!(err(oidc("roles_claim = \"a..b\"")).contains("oidc.roles_claim"));
        assert!(err(oidc("leeway_secs = 301")).contains("oidc.leeway_secs"));
        assert!(err(oidc("redirect_url = \"ftp://x\"")).contains("oidc.redirect_url"));

        let text =
            "issuer = \"https://sso.example.com\"\nresource = \"https://e.example.com/mcp?x=1\"";
        let c: OAuthConfig = toml::from_str(text).unwrap();
        assert!(err(c.check()).contains("oauth.resource") && err(c.check()).contains("no query"));
        assert!(err(oauth("scopes_supported = []")).contains("oauth.scopes_supported"));
        assert!(
            err(oauth("required_scope = \"admin\""))
                .contains("must be one of oauth.scopes_supported")
        );
        assert!(err(oauth("agent_claim = \"\"")).contains("oauth.agent_claim"));
        assert!(err(oauth("http_timeout_ms = 5")).contains("oauth.http_timeout_ms is 5"));
    }

    #[test]
    fn loopback_http_is_the_only_plain_http() {
        for ok in [
            "http://127.0.0.1:8080",
            "http://localhost/realms/x",
            "http://[::1]:9000",
            "https://sso.example.com",
        ] {
            check_url("f", ok).unwrap();
        }
        for bad in [
            "http://sso.example.com",
            "http://127.0.0.1.evil.example:80",
            "http://localhost@evil.example",
            "https://",
            "https:///path",
            "https://a.example/#frag",
            "https://a.example/ x",
            "sso.example.com",
        ] {
            assert!(check_url("f", bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn the_secret_never_prints() {
        let s = ClientSecret("hunter2".into());
        assert_eq!(format!("{s:?}"), "ClientSecret(..)");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        std::fs::write(&path, "  s3cret\n").unwrap();
        let mut cfg = oidc("").unwrap();
        cfg.client_secret_env = None;
        cfg.client_secret_file = Some(path);
        assert_eq!(cfg.client_secret().unwrap().unwrap().expose(), "s3cret");
        cfg.client_secret_file = Some(dir.path().join("missing"));
        let e = format!("{:#}", cfg.client_secret().unwrap_err());
        assert!(
            e.contains("oidc.client_secret_file") && e.contains("missing"),
            "{e}"
        );
    }
}
