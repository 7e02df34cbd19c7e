//! `emisar serve`: build everything from settings, bind, serve until told to stop.
//!
//! With `tls_cert_file` and `tls_key_file` the server serves HTTPS itself (rustls, through
//! `util::tls::serve_https`); without them, plain HTTP for a TLS-terminating proxy in front.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use serde_json::json;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::pack::PackSet;
use crate::protocol::signing::CallSigner;
use crate::protocol::witnessed::WitnessTrust;
use crate::server::approvals::Approvals;
use crate::server::audit::checkpoints::Checkpointer;
use crate::server::audit::{AuditLog, NewEvent, kind};
use crate::server::config::ServerConfig;
use crate::server::db::Db;
use crate::server::gateway::{Gateway, GatewayParts, Limits, ServerApprovers, Witnessing};
use crate::server::notices::Notices;
use crate::server::runners::client::RunnerClient;
use crate::server::runners::registry::Registry;
use crate::server::secrets::AuditKey;
use crate::server::shared_limit::{Quota, SharedLimit};

pub struct Application {
    listener: TcpListener,
    router: Router,
    /// Set when the server serves HTTPS itself.
    tls: Option<Arc<rustls::ServerConfig>>,
    /// Connections open per client address, and the most each may hold.
    connections: crate::util::net::ConnectionCap,
    db: Db,
    /// Flushed once more after the last request finished, so no refusal counted in the
    /// current window is lost on a clean stop.
    audit: AuditLog,
    shutdown: CancellationToken,
}

