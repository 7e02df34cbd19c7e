//! The runner's side of its identity at a server: join once with a join token (and check
//! that the answer comes from the server the token names), re-register after a restart with
//! the credential it kept, and send heartbeats, all through one client that verifies the
//! server's TLS certificate.
//!
//! Invariants: a join answer whose server key does not match the join token's fingerprint
//! (or, when one is configured, `server_public_key_file`) is refused before anything is
//! saved. The server's certificate is verified (system roots, or only `server_ca_file`);
//! plain HTTP is possible only when the config says `insecure_http = true`, which the config
//! check requires for an `http://` server.

use std::time::Duration;

use anyhow::Context;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use super::config::RunnerConfig;
use crate::protocol::signing::key_fingerprint;
use crate::protocol::{
    JoinRequest, JoinResponse, JoinToken, RegisterRequest, RegisterResponse, ServerPins,
};
use crate::util::{Backoff, error_chain};

/// The client that talks to the server (the join or re-registration, then heartbeats). It
/// verifies the server's TLS certificate with the system's trust store, or with
/// `server_ca_file` alone when set.
///
/// This is where trust in the server's transport is decided; trust in its signing key is
/// decided by [`check_server_key`] against the join token's fingerprint.
pub fn server_client(config: &RunnerConfig) -> anyhow::Result<reqwest::Client> {
    let mut builder = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(3))
        .timeout(Duration::from_secs(10))
        // The answer must come from the server the runner was told to join, not from
        // wherever that server's address redirects (which could take the join token
        // somewhere else).
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

/// How a request to the server ended when it did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum ServerRefusal {
    /// The server answered 4xx: retrying the same request cannot help.
    #[error("HTTP {status}: {body}")]
    Refused {
        status: reqwest::StatusCode,
        body: String,
    },
    #[error("stopped before the server answered")]
    Stopped,
    #[error("the server's answer is unreadable: {0}")]
    Unreadable(String),
}

