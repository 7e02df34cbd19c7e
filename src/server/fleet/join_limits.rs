//! How often one client address may try to join, checked before a join touches the store:
//! a token bucket per address on a monotonic clock (governor), like the login limits.
//!
//! A runner joins once in its life (afterwards it re-registers with its own credential, on
//! another path), so a few joins a minute from one address is plenty (the operator raises
//! it, `[join] attempts_per_address_per_minute`, for a fleet joining from behind one NAT);
//! a flood of made-up tokens from one address is answered 429 without a query, a slot or an
//! audit row of its own (the refusals are counted, `audit/refusals.rs`).
//!
//! Invariants: state is bounded. Past [`MAX_TRACKED`] addresses the limiter forgets every
//! bucket that is full again, and if that is not enough refuses new addresses rather than
//! grow. The address is the one the login limits count (`LoginLimits::client`: the socket's
//! peer, or what a trusted proxy says; IPv6 per /64).

use std::net::IpAddr;
use std::num::NonZeroU32;

use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};

/// Join attempts one address may make a minute (also the burst) unless the operator says
/// otherwise (`[join] attempts_per_address_per_minute`); why twenty is said where the config
/// defines it.
pub const JOINS_PER_MINUTE: u32 = crate::server::config::DEFAULT_JOIN_ATTEMPTS_PER_MINUTE;

/// The most addresses the limiter remembers at once.
pub(crate) const MAX_TRACKED: usize = 100_000;

/// Why an attempt was refused before the store was asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JoinLimited {
    /// This address used up its joins for now (the limit a minute).
    Address(u32),
    /// More addresses than [`MAX_TRACKED`] are trying to join at once.
    Crowded,
}

impl JoinLimited {
    pub(crate) fn message(self) -> String {
        match self {
            JoinLimited::Address(per_minute) => format!(
                "too many join attempts from this address (at most {per_minute} a minute): wait a minute and try again"
            ),
            JoinLimited::Crowded => {
                "too many addresses are trying to join at once: wait a minute and try again".into()
            }
        }
    }
}

pub struct JoinLimits {
    by_address: DefaultKeyedRateLimiter<IpAddr>,
    per_minute: u32,
}

impl JoinLimits {
    pub(crate) fn per_minute(n: u32) -> Self {
        let n = NonZeroU32::new(n.max(1)).expect("max(1)");
        JoinLimits {
            by_address: RateLimiter::keyed(Quota::per_minute(n).allow_burst(n)),
            per_minute: n.get(),
        }
    }

    /// One join attempt from `client`.
    pub(crate) fn check(&self, client: IpAddr) -> Result<(), JoinLimited> {
        if self.by_address.len() >= MAX_TRACKED {
            self.by_address.retain_recent();
            if self.by_address.len() >= MAX_TRACKED {
                return Err(JoinLimited::Crowded);
            }
        }
        self.by_address
            .check_key(&client)
            .map_err(|_| JoinLimited::Address(self.per_minute))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_address_has_its_own_bucket() {
        let limits = JoinLimits::per_minute(3);
        let a: IpAddr = "198.51.100.1".parse().unwrap();
        let b: IpAddr = "198.51.100.2".parse().unwrap();
        for _ in 0..3 {
            assert_eq!(limits.check(a), Ok(()));
        }
        assert_eq!(limits.check(a), Err(JoinLimited::Address(3)));
        assert!(
            JoinLimited::Address(3)
                .message()
                .contains("at most 3 a minute"),
            "the message names the limit in force"
        );
        assert_eq!(limits.check(b), Ok(()), "another address is not held up");
    }
}
