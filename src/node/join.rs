//! The runner's side of joining a server: present the join token once (retrying with
//! backoff until the server answers), then send heartbeats with the runner token.
//!
//! Invariant: the server's certificate is verified (system roots, or only `server_ca_file`);
//! plain HTTP is possible only when the config says `insecure_http = true`, which the
//! config check requires for an `http://` server.

use std::time::Duration;

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use super::config::RunnerConfig;
use crate::protocol::{JoinRequest, JoinResponse};
use crate::util::{Backoff, error_chain};

/// The client that talks to the server (the join, then heartbeats). It verifies the server's
/// TLS certificate with the system's trust store, or with `server_ca_file` alone when set.
///
/// This is where trust in the server is decided: pinning the server's certificate by a
/// fingerprint the join token carries belongs here too, as another way to build the client.
pub fn server_client(config: &RunnerConfig) -> anyhow::Result<reqwest::Client> {
    let mut builder = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(3))
        .timeout(Duration::from_secs(10))
        // A redirect could take the join token somewhere else.
        .redirect(reqwest::redirect::Policy::none())
        .https_only(!config.insecure_http);
    if let Some(path) = &config.server_ca_file {
        let pem = std::fs::read(path)
            .with_context(|| format!("failed to read server_ca_file {}", path.display()))?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem).with_context(|| {
            format!(
                "server_ca_file {} is not a PEM certificate bundle",
                path.display()
            )
        })?;
        if certs.is_empty() {
            anyhow::bail!("server_ca_file {} holds no PEM CERTIFICATE", path.display());
        }
        builder = builder.tls_certs_only(certs);
    }
    builder
        .build()
        .context("failed to build the client that joins the server")
}

/// Joins `server`, retrying unreachable or unavailable servers with capped exponential
/// backoff and full jitter. A refused token is final.
pub async fn join(
    http: &reqwest::Client,
    server: &str,
    join_token: &str,
    request: &JoinRequest,
    shutdown: &CancellationToken,
) -> anyhow::Result<JoinResponse> {
    let url = format!("{}/api/runners/join", server.trim_end_matches('/'));
    let backoff = Backoff::try_new(Duration::from_millis(500), Duration::from_secs(30))
        .expect("valid bounds");
    let mut attempt = 0;
    loop {
        let why = match http
            .post(&url)
            .bearer_auth(join_token)
            .json(request)
            .send()
            .await
        {
            Ok(r) if r.status().is_success() => {
                return r
                    .json()
                    .await
                    .context("the server's join answer is unreadable");
            }
            Ok(r) if r.status().is_client_error() => {
                let status = r.status();
                let body = r.text().await.unwrap_or_default();
                anyhow::bail!(
                    "the server refused to let `{}` join (HTTP {status}): {body}",
                    request.name
                );
            }
            Ok(r) => format!("HTTP {}", r.status()),
            Err(e) => error_chain(&e),
        };
        let wait = backoff.delay(attempt);
        attempt = attempt.saturating_add(1);
        tracing::warn!(server, error = %why, retry_in_ms = wait.as_millis() as u64, "join failed; retrying");
        tokio::select! {
            _ = shutdown.cancelled() => anyhow::bail!("stopped before joining"),
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// Sends a heartbeat every `interval` until `shutdown`; failures back off (capped at the
/// interval, full jitter) and are logged, never fatal.
pub fn spawn_heartbeats(
    http: reqwest::Client,
    server: String,
    runner_token: String,
    interval: Duration,
    shutdown: CancellationToken,
) {
    tokio::spawn(async move {
        let url = format!("{}/api/runners/heartbeat", server.trim_end_matches('/'));
        let backoff = Backoff::try_new(
            Duration::from_millis(500),
            interval.max(Duration::from_secs(1)),
        )
        .expect("valid bounds");
        let mut failures = 0u32;
        loop {
            let wait = if failures == 0 {
                interval
            } else {
                backoff.delay(failures)
            };
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
            match http.post(&url).bearer_auth(&runner_token).send().await {
                Ok(r) if r.status().is_success() => failures = 0,
                Ok(r) => {
                    failures = failures.saturating_add(1);
                    tracing::warn!(status = %r.status(), "heartbeat refused");
                }
                Err(e) => {
                    failures = failures.saturating_add(1);
                    tracing::warn!(error = %error_chain(&e), "heartbeat failed");
                }
            }
        }
    });
}
