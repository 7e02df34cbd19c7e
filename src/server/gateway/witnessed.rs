//! Witnessed approvals, the server's half: an approved execution bound for a runner with
//! `require_witnessed` first waits until a checkpoint cosigned by the witness quorum covers
//! the approval's `approval.approved` event, then carries that event with its inclusion proof
//! (`protocol::witnessed`). The runner checks it against its own keys; nothing here is trusted
//! by it. A break-glass call waits the same way for its `grant.used`, and there the server is
//! the only check: it counts a checkpoint as witnessed only once the log's signature, the
//! quorum's cosignatures (against the witness keys of its own config) and the inclusion proof
//! all verify ([`verify_included`]), never because cosignature rows are in its database (red
//! team 6: a database writer's copied rows let an unwitnessed call run).

use std::time::{Duration, Instant};

use crate::protocol::witnessed::{WitnessTrust, WitnessedApproval, verify_included};
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
    /// The log's verifier key and the configured witnesses' keys, with the quorum.
    trust: WitnessTrust,
}

impl Witnessing {
    pub(crate) fn new(db: Db, trust: WitnessTrust) -> Self {
        Witnessing { db, trust }
    }

    /// The proof that event `id` is in a checkpoint the quorum cosigned, verified; waits for
    /// one up to [`WAIT`]. A proof that does not verify (a cosignature row that is not a
    /// witness's signature over that checkpoint) counts as none.
    async fn proven(&self, id: &str) -> Result<audit::proofs::InclusionProof, String> {
        let deadline = Instant::now() + WAIT;
        loop {
            let found = audit::proofs::prove(&self.db, id, self.trust.quorum)
                .await
                .map_err(|e| e.to_string())
                .and_then(|p| {
                    verify_included(&p.event, &p.checkpoint, &p.proof, &self.trust)
                        .map(|_| p)
                        .map_err(|e| format!("its checkpoint does not verify: {e}"))
                });
            match found {
                Ok(p) => return Ok(p),
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
        let p = w
            .proven(&event.id)
            .await
            .map_err(|e| format!("the approval: {e}"))?;
        Ok(WitnessedApproval {
            event: p.event,
            checkpoint: p.checkpoint,
            proof: p.proof,
        })
    }

    /// Waits up to [`WAIT`] until event `id` is in a checkpoint the witness quorum cosigned
    /// (a break-glass call's `grant.used`); the error says why nothing runs.
    pub(super) async fn witnessed_event(&self, id: &str) -> Result<(), String> {
        let Some(w) = &self.witnessing else {
            return Err(
                "this server has no witnesses: set [transparency] witnesses in emisar.toml".into(),
            );
        };
        w.proven(id).await.map(|_| ())
    }
}
