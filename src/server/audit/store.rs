//! Per-backend SQL of the audit log: append a sealed batch, query with filters, verify.
//!
//! `args` and `detail` are stored as the canonical JSON text that was hashed (TEXT on both
//! backends), and every column is read back as the same text on both (PostgreSQL's
//! TIMESTAMPTZ is formatted in the fixed `at` format), so one hash serves both.
//!
//! Invariants: a batch is appended in one transaction under the append lock (PostgreSQL
//! advisory lock, SQLite `BEGIN IMMEDIATE`): on PostgreSQL one statement, which checks under
//! the lock that the event the batch was chained after is still the last (`PG_APPEND`); its
//! `at` is `max(now, at of that last event)`, so `at` never decreases along `seq`, whichever
//! replica writes and whatever its clock does. Time filters rely on that.

use std::time::Instant;

use serde_json::Value;
use sqlx::pool::PoolConnection;
use sqlx::{AssertSqlSafe, Postgres};

use super::chain::{Event, EventText, GENESIS_HASH, NewEvent, format_at, hash_v};
use super::lock::PG_BEGIN_LOCKED;
use super::tree::{self, NewNodes};
use crate::digest::canonical_json;
use crate::server::db::{self, Db, Pool};
use crate::tlog::tree::Frontier;
use crate::with_pool;

/// `at` as the fixed-width text that is hashed (TIMESTAMPTZ keeps microseconds, so this is
/// exactly the text that was written).
pub(super) const PG_AT: &str =
    "to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')";
const PG_COLUMNS: &str = "seq, id, to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') AS at, actor, kind, tool, runner, args, reason, call_id, approval_id, outcome, result_digest, detail, prev_hash, hash, hash_v";
/// The columns as stored: what SQLite reads, and what `audit verify` reads on PostgreSQL too
/// (as binary COPY, `at` as the stored timestamp, formatted by the verifier). `to_char` on
/// every row cost PostgreSQL ~1.8 s of CPU per 1,000,000 events, most of what it spent
/// producing them (EXPLAIN ANALYZE of the whole scan: 2.4 s with it, 0.65 s without).
pub(super) const STORED_COLUMNS: &str = "seq, id, at, actor, kind, tool, runner, args, reason, call_id, approval_id, outcome, result_digest, detail, prev_hash, hash, hash_v";
/// The names of [`STORED_COLUMNS`], in order: the one list the verifier's column positions and
/// `audit export`'s CSV header are read from (a test in `verify.rs` holds the two to each other).
pub const COLUMNS: [&str; 17] = [
    "seq",
    "id",
    "at",
    "actor",
    "kind",
    "tool",
    "runner",
    "args",
    "reason",
    "call_id",
    "approval_id",
    "outcome",
    "result_digest",
    "detail",
    "prev_hash",
    "hash",
    "hash_v",
];

/// One statement per batch, in one round trip: the function (migration
/// `20261204150001_audit_append_function.sql`) takes the append lock, checks that the last
/// event is still `$21` (seq) with hash `$22` when they are given, and inserts the events and
/// the tree nodes they complete (`$18`–`$20`: levels, indexes, hashes); it returns false,
/// having inserted nothing, when another replica appended in between. The batch shares one
/// `at`, bound once; every other column is an array, one element per event (a round trip per
/// event was what bounded the append rate; a second statement for the tree cost 10–20 % of
/// it).
const PG_APPEND: &str = "SELECT emisar_audit_append($1::bigint[], $2::text[], $3::timestamptz, $4::text[], $5::text[], $6::text[], $7::text[], $8::text[], $9::text[], $10::text[], $11::text[], $12::text[], $13::text[], $14::text[], $15::text[], $16::text[], $17::smallint, $18::smallint[], $19::bigint[], $20::bytea[], $21::bigint, $22::text)";
const SQLITE_INSERT: &str = "INSERT INTO audit_events (seq, id, at, actor, kind, tool, runner, args, reason, call_id, approval_id, outcome, result_digest, detail, prev_hash, hash, hash_v) VALUES ";
/// Rows per SQLite INSERT: 17 parameters each stays well under SQLite's 32,766 limit.
const SQLITE_ROWS_PER_INSERT: usize = 500;

