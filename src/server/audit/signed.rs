//! `emisar audit verify-approvals`: every executed approval re-verified offline against its
//! people's signatures and an approvers file, from the audit log alone.
//!
//! For each `approval.executing` event, the `approval.approved` events of the same approval
//! must carry one statement (naming that approval and tool) and signatures over it that verify
//! with the file, by distinct people, at least as many as the file's rule for the tool. For
//! each rollout decision carried out (the `rollout.decided` event whose `state` is
//! `executing`), its `rollout.decided` votes must carry one decision text about that approval
//! and its statement, with signatures over it by enough distinct people in the same way. A
//! failure names the event (seq and id) and the rule it broke. An approval claimed twice (a
//! second `approval.executing`: the store was set back to `approved`) fails at the second, and
//! each approval counts once. The statement people signed must also be the one the request was
//! made with: its SHA-256 and its `required` those of the approval's first
//! `approval.requested` (a store edited before anyone signed fails there). Pure: the caller reads the events; the tests below give each
//! check a case only it catches.

use std::collections::BTreeMap;

use serde::Serialize;

use super::chain::Event;
use super::kind;
use crate::digest::sha256_hex;
use crate::protocol::approval::{Approvers, Decision, Signature, Statement, verify_quorum};

#[derive(Debug, Default, Serialize)]
pub struct Report {
    /// Executed approvals whose signatures held.
    pub verified: u64,
    /// Rollout decisions carried out (a resume or a retry) whose signatures held.
    pub decisions_verified: u64,
    pub failures: Vec<Failure>,
    /// Executed approvals the caller set aside (before `--from-seq`): neither verified nor
    /// failed.
    pub not_checked: u64,
}

#[derive(Debug, Serialize)]
pub struct Failure {
    pub approval_id: String,
    pub seq: i64,
    pub event_id: String,
    pub why: String,
}

/// Checks every executed approval among `events` (any order) against `approvers`.
pub fn verify(events: &[Event], approvers: &Approvers) -> Report {
    let mut approved: BTreeMap<&str, Vec<&Event>> = BTreeMap::new();
    let mut requested: BTreeMap<&str, &Event> = BTreeMap::new();
    let mut executing: Vec<&Event> = Vec::new();
    let mut decided: BTreeMap<(&str, &str), Vec<&Event>> = BTreeMap::new();
    let mut carried_out: Vec<&Event> = Vec::new();
    for e in events {
        let Some(id) = e.approval_id.as_deref() else {
            continue;
        };
        match e.kind.as_str() {
            kind::APPROVAL_APPROVED => approved.entry(id).or_default().push(e),
            kind::APPROVAL_REQUESTED => {
                let first = requested.entry(id).or_insert(e);
                if e.seq < first.seq {
                    *first = e;
                }
            }
            kind::APPROVAL_EXECUTING => executing.push(e),
            kind::ROLLOUT_DECIDED => {
                let detail = e.detail.as_ref();
                let decision = detail
                    .and_then(|d| d.get("decision_id"))
                    .and_then(|d| d.as_str())
                    .unwrap_or_default();
                decided.entry((id, decision)).or_default().push(e);
                if detail.and_then(|d| d.get("state")).and_then(|s| s.as_str()) == Some("executing")
                {
                    carried_out.push(e);
                }
            }
            _ => {}
        }
    }
    let mut report = Report::default();
    let mut fail = |id: &str, (event, why): (&Event, String)| {
        report.failures.push(Failure {
            approval_id: id.to_owned(),
            seq: event.seq,
            event_id: event.id.clone(),
            why,
        });
    };
    let mut verified = 0;
    let mut decisions_verified = 0;
    executing.sort_by_key(|e| e.seq);
    let mut claimed: BTreeMap<&str, i64> = BTreeMap::new();
    for exec in executing {
        let id = exec.approval_id.as_deref().unwrap_or_default();
        if let Some(first) = claimed.insert(id, exec.seq) {
            let why = format!(
                "a second `approval.executing` (the first is seq {first}): an approval is claimed once, and only a rollout decision (`rollout.decided`) runs it again"
            );
            fail(id, (exec, why));
            continue;
        }
        let votes = approved.get(id).map(Vec::as_slice).unwrap_or_default();
        let checked = check(id, exec, votes, approvers)
            .and_then(|text| as_requested(exec, text, requested.get(id).copied()));
        match checked {
            Ok(()) => verified += 1,
            Err(failed) => fail(id, failed),
        }
    }
    for last in carried_out {
        let id = last.approval_id.as_deref().unwrap_or_default();
        let decision = last
            .detail
            .as_ref()
            .and_then(|d| d.get("decision_id"))
            .and_then(|d| d.as_str())
            .unwrap_or_default();
        let votes = approved.get(id).map(Vec::as_slice).unwrap_or_default();
        let statement = match check(id, last, votes, approvers) {
            Ok(text) => text,
            Err(failed) => {
                fail(id, failed);
                continue;
            }
        };
        let decision_votes = decided
            .get(&(id, decision))
            .map(Vec::as_slice)
            .unwrap_or_default();
        match check_decision(id, last, statement, decision_votes, approvers) {
            Ok(()) => decisions_verified += 1,
            Err(failed) => fail(id, failed),
        }
    }
    report.verified = verified;
    report.decisions_verified = decisions_verified;
    report
}