impl Application {
    pub async fn build(config: ServerConfig, database_url: &str) -> anyhow::Result<Self> {
        let tls = checked_tls(&config)?;
        let packs = Arc::new(PackSet::load(config.packs_dir.as_deref())?);
        let (signer, public_pem) = read_signing_key(&config)?;
        let db = Db::connect(database_url).await?;
        let audit = AuditLog::start(db.clone());
        let (checkpointer, audit_key) = audit_signers(&config, &db, &audit)?;
        let (listener, addr, registry) = bind_and_trust(&config).await?;
        let shutdown = CancellationToken::new();
        let approvals = Approvals::new(db.clone(), audit.clone(), shutdown.clone());
        let configured = configured_parts(&config, &db, &shutdown)?;
        if let Some(notices) = Notices::start(
            &config.webhooks,
            &config.notices,
            config.public_url.as_deref(),
            &approvals,
            &audit,
            &shutdown,
        )? {
            notices.spawn(shutdown.clone());
        }
        let gateway = Arc::new(Gateway::new(GatewayParts {
            packs: packs.clone(),
            runners: registry.clone(),
            audit: audit.clone(),
            client: RunnerClient::new(signer.clone()),
            limits: limits(&config),
            audit_key,
            approvals,
            approvers: configured.approvers,
            shared_limit: configured.shared_limit,
            witnessing: configured.witnessing,
        })?);
        load_policy_file(&gateway, &config, &packs).await?;
        // Always handled, so `systemctl reload` never kills a server that has no policy file.
        spawn_policy_reload(
            gateway.clone(),
            config.policy_file.clone(),
            shutdown.clone(),
        )?;
        crate::server::metrics::handle();
        let identity = Arc::new(
            crate::server::oidc::identity::Identity::start(
                config.oidc.as_ref(),
                config.oauth.as_ref(),
                config.public_url.as_deref(),
                &shutdown,
            )
            .await?,
        );
        audit
            .append(server_started(&config, addr, tls.is_some(), &packs))
            .await
            .context("failed to write the first audit event")?;
        spawn_audit_tasks(&gateway, &audit, checkpointer, &shutdown);
        spawn_runner_tasks(&config, &db, &registry, signer, &shutdown);
        let (hosts, origins) = hosts_and_origins(&config, addr);
        let router = crate::server::http::router(
            gateway,
            db.clone(),
            public_pem,
            hosts,
            origins,
            is_https(&config, tls.is_some()),
            &config.login,
            config.join.attempts_per_address_per_minute,
            identity,
            config.relying_party(),
            shutdown.clone(),
        );
        Ok(Application {
            listener,
            router,
            tls,
            connections: crate::util::net::ConnectionCap::new(config.max_connections_per_address),
            db,
            audit,
            shutdown,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    pub fn db(&self) -> &Db {
        &self.db
    }

    /// Cancelling this token stops the server gracefully.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// Whether the server serves HTTPS (its URLs are `https://`).
    pub fn serves_tls(&self) -> bool {
        self.tls.is_some()
    }

    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        tracing::info!(addr = %self.local_addr(), "emisar serving MCP at {scheme}://…/mcp");
        let shutdown = self.shutdown.clone();
        let served = match self.tls {
            Some(tls) => {
                crate::util::tls::serve_https_capped(
                    self.listener,
                    self.router,
                    tls,
                    Some(self.connections),
                    shutdown,
                )
                .await
            }
            None => {
                // The peer's address reaches handlers as `ConnectInfo` (login limits count
                // by it); `serve_https` hands it on the same way.
                let service = self
                    .router
                    .into_make_service_with_connect_info::<SocketAddr>();
                axum::serve(
                    crate::util::net::capped(self.listener, self.connections),
                    service,
                )
                .with_graceful_shutdown(shutdown.cancelled_owned())
                .await
            }
        };
        // Every request has finished: what they counted goes out now (the flusher also
        // flushed when the stop began, while requests could still be refused).
        let counted = self.audit.flush_refusals().await;
        if counted > 0 {
            tracing::info!(refusals = counted, "repeated refusals audited at shutdown");
        }
        served
    }
}

/// The settings checked, and the certificate read before anything else starts, so a bad one
/// stops the server at once.
fn checked_tls(config: &ServerConfig) -> anyhow::Result<Option<Arc<rustls::ServerConfig>>> {
    config.check()?;
    let tls = serving_tls(config)?;
    if config.insecure_http {
        tracing::warn!(
            "insecure_http = true: runners may be reached over plain HTTP, with calls, arguments and results in clear"
        );
    }
    Ok(tls)
}

/// The key the server signs calls with, and its public half (PEM) that runners are given.
fn read_signing_key(config: &ServerConfig) -> anyhow::Result<(Arc<CallSigner>, String)> {
    let signing_pem = std::fs::read_to_string(&config.signing_key_file).with_context(|| {
        format!(
            "failed to read signing key {}",
            config.signing_key_file.display()
        )
    })?;
    let signer = Arc::new(CallSigner::from_pem(&signing_pem)?);
    let public_pem = crate::protocol::signing::public_pem_of(&signing_pem)?;
    Ok((signer, public_pem))
}

/// What signs the audit log: its checkpoints' key (with the witnesses) and the key of its
/// entries. Built before anything is served, so a bad log key or witness stops the server now.
fn audit_signers(
    config: &ServerConfig,
    db: &Db,
    audit: &AuditLog,
) -> anyhow::Result<(Option<Checkpointer>, Option<AuditKey>)> {
    let checkpointer = config
        .transparency
        .as_ref()
        .map(|t| Checkpointer::new(db.clone(), audit.clone(), t))
        .transpose()?;
    let audit_key = config
        .audit_key_file
        .as_deref()
        .map(AuditKey::from_file)
        .transpose()?;
    Ok((checkpointer, audit_key))
}

/// The listener bound, and the runners' registry with the trust it calls them with. Bound
/// first: joined runners may never be this address.
async fn bind_and_trust(
    config: &ServerConfig,
) -> anyhow::Result<(TcpListener, SocketAddr, Arc<Registry>)> {
    let listener = TcpListener::bind(&config.listen)
        .await
        .with_context(|| format!("failed to listen on {}", config.listen))?;
    let addr = listener.local_addr()?;
    let networks = crate::server::runners::networks::JoinNetworks::new(
        config.join.allowed_networks.as_deref(),
        vec![addr],
    )
    .map_err(anyhow::Error::msg)?;
    let trust = crate::server::runners::tls::RunnerTrust::new(
        config.runner_ca_file.as_deref(),
        config.insecure_http,
    )?
    .with_join_networks(networks);
    let registry = Registry::new(config.runners.clone(), trust)?;
    Ok((listener, addr, registry))
}

/// The policy file, if the settings name one, loaded into the gateway.
async fn load_policy_file(
    gateway: &Gateway,
    config: &ServerConfig,
    packs: &PackSet,
) -> anyhow::Result<()> {
    let Some(path) = &config.policy_file else {
        return Ok(());
    };
    // `check_file` rather than `Policy::load`: a name the packs lack is then reported with
    // the file it is in, like a parse error (`load_policy` checks again).
    gateway
        .load_policy(
            crate::server::policy::check_file(path, packs),
            &path.display().to_string(),
            "system",
        )
        .await
        .context("the policy file was not loaded")
}

/// The audit side's background work: expired approvals swept, repeated refusals flushed,
/// checkpoints signed.
fn spawn_audit_tasks(
    gateway: &Arc<Gateway>,
    audit: &AuditLog,
    checkpointer: Option<Checkpointer>,
    shutdown: &CancellationToken,
) {
    gateway.spawn_sweeper(Duration::from_secs(2), shutdown.clone());
    // Revoked grants a replica may not have finished telling every runner of.
    let resend = gateway.clone();
    tokio::spawn(async move { resend.resend_revocations().await });
    audit.spawn_refusal_flusher(shutdown.clone());
    if let Some(checkpointer) = checkpointer {
        tracing::info!(
            log_key = %checkpointer.verifier_key(),
            "signing checkpoints of the audit log (give auditors and witnesses this key)"
        );
        checkpointer.spawn(audit.appended(), shutdown.clone());
    }
}

/// The runners' background work: the joined runners synced from the store, and probed.
fn spawn_runner_tasks(
    config: &ServerConfig,
    db: &Db,
    registry: &Arc<Registry>,
    signer: Arc<CallSigner>,
    shutdown: &CancellationToken,
) {
    crate::server::fleet::spawn_sync(
        db.clone(),
        registry.clone(),
        Duration::from_secs(10),
        shutdown.clone(),
    );
    registry.spawn_prober(
        Duration::from_millis(config.health_probe_interval_ms),
        config.health_probes_per_second,
        shutdown.clone(),
        signer,
    );
}

/// Whether clients reach this server over HTTPS: it serves TLS itself, or its public URL
/// says so (a TLS-terminating proxy in front).
fn is_https(config: &ServerConfig, serves_tls: bool) -> bool {
    serves_tls
        || config
            .public_url
            .as_deref()
            .is_some_and(|u| u.starts_with("https://"))
}

/// Reloads the policy file on SIGHUP. A file that does not load leaves the policy in force
/// unchanged; both outcomes are audited. Without a policy file, SIGHUP is logged and ignored.
/// The TLS config the listener serves with, when `tls_cert_file` and `tls_key_file` are set:
/// read before anything else starts, so a bad certificate stops the server at once.
fn serving_tls(config: &ServerConfig) -> anyhow::Result<Option<Arc<rustls::ServerConfig>>> {
    let (Some(cert), Some(key)) = (&config.tls_cert_file, &config.tls_key_file) else {
        return Ok(None);
    };
    let (tls, fingerprint) = crate::util::tls::server_config_from_files(cert, key)?;
    tracing::info!(%fingerprint, cert = %cert.display(), "serving HTTPS");
    Ok(Some(tls))
}

/// The call path's limits, from the config.
fn limits(config: &ServerConfig) -> Limits {
    let mut limits = Limits::new(
        Duration::from_millis(config.call_timeout_ms),
        config.rate_limit_per_second,
        config.rate_limit_burst,
    );
    limits.approval_ttl = Duration::from_secs(config.approval_ttl_secs);
    limits.approval_wait = Duration::from_secs(config.approval_wait_secs);
    limits.progress_every = Duration::from_millis(config.approval_progress_ms);
    limits.approved_start_within = Duration::from_secs(config.approved_start_within_secs);
    limits.max_pending_per_agent = config.max_pending_per_agent;
    limits.max_grant_lifetime = Duration::from_secs(config.max_grant_lifetime_secs);
    limits.revocation_retry = Duration::from_millis(config.health_probe_interval_ms);
    limits
}

/// The gateway's parts that only some configs have (see [`GatewayParts`] for each).
struct ConfiguredParts {
    approvers: Option<ServerApprovers>,
    shared_limit: Option<Arc<SharedLimit>>,
    witnessing: Option<Witnessing>,
}

/// What the config gives the gateway beyond the parts every gateway has: the approvers file
/// the server carries, the rate limit's buckets shared with other replicas (PostgreSQL),
/// and whether executions wait for witnessed checkpoints.
fn configured_parts(
    config: &ServerConfig,
    db: &Db,
    shutdown: &CancellationToken,
) -> anyhow::Result<ConfiguredParts> {
    let approvers = match &config.approvers_file {
        Some(file) => Some(ServerApprovers::load(
            file,
            config.approvers_signature_file.as_deref(),
        )?),
        None if config.approvers_signature_file.is_some() => anyhow::bail!(
            "approvers_signature_file is set without approvers_file: set both, or neither"
        ),
        None => None,
    };
    let quota = Quota::per_second(config.rate_limit_per_second, config.rate_limit_burst);
    let shared_limit = SharedLimit::start(db, "agent:", quota, shutdown);
    // What the server verifies a witnessed checkpoint against: its own log key and the
    // witnesses' keys of its config, never the cosignature rows of its database alone.
    let witnessing = match config
        .transparency
        .as_ref()
        .filter(|t| !t.witnesses.is_empty())
    {
        Some(t) => {
            let log_key = crate::server::audit::checkpoints::read_log_key(&t.log_key_file)?;
            let keys: Vec<String> = t.witnesses.iter().map(|w| w.key.clone()).collect();
            let trust = WitnessTrust::new(
                &log_key.verifier_key(),
                &keys,
                t.witness_quorum.unwrap_or(keys.len()),
            )
            .map_err(|e| anyhow::anyhow!("[transparency]: {e}"))?;
            Some(Witnessing::new(db.clone(), trust))
        }
        None => None,
    };
    Ok(ConfiguredParts {
        approvers,
        shared_limit,
        witnessing,
    })
}

/// The first event a starting server writes: its version, address, packs and runners.
fn server_started(config: &ServerConfig, addr: SocketAddr, tls: bool, packs: &PackSet) -> NewEvent {
    NewEvent {
        actor: "system".into(),
        kind: kind::SERVER_STARTED.into(),
        outcome: Some("ok".into()),
        detail: Some(json!({
            "version": env!("CARGO_PKG_VERSION"),
            "listen": addr.to_string(),
            "tls": tls,
            "packs": packs.packs().map(|p| json!({"name": p.name, "sha256": p.digest, "origin": p.origin})).collect::<Vec<_>>(),
            "runners": config.runners.iter().map(|r| r.name.clone()).collect::<Vec<_>>(),
        })),
        ..Default::default()
    }
}

/// The `Host`s and `Origin`s the server answers to: the configured ones, the bound address
/// (tests and `dev` use port 0), and the name and origin of `public_url`, where people reach
/// the server even when a proxy in front passes its own `Host` on.
fn hosts_and_origins(config: &ServerConfig, addr: SocketAddr) -> (Vec<String>, Vec<String>) {
    let mut hosts = config.allowed_hosts.clone();
    hosts.push(addr.to_string());
    let mut origins = config.allowed_origins.clone();
    if let Some(public) = config
        .public_url
        .as_deref()
        .and_then(|u| u.parse::<axum::http::Uri>().ok())
        && let (Some(scheme), Some(authority)) = (public.scheme_str(), public.authority())
    {
        hosts.push(authority.as_str().to_owned());
        origins.push(format!("{scheme}://{authority}"));
    }
    (hosts, origins)
}

fn spawn_policy_reload(
    gateway: Arc<Gateway>,
    path: Option<std::path::PathBuf>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let mut hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .context("failed to listen for SIGHUP")?;
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                got = hangups.recv() => if got.is_none() { return },
            }
            let Some(path) = &path else {
                tracing::info!(
                    "SIGHUP: no policy_file is configured, so there is nothing to reload"
                );
                continue;
            };
            let source = path.display().to_string();
            match gateway
                .load_policy(
                    crate::server::policy::check_file(path, gateway.packs()),
                    &source,
                    "system:sighup",
                )
                .await
            {
                Ok(()) => tracing::info!(policy = %source, "policy reloaded"),
                Err(e) => {
                    tracing::error!(error = %format!("{e:#}"), "policy not reloaded; the previous one stays in force")
                }
            }
        }
    });
    Ok(())
}
