//! The server's view of its runners: who they are, which packs they serve, and how healthy
//! each is (last heartbeat, last call, breaker). Shared by the gateway, the prober and the API.
//!
//! Invariant: a runner whose breaker is open is never called; the call fails fast with a
//! message that says since when and why.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::backoff::Backoff;
use super::breaker::{Breaker, Rejection};
use crate::config::RunnerEntry;

/// Consecutive failures that open a runner's breaker.
const BREAKER_THRESHOLD: u32 = 3;

struct Health {
    breaker: Breaker,
    last_heartbeat: Option<chrono::DateTime<chrono::Utc>>,
    heartbeat_ok: Option<bool>,
    last_call: Option<chrono::DateTime<chrono::Utc>>,
    last_error: Option<String>,
    /// Consecutive failed probes, for the prober's backoff.
    probe_failures: u32,
}

pub struct Registry {
    entries: BTreeMap<String, (RunnerEntry, Mutex<Health>)>,
}

/// One runner's health as the API, the metrics and the `emisar.runners` tool show it.
#[derive(Debug, Clone, Serialize)]
pub struct RunnerStatus {
    pub name: String,
    pub url: String,
    pub packs: Option<Vec<String>>,
    pub breaker: &'static str,
    pub breaker_open_since: Option<String>,
    pub healthy: bool,
    pub last_heartbeat: Option<String>,
    pub heartbeat_ok: Option<bool>,
    pub last_call: Option<String>,
    pub last_error: Option<String>,
}

fn cooldown() -> Backoff {
    Backoff::try_new(Duration::from_secs(2), Duration::from_secs(60)).expect("valid bounds")
}

impl Registry {
    pub fn new(runners: Vec<RunnerEntry>) -> Arc<Self> {
        let entries = runners
            .into_iter()
            .map(|r| {
                let health = Health {
                    breaker: Breaker::new(BREAKER_THRESHOLD, cooldown()),
                    last_heartbeat: None,
                    heartbeat_ok: None,
                    last_call: None,
                    last_error: None,
                    probe_failures: 0,
                };
                (r.name.clone(), (r, Mutex::new(health)))
            })
            .collect();
        Arc::new(Registry { entries })
    }

