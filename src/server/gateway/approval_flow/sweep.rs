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
            - chrono::Duration::from_std(self.limits.call_timeout * 2 + Duration::from_secs(60))
                .unwrap_or(chrono::Duration::minutes(5));
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

    /// `executing` → `unknown` for an execution that outlived every deadline: a crash
    /// interrupted it, and it is never re-run.
    async fn mark_interrupted(&self, id: &str) {
        let result = self
            .approvals
            .transition(id, Lock::SkipLocked, |r| {
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
