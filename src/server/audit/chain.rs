//! Audit events and the hash chain that links them. Pure: no IO.
//!
//! Invariant: `hash = sha256(event text)`, where the event text is the canonical JSON of every
//! other field (`prev_hash` included), and `prev_hash` is the previous event's `hash` (the
//! genesis event points at 64 zeros), so changing, removing or reordering any stored event
//! breaks the chain at that event.
//!
//! The event text is written directly ([`EventText::write`]): the keys are fixed, so they are
//! emitted in sorted order into one buffer, strings escaped by serde_json, and `args` and
//! `detail` spliced in as the canonical JSON text that is *stored*. Hashing the stored text,
//! not a value in memory, is what keeps a database that normalises JSON (PostgreSQL's JSONB
//! turns `-0.0` into `0`, rewrites large and long numbers, refuses `\u0000`) from breaking
//! the chain: the text is stored as TEXT and hashed byte for byte. The result is the same
//! bytes `canonical_json` gives for the whole event as one JSON object (a property test holds
//! it to that), so events written before the text was stored still verify: for those rows
//! (`hash_v` 1) the verifier re-canonicalises the stored JSON first.
//!
//! `at` never decreases along `seq` in events of format 2 (the writer stamps it under the
//! append lock); the verifier reports an event whose `at` is before its predecessor's.

use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::digest::canonical_json;
pub use crate::protocol::audit_event::{Event, EventText};
use crate::tlog::tree::{Frontier, Hash};

