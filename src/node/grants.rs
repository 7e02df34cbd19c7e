//! The runner's side of grants (issue 47): a risk:high write that carries people's grant
//! instead of an approval runs here only when this runner finds the grant good itself, and
//! counts it against the grant's calls in its own state directory; and `POST
//! /v1/grants/revoked`, where the server tells it which grants must run nothing more.
//!
//! *Invariant:* a write runs under a grant only when
//! - the call carries the grant alone (no approval id, no policy's lowering, no decision);
//! - this runner does not require witnessed approvals (a grant's call carries no witnessed
//!   proof, so such a runner runs none);
//! - where `require_signed_approvals` covers the tool, the grant passes its one check
//!   ([`crate::protocol::approval::grant::check`]) against this runner's approvers file, its
//!   own name and labels and `max_grant_lifetime_secs`; elsewhere (the server's signatures are
//!   trusted for this tool here, as its approval ids are) the grant still admits the call, has
//!   not expired and lives within that bound, and a break-glass window never runs (only an
//!   approvers file honours one);
//! - it was asked for after this runner's state began, was not revoked here, and fewer than
//!   its `calls_per_runner` (and `calls`) ran here under it, the use taken durably before the
//!   write runs ([`super::executed::Executed::take_use`]).
//!
//! A revocation token is signed by `server.key` (purpose `revoke`, for this runner; `agent`
//! verifies it and hands its grants to [`record_revoked`]); it only ever takes authority away,
//! so a replay changes nothing.
//!
//! *Invariant:* this module imports nothing of `agent` (which calls it): it reads the runner
//! only through [`Node`], and takes its refusals from [`super::refusal`], so the runner's
//! modules form a tree.

use axum::http::StatusCode;

use super::approvals::Gate;
use super::config::RunnerConfig;
use super::executed::Executed;
use super::refusal::{Refused, forbidden, ledger_refusal};
use crate::pack::Tool;
use crate::protocol::CallRequest;
use crate::protocol::approval::check_lifetime;
use crate::protocol::approval::grant::{self, Grant, GrantProof};
use crate::protocol::signing::{CallClaims, RevokedGrant, now};

/// The most grants one revocation token may name: far more than are ever alive at once (each
/// lives an hour at most by default).
const MAX_REVOKED_PER_TOKEN: usize = 1000;

/// What a grant's check reads of the runner (`agent` builds it from its state).
pub(super) struct Node<'a> {
    /// Its name, labels and `max_grant_lifetime_secs`.
    pub(super) config: &'a RunnerConfig,
    /// Which tools need people's signatures here, and the approvers file that checks them.
    pub(super) gate: &'a Gate,
    /// The ledger: when this runner's state began, the grants revoked here, the uses taken.
    pub(super) executed: &'a Executed,
    /// Whether this runner requires witnessed approvals (`require_witnessed`): then no grant
    /// runs here.
    pub(super) requires_witnessed: bool,
}

/// How many grants of one revocation token were recorded as revoked here, and how many had
/// expired already (nothing to remember).
#[derive(Debug)]
pub(super) struct Revocations {
    pub(super) recorded: usize,
    pub(super) expired: usize,
}

/// The check, on `node`, of one risk:high execution that carries `proof`, and its use taken in
/// `node`'s ledger.
pub(super) fn check(
    node: &Node<'_>,
    tool: &Tool,
    claims: &CallClaims,
    request: &CallRequest,
    proof: &GrantProof,
) -> Result<(), Refused> {
    let carries_approval = claims.approval_id.is_some()
        || claims.lowered_by_policy.is_some()
        || request.approval.is_some()
        || request.decision.is_some()
        || request.witnessed.is_some();
    if carries_approval {
        return Err(forbidden(
            "the call carries a grant and an approval (or a policy's lowering, or a rollout decision): a write runs under one of them, never both".to_owned(),
        ));
    }
    if node.requires_witnessed {
        return Err(forbidden(format!(
            "`{}`: this runner requires witnessed approvals (require_witnessed), and a call under a grant carries no witnessed proof, so no grant runs here",
            tool.name
        )));
    }
    let config = node.config;
    let (grant, expires, signed_by) = if node.gate.requires(&tool.name) {
        let checked = node
            .gate
            .check_grant(
                &config.name,
                &config.labels,
                request,
                proof,
                config.max_grant_lifetime_secs,
                node.executed,
            )
            .map_err(forbidden)?;
        let people: Vec<String> = checked.signed.iter().map(|s| s.person.clone()).collect();
        (checked.grant, checked.expires, Some(people))
    } else {
        let (grant, expires) = unsigned_here(node, request, proof).map_err(forbidden)?;
        (grant, expires, None)
    };
    if node.executed.revoked(&grant.id) {
        return Err(forbidden(format!(
            "grant {} was revoked (the server told this runner so): nothing more runs under it",
            grant.id
        )));
    }
    let limit = grant.runner_limit();
    let n = node
        .executed
        .take_use(&grant.id, limit, expires)
        .map_err(ledger_refusal)?;
    tracing::info!(tool = %tool.name, call_id = %claims.call_id, grant = %grant.id, use_here = n, of = limit,
        break_glass = grant.break_glass, signed_by = ?signed_by,
        "executing a risk:high tool under a grant checked here");
    Ok(())
}

