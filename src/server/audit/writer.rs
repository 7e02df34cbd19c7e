//! The single audit writer: one task appends every event of this process, batching whatever
//! arrived together into one transaction (group commit).
//!
//! Invariant: `append` returns `Ok` only after the event's transaction committed. A caller
//! that gets an error must treat the event as not written (the gateway then runs nothing).
//! The events of one `append_all` go into one transaction, in their order: all or none.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

use super::chain::{Event, NewEvent};
use super::failure_log::{FailureLog, SUMMARY_INTERVAL, Wording};
use super::refusals::{Noted, RefusalCounter, RefusalKey, WINDOW};
use super::store;
use crate::server::db::{Db, PING_IDLE};

/// How many appends one transaction may carry (an append is one event, or the few events of
/// one `append_all`).
const MAX_BATCH: usize = 256;
/// How many appends may wait for the writer before callers are refused.
const QUEUE_DEPTH: usize = 4096;
/// The longest a caller waits for its event to become durable.
const APPEND_DEADLINE: Duration = Duration::from_secs(10);
/// How the writer's failed batches read in the log (`failure_log.rs` decides when).
static BATCHES: Wording = Wording {
    failed: "audit batch not written",
    what: "audit writes",
    units: "batches",
};

#[derive(Debug, Clone, thiserror::Error)]
pub enum AuditError {
    #[error("the audit store refused the write: {0}")]
    Store(String),
    #[error("the audit writer is not running")]
    WriterGone,
    #[error("the audit queue is full")]
    QueueFull,
    #[error("the audit write did not complete within {0:?}")]
    Timeout(Duration),
}

type Reply = oneshot::Sender<Result<Vec<Event>, AuditError>>;

/// Events handed over together: they go into the same transaction, in their order, so they
/// are durable together or not at all, and cost one commit.
struct Queued {
    events: Vec<NewEvent>,
    reply: Reply,
    /// When they were handed over (for the lag metric).
    at: Instant,
}

/// A handle to the writer task. Cheap to clone.
#[derive(Clone, Debug)]
pub struct AuditLog {
    tx: mpsc::Sender<Queued>,
    health: Arc<Mutex<Option<String>>>,
    /// The refusals callers repeat, counted until the window's end (`refusals.rs`); shared
    /// by every handle, so a caller's repeats are counted once whichever part refused them.
    refusals: RefusalCounter,
    /// The seq of the last event this process appended (the checkpointer wakes on it).
    appended: watch::Receiver<i64>,
}

impl AuditLog {
    /// Starts the writer task on the current runtime. It ends when every handle is dropped.
    pub fn start(db: Db) -> AuditLog {
        let (tx, rx) = mpsc::channel(QUEUE_DEPTH);
        let health = Arc::new(Mutex::new(None));
        let (appended_tx, appended) = watch::channel(0);
        tokio::spawn(run(db, rx, health.clone(), appended_tx));
        AuditLog {
            tx,
            health,
            refusals: RefusalCounter::default(),
            appended,
        }
    }

    /// Records a refusal that its caller can repeat at will (a rate-limited or unknown-tool
    /// call, a refused join, a failed login): the first of `key` in the current window is
    /// appended as `event` and waited for; the rest are counted and written as one
    /// `refusal.repeated` event at the window's end (see `refusals.rs`).
    pub(crate) async fn refused(
        &self,
        key: RefusalKey,
        event: NewEvent,
    ) -> Result<Noted, AuditError> {
        let noted = self.refusals.note(key, &event);
        if noted == Noted::First {
            self.append(event).await?;
        }
        Ok(noted)
    }

    /// Ends the refusal window now and writes its aggregates; returns how many refusals they
    /// count. What cannot be written is kept for the next flush.
    pub async fn flush_refusals(&self) -> u64 {
        self.refusals
            .flush(WINDOW, &|events| async move {
                self.append_all(events).await.map(|_| ())
            })
            .await
    }