pub const GENESIS_HASH: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// Event kinds, as stored in the `kind` column.
pub mod kind {
    /// A tool call passed validation and policy; a write's is written before anything runs,
    /// a read's in one commit with its outcomes, before the agent gets them.
    pub const TOOL_CALLED: &str = "tool.called";
    /// A tool call was refused (bad input, unknown runner, policy).
    pub const TOOL_REJECTED: &str = "tool.rejected";
    /// A runner answered and the action succeeded.
    pub const CALL_EXECUTED: &str = "call.executed";
    /// The action failed or the runner could not be reached.
    pub const CALL_FAILED: &str = "call.failed";
    pub(crate) const TOKEN_ISSUED: &str = "token.issued";
    pub(crate) const TOKEN_REVOKED: &str = "token.revoked";
    pub(crate) const SERVER_STARTED: &str = "server.started";
    /// A call that needs humans became a pending approval request.
    pub(crate) const APPROVAL_REQUESTED: &str = "approval.requested";
    /// One approver said yes (the detail says whether that settled it).
    pub(crate) const APPROVAL_APPROVED: &str = "approval.approved";
    pub(crate) const APPROVAL_DENIED: &str = "approval.denied";
    pub(crate) const APPROVAL_EXPIRED: &str = "approval.expired";
    /// The agent cancelled its call while the request was still pending.
    pub(crate) const APPROVAL_WITHDRAWN: &str = "approval.withdrawn";
    /// An approved request was claimed for execution; written before any runner is called.
    pub(crate) const APPROVAL_EXECUTING: &str = "approval.executing";
    /// A call that became a pending request was answered with an MCP task (SEP-2663); the
    /// detail names its owner. Cancelling the task withdraws the request
    /// (`approval.withdrawn`).
    pub(crate) const TASK_CREATED: &str = "task.created";
    /// A rollout wave of an approved request starts: the detail names the wave, how many
    /// there are, and its runners; written before any of them is called.
    pub(crate) const ROLLOUT_WAVE: &str = "rollout.wave";
    /// One runner's health gate after its write (the tool's `verify`): the detail says
    /// whether it passed, after how many tries, and what the runner saw (or why it failed).
    pub(crate) const ROLLOUT_GATE: &str = "rollout.gate";
    /// A rollout stopped: a write or a gate failed in one wave; the detail names the wave,
    /// the runner and why, and the runners of later waves that never ran.
    pub(crate) const ROLLOUT_HALTED: &str = "rollout.halted";
    /// A person proposed a decision on a halted rollout (resume, retry or abort): the detail
    /// has its id, choice, runners, how many people it needs, and the text they sign.
    pub(crate) const ROLLOUT_DECISION_PROPOSED: &str = "rollout.decision_proposed";
    /// One person voted for a rollout decision (with their signature over its text, where
    /// people sign); the detail says whether that carried it out.
    pub(crate) const ROLLOUT_DECIDED: &str = "rollout.decided";
    /// People signed the review of a break-glass window after the incident
    /// (`protocol/approval/review.rs`): the detail names the window (`grant`), and has the
    /// review's text, its signatures, who signed and the note. Until one is in the log, the
    /// window is listed as unreviewed (`server/break_glass.rs`).
    pub(crate) const BREAK_GLASS_REVIEWED: &str = "break_glass.reviewed";
    /// Execution was interrupted (a crash) and its outcome is not known; never re-run.
    pub(crate) const CALL_UNKNOWN: &str = "call.unknown";
    pub(crate) const POLICY_LOADED: &str = "policy.loaded";
    pub(crate) const USER_ADDED: &str = "user.added";
    pub(crate) const USER_REMOVED: &str = "user.removed";
    /// A person's role changed; their sessions ended and their API tokens were revoked.
    pub(crate) const USER_ROLE_CHANGED: &str = "user.role_changed";
    /// A person's password changed; their sessions ended.
    pub(crate) const USER_PASSWORD_CHANGED: &str = "user.password_changed";
    pub(crate) const LOGIN: &str = "login";
    pub(crate) const LOGIN_FAILED: &str = "login.failed";
    pub(crate) const LOGOUT: &str = "logout";
    /// The fleet's events (src/server/fleet/).
    pub const JOIN_TOKEN_ISSUED: &str = "join_token.issued";
    pub const JOIN_TOKEN_REVOKED: &str = "join_token.revoked";
    pub const RUNNER_JOINED: &str = "runner.joined";
    /// A join was refused; the detail says why. The token itself is never recorded.
    pub const RUNNER_JOIN_REFUSED: &str = "runner.join_refused";
    /// A runner that joined before came back with its own credential.
    pub const RUNNER_REGISTERED: &str = "runner.registered";
    pub const RUNNER_REMOVED: &str = "runner.removed";
    /// A person registered a passkey (`server/passkeys.rs`); the detail names the credential
    /// id, its algorithm and the SHA-256 of its public key.
    pub(crate) const PASSKEY_REGISTERED: &str = "passkey.registered";
    pub(crate) const PASSKEY_REMOVED: &str = "passkey.removed";
    /// A passkey signature whose signature counter did not grow past the last one seen from
    /// that credential was refused (a cloned authenticator; `server/passkeys.rs`); the detail
    /// names the credential, the person and both counters.
    pub(crate) const PASSKEY_SIGN_COUNT_REFUSED: &str = "passkey.sign_count_refused";
    /// The repeats of one caller's refusals of one kind and class in one window, counted
    /// instead of written one by one (`audit/refusals.rs`); the detail has the count, the
    /// first and last repeat, and the kind they would have been.
    pub(crate) const REFUSAL_REPEATED: &str = "refusal.repeated";
    /// A witness refused a checkpoint of this log (`audit/checkpoints.rs`): a split view, a
    /// tree that does not extend what it cosigned, or a bad signature; the detail names the
    /// witness, the size and its answer.
    pub(crate) const WITNESS_REFUSED: &str = "witness.refused";
    /// An agent asked for a grant (`emisar.request_grant`); the detail has its id (`grant`),
    /// the text people sign, how many must, and its expiry.
    pub(crate) const GRANT_REQUESTED: &str = "grant.requested";
    /// One person signed a grant; the detail names the grant, the person of the approvers
    /// file and the key.
    pub(crate) const GRANT_SIGNED: &str = "grant.signed";
    /// Enough people signed a grant: calls it admits run under it from now on.
    pub(crate) const GRANT_ACTIVE: &str = "grant.active";
    /// A call ran under a grant: the detail names the grant, which use it is, the call and
    /// its runners. Written with the call's `tool.called`, before any runner is called; a
    /// grant's uses are counted from these events.
    pub(crate) const GRANT_USED: &str = "grant.used";
    /// A person revoked a grant; the detail has why. Nothing more runs under it.
    pub(crate) const GRANT_REVOKED: &str = "grant.revoked";
    /// A runner acknowledged a grant's revocation (`POST /v1/grants/revoked`); the detail
    /// names the grant and after how many tries.
    pub(crate) const GRANT_REVOCATION_DELIVERED: &str = "grant.revocation_delivered";
    /// A grant reached its expiry while it was still requested or active.
    pub(crate) const GRANT_EXPIRED: &str = "grant.expired";
}

