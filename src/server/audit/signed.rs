//! `emisar audit verify-approvals`: every executed approval re-verified offline against its
//! people's signatures and an approvers file, from the audit log alone.
//!
//! For each `approval.executing` event, the `approval.approved` events of the same approval
//! must carry one statement (naming that approval and tool) and signatures over it that verify
//! with the file, by distinct people, at least as many as the file's rule for the tool. A
//! failure names the event (seq and id) and the rule it broke. Pure: the caller reads the
//! events.

use std::collections::BTreeMap;

use serde::Serialize;

use super::chain::Event;
use super::kind;
use crate::protocol::approval::{Approvers, Signature, Statement, verify_quorum};

#[derive(Debug, Default, Serialize)]
pub struct Report {
    /// Executed approvals whose signatures held.
    pub verified: u64,
    pub failures: Vec<Failure>,
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
    let mut executing: Vec<&Event> = Vec::new();
    for e in events {
        let Some(id) = e.approval_id.as_deref() else {
            continue;
        };
        match e.kind.as_str() {
            kind::APPROVAL_APPROVED => approved.entry(id).or_default().push(e),
            kind::APPROVAL_EXECUTING => executing.push(e),
            _ => {}
        }
    }
    let mut report = Report::default();
    for exec in executing {
        let id = exec.approval_id.as_deref().unwrap_or_default();
        let votes = approved.get(id).map(Vec::as_slice).unwrap_or_default();
        match check(id, exec, votes, approvers) {
            Ok(()) => report.verified += 1,
            Err((event, why)) => report.failures.push(Failure {
                approval_id: id.to_owned(),
                seq: event.seq,
                event_id: event.id.clone(),
                why,
            }),
        }
    }
    report
}

fn check<'a>(
    id: &str,
    exec: &'a Event,
    votes: &[&'a Event],
    approvers: &Approvers,
) -> Result<(), (&'a Event, String)> {
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
    Ok(())
}
