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
//! (join, re-register, heartbeat); `roster` lists and removes joined runners and keeps each
//! replica's registry in step with the table.

use std::time::Duration;

use base64::Engine;

mod enrol;
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
/// How often a joined runner sends a heartbeat.
pub(crate) const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(10);
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