    /// Flushes the refusal counts at the end of every window, and once more at `shutdown`.
    /// Only the server starts this; a CLI command refuses nothing repeatedly.
    pub(crate) fn spawn_refusal_flusher(&self, shutdown: CancellationToken) {
        let audit = self.clone();
        let refusals = self.refusals.clone();
        tokio::spawn(refusals.run_flusher(WINDOW, shutdown, move |events| {
            let audit = audit.clone();
            async move { audit.append_all(events).await.map(|_| ()) }
        }));
    }

    /// The seq of the last event this process appended, as it changes.
    pub(crate) fn appended(&self) -> watch::Receiver<i64> {
        self.appended.clone()
    }

    /// `None` when the last batch was written; otherwise why it was not. Also degraded when
    /// the queue is more than half full or the writer is gone.
    pub fn problem(&self) -> Option<String> {
        if self.tx.is_closed() {
            return Some("the audit writer is not running".into());
        }
        let queued = QUEUE_DEPTH - self.tx.capacity();
        if queued > QUEUE_DEPTH / 2 {
            return Some(format!("the audit queue holds {queued} appends"));
        }
        self.health
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Appends one event and waits until it is durable.
    pub async fn append(&self, event: NewEvent) -> Result<Event, AuditError> {
        let mut written = self.append_all(vec![event]).await?;
        Ok(written
            .pop()
            .expect("the writer answers one event per event"))
    }

    /// Appends `events` one after the other in one transaction and waits until they are
    /// durable: all of them when this returns `Ok`, none when it returns an error. One commit
    /// instead of one per event (an approval that is also claimed writes two events).
    pub async fn append_all(&self, events: Vec<NewEvent>) -> Result<Vec<Event>, AuditError> {
        if events.is_empty() {
            return Ok(Vec::new());
        }
        let (reply, wait) = oneshot::channel();
        self.tx
            .try_send(Queued {
                events,
                reply,
                at: Instant::now(),
            })
            .map_err(|e| match e {
                mpsc::error::TrySendError::Full(_) => AuditError::QueueFull,
                mpsc::error::TrySendError::Closed(_) => AuditError::WriterGone,
            })?;
        match tokio::time::timeout(APPEND_DEADLINE, wait).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(AuditError::WriterGone),
            Err(_) => Err(AuditError::Timeout(APPEND_DEADLINE)),
        }
    }
}

