//! Waiting for a request to settle: progress while it is pending, a withdrawal when the
//! agent cancels its call, an expiry as soon as it is due, and the agent's view of the
//! request once it has settled or the wait is over.

use std::time::{Duration, Instant};

use serde_json::json;

use super::super::builtins::{APPROVAL_STATUS_TOOL, APPROVAL_WAIT_TOOL};
use super::super::call::CallContext;
use super::super::outcome::{ApprovalInfo, CallError, CallOutcome};
use super::super::state::Gateway;
use crate::server::approvals::{self, Approval, ApprovalError, Lock, State};
use crate::server::audit::kind;

impl Gateway {
    /// Waits for the request to settle, sending progress; returns its outcome, or the
    /// request as pending once `approval_wait` has passed. A cancelled call withdraws a
    /// request that is still pending.
    pub(crate) async fn wait(
        &self,
        a: &Approval,
        ctx: &CallContext,
    ) -> Result<CallOutcome, CallError> {
        let mut changes = self.approvals.subscribe();
        let started = Instant::now();
        let deadline = started + self.limits.approval_wait;
        let mut next_progress = started + self.limits.progress_every;
        // Changes arrive by channel; the poll covers a listener that is reconnecting.
        let poll = Duration::from_secs(2);
        loop {
            let mut row = self.approvals.get(&a.id).await?;
            if row.state == State::Pending && row.expired_at(chrono::Utc::now()) {
                // Expire it now rather than at the next sweep; if another replica holds the
                // row, the poll below picks up whatever it decided.
                self.expire(&row.id).await;
                row = self.approvals.get(&a.id).await?;
            }
            if let Some(done) = settled_outcome(&row)? {
                return Ok(done);
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(pending_outcome(&row, self.limits.approval_wait));
            }
            if now >= next_progress {
                if let Some(progress) = &ctx.progress {
                    progress(format!(
                        "approval {} for {} is {}; approvers: {}/{}; expires at {}",
                        row.id,
                        row.tool,
                        row.state.as_str(),
                        row.votes.len(),
                        row.required_approvals,
                        row.expires_at
                    ))
                    .await;
                }
                next_progress += self.limits.progress_every;
            }
            let wake = deadline.min(next_progress).min(now + poll);
            tokio::select! {
                _ = ctx.cancel.cancelled() => {
                    self.withdraw(&row).await;
                    return Err(CallError::Cancelled(format!("; approval request {} was withdrawn if still pending", row.id)));
                }
                _ = changed(&mut changes, &a.id) => {}
                _ = tokio::time::sleep_until(wake.into()) => {}
            }
        }
    }

    async fn withdraw(&self, row: &Approval) {
        let why = "the agent cancelled its call";
        match self.withdraw_pending(&row.id, &row.requester, why).await {
            Ok(()) | Err(ApprovalError::WrongState { .. }) => {}
            Err(e) => tracing::error!(error = %e, approval_id = %row.id, "could not withdraw"),
        }
    }

    pub(in crate::server::gateway) async fn expire(&self, id: &str) {
        let result = self
            .approvals
            .transition(id, Lock::SkipLocked, |r| {
                let now = chrono::Utc::now();
                if !r.expired_at(now) {
                    return Err(ApprovalError::WrongState {
                        state: r.state,
                        wanted: "expired",
                    });
                }
                approvals::moved(
                    r,
                    &[State::Pending],
                    State::Expired,
                    "system",
                    kind::APPROVAL_EXPIRED,
                    json!({"expires_at": r.expires_at, "votes": r.votes.len()}),
                    now,
                )
            })
            .await;
        match result {
            Ok(Some(_)) => crate::server::metrics::approval_expired_unanswered(),
            Ok(None) | Err(ApprovalError::WrongState { .. }) => {}
            Err(e) => tracing::error!(error = %e, approval_id = %id, "could not expire"),
        }
    }
}

/// Returns when request `id` changed, or when changes were missed (a lagging receiver):
/// other requests' changes do not wake a waiter to re-read its own row.
async fn changed(changes: &mut tokio::sync::broadcast::Receiver<approvals::Changed>, id: &str) {
    use tokio::sync::broadcast::error::RecvError;
    loop {
        match changes.recv().await {
            Ok(c) if c.id == id => return,
            Ok(_) => {}
            Err(RecvError::Lagged(_)) => return,
            // Never while the store lives; the caller's poll still wakes it.
            Err(RecvError::Closed) => std::future::pending().await,
        }
    }
}

