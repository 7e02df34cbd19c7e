//! How fast people (and anyone guessing their passwords) may try to log in, built so that
//! nobody can lock a person out from elsewhere.
//!
//! Only an address is ever refused: every attempt from one client address counts against
//! that address (`per_address_per_minute`, any name) and against the pair of that address
//! and the name it tries (`per_name_and_address_per_minute`). A guesser's own address runs
//! out; the person's does not.
//!
//! The per-name and server-wide limits never refuse: they pace. An attempt for a name from
//! an address that failed for that name in the last [`FAILURE_MEMORY`] is *suspect*, and
//! waits for a turn in the name's bucket (`per_name_per_minute`) and the server's
//! (`global_per_minute`) before its password is checked; if no turn comes within
//! [`MAX_PACE`], that address is told to retry later. An attempt from an address that has
//! not failed for the name (the person at their own desk) is counted in both buckets but
//! never waits, so a flood of wrong passwords for `alice` from twenty addresses slows those
//! twenty addresses and not her. A guesser spread over many addresses gets one unpaced
//! guess per address and name per [`FAILURE_MEMORY`], then the name's pace.
//!
//! What the server-wide bucket protects is CPU: it paces the password hashing that suspect
//! attempts cause. The hashing itself always runs behind a semaphore (`users::hashing`), so
//! no rate of logins, suspect or not, takes more than its share of the cores.
//!
//! On PostgreSQL the two refusing limits hold across replicas: behind each, the same key's
//! bucket in the database that every replica shares (`shared_limit.rs`, with its bound: at
//! most one attempt more per replica, since a minute's quota reports one at a time). The
//! pacing buckets stay per replica: they slow suspect attempts and refuse nobody.
//!
//! Invariants: state is bounded. A sweeper forgets every bucket that is full again and
//! every failure older than [`FAILURE_MEMORY`]; past [`MAX_TRACKED`] keys a limiter forgets
//! at once and then refuses new keys rather than grow, and a failure record that cannot be
//! kept makes every address suspect (paced, not refused) until room is made. The client
//! address is the socket's peer; `X-Forwarded-For` is believed only when the peer is one of
//! the configured `trusted_proxies`, and then only its rightmost entry that is not a
//! trusted proxy itself. IPv6 clients are counted per /64, the block one host usually holds.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::HeaderMap;
use governor::{DefaultDirectRateLimiter, DefaultKeyedRateLimiter, Quota, RateLimiter};
use serde::Deserialize;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::server::db::Db;
use crate::server::shared_limit::{Quota as SharedQuota, SharedLimit};

/// The most addresses, names or failures a limiter remembers at once.
pub(crate) const MAX_TRACKED: usize = 100_000;
/// How long an address stays suspect for a name after it failed to log in as that name.
pub(crate) const FAILURE_MEMORY: Duration = Duration::from_secs(15 * 60);
/// The longest a suspect attempt waits for its turn before its address is told to retry.
pub(crate) const MAX_PACE: Duration = Duration::from_secs(10);

/// The `[login]` section of emisar.toml: attempts per minute (each also the burst).
#[derive(schemars::JsonSchema, Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoginLimitsConfig {
    /// From one client address (an IPv6 /64), any name; past it the address is refused. On
    /// PostgreSQL, counted across all replicas.
    #[serde(default = "default_per_address")]
    pub per_address_per_minute: u32,
    /// From one client address for one user name; past it that address is refused for that
    /// name (the person, from anywhere else, is not). On PostgreSQL, counted across all
    /// replicas.
    #[serde(default = "default_per_name_and_address")]
    pub per_name_and_address_per_minute: u32,
    /// For one user name, from anywhere: past it, attempts from addresses that failed for
    /// the name wait their turn (never refused outright; the person from an address that did
    /// not fail is not slowed).
    #[serde(default = "default_per_name")]
    pub per_name_per_minute: u32,
    /// For the whole server: past it, attempts from addresses that failed wait their turn,
    /// which bounds the password hashing a flood can cause (never refuses by itself).
    #[serde(default = "default_global")]
    pub global_per_minute: u32,
    /// Proxies whose `X-Forwarded-For` names the client (exact addresses). Empty: the
    /// socket's peer is the client, and the header is ignored.
    #[serde(default)]
    pub trusted_proxies: Vec<IpAddr>,
}

