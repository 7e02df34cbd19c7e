//! Typed settings for `emisar serve` (emisar.toml).
//!
//! Unknown keys are errors, so a typo never silently leaves a default in place.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::util::config::read_config;

#[derive(schemars::JsonSchema, Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// Address of the MCP endpoint and API, e.g. `127.0.0.1:7700` (`:0` picks a free port).
    #[serde(default = "default_server_listen")]
    pub listen: String,
    /// `postgres://…` or `sqlite://…`, e.g. `postgres://emisar@db.internal/emisar`;
    /// `--database` / `DATABASE_URL` take precedence.
    #[serde(default)]
    pub database_url: Option<String>,
    /// The Ed25519 private key (PKCS#8 PEM) that signs runner calls, e.g.
    /// `/etc/emisar/server.key` (`emisar keygen`).
    pub signing_key_file: PathBuf,
    /// A directory of pack files that add to or replace the stock packs, e.g.
    /// `/etc/emisar/packs`.
    #[serde(default)]
    pub packs_dir: Option<PathBuf>,
    /// The longest a call waits for any one runner, in milliseconds.
    #[serde(default = "default_call_timeout_ms")]
    pub call_timeout_ms: u64,
    /// Host headers the server accepts on every route but `/healthz` and `/readyz`
    /// (DNS-rebinding protection): `name` allows every port, `name:port` only that one. The
    /// host of `public_url` and the address the server listens on are always accepted.
    #[serde(default = "default_allowed_hosts")]
    pub allowed_hosts: Vec<String>,
    /// Browser origins (`https://host[:port]`) besides the server's own that may call `/mcp`
    /// (the MCP specification's Origin check). A request with another `Origin` is refused
    /// (403); one without `Origin` (MCP clients that are not web pages) is not affected. The
    /// server's own origin (the one its `Host` names, and `public_url`'s) is always allowed.
    #[serde(default)]
    pub allowed_origins: Vec<String>,
    /// Runners listed here rather than joined (`emisar join-token`): one `[[runners]]` table
    /// each, with `name`, `url` and usually `tls_fingerprint`.
    #[serde(default)]
    pub runners: Vec<RunnerEntry>,
    /// Key for the HMAC that stands in for secret params in the audit log (64 hex chars;
    /// `emisar keygen --audit-key FILE`), e.g. `/etc/emisar/audit.key`. Required when a pack
    /// has secret params.
    #[serde(default)]
    pub audit_key_file: Option<PathBuf>,
    /// Tool calls per second each agent may make: the rate its token bucket refills at
    /// (`rate_limit_burst` is the bucket's size). On PostgreSQL, counted across all replicas.
    #[serde(default = "default_rate")]
    pub rate_limit_per_second: u32,
    /// The calls an agent may make at once above `rate_limit_per_second` before it is refused.
    #[serde(default = "default_burst")]
    pub rate_limit_burst: u32,
    /// How often each runner's /healthz is probed, in milliseconds, on average (each wait is
    /// 0.75–1.25 times it), in a fleet small enough for `health_probes_per_second`.
    #[serde(default = "default_probe_ms")]
    pub health_probe_interval_ms: u64,
    /// The most health probes a second this server sends to the whole fleet: a larger fleet
    /// is probed less often than `health_probe_interval_ms` (1,000 runners at the default 50:
    /// each every 20 s). Raise it to notice a dead runner sooner in a large fleet, at a cost
    /// in CPU (each probe is a TLS request).
    #[serde(default = "default_probes_per_second")]
    pub health_probes_per_second: u32,
    /// The policy file (TOML or YAML): who may use which tools and runners, risk overrides,
    /// approvers per tool, per-runner allowlists. Without one, reads run and every write
    /// needs one approval. Reloaded on SIGHUP. E.g. `/etc/emisar/policy.toml`.
    #[serde(default)]
    pub policy_file: Option<PathBuf>,
    /// Webhooks told about approval requests (generic JSON or Slack-compatible): one
    /// `[[webhooks]]` table each, with `url`, `kind` and an optional `name`. When they are
    /// told, and who else is, is `[notices]`.
    #[serde(default)]
    pub webhooks: Vec<crate::server::notices::webhook::WebhookConfig>,
    /// Notices: email targets (`[[notices.email]]`), escalation groups, reminders. Every
    /// notice links to the approval page at `public_url`, which must then be set.
    #[serde(default)]
    pub notices: crate::server::notices::config::NoticesConfig,
    /// Where people reach this server, e.g. `https://emisar.example.com` (for links in
    /// notifications; `https://` also marks the portal's cookie `Secure`).
    #[serde(default)]
    pub public_url: Option<String>,
    /// How long an approval request waits for its approvers before it expires, in seconds.
    #[serde(default = "default_approval_ttl")]
    pub approval_ttl_secs: u64,
    /// How long one MCP call waits for the decision before it returns the request id.
    #[serde(default = "default_approval_wait")]
    pub approval_wait_secs: u64,
    /// How often a waiting call sends progress, in milliseconds (at most 15000: clients and
    /// MCP sessions give up on a silent call).
    #[serde(default = "default_progress_ms")]
    pub approval_progress_ms: u64,
    /// Login attempt limits (per address, per name, for the server) and the proxies whose
    /// `X-Forwarded-For` is believed.
    #[serde(default)]
    pub login: crate::server::login_limits::LoginLimitsConfig,
    /// The most connections one client address (an IPv6 /64) may hold open to the server;
    /// one more is closed as soon as it is accepted. Behind a load balancer every connection
    /// comes from it: raise this to its connection pool.
    #[serde(default = "default_connections_per_address")]
    pub max_connections_per_address: usize,
    /// People sign in to the portal with the organisation's OpenID provider (see
    /// docs/identity.md). Default: none (local users only).
    #[serde(default)]
    pub oidc: Option<crate::server::oidc::config::OidcConfig>,
    /// `/mcp` is an OAuth 2.1 protected resource: MCP clients bring access tokens from the
    /// organisation's authorization server, next to emisar's own tokens. Default: none.
    #[serde(default)]
    pub oauth: Option<crate::server::oidc::config::OAuthConfig>,
    /// The server's TLS certificate (PEM, chain allowed) and key: with both, the server serves
    /// HTTPS itself (and the portal's cookie is `Secure`), e.g. `/etc/emisar/tls/tls.crt`.
    #[serde(default)]
    pub tls_cert_file: Option<PathBuf>,
    /// The private key (PEM) of `tls_cert_file`, e.g. `/etc/emisar/tls/tls.key`.
    #[serde(default)]
    pub tls_key_file: Option<PathBuf>,
    /// A CA (PEM) that signs runners' certificates. A runner without `tls_fingerprint` is
    /// verified against it, its hostname checked against its URL; without it, against the
    /// system's trust store. E.g. `/etc/emisar/tls/runner-ca.crt`.
    #[serde(default)]
    pub runner_ca_file: Option<PathBuf>,
    /// Allows `http://` runner URLs, in this file and in join requests. Loopback tests and
    /// `emisar dev` only: calls, arguments and results would travel in clear.
    #[serde(default)]
    pub insecure_http: bool,
    /// An approved request whose execution has not started this many seconds after the
    /// deciding approval expires instead, and nothing runs (default 300).
    #[serde(default = "default_approved_start_within")]
    pub approved_start_within_secs: u64,
    /// The most approval requests one agent may have pending at once (default 20).
    #[serde(default = "default_max_pending")]
    pub max_pending_per_agent: u32,
    /// The longest a grant may live, from the agent's request to its expiry, in seconds
    /// (default 3600): `emisar.request_grant` refuses a longer `expires_in_secs`. Keep it at
    /// most the runners' `max_grant_lifetime_secs`, or they refuse the grant's calls.
    #[serde(default = "default_max_grant_lifetime")]
    pub max_grant_lifetime_secs: u64,
    /// How runners that join are bounded: where they may be reached, and how often one address may try.
    #[serde(default)]
    pub join: JoinConfig,
    /// Passkeys (WebAuthn) people register in the portal to sign approvals. Default: the
    /// relying party is derived from `public_url`.
    #[serde(default)]
    pub webauthn: WebauthnConfig,
    /// The approvers file the runners trust (`emisar approvers`): with it, every approval
    /// request is signed by people (`emisar approvals approve` with an SSH key, or a passkey in
    /// the portal), the server verifies each signature as it comes, asks for as many people as
    /// the file's rule for the tool needs, and refuses a request no one could satisfy.
    #[serde(default)]
    pub approvers_file: Option<PathBuf>,
    /// The organisation root key's signature over `approvers_file` (`emisar approvers sign`):
    /// the server carries the file and this signature to runners that trust only
    /// `approvers_root_keys`.
    #[serde(default)]
    pub approvers_signature_file: Option<PathBuf>,
    /// The audit log as a transparency log: the log key that signs checkpoints of its Merkle
    /// tree, how often, and the witnesses that cosign them. Default: none (the tree is kept,
    /// nothing is signed).
    #[serde(default)]
    pub transparency: Option<crate::server::audit::checkpoints::TransparencyConfig>,
}

