//! The server's view of its runners: who they are, which packs they serve, and how healthy
//! each is (last heartbeat, last call, breaker). Shared by the gateway, the prober and the API.
//!
//! Invariants: a runner whose breaker is open is never called; the call fails fast with a
//! message that says since when and why. A runner from the server's config is never
//! replaced or removed by a joined one of the same name; only joined runners come and go.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::breaker::{Breaker, Rejection};
use super::client::Endpoint;
use super::tls::RunnerTrust;
use crate::protocol::approval::RunnerApprovals;
use crate::protocol::signing::{self, CallSigner, HealthClaims};
use crate::selector::Selector;
use crate::server::config::RunnerEntry;
use crate::util::Backoff;
use crate::util::backoff::random_below;

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
    /// The runner's `[allowlists]` as its last health answer reported them; `None` until a
    /// probe has read them (the gateway then leaves the check to the runner alone).
    allowlists: Option<Allowlists>,
    /// What the runner's last health answer said of its signed approvals (`None`: not read
    /// yet, or an older runner that checks no signatures).
    approvals: Option<RunnerApprovals>,
}

/// A runner's allowlists: list name → the values it admits.
pub(crate) type Allowlists = BTreeMap<String, Vec<String>>;

/// The part of a runner's `/healthz` answer the server keeps.
#[derive(serde::Deserialize)]
struct HealthAnswer {
    #[serde(default)]
    allowlists: Option<Allowlists>,
    #[serde(default)]
    approvals: Option<RunnerApprovals>,
}

/// One runner: what it is (replaceable when a joined runner re-registers) and how it is doing.
struct Slot {
    known: RwLock<Endpoint>,
    health: Mutex<Health>,
    origin: Origin,
}

/// Where a runner came from, which decides who may change it.
enum Origin {
    /// `[[runners]]` in the server's config: fixed for the life of the process.
    Configured,
    /// Joined (through this replica or another): follows the `runners` table. `touched` is
    /// when this replica last learnt of it, so a sync that read the table before a join
    /// through this replica committed does not remove the runner that just joined.
    Joined { touched: Mutex<Instant> },
}

pub struct Registry {
    slots: RwLock<BTreeMap<String, Arc<Slot>>>,
    /// How runners are trusted: every runner's client is built from it.
    trust: RunnerTrust,
    /// Set once the prober runs, so runners added later get probed too.
    prober: Mutex<Option<Prober>>,
}

#[derive(Clone)]
struct Prober {
    /// The configured mean interval between two probes of one runner.
    interval: Duration,
    /// The most probes a second to the whole fleet ([`probe_interval`]).
    per_second: u32,
    /// Where the probe ticks count from: every probe is due on a [`PROBE_TICK`] after it.
    epoch: Instant,
    shutdown: CancellationToken,
    /// Signs each probe's health token: a runner shows its details (packs, allowlists) only
    /// to the server.
    signer: Arc<CallSigner>,
}

/// The longest a health probe waits for its answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// The grain of the probes' schedule: each probe's due time is rounded up to a tick, so the
/// probes due within one tick start on one wake-up of the server's runtime instead of one
/// each (1,000 runners at the default 10 s interval: 10 wake-ups a second for 100 probes,
/// not 100; waking and parking a worker thread was the largest share of an idle server's
/// CPU). Small against the interval, so the jitter still keeps probes out of step.
const PROBE_TICK: Duration = Duration::from_millis(100);

/// One runner's health as the API, the metrics and the `emisar.runners` tool show it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RunnerStatus {
    pub name: String,
    /// `config` (the server's `[[runners]]`) or `joined`.
    pub origin: &'static str,
    pub url: String,
    pub labels: BTreeMap<String, String>,
    pub packs: Option<Vec<String>>,
    pub breaker: &'static str,
    pub breaker_open_since: Option<String>,
    pub healthy: bool,
    pub last_heartbeat: Option<String>,
    pub heartbeat_ok: Option<bool>,
    pub last_call: Option<String>,
    pub last_error: Option<String>,
    /// The allowlists the runner reported in its last health answer (`None`: not read yet).
    pub allowlists: Option<Allowlists>,
}

fn cooldown() -> Backoff {
    Backoff::try_new(Duration::from_secs(2), Duration::from_secs(60)).expect("valid bounds")
}

