//! `emisar config check FILE`: every check `emisar serve` or `emisar runner` runs at start on
//! its config file, without binding a port or connecting anywhere.
//!
//! Invariant: the checks are the ones the server and the runner run themselves (the
//! configs' own `check`, the key and certificate parsers, the pack loader, the policy check),
//! called here, never re-implemented; each problem is reported with the key it is about, and
//! every independent problem is reported, not only the first.

use std::path::Path;

use anyhow::Context;
use clap::ValueEnum;

use crate::node::config::RunnerConfig;
use crate::pack::PackSet;
use crate::server::config::ServerConfig;

/// Which program's config a file is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ConfigKind {
    /// emisar.toml, read by `emisar serve`.
    Server,
    /// runner.toml, read by `emisar runner` and `emisar-runner`.
    Runner,
}

/// Checks `path`; prints `ok` or every problem. The exit code is 1 when there is a problem.
pub(super) fn run(path: &Path, kind: Option<ConfigKind>) -> anyhow::Result<i32> {
    let kind = match kind {
        Some(kind) => kind,
        None => detect(path)?,
    };
    let problems = match kind {
        ConfigKind::Server => check_server(path),
        ConfigKind::Runner => check_runner(path),
    };
    if problems.is_empty() {
        println!("ok: {} ({} config)", path.display(), kind_name(kind));
        return Ok(0);
    }
    for problem in &problems {
        println!("{}: {problem}", path.display());
    }
    eprintln!(
        "{} problem(s) in {} ({} config)",
        problems.len(),
        path.display(),
        kind_name(kind)
    );
    Ok(1)
}

fn kind_name(kind: ConfigKind) -> &'static str {
    match kind {
        ConfigKind::Server => "server",
        ConfigKind::Runner => "runner",
    }
}

/// Tells a server config from a runner config by its top-level keys: any key only a server
/// config has (`signing_key_file`, `database_url`, `[[runners]]`, …) against any key only a
/// runner config has (`name`, `[services]`, `[allowlists]`, …). Keys both have (`listen`,
/// `[join]`, `state_dir`, …) say nothing. The two lists come from the configs' own schemas,
/// so a key added to either config is known here at once.
fn detect(path: &Path) -> anyhow::Result<ConfigKind> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("failed to read config {}", path.display()))?;
    let table: toml::Table =
        toml::from_str(&text).with_context(|| format!("invalid config {}", path.display()))?;
    kind_of(&table).map_err(|why| anyhow::anyhow!("{}: {why}", path.display()))
}

fn kind_of(table: &toml::Table) -> Result<ConfigKind, String> {
    use crate::util::config::top_level_keys;
    let server_keys = top_level_keys(schemars::schema_for!(ServerConfig));
    let runner_keys = top_level_keys(schemars::schema_for!(RunnerConfig));
    let only = |own: &[String], other: &[String]| -> Vec<String> {
        table
            .keys()
            .filter(|k| own.contains(k) && !other.contains(k))
            .map(|k| format!("`{k}`"))
            .collect()
    };
    let server = only(&server_keys, &runner_keys);
    let runner = only(&runner_keys, &server_keys);
    match (server.is_empty(), runner.is_empty()) {
        (false, true) => Ok(ConfigKind::Server),
        (true, false) => Ok(ConfigKind::Runner),
        (false, false) => Err(format!(
            "has keys only a server config has ({}) and keys only a runner config has ({}): pass --kind server or --kind runner to have the other kind's keys named as problems",
            server.join(", "),
            runner.join(", ")
        )),
        (true, true) => Err(
            "has no key only a server config has (such as `signing_key_file`) nor one only a runner config has (such as `name`): pass --kind server or --kind runner"
                .into(),
        ),
    }
}

/// `listen` must be `HOST:PORT` with a port number (`:0` allowed): the same text `bind` takes,
/// checked without binding or resolving the host.
fn check_listen(problems: &mut Vec<String>, listen: &str) {
    if listen.parse::<std::net::SocketAddr>().is_ok() {
        return;
    }
    let ok = listen
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
    if !ok {
        problems.push(format!(
            "listen `{listen}` must be HOST:PORT, e.g. 127.0.0.1:7700"
        ));
    }
}

/// The message of an error and its causes, on one line.
fn chain(e: &anyhow::Error) -> String {
    format!("{e:#}")
}

/// A file a key names must exist and be readable; the parse is the caller's.
fn readable(problems: &mut Vec<String>, key: &str, path: &Path) -> Option<String> {
    match std::fs::read_to_string(path) {
        Ok(text) => Some(text),
        Err(e) => {
            problems.push(format!("{key}: cannot read {}: {e}", path.display()));
            None
        }
    }
}