/// What the agent is told about a request that has settled (its result, or the refusal that
/// ended it), or `None` while it is undecided.
pub(in crate::server::gateway) fn settled_outcome(
    row: &Approval,
) -> Result<Option<CallOutcome>, CallError> {
    let info = |message: String| ApprovalInfo {
        approval_id: row.id.clone(),
        state: row.state,
        expires_at: row.expires_at.clone(),
        message,
        decided_by: row.decided_by.clone(),
        outcome_note: row.note.clone(),
        note: row.note.clone(),
    };
    match row.state {
        State::Pending | State::Approved | State::Executing => Ok(None),
        State::Denied => Err(CallError::DeniedByHuman {
            approval_id: row.id.clone(),
            by: row
                .decided_by
                .clone()
                .unwrap_or_else(|| "an approver".into()),
            note: row.note.clone().unwrap_or_default(),
        }),
        State::Expired => Err(CallError::Expired {
            approval_id: row.id.clone(),
            why: match &row.note {
                Some(note) => note.clone(),
                None => format!(
                    "expired unanswered at {} after waiting {} ({} of {} approvals); nothing ran: ask again if it is still needed",
                    row.expires_at,
                    crate::server::notices::waited_text(
                        crate::server::notices::expired_after(row).as_secs()
                    ),
                    row.votes.len(),
                    row.required_approvals
                ),
            },
        }),
        State::Withdrawn => Err(CallError::Withdrawn {
            approval_id: row.id.clone(),
        }),
        State::Executed | State::Failed | State::Unknown | State::Halted | State::Aborted => {
            // The stored outcome is one this code wrote; an unreadable one still settles
            // the call, without results, and says so in the log.
            let stored = row
                .result
                .clone()
                .map(serde_json::from_value::<CallOutcome>);
            if let Some(Err(e)) = &stored {
                tracing::error!(error = %e, approval_id = %row.id, "stored outcome unreadable");
            }
            let mut outcome = stored
                .and_then(Result::ok)
                .unwrap_or_else(|| CallOutcome::of_approval(row, Vec::new()));
            let message = match row.state {
                State::Executed => "approved and executed".to_owned(),
                State::Failed => format!(
                    "approved, but the execution failed: {}",
                    row.note.as_deref().unwrap_or("see the per-runner results")
                ),
                State::Halted => format!(
                    "approved, but the rollout halted: {}; the runners marked `not_run` did not change. People may resume, retry or abort it with a signed decision ({APPROVAL_STATUS_TOOL} with this approval_id shows it), or you may ask again naming the runners still to change",
                    row.note.as_deref().unwrap_or("see the per-runner results")
                ),
                State::Aborted => format!(
                    "approved, but the rollout halted and people aborted it: {}",
                    row.note.as_deref().unwrap_or("see the per-runner results")
                ),
                _ => row.note.clone().unwrap_or_default(),
            };
            outcome.approval = Some(info(message));
            Ok(Some(outcome))
        }
    }
}

pub(in crate::server::gateway) fn pending_outcome(row: &Approval, waited: Duration) -> CallOutcome {
    CallOutcome {
        approval: Some(ApprovalInfo {
            approval_id: row.id.clone(),
            state: row.state,
            expires_at: row.expires_at.clone(),
            message: format!(
                "waiting for a human to approve ({} of {} approvals) after {} s; call {APPROVAL_WAIT_TOOL} with this approval_id to wait again, or {APPROVAL_STATUS_TOOL} to check",
                row.votes.len(),
                row.required_approvals,
                waited.as_secs()
            ),
            decided_by: row.decided_by.clone(),
            outcome_note: row.note.clone(),
            note: row.note.clone(),
        }),
        ..CallOutcome::of_approval(row, Vec::new())
    }
}

#[cfg(test)]
mod tests {
    use crate::server::approvals::testing::row;

    use super::*;

    #[test]
    fn an_undecided_request_has_not_settled() {
        for state in [State::Pending, State::Approved, State::Executing] {
            let r = Approval { state, ..row() };
            assert!(settled_outcome(&r).unwrap().is_none(), "{state:?} settled");
        }
    }