fn default_per_address() -> u32 {
    30
}
fn default_per_name_and_address() -> u32 {
    10
}
fn default_per_name() -> u32 {
    10
}
fn default_global() -> u32 {
    600
}

impl Default for LoginLimitsConfig {
    fn default() -> Self {
        LoginLimitsConfig {
            per_address_per_minute: default_per_address(),
            per_name_and_address_per_minute: default_per_name_and_address(),
            per_name_per_minute: default_per_name(),
            global_per_minute: default_global(),
            trusted_proxies: Vec::new(),
        }
    }
}

impl LoginLimitsConfig {
    pub(crate) fn check(&self) -> anyhow::Result<()> {
        for (field, value) in [
            ("login.per_address_per_minute", self.per_address_per_minute),
            (
                "login.per_name_and_address_per_minute",
                self.per_name_and_address_per_minute,
            ),
            ("login.per_name_per_minute", self.per_name_per_minute),
            ("login.global_per_minute", self.global_per_minute),
        ] {
            if value == 0 {
                anyhow::bail!("{field} must be at least 1");
            }
        }
        Ok(())
    }
}

/// Why an attempt was refused: always something about the address it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    Address,
    /// This address tried this name too often.
    NameAddress,
    /// This address failed for this name, and its turn did not come within [`MAX_PACE`].
    Paced,
    /// More distinct addresses or names than [`MAX_TRACKED`] are trying at once.
    Crowded,
}

impl Refusal {
    pub(crate) fn message(self) -> &'static str {
        match self {
            Refusal::Address => "too many login attempts from this address: wait a minute",
            Refusal::NameAddress => {
                "too many login attempts for this user from this address: wait a minute"
            }
            Refusal::Paced => {
                "too many failed logins for this user from this address: wait a minute"
            }
            Refusal::Crowded => "too many clients are trying to log in at once: wait a minute",
        }
    }
}

pub struct LoginLimits {
    by_address: DefaultKeyedRateLimiter<IpAddr>,
    by_name_and_address: DefaultKeyedRateLimiter<(String, IpAddr)>,
    /// Paces suspect attempts for one name; clean ones only draw on it.
    by_name: DefaultKeyedRateLimiter<String>,
    /// Paces suspect attempts server-wide; clean ones only draw on it.
    global: DefaultDirectRateLimiter,
    /// (name, address) → when that address last failed to log in as that name.
    failures: Mutex<HashMap<(String, IpAddr), Instant>>,
    trusted_proxies: Vec<IpAddr>,
    /// On PostgreSQL, the buckets of `by_address` and `by_name_and_address` that every
    /// replica shares, asked after this replica's own admit.
    shared: Option<Shared>,
}

/// The refusing limits' shared buckets (see `shared_limit.rs`).
struct Shared {
    by_address: Arc<SharedLimit>,
    by_name_and_address: Arc<SharedLimit>,
}

fn per_minute(n: u32) -> Quota {
    let n = NonZeroU32::new(n.max(1)).expect("max(1)");
    Quota::per_minute(n).allow_burst(n)
}

/// Refuses a new key once `limiter` holds [`MAX_TRACKED`] keys that are all still in use.
fn room<K: std::hash::Hash + Eq + Clone>(
    limiter: &DefaultKeyedRateLimiter<K>,
) -> Result<(), Refusal> {
    if limiter.len() >= MAX_TRACKED {
        limiter.retain_recent();
        if limiter.len() >= MAX_TRACKED {
            return Err(Refusal::Crowded);
        }
    }
    Ok(())
}

impl LoginLimits {
    pub(crate) fn new(config: &LoginLimitsConfig) -> Self {
        LoginLimits {
            by_address: RateLimiter::keyed(per_minute(config.per_address_per_minute)),
            by_name_and_address: RateLimiter::keyed(per_minute(
                config.per_name_and_address_per_minute,
            )),
            by_name: RateLimiter::keyed(per_minute(config.per_name_per_minute)),
            global: RateLimiter::direct(per_minute(config.global_per_minute)),
            failures: Mutex::default(),
            trusted_proxies: config.trusted_proxies.clone(),
            shared: None,
        }
    }