async fn run(
    db: Db,
    mut rx: mpsc::Receiver<Queued>,
    health: Arc<Mutex<Option<String>>>,
    appended: watch::Sender<i64>,
) {
    let mut queued = Vec::with_capacity(MAX_BATCH);
    let mut failures = FailureLog::new(SUMMARY_INTERVAL);
    // The last event this task appended, so the next batch can be chained after it without
    // reading it back (store::append_batch).
    let mut head = None;
    // A log older than its tree is folded in chunk by chunk before the first append, so that
    // append does not hold the append lock for all of it (`emisar migrate` does it too).
    if let Err(e) = super::tree::fold_all(&db).await {
        tracing::error!(error = %e, "failed to fold the audit log into its Merkle tree; the next append tries again");
    }
    // The connection of the last batch, kept for the next (`store::Held`); given back when no
    // batch follows within `PING_IDLE`, so an idle server holds none.
    let mut held = store::Held::default();
    loop {
        let received = if held.is_held() {
            // `recv_many` is cancel safe: a timeout loses nothing.
            match tokio::time::timeout(PING_IDLE, rx.recv_many(&mut queued, MAX_BATCH)).await {
                Ok(received) => received,
                Err(_) => {
                    held.release();
                    continue;
                }
            }
        } else {
            rx.recv_many(&mut queued, MAX_BATCH).await
        };
        if received == 0 {
            break;
        }
        let oldest = queued.first().map(|q| q.at);
        let appends = queued.len();
        let mut events = Vec::with_capacity(appends);
        // Each append's number of events, to hand each caller back its own receipts.
        let mut groups = Vec::with_capacity(appends);
        let mut replies = Vec::with_capacity(appends);
        for q in queued.drain(..) {
            groups.push(q.events.len());
            events.extend(q.events);
            replies.push(q.reply);
        }
        let size = events.len();
        let started = Instant::now();
        let result = store::append_batch(&db, &mut held, &events, &mut head).await;
        crate::server::metrics::audit_batch(size, started.elapsed().as_secs_f64(), result.is_ok());
        if let Some(oldest) = oldest {
            crate::server::metrics::audit_lag(oldest.elapsed().as_secs_f64());
        }
        let written = match result {
            Ok(receipts) => {
                let mut written = receipts
                    .into_iter()
                    .zip(events)
                    .map(|(receipt, event)| receipt.into_event(event));
                for (reply, n) in replies.into_iter().zip(groups) {
                    // The caller may have given up waiting; its events are durable all the same.
                    let _ = reply.send(Ok(written.by_ref().take(n).collect()));
                }
                Ok(())
            }
            Err(e) if appends > 1 && refused_by_the_database(&e) => {
                // Most likely one event the database cannot store (a NUL byte in a text
                // column, a value too long for an index). Each append is retried in its own
                // transaction, so the poison fails only its own caller and every other
                // caller's events are written and acknowledged.
                tracing::debug!(error = %e, events = size, "audit batch refused; retrying its appends one at a time");
                one_at_a_time(&db, &mut held, &mut head, events, groups, replies).await
            }
            Err(e) => {
                let err = AuditError::Store(e.to_string());
                for reply in replies {
                    let _ = reply.send(Err(err.clone()));
                }
                Err(e.to_string())
            }
        };
        *health.lock().unwrap_or_else(|p| p.into_inner()) = written
            .as_ref()
            .err()
            .map(|e| format!("the last audit batch failed: {e}"));
        let line = match &written {
            Ok(()) => failures.written(Instant::now()),
            Err(_) => failures.failed(Instant::now(), size),
        };
        if let Some(line) = line {
            let error = written.err().unwrap_or_default();
            line.log(&BATCHES, &error);
        }
        if let Some(head) = &head {
            appended.send_replace(head.seq());
        }
    }
}

/// Appends each caller's events (`groups[i]` of them, in order) in their own transaction and
/// answers that caller. `Err` when nothing could be written (the store refuses everything: a
/// full disk, a read-only database) or when the store went away meanwhile; then the outage
/// log speaks for the refusals.
async fn one_at_a_time(
    db: &Db,
    held: &mut store::Held,
    head: &mut Option<store::Head>,
    events: Vec<NewEvent>,
    groups: Vec<usize>,
    replies: Vec<Reply>,
) -> Result<(), String> {
    let mut written = 0;
    let mut refused = Vec::new();
    let mut outage = None;
    let mut events = events.into_iter();
    for (n, reply) in groups.into_iter().zip(replies) {
        let group: Vec<NewEvent> = events.by_ref().take(n).collect();
        let outcome = match store::append_batch(db, held, &group, head).await {
            Ok(receipts) => {
                written += 1;
                Ok(receipts
                    .into_iter()
                    .zip(group)
                    .map(|(receipt, event)| receipt.into_event(event))
                    .collect())
            }
            Err(e) => {
                let message = e.to_string();
                if refused_by_the_database(&e) {
                    for event in group {
                        refused.push((event.actor, event.kind, message.clone()));
                    }
                } else {
                    outage = Some(message.clone());
                }
                Err(AuditError::Store(message))
            }
        };
        let _ = reply.send(outcome);
    }
    if let Some(e) = outage {
        return Err(e);
    }
    if written == 0 {
        return Err(refused.pop().map(|(_, _, e)| e).unwrap_or_default());
    }
    for (actor, kind, error) in refused {
        tracing::error!(
            error,
            actor,
            kind,
            "audit event refused by the database; the other events of its batch were written"
        );
    }
    Ok(())
}

/// The database refused a statement (bad data), as opposed to being unreachable.
fn refused_by_the_database(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(_)) && !crate::server::db::is_connection_error(e)
}
