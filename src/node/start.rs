//! Starting a runner: bind its listener, take its TLS identity (configured, or self-signed in
//! `state_dir`), join the server when configured to (presenting the join token once, with the
//! certificate's fingerprint, then sending heartbeats), and serve signed calls until told to
//! stop. `emisar runner` and the `emisar-runner` binary both start here.
//!
//! Invariant: the runner serves HTTPS unless its config says `insecure_http = true` and names
//! no certificate.

use anyhow::Context;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::agent::{self, RunnerState};
use super::config::RunnerConfig;
use crate::pack::PackSet;
use crate::protocol::JoinRequest;

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
            let packs = PackSet::load(config.packs_dir.as_deref())?;
            let scheme = if tls.is_some() { "https" } else { "http" };
            let url = config
                .advertise_url
                .clone()
                .unwrap_or_else(|| format!("{scheme}://{}", listener.local_addr().expect("bound")));
            let request = JoinRequest {
                name: config.name.clone(),
                url,
                labels: config.labels.clone(),
                packs: packs
                    .packs()
                    .map(|p| (p.name.clone(), p.digest.clone()))
                    .collect(),
                tls_fingerprint: tls.as_ref().map(|t| t.fingerprint.to_string()),
            };
            let http = super::join::server_client(&config)?;
            let joined =
                super::join::join(&http, &join.server, &join.token, &request, &shutdown).await?;
            tracing::info!(server = %join.server, runner = %request.name, "joined");
            super::join::spawn_heartbeats(
                http,
                join.server.clone(),
                joined.runner_token,
                std::time::Duration::from_millis(joined.heartbeat_interval_ms.max(1000)),
                shutdown.clone(),
            );
            RunnerState::with_key(config, &joined.server_public_key)?
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
