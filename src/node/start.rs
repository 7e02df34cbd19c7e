//! Starting a runner: bind its listener, take its TLS identity (configured, or self-signed in
//! `state_dir`), establish its identity at the server when it joins one, and serve signed
//! calls until told to stop. `emisar runner` and the `emisar-runner` binary both start here.
//!
//! A runner that joins proves who it is in one of two ways: with the credential it kept from
//! an earlier join (re-registration: no join token needed, so a runner restarts long after
//! its join token expired), or, when it has none or the server no longer accepts it, with a
//! join token, once. Either way it sends the fingerprint of the certificate it serves, which
//! the server pins, and talks to the server through a client that verifies the server's
//! certificate. The server's key it trusts comes from `server_public_key_file` when
//! configured, else from the join answer checked against the join token's fingerprint (and,
//! after that, from the credential that pinned it).
//!
//! Invariant: the runner serves HTTPS unless its config says `insecure_http = true` and names
//! no certificate.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::agent::{self, RunnerState};
use super::config::{JoinConfig, RunnerConfig};
use super::credential::{Credential, CredentialStore};
use super::join::{self, ServerRefusal};
use crate::pack::PackSet;
use crate::protocol::join::JoinToken;
use crate::protocol::signing::key_fingerprint;
use crate::protocol::{JoinRequest, RegisterRequest};

/// Runs the runner described by `config` until `shutdown` is cancelled.
pub async fn run(config: RunnerConfig, shutdown: CancellationToken) -> anyhow::Result<()> {
    let tls = super::tls::identity(&config)?;
    if tls.is_none() {
        tracing::warn!(
            "insecure_http = true: this runner serves plain HTTP; calls, arguments and results travel in clear"
        );
    }
    let listener = TcpListener::bind(&config.listen)
        .await
        .with_context(|| format!("failed to listen on {}", config.listen))?;
    let state = match config.join.clone() {
        None => RunnerState::new(config)?,
        Some(join) => {
            let scheme = if tls.is_some() { "https" } else { "http" };
            let url = config
                .advertise_url
                .clone()
                .unwrap_or_else(|| format!("{scheme}://{}", listener.local_addr().expect("bound")));
            // Everything slow (loading and checking the packs) happens before the server
            // learns this runner's URL, so the runner serves as soon as the server knows it.
            let packs = PackSet::load(config.packs_dir.as_deref())?;
            config.check_services(&packs)?;
            let http = join::server_client(&config)?;
            let announce = Announce {
                url,
                tls_fingerprint: tls.as_ref().map(|t| t.fingerprint.to_string()),
                packs: &packs,
            };
            let identity = establish(&config, &join, &http, announce, &shutdown).await?;
            if join.server_from_command_line {
                tracing::warn!(
                    server = %join.server,
                    "the server came from --server only: runner.toml names no [join] server (or another one), so a restart from the file alone (as systemd starts it) would not find this server; add `server = \"{}\"` under [join] in runner.toml",
                    join.server
                );
            }
            let state =
                RunnerState::with_key_and_packs(config, &identity.server_public_key, packs)?;
            join::spawn_heartbeats(
                http,
                join.server.clone(),
                identity.runner_token,
                identity.heartbeat_interval,
                shutdown.clone(),
            );
            state
        }
    };
    match tls {
        Some(tls) => {
            tracing::info!(fingerprint = %tls.fingerprint, cert = %tls.cert_file.display(), "serving HTTPS");
            agent::run_https(listener, state, tls.config, shutdown).await?
        }
        None => agent::run(listener, state, shutdown).await?,
    }
    Ok(())
}

/// What a runner needs from its server to serve: the key that verifies calls, and the token
/// its heartbeats carry.
struct Identity {
    server_public_key: String,
    runner_token: String,
    heartbeat_interval: Duration,
}

/// What the runner tells the server about itself when it joins or re-registers.
struct Announce<'a> {
    /// Where the server reaches it.
    url: String,
    /// Of the certificate it serves at `url` (none when it serves plain HTTP).
    tls_fingerprint: Option<String>,
    packs: &'a PackSet,
}