const PG_LAST: &str = "SELECT seq, hash, to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') FROM audit_events ORDER BY seq DESC LIMIT 1";
const SQLITE_LAST: &str = "SELECT seq, hash, at FROM audit_events ORDER BY seq DESC LIMIT 1";

#[derive(sqlx::FromRow)]
struct Row {
    seq: i64,
    id: String,
    at: String,
    actor: String,
    kind: String,
    tool: Option<String>,
    runner: Option<String>,
    args: Option<String>,
    reason: Option<String>,
    call_id: Option<String>,
    approval_id: Option<String>,
    outcome: Option<String>,
    result_digest: Option<String>,
    detail: Option<String>,
    prev_hash: String,
    hash: String,
    hash_v: i16,
}

impl Row {
    fn into_event(self) -> Result<Event, sqlx::Error> {
        let json = |s: Option<String>| -> Result<Option<Value>, sqlx::Error> {
            s.map(|s| serde_json::from_str(&s))
                .transpose()
                .map_err(|e| sqlx::Error::Decode(Box::new(e)))
        };
        Ok(Event {
            seq: self.seq,
            id: self.id,
            at: self.at,
            actor: self.actor,
            kind: self.kind,
            tool: self.tool,
            runner: self.runner,
            args: json(self.args)?,
            reason: self.reason,
            call_id: self.call_id,
            approval_id: self.approval_id,
            outcome: self.outcome,
            result_digest: self.result_digest,
            detail: json(self.detail)?,
            prev_hash: self.prev_hash,
            hash: self.hash,
            hash_v: self.hash_v,
        })
    }
}

/// What the chain assigned to one appended event.
#[derive(Debug, Clone)]
pub(super) struct Receipt {
    pub seq: i64,
    pub id: String,
    pub at: String,
    pub prev_hash: String,
    pub hash: String,
}

impl Receipt {
    pub(crate) fn into_event(self, new: NewEvent) -> Event {
        Event::from_new(new, self.seq, self.id, self.at, self.prev_hash, self.hash)
    }
}

/// An event ready to be chained: its JSON columns already in their stored text.
struct Prepared<'a> {
    new: &'a NewEvent,
    args: Option<String>,
    detail: Option<String>,
}