fn new_health() -> Health {
    Health {
        breaker: Breaker::new(BREAKER_THRESHOLD, cooldown()),
        last_heartbeat: None,
        heartbeat_ok: None,
        last_call: None,
        last_error: None,
        probe_failures: 0,
        allowlists: None,
        approvals: None,
    }
}

impl Registry {
    /// The configured runners, each with its client; a runner that cannot be trusted as
    /// configured (plain HTTP without `insecure_http`, a malformed pin) is an error.
    pub(crate) fn new(runners: Vec<RunnerEntry>, trust: RunnerTrust) -> anyhow::Result<Arc<Self>> {
        let mut slots = BTreeMap::new();
        for entry in runners {
            let http = trust.client(&entry)?;
            slots.insert(
                entry.name.clone(),
                Arc::new(Slot {
                    known: RwLock::new(Endpoint { entry, http }),
                    health: Mutex::new(new_health()),
                    origin: Origin::Configured,
                }),
            );
        }
        Ok(Arc::new(Registry {
            slots: RwLock::new(slots),
            trust,
            prober: Mutex::new(None),
        }))
    }

    /// How runners are trusted here (join requests are checked against it too).
    pub(crate) fn trust(&self) -> &RunnerTrust {
        &self.trust
    }

    fn slot(&self, name: &str) -> Option<Arc<Slot>> {
        self.slots
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned()
    }

