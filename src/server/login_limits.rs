//! How fast people (and anyone guessing their passwords) may try to log in: per client
//! address, for the whole server, and per user name, each a token bucket on a monotonic
//! clock.
//!
//! The checks run in that order. A flood from one address is stopped by its own bucket
//! before it spends the server's; the global bucket bounds the password hashing the server
//! does, whoever asks; the per-name bucket slows a guesser spread over many addresses.
//!
//! Invariants: state is bounded. A sweeper forgets every bucket that is full again, and past
//! [`MAX_TRACKED`] keys a limiter forgets at once and then refuses new keys rather than grow.
//! The client address is the socket's peer; `X-Forwarded-For` is believed only when the peer
//! is one of the configured `trusted_proxies`, and then only its rightmost entry that is not a
//! trusted proxy itself. IPv6 clients are counted per /64, the block one host usually holds.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use axum::http::HeaderMap;
use governor::{DefaultDirectRateLimiter, DefaultKeyedRateLimiter, Quota, RateLimiter};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

/// The most addresses or names a limiter remembers at once.
pub const MAX_TRACKED: usize = 100_000;

/// The `[login]` section of emisar.toml: attempts per minute (each also the burst).
#[derive(schemars::JsonSchema, Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoginLimitsConfig {
    /// From one client address (an IPv6 /64).
    #[serde(default = "default_per_address")]
    pub per_address_per_minute: u32,
    /// For one user name, from anywhere.
    #[serde(default = "default_per_name")]
    pub per_name_per_minute: u32,
    /// For the whole server: bounds the password hashing a flood can cause.
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
            per_name_per_minute: default_per_name(),
            global_per_minute: default_global(),
            trusted_proxies: Vec::new(),
        }
    }
}

impl LoginLimitsConfig {
    pub fn check(&self) -> anyhow::Result<()> {
        for (field, value) in [
            ("login.per_address_per_minute", self.per_address_per_minute),
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

/// Which limit refused an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    Address,
    Global,
    Name,
    /// More distinct addresses or names than [`MAX_TRACKED`] are trying at once.
    Crowded,
}

impl Refusal {
    pub fn message(self) -> &'static str {
        match self {
            Refusal::Address => "too many login attempts from this address: wait a minute",
            Refusal::Global => "too many login attempts on this server: wait a minute",
            Refusal::Name => "too many login attempts for this user: wait a minute",
            Refusal::Crowded => "too many clients are trying to log in at once: wait a minute",
        }
    }
}

pub struct LoginLimits {
    by_address: DefaultKeyedRateLimiter<IpAddr>,
    global: DefaultDirectRateLimiter,
    by_name: DefaultKeyedRateLimiter<String>,
    trusted_proxies: Vec<IpAddr>,
}

fn per_minute(n: u32) -> Quota {
    let n = NonZeroU32::new(n.max(1)).expect("max(1)");
    Quota::per_minute(n).allow_burst(n)
}

impl LoginLimits {
    pub fn new(config: &LoginLimitsConfig) -> Self {
        LoginLimits {
            by_address: RateLimiter::keyed(per_minute(config.per_address_per_minute)),
            global: RateLimiter::direct(per_minute(config.global_per_minute)),
            by_name: RateLimiter::keyed(per_minute(config.per_name_per_minute)),
            trusted_proxies: config.trusted_proxies.clone(),
        }
    }

    /// The client's address as the limits count it: the peer, or what a trusted proxy says.
    pub fn client(&self, peer: Option<SocketAddr>, headers: &HeaderMap) -> IpAddr {
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
        match client {
            IpAddr::V6(v6) => {
                let bits = u128::from(v6) & !((1u128 << 64) - 1);
                IpAddr::V6(Ipv6Addr::from(bits))
            }
            v4 => v4,
        }
    }

