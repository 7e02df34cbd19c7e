//! Typed settings for `emisar serve` (emisar.toml) and `emisar runner` (runner.toml).
//!
//! Unknown keys are errors, so a typo never silently leaves a default in place.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::Deserialize;

use crate::pack::PackSet;

fn read_toml<T: for<'de> Deserialize<'de>>(path: &Path) -> anyhow::Result<T> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("failed to read config {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("invalid config {}", path.display()))
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// Address of the MCP endpoint and API, e.g. `127.0.0.1:7700` (`:0` picks a free port).
    #[serde(default = "default_server_listen")]
    pub listen: String,
    /// `postgres://…` or `sqlite://…`; `--database` / `DATABASE_URL` take precedence.
    #[serde(default)]
    pub database_url: Option<String>,
    /// The Ed25519 private key (PKCS#8 PEM) that signs runner calls.
    pub signing_key_file: PathBuf,
    /// A directory of pack files that add to or replace the stock packs.
    #[serde(default)]
    pub packs_dir: Option<PathBuf>,
    /// The longest a call waits for any one runner, in milliseconds.
    #[serde(default = "default_call_timeout_ms")]
    pub call_timeout_ms: u64,
    /// Host headers the MCP endpoint accepts (DNS-rebinding protection).
    #[serde(default = "default_allowed_hosts")]
    pub allowed_hosts: Vec<String>,
    #[serde(default)]
    pub runners: Vec<RunnerEntry>,
    /// Key for the HMAC that stands in for secret params in the audit log (64 hex chars;
    /// `emisar keygen --audit-key FILE`). Required when a pack has secret params.
    #[serde(default)]
    pub audit_key_file: Option<PathBuf>,
    /// Tool calls per second each agent may make, and the burst above it.
    #[serde(default = "default_rate")]
    pub rate_limit_per_second: u32,
    #[serde(default = "default_burst")]
    pub rate_limit_burst: u32,
    /// How often each runner's /healthz is probed, in milliseconds (jittered).
    #[serde(default = "default_probe_ms")]
    pub health_probe_interval_ms: u64,
    /// The policy file (TOML or YAML): who may use which tools and runners, risk overrides,
    /// approvers per tool, per-runner allowlists. Without one, reads run and every write
    /// needs one approval. Reloaded on SIGHUP.
    #[serde(default)]
    pub policy_file: Option<PathBuf>,
    /// Who hears about new approval requests.
    #[serde(default)]
    pub webhooks: Vec<crate::webhook::WebhookConfig>,
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
}

fn default_approval_ttl() -> u64 {
    15 * 60
}
fn default_approval_wait() -> u64 {
    120
}
fn default_progress_ms() -> u64 {
    10_000
}