    fn slots(&self) -> Vec<(String, Arc<Slot>)> {
        self.slots
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(n, s)| (n.clone(), s.clone()))
            .collect()
    }

    /// Is `name` a runner from the server's config?
    pub(crate) fn is_configured(&self, name: &str) -> bool {
        self.slot(name)
            .is_some_and(|s| matches!(s.origin, Origin::Configured))
    }

    /// Adds a joined runner or replaces what is known of it (it re-registered: a new URL or
    /// certificate gets a new client); its health is kept. A runner from the server's config
    /// of the same name is never replaced: returns `Ok(false)` and changes nothing. A runner
    /// that cannot be trusted as given (plain HTTP without `insecure_http`, a malformed pin)
    /// is an error and changes nothing.
    pub(crate) fn upsert_joined(self: &Arc<Self>, entry: RunnerEntry) -> anyhow::Result<bool> {
        let name = entry.name.clone();
        let http = self.trust.joined_client(&entry)?;
        let endpoint = Endpoint { entry, http };
        let added = {
            let mut slots = self.slots.write().unwrap_or_else(|p| p.into_inner());
            match slots.get(&name) {
                Some(slot) => match &slot.origin {
                    Origin::Configured => return Ok(false),
                    Origin::Joined { touched } => {
                        *slot.known.write().unwrap_or_else(|p| p.into_inner()) = endpoint;
                        *touched.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
                        false
                    }
                },
                None => {
                    slots.insert(
                        name.clone(),
                        Arc::new(Slot {
                            known: RwLock::new(endpoint),
                            health: Mutex::new(new_health()),
                            origin: Origin::Joined {
                                touched: Mutex::new(Instant::now()),
                            },
                        }),
                    );
                    true
                }
            }
        };
        if added
            && let Some(prober) = self
                .prober
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone()
        {
            self.spawn_probe(name, prober);
        }
        Ok(true)
    }

    /// Forgets the joined runners that are not in `present` (they were removed) and that this
    /// replica has not learnt of since `read_at`, when `present` was read. Runners from the
    /// config are never removed. Returns the names removed. Their probes stop on their own.
    pub(crate) fn retain_joined(
        &self,
        present: &std::collections::BTreeSet<String>,
        read_at: Instant,
    ) -> Vec<String> {
        let mut slots = self.slots.write().unwrap_or_else(|p| p.into_inner());
        let gone: Vec<String> = slots
            .iter()
            .filter(|(name, slot)| match &slot.origin {
                Origin::Configured => false,
                Origin::Joined { touched } => {
                    !present.contains(*name)
                        && *touched.lock().unwrap_or_else(|p| p.into_inner()) < read_at
                }
            })
            .map(|(name, _)| name.clone())
            .collect();
        for name in &gone {
            slots.remove(name);
        }
        gone
    }

    pub(crate) fn get(&self, name: &str) -> Option<RunnerEntry> {
        self.endpoint(name).map(|e| e.entry)
    }

    /// The runner and the client to reach it with.
    pub(crate) fn endpoint(&self, name: &str) -> Option<Endpoint> {
        self.slot(name)
            .map(|s| s.known.read().unwrap_or_else(|p| p.into_inner()).clone())
    }

    /// Every runner, in name order.
    /// How many runners are known (configured and joined).
    pub(crate) fn len(&self) -> usize {
        self.slots.read().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn entries(&self) -> Vec<RunnerEntry> {
        self.slots()
            .into_iter()
            .map(|(_, s)| {
                s.known
                    .read()
                    .unwrap_or_else(|p| p.into_inner())
                    .entry
                    .clone()
            })
            .collect()
    }

    /// Runners designated for `pack` (a configured runner whose `packs` name it or are left
    /// out, or a joined runner whose join token granted it and that announced it) and in
    /// `scope`, in the order the server picks for a cluster-scoped tool: healthiest first
    /// (closed breaker and a good heartbeat), then configured runners before joined ones,
    /// then by name. The order never depends on anything a joining runner chooses but its
    /// name, and a name sorts only among runners the operator designated for the pack.
    pub(crate) fn serving(&self, pack: &str, scope: Option<&Selector>) -> Vec<String> {
        let mut names: Vec<(u8, bool, String)> = self
            .slots()
            .into_iter()
            .filter(|(_, s)| {
                let k = s.known.read().unwrap_or_else(|p| p.into_inner());
                k.entry.serves(pack) && scope.is_none_or(|sel| sel.matches(&k.entry.labels))
            })
            .map(|(name, s)| {
                let h = s.health.lock().unwrap_or_else(|p| p.into_inner());
                let rank = h.breaker.level() * 2 + u8::from(h.heartbeat_ok == Some(false));
                let joined = matches!(s.origin, Origin::Joined { .. });
                (rank, joined, name)
            })
            .collect();
        names.sort();
        names.into_iter().map(|(_, _, n)| n).collect()
    }

    /// Runners that serve `pack` and are in `scope`, by name.
    pub fn serving_sorted(&self, pack: &str, scope: Option<&Selector>) -> Vec<String> {
        let mut names = self.serving(pack, scope);
        names.sort();
        names
    }

    /// May a call to `name` start now?
    pub(crate) fn admit(&self, name: &str) -> Result<(), Rejection> {
        match self.slot(name) {
            Some(s) => s
                .health
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .breaker
                .admit(Instant::now()),
            None => Ok(()),
        }
    }

    /// Records how a call went. Only failures of the runner itself count against its breaker
    /// (unreachable, timed out, unreadable); a service error behind a healthy runner does not.
    /// The breaker keeps the agent's text of the failure (an open breaker's refusal quotes
    /// it); `last_error` the operator's detail, which only admins read.
    pub(crate) fn record(&self, name: &str, runner_failure: Option<&super::client::RunnerError>) {
        if let Some(s) = self.slot(name) {
            let mut h = s.health.lock().unwrap_or_else(|p| p.into_inner());
            h.last_call = Some(chrono::Utc::now());
            match runner_failure {
                None => {
                    h.breaker.on_success();
                    h.last_error = None;
                }
                Some(failure) => {
                    h.breaker.on_failure(Instant::now(), &failure.to_string());
                    h.last_error = Some(failure.detail());
                }
            }
            crate::server::metrics::breaker_state(name, h.breaker.level());
        }
    }

    /// A probe's or a runner heartbeat's result. Returns the consecutive failures so far.
    pub(crate) fn record_heartbeat(&self, name: &str, result: Result<(), String>) -> u32 {
        let Some(s) = self.slot(name) else {
            return 0;
        };
        let mut h = s.health.lock().unwrap_or_else(|p| p.into_inner());
        let before = (h.heartbeat_ok, h.breaker.level());
        h.last_heartbeat = Some(chrono::Utc::now());
        match result {
            Ok(()) => {
                h.heartbeat_ok = Some(true);
                h.probe_failures = 0;
                // A runner that answers again closes its breaker once the cooldown is over.
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
        // Set on a change only (the first report is one): a gauge keeps its value, and
        // setting it looks its labelled key up afresh, 5 % of an idle server's CPU when every
        // probe did.
        if before != (h.heartbeat_ok, h.breaker.level()) {
            crate::server::metrics::runner_up(name, h.heartbeat_ok == Some(true));
            crate::server::metrics::breaker_state(name, h.breaker.level());
        }
        h.probe_failures
    }

    /// Keeps the allowlists a runner reported in its health answer.
    pub(crate) fn record_allowlists(&self, name: &str, allowlists: Allowlists) {
        if let Some(s) = self.slot(name) {
            s.health
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .allowlists = Some(allowlists);
        }
    }

    /// Keeps what a runner reported of its signed approvals in its health answer.
    pub(crate) fn record_approvals(&self, name: &str, approvals: Option<RunnerApprovals>) {
        if let Some(s) = self.slot(name) {
            s.health.lock().unwrap_or_else(|p| p.into_inner()).approvals = approvals;
        }
    }

    /// What `name` last reported of its signed approvals, if a probe has read it.
    pub(crate) fn approvals(&self, name: &str) -> Option<RunnerApprovals> {
        let s = self.slot(name)?;
        let h = s.health.lock().unwrap_or_else(|p| p.into_inner());
        h.approvals.clone()
    }

    /// The allowlists `name` last reported, if a probe has read them.
    pub(crate) fn allowlists(&self, name: &str) -> Option<Allowlists> {
        let s = self.slot(name)?;
        let h = s.health.lock().unwrap_or_else(|p| p.into_inner());
        h.allowlists.clone()
    }

    pub(crate) fn snapshot(&self) -> Vec<RunnerStatus> {
        self.slots()
            .into_iter()
            .map(|(name, s)| {
                let e = s
                    .known
                    .read()
                    .unwrap_or_else(|p| p.into_inner())
                    .entry
                    .clone();
                let h = s.health.lock().unwrap_or_else(|p| p.into_inner());
                RunnerStatus {
                    name,
                    origin: match s.origin {
                        Origin::Configured => "config",
                        Origin::Joined { .. } => "joined",
                    },
                    url: e.url,
                    labels: e.labels,
                    packs: e.packs,
                    breaker: h.breaker.name(),
                    breaker_open_since: h.breaker.opened_at().map(|t| t.to_rfc3339()),
                    healthy: h.breaker.level() == 0 && h.heartbeat_ok != Some(false),
                    last_heartbeat: h.last_heartbeat.map(|t| t.to_rfc3339()),
                    heartbeat_ok: h.heartbeat_ok,
                    last_call: h.last_call.map(|t| t.to_rfc3339()),
                    last_error: h.last_error.clone(),
                    allowlists: h.allowlists.clone(),
                }
            })
            .collect()
    }

    /// Probes every runner's `/healthz` every `interval` on average, or less often in a
    /// fleet too large for `per_second` ([`probe_interval`]; jittered, each start rounded up
    /// to a [`PROBE_TICK`] so probes due together share a wake-up), backing off per runner
    /// while it fails, until `shutdown`. Runners added later are probed from then on. Each
    /// probe carries a health token `signer` signed for that runner (kept for most of its
    /// lifetime: [`HealthToken`]), which its details need.
    pub(crate) fn spawn_prober(
        self: &Arc<Self>,
        interval: Duration,
        per_second: u32,
        shutdown: CancellationToken,
        signer: Arc<CallSigner>,
    ) {
        let prober = Prober {
            interval,
            per_second,
            epoch: Instant::now(),
            shutdown,
            signer,
        };
        *self.prober.lock().unwrap_or_else(|p| p.into_inner()) = Some(prober.clone());
        for (name, _) in self.slots() {
            self.spawn_probe(name, prober.clone());
        }
    }

    fn spawn_probe(self: &Arc<Self>, name: String, prober: Prober) {
        let registry = self.clone();
        let Prober {
            interval,
            per_second,
            epoch,
            shutdown,
            signer,
        } = prober;
        let failing = Backoff::try_new(
            Duration::from_millis(500),
            interval.max(Duration::from_secs(1)),
        )
        .expect("valid bounds");
        tokio::spawn(async move {
            // Start at a random point in the interval so probes never march in step.
            let mut wait = Duration::from_millis(random_below(interval.as_millis() as u64 + 1));
            let mut token = HealthToken::default();
            let mut health_url = HealthUrl::default();
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep_until(on_tick(epoch, Instant::now() + wait)) => {}
                }
                let Some(Endpoint { entry, http }) = registry.endpoint(&name) else {
                    return;
                };
                let result = match health_url.of(&entry.url) {
                    Ok(url) => {
                        let url = url.clone();
                        // Without a token the runner answers liveness only, so a failure to
                        // sign still probes; it cannot happen with a key that signed at start.
                        let token = match token.current(&signer, &name, signing::now()) {
                            Ok(token) => Some(token),
                            Err(e) => {
                                tracing::error!(runner = %name, error = %e, "could not sign a health token");
                                None
                            }
                        };
                        registry.probe(&name, &http, url, token).await
                    }
                    Err(e) => Err(e),
                };
                if let Err(e) = &result {
                    // The detail names hosts and certificates: the log and admins read it.
                    tracing::warn!(runner = %name, error = %e, "health probe failed");
                }
                let failures = registry.record_heartbeat(&name, result);
                wait = if failures == 0 {
                    next_probe(probe_interval(interval, per_second, registry.len()))
                } else {
                    failing.delay(failures)
                };
            }
        });
    }

    /// One probe of `name` at `url` with its own client (which checks its certificate like
    /// a call does), keeping what the answer reports.
    async fn probe(
        &self,
        name: &str,
        http: &reqwest::Client,
        url: reqwest::Url,
        token: Option<&str>,
    ) -> Result<(), String> {
        let mut request = http.get(url).timeout(PROBE_TIMEOUT);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        match request.send().await {
            Ok(r) if r.status().is_success() => {
                // An older runner, or an answer that does not parse or is too large, leaves
                // the last known allowlists as they were: the runner checks every call anyway.
                if let Some(answer) = reported(r).await {
                    if let Some(lists) = answer.allowlists {
                        self.record_allowlists(name, lists);
                    }
                    self.record_approvals(name, answer.approvals);
                }
                Ok(())
            }
            Ok(r) => Err(format!("HTTP {}", r.status())),
            Err(e) => Err(super::client::describe_send_error(&e)),
        }
    }
}