/// `[webauthn]`: the relying party passkeys are registered for and approvals are signed
/// with. Runners check signatures against the same RP ID and origins (their approvers
/// file names them), so changing either makes every registered passkey useless.
#[derive(schemars::JsonSchema, Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebauthnConfig {
    /// The RP ID: the domain passkeys are bound to, e.g. `emisar.example.com` (the portal's
    /// host or a parent domain of it; never an IP address). Default: the host of
    /// `public_url`.
    #[serde(default)]
    pub rp_id: Option<String>,
    /// The origins (`https://host[:port]`) the portal is reached at, whose host is the RP ID
    /// or under it; `http://` only for `localhost`. Default: the origin of `public_url`.
    #[serde(default)]
    pub origins: Vec<String>,
}

/// `[join]`: bounds on runners that join with a join token.
#[derive(schemars::JsonSchema, Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JoinConfig {
    /// The networks (CIDRs, or single addresses) a joined runner's URL may point into,
    /// checked when it joins or re-registers and on every connection (each address its name
    /// resolves to). Default: the private ranges (10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16,
    /// 100.64.0.0/10, fc00::/7); loopback and link-local only when listed. The server's own
    /// listening address is refused whatever this says. Runners in `[[runners]]` are not
    /// bound by it.
    #[serde(default)]
    pub allowed_networks: Option<Vec<String>>,
    /// Join attempts one client address (an IPv6 /64) may make a minute, also the burst;
    /// past it the address is answered 429 before the store is asked, and a runner retries
    /// with backoff. Raise it when a large fleet joins from behind one NAT (1,000 runners
    /// take 50 minutes at the default); a flood of made-up tokens from one address then
    /// reaches the store this often. Counted per replica. 1 to 100000.
    #[serde(default = "default_join_attempts")]
    pub attempts_per_address_per_minute: u32,
}

