//! A person's decision, and the execution of an approved request: claimed once across
//! replicas (`approved` → `executing`), run with the args, runners and preview values stored
//! at request time, its outcome recorded; an approval that did not start in time is expired.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use super::super::dispatch::AuditedCall;
use super::super::outcome::{CallOutcome, RunnerResult};
use super::super::state::Gateway;
use super::rollout::{Prepared, ROLLOUT_ACTOR, Rolled};
use crate::protocol::approval::{Choice, DecisionProof, Statement};
use crate::protocol::audit_event::Event;
use crate::server::approvals::{self, Actor, Approval, ApprovalError, Lock, State, Verdict};
use crate::server::audit::{AuditFilter, format_at, kind};
use crate::server::principal::Principal;

impl Gateway {
    /// A person's decision on a pending request. The decision that approves it also claims
    /// it (`approval.executing`) in the same transition, so this replica runs it: the two
    /// events share one audit commit and the row one commit, where a separate claim took
    /// two more, in sequence, between the click and the runner call.
    pub async fn decide(
        self: &Arc<Self>,
        who: &Principal,
        id: &str,
        verdict: Verdict,
    ) -> Result<Approval, ApprovalError> {
        let policy = self.policy();
        self.check_sign_count(who, id, &verdict, |r, v| self.verify_vote(r, v))
            .await?;
        let row = self
            .approvals
            .transition(id, Lock::Wait, |r| {
                // The tool comes from the locked row: no second read to learn it.
                let actor = Actor {
                    name: who.name.clone(),
                    actor: who.actor(),
                    // A person from the provider may hold several roles; any one that may
                    // approve this tool is enough.
                    may_approve: who
                        .roles
                        .iter()
                        .any(|role| policy.may_approve(*role, &r.tool)),
                };
                let now = chrono::Utc::now();
                let verdict = self.verify_vote(r, &verdict)?;
                let mut decided = approvals::decide(r, &actor, &verdict, now)?;
                // Every vote's event names exactly the call it approves, for the runners
                // that hold a witnessed approval to it.
                let binding = self.binding(r).map_err(ApprovalError::Refused)?;
                for event in &mut decided.events {
                    if event.kind == kind::APPROVAL_APPROVED
                        && let Some(detail) = event.detail.as_mut()
                    {
                        detail["binding"] = json!(binding);
                    }
                }
                if decided.row.state != State::Approved {
                    return Ok(decided);
                }
                let claim = claim(&decided.row, now)?;
                Ok(decided.then(claim))
            })
            .await?
            .expect("a transition that waits for the lock always returns the row");
        if row.state == State::Executing {
            let me = self.clone();
            let claimed = row.clone();
            tokio::spawn(async move { me.run_claimed(claimed).await });
        }
        Ok(row)
    }

    /// Claims an approved request nobody claimed (exactly once across replicas: the sweep
    /// finds it when the replica that approved it stopped before its claim committed), then
    /// runs it.
    pub(crate) async fn execute_approved(&self, id: &str) {
        let start_within = self.limits.approved_start_within;
        // The row is the store's, which an insider with the database may rewrite (an aborted
        // or halted request set back to `approved`, a later `updated_at`); the log is
        // append-only and witnessed. The window runs from the earlier of the two times.
        let settled = match self.approved_in_log(id).await {
            Ok(at) => at,
            Err(why) => {
                tracing::error!(approval_id = %id, why = %why, "an approved request the audit log does not back is not run");
                self.expire_approved_if(id, |_| Some(why.clone())).await;
                return;
            }
        };
        if settled
            + chrono::Duration::from_std(start_within).unwrap_or(chrono::Duration::minutes(5))
            <= chrono::Utc::now()
        {
            let why = format!(
                "its approval is in the audit log at {}, more than {} s ago",
                format_at(settled),
                start_within.as_secs()
            );
            self.expire_approved_if(id, |_| Some(why.clone())).await;
            return;
        }
        let claimed = self
            .approvals
            .transition(id, Lock::SkipLocked, |r| {
                if r.state == State::Approved
                    && too_late_to_start(r, start_within, chrono::Utc::now())
                {
                    // Left for the sweeper, which expires it and says why.
                    return Err(ApprovalError::WrongState {
                        state: r.state,
                        wanted: "approved recently enough to start",
                    });
                }
                claim(r, chrono::Utc::now())
            })
            .await;
        match claimed {
            Ok(Some(row)) => self.run_claimed(row).await,
            // Another replica holds it, or it moved on already: not ours to run.
            Ok(None) | Err(ApprovalError::WrongState { .. }) => {}
            Err(e) => {
                tracing::error!(error = %e, approval_id = %id, "could not claim an approved request");
            }
        }
    }