/// Re-registers with the kept credential, or joins with the join token, through `http` (the
/// client that verifies the server's certificate); see the module docs.
async fn establish(
    config: &RunnerConfig,
    join: &JoinConfig,
    http: &reqwest::Client,
    announce: Announce<'_>,
    shutdown: &CancellationToken,
) -> anyhow::Result<Identity> {
    let token = join.join_token()?;
    let configured_key = configured_server_key(config)?;
    check_token_issuer(token.as_ref(), configured_key.as_deref())?;
    let store = CredentialStore::new(&config.state_dir);
    store.prepare()?;
    let at = Server {
        config,
        join,
        http,
        store,
        configured_key,
        shutdown,
    };
    let packs = announced_packs(announce.packs);
    if let Some(credential) = kept_credential(config, join, token.is_some())? {
        let request = RegisterRequest {
            url: announce.url.clone(),
            packs: packs.clone(),
            tls_fingerprint: announce.tls_fingerprint.clone(),
        };
        if let Some(identity) = at.reregister(credential, &request, token.is_some()).await? {
            return Ok(identity);
        }
    }
    // `kept_credential` answered no credential only because there is a token.
    let Some(token) = token else {
        anyhow::bail!(
            "runner `{}` has no join token for {}",
            config.name,
            join.server
        );
    };
    let request = JoinRequest {
        name: config.name.clone(),
        url: announce.url,
        labels: config.labels.clone(),
        packs,
        tls_fingerprint: announce.tls_fingerprint,
    };
    at.join_with(&token, &request).await
}

/// The server key `server_public_key_file` names, if it names one.
fn configured_server_key(config: &RunnerConfig) -> anyhow::Result<Option<String>> {
    config
        .server_public_key_file
        .as_deref()
        .map(|path| {
            std::fs::read_to_string(path)
                .with_context(|| format!("failed to read server public key {}", path.display()))
        })
        .transpose()
}

/// A token issued by a server with another key than the configured one can only lead to a
/// refused answer; say so before spending it.
fn check_token_issuer(
    token: Option<&JoinToken>,
    configured_key: Option<&str>,
) -> anyhow::Result<()> {
    let (Some(token), Some(configured)) = (token, configured_key) else {
        return Ok(());
    };
    let fingerprint = key_fingerprint(configured).context("server_public_key_file is not a key")?;
    if fingerprint != token.pins.key_sha256 {
        anyhow::bail!(
            "the join token was issued by a server whose key (sha256 {}) is not server_public_key_file (sha256 {fingerprint}): issue a token on the server this runner trusts",
            token.pins.key_sha256
        );
    }
    Ok(())
}

/// The packs a runner announces: each name with its digest.
fn announced_packs(packs: &PackSet) -> BTreeMap<String, String> {
    packs
        .packs()
        .map(|p| (p.name.clone(), p.digest.clone()))
        .collect()
}

/// The server a runner establishes its identity at, and what it brings there.
struct Server<'a> {
    config: &'a RunnerConfig,
    join: &'a JoinConfig,
    http: &'a reqwest::Client,
    /// Where the runner's credential is kept.
    store: CredentialStore,
    /// The server key `server_public_key_file` names: trusted over any the server answers.
    configured_key: Option<String>,
    shutdown: &'a CancellationToken,
}