fn default_rate() -> u32 {
    20
}
fn default_burst() -> u32 {
    40
}
fn default_probe_ms() -> u64 {
    10_000
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunnerEntry {
    pub name: String,
    /// Base URL of the runner, e.g. `http://10.0.0.5:7701`.
    pub url: String,
    /// The packs this runner serves; all packs when left out.
    #[serde(default)]
    pub packs: Option<Vec<String>>,
    /// Labels that selectors match, e.g. `{ role = "edge", dc = "dc1" }`.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

impl RunnerEntry {
    pub fn serves(&self, pack: &str) -> bool {
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
            runners: Vec::new(),
            audit_key_file: None,
            rate_limit_per_second: default_rate(),
            rate_limit_burst: default_burst(),
            health_probe_interval_ms: default_probe_ms(),
            policy_file: None,
            webhooks: Vec::new(),
            public_url: None,
            approval_ttl_secs: default_approval_ttl(),
            approval_wait_secs: default_approval_wait(),
            approval_progress_ms: default_progress_ms(),
        }
    }

    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let c: Self = read_toml(path)?;
        c.check()?;
        Ok(c)
    }

    /// Checks what serde cannot: unique, well-formed runner names and URLs.
    pub fn check(&self) -> anyhow::Result<()> {
        let mut seen = std::collections::BTreeSet::new();
        for (i, r) in self.runners.iter().enumerate() {
            if !crate::pack::is_identifier(&r.name) {
                anyhow::bail!("runners[{i}].name `{}` must be an identifier", r.name);
            }
            if !seen.insert(&r.name) {
                anyhow::bail!("runners[{i}].name `{}` appears twice", r.name);
            }
            if !(r.url.starts_with("http://") || r.url.starts_with("https://")) {
                anyhow::bail!(
                    "runners[{i}].url `{}` must start with http:// or https://",
                    r.url
                );
            }
        }
        if self.rate_limit_per_second == 0 || self.rate_limit_burst == 0 {
            anyhow::bail!("rate_limit_per_second and rate_limit_burst must be at least 1");
        }
        if self.health_probe_interval_ms < 100 {
            anyhow::bail!("health_probe_interval_ms must be at least 100");
        }
        if self.call_timeout_ms == 0 || self.call_timeout_ms > 600_000 {
            anyhow::bail!("call_timeout_ms must be between 1 and 600000");
        }
        crate::webhook::validate(&self.webhooks)?;
        if let Some(url) = &self.public_url
            && !(url.starts_with("http://") || url.starts_with("https://"))
        {
            anyhow::bail!("public_url `{url}` must start with http:// or https://");
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
        Ok(())
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunnerConfig {
    /// This runner's name: signed calls must carry it as their audience.
    pub name: String,
    #[serde(default = "default_runner_listen")]
    pub listen: String,
    /// The server's Ed25519 public key (SPKI PEM). A runner that joins gets it from the
    /// server instead (over the join token's channel: use https for the server URL).
    #[serde(default)]
    pub server_public_key_file: Option<PathBuf>,
    /// Labels that agents' and tokens' selectors match, e.g. `{ role = "edge" }`.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// The URL the server reaches this runner at, when it joins (default: `http://LISTEN`).
    #[serde(default)]
    pub advertise_url: Option<String>,
    /// Join a server instead of being listed in its config.
    #[serde(default)]
    pub join: Option<JoinConfig>,
    #[serde(default)]
    pub packs_dir: Option<PathBuf>,
    /// PATH for exec actions (the rest of the environment is cleared).
    #[serde(default = "default_exec_path")]
    pub exec_path: String,
    /// The most bytes of output any action may return; the rest is cut with a marker.
    #[serde(default = "default_max_output_bytes")]
    pub max_output_bytes: usize,
    /// Local services, by the name packs use. Missing ones get their standard local address.
    #[serde(default)]
    pub services: BTreeMap<String, ServiceConfig>,
    /// Program name → the argv that replaces it, e.g.
    /// `vtysh = ["/usr/bin/vtysh", "--vty_socket", "/run/frr"]`.
    #[serde(default)]
    pub programs: BTreeMap<String, Vec<String>>,
    /// Allowlists that params refer to (`allowlist: systemd_units` in a pack). A list that is
    /// not here is empty: every value is refused.
    #[serde(default)]
    pub allowlists: BTreeMap<String, Vec<String>>,
}

#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JoinConfig {
    /// The server's base URL, e.g. https://emisar.example.internal.
    pub server: String,
    /// A join token from `emisar join-token issue`.
    pub token: String,
}

impl std::fmt::Debug for JoinConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JoinConfig")
            .field("server", &self.server)
            .finish_non_exhaustive()
    }
}

#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceConfig {
    pub base_url: String,
    /// Headers sent with every request, e.g. an ACL token. They stay on this node.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
}

impl std::fmt::Debug for ServiceConfig {
    // Header values are credentials: never print them.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceConfig")
            .field("base_url", &self.base_url)
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .finish()
    }
}

fn default_runner_listen() -> String {
    "127.0.0.1:7701".into()
}
fn default_exec_path() -> String {
    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into()
}
fn default_max_output_bytes() -> usize {
    1024 * 1024
}

/// The standard local address of each service a stock pack talks to.
pub const STANDARD_SERVICES: &[(&str, &str)] = &[
    ("traefik", "http://127.0.0.1:8080"),
    ("consul", "http://127.0.0.1:8500"),
    ("nomad", "http://127.0.0.1:4646"),
    ("victoriametrics", "http://127.0.0.1:8428"),
];