/// An event as a caller hands it to the writer. Its fields repeat those of the stored
/// [`Event`](crate::protocol::audit_event::Event) on purpose: `Event` is the wire type a runner
/// checks and adds what only the store assigns (`seq`, `id`, `at`, the hashes), while this
/// one is the server's to fill, and one shared inner struct would put a `.fields` in every
/// read of an event's kind or actor.
#[derive(Debug, Clone, Default, Serialize)]
pub struct NewEvent {
    /// Who: a caller's `ROLE:NAME` (`agent:`, `auditor:`, `approver:`, `admin:`), a provider
    /// person's `person:ID`, `user:NAME` (a failed local login), `runner:NAME`, `cli:USER`,
    /// or `system` / `system:WHAT`.
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

/// How an event's hash input was built, stored per row (`hash_v`).
pub mod hash_v {
    /// `args` and `detail` were stored as JSONB (PostgreSQL) or as serde_json text (SQLite)
    /// and are re-canonicalised from what is stored before hashing. Events written before the
    /// canonical text was stored, and by writers that do not set `hash_v`.
    pub const VALUE: i16 = 1;
    /// `args` and `detail` are stored as the canonical JSON text that was hashed, and hashed
    /// again exactly as stored.
    pub(crate) const TEXT: i16 = 2;
}

/// A sealed event and the text of its JSON columns, exactly as hashed and to be stored.
#[derive(Debug)]
pub struct Sealed {
    pub event: Event,
    pub args_text: Option<String>,
    pub detail_text: Option<String>,
}

impl Event {
    /// `new` as event number `seq` after `prev_hash`, carrying `hash` in the current format:
    /// the one place a caller's event becomes a stored one, for sealing and for handing the
    /// appended event back.
    pub(crate) fn from_new(
        new: NewEvent,
        seq: i64,
        id: String,
        at: String,
        prev_hash: String,
        hash: String,
    ) -> Event {
        Event {
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
            hash,
            hash_v: hash_v::TEXT,
        }
    }