/// A rollout decision carried out by `last` (the vote that made it enough): every vote for it
/// carries one decision text, about approval `id` and its `statement`, and a signature over
/// it; together they make the file's quorum for the tool and the statement's own count.
fn check_decision<'a>(
    id: &str,
    last: &'a Event,
    statement: &str,
    votes: &[&'a Event],
    approvers: &Approvers,
) -> Result<(), (&'a Event, String)> {
    let tool = last.tool.as_deref().unwrap_or_default();
    let mut text: Option<&str> = None;
    let mut signatures = Vec::new();
    for vote in votes {
        let detail = vote.detail.as_ref();
        let (Some(t), Some(sig)) = (
            detail.and_then(|d| d.get("text")).and_then(|s| s.as_str()),
            detail.and_then(|d| d.get("signature")),
        ) else {
            return Err((
                *vote,
                "a rollout decision's vote without a signature".into(),
            ));
        };
        if text.is_some_and(|first| first != t) {
            return Err((
                *vote,
                "signed another decision text than the first vote".into(),
            ));
        }
        text = Some(t);
        let d = Decision::parse(t).map_err(|e| (*vote, e.to_string()))?;
        if d.approval_id != id || d.statement_sha256 != sha256_hex(statement.as_bytes()) {
            return Err((
                *vote,
                "the decision is about another approval or statement than the one signed".into(),
            ));
        }
        let sig: Signature = serde_json::from_value(sig.clone())
            .map_err(|e| (*vote, format!("an unreadable signature: {e}")))?;
        crate::protocol::approval::verify_signature(approvers, t, &sig).map_err(|e| (*vote, e))?;
        signatures.push(sig);
    }
    let text = text.ok_or_else(|| (last, "a decision carried out with no vote".to_owned()))?;
    let required = Statement::parse(statement)
        .map_err(|e| (last, e.to_string()))?
        .required;
    verify_quorum(approvers, tool, text, &signatures, required)
        .map_err(|e| (last, format!("the rollout decision: {e}")))?;
    Ok(())
}

/// The statement people signed is the one the request was made with: the SHA-256 and the
/// count of people its `approval.requested` recorded (an event from before the digest was
/// recorded is held to its count alone; one with neither fails).
fn as_requested<'a>(
    exec: &'a Event,
    text: &str,
    requested: Option<&Event>,
) -> Result<(), (&'a Event, String)> {
    let detail = requested.and_then(|e| e.detail.as_ref()).ok_or_else(|| {
        (
            exec,
            "executed with no `approval.requested` event in the log".to_owned(),
        )
    })?;
    if let Some(asked) = detail.get("statement_sha256").and_then(|d| d.as_str())
        && asked != sha256_hex(text.as_bytes())
    {
        return Err((
            exec,
            format!(
                "people signed a statement (sha256:{}) other than the one the request was made with (sha256:{asked}): the store was changed before they signed",
                sha256_hex(text.as_bytes())
            ),
        ));
    }
    let required = Statement::parse(text)
        .map_err(|e| (exec, e.to_string()))?
        .required;
    match detail.get("required_approvals").and_then(|r| r.as_u64()) {
        Some(asked) if asked == u64::from(required) => Ok(()),
        Some(asked) => Err((
            exec,
            format!(
                "the signed statement says `required {required}`, and the request was made for {asked} people: the store was changed before they signed"
            ),
        )),
        None => Err((
            exec,
            "its `approval.requested` names no count of people".to_owned(),
        )),
    }
}

