//! The binaries that ship, run as processes: `emisar-runner` built node-only
//! (`--no-default-features`, what every node runs) and `emisar` built without the lab
//! (`--no-default-features --features server`, what the Debian package ships).
//! `scripts/build-shipped` builds both into `target/shipped/` (scripts/test runs it before
//! `cargo test`); a test that asks for them fails loudly when one is missing or older than the
//! sources it is built from, and never skips.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::SystemTime;

use emisar::node::config::RunnerConfig;
use emisar::server::config::ServerConfig;
use serde_json::{Map, Value, json};

use super::app::Options;
use super::tools::{Proc, bound_addr};

/// Which build of the server and the runners a test runs against.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub enum Build {
    /// The library, all features, inside the test process (most tests).
    #[default]
    InProcess,
    /// `target/shipped/emisar serve` and `target/shipped/emisar-runner`, as processes.
    Shipped,
}

/// What the shipped binaries are built from (besides `src/`): a change to any of these after
/// the build makes them stale.
const SOURCES: &[&str] = &[
    "src",
    "packs",
    "migrations",
    "web",
    "docs/agent-guide.md",
    "build.rs",
    "Cargo.toml",
    "Cargo.lock",
];

/// The shipped build of `name` (`emisar` or `emisar-runner`); panics, saying how to build it,
/// when it is missing or older than a source.
pub fn binary(name: &str) -> PathBuf {
    let path = shipped_dir().join(name);
    let built = std::fs::metadata(&path)
        .and_then(|m| m.modified())
        .unwrap_or_else(|e| {
            panic!(
                "the shipped build {} is missing ({e}): run scripts/build-shipped (scripts/test does) before cargo test",
                path.display()
            )
        });
    let stale = newer_than(built, source_files());
    assert!(
        stale.is_empty(),
        "the shipped build {} is older than {} (and {} more): run scripts/build-shipped again",
        path.display(),
        stale[0].display(),
        stale.len() - 1
    );
    path
}

/// `target/shipped/`, next to the `target/debug/` cargo test built into.
fn shipped_dir() -> PathBuf {
    let debug_bin = Path::new(env!("CARGO_BIN_EXE_emisar"));
    let target = debug_bin
        .parent()
        .and_then(Path::parent)
        .expect("CARGO_BIN_EXE_emisar is TARGET/PROFILE/emisar");
    target.join("shipped")
}

/// The sources of [`SOURCES`] changed after `built`.
fn newer_than(built: SystemTime, sources: Vec<(PathBuf, SystemTime)>) -> Vec<PathBuf> {
    sources
        .into_iter()
        .filter(|(_, modified)| *modified > built)
        .map(|(path, _)| path)
        .collect()
}

/// Every file under [`SOURCES`] with its modification time.
fn source_files() -> Vec<(PathBuf, SystemTime)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for source in SOURCES {
        collect_files(&root.join(source), &mut files);
    }
    files
}

fn collect_files(path: &Path, files: &mut Vec<(PathBuf, SystemTime)>) {
    let meta = std::fs::metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    if meta.is_dir() {
        for entry in std::fs::read_dir(path).unwrap() {
            collect_files(&entry.unwrap().path(), files);
        }
    } else {
        files.push((path.to_owned(), meta.modified().unwrap()));
    }
}

/// Panics naming the first of `options` that the shipped server's emisar.toml written here
/// does not carry (rather than run a test without it).
pub fn refuse_unsupported(options: &Options) {
    let unsupported = [
        ("oidc", options.oidc.is_some()),
        ("oauth", options.oauth.is_some()),
        ("server_tls", options.server_tls.is_some()),
        ("webhooks", !options.webhooks.is_empty()),
        ("notices", options.notices.is_some()),
        ("public_url", options.public_url.is_some()),
        ("allowed_origins", !options.allowed_origins.is_empty()),
        ("login", options.login.is_some()),
        ("webauthn", options.webauthn.is_some()),
        ("transparency", options.transparency.is_some()),
        ("join", options.join.is_some()),
    ];
    if let Some((name, _)) = unsupported.iter().find(|(_, set)| *set) {
        panic!(
            "Options::{name} is not written into the shipped server's emisar.toml (harness/shipped.rs)"
        );
    }
}