impl Default for JoinConfig {
    fn default() -> Self {
        JoinConfig {
            allowed_networks: None,
            attempts_per_address_per_minute: default_join_attempts(),
        }
    }
}

fn default_join_attempts() -> u32 {
    DEFAULT_JOIN_ATTEMPTS_PER_MINUTE
}

/// Join attempts one address may make a minute (also the burst) unless the operator says
/// otherwise. Twenty: a rack behind one NAT can bring twenty new runners up at once, and a
/// runner refused with 429 retries with backoff; a flood from one address reaches the store
/// twenty times a minute at most. Here, not in `fleet`, which reads the config.
pub const DEFAULT_JOIN_ATTEMPTS_PER_MINUTE: u32 = 20;

/// The most `join.attempts_per_address_per_minute` may say.
const MAX_JOIN_ATTEMPTS_PER_MINUTE: u32 = 100_000;
/// `health_probes_per_second` by default: as many as the heartbeats a fleet sends at most
/// (`fleet::HEARTBEATS_PER_SECOND`). Consul scales its agents' anti-entropy the same way
/// (a rate for the whole cluster, not an interval per node).
pub const DEFAULT_PROBES_PER_SECOND: u32 = 50;
/// The most probes a second `health_probes_per_second` may ask for.
const MAX_PROBES_PER_SECOND: u32 = 100_000;