    /// Seals `new` as event number `seq` after `prev_hash`, in the current format.
    pub fn seal(new: NewEvent, seq: i64, id: String, at: String, prev_hash: String) -> Sealed {
        let args_text = new.args.as_ref().map(canonical_json);
        let detail_text = new.detail.as_ref().map(canonical_json);
        let mut event = Event::from_new(new, seq, id, at, prev_hash, String::new());
        event.hash = hex::encode(
            event
                .text(args_text.as_deref(), detail_text.as_deref())
                .hash(&mut Vec::new()),
        );
        Sealed {
            event,
            args_text,
            detail_text,
        }
    }
}

/// The timestamp format of `at`: fixed width, so text order is time order.
pub fn format_at(t: chrono::DateTime<chrono::Utc>) -> String {
    let mut out = String::with_capacity(27);
    write_at(&mut out, t);
    out
}

/// Appends `at` as [`format_at`] writes it. Written digit by digit rather than through
/// chrono's `format` (which parses its pattern on every call) or `write!` (whose formatting
/// machinery was ~6 % of `audit verify`'s CPU): verify formats the `at` of every event it
/// reads, and PostgreSQL's `to_char` doing the same cost the database ~1.8 s of CPU per
/// 1,000,000 events.
pub(crate) fn write_at(out: &mut String, t: chrono::DateTime<chrono::Utc>) {
    use chrono::{Datelike, Timelike};
    let n = t.naive_utc();
    let (year, micros) = (n.year(), t.timestamp_subsec_micros());
    if !(0..=9999).contains(&year) || micros >= 1_000_000 {
        // Five-digit or negative years, and leap seconds: chrono's formatter, whose pattern
        // defined the format.
        use std::fmt::Write;
        write!(out, "{}", t.format("%Y-%m-%dT%H:%M:%S%.6fZ"))
            .expect("writing to a String cannot fail");
        return;
    }
    fn digits(out: &mut [u8], mut n: u32) {
        for d in out.iter_mut().rev() {
            *d = b'0' + (n % 10) as u8;
            n /= 10;
        }
    }
    let mut text = *b"0000-00-00T00:00:00.000000Z";
    digits(&mut text[0..4], year as u32);
    digits(&mut text[5..7], n.month());
    digits(&mut text[8..10], n.day());
    digits(&mut text[11..13], n.hour());
    digits(&mut text[14..16], n.minute());
    digits(&mut text[17..19], n.second());
    digits(&mut text[20..26], micros);
    out.push_str(std::str::from_utf8(&text).expect("ASCII digits"));
}

/// How many broken events (and warnings) a report lists; it counts them all.
pub const MAX_LISTED: usize = 20;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct BrokenLink {
    pub seq: i64,
    pub problem: String,
}

#[derive(Debug, Clone, Serialize, PartialEq, Default)]
pub struct VerifyReport {
    /// Events read and checked, broken ones included.
    pub checked: u64,
    pub first_seq: Option<i64>,
    pub last_seq: Option<i64>,
    /// How many events are broken: altered, out of sequence, not linked to their
    /// predecessor, or (format 2) stamped before their predecessor.
    pub broken_count: u64,
    /// The first [`MAX_LISTED`] broken events, in `seq` order.
    pub broken: Vec<BrokenLink>,
    /// How many events of format 1 have an `at` before their predecessor's. Not a break:
    /// before `at` was stamped under the append lock, replicas could interleave that way.
    pub warning_count: u64,
    /// The first [`MAX_LISTED`] of them.
    pub warnings: Vec<BrokenLink>,
}

impl VerifyReport {
    /// Nothing broken (warnings allowed).
    pub fn is_intact(&self) -> bool {
        self.broken_count == 0
    }
}

/// The event just before the first one a verifier is fed (`verify --since`).
#[derive(Debug, Clone)]
pub(crate) struct Anchor {
    pub seq: i64,
    pub hash: String,
    pub at: String,
}

/// One stored event as the verifier sees it: its links, its stored hash, and its event text
/// as built from the stored columns.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StoredEvent<'a> {
    pub seq: i64,
    pub at: &'a str,
    pub prev_hash: &'a str,
    pub hash: &'a str,
    pub hash_v: i16,
    pub text: &'a [u8],
}

/// Walks events in `seq` order and reports every broken one, not only the first: an auditor
/// needs to know whether one event was altered or everything after it, and a chain broken
/// once must not hide what follows.
#[derive(Debug)]
pub(crate) struct Verifier {
    report: VerifyReport,
    prev: Option<Anchor>,
    /// With `verify --checkpoint`: the Merkle tree's right edge, grown with the leaf of each
    /// event's recomputed hash up to a size (the newest checkpoint's, or a witness's).
    tree: Option<Growing>,
}

/// The tree a [`Verifier::growing`] grows, and the roots it passed on the way.
#[derive(Debug)]
pub(crate) struct Growing {
    pub(crate) tree: Frontier,
    upto: u64,
    /// The sizes whose root to keep, ascending; `next` is the first not reached yet.
    marks: Vec<u64>,
    next: usize,
    /// The root at each mark reached, in the order of `marks`.
    pub(crate) roots: Vec<(u64, Hash)>,
}

impl Growing {
    /// The root the tree had at `size`, if `size` was a mark it reached.
    pub(crate) fn root_at(&self, size: u64) -> Option<Hash> {
        self.roots.iter().find(|(s, _)| *s == size).map(|(_, r)| *r)
    }
}

impl Verifier {
    pub(crate) fn new(anchor: Option<Anchor>) -> Self {
        Verifier {
            report: VerifyReport::default(),
            prev: anchor,
            tree: None,
        }
    }

    /// A verifier that also grows `tree` (whose size is the anchor's seq) with every event up
    /// to seq `upto`, from the hash recomputed from the event's fields: the root then commits
    /// to what the events say, whatever hash is stored. The root at each size of `marks`
    /// (above the tree's size, up to `upto`) is kept on the way.
    pub(crate) fn growing(
        anchor: Option<Anchor>,
        tree: Frontier,
        upto: u64,
        marks: &[u64],
    ) -> Self {
        let mut marks: Vec<u64> = marks
            .iter()
            .copied()
            .filter(|&m| m > tree.size() && m <= upto)
            .collect();
        marks.sort_unstable();
        marks.dedup();
        Verifier {
            tree: Some(Growing {
                tree,
                upto,
                marks,
                next: 0,
                roots: Vec::new(),
            }),
            ..Verifier::new(anchor)
        }
    }