/// POSTs `body` to `server` + `path` with a bearer token, retrying unreachable or unavailable
/// servers (5xx) and 429 with capped exponential backoff and full jitter. Any other 4xx
/// answer is final.
async fn post<B: Serialize, R: DeserializeOwned>(
    http: &reqwest::Client,
    server: &str,
    path: &str,
    bearer: &str,
    body: &B,
    shutdown: &CancellationToken,
) -> Result<R, ServerRefusal> {
    let url = format!("{}{path}", server.trim_end_matches('/'));
    let backoff = Backoff::try_new(Duration::from_millis(500), Duration::from_secs(30))
        .expect("valid bounds");
    let mut attempt = 0;
    loop {
        let why = match http.post(&url).bearer_auth(bearer).json(body).send().await {
            Ok(r) if r.status().is_success() => {
                return r
                    .json()
                    .await
                    .map_err(|e| ServerRefusal::Unreadable(error_chain(&e)));
            }
            // 429 (too many joins from this address) passes: it is retried with backoff.
            Ok(r)
                if (r.status().is_client_error()
                    && r.status() != reqwest::StatusCode::TOO_MANY_REQUESTS)
                    || r.status().is_redirection() =>
            {
                let status = r.status();
                let body = r.text().await.unwrap_or_default();
                return Err(ServerRefusal::Refused {
                    status,
                    body: body.chars().take(1000).collect(),
                });
            }
            Ok(r) => format!("HTTP {}", r.status()),
            Err(e) => error_chain(&e),
        };
        let wait = backoff.delay(attempt);
        attempt = attempt.saturating_add(1);
        tracing::warn!(%url, error = %why, retry_in_ms = wait.as_millis() as u64, "the server did not answer; retrying");
        tokio::select! {
            _ = shutdown.cancelled() => return Err(ServerRefusal::Stopped),
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// Joins `server` with `token` (presenting only its secret). The answer is not checked here:
/// [`check_server_key`] does that before the caller keeps anything of it.
pub async fn join(
    http: &reqwest::Client,
    server: &str,
    token: &JoinToken,
    request: &JoinRequest,
    shutdown: &CancellationToken,
) -> anyhow::Result<JoinResponse> {
    post(
        http,
        server,
        "/api/runners/join",
        token.secret(),
        request,
        shutdown,
    )
    .await
    .map_err(|e| match e {
        ServerRefusal::Refused { status, body } => anyhow::anyhow!(
            "the server refused to let `{}` join (HTTP {status}): {body}",
            request.name
        ),
        other => anyhow::anyhow!("failed to join {server}: {other}"),
    })
}

/// Re-registers a runner that joined before, with its own runner token.
pub async fn register(
    http: &reqwest::Client,
    server: &str,
    runner_token: &str,
    request: &RegisterRequest,
    shutdown: &CancellationToken,
) -> Result<RegisterResponse, ServerRefusal> {
    post(
        http,
        server,
        "/api/runners/register",
        runner_token,
        request,
        shutdown,
    )
    .await
}

/// Refuses a join answer whose server key is not the one the runner was told to trust: the
/// configured `server_public_key_file` when there is one, otherwise the key whose
/// fingerprint the join token carries.
pub fn check_server_key(
    answered_pem: &str,
    pins: &ServerPins,
    configured_pem: Option<&str>,
) -> anyhow::Result<()> {
    let answered = key_fingerprint(answered_pem)
        .context("the server's join answer carries no readable public key; nothing was saved")?;
    match configured_pem {
        Some(configured) => {
            let expected =
                key_fingerprint(configured).context("server_public_key_file is not a key")?;
            if answered != expected {
                anyhow::bail!(
                    "the server's key does not match server_public_key_file (answered sha256 {answered}, configured {expected}): someone may be in the middle; nothing was saved"
                );
            }
        }
        None => {
            if answered != pins.key_sha256 {
                anyhow::bail!(
                    "the server's key does not match the fingerprint in the join token (answered sha256 {answered}, token {}): someone may be in the middle; nothing was saved",
                    pins.key_sha256
                );
            }
        }
    }
    Ok(())
}

/// The longest heartbeat interval a server may ask for.
const MAX_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(600);

/// The heartbeat interval the server asked for, kept between a second and ten minutes
/// whatever it says.
pub(crate) fn told_interval(ms: u64) -> Duration {
    Duration::from_millis(ms).clamp(Duration::from_secs(1), MAX_HEARTBEAT_INTERVAL)
}

/// The interval to keep after a heartbeat the server answered with `body`: the one it asks
/// for, or `current` when it names none (a server before the field) or is unreadable.
fn interval_after(current: Duration, body: &[u8]) -> Duration {
    serde_json::from_slice::<crate::protocol::HeartbeatResponse>(body)
        .ok()
        .and_then(|answer| answer.heartbeat_interval_ms)
        .map_or(current, told_interval)
}

/// Sends a heartbeat every `interval` (or what the server's answers ask for since: it
/// lengthens the interval as the fleet grows) until `shutdown`; failures back off (capped at
/// the first interval, full jitter) and are logged, never fatal.
pub fn spawn_heartbeats(
    http: reqwest::Client,
    server: String,
    runner_token: String,
    mut interval: Duration,
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
                Ok(r) if r.status().is_success() => {
                    failures = 0;
                    // An answer that cannot be read still counts as heard.
                    let told = interval_after(interval, &r.bytes().await.unwrap_or_default());
                    if told != interval {
                        tracing::info!(
                            interval_ms = told.as_millis() as u64,
                            "the server asks for heartbeats at another interval"
                        );
                        interval = told;
                    }
                }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::signing::generate_keypair;

    #[test]
    fn the_server_sets_the_heartbeat_interval_within_bounds() {
        let now = Duration::from_secs(10);
        let told = |body: &str| interval_after(now, body.as_bytes());
        assert_eq!(
            told(r#"{"runner":"a","heartbeat_interval_ms":20000}"#),
            Duration::from_secs(20)
        );
        assert_eq!(told(r#"{"runner":"a"}"#), now, "an older server: kept");
        assert_eq!(told("not json"), now);
        assert_eq!(
            told(r#"{"runner":"a","heartbeat_interval_ms":5}"#),
            Duration::from_secs(1)
        );
        assert_eq!(
            told(r#"{"runner":"a","heartbeat_interval_ms":86400000}"#),
            MAX_HEARTBEAT_INTERVAL
        );
    }

    #[test]
    fn a_substituted_key_is_refused() {
        let (_, server) = generate_keypair().unwrap();
        let (_, intruder) = generate_keypair().unwrap();
        let pins = ServerPins {
            key_sha256: key_fingerprint(&server).unwrap(),
        };
        check_server_key(&server, &pins, None).unwrap();
        let err = check_server_key(&intruder, &pins, None)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("does not match the fingerprint in the join token")
                && err.contains("nothing was saved"),
            "{err}"
        );
        // A configured key wins over the token's fingerprint, both ways.
        check_server_key(&intruder, &pins, Some(&intruder)).unwrap();
        let err = check_server_key(&server, &pins, Some(&intruder))
            .unwrap_err()
            .to_string();
        assert!(err.contains("server_public_key_file"), "{err}");
        assert!(check_server_key("garbage", &pins, None).is_err());
    }
}