fn default_approval_ttl() -> u64 {
    15 * 60
}
fn default_approval_wait() -> u64 {
    120
}
fn default_progress_ms() -> u64 {
    10_000
}
fn default_approved_start_within() -> u64 {
    5 * 60
}
fn default_max_pending() -> u32 {
    20
}
fn default_max_grant_lifetime() -> u64 {
    crate::protocol::approval::grant::DEFAULT_MAX_LIFETIME_SECS
}

fn default_rate() -> u32 {
    20
}
fn default_burst() -> u32 {
    40
}
fn default_connections_per_address() -> usize {
    256
}
fn default_probe_ms() -> u64 {
    10_000
}
fn default_probes_per_second() -> u32 {
    DEFAULT_PROBES_PER_SECOND
}

#[derive(schemars::JsonSchema, Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunnerEntry {
    /// The runner's name, as its runner.toml `name` says: the audience of its signed calls.
    pub name: String,
    /// Base URL of the runner, e.g. `https://10.0.0.5:7701`.
    pub url: String,
    /// `sha256:<hex>` of the certificate the runner serves (`emisar runner fingerprint`): the
    /// server accepts that certificate and no other, whatever names it carries.
    #[serde(default)]
    pub tls_fingerprint: Option<String>,
    /// The packs this runner serves; all packs when left out.
    #[serde(default)]
    pub packs: Option<Vec<String>>,
    /// Labels that selectors match, e.g. `{ role = "edge", dc = "dc1" }`.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

impl RunnerEntry {
    pub(crate) fn serves(&self, pack: &str) -> bool {
        self.packs
            .as_ref()
            .is_none_or(|p| p.iter().any(|x| x == pack))
    }
}

fn default_server_listen() -> String {
    "127.0.0.1:7700".into()
}
fn default_call_timeout_ms() -> u64 {
    15_000
}
fn default_allowed_hosts() -> Vec<String> {
    vec!["localhost".into(), "127.0.0.1".into(), "::1".into()]
}

impl ServerConfig {
    /// Every setting at its default, with the one setting that has none.
    pub fn with_signing_key(signing_key_file: PathBuf) -> Self {
        ServerConfig {
            listen: default_server_listen(),
            database_url: None,
            signing_key_file,
            packs_dir: None,
            call_timeout_ms: default_call_timeout_ms(),
            allowed_hosts: default_allowed_hosts(),
            allowed_origins: Vec::new(),
            runners: Vec::new(),
            audit_key_file: None,
            rate_limit_per_second: default_rate(),
            rate_limit_burst: default_burst(),
            health_probe_interval_ms: default_probe_ms(),
            health_probes_per_second: default_probes_per_second(),
            policy_file: None,
            webhooks: Vec::new(),
            notices: Default::default(),
            public_url: None,
            approval_ttl_secs: default_approval_ttl(),
            approval_wait_secs: default_approval_wait(),
            approval_progress_ms: default_progress_ms(),
            login: Default::default(),
            max_connections_per_address: default_connections_per_address(),
            oidc: None,
            oauth: None,
            tls_cert_file: None,
            tls_key_file: None,
            runner_ca_file: None,
            insecure_http: false,
            approved_start_within_secs: default_approved_start_within(),
            max_pending_per_agent: default_max_pending(),
            max_grant_lifetime_secs: default_max_grant_lifetime(),
            join: JoinConfig::default(),
            webauthn: WebauthnConfig::default(),
            approvers_file: None,
            approvers_signature_file: None,
            transparency: None,
        }
    }