/// Starts the shipped `emisar-runner` on `config` (written to `dir`); returns its URL and
/// the process (killed when dropped).
pub async fn start_runner(config: &RunnerConfig, dir: &Path) -> (String, Proc) {
    let file = dir.join(format!("runner-{}.toml", config.name));
    std::fs::write(&file, runner_toml(config)).unwrap();
    let log = dir.join(format!("runner-{}.log", config.name));
    let mut runner = spawn(
        Command::new(binary("emisar-runner"))
            .args(["--config", file.to_str().unwrap()])
            .env_remove("EMISAR_JOIN_TOKEN"),
        &log,
    );
    let addr = bound_addr(&mut runner, &log, "runner listening").await;
    let scheme = if config.tls_cert_file.is_some() {
        "https"
    } else {
        "http"
    };
    (format!("{scheme}://{addr}"), runner)
}

/// Starts the shipped `emisar serve` on `config` and `database_url` (written to `dir`);
/// returns the address it serves on and the process (killed when dropped).
pub async fn start_server(
    config: &ServerConfig,
    database_url: &str,
    dir: &Path,
) -> (SocketAddr, Proc) {
    let file = dir.join("emisar.toml");
    std::fs::write(&file, server_toml(config, database_url)).unwrap();
    let log = dir.join("emisar-serve.log");
    let mut server = spawn(
        Command::new(binary("emisar"))
            .args(["serve", "--config", file.to_str().unwrap()])
            .env_remove("DATABASE_URL"),
        &log,
    );
    let addr = bound_addr(&mut server, &log, "emisar serving MCP").await;
    (addr, server)
}