    /// Checks one event against its predecessor and its stored hash.
    pub(crate) fn feed(&mut self, e: StoredEvent<'_>) {
        let mut problems = Vec::new();
        match &self.prev {
            None => {
                if e.seq != 1 {
                    problems.push(format!("the log starts at seq {} instead of 1", e.seq));
                }
                if e.prev_hash != GENESIS_HASH {
                    problems.push("the first event does not point at the genesis hash".into());
                }
            }
            Some(prev) => {
                if e.seq != prev.seq + 1 {
                    problems.push(format!(
                        "seq {} follows seq {}: events are missing",
                        e.seq, prev.seq
                    ));
                }
                if e.prev_hash != prev.hash {
                    problems.push(format!(
                        "prev_hash {} does not match the hash of seq {} ({})",
                        e.prev_hash, prev.seq, prev.hash
                    ));
                }
                if e.at < prev.at.as_str() {
                    let what = format!(
                        "at {} is before the at of seq {} ({})",
                        e.at, prev.seq, prev.at
                    );
                    if e.hash_v >= hash_v::TEXT {
                        problems.push(format!("{what}: time went backwards along seq"));
                    } else {
                        self.report.warning_count += 1;
                        if self.report.warnings.len() < MAX_LISTED {
                            self.report.warnings.push(BrokenLink {
                                seq: e.seq,
                                problem: format!(
                                    "{what} (written before at was ordered along seq; \
                                     time-filtered searches near it may be inexact)"
                                ),
                            });
                        }
                    }
                }
            }
        }
        let expected: [u8; 32] = Sha256::digest(e.text).into();
        if let Some(g) = &mut self.tree
            && g.tree.size() < g.upto
            && e.seq as u64 == g.tree.size() + 1
        {
            g.tree.push(crate::tlog::tree::leaf_hash(&expected));
            if g.marks.get(g.next) == Some(&g.tree.size()) {
                g.roots.push((g.tree.size(), g.tree.root()));
                g.next += 1;
            }
        }
        let mut expected_hex = [0u8; 64];
        hex::encode_to_slice(expected, &mut expected_hex).expect("64 bytes hold 32 in hex");
        if e.hash.as_bytes() != expected_hex {
            problems.push(format!(
                "stored hash {} does not match its contents (expected {}): the event was altered",
                e.hash,
                String::from_utf8_lossy(&expected_hex)
            ));
        }
        if !problems.is_empty() {
            self.report.broken_count += 1;
            if self.report.broken.len() < MAX_LISTED {
                self.report.broken.push(BrokenLink {
                    seq: e.seq,
                    problem: problems.join("; "),
                });
            }
        }
        self.report.checked += 1;
        self.report.first_seq.get_or_insert(e.seq);
        self.report.last_seq = Some(e.seq);
        // The next event links to what is stored, so one altered event is reported once,
        // not again at every event after it.
        match &mut self.prev {
            Some(prev) => {
                prev.seq = e.seq;
                prev.hash.clear();
                prev.hash.push_str(e.hash);
                prev.at.clear();
                prev.at.push_str(e.at);
            }
            None => {
                self.prev = Some(Anchor {
                    seq: e.seq,
                    hash: e.hash.to_owned(),
                    at: e.at.to_owned(),
                })
            }
        }
    }

    pub(crate) fn finish(self) -> VerifyReport {
        self.report
    }