    /// Runs a request this replica claimed (`executing`): rolls it out on its runners with
    /// the approval id and the preview's vars, and records the outcome: `executed`, `failed`
    /// (a write or the last wave's gate failed) or `halted` (runners of later waves never ran).
    pub(super) async fn run_claimed(&self, row: Approval) {
        let id = &row.id;
        let started = Instant::now();
        let rolled = self.run_approved(&row).await;
        let state = match (&rolled.stopped, &rolled.halt) {
            (None, _) => State::Executed,
            (Some(_), None) => State::Failed,
            (Some(_), Some(_)) => State::Halted,
        };
        let ok = state == State::Executed;
        let results = match carried_out(&row) {
            Some(_) => after_decision(&row, rolled.results),
            None => rolled.results,
        };
        let mut outcome = CallOutcome::of_approval(&row, results);
        outcome.halt = rolled.halt;
        crate::server::metrics::tool_call(&row.tool, if ok { "ok" } else { "error" });
        let result = serde_json::to_value(&outcome).expect("outcomes are JSON");
        let finished = self
            .approvals
            .finish(id, state, result, rolled.stopped)
            .await;
        if let Err(e) = finished {
            tracing::error!(error = %e, approval_id = %id, "could not record the end of an execution");
        }
        tracing::info!(approval_id = %id, state = state.as_str(), elapsed_ms = started.elapsed().as_millis() as u64, "approved call ran");
    }

    /// Steps 6 and 7 for an approved request: what every write carries, prepared once, then
    /// its rollout (`rollout.rs`). A failure before any runner was called stops it at once.
    async fn run_approved(&self, row: &Approval) -> Rolled {
        let before_any = |why: String| Rolled {
            results: Vec::new(),
            stopped: Some(why),
            halt: None,
        };
        let Some(tool) = self.packs.tool(&row.tool) else {
            return before_any(format!("tool `{}` is no longer loaded", row.tool));
        };
        let pack = self.packs.pack(&tool.pack).expect("tool has a pack");
        if pack.digest != row.pack_sha256 {
            return before_any(format!(
                "pack `{}` changed since the request ({} → {}): nothing was run; ask again",
                pack.name, row.pack_sha256, pack.digest
            ));
        }
        if let Err(why) = plan_as_signed(row) {
            tracing::error!(approval_id = %row.id, why = %why, "a request whose stored plan is not the one people signed is not run");
            return before_any(why);
        }
        let held = match self.approval_events(&row.id).await {
            Ok(events) => as_requested(row, &events),
            Err(why) => Err(why),
        };
        if let Err(why) = held {
            tracing::error!(approval_id = %row.id, why = %why, "a request the audit log does not hold as asked for and approved is not run");
            return before_any(why);
        }
        let proof = self.proof_for(row);
        let decision = carried_out(row).map(|d| DecisionProof {
            text: d.text.clone(),
            signatures: d.votes.iter().filter_map(|v| v.signature.clone()).collect(),
        });
        let secret_salt = self.commit_salt(tool, &row.id);
        let witnessed = if self.needs_witnessed(row) {
            match self.witnessed_for(row).await {
                Ok(w) => Some(w),
                Err(why) => return before_any(why),
            }
        } else {
            None
        };
        let prepared = Prepared {
            tool,
            audited: AuditedCall {
                actor: &row.requester,
                tool: &row.tool,
                args: &row.shown_args,
                reason: Some(&row.reason),
                call_id: &row.call_id,
                approval_id: Some(&row.id),
                on_behalf_of: row.on_behalf_of.as_deref(),
            },
            proof: proof.as_ref(),
            witnessed: witnessed.as_ref(),
            secret_salt: secret_salt.as_deref(),
            decision: decision.as_ref(),
        };
        self.roll_out_approved(row, &prepared).await
    }

