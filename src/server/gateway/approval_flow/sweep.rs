//! The sweep, every few seconds on every replica: expires overdue requests, runs approved
//! ones nobody claimed, and marks executions that outlived every deadline `unknown`.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::super::state::Gateway;
use crate::server::approvals::{self, Due, Lock, State};
use crate::server::audit::{format_at, kind};

impl Gateway {
    /// Expires overdue requests (pending past their expiry, approved but never started
    /// within `approved_start_within`), executes approved ones nobody claimed (their replica
    /// stopped between the decision and the claim), and marks executions that outlived
    /// every deadline `unknown`: a crash interrupted them, and they are never re-run.
    pub(crate) async fn sweep(&self) {
        let now = chrono::Utc::now();
        for id in self.due(State::Pending, now, Due::Expiry).await {
            self.expire(&id).await;
        }
        let stale = now
            - chrono::Duration::from_std(self.limits.approved_start_within)
                .unwrap_or(chrono::Duration::minutes(5));
        for id in self.due(State::Approved, stale, Due::LastChange).await {
            self.expire_approved(&id).await;
        }
        let orphaned = now - chrono::Duration::seconds(10);
        for id in self.due(State::Approved, orphaned, Due::LastChange).await {
            self.execute_approved(&id).await;
        }
        let lost = now
            - chrono::Duration::from_std(self.lost_after()).unwrap_or(chrono::Duration::minutes(5));
        for id in self.due(State::Executing, lost, Due::LastChange).await {
            self.mark_interrupted(&id).await;
        }
    }

    /// The requests in `state` whose `due` time is before `before`. A failure to list them is
    /// logged and leaves this part of the sweep empty: the next sweep tries again.
    async fn due(
        &self,
        state: State,
        before: chrono::DateTime<chrono::Utc>,
        due: Due,
    ) -> Vec<String> {
        match self.approvals.ids_in(state, &format_at(before), due).await {
            Ok(ids) => ids,
            Err(e) => {
                tracing::warn!(error = %e, state = state.as_str(), "approval sweep could not list requests");
                Vec::new()
            }
        }
    }

    /// How long an execution of one wave may stay `executing` before the sweep takes it for
    /// lost: two calls' time and a minute.
    fn lost_after(&self) -> Duration {
        self.limits.call_timeout * 2 + Duration::from_secs(60)
    }

    /// Whether `row`, `executing`, may still be rolling out at `now` ([`still_rolling_out`]
    /// with its tool's verify deadline and this server's call timeout).
    fn may_still_be_rolling_out(
        &self,
        row: &approvals::Approval,
        now: chrono::DateTime<chrono::Utc>,
    ) -> bool {
        let within = self
            .packs
            .tool(&row.tool)
            .and_then(|t| t.verify.as_ref().map(|v| v.within))
            .unwrap_or_default();
        let allowed = self.lost_after() + longest_rollout(row, self.limits.call_timeout, within);
        still_rolling_out(row, allowed, now)
    }

    /// `executing` → `unknown` for an execution that outlived every deadline (its rollout's
    /// too): a crash interrupted it, and it is never re-run.
    async fn mark_interrupted(&self, id: &str) {
        let result = self
            .approvals
            .transition(id, Lock::SkipLocked, |r| {
                // A rollout in waves runs longer than one call: its gates and pauses.
                if self.may_still_be_rolling_out(r, chrono::Utc::now()) {
                    return Err(approvals::ApprovalError::WrongState {
                        state: r.state,
                        wanted: "an execution past its rollout's longest time",
                    });
                }
                let mut change = approvals::moved(
                    r,
                    &[State::Executing],
                    State::Unknown,
                    "system",
                    kind::CALL_UNKNOWN,
                    json!({"why": "execution was interrupted (the server stopped); it is not re-run: check the runners"}),
                    chrono::Utc::now(),
                )?;
                change.row.note = Some(
                    "execution was interrupted before its outcome was recorded; it is not re-run: check the runners".into(),
                );
                Ok(change)
            })
            .await;
        if let Err(e) = result {
            tracing::warn!(error = %e, approval_id = %id, "could not mark an interrupted execution");
        }
    }

    /// Runs [`Gateway::sweep`] every `every` until `shutdown`.
    pub(crate) fn spawn_sweeper(self: &Arc<Self>, every: Duration, shutdown: CancellationToken) {
        let me = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(every) => {}
                }
                let Some(gateway) = me.upgrade() else { return };
                gateway.sweep().await;
            }
        });
    }
}

/// The longest `row`'s plan can run: per wave a write and a verify call (each up to
/// `call_timeout`), the verify's deadline `within` and one more try; the pauses between waves.
fn longest_rollout(
    row: &approvals::Approval,
    call_timeout: Duration,
    within: Duration,
) -> Duration {
    let waves = row.plan.waves.len() as u32;
    (call_timeout * 2 + within + Duration::from_secs(1)) * waves
        + Duration::from_secs(row.plan.pause_secs.into()) * waves.saturating_sub(1)
}

/// Whether `row` was claimed less than `allowed` before `now` (an unreadable claim time
/// counts as long ago).
fn still_rolling_out(
    row: &approvals::Approval,
    allowed: Duration,
    now: chrono::DateTime<chrono::Utc>,
) -> bool {
    let Ok(claimed) = chrono::DateTime::parse_from_rfc3339(&row.updated_at) else {
        return false;
    };
    let allowed = chrono::Duration::from_std(allowed).unwrap_or(chrono::Duration::hours(24));
    now < claimed.with_timezone(&chrono::Utc) + allowed
}

#[cfg(test)]
mod tests {
    use crate::protocol::approval::Plan;
    use crate::server::approvals::testing::{at, row};

    use super::*;

    /// A rollout of three waves with 60 s gates and 30 s pauses is not taken for lost while
    /// it may still run; a crashed one is, once that time has passed.
    #[test]
    fn a_rolling_out_execution_is_lost_only_after_its_plans_longest_time() {
        let executing = approvals::Approval {
            state: State::Executing,
            updated_at: "2026-11-30T10:00:00.000000Z".into(),
            plan: Plan {
                waves: vec![vec!["a".into()], vec!["b".into()], vec!["c".into()]],
                pause_secs: 30,
            },
            ..row()
        };
        let longest = longest_rollout(&executing, Duration::from_secs(30), Duration::from_secs(60));
        // 3 × (2 × 30 + 60 + 1) + 2 × 30
        assert_eq!(longest, Duration::from_secs(423));
        let allowed = Duration::from_secs(120) + longest;
        assert!(still_rolling_out(
            &executing,
            allowed,
            at("2026-11-30T10:09:02Z")
        ));
        assert!(!still_rolling_out(
            &executing,
            allowed,
            at("2026-11-30T10:09:03Z")
        ));
        // One wave, no verify: two calls and a second past the sweep's own bound.
        let one = approvals::Approval {
            plan: Plan::one_wave([&"a".to_owned()]),
            ..executing.clone()
        };
        assert_eq!(
            longest_rollout(&one, Duration::from_secs(30), Duration::ZERO),
            Duration::from_secs(61)
        );
        let unreadable = approvals::Approval {
            updated_at: "yesterday".into(),
            ..executing
        };
        assert!(!still_rolling_out(
            &unreadable,
            allowed,
            at("2026-11-30T10:00:00Z")
        ));
    }
}
