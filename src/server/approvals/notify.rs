//! Announcements that a request was created or changed: [`Approvals::subscribe`] hands them
//! out on this replica; on PostgreSQL a change also goes out with NOTIFY once it has
//! committed, and a LISTEN task relays the other replicas' changes into the same channel.
//! Only hints: waiters also poll, so a lost one delays an update, never loses it.

use std::time::Duration;

use serde::Serialize;
use tokio::sync::broadcast;

use super::{Approval, Approvals, State, text};
use crate::server::db::{Db, Pool};

/// The PostgreSQL channel that carries approval changes between replicas.
const CHANNEL: &str = "emisar_approvals";

/// An announcement that a request was created or changed.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Changed {
    pub id: String,
    pub state: State,
}

impl Approvals {
    /// Every creation and state change, on this replica and (PostgreSQL) every other.
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<Changed> {
        self.changes.subscribe()
    }

    pub(super) fn announce(&self, row: &Approval) {
        let _ = self.changes.send(Changed {
            id: row.id.clone(),
            state: row.state,
        });
    }
}

/// Tells every replica that `a` changed, once its change has committed.
///
/// Not inside the change's own transaction: PostgreSQL serialises the commits of notifying
/// transactions (each holds a database-wide lock from before its commit record until the
/// end, flush included), so ten approvals clicked at once committed one flush after the
/// other. This statement commits on its own without waiting for its flush
/// (`synchronous_commit` off for it alone): the notification is only a hint, since waiters
/// also poll, and one lost in a crash delays an update without losing it. A failure to send
/// it is logged, never the change's failure.
pub(super) async fn notify_committed(pool: &sqlx::PgPool, a: &Approval) {
    let payload = text(&Changed {
        id: a.id.clone(),
        state: a.state,
    });
    let sent =
        sqlx::query("SELECT set_config('synchronous_commit', 'off', true), pg_notify($1, $2)")
            .bind(CHANNEL)
            .bind(payload)
            .execute(pool)
            .await;
    if let Err(e) = sent {
        tracing::warn!(error = %e, approval_id = %a.id, "could not tell the other replicas of an approval change; they see it when they next poll");
    }
}

/// Relays NOTIFY payloads into the local channel. The connection goes through the store's
/// gate like every other: during an outage it waits for the gate to reopen instead of
/// reconnecting on its own. Waiters also poll, so a gap delays an update but never loses one.
pub(super) async fn listen(
    db: Db,
    changes: broadcast::Sender<Changed>,
    shutdown: tokio_util::sync::CancellationToken,
) {
    let Pool::Pg(pool) = db.pool().clone() else {
        return;
    };
    let backoff =
        crate::util::Backoff::try_new(Duration::from_millis(200), Duration::from_secs(30))
            .expect("valid bounds");
    let mut failures = 0u32;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = db.until_up() => {}
        }
        let attempt = async {
            let mut listener = sqlx::postgres::PgListener::connect_with(&pool).await?;
            // A lost connection must come back here, not be re-made inside the listener
            // (through the pool's own connect retries, past the gate).
            listener.eager_reconnect(false);
            listener.listen(CHANNEL).await?;
            loop {
                let Some(n) = listener.try_recv().await? else {
                    // Reported as a connection error, so the guard closes the gate.
                    return Err(sqlx::Error::Io(std::io::Error::new(
                        std::io::ErrorKind::ConnectionAborted,
                        "the LISTEN connection was lost",
                    )));
                };
                if let Ok(changed) = serde_json::from_str::<Changed>(n.payload()) {
                    let _ = changes.send(changed);
                }
            }
        };
        let started = std::time::Instant::now();
        tokio::select! {
            _ = shutdown.cancelled() => return,
            result = db.guard::<()>(attempt) => {
                if let Err(e) = result {
                    tracing::warn!(error = %e, "approval change listener lost its connection");
                }
            }
        }
        // A gap between outages (or an error that is not the store being down) still backs
        // off, so a listener that keeps failing never spins.
        if started.elapsed() > Duration::from_secs(60) {
            failures = 0;
        }
        failures = failures.saturating_add(1);
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(backoff.delay(failures)) => {}
        }
    }
}