    /// When the audit log says the request `id` was approved, if it backs a first execution:
    /// an `approval.approved` that settled it, no `approval.executing` yet, and no event
    /// missing from the log since (a deleted `approval.executing` leaves a gap in `seq`).
    async fn approved_in_log(&self, id: &str) -> Result<chrono::DateTime<chrono::Utc>, String> {
        let events = self.approval_events(id).await?;
        let (seq, at) = first_execution_backed(&events)?;
        let gap = crate::server::audit::proofs::missing_from(self.approvals.db(), seq)
            .await
            .map_err(|e| format!("the audit log could not be read: {e}"))?;
        match gap {
            Some(gap) => Err(format!(
                "the audit log is missing events since its approval ({gap}), so it was changed"
            )),
            None => Ok(at),
        }
    }

    /// Every event of the request `id`, in order.
    async fn approval_events(&self, id: &str) -> Result<Vec<Event>, String> {
        let filter = AuditFilter {
            approval_id: Some(id.to_owned()),
            limit: MAX_HISTORY,
            ..AuditFilter::default()
        };
        crate::server::audit::query(self.approvals.db(), &filter)
            .await
            .map_err(|e| format!("the audit log could not be read: {e}"))
    }

    /// Expires an approved request whose execution never started within
    /// `approved_start_within` of its approval; nothing runs.
    pub(super) async fn expire_approved(&self, id: &str) {
        let start_within = self.limits.approved_start_within;
        self.expire_approved_if(id, |r| {
            let late = r.state != State::Approved
                || too_late_to_start(r, start_within, chrono::Utc::now());
            late.then(|| {
                format!(
                    "was approved at {}, but its execution did not start within {} s of the approval",
                    r.updated_at,
                    start_within.as_secs()
                )
            })
        })
        .await;
    }

    /// Expires an approved request for the reason `why` gives for the locked row (`None`
    /// leaves it as it is); nothing runs.
    async fn expire_approved_if(&self, id: &str, why: impl Fn(&Approval) -> Option<String>) {
        let result = self
            .approvals
            .transition(id, Lock::SkipLocked, |r| {
                let Some(why) = why(r) else {
                    return Err(ApprovalError::WrongState {
                        state: r.state,
                        wanted: "expired",
                    });
                };
                let why = format!("{why}; nothing ran: ask again");
                let mut change = approvals::moved(
                    r,
                    &[State::Approved],
                    State::Expired,
                    "system",
                    kind::APPROVAL_EXPIRED,
                    json!({"approved_at": r.updated_at, "why": why}),
                    chrono::Utc::now(),
                )?;
                change.row.note = Some(why);
                Ok(change)
            })
            .await;
        match result {
            Ok(_) | Err(ApprovalError::WrongState { .. }) => {}
            Err(e) => tracing::error!(error = %e, approval_id = %id, "could not expire"),
        }
    }
}

/// The most events of one approval read to decide whether it may start (a rollout of the
/// largest plan has a few per runner).
const MAX_HISTORY: i64 = 100_000;