/// The grant, where this runner does not check people's signatures for the tool: it still
/// admits the call, lives within `max_grant_lifetime_secs`, has not expired, was asked for
/// after this runner's state began, and is no break-glass window.
fn unsigned_here(
    node: &Node<'_>,
    request: &CallRequest,
    proof: &GrantProof,
) -> Result<(Grant, u64), String> {
    let config = node.config;
    let grant = Grant::parse(&proof.text).map_err(|e| e.to_string())?;
    if grant.break_glass {
        return Err(format!(
            "`{}`: a break-glass window runs only where the runner's approvers file honours it (`break_glass = true`), and this runner checks no signatures for the tool",
            request.tool
        ));
    }
    let call = grant::Call {
        tool: &request.tool,
        runner: &config.name,
        labels: &config.labels,
        args: &request.args,
        agent: None,
    };
    grant::admits(&grant, &call)?;
    let expires = grant.expires_unix().map_err(|e| e.to_string())?;
    let requested = check_lifetime(&grant.id, expires, now(), config.max_grant_lifetime_secs)
        .map_err(|e| format!("the grant: {e}"))?;
    node.executed
        .check_requested(&format!("grant {}", grant.id), requested)?;
    Ok((grant, expires))
}

/// Records each grant a verified revocation token names (`grants`) as revoked in `executed`,
/// remembered until its `expires` but no longer than `max_lifetime` seconds from now (no grant
/// lives longer here). The whole list is checked first (at most [`MAX_REVOKED_PER_TOKEN`], each
/// id a UUIDv7), so a bad one records nothing; a grant already expired is counted, not
/// recorded: it runs nothing here anyway.
pub(super) fn record_revoked(
    executed: &Executed,
    max_lifetime: u64,
    grants: &[RevokedGrant],
) -> Result<Revocations, Refused> {
    if grants.len() > MAX_REVOKED_PER_TOKEN {
        return Err((
            StatusCode::BAD_REQUEST,
            format!("`grants`: at most {MAX_REVOKED_PER_TOKEN} in one token"),
        ));
    }
    if let Some(bad) = grants
        .iter()
        .find(|g| crate::protocol::approval::issued_millis(&g.id).is_none())
    {
        return Err((
            StatusCode::BAD_REQUEST,
            format!(
                "`grants`: `{}` is not a grant id (a UUIDv7)",
                bad.id.escape_debug()
            ),
        ));
    }
    // A later `expires` is remembered no longer than a grant may live here.
    let t = now();
    let longest = t + max_lifetime;
    let mut told = Revocations {
        recorded: 0,
        expired: 0,
    };
    for revoked in grants {
        // An expired grant runs nothing here anyway: nothing to remember, and the answer
        // says so rather than count it as revoked.
        if revoked.expires <= t {
            told.expired += 1;
            continue;
        }
        executed
            .revoke(&revoked.id, revoked.expires.min(longest))
            .map_err(ledger_refusal)?;
        told.recorded += 1;
        tracing::warn!(grant = %revoked.id, "grant revoked: nothing more runs under it here");
    }
    Ok(told)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A grant id of the shape the server makes (a UUIDv7), the `n`th of a test.
    fn grant_id(n: u32) -> String {
        format!("01900000-0000-7000-8000-{n:012}")
    }

    fn revoked(n: u32, expires: u64) -> RevokedGrant {
        RevokedGrant {
            id: grant_id(n),
            expires,
        }
    }

    #[test]
    fn a_revocation_is_kept_no_longer_than_a_grant_lives_and_an_expired_one_only_counted() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Executed::load(dir.path()).unwrap();
        let t = now();
        let told = record_revoked(
            &ledger,
            3600,
            &[
                revoked(1, t + 600),
                revoked(2, t + 86_400),
                revoked(3, t - 1),
            ],
        )
        .unwrap();
        assert_eq!((told.recorded, told.expired), (2, 1));
        assert!(ledger.revoked(&grant_id(1)) && ledger.revoked(&grant_id(2)));
        assert!(!ledger.revoked(&grant_id(3)));
        // The one that claims a day is kept an hour at most (`max_lifetime`).
        let text = std::fs::read_to_string(dir.path().join("approvals-executed")).unwrap();
        let kept: u64 = text
            .lines()
            .find_map(|l| l.strip_prefix(&format!("revoked:{} ", grant_id(2))))
            .unwrap()
            .parse()
            .unwrap();
        assert!(kept <= now() + 3600, "{text}");
    }

    #[test]
    fn a_bad_revocation_list_is_refused_whole_naming_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Executed::load(dir.path()).unwrap();
        let t = now();
        let not_an_id = RevokedGrant {
            id: "g1".into(),
            expires: t + 600,
        };
        let (status, why) =
            record_revoked(&ledger, 3600, &[revoked(1, t + 600), not_an_id]).unwrap_err();
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(why.contains("`grants`: `g1` is not a grant id"), "{why}");
        assert!(!ledger.revoked(&grant_id(1)), "nothing is recorded");
        let many: Vec<_> = (0..=MAX_REVOKED_PER_TOKEN as u32)
            .map(|n| revoked(n, t + 600))
            .collect();
        let (status, why) = record_revoked(&ledger, 3600, &many).unwrap_err();
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(why.contains("at most 1000"), "{why}");
        assert!(!ledger.revoked(&grant_id(0)), "nothing is recorded");
    }
}