impl Server<'_> {
    /// Re-registers with the kept credential. `None` when the server refused it and the
    /// runner has a join token to join with instead.
    async fn reregister(
        &self,
        credential: Credential,
        request: &RegisterRequest,
        has_token: bool,
    ) -> anyhow::Result<Option<Identity>> {
        let (config, join) = (self.config, self.join);
        let registered = join::register(
            self.http,
            &join.server,
            &credential.runner_token,
            request,
            self.shutdown,
        )
        .await;
        match registered {
            Ok(registered) => {
                if registered.runner != config.name {
                    anyhow::bail!(
                        "the server knows this runner's credential as `{}`, not `{}`: remove {} and join again",
                        registered.runner,
                        config.name,
                        self.store.path().display()
                    );
                }
                tracing::info!(server = %join.server, runner = %config.name, "re-registered with the kept credential");
                Ok(Some(Identity {
                    server_public_key: self
                        .configured_key
                        .clone()
                        .unwrap_or(credential.server_public_key),
                    runner_token: credential.runner_token,
                    heartbeat_interval: join::told_interval(registered.heartbeat_interval_ms),
                }))
            }
            Err(ServerRefusal::Refused { status, body }) => {
                let why = format!(
                    "the server refused the credential of runner `{}` in {} (HTTP {status}: {body})",
                    config.name,
                    self.store.path().display()
                );
                if !has_token {
                    anyhow::bail!(
                        "{why}. It no longer knows this runner (was it removed with `emisar runner remove {}`?). Issue a new join token (`emisar join-token issue --name {}`) and start the runner with --join-token: the credential is replaced when the join succeeds",
                        config.name,
                        config.name
                    );
                }
                tracing::warn!("{why}; joining with the join token instead");
                Ok(None)
            }
            Err(e) => anyhow::bail!("failed to re-register at {}: {e}", join.server),
        }
    }

    /// Joins with the join token, checks the key the server answered and keeps the
    /// credential it handed out.
    async fn join_with(self, token: &JoinToken, request: &JoinRequest) -> anyhow::Result<Identity> {
        let (config, join) = (self.config, self.join);
        let joined = join::join(self.http, &join.server, token, request, self.shutdown).await?;
        join::check_server_key(
            &joined.server_public_key,
            &token.pins,
            self.configured_key.as_deref(),
        )?;
        self.store.save(&Credential {
            server: join.server.clone(),
            runner: config.name.clone(),
            runner_token: joined.runner_token.clone(),
            server_public_key: joined.server_public_key.clone(),
        })?;
        tracing::info!(server = %join.server, runner = %config.name, labels = ?joined.labels, packs = ?joined.packs, credential = %self.store.path().display(), "joined");
        if joined.packs.is_empty() {
            tracing::warn!(runner = %config.name, "the join token grants none of the packs this runner serves: the server will send it no calls (issue a token with --pack NAME)");
        }
        Ok(Identity {
            server_public_key: self.configured_key.unwrap_or(joined.server_public_key),
            runner_token: joined.runner_token,
            heartbeat_interval: join::told_interval(joined.heartbeat_interval_ms),
        })
    }
}

/// The credential a runner that joins re-registers with at start, read from `state_dir`
/// before any network call: `Some` when it holds one for `join.server` and its name, `None`
/// when it holds none but `has_token` (it joins), and an error saying what is missing when it
/// has neither. The runner's start and `emisar config check` both ask this.
pub fn kept_credential(
    config: &RunnerConfig,
    join: &JoinConfig,
    has_token: bool,
) -> anyhow::Result<Option<Credential>> {
    let store = CredentialStore::new(&config.state_dir);
    match store.load()? {
        Some(credential) if credential.is_for(&join.server, &config.name) => Ok(Some(credential)),
        Some(other) if has_token => {
            tracing::info!(
                credential_server = %other.server,
                credential_runner = %other.runner,
                "the kept credential is for another server or name; joining"
            );
            Ok(None)
        }
        None if has_token => Ok(None),
        Some(other) => anyhow::bail!(
            "runner `{}` has no credential for {} and no join token: {} holds the credential of runner `{}` at {}. Set [join] server to the server it joined (and name to its name), or give a join token for {} ([join] token, --join-token or EMISAR_JOIN_TOKEN; from `emisar join-token issue`)",
            config.name,
            join.server,
            store.path().display(),
            other.runner,
            other.server,
            join.server
        ),
        None => anyhow::bail!(
            "runner `{}` has no credential for {} in {} and no join token: it has not joined yet (or its state_dir was lost). Give it a join token for its first start ([join] token, --join-token or EMISAR_JOIN_TOKEN; from `emisar join-token issue`); after that it restarts with its credential alone",
            config.name,
            join.server,
            config.state_dir.display()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::signing::generate_keypair;

    fn token_pinning(public_pem: &str) -> JoinToken {
        let pin = key_fingerprint(public_pem).unwrap();
        JoinToken::parse(&format!(
            "emj_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA.key={pin}"
        ))
        .unwrap()
    }

    #[test]
    fn a_token_from_another_server_than_the_configured_key_is_refused_before_it_is_spent() {
        let (_, ours) = generate_keypair().unwrap();
        let (_, theirs) = generate_keypair().unwrap();
        check_token_issuer(Some(&token_pinning(&ours)), Some(&ours)).unwrap();
        check_token_issuer(Some(&token_pinning(&ours)), None).unwrap();
        check_token_issuer(None, Some(&ours)).unwrap();
        let err = check_token_issuer(Some(&token_pinning(&theirs)), Some(&ours))
            .unwrap_err()
            .to_string();
        assert!(err.contains("is not server_public_key_file"), "{err}");
        let err = check_token_issuer(Some(&token_pinning(&ours)), Some("not a key"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("server_public_key_file is not a key"), "{err}");
    }
}