    /// Whether the server serves HTTPS itself.
    pub fn serves_tls(&self) -> bool {
        self.tls_cert_file.is_some()
    }

    pub(crate) fn load(path: &Path) -> anyhow::Result<Self> {
        let c = Self::read(path)?;
        c.check()?;
        Ok(c)
    }

    /// Reads emisar.toml without checking it (`emisar config check` runs the checks itself).
    pub(crate) fn read(path: &Path) -> anyhow::Result<Self> {
        let keys = crate::util::config::top_level_keys(schemars::schema_for!(ServerConfig));
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        read_config(path, &keys)
    }

    /// Checks what serde cannot: unique, well-formed runner names and URLs.
    pub(crate) fn check(&self) -> anyhow::Result<()> {
        if let Some(t) = &self.transparency {
            t.check()?;
        }
        let mut seen = std::collections::BTreeSet::new();
        for (i, r) in self.runners.iter().enumerate() {
            if !crate::util::input::is_identifier(&r.name) {
                anyhow::bail!("runners[{i}].name `{}` must be an identifier", r.name);
            }
            if !seen.insert(&r.name) {
                anyhow::bail!("runners[{i}].name `{}` appears twice", r.name);
            }
            check_runner_url(&format!("runners[{i}].url"), &r.url, self.insecure_http)?;
            if let Some(pin) = &r.tls_fingerprint {
                crate::util::tls::Fingerprint::parse(pin)
                    .map_err(|e| anyhow::anyhow!("runners[{i}].tls_fingerprint {e}"))?;
                if !r.url.starts_with("https://") {
                    anyhow::bail!(
                        "runners[{i}].tls_fingerprint pins a certificate, but url `{}` is not https://",
                        r.url
                    );
                }
            }
        }
        if self.tls_cert_file.is_some() != self.tls_key_file.is_some() {
            anyhow::bail!("tls_cert_file and tls_key_file go together: set both or neither");
        }
        if self.max_connections_per_address == 0 {
            anyhow::bail!("max_connections_per_address must be at least 1");
        }
        if self.rate_limit_per_second == 0 || self.rate_limit_burst == 0 {
            anyhow::bail!("rate_limit_per_second and rate_limit_burst must be at least 1");
        }
        if self.health_probe_interval_ms < 100 {
            anyhow::bail!("health_probe_interval_ms must be at least 100");
        }
        if !(1..=MAX_PROBES_PER_SECOND).contains(&self.health_probes_per_second) {
            anyhow::bail!(
                "health_probes_per_second must be between 1 and {MAX_PROBES_PER_SECOND}, not {}",
                self.health_probes_per_second
            );
        }
        if self.call_timeout_ms == 0 || self.call_timeout_ms > 600_000 {
            anyhow::bail!("call_timeout_ms must be between 1 and 600000");
        }
        crate::server::notices::webhook::validate(&self.webhooks)?;
        self.notices
            .check(&self.webhooks, self.public_url.as_deref())
            .map_err(anyhow::Error::msg)?;
        self.login.check()?;
        if !(1..=MAX_JOIN_ATTEMPTS_PER_MINUTE).contains(&self.join.attempts_per_address_per_minute)
        {
            anyhow::bail!(
                "join.attempts_per_address_per_minute must be between 1 and {MAX_JOIN_ATTEMPTS_PER_MINUTE}, not {}",
                self.join.attempts_per_address_per_minute
            );
        }
        // The same parse as `runners::networks::JoinNetworks::new`, which `app.rs` builds from
        // this list; checked here so `config check` reports it without importing `runners`.
        for text in self.join.allowed_networks.iter().flatten() {
            if text.parse::<ipnet::IpNet>().is_err() && text.parse::<std::net::IpAddr>().is_err() {
                anyhow::bail!(
                    "join.allowed_networks: `{}` is not a network (CIDR such as 10.0.0.0/8 or fd00::/8, or one address)",
                    text.escape_debug()
                );
            }
        }
        if let Some(url) = &self.public_url
            && !(url.starts_with("http://") || url.starts_with("https://"))
        {
            anyhow::bail!("public_url `{url}` must start with http:// or https://");
        }
        for (i, origin) in self.allowed_origins.iter().enumerate() {
            if let Err(rule) = crate::server::rebinding::Origin::parse(origin) {
                anyhow::bail!("allowed_origins[{i}] {rule}");
            }
        }
        if !(10..=7 * 24 * 3600).contains(&self.approval_ttl_secs) {
            anyhow::bail!("approval_ttl_secs must be between 10 and 604800 (a week)");
        }
        if self.approval_wait_secs > 3600 {
            anyhow::bail!("approval_wait_secs must be at most 3600");
        }
        if !(50..=15_000).contains(&self.approval_progress_ms) {
            anyhow::bail!(
                "approval_progress_ms must be between 50 and 15000 (a silent call is dropped by clients)"
            );
        }
        if !(1..=3600).contains(&self.approved_start_within_secs) {
            anyhow::bail!("approved_start_within_secs must be between 1 and 3600");
        }
        if !(60..=7 * 24 * 3600).contains(&self.max_grant_lifetime_secs) {
            anyhow::bail!("max_grant_lifetime_secs must be between 60 and 604800 (a week)");
        }
        if !(1..=10_000).contains(&self.max_pending_per_agent) {
            anyhow::bail!("max_pending_per_agent must be between 1 and 10000");
        }
        if self.webauthn.rp_id.is_some() || !self.webauthn.origins.is_empty() {
            // Set explicitly: wrong is an error at start. Derived from `public_url` only: an
            // error when someone tries to register a passkey (`relying_party`).
            self.relying_party().map_err(|e| anyhow::anyhow!("{e}"))?;
        }
        self.check_identity()
    }