/// Stops `process` with SIGTERM, as systemd does, and waits (generously) until it has exited
/// cleanly.
pub async fn stop(mut process: Proc) {
    let pid = nix::unistd::Pid::from_raw(process.0.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let status = loop {
        if let Some(status) = process.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the process did not stop within 30 s of SIGTERM"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert!(status.success(), "the process exited with {status}");
}

fn spawn(command: &mut Command, log: &Path) -> Proc {
    Proc(
        command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .unwrap(),
    )
}

/// runner.toml for `config`: every field the harness sets.
fn runner_toml(config: &RunnerConfig) -> String {
    let mut t = Map::new();
    t.insert("name".into(), json!(config.name));
    t.insert("listen".into(), json!(config.listen));
    t.insert("state_dir".into(), json!(config.state_dir));
    t.insert(
        "insecure_http".into(),
        json!(config.tls_cert_file.is_none()),
    );
    t.insert("exec_path".into(), json!(config.exec_path));
    t.insert("max_output_bytes".into(), json!(config.max_output_bytes));
    t.insert("labels".into(), json!(config.labels));
    t.insert("programs".into(), json!(config.programs));
    t.insert("allowlists".into(), json!(config.allowlists));
    let services: Map<String, Value> = config
        .services
        .iter()
        .map(|(name, s)| {
            let service = json!({"base_url": s.base_url, "headers": s.headers});
            (name.clone(), service)
        })
        .collect();
    t.insert("services".into(), Value::Object(services));
    let signed = json!(config.require_signed_approvals);
    t.insert("require_signed_approvals".into(), signed);
    let roots = json!(config.approvers_root_keys);
    t.insert("approvers_root_keys".into(), roots);
    let serial = json!(config.min_approvers_serial);
    t.insert("min_approvers_serial".into(), serial);
    t.insert("require_witnessed".into(), json!(config.require_witnessed));
    t.insert("witness_keys".into(), json!(config.witness_keys));
    let optional = [
        (
            "server_public_key_file",
            json!(config.server_public_key_file),
        ),
        ("packs_dir", json!(config.packs_dir)),
        ("tls_cert_file", json!(config.tls_cert_file)),
        ("tls_key_file", json!(config.tls_key_file)),
        ("approvers_file", json!(config.approvers_file)),
        ("log_key", json!(config.log_key)),
        ("witness_quorum", json!(config.witness_quorum)),
    ];
    insert_present(&mut t, optional);
    toml::to_string(&t).unwrap()
}

/// emisar.toml for `config` on `database_url`: every field the harness sets.
fn server_toml(config: &ServerConfig, database_url: &str) -> String {
    let mut t = Map::new();
    t.insert("listen".into(), json!(config.listen));
    t.insert("database_url".into(), json!(database_url));
    t.insert("signing_key_file".into(), json!(config.signing_key_file));
    t.insert("insecure_http".into(), json!(config.insecure_http));
    t.insert("call_timeout_ms".into(), json!(config.call_timeout_ms));
    t.insert("allowed_hosts".into(), json!(config.allowed_hosts));
    let limits = [
        ("rate_limit_per_second", config.rate_limit_per_second.into()),
        ("rate_limit_burst", config.rate_limit_burst.into()),
        ("health_probe_interval_ms", config.health_probe_interval_ms),
        ("approval_wait_secs", config.approval_wait_secs),
        ("approval_ttl_secs", config.approval_ttl_secs),
        ("approval_progress_ms", config.approval_progress_ms),
        ("max_pending_per_agent", config.max_pending_per_agent.into()),
        (
            "max_connections_per_address",
            config.max_connections_per_address as u64,
        ),
    ];
    for (key, value) in limits {
        t.insert(key.into(), json!(value));
    }
    let networks = json!({"allowed_networks": config.join.allowed_networks});
    t.insert("join".into(), networks);
    let runners: Vec<Value> = config.runners.iter().map(runner_entry).collect();
    t.insert("runners".into(), Value::Array(runners));
    let optional = [
        ("packs_dir", json!(config.packs_dir)),
        ("audit_key_file", json!(config.audit_key_file)),
        ("policy_file", json!(config.policy_file)),
        ("runner_ca_file", json!(config.runner_ca_file)),
        ("approvers_file", json!(config.approvers_file)),
        (
            "approvers_signature_file",
            json!(config.approvers_signature_file),
        ),
    ];
    insert_present(&mut t, optional);
    toml::to_string(&t).unwrap()
}

/// One `[[runners]]` entry of emisar.toml.
fn runner_entry(entry: &emisar::server::config::RunnerEntry) -> Value {
    let mut t = Map::new();
    t.insert("name".into(), json!(entry.name));
    t.insert("url".into(), json!(entry.url));
    t.insert("labels".into(), json!(entry.labels));
    let optional = [
        ("tls_fingerprint", json!(entry.tls_fingerprint)),
        ("packs", json!(entry.packs)),
    ];
    insert_present(&mut t, optional);
    Value::Object(t)
}

/// Inserts each value that is not null (TOML has no null: an absent key is the default).
fn insert_present<const N: usize>(table: &mut Map<String, Value>, values: [(&str, Value); N]) {
    for (key, value) in values {
        if !value.is_null() {
            table.insert(key.into(), value);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use emisar::node::config::ServiceConfig;
    use emisar::server::config::RunnerEntry;

    use super::*;

    /// A runner config whose every field the harness sets differs from its default.
    fn runner_config() -> RunnerConfig {
        let mut config = RunnerConfig::with_name("hvn05");
        config.listen = "127.0.0.1:0".into();
        config.state_dir = "/tmp/state-hvn05".into();
        config.exec_path = "/opt/bin:/usr/bin".into();
        config.max_output_bytes = 4096;
        config.labels = BTreeMap::from([("dc".into(), "eu".into())]);
        config.programs = BTreeMap::from([("echo".into(), vec!["/bin/echo".into()])]);
        config.allowlists = BTreeMap::from([("units".into(), vec!["consul".into()])]);
        config.services = BTreeMap::from([(
            "consul".into(),
            ServiceConfig {
                base_url: "http://127.0.0.1:8500".into(),
                headers: BTreeMap::from([("X-Consul-Token".into(), "t".into())]),
            },
        )]);
        config.require_signed_approvals = vec!["linux.*".into()];
        config.approvers_root_keys = vec!["ssh-ed25519 AAAA root".into()];
        config.min_approvers_serial = 2;
        config.require_witnessed = true;
        config.witness_keys = vec!["w1".into()];
        config.server_public_key_file = Some("/tmp/server.pub".into());
        config.packs_dir = Some("/tmp/packs".into());
        config.tls_cert_file = Some("/tmp/cert.pem".into());
        config.tls_key_file = Some("/tmp/key.pem".into());
        config.approvers_file = Some("/tmp/approvers.toml".into());
        config.log_key = Some("log".into());
        config.witness_quorum = Some(1);
        config
    }

    #[test]
    fn runner_toml_carries_every_field_the_harness_sets() {
        let config = runner_config();
        let read: RunnerConfig = toml::from_str(&runner_toml(&config)).unwrap();
        assert_eq!(format!("{read:?}"), format!("{config:?}"));
        assert_eq!(
            read.services["consul"].headers,
            config.services["consul"].headers
        );
    }

    #[test]
    fn a_runner_without_a_certificate_serves_plain_http() {
        let mut config = runner_config();
        config.tls_cert_file = None;
        config.tls_key_file = None;
        let read: RunnerConfig = toml::from_str(&runner_toml(&config)).unwrap();
        assert!(read.insecure_http && read.tls_cert_file.is_none());
    }

    #[test]
    fn server_toml_carries_every_field_the_harness_sets() {
        let mut config = ServerConfig::with_signing_key("/tmp/server.key".into());
        config.listen = "127.0.0.1:0".into();
        config.database_url = Some("sqlite:///tmp/e.db".into());
        config.insecure_http = true;
        config.call_timeout_ms = 1234;
        config.allowed_hosts = vec!["localhost".into()];
        config.rate_limit_per_second = 7;
        config.rate_limit_burst = 8;
        config.health_probe_interval_ms = 9;
        config.approval_wait_secs = 10;
        config.approval_ttl_secs = 11;
        config.approval_progress_ms = 12;
        config.max_pending_per_agent = 13;
        config.max_connections_per_address = 14;
        config.join.allowed_networks = Some(vec!["127.0.0.0/8".into()]);
        config.runners = vec![RunnerEntry {
            name: "hvn05".into(),
            url: "https://127.0.0.1:1".into(),
            tls_fingerprint: Some("sha256:ab".into()),
            packs: Some(vec!["linux".into()]),
            labels: BTreeMap::from([("dc".into(), "eu".into())]),
        }];
        config.packs_dir = Some("/tmp/packs".into());
        config.audit_key_file = Some("/tmp/audit.key".into());
        config.policy_file = Some("/tmp/policy.yaml".into());
        config.runner_ca_file = Some("/tmp/ca.pem".into());
        config.approvers_file = Some("/tmp/approvers.toml".into());
        config.approvers_signature_file = Some("/tmp/approvers.toml.sig".into());
        let text = server_toml(&config, "sqlite:///tmp/e.db");
        let read: ServerConfig = toml::from_str(&text).unwrap();
        assert_eq!(format!("{read:?}"), format!("{config:?}"));
    }

    #[test]
    fn only_sources_changed_after_the_build_make_it_stale() {
        let built = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        let sources = vec![
            ("src/old.rs".into(), built - Duration::from_secs(1)),
            ("src/same.rs".into(), built),
            ("src/new.rs".into(), built + Duration::from_secs(1)),
        ];
        assert_eq!(newer_than(built, sources), [PathBuf::from("src/new.rs")]);
    }

    #[test]
    fn every_source_named_exists() {
        let files = source_files();
        for source in SOURCES {
            let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(source);
            assert!(files.iter().any(|(f, _)| f.starts_with(&path)), "{source}");
        }
    }
}
