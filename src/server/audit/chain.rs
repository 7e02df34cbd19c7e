//! Audit events and the hash chain that links them. Pure: no IO.
//!
//! Invariant: `hash = sha256(canonical JSON of every other field, prev_hash included)` and
//! `prev_hash` is the previous event's `hash` (the genesis event points at 64 zeros), so
//! changing, removing or reordering any stored event breaks the chain at that event.

use serde::Serialize;
use serde_json::{Value, json};

use crate::digest::{canonical_json, sha256_hex};

pub const GENESIS_HASH: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// Event kinds, as stored in the `kind` column.
pub mod kind {
    /// A tool call passed validation and policy; written before anything runs.
    pub const TOOL_CALLED: &str = "tool.called";
    /// A tool call was refused (bad input, unknown runner, policy).
    pub const TOOL_REJECTED: &str = "tool.rejected";
    /// A runner answered and the action succeeded.
    pub const CALL_EXECUTED: &str = "call.executed";
    /// The action failed or the runner could not be reached.
    pub const CALL_FAILED: &str = "call.failed";
    pub const TOKEN_ISSUED: &str = "token.issued";
    pub const TOKEN_REVOKED: &str = "token.revoked";
    pub const SERVER_STARTED: &str = "server.started";
    /// A call that needs humans became a pending approval request.
    pub const APPROVAL_REQUESTED: &str = "approval.requested";
    /// One approver said yes (the detail says whether that settled it).
    pub const APPROVAL_APPROVED: &str = "approval.approved";
    pub const APPROVAL_DENIED: &str = "approval.denied";
    pub const APPROVAL_EXPIRED: &str = "approval.expired";
    /// The agent cancelled its call while the request was still pending.
    pub const APPROVAL_WITHDRAWN: &str = "approval.withdrawn";
    /// An approved request was claimed for execution; written before any runner is called.
    pub const APPROVAL_EXECUTING: &str = "approval.executing";
    /// Execution was interrupted (a crash) and its outcome is not known; never re-run.
    pub const CALL_UNKNOWN: &str = "call.unknown";
    pub const POLICY_LOADED: &str = "policy.loaded";
    pub const USER_ADDED: &str = "user.added";
    pub const USER_REMOVED: &str = "user.removed";
    pub const LOGIN: &str = "login";
    pub const LOGIN_FAILED: &str = "login.failed";
    pub const LOGOUT: &str = "logout";
}

/// An event as a caller hands it to the writer.
#[derive(Debug, Clone, Default, Serialize)]
pub struct NewEvent {
    /// Who: `agent:NAME`, `user:NAME`, `cli:USER` or `system`.
    pub actor: String,
    pub kind: String,
    pub tool: Option<String>,
    pub runner: Option<String>,
    /// The arguments of a call (secret params already replaced).
    pub args: Option<Value>,
    pub reason: Option<String>,
    /// Ties the intent and the per-runner outcomes of one call together.
    pub call_id: Option<String>,
    pub approval_id: Option<String>,
    /// `ok`, `error`, `refused`, ...
    pub outcome: Option<String>,
    /// SHA-256 of the canonical result the runner returned.
    pub result_digest: Option<String>,
    /// Anything else worth keeping: an error message, a duration, an excerpt.
    pub detail: Option<Value>,
}

/// A stored event.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Event {
    pub seq: i64,
    pub id: String,
    /// RFC 3339 UTC with microseconds, the exact text that was hashed.
    pub at: String,
    pub actor: String,
    pub kind: String,
    pub tool: Option<String>,
    pub runner: Option<String>,
    pub args: Option<Value>,
    pub reason: Option<String>,
    pub call_id: Option<String>,
    pub approval_id: Option<String>,
    pub outcome: Option<String>,
    pub result_digest: Option<String>,
    pub detail: Option<Value>,
    pub prev_hash: String,
    pub hash: String,
}

impl Event {
    /// Seals `new` as event number `seq` after `prev_hash`.
    pub fn seal(new: NewEvent, seq: i64, id: String, at: String, prev_hash: String) -> Event {
        let mut event = Event {
            seq,
            id,
            at,
            actor: new.actor,
            kind: new.kind,
            tool: new.tool,
            runner: new.runner,
            args: new.args,
            reason: new.reason,
            call_id: new.call_id,
            approval_id: new.approval_id,
            outcome: new.outcome,
            result_digest: new.result_digest,
            detail: new.detail,
            prev_hash,
            hash: String::new(),
        };
        event.hash = event.compute_hash();
        event
    }