    /// The WebAuthn relying party: `[webauthn]`, with what it leaves out taken from
    /// `public_url`; an error naming the setting when neither gives one.
    pub(crate) fn relying_party(
        &self,
    ) -> Result<crate::protocol::approval::webauthn::RelyingParty, String> {
        // The origin of `public_url` (which may have a path: a portal behind a prefix).
        let public = self
            .public_url
            .as_deref()
            .map(|url| {
                let uri: axum::http::Uri = url.parse().map_err(|_| {
                    "public_url must be a URL such as https://emisar.example.com".to_owned()
                })?;
                let (Some(scheme), Some(authority)) = (uri.scheme_str(), uri.authority()) else {
                    return Err(
                        "public_url must be a URL such as https://emisar.example.com".to_owned(),
                    );
                };
                crate::server::rebinding::Origin::parse(&format!("{scheme}://{authority}"))
                    .map_err(|rule| format!("public_url {rule}"))
            })
            .transpose()?;
        let rp_id = match (&self.webauthn.rp_id, &public) {
            (Some(id), _) => id.clone(),
            (None, Some(origin)) => origin.host().to_owned(),
            (None, None) => {
                return Err("passkeys need a relying party: set webauthn.rp_id and webauthn.origins, or public_url to derive them from".into());
            }
        };
        check_rp_id(&rp_id)?;
        let origins: Vec<String> = if self.webauthn.origins.is_empty() {
            match &public {
                Some(origin) => vec![origin.serialized()],
                None => {
                    return Err("webauthn.origins: set the portal's origins (https://host[:port]), or public_url to derive it from".into());
                }
            }
        } else {
            self.webauthn.origins.clone()
        };
        for (i, text) in origins.iter().enumerate() {
            let what = if self.webauthn.origins.is_empty() {
                "public_url".to_owned()
            } else {
                format!("webauthn.origins[{i}]")
            };
            let origin = crate::server::rebinding::Origin::parse(text)
                .map_err(|rule| format!("{what} {rule}"))?;
            if origin.serialized() != *text {
                return Err(format!(
                    "{what} must be written as the browser reports it: {}",
                    origin.serialized()
                ));
            }
            let host = origin.host();
            if host != rp_id && !host.ends_with(&format!(".{rp_id}")) {
                return Err(format!(
                    "{what}: its host must be webauthn.rp_id `{rp_id}` or a name under it (WebAuthn binds a passkey to the RP ID)"
                ));
            }
            if origin.scheme() != "https" && host != "localhost" {
                return Err(format!(
                    "{what} must be https:// (browsers offer passkeys only in secure contexts; http:// only for localhost)"
                ));
            }
        }
        Ok(crate::protocol::approval::webauthn::RelyingParty { rp_id, origins })
    }