    /// The refusing limits also hold across the replicas sharing `db`, when it is
    /// PostgreSQL; their reports run until `shutdown`.
    pub(crate) fn shared_through(
        mut self,
        db: &Db,
        config: &LoginLimitsConfig,
        shutdown: &CancellationToken,
    ) -> Self {
        let address = SharedLimit::start(
            db,
            "login-address:",
            SharedQuota::per_minute(config.per_address_per_minute),
            shutdown,
        );
        let name_and_address = SharedLimit::start(
            db,
            "login-name-address:",
            SharedQuota::per_minute(config.per_name_and_address_per_minute),
            shutdown,
        );
        if let (Some(address), Some(name_and_address)) = (address, name_and_address) {
            self.shared = Some(Shared {
                by_address: address,
                by_name_and_address: name_and_address,
            });
        }
        self
    }

    /// The client's address as the limits count it: the peer, or what a trusted proxy says.
    pub(crate) fn client(&self, peer: Option<SocketAddr>, headers: &HeaderMap) -> IpAddr {
        // Without a peer (a router driven in-process) every such request shares one bucket.
        let peer = peer.map_or(IpAddr::from([0, 0, 0, 0]), |p| p.ip().to_canonical());
        let mut client = peer;
        if self.trusted_proxies.contains(&peer) {
            // Each proxy appends the address it got the request from; read from the right,
            // past our own proxies, to the first address none of them vouches for.
            let forwarded = headers
                .get_all("x-forwarded-for")
                .iter()
                .filter_map(|v| v.to_str().ok())
                .flat_map(|v| v.split(','))
                .map(str::trim)
                .collect::<Vec<_>>();
            for hop in forwarded.iter().rev() {
                match hop.parse::<IpAddr>() {
                    Ok(ip) if self.trusted_proxies.contains(&ip.to_canonical()) => continue,
                    Ok(ip) => {
                        client = ip.to_canonical();
                        break;
                    }
                    // A hop we cannot read: count the request against the last proxy.
                    Err(_) => break,
                }
            }
        }
        crate::util::net::counted_as(client)
    }

    /// One attempt from `client` for `name` (already checked to be an identifier): refused
    /// (the address's own limits), or admitted once its turn has come. Returns how long it
    /// waited.
    pub(crate) async fn admit(&self, client: IpAddr, name: &str) -> Result<Duration, Refusal> {
        room(&self.by_address)?;
        self.by_address
            .check_key(&client)
            .map_err(|_| Refusal::Address)?;
        if let Some(shared) = &self.shared {
            shared
                .by_address
                .admit(&client.to_string())
                .await
                .map_err(|_| Refusal::Address)?;
        }
        room(&self.by_name_and_address)?;
        self.by_name_and_address
            .check_key(&(name.to_owned(), client))
            .map_err(|_| Refusal::NameAddress)?;
        if let Some(shared) = &self.shared {
            // A space is in neither a name (an identifier) nor an address.
            shared
                .by_name_and_address
                .admit(&format!("{client} {name}"))
                .await
                .map_err(|_| Refusal::NameAddress)?;
        }
        room(&self.by_name)?;
        let name = name.to_owned();
        if !self.failed_recently(client, &name) {
            // Counted, so that suspect attempts see the name's and the server's real load,
            // but never held up: a full bucket is no reason to slow a clean address.
            self.by_name.check_key(&name).ok();
            self.global.check().ok();
            return Ok(Duration::ZERO);
        }
        let started = Instant::now();
        let turn = async {
            self.by_name.until_key_ready(&name).await;
            self.global.until_ready().await;
        };
        tokio::time::timeout(MAX_PACE, turn)
            .await
            .map_err(|_| Refusal::Paced)?;
        Ok(started.elapsed())
    }