/// The mean interval between two probes of one runner in a fleet of `runners`: `configured`,
/// or longer so that the whole fleet is sent at most `per_second` probes (1,000 runners at
/// 50 a second: each every 20 s). Each probe is a TLS request the server sends and reads;
/// at 1,000 runners every 10 s they were most of an idle server's CPU. A fleet that grows
/// is probed less often from each runner's next probe on; a failing runner keeps its own
/// quicker backoff. Consul spaces its agents' anti-entropy syncs by cluster size the same way.
pub(crate) fn probe_interval(configured: Duration, per_second: u32, runners: usize) -> Duration {
    let spread = Duration::from_millis(runners as u64 * 1000 / u64::from(per_second.max(1)));
    configured.max(spread)
}

/// The wait after a probe that succeeded: `interval` × a uniform draw from [0.75, 1.25], so
/// probes of many runners never march in step and `interval` is the mean.
fn next_probe(interval: Duration) -> Duration {
    let ms = interval.as_millis() as u64;
    Duration::from_millis(ms * 3 / 4 + random_below(ms / 2 + 1))
}

/// The first [`PROBE_TICK`] after `epoch` at or after `due`.
fn on_tick(epoch: Instant, due: Instant) -> Instant {
    let ticks = due
        .saturating_duration_since(epoch)
        .as_nanos()
        .div_ceil(PROBE_TICK.as_nanos());
    epoch + PROBE_TICK * u32::try_from(ticks).unwrap_or(u32::MAX)
}