/// Chains `batch` after the last event (`last`: its seq, hash and at) at time `now`: the seq,
/// id, `at` and hashes of each event, in order.
fn chain_after(last: Option<Tip>, now: String, batch: &[Prepared<'_>]) -> Vec<Receipt> {
    let (mut seq, mut prev, last_at) = last.unwrap_or((0, GENESIS_HASH.to_owned(), String::new()));
    // `at` text is fixed width, so text order is time order.
    let at = if now < last_at { last_at } else { now };
    let mut scratch = Vec::with_capacity(1024);
    batch
        .iter()
        .map(|p| {
            seq += 1;
            // Time-ordered (UUIDv7: 48 bits of milliseconds, then 74 random bits), so each new
            // id lands at the right edge of the unique index on `id`, as call ids do in theirs,
            // instead of on a random page of an index of a million: fewer pages touched and
            // written per append, under the append lock.
            let id = uuid::Uuid::now_v7().to_string();
            let new = p.new;
            let hash = hex::encode(
                EventText {
                    seq,
                    id: &id,
                    at: &at,
                    actor: &new.actor,
                    kind: &new.kind,
                    tool: new.tool.as_deref(),
                    runner: new.runner.as_deref(),
                    args: p.args.as_deref(),
                    reason: new.reason.as_deref(),
                    call_id: new.call_id.as_deref(),
                    approval_id: new.approval_id.as_deref(),
                    outcome: new.outcome.as_deref(),
                    result_digest: new.result_digest.as_deref(),
                    detail: p.detail.as_deref(),
                    prev_hash: &prev,
                }
                .hash(&mut scratch),
            );
            Receipt {
                seq,
                id,
                at: at.clone(),
                prev_hash: std::mem::replace(&mut prev, hash.clone()),
                hash,
            }
        })
        .collect()
}

/// The last event: its seq, hash and `at`.
type Tip = (i64, String, String);

/// The last event a process appended, and the tree's right edge after it.
#[derive(Debug, Clone)]
pub(super) struct Head {
    tip: Tip,
    tree: Frontier,
}

impl Head {
    /// The last event's seq: the tree's size.
    pub(crate) fn seq(&self) -> i64 {
        self.tip.0
    }
}

/// A chained batch: the events' receipts, the subtrees they complete, and the tree after them.
struct Chained {
    receipts: Vec<Receipt>,
    nodes: NewNodes,
    tree: Frontier,
}

/// Chains `batch` after `last` and grows `tree` (the tree of `last`'s seq leaves) with it.
fn chain_and_grow(
    last: Option<Tip>,
    mut tree: Frontier,
    now: String,
    batch: &[Prepared<'_>],
) -> Result<Chained, sqlx::Error> {
    let receipts = chain_after(last, now, batch);
    let mut nodes = NewNodes::with_capacity(batch.len() * 2);
    tree::grow(
        &mut tree,
        receipts.iter().map(|r| r.hash.as_str()),
        &mut nodes,
    )?;
    Ok(Chained {
        receipts,
        nodes,
        tree,
    })
}

/// Appends `batch` in one transaction, chained after the current last event. All or nothing.
///
/// `head` is the last event this process appended (the writer keeps it; `None` when unknown).
/// On PostgreSQL the batch is first chained after it and appended, in one statement of its
/// own (an implicit transaction: one round trip, committed when it ends, the append lock held
/// only while it runs), only if that is still the last event. If another replica appended
/// since, the last event is read and the batch chained again, in a transaction holding the
/// lock. `head` is updated on commit and forgotten on any failure.
///
/// A statement the server stops waiting for (the store went down, the connection broke) may
/// still have committed, as a `COMMIT` whose answer was lost may have: the caller then treats
/// the batch as not recorded (a read's result is withheld) although the log may hold it: the
/// log can hold more than the agents read, never less.
pub(super) async fn append_batch(
    db: &Db,
    held: &mut Held,
    batch: &[NewEvent],
    head: &mut Option<Head>,
) -> Result<Vec<Receipt>, sqlx::Error> {
    let chained = append_after(db, held, batch, head.take()).await?;
    *head = chained.receipts.last().map(|r| Head {
        tip: (r.seq, r.hash.clone(), r.at.clone()),
        tree: chained.tree.clone(),
    });
    Ok(chained.receipts)
}

/// The writer's PostgreSQL connection between two batches that follow each other closely.
///
/// sqlx tests every connection given back to its pool with a round trip (a `Sync` and its
/// `ReadyForQuery`: sqlx-core's `return_to_pool` always pings), so a writer that took a
/// connection for each batch paid a second round trip, and woke PostgreSQL a second time,
/// per batch. The writer keeps the connection of a batch that succeeded for the next one
/// instead, for at most [`db::PING_IDLE`]: one idle longer goes back to the pool (which pings
/// it before anyone uses it again), as does one whose statement failed.
#[derive(Default)]
pub(super) struct Held(Option<(PoolConnection<Postgres>, Instant)>);

impl Held {
    /// The connection kept from the last batch, if it was used within [`db::PING_IDLE`].
    fn take_recent(&mut self) -> Option<PoolConnection<Postgres>> {
        self.0
            .take()
            .filter(|(_, used)| used.elapsed() <= db::PING_IDLE)
            .map(|(conn, _)| conn)
    }

    fn keep(&mut self, conn: PoolConnection<Postgres>) {
        self.0 = Some((conn, Instant::now()));
    }

    /// Whether a connection is kept.
    pub(super) fn is_held(&self) -> bool {
        self.0.is_some()
    }

    /// Gives the kept connection back to the pool.
    pub(super) fn release(&mut self) {
        self.0 = None;
    }
}

async fn append_after(
    db: &Db,
    held: &mut Held,
    batch: &[NewEvent],
    head: Option<Head>,
) -> Result<Chained, sqlx::Error> {
    // Everything that does not depend on the chain is done before taking the lock.
    let prepared: Vec<Prepared<'_>> = batch
        .iter()
        .map(|new| Prepared {
            new,
            args: new.args.as_ref().map(canonical_json),
            detail: new.detail.as_ref().map(canonical_json),
        })
        .collect();
    db.guard(async {
        match db.pool() {
            Pool::Pg(pool) => {
                let now = format_at(chrono::Utc::now());
                if let Some(Head { tip, tree }) = head {
                    let (seq, hash) = (tip.0, tip.1.clone());
                    let chained = chain_and_grow(Some(tip), tree, now.clone(), &prepared)?;
                    let mut conn = match held.take_recent() {
                        Some(conn) => conn,
                        None => pool.acquire().await?,
                    };
                    let after = Some((seq, hash.as_str()));
                    // On an error `conn` is dropped here: back to the pool, which tests it.
                    let appended = pg_append(&mut *conn, &prepared, &chained, after).await?;
                    held.keep(conn);
                    if appended {
                        return Ok(chained);
                    }
                }
                let mut tx = pool.begin_with(PG_BEGIN_LOCKED).await?;
                let result = async {
                    let last: Option<Tip> =
                        sqlx::query_as(PG_LAST).fetch_optional(&mut *tx).await?;
                    let tree =
                        tree::pg_fold(&mut tx, last.as_ref().map_or(0, |l| l.0 as u64)).await?;
                    let chained = chain_and_grow(last, tree, now, &prepared)?;
                    pg_append(&mut *tx, &prepared, &chained, None).await?;
                    Ok::<_, sqlx::Error>(chained)
                }
                .await;
                finish(tx, result).await
            }
            Pool::Sqlite(pool) => {
                // IMMEDIATE takes the write lock up front, so reading the last hash and
                // appending after it cannot interleave with another writer.
                let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
                let result = async {
                    let last: Option<Tip> =
                        sqlx::query_as(SQLITE_LAST).fetch_optional(&mut *tx).await?;
                    // SQLite has one process writing, but not necessarily this one: the tree
                    // edge is read back each time (a local read, no round trip).
                    let tree =
                        tree::sqlite_fold(&mut tx, last.as_ref().map_or(0, |l| l.0 as u64)).await?;
                    let now = format_at(chrono::Utc::now());
                    let chained = chain_and_grow(last, tree, now, &prepared)?;
                    sqlite_insert(&mut tx, &prepared, &chained.receipts).await?;
                    tree::sqlite_insert_nodes(&mut tx, &chained.nodes).await?;
                    Ok::<_, sqlx::Error>(chained)
                }
                .await;
                finish(tx, result).await
            }
        }
    })
    .await
}

/// Commits on success; on failure rolls back at once, so that the append lock a refused
/// batch holds is released now, not whenever its connection is next used.
async fn finish<DB: sqlx::Database, T>(
    tx: sqlx::Transaction<'_, DB>,
    result: Result<T, sqlx::Error>,
) -> Result<T, sqlx::Error> {
    match result {
        Ok(v) => {
            tx.commit().await?;
            Ok(v)
        }
        Err(e) => {
            let _ = tx.rollback().await;
            Err(e)
        }
    }
}

/// Appends the chained batch's events and tree nodes ([`PG_APPEND`]); with `after` (seq,
/// hash), only if that is still the last event. `false` when it was not (nothing inserted).
async fn pg_append<'e>(
    db: impl sqlx::PgExecutor<'e>,
    batch: &[Prepared<'_>],
    chained: &Chained,
    after: Option<(i64, &str)>,
) -> Result<bool, sqlx::Error> {
    let receipts = &chained.receipts;
    fn text<'a>(
        batch: &'a [Prepared<'a>],
        f: impl Fn(&'a Prepared<'a>) -> Option<&'a str>,
    ) -> Vec<Option<&'a str>> {
        batch.iter().map(f).collect()
    }
    let at = receipts.first().map_or("", |r| r.at.as_str());
    sqlx::query_scalar(PG_APPEND)
        .bind(receipts.iter().map(|r| r.seq).collect::<Vec<_>>())
        .bind(receipts.iter().map(|r| r.id.as_str()).collect::<Vec<_>>())
        .bind(at)
        .bind(
            batch
                .iter()
                .map(|p| p.new.actor.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(
            batch
                .iter()
                .map(|p| p.new.kind.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(text(batch, |p| p.new.tool.as_deref()))
        .bind(text(batch, |p| p.new.runner.as_deref()))
        .bind(text(batch, |p| p.args.as_deref()))
        .bind(text(batch, |p| p.new.reason.as_deref()))
        .bind(text(batch, |p| p.new.call_id.as_deref()))
        .bind(text(batch, |p| p.new.approval_id.as_deref()))
        .bind(text(batch, |p| p.new.outcome.as_deref()))
        .bind(text(batch, |p| p.new.result_digest.as_deref()))
        .bind(text(batch, |p| p.detail.as_deref()))
        .bind(
            receipts
                .iter()
                .map(|r| r.prev_hash.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(receipts.iter().map(|r| r.hash.as_str()).collect::<Vec<_>>())
        .bind(hash_v::TEXT)
        .bind(&chained.nodes.levels)
        .bind(&chained.nodes.indexes)
        .bind(&chained.nodes.hashes)
        .bind(after.map(|(seq, _)| seq))
        .bind(after.map(|(_, hash)| hash))
        .fetch_one(db)
        .await
}

async fn sqlite_insert(
    tx: &mut sqlx::SqliteConnection,
    batch: &[Prepared<'_>],
    receipts: &[Receipt],
) -> Result<(), sqlx::Error> {
    for (rows, receipts) in batch
        .chunks(SQLITE_ROWS_PER_INSERT)
        .zip(receipts.chunks(SQLITE_ROWS_PER_INSERT))
    {
        let one = format!(
            "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, {})",
            hash_v::TEXT
        );
        let sql = format!("{SQLITE_INSERT}{}", vec![one; rows.len()].join(", "));
        // Only placeholders and a constant are formatted into the SQL; every value is bound.
        let mut q = sqlx::query(AssertSqlSafe(sql));
        for (p, r) in rows.iter().zip(receipts) {
            let new = p.new;
            q = q
                .bind(r.seq)
                .bind(&r.id)
                .bind(&r.at)
                .bind(&new.actor)
                .bind(&new.kind)
                .bind(&new.tool)
                .bind(&new.runner)
                .bind(&p.args)
                .bind(&new.reason)
                .bind(&new.call_id)
                .bind(&new.approval_id)
                .bind(&new.outcome)
                .bind(&new.result_digest)
                .bind(&p.detail)
                .bind(&r.prev_hash)
                .bind(&r.hash);
        }
        q.execute(&mut *tx).await?;
    }
    Ok(())
}

/// Filters of `emisar audit query` and `GET /api/audit`. Every filter is optional.
#[derive(Debug, Clone, Default)]
pub struct AuditFilter {
    pub tool: Option<String>,
    pub runner: Option<String>,
    pub actor: Option<String>,
    pub kind: Option<String>,
    pub call_id: Option<String>,
    pub approval_id: Option<String>,
    pub outcome: Option<String>,
    /// Events at or after this time.
    pub since: Option<chrono::DateTime<chrono::Utc>>,
    /// Events before this time.
    pub until: Option<chrono::DateTime<chrono::Utc>>,
    /// Events with a larger seq than this (a cursor).
    pub after_seq: Option<i64>,
    pub limit: i64,
}

/// Events matching `filter`, oldest first.
pub async fn query(db: &Db, filter: &AuditFilter) -> Result<Vec<Event>, sqlx::Error> {
    let pg = db.is_postgres();
    let mut clauses = Vec::new();
    let mut binds: Vec<String> = Vec::new();
    let mut text_filter = |column: &str, value: &Option<String>| {
        if let Some(v) = value {
            binds.push(v.clone());
            clauses.push(format!("{column} = ${}", binds.len()));
        }
    };
    text_filter("tool", &filter.tool);
    text_filter("runner", &filter.runner);
    text_filter("actor", &filter.actor);
    text_filter("kind", &filter.kind);
    text_filter("call_id", &filter.call_id);
    text_filter("approval_id", &filter.approval_id);
    text_filter("outcome", &filter.outcome);
    // Time bounds become seq bounds: the first event at or after the time, found through the
    // `at` index. Exact because `at` never decreases along `seq`. Filtering on `at` itself
    // made the planner walk the primary key from seq 1 (it assumes matching rows are spread
    // evenly, while in a log they all sit at the end), reading the whole log up to `since`;
    // keeping the `at` predicates next to the seq bounds makes it combine both indexes and
    // sort the whole window.
    let cast = if pg { "::timestamptz" } else { "" };
    let first_seq_at = |n: usize| {
        format!("(SELECT seq FROM audit_events WHERE at >= ${n}{cast} ORDER BY at, seq LIMIT 1)")
    };
    if let Some(since) = filter.since {
        binds.push(format_at(since));
        clauses.push(format!("seq >= {}", first_seq_at(binds.len())));
    }
    if let Some(until) = filter.until {
        binds.push(format_at(until));
        clauses.push(format!(
            "seq < COALESCE({}, {})",
            first_seq_at(binds.len()),
            i64::MAX
        ));
    }
    let after = filter.after_seq.unwrap_or(0);
    clauses.push(format!("seq > {after}"));
    let columns = if pg { PG_COLUMNS } else { STORED_COLUMNS };
    // Only placeholders and integers are formatted into the SQL; every value is bound.
    let sql = format!(
        "SELECT {columns} FROM audit_events WHERE {} ORDER BY seq LIMIT {}",
        clauses.join(" AND "),
        filter.limit.clamp(1, 10_000)
    );
    let rows: Vec<Row> = db
        .guard(async {
            with_pool!(db, pool => {
                let mut q = sqlx::query_as::<_, Row>(AssertSqlSafe(sql));
                for b in &binds {
                    q = q.bind(b);
                }
                q.fetch_all(pool).await
            })
        })
        .await?;
    rows.into_iter().map(Row::into_event).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_append_transaction_takes_the_append_lock() {
        let key = i64::from_be_bytes(*b"\0\0emisar");
        assert_eq!(key, 0x656d_6973_6172);
        assert_eq!(
            PG_BEGIN_LOCKED,
            format!("BEGIN; SELECT pg_advisory_xact_lock({key})")
        );
    }

    /// The append function, which every append in the common case runs, takes the same lock
    /// as the transactions that read the last event first and fold the tree.
    #[test]
    fn the_append_function_takes_the_append_lock() {
        let function =
            include_str!("../../../migrations/postgres/20261204150001_audit_append_function.sql");
        let lock = PG_BEGIN_LOCKED.trim_start_matches("BEGIN; SELECT ");
        assert!(
            function.contains(&format!("PERFORM {lock};")),
            "the append function does not take `{lock}`"
        );
        assert!(PG_APPEND.starts_with("SELECT emisar_audit_append("));
    }
}