    /// The report, and the tree grown (see [`Verifier::growing`]).
    pub(crate) fn finish_growing(self) -> (VerifyReport, Option<Growing>) {
        (self.report, self.tree)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

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
                    format!("2026-11-30T00:00:{:02}.000000Z", seq % 60),
                    prev.clone(),
                )
                .event;
                prev = e.hash.clone();
                e
            })
            .collect()
    }

    fn verify(events: &[Event]) -> VerifyReport {
        let mut v = Verifier::new(None);
        let mut buf = Vec::new();
        for e in events {
            let args = e.args.as_ref().map(canonical_json);
            let detail = e.detail.as_ref().map(canonical_json);
            buf.clear();
            e.text(args.as_deref(), detail.as_deref()).write(&mut buf);
            v.feed(StoredEvent {
                seq: e.seq,
                at: &e.at,
                prev_hash: &e.prev_hash,
                hash: &e.hash,
                hash_v: e.hash_v,
                text: &buf,
            });
        }
        v.finish()
    }

    #[test]
    fn at_is_written_fixed_width_as_it_was_hashed() {
        // The format every stored `at` was hashed in (chrono's, before write_at) and the
        // one PostgreSQL's to_char gave verify; write_at must keep producing it byte for byte.
        for text in [
            "2026-12-02T01:02:03.000004Z",
            "2026-02-28T23:59:59.999999Z",
            "0999-01-01T00:00:00Z",
            "2026-06-30T12:00:00.5Z",
            "+12026-06-30T12:00:00Z",
            "-0001-06-30T12:00:00Z",
            "2016-12-31T23:59:60.25Z",
        ] {
            let t: chrono::DateTime<chrono::Utc> = text.parse().expect(text);
            assert_eq!(
                format_at(t),
                t.format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string(),
                "{text}"
            );
        }
    }

    proptest! {
        #[test]
        fn at_is_written_as_chrono_wrote_it_for_any_time(
            micros in -62_000_000_000_000_000i64..300_000_000_000_000_000i64
        ) {
            let t = chrono::DateTime::from_timestamp_micros(micros).expect("in chrono's range");
            prop_assert_eq!(format_at(t), t.format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string());
        }
    }

    fn broken_seqs(r: &VerifyReport) -> Vec<i64> {
        r.broken.iter().map(|b| b.seq).collect()
    }

    #[test]
    fn an_intact_chain_verifies() {
        let r = verify(&chain(5));
        assert_eq!(r.checked, 5);
        assert!(r.is_intact(), "{r:?}");
        assert_eq!((r.first_seq, r.last_seq), (Some(1), Some(5)));
    }

    #[test]
    fn tampering_is_found_at_the_right_event_and_every_break_is_reported() {
        let mut events = chain(5);
        events[2].reason = Some("edited".into());
        let r = verify(&events);
        assert_eq!(broken_seqs(&r), [3]);
        assert!(r.broken[0].problem.contains("was altered"));
        assert_eq!(r.checked, 5, "verification goes on past the break");

        let mut events = chain(5);
        events[1].reason = Some("edited".into());
        events[3].actor = "agent:b".into();
        let r = verify(&events);
        assert_eq!(broken_seqs(&r), [2, 4], "{r:?}");
        assert_eq!(r.broken_count, 2);

        let mut events = chain(5);
        events.remove(3);
        let r = verify(&events);
        assert_eq!(broken_seqs(&r), [5]);
        assert!(r.broken[0].problem.contains("missing"));

        // A resealed event has a valid hash of its own; its successor no longer links to it.
        let mut events = chain(5);
        let resealed = Event::seal(
            NewEvent::default(),
            2,
            "x".into(),
            events[1].at.clone(),
            events[0].hash.clone(),
        )
        .event;
        events[1] = resealed;
        assert_eq!(broken_seqs(&verify(&events)), [3]);
    }

    #[test]
    fn the_list_is_capped_but_the_count_is_not() {
        let mut events = chain(60);
        for e in &mut events {
            e.reason = Some("edited".into());
        }
        let r = verify(&events);
        assert_eq!(r.broken_count, 60);
        assert_eq!(r.broken.len(), MAX_LISTED);
        assert_eq!(r.broken[0].seq, 1);
    }

    #[test]
    fn time_going_backwards_is_a_break_in_the_current_format_and_a_warning_before_it() {
        let mut prev = GENESIS_HASH.to_owned();
        let mut events = Vec::new();
        for (seq, at) in [
            (1, "2026-11-30T00:00:02.000000Z"),
            (2, "2026-11-30T00:00:01.000000Z"),
        ] {
            let e = Event::seal(
                NewEvent::default(),
                seq,
                format!("id-{seq}"),
                at.into(),
                prev.clone(),
            )
            .event;
            prev = e.hash.clone();
            events.push(e);
        }
        let r = verify(&events);
        assert_eq!(broken_seqs(&r), [2]);
        assert!(r.broken[0].problem.contains("time went backwards"), "{r:?}");

        // The same two events, as rows of the older format: a warning, not a break.
        for e in &mut events {
            e.hash_v = hash_v::VALUE;
        }
        let r = verify(&events);
        assert!(r.is_intact(), "{r:?}");
        assert_eq!(r.warning_count, 1);
        assert_eq!(r.warnings[0].seq, 2);
    }

    #[test]
    fn the_direct_text_of_a_known_event_is_its_canonical_json() {
        let e = chain(1).remove(0);
        let mut buf = Vec::new();
        let args = canonical_json(e.args.as_ref().unwrap());
        e.text(Some(&args), None).write(&mut buf);
        assert_eq!(
            String::from_utf8(buf).unwrap(),
            format!(
                r#"{{"actor":"agent:a","approval_id":null,"args":{{"a":[1],"b":1}},"at":"2026-11-30T00:00:01.000000Z","call_id":null,"detail":null,"id":"id-1","kind":"tool.called","outcome":null,"prev_hash":"{GENESIS_HASH}","reason":null,"result_digest":null,"runner":null,"seq":1,"tool":null}}"#
            )
        );
    }

    /// Arbitrary JSON, including what databases tend to rewrite: -0.0, integers and floats
    /// at the edges of their types, long fractions, NUL and other control characters,
    /// non-ASCII text, and nesting.
    fn arb_json() -> impl Strategy<Value = Value> {
        let float = |f: f64| Value::Number(serde_json::Number::from_f64(f).expect("finite"));
        let tricky = prop::sample::select(vec![
            -0.0,
            0.1 + 0.2,
            1e300,
            5e-324,
            f64::MAX,
            1e29,
            1e21,
            1e-7,
            9_007_199_254_740_993.0,
        ])
        .prop_map(float);
        let string = prop_oneof![
            any::<String>(),
            prop::sample::select(vec![
                "\u{0}",
                "a\u{0}b",
                "\"\\",
                "\u{1}\u{7f}",
                "\u{2028}",
                "😀"
            ])
            .prop_map(str::to_owned),
        ];
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>().prop_filter_map("finite", |f| serde_json::Number::from_f64(f)
                .map(Value::Number)),
            tricky,
            string.clone().prop_map(Value::String),
        ];
        leaf.prop_recursive(10, 96, 6, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map(string.clone(), inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn opt_string() -> impl Strategy<Value = Option<String>> {
        prop::option::of(any::<String>())
    }

    proptest! {
        /// The direct writer gives byte for byte what `canonical_json` of the whole event as
        /// one `json!` object gives (the format events were always hashed in), for every
        /// event: so the hashes of events written before it are unchanged.
        #[test]
        fn the_direct_text_is_the_canonical_json_of_the_event(
            seq in any::<i64>(),
            strings in prop::collection::vec(any::<String>(), 5),
            opts in prop::collection::vec(opt_string(), 7),
            args in prop::option::of(arb_json()),
            detail in prop::option::of(arb_json()),
        ) {
            let e = Event {
                seq,
                id: strings[0].clone(),
                at: strings[1].clone(),
                actor: strings[2].clone(),
                kind: strings[3].clone(),
                tool: opts[0].clone(),
                runner: opts[1].clone(),
                args,
                reason: opts[2].clone(),
                call_id: opts[3].clone(),
                approval_id: opts[4].clone(),
                outcome: opts[5].clone(),
                result_digest: opts[6].clone(),
                detail,
                prev_hash: strings[4].clone(),
                hash: String::new(),
                hash_v: hash_v::TEXT,
            };
            let whole = serde_json::json!({
                "seq": e.seq,
                "id": e.id,
                "at": e.at,
                "actor": e.actor,
                "kind": e.kind,
                "tool": e.tool,
                "runner": e.runner,
                "args": e.args,
                "reason": e.reason,
                "call_id": e.call_id,
                "approval_id": e.approval_id,
                "outcome": e.outcome,
                "result_digest": e.result_digest,
                "detail": e.detail,
                "prev_hash": e.prev_hash,
            });
            let args = e.args.as_ref().map(canonical_json);
            let detail = e.detail.as_ref().map(canonical_json);
            let mut direct = Vec::new();
            e.text(args.as_deref(), detail.as_deref()).write(&mut direct);
            prop_assert_eq!(String::from_utf8(direct).unwrap(), canonical_json(&whole));
        }
    }
}