    /// `[oidc]` and `[oauth]` on their own, and together.
    fn check_identity(&self) -> anyhow::Result<()> {
        if let Some(oidc) = &self.oidc {
            oidc.check()?;
            if oidc.redirect_url.is_none() && self.public_url.is_none() {
                anyhow::bail!(
                    "oidc.redirect_url: set it, or set public_url (the redirect URL is then <public_url>/login/oidc/callback)"
                );
            }
        }
        if let Some(oauth) = &self.oauth {
            oauth.check()?;
        }
        // Self-approval is refused by comparing the person an agent acted for with the person
        // who approves: both must be named by the same claim, or the comparison never
        // matches. Whenever both are set (one provider or two: `person:<value>` is one
        // namespace in the approvals either way).
        if let (Some(oidc), Some(oauth)) = (&self.oidc, &self.oauth)
            && let Some(claim) = &oauth.on_behalf_of_claim
            && *claim != oidc.identity_claim
        {
            anyhow::bail!(
                "oauth.on_behalf_of_claim is `{claim}` but oidc.identity_claim is `{}`: when both are set they must name the same claim, or a person could approve what an agent asked for on their behalf",
                oidc.identity_claim
            );
        }
        Ok(())
    }
}

/// An RP ID is a domain: lowercase letters, digits, `-` and dots, not an IP address.
fn check_rp_id(rp_id: &str) -> Result<(), String> {
    let domain = !rp_id.is_empty()
        && rp_id.len() <= 253
        && rp_id.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        });
    if !domain || rp_id.parse::<std::net::IpAddr>().is_ok() {
        return Err("webauthn.rp_id must be a domain name in lowercase (the portal's host or a parent of it), not an IP address: set webauthn.rp_id, or a public_url with a host name".into());
    }
    Ok(())
}

