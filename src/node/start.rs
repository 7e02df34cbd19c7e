//! Starting a runner: bind its listener, join the server when configured to (presenting the
//! join token once, then sending heartbeats), and serve signed calls until told to stop.
//! `emisar runner` and the `emisar-runner` binary both start here.

use anyhow::Context;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::agent::{self, RunnerState};
use super::config::RunnerConfig;
use crate::pack::PackSet;
use crate::protocol::JoinRequest;

/// Runs the runner described by `config` until `shutdown` is cancelled.
pub async fn run(config: RunnerConfig, shutdown: CancellationToken) -> anyhow::Result<()> {
    let listener = TcpListener::bind(&config.listen)
        .await
        .with_context(|| format!("failed to listen on {}", config.listen))?;
    let state = match config.join.clone() {
        None => RunnerState::new(config)?,
        Some(join) => {
            let packs = PackSet::load(config.packs_dir.as_deref())?;
            let url = config
                .advertise_url
                .clone()
                .unwrap_or_else(|| format!("http://{}", listener.local_addr().expect("bound")));
            let request = JoinRequest {
                name: config.name.clone(),
                url,
                labels: config.labels.clone(),
                packs: packs
                    .packs()
                    .map(|p| (p.name.clone(), p.digest.clone()))
                    .collect(),
            };
            let joined = super::join::join(&join.server, &join.token, &request, &shutdown).await?;
            tracing::info!(server = %join.server, runner = %request.name, "joined");
            super::join::spawn_heartbeats(
                join.server.clone(),
                joined.runner_token,
                std::time::Duration::from_millis(joined.heartbeat_interval_ms.max(1000)),
                shutdown.clone(),
            );
            RunnerState::with_key(config, &joined.server_public_key)?
        }
    };
    agent::run(listener, state, shutdown).await?;
    Ok(())
}