/// When an approval's events say it was approved, if they back its first execution: the
/// first `approval.approved` that settled it (`state: approved`; a later copy, such as one an
/// insider appended, never moves its time), and no `approval.executing` (an approval is
/// claimed once; only people's signed decision on its halt runs it again). Returns that
/// event's seq and time.
fn first_execution_backed(
    events: &[Event],
) -> Result<(i64, chrono::DateTime<chrono::Utc>), String> {
    if let Some(e) = events.iter().find(|e| e.kind == kind::APPROVAL_EXECUTING) {
        return Err(format!(
            "it started already (`approval.executing` at seq {}), so the store was changed since",
            e.seq
        ));
    }
    let settled = events.iter().find(|e| {
        e.kind == kind::APPROVAL_APPROVED
            && e.detail.as_ref().is_some_and(|d| d["state"] == "approved")
    });
    let Some(settled) = settled else {
        return Err(
            "the audit log has no `approval.approved` that settled it, so the store was changed"
                .into(),
        );
    };
    chrono::DateTime::parse_from_rfc3339(&settled.at)
        .map(|at| (settled.seq, at.with_timezone(&chrono::Utc)))
        .map_err(|e| format!("its approval's time in the audit log is unreadable: {e}"))
}

/// The stored request is the one the log says was asked for, and nobody ended it before it
/// ran: its first `approval.requested` names the same count of people, plan and statement
/// (an insider with the database who lowers them before people sign runs nothing); no
/// `approval.denied`, `approval.withdrawn` or `approval.expired` is in the log for it; and at
/// least as many distinct people as it needs approved it in the log (a vote stored without
/// its event counts for nothing).
fn as_requested(row: &Approval, events: &[Event]) -> Result<(), String> {
    let changed = |what: String| {
        format!("the stored request {what} (the store was changed): nothing was run")
    };
    let Some(requested) = events
        .iter()
        .find(|e| e.kind == kind::APPROVAL_REQUESTED)
        .and_then(|e| e.detail.as_ref())
    else {
        return Err(changed(
            "has no `approval.requested` in the audit log".into(),
        ));
    };
    if requested["required_approvals"] != json!(row.required_approvals) {
        return Err(changed(format!(
            "needs {} people, and it was asked for with {}",
            row.required_approvals, requested["required_approvals"]
        )));
    }
    if requested["plan"] != json!(row.plan) {
        return Err(changed(
            "has another plan than it was asked for with".into(),
        ));
    }
    let statement = row
        .statement
        .as_deref()
        .map(super::request::statement_digest);
    if requested["statement_sha256"] != json!(statement) {
        return Err(changed(
            "has another statement than it was asked for with".into(),
        ));
    }
    if let Some(end) = events.iter().find(|e| {
        [
            kind::APPROVAL_DENIED,
            kind::APPROVAL_WITHDRAWN,
            kind::APPROVAL_EXPIRED,
        ]
        .contains(&e.kind.as_str())
    }) {
        return Err(changed(format!(
            "was ended in the audit log (`{}` at seq {})",
            end.kind, end.seq
        )));
    }
    let mut approvers: Vec<&str> = events
        .iter()
        .filter(|e| e.kind == kind::APPROVAL_APPROVED)
        .map(|e| e.actor.as_str())
        .collect();
    approvers.sort_unstable();
    approvers.dedup();
    if (approvers.len() as u64) < u64::from(row.required_approvals) {
        return Err(changed(format!(
            "counts as approved, and the audit log has {} of the {} people it needs approving it",
            approvers.len(),
            row.required_approvals
        )));
    }
    match carried_out(row) {
        Some(decision) => decision_as_voted(row, decision, events).map_err(changed),
        None => Ok(()),
    }
}

