//! The single audit writer: one task appends every event of this process, batching whatever
//! arrived together into one transaction (group commit).
//!
//! Invariant: `append` returns `Ok` only after the event's transaction committed. A caller
//! that gets an error must treat the event as not written (the gateway then runs nothing).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::chain::{Event, NewEvent};
use super::store;
use crate::server::db::Db;

/// How many events one transaction may carry.
const MAX_BATCH: usize = 256;
/// How many appends may wait for the writer before callers are refused.
const QUEUE_DEPTH: usize = 4096;
/// The longest a caller waits for its event to become durable.
const APPEND_DEADLINE: Duration = Duration::from_secs(10);

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

type Reply = oneshot::Sender<Result<Event, AuditError>>;
/// An event waiting for the writer, with when it was handed over (for the lag metric).
type Queued = (NewEvent, Reply, std::time::Instant);

/// A handle to the writer task. Cheap to clone.
#[derive(Clone, Debug)]
pub struct AuditLog {
    tx: mpsc::Sender<Queued>,
    health: Arc<Mutex<Option<String>>>,
}

impl AuditLog {
    /// Starts the writer task on the current runtime. It ends when every handle is dropped.
    pub fn start(db: Db) -> AuditLog {
        let (tx, rx) = mpsc::channel(QUEUE_DEPTH);
        let health = Arc::new(Mutex::new(None));
        tokio::spawn(run(db, rx, health.clone()));
        AuditLog { tx, health }
    }

    /// `None` when the last batch was written; otherwise why it was not. Also degraded when
    /// the queue is more than half full or the writer is gone.
    pub fn problem(&self) -> Option<String> {
        if self.tx.is_closed() {
            return Some("the audit writer is not running".into());
        }
        let queued = QUEUE_DEPTH - self.tx.capacity();
        if queued > QUEUE_DEPTH / 2 {
            return Some(format!("the audit queue holds {queued} events"));
        }
        self.health
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Appends one event and waits until it is durable.
    pub async fn append(&self, event: NewEvent) -> Result<Event, AuditError> {
        let (reply, wait) = oneshot::channel();
        self.tx
            .try_send((event, reply, std::time::Instant::now()))
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

async fn run(db: Db, mut rx: mpsc::Receiver<Queued>, health: Arc<Mutex<Option<String>>>) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while rx.recv_many(&mut batch, MAX_BATCH).await > 0 {
        let mut events = Vec::with_capacity(batch.len());
        let mut replies = Vec::with_capacity(batch.len());
        let oldest = batch.first().map(|(_, _, at)| *at);
        for (event, reply, _) in batch.drain(..) {
            events.push(event);
            replies.push(reply);
        }
        let size = events.len();
        let started = std::time::Instant::now();
        let result = store::append_batch(&db, events).await;
        crate::server::metrics::audit_batch(size, started.elapsed().as_secs_f64(), result.is_ok());
        if let Some(oldest) = oldest {
            crate::server::metrics::audit_lag(oldest.elapsed().as_secs_f64());
        }
        *health.lock().unwrap_or_else(|p| p.into_inner()) = result
            .as_ref()
            .err()
            .map(|e| format!("the last audit batch failed: {e}"));
        match result {
            Ok(sealed) => {
                for (reply, event) in replies.into_iter().zip(sealed) {
                    // The caller may have given up waiting; its event is durable all the same.
                    let _ = reply.send(Ok(event));
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "audit batch not written");
                let err = AuditError::Store(e.to_string());
                for reply in replies {
                    let _ = reply.send(Err(err.clone()));
                }
            }
        }
    }
}