    /// One attempt from `client` for `name` (already checked to be an identifier).
    pub fn check(&self, client: IpAddr, name: &str) -> Result<(), Refusal> {
        if self.by_address.len() >= MAX_TRACKED {
            self.by_address.retain_recent();
            if self.by_address.len() >= MAX_TRACKED {
                return Err(Refusal::Crowded);
            }
        }
        self.by_address
            .check_key(&client)
            .map_err(|_| Refusal::Address)?;
        self.global.check().map_err(|_| Refusal::Global)?;
        if self.by_name.len() >= MAX_TRACKED {
            self.by_name.retain_recent();
            if self.by_name.len() >= MAX_TRACKED {
                return Err(Refusal::Crowded);
            }
        }
        self.by_name
            .check_key(&name.to_owned())
            .map_err(|_| Refusal::Name)
    }

    /// Forgets every address and name whose bucket is full again.
    pub fn forget_idle(&self) {
        self.by_address.retain_recent();
        self.by_address.shrink_to_fit();
        self.by_name.retain_recent();
        self.by_name.shrink_to_fit();
    }

    /// How many addresses and names are remembered now.
    pub fn tracked(&self) -> (usize, usize) {
        (self.by_address.len(), self.by_name.len())
    }

    /// Forgets idle buckets every `every` until `shutdown`.
    pub fn spawn_sweeper(self: &Arc<Self>, every: Duration, shutdown: CancellationToken) {
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

    fn limits(per_address: u32, per_name: u32, global: u32, proxies: &[&str]) -> LoginLimits {
        LoginLimits::new(&LoginLimitsConfig {
            per_address_per_minute: per_address,
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

    #[test]
    fn forwarded_for_is_believed_only_from_trusted_proxies() {
        let l = limits(1, 1, 1, &["10.0.0.1", "10.0.0.2"]);
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

    #[test]
    fn each_limit_refuses_in_turn() {
        let l = limits(2, 10, 3, &[]);
        let a: IpAddr = "198.51.100.1".parse().unwrap();
        let b: IpAddr = "198.51.100.2".parse().unwrap();
        let c: IpAddr = "198.51.100.3".parse().unwrap();
        assert_eq!(l.check(a, "alice"), Ok(()));
        assert_eq!(l.check(a, "bob"), Ok(()));
        assert_eq!(l.check(a, "carol"), Err(Refusal::Address));
        assert_eq!(l.check(b, "dave"), Ok(()));
        assert_eq!(l.check(c, "erin"), Err(Refusal::Global));
        let l = limits(10, 1, 10, &[]);
        assert_eq!(l.check(a, "alice"), Ok(()));
        assert_eq!(l.check(b, "alice"), Err(Refusal::Name));
        assert_eq!(l.check(b, "bob"), Ok(()));
    }

    #[test]
    fn idle_buckets_are_forgotten_and_the_maps_never_grow_past_the_cap() {
        // 60,000 a minute: one attempt is back in its bucket after a millisecond.
        let l = limits(60_000, 60_000, 60_000, &[]);
        for i in 0..50u8 {
            l.check(IpAddr::from([198, 51, 100, i]), &format!("user{i}"))
                .unwrap();
        }
        assert_eq!(l.tracked(), (50, 50));
        std::thread::sleep(Duration::from_millis(20));
        l.forget_idle();
        assert_eq!(l.tracked(), (0, 0));

        // Buckets that stay drawn on cannot be forgotten: past the cap, new keys are refused.
        // (One attempt a minute: each bucket stays empty for a minute, far longer than the
        // loop takes even on a loaded machine.)
        let l = limits(1, 1, u32::MAX, &[]);
        for i in 0..MAX_TRACKED as u32 {
            l.check(IpAddr::from(i.to_be_bytes()), "alice").ok();
        }
        assert_eq!(l.tracked().0, MAX_TRACKED);
        assert_eq!(
            l.check("203.0.113.1".parse().unwrap(), "bob"),
            Err(Refusal::Crowded)
        );
        assert_eq!(l.tracked().0, MAX_TRACKED);
    }
}