fn check_server(path: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    let config = match ServerConfig::read(path) {
        Ok(c) => c,
        Err(e) => return vec![chain(&e)],
    };
    if let Err(e) = config.check() {
        problems.push(chain(&e));
    }
    check_listen(&mut problems, &config.listen);
    if let Some(url) = &config.database_url
        && !(url.starts_with("postgres://")
            || url.starts_with("postgresql://")
            || url.starts_with("sqlite:"))
    {
        // Never print the URL: it may hold a password.
        problems.push("database_url must start with postgres:// or sqlite:".into());
    }
    if let Some(pem) = readable(&mut problems, "signing_key_file", &config.signing_key_file)
        && let Err(e) = crate::protocol::signing::CallSigner::from_pem(&pem)
    {
        problems.push(format!(
            "signing_key_file {}: {}",
            config.signing_key_file.display(),
            chain(&e)
        ));
    }
    if let (Some(cert), Some(key)) = (&config.tls_cert_file, &config.tls_key_file)
        && let Err(e) = crate::util::tls::server_config_from_files(cert, key)
    {
        problems.push(format!("tls_cert_file/tls_key_file: {}", chain(&e)));
    }
    if let Some(file) = &config.audit_key_file
        && let Err(e) = crate::server::secrets::AuditKey::from_file(file)
    {
        problems.push(format!("audit_key_file: {}", chain(&e)));
    }
    if let Some(t) = &config.transparency {
        match crate::server::audit::checkpoints::read_log_key(&t.log_key_file) {
            Ok(key) => {
                if let Err(e) = t.check_witness_keys(&key) {
                    problems.push(chain(&e));
                }
            }
            Err(e) => problems.push(format!("transparency.log_key_file: {}", chain(&e))),
        }
    }
    if let Err(e) = crate::server::runners::tls::RunnerTrust::new(
        config.runner_ca_file.as_deref(),
        config.insecure_http,
    ) {
        problems.push(chain(&e));
    }
    match PackSet::load(config.packs_dir.as_deref()) {
        Ok(packs) => {
            if let Some(policy) = &config.policy_file
                && let Err(e) = crate::server::policy::check_file(policy, &packs)
            {
                problems.push(format!("policy_file: {e}"));
            }
        }
        Err(e) => problems.push(format!("packs_dir: {e}")),
    }
    problems
}

fn check_runner(path: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    let config = match RunnerConfig::read(path) {
        Ok(c) => c,
        Err(e) => return vec![chain(&e)],
    };
    if let Err(e) = config.check() {
        problems.push(chain(&e));
    }
    check_listen(&mut problems, &config.listen);
    // A runner that joins starts with its kept credential or a join token; which it has is in
    // state_dir, read (never created) here as the runner reads it at start.
    if let Some(join) = &config.join
        && let Err(e) = crate::node::start::kept_credential(&config, join, join.token.is_some())
    {
        problems.push(format!("join: {}", chain(&e)));
    }
    if let Some(file) = &config.server_public_key_file
        && let Some(pem) = readable(&mut problems, "server_public_key_file", file)
        && let Err(e) = crate::protocol::signing::CallVerifier::from_pem(&pem, &config.name)
    {
        problems.push(format!(
            "server_public_key_file {}: {}",
            file.display(),
            chain(&e)
        ));
    }
    if let (Some(cert), Some(key)) = (&config.tls_cert_file, &config.tls_key_file)
        && let Err(e) = crate::util::tls::server_config_from_files(cert, key)
    {
        problems.push(format!("tls_cert_file/tls_key_file: {}", chain(&e)));
    }
    if let Some(ca) = &config.server_ca_file
        && let Err(e) = crate::util::tls::read_certificates(ca)
    {
        problems.push(format!("server_ca_file: {}", chain(&e)));
    }
    for (name, argv) in &config.programs {
        if let Some(program) = argv.first()
            && program.starts_with('/')
            && !Path::new(program).is_file()
        {
            problems.push(format!("programs.{name}: `{program}` is not a file"));
        }
    }
    if let Err(e) = crate::node::agent::check_approvals(&config) {
        problems.push(chain(&e));
    }
    match PackSet::load(config.packs_dir.as_deref()) {
        Ok(packs) => {
            if let Err(e) = config.check_services(&packs) {
                problems.push(chain(&e));
            }
        }
        Err(e) => problems.push(format!("packs_dir: {e}")),
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(text: &str) -> Result<ConfigKind, String> {
        kind_of(&toml::from_str(text).unwrap())
    }

    #[test]
    fn the_kind_comes_from_any_key_only_one_config_has() {
        // The operator guide's server config, with the `[join]` table it tells people to add:
        // `join` is a key of both configs, so it says nothing either way.
        let server = "listen = \"0.0.0.0:8080\"\npublic_url = \"https://emisar.example\"\n\n[join]\nenabled = true\n";
        assert_eq!(kind(server), Ok(ConfigKind::Server));
        assert_eq!(
            kind("database_url = \"postgres://e@db/emisar\"\n"),
            Ok(ConfigKind::Server)
        );
        assert_eq!(
            kind(
                "[join]\nserver_url = \"https://emisar.example\"\n\n[allowlists]\nsystemd_units = []\n"
            ),
            Ok(ConfigKind::Runner)
        );
        assert_eq!(kind("name = \"cache-1\"\n"), Ok(ConfigKind::Runner));
    }

    #[test]
    fn a_file_of_both_kinds_or_neither_names_what_it_found() {
        let both = kind("name = \"cache-1\"\nsigning_key_file = \"/etc/emisar/server.key\"\n")
            .unwrap_err();
        assert!(
            both.contains("keys only a server config has (`signing_key_file`)")
                && both.contains("keys only a runner config has (`name`)"),
            "{both}"
        );
        let neither = kind("listen = \"127.0.0.1:7700\"\n").unwrap_err();
        assert!(
            neither.contains("has no key only a server config has"),
            "{neither}"
        );
    }
}
