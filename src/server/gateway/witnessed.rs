//! Witnessed approvals, the server's half: an approved execution bound for a runner with
//! `require_witnessed` first waits until a checkpoint cosigned by the witness quorum covers
//! the approval's `approval.approved` event, then carries that event with its inclusion proof
//! (`protocol::witnessed`). The runner checks it against its own keys; nothing here is trusted
//! by it.

use std::time::{Duration, Instant};

use crate::protocol::witnessed::WitnessedApproval;
use crate::server::approvals::Approval;
use crate::server::audit::{self, AuditFilter, kind};
use crate::server::db::Db;

/// How long an execution waits for its approval to be witnessed before it fails (nothing
/// runs): a checkpoint is due every `checkpoint_interval_ms`, and a witness answers in
/// milliseconds; longer means a witness is down or refusing.
const WAIT: Duration = Duration::from_secs(10);
/// How often the stored checkpoints are looked at while waiting.
const POLL: Duration = Duration::from_millis(25);

pub(crate) struct Witnessing {
    db: Db,
    quorum: usize,
}

impl Witnessing {
    pub(crate) fn new(db: Db, quorum: usize) -> Self {
        Witnessing { db, quorum }
    }
}

impl super::Gateway {
    /// Whether any of `row`'s runners said (in its health answer) that it requires witnessed
    /// approvals; with witnesses configured, also a runner not probed yet (its requirement is
    /// unknown, and a proof it does not need costs it nothing).
    pub(super) fn needs_witnessed(&self, row: &Approval) -> bool {
        row.runners.iter().any(|r| match self.runners.approvals(r) {
            Some(a) => a.require_witnessed,
            None => self.witnessing.is_some(),
        })
    }

    /// The approval's last `approval.approved` event with its inclusion proof in a checkpoint
    /// the witness quorum cosigned; waits for that checkpoint up to [`WAIT`]. The error says
    /// why nothing can run.
    pub(super) async fn witnessed_for(&self, row: &Approval) -> Result<WitnessedApproval, String> {
        let Some(w) = &self.witnessing else {
            return Err(
                "a runner requires witnessed approvals, but this server has no witnesses: set [transparency] witnesses in emisar.toml"
                    .into(),
            );
        };
        let approved = audit::query(
            &w.db,
            &AuditFilter {
                approval_id: Some(row.id.clone()),
                kind: Some(kind::APPROVAL_APPROVED.into()),
                limit: 100,
                ..Default::default()
            },
        )
        .await
        .map_err(|e| format!("the audit store failed: {e}"))?;
        let Some(event) = approved.last() else {
            return Err(format!(
                "approval {} has no approval.approved event",
                row.id
            ));
        };
        let deadline = Instant::now() + WAIT;
        loop {
            match audit::proofs::prove(&w.db, &event.id, w.quorum).await {
                Ok(p) => {
                    return Ok(WitnessedApproval {
                        event: p.event,
                        checkpoint: p.checkpoint,
                        proof: p.proof,
                    });
                }
                Err(e) if Instant::now() >= deadline => {
                    return Err(format!(
                        "the approval was not witnessed within {} s ({e}): nothing ran",
                        WAIT.as_secs()
                    ));
                }
                Err(_) => tokio::time::sleep(POLL).await,
            }
        }
    }

    /// Waits up to [`WAIT`] until event `id` is in a checkpoint the witness quorum cosigned
    /// (a break-glass call's `grant.used`); the error says why nothing runs.
    pub(super) async fn witnessed_event(&self, id: &str) -> Result<(), String> {
        let Some(w) = &self.witnessing else {
            return Err(
                "this server has no witnesses: set [transparency] witnesses in emisar.toml".into(),
            );
        };
        let deadline = Instant::now() + WAIT;
        loop {
            match audit::proofs::prove(&w.db, id, w.quorum).await {
                Ok(_) => return Ok(()),
                Err(e) if Instant::now() >= deadline => {
                    return Err(format!(
                        "it was not witnessed within {} s ({e}): nothing ran",
                        WAIT.as_secs()
                    ));
                }
                Err(_) => tokio::time::sleep(POLL).await,
            }
        }
    }
}