    #[test]
    fn a_refused_request_settles_as_its_error() {
        let denied = Approval {
            state: State::Denied,
            decided_by: Some("approver:alice".into()),
            note: Some("not during the freeze".into()),
            ..row()
        };
        assert_eq!(
            settled_outcome(&denied).unwrap_err().to_string(),
            "refused: approval request a1 was denied by approver:alice: not during the freeze"
        );
        let unnamed = Approval {
            decided_by: None,
            note: None,
            ..denied
        };
        assert_eq!(
            settled_outcome(&unnamed).unwrap_err().to_string(),
            "refused: approval request a1 was denied by an approver: "
        );
        let expired = Approval {
            state: State::Expired,
            ..row()
        };
        assert_eq!(
            settled_outcome(&expired).unwrap_err().to_string(),
            "refused: approval request a1 expired unanswered at 2026-11-30T10:15:00.000000Z after waiting 15 min (0 of 1 approvals); nothing ran: ask again if it is still needed"
        );
        let too_late = Approval {
            note: Some("was approved at 10:05, but its execution did not start".into()),
            ..expired
        };
        assert_eq!(
            settled_outcome(&too_late).unwrap_err().to_string(),
            "refused: approval request a1 was approved at 10:05, but its execution did not start"
        );
        let withdrawn = Approval {
            state: State::Withdrawn,
            ..row()
        };
        assert!(matches!(
            settled_outcome(&withdrawn),
            Err(CallError::Withdrawn { approval_id }) if approval_id == "a1"
        ));
    }

    #[test]
    fn a_finished_request_settles_as_its_stored_outcome() {
        let stored = json!({"call_id": "c1", "tool": "linux.systemctl_restart",
            "runner_chosen_by_server": false,
            "results": [{"runner": "hvn05", "ok": true, "output": "restarted", "duration_ms": 12}]});
        let executed = Approval {
            state: State::Executed,
            decided_by: Some("approver:alice".into()),
            result: Some(stored.clone()),
            ..row()
        };
        let outcome = settled_outcome(&executed).unwrap().unwrap();
        assert_eq!(outcome.results.len(), 1);
        assert_eq!(outcome.results[0].runner, "hvn05");
        let info = outcome.approval.unwrap();
        assert_eq!(info.message, "approved and executed");
        assert_eq!(info.state, State::Executed);
        assert_eq!(info.decided_by.as_deref(), Some("approver:alice"));

        let failed = Approval {
            state: State::Failed,
            note: Some("hvn05: exit 1".into()),
            ..executed.clone()
        };
        let info = settled_outcome(&failed).unwrap().unwrap().approval.unwrap();
        assert_eq!(
            info.message,
            "approved, but the execution failed: hvn05: exit 1"
        );
        // The agent reads why under `outcome_note`, and under `note` for one more release.
        let answer = serde_json::to_value(&info).unwrap();
        assert_eq!(answer["outcome_note"], "hvn05: exit 1", "{answer}");
        assert_eq!(answer["note"], "hvn05: exit 1", "{answer}");
        let failed_early = Approval {
            note: None,
            ..failed
        };
        let message = settled_outcome(&failed_early)
            .unwrap()
            .unwrap()
            .approval
            .unwrap()
            .message;
        assert_eq!(
            message,
            "approved, but the execution failed: see the per-runner results"
        );

        let unknown = Approval {
            state: State::Unknown,
            note: Some("execution was interrupted".into()),
            result: None,
            ..executed.clone()
        };
        let outcome = settled_outcome(&unknown).unwrap().unwrap();
        assert!(outcome.results.is_empty());
        assert_eq!(
            outcome.approval.unwrap().message,
            "execution was interrupted"
        );

        // An outcome this code cannot read still settles the call, without results.
        let unreadable = Approval {
            result: Some(json!({"results": "not a list"})),
            ..executed
        };
        let outcome = settled_outcome(&unreadable).unwrap().unwrap();
        assert!(outcome.results.is_empty());
        assert_eq!(outcome.call_id, "c1");
        assert_eq!(outcome.approval.unwrap().message, "approved and executed");
    }

    #[test]
    fn a_pending_outcome_says_how_far_the_request_is_and_how_to_wait_again() {
        let two = Approval {
            required_approvals: 2,
            votes: vec![approvals::Vote {
                user: "alice".into(),
                at: "x".into(),
                ..Default::default()
            }],
            ..row()
        };
        let outcome = pending_outcome(&two, Duration::from_secs(30));
        assert!(outcome.results.is_empty());
        assert_eq!(outcome.call_id, "c1");
        let info = outcome.approval.unwrap();
        assert_eq!(info.approval_id, "a1");
        assert_eq!(info.state, State::Pending);
        assert_eq!(info.expires_at, "2026-11-30T10:15:00.000000Z");
        assert_eq!(
            info.message,
            format!(
                "waiting for a human to approve (1 of 2 approvals) after 30 s; call {APPROVAL_WAIT_TOOL} with this approval_id to wait again, or {APPROVAL_STATUS_TOOL} to check"
            )
        );
    }
}