/// A runner's URL (`what` names where it came from): https, or http only with
/// `insecure_http`. The message names the setting, so whoever reads it knows the way out.
pub(crate) fn check_runner_url(what: &str, url: &str, insecure_http: bool) -> anyhow::Result<()> {
    if url.starts_with("https://") || (url.starts_with("http://") && insecure_http) {
        return Ok(());
    }
    if url.starts_with("http://") {
        anyhow::bail!(
            "{what} `{url}` is plain HTTP: calls, arguments and results would travel in clear; use https:// (see tls_fingerprint / runner_ca_file) or set insecure_http = true (loopback tests and `emisar dev` only)"
        );
    }
    anyhow::bail!("{what} `{url}` must start with https:// (or http:// with insecure_http = true)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_example_loads() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
        let server = ServerConfig::load(&root.join("emisar.toml")).unwrap();
        assert_eq!(server.runners.len(), 2);
        assert!(server.runners[1].serves("traefik") && !server.runners[1].serves("consul"));
        assert_eq!(server.webhooks.len(), 2);
        assert!(
            !format!("{:?}", server.webhooks).contains("XXXX"),
            "hook URLs are secrets"
        );
    }
    #[test]
    fn bad_configs_name_the_field() {
        let err = toml::from_str::<ServerConfig>("signing_key_file = 'k'\nlisten_addr = 'x'")
            .unwrap_err()
            .to_string();
        assert!(err.contains("listen_addr"), "{err}");
        let mut c: ServerConfig =
            toml::from_str("signing_key_file = 'k'\n[[runners]]\nname = 'a b'\nurl = 'http://x'")
                .unwrap();
        assert!(
            c.check()
                .unwrap_err()
                .to_string()
                .contains("runners[0].name")
        );
        c.runners[0].name = "a".into();
        c.runners[0].url = "ftp://x".into();
        assert!(
            c.check()
                .unwrap_err()
                .to_string()
                .contains("runners[0].url")
        );
        c.runners[0].url = "http://x".into();
        c.insecure_http = true;
        c.check().unwrap();
        for bad in [0, MAX_JOIN_ATTEMPTS_PER_MINUTE + 1] {
            c.join.attempts_per_address_per_minute = bad;
            let err = c.check().unwrap_err().to_string();
            assert!(
                err.contains("join.attempts_per_address_per_minute must be between 1 and 100000"),
                "{err}"
            );
        }
        c.join.attempts_per_address_per_minute = 20;
        for bad in [0, MAX_PROBES_PER_SECOND + 1] {
            c.health_probes_per_second = bad;
            let err = c.check().unwrap_err().to_string();
            assert!(
                err.contains("health_probes_per_second must be between 1 and 100000"),
                "{err}"
            );
        }
        let c: ServerConfig = toml::from_str("signing_key_file = 'k'").unwrap();
        assert_eq!(c.join.attempts_per_address_per_minute, 20, "the default");
        assert_eq!(c.health_probes_per_second, 50, "the default");
    }

    #[test]
    fn plain_http_and_bad_pins_are_refused_naming_the_setting() {
        let mut c: ServerConfig = toml::from_str(
            "signing_key_file = 'k'\n[[runners]]\nname = 'a'\nurl = 'http://10.0.0.5:7701'",
        )
        .unwrap();
        let err = c.check().unwrap_err().to_string();
        assert!(
            err.contains("runners[0].url `http://10.0.0.5:7701` is plain HTTP")
                && err.contains("insecure_http = true"),
            "{err}"
        );
        c.insecure_http = true;
        c.check().unwrap();
        c.runners[0].tls_fingerprint = Some(format!("sha256:{}", "ab".repeat(32)));
        let err = c.check().unwrap_err().to_string();
        assert!(
            err.contains("runners[0].tls_fingerprint pins a certificate"),
            "{err}"
        );
        c.runners[0].url = "https://10.0.0.5:7701".into();
        c.check().unwrap();
        c.runners[0].tls_fingerprint = Some("sha256:abc".into());
        let err = c.check().unwrap_err().to_string();
        assert!(
            err.contains("runners[0].tls_fingerprint `sha256:abc` must be"),
            "{err}"
        );
        c.runners[0].tls_fingerprint = None;
        c.tls_cert_file = Some("cert.pem".into());
        let err = c.check().unwrap_err().to_string();
        assert!(
            err.contains("tls_cert_file and tls_key_file go together"),
            "{err}"
        );
    }

    #[test]
    fn on_behalf_of_claim_must_name_the_identity_claim_whenever_both_are_set() {
        let text = |oauth_issuer: &str, claim: &str| {
            format!(
                "signing_key_file = 'k'\npublic_url = 'https://emisar.example.com'\n\
                 [oidc]\nissuer = 'https://sso.example.com'\nclient_id = 'emisar'\n\
                 client_secret_file = 's'\nidentity_claim = 'sub'\n\
                 [oauth]\nissuer = '{oauth_issuer}'\nresource = 'https://emisar.example.com/mcp'\n\
                 on_behalf_of_claim = '{claim}'\n"
            )
        };
        for issuer in ["https://sso.example.com", "https://other.example.com"] {
            let c: ServerConfig = toml::from_str(&text(issuer, "sub")).unwrap();
            c.check().unwrap();
            let c: ServerConfig = toml::from_str(&text(issuer, "email")).unwrap();
            let err = c.check().unwrap_err().to_string();
            assert!(
                err.contains("oauth.on_behalf_of_claim is `email`")
                    && err.contains("oidc.identity_claim is `sub`"),
                "{issuer}: {err}"
            );
        }
    }
}