/// A resume or a retry runs only when as many distinct people as the request itself needed
/// voted for that decision in the log (`rollout.decided` naming it): a vote stored without
/// its event, or a count lowered in the store, counts for nothing (red team 3, F5b).
fn decision_as_voted(
    row: &Approval,
    decision: &approvals::RolloutDecision,
    events: &[Event],
) -> Result<(), String> {
    let mut voters: Vec<&str> = events
        .iter()
        .filter(|e| {
            e.kind == kind::ROLLOUT_DECIDED
                && e.detail
                    .as_ref()
                    .is_some_and(|d| d["decision_id"] == decision.id.as_str())
        })
        .map(|e| e.actor.as_str())
        .collect();
    voters.sort_unstable();
    voters.dedup();
    let needed = row.required_approvals.max(decision.required);
    if (voters.len() as u64) < u64::from(needed) {
        return Err(format!(
            "carries out rollout decision {}, and the audit log has {} of the {needed} people it needs voting for it",
            decision.id,
            voters.len()
        ));
    }
    Ok(())
}

/// The stored plan is one a rollout can run, and where people signed, the one they signed:
/// every wave has a runner, every runner of the request is in exactly one wave, and the
/// statement's `wave` lines are this plan (a store edited to skip a wave, or to move a
/// runner, runs nothing).
fn plan_as_signed(row: &Approval) -> Result<(), String> {
    let changed =
        |what: &str| format!("the stored plan {what} (the store was changed): nothing was run");
    if row.plan.waves.iter().any(Vec::is_empty) {
        return Err(changed("has an empty wave"));
    }
    let mut planned: Vec<&String> = row.plan.waves.iter().flatten().collect();
    planned.sort();
    let mut runners: Vec<&String> = row.runners.iter().collect();
    runners.sort();
    if planned != runners {
        return Err(changed(
            "does not place each of the request's runners in one wave",
        ));
    }
    if let Some(text) = &row.statement {
        let signed = Statement::parse(text)
            .map_err(|e| changed(&format!("has no readable statement: {e}")))?;
        if signed.plan != row.plan {
            return Err(changed("is not the plan of the statement people signed"));
        }
    }
    Ok(())
}

/// The decision people took on the request's halt that this execution carries out (a resume
/// or a retry), if it is one.
fn carried_out(row: &Approval) -> Option<&approvals::RolloutDecision> {
    row.decision
        .as_ref()
        .filter(|d| d.taken && d.choice != Choice::Abort)
}

/// The outcome after a decision ran some runners again: each runner's latest result, the
/// earlier ones kept for the runners it did not run.
fn after_decision(row: &Approval, rerun: Vec<RunnerResult>) -> Vec<RunnerResult> {
    let before: Vec<RunnerResult> = row
        .result
        .clone()
        .and_then(|r| serde_json::from_value::<CallOutcome>(r).ok())
        .map(|o| o.results)
        .unwrap_or_default();
    let mut results: Vec<RunnerResult> = before
        .into_iter()
        .filter(|old| !rerun.iter().any(|new| new.runner == old.runner))
        .collect();
    results.extend(rerun);
    results
}