/// A runner's `/healthz` URL, parsed once and again only when the runner's URL changes (a
/// joined runner that re-registered): parsing it for every probe was 5 % of an idle server's
/// CPU at 1,000 runners.
#[derive(Default)]
struct HealthUrl {
    /// The runner's URL it was parsed from, and the parsed `/healthz` URL.
    parsed: Option<(String, reqwest::Url)>,
}

impl HealthUrl {
    /// The `/healthz` URL of the runner at `runner_url`, or why it is not a URL.
    fn of(&mut self, runner_url: &str) -> Result<&reqwest::Url, String> {
        if self
            .parsed
            .as_ref()
            .is_none_or(|(from, _)| from != runner_url)
        {
            let health = format!("{}/healthz", runner_url.trim_end_matches('/'));
            let url = reqwest::Url::parse(&health).map_err(|e| format!("{health}: {e}"))?;
            self.parsed = Some((runner_url.to_owned(), url));
        }
        Ok(&self.parsed.as_ref().expect("parsed above").1)
    }
}

/// A runner's health token, signed once and sent with every probe until it nears its expiry:
/// with the default interval one signature serves about three probes instead of one (the
/// signature was 6 % of an idle server's CPU at 1,000 runners). Each probe task keeps its
/// own, so a token only ever goes to the runner it names.
#[derive(Default)]
struct HealthToken {
    token: String,
    /// Its `exp`, in seconds since the epoch; 0 before the first.
    exp: u64,
}

