//! Heartbeats written together: each heartbeat is authenticated by the statement that records
//! it (`UPDATE runners SET last_heartbeat … WHERE runner_token_hash … RETURNING name`), and
//! the heartbeats that arrive within [`WINDOW`] of each other share one such statement.
//!
//! A fleet of 1,000 runners sends 50 heartbeats a second (`super::heartbeat_interval`). One
//! statement each was a database round trip per heartbeat on the server, and most of
//! PostgreSQL's CPU while the fleet idled; together they are about five a second, whatever
//! the fleet's size. This is a group commit: no heartbeat is answered before the statement
//! that recorded it has committed, and each is still checked against the table (a runner
//! removed on any replica is refused at its next heartbeat, not after a cache expires).
//! A heartbeat's answer waits up to [`WINDOW`] longer; nothing waits on it but the runner's
//! background task.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::FleetError;
use crate::server::audit::format_at;
use crate::server::db::Db;
use crate::with_pool;

/// How long the first heartbeat of a batch waits for others to join it.
pub(super) const WINDOW: Duration = Duration::from_millis(200);
/// The most heartbeats one statement records (a fleet at 50 a second fills a tenth of it).
const MAX_BATCH: usize = 1_000;
/// Heartbeats waiting for the writer; beyond it a heartbeat waits for room.
const QUEUE: usize = 4 * MAX_BATCH;

const PG_WRITE: &str = "UPDATE runners SET last_heartbeat = $2::timestamptz WHERE runner_token_hash IN (SELECT jsonb_array_elements_text($1::jsonb)) RETURNING runner_token_hash, name";
const SQLITE_WRITE: &str = "UPDATE runners SET last_heartbeat = $2 WHERE runner_token_hash IN (SELECT value FROM json_each($1)) RETURNING runner_token_hash, name";

/// One heartbeat waiting to be written: the hash of its credential, and where its runner's
/// name goes (`None`: no runner has that credential).
struct Beat {
    hash: String,
    answer: oneshot::Sender<Result<Option<String>, String>>,
}

/// The heartbeat writer of one server: a task, started by the first heartbeat, that writes
/// each batch with one statement.
pub(super) struct Heartbeats {
    db: Db,
    queue: OnceLock<mpsc::Sender<Beat>>,
    /// Statements written so far (what the tests count).
    writes: Arc<std::sync::atomic::AtomicU64>,
}

impl Heartbeats {
    pub(super) fn new(db: Db) -> Self {
        Heartbeats {
            db,
            queue: OnceLock::new(),
            writes: Arc::default(),
        }
    }

    /// Records a heartbeat from the runner whose credential hashes to `hash`, and answers
    /// that runner's name once the statement that recorded it committed; `None` when no
    /// runner has that credential.
    pub(super) async fn beat(&self, hash: String) -> Result<Option<String>, FleetError> {
        let queue = self.queue.get_or_init(|| {
            let (tx, rx) = mpsc::channel(QUEUE);
            tokio::spawn(write_batches(self.db.clone(), rx, self.writes.clone()));
            tx
        });
        let (answer, answered) = oneshot::channel();
        let lost = || FleetError::Store(store_error("the heartbeat writer stopped"));
        queue
            .send(Beat { hash, answer })
            .await
            .map_err(|_| lost())?;
        answered
            .await
            .map_err(|_| lost())?
            .map_err(|e| FleetError::Store(store_error(&e)))
    }