impl RunnerConfig {
    /// Every setting at its default, standard services filled in.
    pub fn with_name(name: &str) -> Self {
        let mut c = RunnerConfig {
            name: name.to_owned(),
            listen: default_runner_listen(),
            server_public_key_file: None,
            labels: BTreeMap::new(),
            advertise_url: None,
            join: None,
            packs_dir: None,
            exec_path: default_exec_path(),
            max_output_bytes: default_max_output_bytes(),
            services: BTreeMap::new(),
            programs: BTreeMap::new(),
            allowlists: BTreeMap::new(),
        };
        c.fill_standard_services();
        c
    }

    pub fn load(path: &Path) -> anyhow::Result<Self> {
        Self::load_for_join(path, false)
    }

    /// Loads runner.toml; `joining` says the command line supplies the join settings, so
    /// the server's public key may come from the server.
    pub fn load_for_join(path: &Path, joining: bool) -> anyhow::Result<Self> {
        let mut c: Self = read_toml(path)?;
        c.fill_standard_services();
        if joining && c.join.is_none() {
            c.join = Some(JoinConfig {
                server: String::new(),
                token: String::new(),
            });
        }
        c.check()?;
        Ok(c)
    }

    pub fn fill_standard_services(&mut self) {
        for (name, url) in STANDARD_SERVICES {
            self.services
                .entry((*name).to_owned())
                .or_insert_with(|| ServiceConfig {
                    base_url: (*url).to_owned(),
                    headers: BTreeMap::new(),
                });
        }
    }

    pub fn check(&self) -> anyhow::Result<()> {
        if !crate::pack::is_identifier(&self.name) {
            anyhow::bail!("name `{}` must be an identifier", self.name);
        }
        if self.server_public_key_file.is_none() && self.join.is_none() {
            anyhow::bail!(
                "server_public_key_file is required unless the runner joins a server ([join] or --server/--join-token)"
            );
        }
        for (k, v) in &self.labels {
            if !crate::pack::is_identifier(k) || !crate::pack::is_identifier(v) {
                anyhow::bail!("labels: `{k} = {v}` must be identifiers");
            }
        }
        for (name, s) in &self.services {
            let url = reqwest::Url::parse(&s.base_url).with_context(|| {
                format!("services.{name}.base_url `{}` is not a URL", s.base_url)
            })?;
            if !matches!(url.scheme(), "http" | "https") {
                anyhow::bail!("services.{name}.base_url must be http or https");
            }
        }
        for (name, argv) in &self.programs {
            if argv.is_empty() || !argv[0].starts_with('/') {
                anyhow::bail!(
                    "programs.{name} must be a non-empty argv starting with an absolute path"
                );
            }
        }
        if self.max_output_bytes < 1024 || self.max_output_bytes > 64 * 1024 * 1024 {
            anyhow::bail!("max_output_bytes must be between 1024 and 67108864");
        }
        Ok(())
    }

    /// Every pack with http actions needs its service configured.
    pub fn check_services(&self, packs: &PackSet) -> anyhow::Result<()> {
        for p in packs.packs() {
            if let Some(s) = &p.service
                && !self.services.contains_key(s)
            {
                anyhow::bail!(
                    "pack `{}` needs [services.{s}] in the runner config",
                    p.name
                );
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_examples_load() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
        let server = ServerConfig::load(&root.join("emisar.toml")).unwrap();
        assert_eq!(server.runners.len(), 2);
        assert!(server.runners[1].serves("traefik") && !server.runners[1].serves("consul"));
        assert_eq!(server.webhooks.len(), 2);
        assert!(
            !format!("{:?}", server.webhooks).contains("XXXX"),
            "hook URLs are secrets"
        );
        let runner = RunnerConfig::load(&root.join("runner.toml")).unwrap();
        assert_eq!(runner.services["nomad"].base_url, "http://127.0.0.1:4646");
        assert!(!format!("{:?}", runner.services["consul"]).contains("replace-with"));
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
    }
}