/// `approved` → `executing`: this replica will run the request, audited with who approved it.
fn claim(
    r: &Approval,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<approvals::Change, ApprovalError> {
    let by = r.decided_by.clone().unwrap_or_else(|| "system".into());
    let mut change = approvals::moved(
        r,
        &[State::Approved],
        State::Executing,
        &by,
        kind::APPROVAL_EXECUTING,
        json!({"runners": r.runners, "approvals": r.votes}),
        now,
    )?;
    // A rollout of several waves starts its first in the same commit as the claim, one
    // durable commit fewer between the click and the first runner call (`rollout.rs` then
    // records the waves after it).
    if r.plan.waves.len() > 1 {
        let mut wave = r.event(
            ROLLOUT_ACTOR,
            kind::ROLLOUT_WAVE,
            json!({"wave": 1, "waves": r.plan.waves.len(), "runners": r.plan.waves[0]}),
        );
        wave.runner = None;
        wave.detail = Some(super::super::call::on_behalf_of(
            wave.detail.take().unwrap_or_default(),
            r.on_behalf_of.as_deref(),
        ));
        change.events.push(wave);
    }
    Ok(change)
}

/// Whether an approved request's execution may no longer start: more than `within` since
/// the approval that settled it, at `now` (an unreadable time counts as too late).
fn too_late_to_start(row: &Approval, within: Duration, now: chrono::DateTime<chrono::Utc>) -> bool {
    let Ok(approved) = chrono::DateTime::parse_from_rfc3339(&row.updated_at) else {
        return true;
    };
    let within = chrono::Duration::from_std(within).unwrap_or(chrono::Duration::minutes(5));
    approved.with_timezone(&chrono::Utc) + within <= now
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use crate::server::approvals::testing::{at, row};

    use super::*;

    #[test]
    fn a_claim_moves_an_approved_request_to_executing_by_its_approver() {
        let now = at("2026-11-30T10:06:00Z");
        let approved = Approval {
            state: State::Approved,
            decided_by: Some("approver:alice".into()),
            ..row()
        };
        let change = claim(&approved, now).unwrap();
        assert_eq!(change.row.state, State::Executing);
        assert_eq!(change.row.updated_at, "2026-11-30T10:06:00.000000Z");
        let [event] = &change.events[..] else {
            panic!("a claim is audited by one event");
        };
        assert_eq!(event.kind, kind::APPROVAL_EXECUTING);
        assert_eq!(event.actor, "approver:alice");
        assert_eq!(
            event.detail,
            Some(json!({"runners": ["hvn05"], "approvals": []}))
        );
        // A plan of several waves: its first wave starts in the claim's commit.
        let waves = Approval {
            plan: crate::protocol::approval::Plan {
                waves: vec![vec!["hvn05".into()], vec!["hvn06".into()]],
                pause_secs: 0,
            },
            ..approved.clone()
        };
        let change = claim(&waves, now).unwrap();
        let [executing, wave] = &change.events[..] else {
            panic!("a claim and the first wave: {:?}", change.events);
        };
        assert_eq!(executing.kind, kind::APPROVAL_EXECUTING);
        assert_eq!(wave.kind, kind::ROLLOUT_WAVE);
        assert_eq!(wave.actor, "system:rollout");
        assert_eq!(
            wave.detail,
            Some(
                json!({"wave": 1, "waves": 2, "runners": ["hvn05"], "on_behalf_of": "person:dana"})
            )
        );
        // Without a recorded approver, the system claims it.
        let nobody = Approval {
            decided_by: None,
            ..approved
        };
        assert_eq!(claim(&nobody, now).unwrap().events[0].actor, "system");
        // Only an approved request is claimed.
        for state in State::ALL.into_iter().filter(|s| *s != State::Approved) {
            let other = Approval { state, ..row() };
            assert!(
                matches!(claim(&other, now), Err(ApprovalError::WrongState { .. })),
                "{state:?} was claimed"
            );
        }
    }

    #[test]
    fn an_approval_starts_only_within_its_window() {
        let approved = Approval {
            state: State::Approved,
            updated_at: "2026-11-30T10:05:00.000000Z".into(),
            ..row()
        };
        let within = Duration::from_secs(300);
        assert!(!too_late_to_start(
            &approved,
            within,
            at("2026-11-30T10:05:00Z")
        ));
        assert!(!too_late_to_start(
            &approved,
            within,
            at("2026-11-30T10:09:59Z")
        ));
        assert!(too_late_to_start(
            &approved,
            within,
            at("2026-11-30T10:10:00Z")
        ));
        assert!(too_late_to_start(
            &approved,
            within,
            at("2026-11-30T11:00:00Z")
        ));
        let unreadable = Approval {
            updated_at: "yesterday".into(),
            ..approved
        };
        assert!(
            too_late_to_start(&unreadable, within, at("2026-11-30T10:05:00Z")),
            "an unreadable approval time counts as too late"
        );
    }

    fn event(seq: i64, kind: &str, detail: Option<Value>) -> Event {
        Event {
            seq,
            id: format!("e{seq}"),
            at: format!("2026-11-30T10:0{seq}:00.000000Z"),
            actor: "approver:alice".into(),
            kind: kind.into(),
            tool: None,
            runner: None,
            args: None,
            reason: None,
            call_id: None,
            approval_id: Some("a".into()),
            outcome: None,
            result_digest: None,
            detail,
            prev_hash: String::new(),
            hash: String::new(),
            hash_v: 2,
        }
    }

    /// The sweep runs an approved request only if the log backs it: an `approval.approved`
    /// that settled it (its time is the log's), and no `approval.executing` before.
    #[test]
    fn only_an_approval_the_log_backs_and_never_started_may_start() {
        let requested = event(1, kind::APPROVAL_REQUESTED, None);
        let one_of_two = event(
            2,
            kind::APPROVAL_APPROVED,
            Some(json!({"state": "pending", "votes": 1})),
        );
        let settled = event(
            3,
            kind::APPROVAL_APPROVED,
            Some(json!({"state": "approved", "votes": 2})),
        );
        let at = first_execution_backed(&[requested.clone(), one_of_two.clone(), settled.clone()]);
        assert_eq!(at.unwrap(), (3, at_("2026-11-30T10:03:00Z")));
        // A later copy of the settling event (an insider's append) does not move the time.
        let copy = event(
            5,
            kind::APPROVAL_APPROVED,
            Some(json!({"state": "approved", "votes": 2})),
        );
        let at = first_execution_backed(&[requested.clone(), settled.clone(), copy]);
        assert_eq!(at.unwrap(), (3, at_("2026-11-30T10:03:00Z")));
        let why = first_execution_backed(&[requested.clone(), one_of_two]).unwrap_err();
        assert!(
            why.contains("no `approval.approved` that settled it"),
            "{why}"
        );
        let started = event(4, kind::APPROVAL_EXECUTING, None);
        let why = first_execution_backed(&[requested, settled, started]).unwrap_err();
        assert!(
            why.contains("started already (`approval.executing` at seq 4)"),
            "{why}"
        );
    }

    /// A request runs only as it was asked for and approved in the log: the count of people,
    /// the plan and the statement of its `approval.requested`, no event that ended it, and as
    /// many distinct people approving it in the log as it needs (red team 3: B0, B3, W4).
    #[test]
    fn a_request_runs_only_as_the_log_says_it_was_asked_for_and_approved() {
        let asked = Approval {
            required_approvals: 2,
            statement: Some("the statement\n".into()),
            ..row()
        };
        let requested = |required: u32, plan: &crate::protocol::approval::Plan, text: &str| {
            event(
                1,
                kind::APPROVAL_REQUESTED,
                Some(json!({"required_approvals": required, "plan": plan,
                    "statement_sha256": super::super::request::statement_digest(text)})),
            )
        };
        let vote = |seq: i64, who: &str| Event {
            actor: who.into(),
            ..event(
                seq,
                kind::APPROVAL_APPROVED,
                Some(json!({"state": "approved"})),
            )
        };
        let good = vec![
            requested(2, &asked.plan, "the statement\n"),
            vote(2, "approver:alice"),
            vote(3, "approver:bob"),
        ];
        as_requested(&asked, &good).unwrap();
        let refused = |events: Vec<Event>, says: &str| {
            let why = as_requested(&asked, &events).unwrap_err();
            assert!(why.contains(says), "{why}");
        };
        // B0: the count of people (or the statement) lowered in the store before people signed.
        let mut lowered = good.clone();
        lowered[0] = requested(3, &asked.plan, "the statement\n");
        refused(lowered, "needs 2 people, and it was asked for with 3");
        let mut edited = good.clone();
        edited[0] = requested(2, &asked.plan, "another statement\n");
        refused(edited, "another statement");
        let mut replanned = good.clone();
        replanned[0] = requested(
            2,
            &crate::protocol::approval::Plan {
                waves: vec![vec!["e0".into()], vec!["e1".into()]],
                pause_secs: 0,
            },
            "the statement\n",
        );
        refused(replanned, "another plan");
        refused(good[1..].to_vec(), "has no `approval.requested`");
        // B3: a vote stored without its event (or one person's twice) counts for nothing.
        refused(
            vec![
                good[0].clone(),
                vote(2, "approver:alice"),
                vote(3, "approver:alice"),
            ],
            "has 1 of the 2 people",
        );
        // F5b: a resume carried out with a vote stored without its event.
        let decision = approvals::RolloutDecision {
            id: "d1".into(),
            choice: Choice::Resume,
            runners: vec!["e1".into()],
            text: String::new(),
            expires_at: String::new(),
            proposed_by: "approver:alice".into(),
            required: 1,
            votes: Vec::new(),
            taken: true,
        };
        let resumed = Approval {
            decision: Some(decision),
            ..asked.clone()
        };
        let decided = |seq: i64, who: &str, id: &str| Event {
            actor: who.into(),
            ..event(seq, kind::ROLLOUT_DECIDED, Some(json!({"decision_id": id})))
        };
        let mut voted = good.clone();
        voted.push(decided(4, "approver:alice", "d1"));
        let why = as_requested(&resumed, &voted).unwrap_err();
        assert!(why.contains("1 of the 2 people"), "{why}");
        voted.push(decided(5, "approver:alice", "d1"));
        voted.push(decided(6, "approver:bob", "d0"));
        let why = as_requested(&resumed, &voted).unwrap_err();
        assert!(why.contains("1 of the 2 people"), "{why}");
        voted.push(decided(7, "approver:bob", "d1"));
        as_requested(&resumed, &voted).unwrap();
        // W4: a denial in the log ends it, whatever is appended after.
        let mut denied = good.clone();
        denied.insert(2, event(3, kind::APPROVAL_DENIED, None));
        refused(denied, "`approval.denied` at seq 3");
    }

    fn at_(text: &str) -> chrono::DateTime<chrono::Utc> {
        at(text)
    }

    /// A stored plan runs only as it was made and, where people signed, as they signed it: no
    /// empty wave (a store edited to skip the canary), every runner in one wave, the
    /// statement's plan.
    #[test]
    fn a_plan_runs_only_as_people_signed_it() {
        let plan = |waves: &[&[&str]]| crate::protocol::approval::Plan {
            waves: waves
                .iter()
                .map(|w| w.iter().map(|n| n.to_string()).collect())
                .collect(),
            pause_secs: 0,
        };
        let two = Approval {
            runners: vec!["e1".into(), "e2".into()],
            plan: plan(&[&["e1"], &["e2"]]),
            ..row()
        };
        assert!(plan_as_signed(&two).is_ok());
        for (waves, says) in [
            (plan(&[&[], &["e2"]]), "has an empty wave"),
            (plan(&[&["e1"]]), "does not place each"),
            (plan(&[&["e1", "e2"], &["e2"]]), "does not place each"),
        ] {
            let edited = Approval {
                plan: waves,
                ..two.clone()
            };
            let why = plan_as_signed(&edited).unwrap_err();
            assert!(why.contains(says), "{why}");
        }
        // Signed: the statement's plan is the one that runs.
        let statement = |p: &crate::protocol::approval::Plan| {
            let mut st = crate::protocol::approval::statement::tests::sample();
            st.approval_id = two.id.clone();
            st.runners = two.runners.iter().map(|r| (r.clone(), None)).collect();
            st.plan = p.clone();
            st.text().unwrap()
        };
        let signed = Approval {
            statement: Some(statement(&two.plan)),
            ..two.clone()
        };
        assert!(plan_as_signed(&signed).is_ok());
        let swapped = Approval {
            plan: plan(&[&["e2"], &["e1"]]),
            ..signed.clone()
        };
        let why = plan_as_signed(&swapped).unwrap_err();
        assert!(
            why.contains("not the plan of the statement people signed"),
            "{why}"
        );
    }
}
