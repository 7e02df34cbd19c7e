//! Typed settings for `emisar runner` (runner.toml).
//!
//! Unknown keys are errors, so a typo never silently leaves a default in place.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::Deserialize;

use super::credential::CredentialStore;
use crate::pack::PackSet;
use crate::protocol::JoinToken;
use crate::util::config::read_config;

/// runner.toml's top-level keys, for the error that names a key read into the wrong table
/// (`util::config::read_config`); the runner-only build has no schema to take them from, and a
/// test holds this list to the schema.
const TOP_LEVEL_KEYS: &[&str] = &[
    "name",
    "listen",
    "server_public_key_file",
    "labels",
    "advertise_url",
    "state_dir",
    "tls_cert_file",
    "tls_key_file",
    "server_ca_file",
    "insecure_http",
    "join",
    "packs_dir",
    "exec_path",
    "max_output_bytes",
    "services",
    "programs",
    "allowlists",
    "require_signed_approvals",
    "approvers_file",
    "approvers_root_keys",
    "min_approvers_serial",
    "max_approval_lifetime_secs",
    "max_grant_lifetime_secs",
    "require_witnessed",
    "log_key",
    "witness_keys",
    "witness_quorum",
];

#[cfg_attr(feature = "server", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunnerConfig {
    /// This runner's name: signed calls must carry it as their audience.
    pub name: String,
    /// The address the runner serves signed calls on, e.g. `127.0.0.1:7701` (`:0` picks a
    /// free port).
    #[serde(default = "default_runner_listen")]
    pub listen: String,
    /// The server's Ed25519 public key (SPKI PEM), e.g. `/etc/emisar/server.pub`. A runner that joins may leave it out: it
    /// then takes the key from the join answer, checked against the fingerprint its join
    /// token carries. When set, it always wins: the join answer's key must be this one.
    #[serde(default)]
    pub server_public_key_file: Option<PathBuf>,
    /// Labels that agents' and tokens' selectors match, e.g. `{ role = "edge" }`.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// The URL the server reaches this runner at, when it joins, e.g.
    /// `https://node1.example:7701` (default: `https://LISTEN`, or `http://LISTEN` when the
    /// runner serves plain HTTP).
    #[serde(default)]
    pub advertise_url: Option<String>,
    /// Where the runner keeps what it creates for itself: the credential a runner that joined
    /// re-registers with after a restart, without a join token (`credential.json`), and its
    /// self-signed TLS certificate and key (`tls/`). Created mode 0700 when first needed.
    #[serde(default = "default_state_dir")]
    pub state_dir: PathBuf,
    /// The runner's TLS certificate (PEM, chain allowed) and key. Without them the runner
    /// serves a self-signed certificate it creates once in `state_dir`; the server pins it by
    /// fingerprint (`emisar runner fingerprint`, or sent when the runner joins). E.g.
    /// `/etc/emisar/tls/runner.crt`.
    #[serde(default)]
    pub tls_cert_file: Option<PathBuf>,
    /// The private key (PEM) of `tls_cert_file`, e.g. `/etc/emisar/tls/runner.key`.
    #[serde(default)]
    pub tls_key_file: Option<PathBuf>,
    /// The CA (PEM) that signed the server's certificate, when it is not in the system's
    /// trust store, e.g. `/etc/emisar/tls/server-ca.crt`. When set, it is the only CA the join
    /// client trusts.
    #[serde(default)]
    pub server_ca_file: Option<PathBuf>,
    /// Allows plain HTTP: serving calls without TLS (when no certificate is configured) and
    /// joining an `http://` server. Loopback tests and `emisar dev` only: calls, arguments,
    /// results and tokens would travel in clear.
    #[serde(default)]
    pub insecure_http: bool,
    /// Join a server instead of being listed in its config.
    #[serde(default)]
    pub join: Option<JoinConfig>,
    /// A directory of pack files that add to or replace the stock packs: the same files,
    /// byte for byte, as the server's `packs_dir`, e.g. `/etc/emisar/packs`.
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
    /// Allowlists that params refer to (`allowlist: NAME` in a pack; the stock packs use
    /// `systemd_units` and `debian_packages`). A list that is not here is empty: every value
    /// is refused.
    #[serde(default)]
    pub allowlists: BTreeMap<String, Vec<String>>,
    /// Tools (patterns, `*` for any run of characters; `["*"]` for every risk:high tool) whose
    /// executions run here only with people's signatures, checked by this runner against its
    /// approvers file: a compromised server cannot make it run one. Empty: off.
    #[serde(default)]
    pub require_signed_approvals: Vec<String>,
    /// The approvers file this runner trusts as deployed (people, their SSH keys and passkeys,
    /// and per tool how many must sign): `emisar approvers add|remove|show` write it.
    #[serde(default)]
    pub approvers_file: Option<PathBuf>,
    /// Organisation root keys (`ssh-ed25519 AAAA… comment`): without `approvers_file`, an
    /// approvers file the server carries counts only when one of these signed it (`emisar
    /// approvers sign`), and never one older (by `serial`) than one accepted before.
    #[serde(default)]
    pub approvers_root_keys: Vec<String>,
    /// The lowest `serial` of an approvers file this runner takes, e.g. `12`: a runner whose
    /// `state_dir` is new (or was lost) then never accepts a file older than the one in force
    /// when it was deployed. Default 0.
    #[serde(default)]
    pub min_approvers_serial: u64,
    /// The longest an approval may live, from its request to its expiry, in seconds (default
    /// 1260: the server's default 15 min `approval_ttl_secs`, 5 min
    /// `approved_start_within_secs`, and a minute of clock skew). A signed statement or a
    /// witnessed approval that lives longer, or whose approval event is older, is refused.
    /// Raise it with the server's settings.
    #[serde(default = "default_max_approval_lifetime")]
    pub max_approval_lifetime_secs: u64,
    /// The longest a grant (people's signed, time-boxed mandate for an agent's writes, or a
    /// break-glass window) may live from when it was asked for, in seconds: a grant that
    /// lives longer is refused here, whatever its signatures. Default 3600 (1 h), the most
    /// 86400.
    #[serde(default = "default_max_grant_lifetime")]
    pub max_grant_lifetime_secs: u64,
    /// Run a risk:high write only when the call carries its approval's `approval.approved`
    /// audit event with an inclusion proof in a checkpoint signed by `log_key` and cosigned by
    /// `witness_quorum` of `witness_keys`: then no approval runs here that every witness does
    /// not hold in the log. Default: off.
    #[serde(default)]
    pub require_witnessed: bool,
    /// The audit log's verifier key (`emisar audit log-keygen` printed it), e.g.
    /// `emisar.example.com/audit+1a2b3c4d+AXyz…`.
    #[serde(default)]
    pub log_key: Option<String>,
    /// The witnesses' cosignature verifier keys (`emisar witness keygen` printed them).
    #[serde(default)]
    pub witness_keys: Vec<String>,
    /// How many of `witness_keys` must have cosigned (default: all of them).
    #[serde(default)]
    pub witness_quorum: Option<usize>,
}