    fn health(&self, name: &str) -> Option<std::sync::MutexGuard<'_, Health>> {
        self.entries
            .get(name)
            .map(|(_, h)| h.lock().unwrap_or_else(|p| p.into_inner()))
    }

    pub fn get(&self, name: &str) -> Option<&RunnerEntry> {
        self.entries.get(name).map(|(e, _)| e)
    }

    pub fn names(&self) -> impl Iterator<Item = &String> {
        self.entries.keys()
    }

    /// Runners that serve `pack`, healthiest first (closed breaker and a good heartbeat),
    /// then by name.
    pub fn serving(&self, pack: &str) -> Vec<String> {
        let mut names: Vec<(u8, &String)> = self
            .entries
            .iter()
            .filter(|(_, (e, _))| e.serves(pack))
            .map(|(name, (_, h))| {
                let h = h.lock().unwrap_or_else(|p| p.into_inner());
                let rank = h.breaker.level() * 2 + u8::from(h.heartbeat_ok == Some(false));
                (rank, name)
            })
            .collect();
        names.sort();
        names.into_iter().map(|(_, n)| n.clone()).collect()
    }

    /// May a call to `name` start now?
    pub fn admit(&self, name: &str) -> Result<(), Rejection> {
        match self.health(name) {
            Some(mut h) => h.breaker.admit(Instant::now()),
            None => Ok(()),
        }
    }

    /// Records how a call went. Only failures of the runner itself count against its breaker
    /// (unreachable, timed out, unreadable); a service error behind a healthy runner does not.
    pub fn record(&self, name: &str, runner_failure: Option<&str>) {
        if let Some(mut h) = self.health(name) {
            h.last_call = Some(chrono::Utc::now());
            match runner_failure {
                None => {
                    h.breaker.on_success();
                    h.last_error = None;
                }
                Some(reason) => {
                    h.breaker.on_failure(Instant::now(), reason);
                    h.last_error = Some(reason.to_owned());
                }
            }
            crate::metrics::breaker_state(name, h.breaker.level());
        }
    }

    fn record_probe(&self, name: &str, result: Result<(), String>) -> u32 {
        let Some(mut h) = self.health(name) else {
            return 0;
        };
        h.last_heartbeat = Some(chrono::Utc::now());
        match result {
            Ok(()) => {
                h.heartbeat_ok = Some(true);
                h.probe_failures = 0;
                // A runner that answers its health probe again closes its breaker.
                if h.breaker.level() != 0 && h.breaker.admit(Instant::now()).is_ok() {
                    h.breaker.on_success();
                }
            }
            Err(e) => {
                h.heartbeat_ok = Some(false);
                h.probe_failures += 1;
                h.last_error = Some(format!("health probe: {e}"));
            }
        }
        crate::metrics::runner_up(name, h.heartbeat_ok == Some(true));
        crate::metrics::breaker_state(name, h.breaker.level());
        h.probe_failures
    }

    pub fn snapshot(&self) -> Vec<RunnerStatus> {
        self.entries
            .iter()
            .map(|(name, (e, h))| {
                let h = h.lock().unwrap_or_else(|p| p.into_inner());
                RunnerStatus {
                    name: name.clone(),
                    url: e.url.clone(),
                    packs: e.packs.clone(),
                    breaker: h.breaker.name(),
                    breaker_open_since: h.breaker.opened_at().map(|t| t.to_rfc3339()),
                    healthy: h.breaker.level() == 0 && h.heartbeat_ok != Some(false),
                    last_heartbeat: h.last_heartbeat.map(|t| t.to_rfc3339()),
                    heartbeat_ok: h.heartbeat_ok,
                    last_call: h.last_call.map(|t| t.to_rfc3339()),
                    last_error: h.last_error.clone(),
                }
            })
            .collect()
    }

    /// Probes every runner's `/healthz` every `interval` (jittered), backing off per runner
    /// while it fails, until `shutdown`.
    pub fn spawn_prober(self: &Arc<Self>, interval: Duration, shutdown: CancellationToken) {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(3))
            .no_proxy()
            .build()
            .expect("a plain HTTP client builds");
        let failing = Backoff::try_new(
            Duration::from_millis(500),
            interval.max(Duration::from_secs(1)),
        )
        .expect("valid bounds");
        for name in self.entries.keys() {
            let name = name.clone();
            let registry = self.clone();
            let http = http.clone();
            let shutdown = shutdown.clone();
            tokio::spawn(async move {
                let url = format!(
                    "{}/healthz",
                    registry.entries[&name].0.url.trim_end_matches('/')
                );
                // Start at a random point in the interval so probes never march in step.
                let mut wait = Duration::from_millis(super::backoff::random_below(
                    interval.as_millis() as u64 + 1,
                ));
                loop {
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(wait) => {}
                    }
                    let result = match http.get(&url).send().await {
                        Ok(r) if r.status().is_success() => Ok(()),
                        Ok(r) => Err(format!("HTTP {}", r.status())),
                        Err(e) => Err(super::http_action::error_chain(&e)),
                    };
                    let failures = registry.record_probe(&name, result);
                    wait = if failures == 0 {
                        interval / 2
                            + Duration::from_millis(super::backoff::random_below(
                                interval.as_millis() as u64 / 2 + 1,
                            ))
                    } else {
                        failing.delay(failures)
                    };
                }
            });
        }
    }
}

/// The message of a call refused by an open breaker.
pub fn rejection_message(r: &Rejection) -> String {
    let since = r
        .since
        .map(|t| {
            format!(
                " since {}",
                t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            )
        })
        .unwrap_or_default();
    format!(
        "circuit open{since}: {} (not called; next attempt allowed in {} s)",
        r.reason,
        r.retry_in.as_secs().max(1)
    )
}