    /// Whether `client` failed to log in as `name` within [`FAILURE_MEMORY`]. While the
    /// failure records are full, every address is.
    fn failed_recently(&self, client: IpAddr, name: &str) -> bool {
        let failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        if failures.len() >= MAX_TRACKED {
            return true;
        }
        failures
            .get(&(name.to_owned(), client))
            .is_some_and(|at| at.elapsed() < FAILURE_MEMORY)
    }

    /// `client` gave a wrong password for `name` (or a name that does not exist).
    pub(crate) fn failed(&self, client: IpAddr, name: &str) {
        let mut failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        if failures.len() >= MAX_TRACKED {
            failures.retain(|_, at| at.elapsed() < FAILURE_MEMORY);
            if failures.len() >= MAX_TRACKED {
                // Full of live records: every address is suspect until room is made.
                return;
            }
        }
        failures.insert((name.to_owned(), client), Instant::now());
    }

    /// `client` logged in as `name`: it is no longer suspect for it.
    pub(crate) fn succeeded(&self, client: IpAddr, name: &str) {
        self.failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(name.to_owned(), client));
    }

    /// Forgets every bucket that is full again and every failure past [`FAILURE_MEMORY`].
    pub(crate) fn forget_idle(&self) {
        self.by_address.retain_recent();
        self.by_address.shrink_to_fit();
        self.by_name_and_address.retain_recent();
        self.by_name_and_address.shrink_to_fit();
        self.by_name.retain_recent();
        self.by_name.shrink_to_fit();
        let mut failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        failures.retain(|_, at| at.elapsed() < FAILURE_MEMORY);
        failures.shrink_to_fit();
    }

    /// How many addresses, names and failures are remembered now.
    pub fn tracked(&self) -> (usize, usize, usize) {
        (
            self.by_address.len(),
            self.by_name.len(),
            self.failures
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .len(),
        )
    }

    /// Forgets idle buckets every `every` until `shutdown`.
    pub(crate) fn spawn_sweeper(self: &Arc<Self>, every: Duration, shutdown: CancellationToken) {
        let limits = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tick.tick() => limits.forget_idle(),
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(
        per_address: u32,
        per_pair: u32,
        per_name: u32,
        global: u32,
        proxies: &[&str],
    ) -> LoginLimits {
        LoginLimits::new(&LoginLimitsConfig {
            per_address_per_minute: per_address,
            per_name_and_address_per_minute: per_pair,
            per_name_per_minute: per_name,
            global_per_minute: global,
            trusted_proxies: proxies.iter().map(|p| p.parse().unwrap()).collect(),
        })
    }

    fn peer(s: &str) -> Option<SocketAddr> {
        Some(SocketAddr::new(s.parse().unwrap(), 40000))
    }

    fn forwarded(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", value.parse().unwrap());
        h
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn forwarded_for_is_believed_only_from_trusted_proxies() {
        let l = limits(1, 1, 1, 1, &["10.0.0.1", "10.0.0.2"]);
        let header = forwarded("6.6.6.6, 203.0.113.7, 10.0.0.2");
        // From a stranger, the header is ignored.
        assert_eq!(
            l.client(peer("198.51.100.9"), &header),
            "198.51.100.9".parse::<IpAddr>().unwrap()
        );
        // From our proxy, the rightmost address no proxy of ours vouches for; what the client
        // itself put further left (6.6.6.6) is not believed.
        assert_eq!(
            l.client(peer("10.0.0.1"), &header),
            "203.0.113.7".parse::<IpAddr>().unwrap()
        );
        assert_eq!(
            l.client(peer("10.0.0.1"), &forwarded("not-an-ip")),
            "10.0.0.1".parse::<IpAddr>().unwrap()
        );
        assert_eq!(
            l.client(None, &header),
            "0.0.0.0".parse::<IpAddr>().unwrap()
        );
        // An IPv4-mapped peer is the IPv4 address; an IPv6 client counts per /64.
        assert_eq!(
            l.client(peer("::ffff:198.51.100.9"), &HeaderMap::new()),
            "198.51.100.9".parse::<IpAddr>().unwrap()
        );
        assert_eq!(
            l.client(peer("2001:db8:1:2:aaaa::1"), &HeaderMap::new()),
            "2001:db8:1:2::".parse::<IpAddr>().unwrap()
        );
    }

    #[tokio::test]
    async fn only_addresses_are_refused_and_names_and_the_server_only_pace() {
        let (a, b, c) = (ip("198.51.100.1"), ip("198.51.100.2"), ip("198.51.100.3"));
        // Per address, any name.
        let l = limits(2, 10, 10, 10, &[]);
        assert_eq!(l.admit(a, "alice").await, Ok(Duration::ZERO));
        assert_eq!(l.admit(a, "bob").await, Ok(Duration::ZERO));
        assert_eq!(l.admit(a, "carol").await, Err(Refusal::Address));
        assert_eq!(l.admit(b, "carol").await, Ok(Duration::ZERO));
        // Per (name, address): the pair is refused, the name from elsewhere is not.
        let l = limits(10, 1, 10, 10, &[]);
        assert_eq!(l.admit(a, "alice").await, Ok(Duration::ZERO));
        assert_eq!(l.admit(a, "alice").await, Err(Refusal::NameAddress));
        assert_eq!(l.admit(a, "bob").await, Ok(Duration::ZERO));
        assert_eq!(l.admit(b, "alice").await, Ok(Duration::ZERO));
        // One attempt a minute for the name and the server, both drawn: an address that
        // failed for `alice` waits and is then refused; a clean address never waits.
        let l = limits(10, 10, 1, 1, &[]);
        assert_eq!(l.admit(a, "alice").await, Ok(Duration::ZERO));
        l.failed(a, "alice");
        assert_eq!(l.admit(c, "alice").await, Ok(Duration::ZERO));
        assert_eq!(l.admit(c, "bob").await, Ok(Duration::ZERO));
        let started = std::time::Instant::now();
        assert_eq!(l.admit(a, "alice").await, Err(Refusal::Paced));
        assert!(started.elapsed() >= MAX_PACE, "{:?}", started.elapsed());
        // A success clears the address.
        l.succeeded(a, "alice");
        assert_eq!(l.admit(a, "alice").await, Ok(Duration::ZERO));
    }

    #[tokio::test]
    async fn a_suspect_attempt_waits_for_its_turn() {
        // 120 a minute: a turn every half second, a burst of 120 drawn by the clean attempts.
        let l = limits(1000, 1000, 120, 100_000, &[]);
        let a = ip("198.51.100.1");
        for i in 0..120u8 {
            l.admit(IpAddr::from([203, 0, 113, i]), "alice")
                .await
                .unwrap();
        }
        l.failed(a, "alice");
        let waited = l.admit(a, "alice").await.unwrap();
        assert!(
            waited >= Duration::from_millis(300) && waited < MAX_PACE,
            "{waited:?}"
        );
    }

    #[tokio::test]
    async fn idle_buckets_are_forgotten_and_the_maps_never_grow_past_the_cap() {
        // 60,000 a minute: one attempt is back in its bucket after a millisecond.
        let l = limits(60_000, 60_000, 60_000, 60_000, &[]);
        for i in 0..50u8 {
            l.admit(IpAddr::from([198, 51, 100, i]), &format!("user{i}"))
                .await
                .unwrap();
        }
        assert_eq!(l.tracked().0, 50);
        assert_eq!(l.tracked().1, 50);
        std::thread::sleep(Duration::from_millis(20));
        l.forget_idle();
        assert_eq!(l.tracked(), (0, 0, 0));

        // Buckets that stay drawn on cannot be forgotten: past the cap, new keys are refused.
        // (One attempt a minute: each bucket stays empty for a minute, far longer than the
        // loop takes even on a loaded machine.)
        let l = limits(1, u32::MAX, u32::MAX, u32::MAX, &[]);
        for i in 0..MAX_TRACKED as u32 {
            l.admit(IpAddr::from(i.to_be_bytes()), "alice").await.ok();
        }
        assert_eq!(l.tracked().0, MAX_TRACKED);
        assert_eq!(
            l.admit(ip("203.0.113.1"), "bob").await,
            Err(Refusal::Crowded)
        );
        assert_eq!(l.tracked().0, MAX_TRACKED);
    }
}