/// The approval `id` executed by `exec`: its votes carry one statement and enough signatures
/// over it. Returns the statement's text.
fn check<'a>(
    id: &str,
    exec: &'a Event,
    votes: &[&'a Event],
    approvers: &Approvers,
) -> Result<&'a str, (&'a Event, String)> {
    let tool = exec.tool.as_deref().unwrap_or_default();
    if votes.is_empty() {
        return Err((exec, "executed with no approval.approved event".into()));
    }
    let mut statement: Option<&str> = None;
    let mut signatures: Vec<Signature> = Vec::new();
    for vote in votes {
        let detail = vote.detail.as_ref();
        let (Some(text), Some(sig)) = (
            detail
                .and_then(|d| d.get("statement"))
                .and_then(|s| s.as_str()),
            detail.and_then(|d| d.get("signature")),
        ) else {
            return Err((*vote, "an approval without a signature".into()));
        };
        match statement {
            None => statement = Some(text),
            Some(first) if first != text => {
                return Err((
                    *vote,
                    "signed another statement than the first approval".into(),
                ));
            }
            Some(_) => {}
        }
        let parsed = Statement::parse(text).map_err(|e| (*vote, e.to_string()))?;
        if parsed.approval_id != id || parsed.tool != tool {
            return Err((
                *vote,
                format!(
                    "the statement names approval {} and tool `{}`, not this event's",
                    parsed.approval_id, parsed.tool
                ),
            ));
        }
        let sig: Signature = serde_json::from_value(sig.clone())
            .map_err(|e| (*vote, format!("an unreadable signature: {e}")))?;
        // Each vote's own signature first, so a failure names the event that carries it.
        crate::protocol::approval::verify_signature(approvers, text, &sig)
            .map_err(|e| (*vote, e))?;
        signatures.push(sig);
    }
    let text = statement.expect("at least one vote");
    // The statement's own `required` holds as it does on the runner.
    let required = Statement::parse(text)
        .map_err(|e| (exec, e.to_string()))?
        .required;
    verify_quorum(approvers, tool, text, &signatures, required).map_err(|e| (exec, e))?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::protocol::approval::approvers::tests::file_with;
    use crate::protocol::approval::sshsig::{self, tests::sign, tests::test_key};

    const TOOL: &str = "linux.systemctl_restart";

    /// alice holds keys 1 and 3, bob key 2; every tool needs two people.
    fn approvers() -> Approvers {
        let mut text = file_with(
            &[("alice", 1), ("bob", 2)],
            "[[rule]]\ntools = \"*\"\napprovals = 2\n",
        );
        let second = test_key(3).public_key().to_openssh().unwrap();
        text = text.replacen("\"]\n", &format!("\", \"{second}\"]\n"), 1);
        Approvers::parse(&text).unwrap()
    }

    fn statement(approval_id: &str, tool: &str) -> String {
        Statement {
            approval_id: approval_id.into(),
            tool: tool.into(),
            pack_sha256: "1".repeat(64),
            args_sha256: "2".repeat(64),
            runners: [("hvn05".to_owned(), None)].into(),
            plan: crate::protocol::approval::Plan::one_wave([&"hvn05".to_owned()]),
            required: 2,
            policy_sha256: "3".repeat(64),
            requester: "agent:bot".into(),
            expires_at: "2026-11-30T10:15:00Z".into(),
        }
        .text()
        .unwrap()
    }

    fn event(seq: i64, kind: &str, approval_id: &str, detail: Option<serde_json::Value>) -> Event {
        Event {
            seq,
            id: format!("e{seq}"),
            at: "2026-11-30T10:05:00.000000Z".into(),
            actor: "x".into(),
            kind: kind.into(),
            tool: Some(TOOL.into()),
            runner: None,
            args: None,
            reason: None,
            call_id: None,
            approval_id: Some(approval_id.into()),
            outcome: None,
            result_digest: None,
            detail,
            prev_hash: String::new(),
            hash: String::new(),
            hash_v: 2,
        }
    }

    /// An `approval.approved` event carrying key `seed`'s signature over `text`.
    fn vote(seq: i64, approval_id: &str, text: &str, seed: u8) -> Event {
        let signature = Signature::Ssh {
            signer: format!("key{seed}"),
            signature: sign(&test_key(seed), sshsig::APPROVAL_NAMESPACE, text.as_bytes()),
        };
        event(
            seq,
            kind::APPROVAL_APPROVED,
            approval_id,
            Some(json!({"statement": text, "signature": signature})),
        )
    }

    fn executing(seq: i64, approval_id: &str) -> Event {
        event(seq, kind::APPROVAL_EXECUTING, approval_id, None)
    }

    /// `verify` of `events` with, for each approval a vote carries a statement for, the
    /// `approval.requested` the server recorded for that statement (seq 0).
    fn checked(events: &[Event]) -> Report {
        let mut all: Vec<Event> = Vec::new();
        for e in events {
            let id = e.approval_id.clone().unwrap_or_default();
            let text = e.detail.as_ref().and_then(|d| d["statement"].as_str());
            if let Some(text) = text
                && !all.iter().any(|r| {
                    r.kind == kind::APPROVAL_REQUESTED && r.approval_id.as_deref() == Some(&id)
                })
            {
                all.push(requested(0, &id, text));
            }
        }
        all.extend(events.iter().cloned());
        verify(&all, &approvers())
    }

    /// The `approval.requested` of a request made with statement `text`.
    fn requested(seq: i64, approval_id: &str, text: &str) -> Event {
        let required = Statement::parse(text).unwrap().required;
        event(
            seq,
            kind::APPROVAL_REQUESTED,
            approval_id,
            Some(
                json!({"required_approvals": required, "statement_sha256": sha256_hex(text.as_bytes())}),
            ),
        )
    }

    /// Red team 3, B0: people signed a statement the store changed before they signed (its
    /// count of people lowered), or one with no request in the log: both fail at the claim.
    #[test]
    fn a_statement_other_than_the_requests_fails() {
        let asked = statement("a1", TOOL);
        let lowered = asked.replace("\nrequired 2\n", "\nrequired 1\n");
        assert_ne!(asked, lowered);
        let signed = |text: &str| {
            vec![
                vote(1, "a1", text, 1),
                vote(2, "a1", text, 2),
                executing(3, "a1"),
            ]
        };
        let mut events = vec![requested(0, "a1", &asked)];
        events.extend(signed(&lowered));
        let report = verify(&events, &approvers());
        let [f] = &report.failures[..] else {
            panic!("one failure: {report:?}");
        };
        assert_eq!(f.seq, 3);
        assert!(
            f.why
                .contains("other than the one the request was made with"),
            "{}",
            f.why
        );
        // A request event from before the digest: held to its count of people.
        let mut old = requested(0, "a1", &asked);
        old.detail = Some(json!({"required_approvals": 3}));
        let mut events = vec![old];
        events.extend(signed(&asked));
        let report = verify(&events, &approvers());
        assert!(
            report.failures[0].why.contains("made for 3 people"),
            "{report:?}"
        );
        let report = verify(&signed(&asked), &approvers());
        assert!(
            report.failures[0].why.contains("no `approval.requested`"),
            "{report:?}"
        );
    }

    /// The one failure of `events`: its event's seq and why.
    fn failure(events: &[Event]) -> (i64, String) {
        let report = checked(events);
        assert_eq!(report.verified, 0, "{report:?}");
        let [f] = &report.failures[..] else {
            panic!("one failure: {report:?}");
        };
        (f.seq, f.why.clone())
    }

    #[test]
    fn two_people_over_the_executed_statement_verify() {
        let text = statement("a1", TOOL);
        let report = checked(&[
            vote(1, "a1", &text, 1),
            vote(2, "a1", &text, 2),
            executing(3, "a1"),
        ]);
        assert_eq!(report.verified, 1, "{report:?}");
        assert!(report.failures.is_empty(), "{report:?}");
    }

    /// An approval claimed a second time (its row set back to `approved` in the store, and a
    /// server that ran it again) fails at the second claim, and counts once.
    #[test]
    fn an_approval_claimed_twice_fails_at_the_second_claim() {
        let text = statement("a1", TOOL);
        let report = checked(&[
            vote(1, "a1", &text, 1),
            vote(2, "a1", &text, 2),
            executing(7, "a1"),
            executing(3, "a1"),
        ]);
        assert_eq!(report.verified, 1, "{report:?}");
        let [failure] = &report.failures[..] else {
            panic!("one failure: {report:?}");
        };
        assert_eq!(failure.seq, 7);
        assert!(
            failure.why.contains("the first is seq 3"),
            "{}",
            failure.why
        );
    }

    /// The quorum (`verify_quorum`): every vote's signature verifies, yet the execution had
    /// fewer people than the file's rule, or one person twice. Named at the execution.
    #[test]
    fn an_execution_short_of_the_files_quorum_is_named() {
        let text = statement("a1", TOOL);
        let (seq, why) = failure(&[vote(1, "a1", &text, 1), executing(2, "a1")]);
        assert_eq!(seq, 2, "{why}");
        assert!(why.contains("needs 2 people's signatures"), "{why}");
        // Alice's two keys are one person.
        let (seq, why) = failure(&[
            vote(1, "a1", &text, 1),
            vote(2, "a1", &text, 3),
            executing(3, "a1"),
        ]);
        assert_eq!(seq, 3, "{why}");
        assert!(why.contains("count once"), "{why}");
    }

    /// The votes of one approval must all sign one statement: a vote over another text is
    /// named, as the vote that broke it.
    #[test]
    fn a_vote_over_another_statement_than_the_first_is_named() {
        let text = statement("a1", TOOL);
        let mut other = Statement::parse(&text).unwrap();
        other.args_sha256 = "9".repeat(64);
        let other = other.text().unwrap();
        let (seq, why) = failure(&[
            vote(1, "a1", &text, 1),
            vote(2, "a1", &other, 2),
            executing(3, "a1"),
        ]);
        assert_eq!(seq, 2, "{why}");
        assert_eq!(why, "signed another statement than the first approval");
    }

    /// Signatures people really made, over a statement for another approval or another tool,
    /// do not vouch for this execution: named at the vote.
    #[test]
    fn a_statement_for_another_approval_or_tool_is_named() {
        for (approval_id, tool) in [("a2", TOOL), ("a1", "nomad.job_scale")] {
            let text = statement(approval_id, tool);
            let (seq, why) = failure(&[
                vote(1, "a1", &text, 1),
                vote(2, "a1", &text, 2),
                executing(3, "a1"),
            ]);
            assert_eq!(seq, 1, "{why}");
            assert_eq!(
                why,
                format!(
                    "the statement names approval {approval_id} and tool `{tool}`, not this event's"
                )
            );
        }
    }

    /// A `rollout.decided` vote by key `seed` over decision `text`; `state` after it.
    fn decided(seq: i64, approval_id: &str, text: &str, seed: u8, state: &str) -> Event {
        let signature = Signature::Ssh {
            signer: format!("key{seed}"),
            signature: sign(&test_key(seed), sshsig::APPROVAL_NAMESPACE, text.as_bytes()),
        };
        event(
            seq,
            kind::ROLLOUT_DECIDED,
            approval_id,
            Some(
                json!({"decision_id": "d1", "state": state, "text": text, "signature": signature}),
            ),
        )
    }

    fn decision(approval_id: &str, statement: &str) -> String {
        crate::protocol::approval::Decision {
            id: "d1".into(),
            approval_id: approval_id.into(),
            statement_sha256: sha256_hex(statement.as_bytes()),
            halted_wave: 1,
            choice: crate::protocol::approval::Choice::Retry,
            runners: vec!["hvn05".into()],
            expires_at: "2026-11-30T10:30:00Z".into(),
        }
        .text()
        .unwrap()
    }

    #[test]
    fn a_rollout_decision_carried_out_is_verified_like_its_approval() {
        let text = statement("a1", TOOL);
        let d = decision("a1", &text);
        let approval = [
            vote(1, "a1", &text, 1),
            vote(2, "a1", &text, 2),
            executing(3, "a1"),
        ];
        let with = |decided: &[Event]| {
            let events: Vec<Event> = approval
                .iter()
                .cloned()
                .chain(decided.iter().cloned())
                .collect();
            checked(&events)
        };
        let report = with(&[
            decided(4, "a1", &d, 1, "halted"),
            decided(5, "a1", &d, 2, "executing"),
        ]);
        assert_eq!(
            (report.verified, report.decisions_verified),
            (1, 1),
            "{report:?}"
        );
        assert!(report.failures.is_empty(), "{report:?}");
        // One person's decision where two are needed: named at the vote that carried it out.
        let report = with(&[decided(4, "a1", &d, 1, "executing")]);
        assert_eq!(report.failures.len(), 1, "{report:?}");
        assert_eq!(report.failures[0].seq, 4);
        assert!(report.failures[0].why.contains("needs 2"), "{report:?}");
        // One person with two keys counts once.
        let report = with(&[
            decided(4, "a1", &d, 1, "halted"),
            decided(5, "a1", &d, 3, "executing"),
        ]);
        assert!(report.failures[0].why.contains("count once"), "{report:?}");
        // A decision about another statement than the one people signed.
        let other = decision("a1", "another statement\n");
        let report = with(&[
            decided(4, "a1", &other, 1, "halted"),
            decided(5, "a1", &other, 2, "executing"),
        ]);
        assert!(
            report.failures[0]
                .why
                .contains("another approval or statement"),
            "{report:?}"
        );
        // Two votes over different texts.
        let report = with(&[
            decided(4, "a1", &d, 1, "halted"),
            decided(5, "a1", &d.replace("retry", "resume"), 2, "executing"),
        ]);
        assert!(
            report.failures[0].why.contains("another decision text"),
            "{report:?}"
        );
    }
}