#[cfg_attr(feature = "server", derive(schemars::JsonSchema))]
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JoinConfig {
    /// The server's base URL, e.g. https://emisar.example.internal. Kept here for good: a
    /// runner that joined restarts from this file alone, re-registering at this server with
    /// the credential it keeps in `state_dir`.
    pub server: String,
    /// A join token from `emisar join-token issue`. Needed once: after joining, the runner
    /// re-registers with the credential it keeps in `state_dir`, and a token left here is
    /// ignored (it may expire).
    #[serde(default)]
    pub token: Option<String>,
    /// Whether `server` came only from `--server` on the command line (runner.toml names no
    /// server, or another one): the runner then says, once it is in, that a restart from the
    /// file alone would not find this server.
    #[serde(skip)]
    pub server_from_command_line: bool,
}

impl JoinConfig {
    /// The join token, parsed (a malformed one is an error here, before any network call).
    pub fn join_token(&self) -> anyhow::Result<Option<JoinToken>> {
        self.token
            .as_deref()
            .map(JoinToken::parse)
            .transpose()
            .context("join.token (or --join-token)")
    }
}

impl std::fmt::Debug for JoinConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JoinConfig")
            .field("server", &self.server)
            .finish_non_exhaustive()
    }
}

#[cfg_attr(feature = "server", derive(schemars::JsonSchema))]
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceConfig {
    /// The service's local address, e.g. `http://127.0.0.1:8500`; packs add only the path.
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

fn default_max_approval_lifetime() -> u64 {
    crate::protocol::approval::DEFAULT_MAX_LIFETIME_SECS
}
fn default_max_grant_lifetime() -> u64 {
    crate::protocol::approval::grant::DEFAULT_MAX_LIFETIME_SECS
}
fn default_state_dir() -> PathBuf {
    PathBuf::from("/var/lib/emisar-runner")
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
            state_dir: default_state_dir(),
            tls_cert_file: None,
            tls_key_file: None,
            server_ca_file: None,
            insecure_http: false,
            join: None,
            packs_dir: None,
            exec_path: default_exec_path(),
            max_output_bytes: default_max_output_bytes(),
            services: BTreeMap::new(),
            programs: BTreeMap::new(),
            allowlists: BTreeMap::new(),
            require_signed_approvals: Vec::new(),
            approvers_file: None,
            approvers_root_keys: Vec::new(),
            min_approvers_serial: 0,
            max_approval_lifetime_secs: default_max_approval_lifetime(),
            max_grant_lifetime_secs: default_max_grant_lifetime(),
            require_witnessed: false,
            log_key: None,
            witness_keys: Vec::new(),
            witness_quorum: None,
        };
        c.fill_standard_services();
        c
    }

    pub fn load(path: &Path) -> anyhow::Result<Self> {
        Self::load_with_join(path, None, None)
    }

    /// Loads runner.toml; a `server` or `token` from the command line replaces the one in
    /// `[join]` (and is checked like it: an `http://` server needs `insecure_http`).
    pub fn load_with_join(
        path: &Path,
        server: Option<String>,
        token: Option<String>,
    ) -> anyhow::Result<Self> {
        let mut c = Self::read(path)?;
        if server.is_some() || token.is_some() {
            let file = c.join.take();
            let file_server = file.as_ref().map(|j| j.server.clone());
            let server_from_command_line = server
                .as_deref()
                .is_some_and(|s| file_server.as_deref() != Some(s));
            let server = server.or(file_server).context(
                "a join token needs a server to join: set [join] server = \"https://…\" in runner.toml (or pass --server URL)",
            )?;
            let token = token.or_else(|| file.and_then(|j| j.token));
            c.join = Some(JoinConfig {
                server,
                token,
                server_from_command_line,
            });
        }
        c.check()?;
        Ok(c)
    }

    /// Reads runner.toml and checks only its TLS settings: enough for `emisar runner
    /// fingerprint`, which runs before the runner has joined or has a server key.
    pub fn load_for_tls(path: &Path) -> anyhow::Result<Self> {
        let c = Self::read(path)?;
        c.check_tls()?;
        Ok(c)
    }

    /// Reads runner.toml without checking it (`emisar config check` runs the checks itself,
    /// so it can report every problem rather than the first).
    pub fn read(path: &Path) -> anyhow::Result<Self> {
        let mut c: Self = read_config(path, TOP_LEVEL_KEYS)?;
        c.fill_standard_services();
        Ok(c)
    }

    /// Whether the runner serves HTTPS: with its configured certificate, or else with its
    /// self-signed one unless `insecure_http` says plain HTTP.
    pub fn serves_tls(&self) -> bool {
        self.tls_cert_file.is_some() || !self.insecure_http
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
        if !crate::util::input::is_identifier(&self.name) {
            anyhow::bail!("name `{}` must be an identifier", self.name);
        }
        if self.server_public_key_file.is_none() && self.join.is_none() {
            anyhow::bail!("{}", self.no_server());
        }
        for (k, v) in &self.labels {
            if !crate::util::input::is_identifier(k) || !crate::util::input::is_identifier(v) {
                anyhow::bail!("labels: `{k} = {v}` must be identifiers");
            }
        }
        self.check_tls()?;
        if !(10..=86_400).contains(&self.max_grant_lifetime_secs) {
            anyhow::bail!("max_grant_lifetime_secs must be between 10 and 86400 (a day)");
        }
        if !(10..=crate::protocol::approval::MAX_LIFETIME_SECS)
            .contains(&self.max_approval_lifetime_secs)
        {
            anyhow::bail!(
                "max_approval_lifetime_secs must be between 10 and {} (the server's longest approval_ttl_secs and approved_start_within_secs, and a minute)",
                crate::protocol::approval::MAX_LIFETIME_SECS
            );
        }
        if let Some(join) = &self.join {
            let url = reqwest::Url::parse(&join.server)
                .with_context(|| format!("join.server `{}` is not a URL", join.server))?;
            match url.scheme() {
                "https" => {}
                "http" if self.insecure_http => {}
                "http" => anyhow::bail!(
                    "join.server `{}` is plain HTTP: the join token, this runner's token and the server's public key would travel in clear; use https:// (see server_ca_file) or set insecure_http = true (loopback tests and `emisar dev` only)",
                    join.server
                ),
                _ => anyhow::bail!("join.server `{}` must be an http(s) URL", join.server),
            }
            join.join_token()?;
        }
        if self.join.is_some() && self.advertise_url.is_none() && listens_on_wildcard(&self.listen)
        {
            anyhow::bail!(
                "advertise_url is required: listen `{}` is a wildcard address, and a runner that joins announces the URL the server reaches it at; without advertise_url it would announce `{}`, which no server can reach. Set advertise_url to this node's address, e.g. https://node1.example:7701",
                self.listen,
                self.listen
            );
        }
        if let Some(advertised) = &self.advertise_url {
            let scheme = if self.serves_tls() {
                "https://"
            } else {
                "http://"
            };
            if !advertised.starts_with(scheme) {
                anyhow::bail!(
                    "advertise_url `{advertised}` must start with {scheme}: this runner serves {} (tls_cert_file, insecure_http)",
                    if self.serves_tls() {
                        "HTTPS"
                    } else {
                        "plain HTTP"
                    }
                );
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
        // exec.rs only searches absolute directories; saying so here beats a program that is
        // "not found" in a directory the operator listed.
        if let Some(bad) = self.exec_path.split(':').find(|dir| !dir.starts_with('/')) {
            anyhow::bail!(
                "exec_path `{}`: every directory must be an absolute path (found `{bad}`; an empty \
                 entry would mean the working directory)",
                self.exec_path
            );
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

    /// What to say when runner.toml names no server: neither `server_public_key_file` (a
    /// runner in the server's `[[runners]]`) nor `[join] server`. A runner that joined before
    /// has its server in its credential, so the message names the exact line to add.
    fn no_server(&self) -> String {
        let store = CredentialStore::new(&self.state_dir);
        // Only a hint: a credential that cannot be read (another user's, malformed) is
        // reported by the runner itself when it uses it.
        match store.load() {
            Ok(Some(credential)) if credential.runner == self.name => format!(
                "runner `{}` names no server: runner.toml has neither [join] server nor server_public_key_file. It joined {} before and keeps its credential in {}: add `server = \"{}\"` under [join] in runner.toml, and it re-registers with that credential at every start, no join token needed",
                self.name,
                credential.server,
                store.path().display(),
                credential.server
            ),
            _ => format!(
                "runner `{}` names no server: set server_public_key_file (the server's public key) for a runner listed in the server's [[runners]], or [join] server = \"https://…\" for a runner that joins (with a join token for its first start: [join] token, --join-token or EMISAR_JOIN_TOKEN; after that its credential in {} is enough)",
                self.name,
                store.path().display()
            ),
        }
    }

    /// The settings the runner's TLS identity needs (its self-signed certificate lives in
    /// `state_dir`, next to the credential).
    fn check_tls(&self) -> anyhow::Result<()> {
        if self.tls_cert_file.is_some() != self.tls_key_file.is_some() {
            anyhow::bail!("tls_cert_file and tls_key_file go together: set both or neither");
        }
        if self.state_dir.as_os_str().is_empty() || !self.state_dir.is_absolute() {
            anyhow::bail!(
                "state_dir `{}` must be an absolute path",
                self.state_dir.display()
            );
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

/// Whether `listen` is `0.0.0.0:PORT` or `[::]:PORT`: every address of the node, none of
/// which is one a server could be told to use.
fn listens_on_wildcard(listen: &str) -> bool {
    listen
        .parse::<std::net::SocketAddr>()
        .is_ok_and(|a| a.ip().is_unspecified())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "server")]
    #[test]
    fn the_top_level_keys_are_the_schemas() {
        let mut listed: Vec<&str> = TOP_LEVEL_KEYS.to_vec();
        let mut schema = crate::util::config::top_level_keys(schemars::schema_for!(RunnerConfig));
        listed.sort_unstable();
        schema.sort_unstable();
        assert_eq!(listed, schema);
    }

    #[test]
    fn a_joining_runner_on_a_wildcard_address_needs_advertise_url() {
        for listen in ["0.0.0.0:7701", "[::]:7701"] {
            let mut c = RunnerConfig::with_name("edge1");
            c.listen = listen.into();
            c.join = Some(JoinConfig {
                server: "https://emisar.example".into(),
                token: None,
                server_from_command_line: false,
            });
            let err = c.check().unwrap_err().to_string();
            assert!(
                err.starts_with("advertise_url is required") && err.contains(listen),
                "{err}"
            );
            c.advertise_url = Some("https://edge1.example:7701".into());
            c.check().unwrap();
        }
        // A runner the server lists in its config announces nothing.
        let mut c = RunnerConfig::with_name("edge1");
        c.listen = "0.0.0.0:7701".into();
        c.server_public_key_file = Some("/etc/emisar/server.pub".into());
        c.check().unwrap();
    }

    #[test]
    fn exec_path_takes_absolute_directories_only() {
        let runner = || {
            let mut c = RunnerConfig::with_name("edge1");
            c.server_public_key_file = Some("/etc/emisar/server.pub".into());
            c
        };
        for bad in ["bin:/usr/bin", "/usr/bin::/bin", "/usr/bin:", "./tools"] {
            let mut c = runner();
            c.exec_path = bad.into();
            let err = c.check().unwrap_err().to_string();
            assert!(
                err.starts_with(&format!(
                    "exec_path `{bad}`: every directory must be an absolute path"
                )),
                "{err}"
            );
        }
        let mut c = runner();
        c.exec_path = "/usr/local/bin:/usr/bin".into();
        c.check().unwrap();
    }

    #[test]
    fn shipped_example_loads() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
        let runner = RunnerConfig::load(&root.join("runner.toml")).unwrap();
        assert_eq!(runner.services["nomad"].base_url, "http://127.0.0.1:4646");
        assert!(!format!("{:?}", runner.services["consul"]).contains("replace-with"));
    }
}
