//! Runners' identity at the server: join tokens (issue, list, revoke), the join handshake,
//! re-registration with a runner's own credential, heartbeats, removal, and keeping every
//! replica's registry in step with the `runners` table.
//!
//! A runner presents a join token once and gets back its own runner token (its credential,
//! for re-registration and heartbeats) and the server's public key (to verify calls). Only
//! SHA-256 hashes of both tokens are stored.
//!
//! Invariants:
//! - A join consumes one use of its token with one guarded `UPDATE … RETURNING`, in the same
//!   transaction as the new `runners` row, so two joins never share a token's last use.
//! - A join never replaces a runner: not one from the server's config, not one that joined
//!   before (re-registration needs that runner's credential). Its name must fit the token's
//!   name or pattern, and it gets exactly the labels the token grants.
//! - Every refused join is audited (`runner.join_refused`, with the reason, never the token)
//!   and changes nothing: no use consumed, no row, no registry entry. Repeats from one client
//!   address are counted per window after the first (`refusal.repeated`), and joins are
//!   limited per address (`join_limits`) before the store is asked.
//! - A refused join holds no PostgreSQL join slot (nor SQLite's join lock) while it is
//!   audited, and a token that cannot be used is refused before a slot is taken at all.
//! - A join or re-registration is written only after its audit event is durable.
//!
//! `join_tokens` issues, lists and revokes join tokens; `enrol` is the HTTP side of runners
//! (join, re-register, heartbeat); `heartbeats` writes the heartbeats that arrive together
//! with one statement, which also authenticates each; `roster` lists and removes joined
//! runners and keeps each replica's registry in step with the table.

use std::time::Duration;

use base64::Engine;

mod enrol;
mod heartbeats;
mod join_limits;
mod join_tokens;
mod roster;

pub use enrol::Fleet;
pub use join_limits::{JOINS_PER_MINUTE, JoinLimited, JoinLimits};
pub use join_tokens::{
    IssuedJoinToken, JoinTokenInfo, JoinTokenSpec, JoinTokenState, NameRule, issue_join_token,
    list_join_tokens, parse_label, revoke_join_token,
};
pub use roster::{JoinedRunner, joined_runners, remove_runner, spawn_sync};

const RUNNER_PREFIX: &str = "emr_";
/// How often a joined runner sends a heartbeat in a fleet of up to 500 runners; a larger
/// fleet's runners are told to send them less often ([`heartbeat_interval`]).
pub(crate) const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(10);
/// The most heartbeats a second the server asks of the whole fleet: each costs a TLS request
/// and a write, so 1,000 runners at one every 10 s would cost more than everything else an
/// idle server does. Nomad's servers do the same (`max_heartbeats_per_second`, 50 by
/// default, with a 10 s floor, `min_heartbeat_ttl`).
pub(crate) const HEARTBEATS_PER_SECOND: u32 = 50;

/// The heartbeat interval a runner is told (when it joins, re-registers, and in every
/// heartbeat's answer) in a fleet of `runners`: [`HEARTBEAT_INTERVAL`], or longer so that
/// the fleet together sends at most [`HEARTBEATS_PER_SECOND`]. A fleet that grows is told
/// within one interval; a runner's health meanwhile comes from the server's probes.
pub(crate) fn heartbeat_interval(runners: usize) -> Duration {
    let spread = Duration::from_millis(runners as u64 * 1000 / u64::from(HEARTBEATS_PER_SECOND));
    HEARTBEAT_INTERVAL.max(spread)
}
/// The longest a join token may live: it is needed once per runner, so a long life only
/// widens the window in which a copy of it is worth stealing.
pub(crate) const MAX_JOIN_TOKEN_TTL: Duration = Duration::from_secs(30 * 86_400);
/// The most joins one token may allow.
pub(crate) const MAX_JOIN_TOKEN_USES: u32 = 10_000;
/// The most labels a join token may grant and packs a runner may announce.
const MAX_LABELS: usize = 32;
const MAX_PACKS: usize = 256;
/// The longest runner URL accepted.
const MAX_URL_LEN: usize = 500;

/// The fleet's audit event kinds, defined with every other kind in the audit log's own list
/// (so the audit log needs nothing from the fleet).
pub mod kind {
    pub use crate::server::audit::kind::{
        JOIN_TOKEN_ISSUED, JOIN_TOKEN_REVOKED, RUNNER_JOIN_REFUSED, RUNNER_JOINED,
        RUNNER_REGISTERED, RUNNER_REMOVED,
    };
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum FleetError {
    /// The request is malformed (400).
    #[error("{0}")]
    Invalid(String),
    /// The token or credential does not authenticate (401).
    #[error("{0}")]
    Unauthorized(String),
    /// The token does not allow this (403).
    #[error("{0}")]
    Forbidden(String),
    /// The name belongs to another runner (409).
    #[error("{0}")]
    Conflict(String),
    /// Too many join attempts from this address (429), refused before the store was asked.
    #[error("{0}")]
    TooMany(String),
    #[error("the store failed: {0}")]
    Store(#[from] sqlx::Error),
    #[error("the audit log cannot record this: {0}")]
    Audit(#[from] crate::server::audit::AuditError),
}

fn random_secret(prefix: &str) -> anyhow::Result<String> {
    let mut secret = [0u8; 32];
    getrandom::fill(&mut secret).map_err(|e| anyhow::anyhow!("no randomness: {e}"))?;
    Ok(format!(
        "{prefix}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(secret)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_large_fleet_is_told_to_heartbeat_less_often() {
        assert_eq!(heartbeat_interval(0), HEARTBEAT_INTERVAL);
        assert_eq!(heartbeat_interval(500), HEARTBEAT_INTERVAL, "50 a second");
        assert_eq!(heartbeat_interval(1000), Duration::from_secs(20));
        assert_eq!(heartbeat_interval(10_000), Duration::from_secs(200));
        for n in [1, 499, 501, 1000, 3333] {
            let per_second = n as f64 / heartbeat_interval(n).as_secs_f64();
            assert!(
                per_second <= f64::from(HEARTBEATS_PER_SECOND),
                "{n}: {per_second}"
            );
        }
    }
}