impl HealthToken {
    /// The token to send at `now` (seconds since the epoch): the kept one while it outlives
    /// the probe's timeout by [`HEALTH_TOKEN_MARGIN`], else a fresh one for `runner`.
    fn current(&mut self, signer: &CallSigner, runner: &str, now: u64) -> anyhow::Result<&str> {
        if self.exp < now + PROBE_TIMEOUT.as_secs() + HEALTH_TOKEN_MARGIN {
            let claims = HealthClaims::for_runner(runner);
            self.token = signer.sign(&claims)?;
            self.exp = claims.exp;
        }
        Ok(&self.token)
    }
}

/// Seconds a kept health token must still live past a probe's timeout: the runner's clock may
/// run ahead of the server's (its verifier allows 5 s of leeway on top).
const HEALTH_TOKEN_MARGIN: u64 = 2;

/// The most of a health answer the prober reads. A runner's name, pack digests and
/// allowlists fit in it many times over; a runner that sends more (a compromised one, say)
/// is not believed, and cannot make the server buffer an unbounded body.
const MAX_HEALTH_BYTES: usize = 256 * 1024;

/// What the server keeps of a runner's `/healthz` answer, read up to [`MAX_HEALTH_BYTES`].
async fn reported(mut answer: reqwest::Response) -> Option<HealthAnswer> {
    let body = super::read_capped(&mut answer, MAX_HEALTH_BYTES)
        .await
        .ok()?;
    serde_json::from_slice::<HealthAnswer>(&body).ok()
}