    /// The hash this event should carry, from its other fields.
    pub fn compute_hash(&self) -> String {
        let body = json!({
            "seq": self.seq,
            "id": self.id,
            "at": self.at,
            "actor": self.actor,
            "kind": self.kind,
            "tool": self.tool,
            "runner": self.runner,
            "args": self.args,
            "reason": self.reason,
            "call_id": self.call_id,
            "approval_id": self.approval_id,
            "outcome": self.outcome,
            "result_digest": self.result_digest,
            "detail": self.detail,
            "prev_hash": self.prev_hash,
        });
        sha256_hex(canonical_json(&body).as_bytes())
    }
}

/// The timestamp format of `at`: fixed width, so text order is time order.
pub fn format_at(t: chrono::DateTime<chrono::Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct BrokenLink {
    pub seq: i64,
    pub problem: String,
}

#[derive(Debug, Clone, Serialize, PartialEq, Default)]
pub struct VerifyReport {
    pub checked: u64,
    pub first_seq: Option<i64>,
    pub last_seq: Option<i64>,
    pub broken: Option<BrokenLink>,
}

/// Walks events in `seq` order and stops at the first broken link.
#[derive(Debug)]
pub struct Verifier {
    report: VerifyReport,
    prev: Option<(i64, String)>,
}

impl Verifier {
    /// `anchor` is the (seq, hash) of the event before the first one fed, if any.
    pub fn new(anchor: Option<(i64, String)>) -> Self {
        Verifier {
            report: VerifyReport::default(),
            prev: anchor,
        }
    }

    /// Checks one event; returns false once the chain is broken.
    pub fn feed(&mut self, e: &Event) -> bool {
        if self.report.broken.is_some() {
            return false;
        }
        let problem = match &self.prev {
            None if e.seq != 1 => Some(format!("the log starts at seq {} instead of 1", e.seq)),
            None if e.prev_hash != GENESIS_HASH => {
                Some("the first event does not point at the genesis hash".to_owned())
            }
            Some((seq, _)) if e.seq != seq + 1 => Some(format!(
                "seq {} follows seq {seq}: events are missing",
                e.seq
            )),
            Some((_, hash)) if &e.prev_hash != hash => Some(format!(
                "prev_hash {} does not match the hash of seq {} ({hash})",
                e.prev_hash,
                e.seq - 1
            )),
            _ => {
                let expected = e.compute_hash();
                (expected != e.hash).then(|| {
                    format!("stored hash {} does not match its contents (expected {expected}): the event was altered", e.hash)
                })
            }
        };
        if let Some(problem) = problem {
            self.report.broken = Some(BrokenLink {
                seq: e.seq,
                problem,
            });
            return false;
        }
        self.report.checked += 1;
        self.report.first_seq.get_or_insert(e.seq);
        self.report.last_seq = Some(e.seq);
        self.prev = Some((e.seq, e.hash.clone()));
        true
    }

    pub fn finish(self) -> VerifyReport {
        self.report
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(n: i64) -> Vec<Event> {
        let mut prev = GENESIS_HASH.to_owned();
        (1..=n)
            .map(|seq| {
                let e = Event::seal(
                    NewEvent {
                        actor: "agent:a".into(),
                        kind: kind::TOOL_CALLED.into(),
                        args: Some(json!({"b": 1, "a": [seq]})),
                        ..Default::default()
                    },
                    seq,
                    format!("id-{seq}"),
                    "2026-11-30T00:00:00.000000Z".into(),
                    prev.clone(),
                );
                prev = e.hash.clone();
                e
            })
            .collect()
    }

    fn verify(events: &[Event]) -> VerifyReport {
        let mut v = Verifier::new(None);
        for e in events {
            if !v.feed(e) {
                break;
            }
        }
        v.finish()
    }

    #[test]
    fn an_intact_chain_verifies() {
        let r = verify(&chain(5));
        assert_eq!(r.checked, 5);
        assert_eq!(r.broken, None);
    }

    #[test]
    fn tampering_is_found_at_the_right_event() {
        let mut events = chain(5);
        events[2].reason = Some("edited".into());
        assert_eq!(verify(&events).broken.unwrap().seq, 3);

        let mut events = chain(5);
        events.remove(3);
        let b = verify(&events).broken.unwrap();
        assert_eq!(b.seq, 5);
        assert!(b.problem.contains("missing"));

        let mut events = chain(5);
        let resealed = Event::seal(
            NewEvent::default(),
            2,
            "x".into(),
            "t".into(),
            events[0].hash.clone(),
        );
        events[1] = resealed;
        assert_eq!(verify(&events).broken.unwrap().seq, 3);
    }
}