    #[cfg(test)]
    pub(super) fn writes(&self) -> u64 {
        self.writes.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// The store's failure as each heartbeat of a failed batch reports it (one error, many
/// waiters: its text is what they share).
fn store_error(message: &str) -> sqlx::Error {
    sqlx::Error::Io(std::io::Error::other(message.to_owned()))
}

/// Until every sender is gone: takes the first heartbeat waiting, those that arrive within
/// [`WINDOW`] after it (at most [`MAX_BATCH`]), writes them with one statement, and answers
/// each.
async fn write_batches(
    db: Db,
    mut rx: mpsc::Receiver<Beat>,
    writes: Arc<std::sync::atomic::AtomicU64>,
) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while rx.recv_many(&mut batch, MAX_BATCH).await > 0 {
        let closes = tokio::time::Instant::now() + WINDOW;
        while batch.len() < MAX_BATCH {
            let room = MAX_BATCH - batch.len();
            tokio::select! {
                n = rx.recv_many(&mut batch, room) => if n == 0 { break },
                _ = tokio::time::sleep_until(closes) => break,
            }
        }
        let hashes: Vec<&str> = batch.iter().map(|b| b.hash.as_str()).collect();
        let written = write(&db, &hashes).await.map_err(|e| e.to_string());
        writes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if let Err(e) = &written {
            tracing::warn!(error = %e, heartbeats = batch.len(), "could not record heartbeats");
        }
        for beat in batch.drain(..) {
            let named = written.as_ref().map(|names| names.get(&beat.hash).cloned());
            // A runner that hung up meanwhile has no one to tell.
            let _ = beat.answer.send(named.map_err(Clone::clone));
        }
    }
}

/// Sets `last_heartbeat` to now for the runners whose credentials hash to `hashes`, in one
/// statement: each hash that matched, with its runner's name.
async fn write(db: &Db, hashes: &[&str]) -> Result<HashMap<String, String>, sqlx::Error> {
    let now = format_at(chrono::Utc::now());
    let hashes = serde_json::to_string(hashes).expect("strings serialize");
    let sql = db.sql(if db.is_postgres() {
        PG_WRITE
    } else {
        SQLITE_WRITE
    });
    let rows: Vec<(String, String)> = db
        .guard(async {
            with_pool!(db, pool => sqlx::query_as(sql).bind(&hashes).bind(&now).fetch_all(pool).await)
        })
        .await?;
    Ok(rows.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Heartbeats sent together are recorded by one statement, and each is answered for
    /// its own credential: a known one with its runner's name, an unknown one with none.
    #[tokio::test]
    async fn heartbeats_sent_together_share_one_statement_and_each_gets_its_own_answer() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("emisar.db").display());
        let (db, _) = Db::connect_and_migrate(&url).await.unwrap();
        for (name, hash) in [("edge-1", "h1"), ("edge-2", "h2"), ("edge-3", "h3")] {
            with_pool!(&db, pool => sqlx::query("INSERT INTO runners (name, url, labels, packs, runner_token_hash, joined_at) VALUES ($1, 'https://10.0.0.1:7701', '{}', '{}', $2, '2026-01-01T00:00:00.000000Z')")
                .bind(name).bind(hash).execute(pool).await.map(|_| ()))
            .unwrap();
        }
        let heartbeats = Heartbeats::new(db.clone());
        // Thirty sent together: all are queued in the first poll, before the window the first
        // one opens can close, however slow the machine (no clock decides the count).
        let sent: Vec<&str> = ["h1", "h2", "unknown", "h3", "h1"].repeat(6);
        let answers =
            futures::future::join_all(sent.iter().map(|h| heartbeats.beat((*h).into()))).await;
        for (hash, answer) in sent.iter().zip(answers) {
            let expected = match *hash {
                "h1" => Some("edge-1"),
                "h2" => Some("edge-2"),
                "h3" => Some("edge-3"),
                _ => None,
            };
            assert_eq!(answer.unwrap().as_deref(), expected, "{hash}");
        }
        assert_eq!(
            heartbeats.writes(),
            1,
            "30 heartbeats within one window, one statement"
        );
        let beaten: Vec<(String,)> = with_pool!(&db, pool => sqlx::query_as("SELECT name FROM runners WHERE last_heartbeat IS NOT NULL ORDER BY name").fetch_all(pool).await).unwrap();
        assert_eq!(beaten.len(), 3, "{beaten:?}");

        // One later, after the window: a statement of its own.
        tokio::time::sleep(WINDOW * 2).await;
        assert_eq!(
            heartbeats.beat("h2".into()).await.unwrap().as_deref(),
            Some("edge-2")
        );
        assert_eq!(heartbeats.writes(), 2);
    }
}