/// The message of a call refused by an open breaker.
pub(crate) fn rejection_message(r: &Rejection) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, url: &str) -> RunnerEntry {
        RunnerEntry {
            name: name.into(),
            url: url.into(),
            tls_fingerprint: None,
            packs: None,
            labels: BTreeMap::new(),
        }
    }

    #[test]
    fn probes_come_every_interval_on_average_never_in_step() {
        let interval = Duration::from_secs(10);
        let waits: Vec<Duration> = (0..4000).map(|_| next_probe(interval)).collect();
        assert!(
            waits
                .iter()
                .all(|w| *w >= interval * 3 / 4 && *w <= interval * 5 / 4)
        );
        let mean = waits.iter().sum::<Duration>() / waits.len() as u32;
        // The standard error of 4,000 draws is 23 ms; 200 ms is far outside chance.
        assert!(
            mean.abs_diff(interval) < Duration::from_millis(200),
            "mean {mean:?}"
        );
        assert!(waits.iter().any(|w| *w != waits[0]), "jittered");
    }

    #[test]
    fn a_large_fleet_is_probed_less_often_than_configured() {
        let ten = Duration::from_secs(10);
        assert_eq!(probe_interval(ten, 50, 0), ten);
        assert_eq!(probe_interval(ten, 50, 500), ten, "50 a second");
        assert_eq!(probe_interval(ten, 50, 1000), Duration::from_secs(20));
        assert_eq!(
            probe_interval(ten, 200, 1000),
            ten,
            "raised by the operator"
        );
        assert_eq!(
            probe_interval(Duration::from_secs(60), 50, 1000),
            Duration::from_secs(60)
        );
        let second = Duration::from_secs(1);
        assert_eq!(
            probe_interval(second, 0, 10),
            ten,
            "0 counts as 1, never divides"
        );
    }

    #[tokio::test]
    async fn the_prober_keeps_the_fleet_to_its_probes_per_second() {
        // Five runners at one address that counts its probes, a configured interval of
        // 100 ms, and at most two probes a second: each runner every 2.5 s, not 10 times a
        // second. The first round starts within the configured interval.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let probes = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = probes.clone();
        let app = axum::Router::new().route(
            "/healthz",
            axum::routing::get(move || {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                async { "{}" }
            }),
        );
        let server = tokio::spawn(async move { axum::serve(listener, app).await });
        let names = ["n1", "n2", "n3", "n4", "n5"];
        let entries = names.iter().map(|n| entry(n, &url)).collect();
        let registry =
            Arc::new(Registry::new(entries, RunnerTrust::new(None, true).unwrap()).unwrap());
        let (private, _) = signing::generate_keypair().unwrap();
        let signer = Arc::new(CallSigner::from_pem(&private).unwrap());
        let shutdown = CancellationToken::new();
        registry.spawn_prober(Duration::from_millis(100), 2, shutdown.clone(), signer);
        tokio::time::sleep(Duration::from_millis(1500)).await;
        shutdown.cancel();
        server.abort();
        let probed = probes.load(std::sync::atomic::Ordering::SeqCst);
        // One round (5; fewer if the machine is slow to answer), a retry or two at most,
        // never the dozens of the configured interval alone (45 when it was used).
        assert!((1..=7).contains(&probed), "{probed} probes in 1.5 s");
    }

    #[test]
    fn probes_due_within_one_tick_start_together_on_it() {
        let epoch = Instant::now();
        for ms in [0u64, 1, 99, 100, 101, 9_950, 10_049] {
            let due = epoch + Duration::from_millis(ms);
            let start = on_tick(epoch, due);
            // Never early, never a tick late, and on a whole tick from the epoch.
            assert!(start >= due && start - due < PROBE_TICK, "{ms} ms");
            assert_eq!(
                (start - epoch).as_nanos() % PROBE_TICK.as_nanos(),
                0,
                "{ms} ms"
            );
        }
        assert_eq!(
            on_tick(epoch, epoch + Duration::from_millis(1)),
            on_tick(epoch, epoch + Duration::from_millis(99))
        );
    }

    #[test]
    fn a_health_url_is_parsed_again_when_the_runner_moves() {
        let mut url = HealthUrl::default();
        assert_eq!(
            url.of("http://127.0.0.1:7701/").unwrap().as_str(),
            "http://127.0.0.1:7701/healthz"
        );
        assert_eq!(
            url.of("http://127.0.0.1:7701/").unwrap().as_str(),
            "http://127.0.0.1:7701/healthz"
        );
        assert_eq!(
            url.of("https://10.0.0.2:7701").unwrap().as_str(),
            "https://10.0.0.2:7701/healthz"
        );
        assert!(
            url.of("not a url")
                .unwrap_err()
                .contains("not a url/healthz")
        );
    }

    #[test]
    fn a_runners_gauges_are_set_by_its_first_report_and_each_change() {
        let trust = RunnerTrust::new(None, true).unwrap();
        let registry =
            Registry::new(vec![entry("node-1", "http://127.0.0.1:7701")], trust).unwrap();
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let report = |result: Result<(), String>| {
            metrics::with_local_recorder(&recorder, || registry.record_heartbeat("node-1", result));
            handle.render()
        };
        let shown = report(Ok(()));
        assert!(
            shown.contains("emisar_runner_up{runner=\"node-1\"} 1"),
            "{shown}"
        );
        assert!(
            shown.contains("emisar_runner_breaker_state{runner=\"node-1\"} 0"),
            "{shown}"
        );
        let shown = report(Err("refused".into()));
        assert!(
            shown.contains("emisar_runner_up{runner=\"node-1\"} 0"),
            "{shown}"
        );
        let shown = report(Ok(()));
        assert!(
            shown.contains("emisar_runner_up{runner=\"node-1\"} 1"),
            "{shown}"
        );
    }

    #[test]
    fn a_health_token_is_kept_until_it_nears_its_expiry_then_signed_again() {
        let (private, public) = signing::generate_keypair().unwrap();
        let signer = CallSigner::from_pem(&private).unwrap();
        let verifier = signing::CallVerifier::from_pem(&public, "node-1").unwrap();
        let now = signing::now();
        let mut token = HealthToken::default();
        verifier
            .verify_health(token.current(&signer, "node-1", now).unwrap())
            .unwrap();
        // A token that expires 25 s from now is sent again while it outlives a probe's
        // timeout (3 s) and the margin (2 s)...
        token.token = "kept".into();
        token.exp = now + 25;
        assert_eq!(token.current(&signer, "node-1", now).unwrap(), "kept");
        assert_eq!(token.current(&signer, "node-1", now + 20).unwrap(), "kept");
        // ...and replaced by a fresh one once it would not.
        let fresh = token
            .current(&signer, "node-1", now + 21)
            .unwrap()
            .to_owned();
        verifier.verify_health(&fresh).unwrap();
        assert!(token.exp >= now + signing::TOKEN_LIFETIME);
    }

    #[tokio::test]
    async fn a_health_answer_is_read_only_up_to_its_bound() {
        async fn answer_with(body: String) -> Option<Allowlists> {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let url = format!("http://{}/healthz", listener.local_addr().unwrap());
            let app = axum::Router::new().route(
                "/healthz",
                axum::routing::get(move || {
                    let body = body.clone();
                    async move { body }
                }),
            );
            let server = tokio::spawn(async move { axum::serve(listener, app).await });
            let answer = reqwest::get(&url).await.unwrap();
            let lists = reported(answer).await.and_then(|a| a.allowlists);
            server.abort();
            lists
        }
        let small = serde_json::json!({"name": "n", "allowlists": {"units": ["nginx"]}});
        assert_eq!(
            answer_with(small.to_string()).await,
            Some(BTreeMap::from([(
                "units".to_owned(),
                vec!["nginx".to_owned()]
            )]))
        );
        // The same shape, past the bound: not believed, not buffered whole.
        let padding = "x".repeat(MAX_HEALTH_BYTES);
        let large = serde_json::json!({"name": padding, "allowlists": {"units": ["nginx"]}});
        assert_eq!(answer_with(large.to_string()).await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn joined_runners_never_replace_configured_ones_and_leave_when_removed() {
        // Plain HTTP URLs keep the test about names; trust has its own tests.
        let trust = RunnerTrust::new(None, true).unwrap();
        let registry = Registry::new(vec![entry("local", "http://127.0.0.1:7701")], trust).unwrap();
        assert!(registry.is_configured("local"));
        assert!(
            !registry
                .upsert_joined(entry("local", "http://attacker:1"))
                .unwrap()
        );
        assert_eq!(registry.get("local").unwrap().url, "http://127.0.0.1:7701");

        assert!(
            registry
                .upsert_joined(entry("edge-1", "http://10.0.0.1:7701"))
                .unwrap()
        );
        assert!(!registry.is_configured("edge-1"));
        assert!(
            registry
                .upsert_joined(entry("edge-1", "http://10.0.0.2:7701"))
                .unwrap()
        );
        assert_eq!(registry.get("edge-1").unwrap().url, "http://10.0.0.2:7701");

        // A sync that read the table before edge-2 joined here does not forget edge-2.
        tokio::time::advance(Duration::from_millis(1)).await;
        let read_at = Instant::now();
        tokio::time::advance(Duration::from_millis(1)).await;
        registry
            .upsert_joined(entry("edge-2", "http://10.0.0.3:7701"))
            .unwrap();
        let gone = registry.retain_joined(&Default::default(), read_at);
        assert_eq!(gone, ["edge-1"]);
        assert!(registry.get("edge-1").is_none());
        assert!(registry.get("edge-2").is_some());
        assert!(registry.get("local").is_some());
        let later = Instant::now() + Duration::from_millis(1);
        tokio::time::advance(Duration::from_millis(2)).await;
        assert_eq!(
            registry.retain_joined(&Default::default(), later),
            ["edge-2"]
        );
        assert!(registry.get("local").is_some(), "configured runners stay");

        // A joined runner this server cannot trust as given is refused and not added.
        let strict = Registry::new(vec![], RunnerTrust::new(None, false).unwrap()).unwrap();
        let err = strict
            .upsert_joined(entry("edge-3", "http://10.0.0.4:7701"))
            .unwrap_err();
        assert!(format!("{err:#}").contains("insecure_http"), "{err:#}");
        assert!(strict.get("edge-3").is_none());
    }
}
