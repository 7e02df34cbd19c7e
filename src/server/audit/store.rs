//! Per-backend SQL of the audit log: append a sealed batch, query with filters, verify.
//!
//! Both backends hand back the same text for every column (PostgreSQL's JSONB and TIMESTAMPTZ
//! are cast to text in a fixed format), so one row type and one hash serve both.

use futures::TryStreamExt;
use serde_json::Value;
use sqlx::AssertSqlSafe;

use super::chain::{Event, GENESIS_HASH, NewEvent, Verifier, VerifyReport, format_at};
use crate::server::db::{Db, Pool};
use crate::with_pool;

/// An advisory lock key that serializes appends across every `emisar serve` replica.
const PG_AUDIT_LOCK: i64 = 0x656d_6973_6172; // "emisar"

const PG_COLUMNS: &str = "seq, id, to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') AS at, actor, kind, tool, runner, args::text AS args, reason, call_id, approval_id, outcome, result_digest, detail::text AS detail, prev_hash, hash";
const SQLITE_COLUMNS: &str = "seq, id, at, actor, kind, tool, runner, args, reason, call_id, approval_id, outcome, result_digest, detail, prev_hash, hash";

const PG_INSERT: &str = "INSERT INTO audit_events (seq, id, at, actor, kind, tool, runner, args, reason, call_id, approval_id, outcome, result_digest, detail, prev_hash, hash) VALUES ($1, $2, $3::timestamptz, $4, $5, $6, $7, $8::jsonb, $9, $10, $11, $12, $13, $14::jsonb, $15, $16)";
const SQLITE_INSERT: &str = "INSERT INTO audit_events (seq, id, at, actor, kind, tool, runner, args, reason, call_id, approval_id, outcome, result_digest, detail, prev_hash, hash) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)";

const LAST: &str = "SELECT seq, hash FROM audit_events ORDER BY seq DESC LIMIT 1";

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
        })
    }
}

/// Appends `batch` in one transaction, chained after the current last event. All or nothing.
pub(super) async fn append_batch(db: &Db, batch: Vec<NewEvent>) -> Result<Vec<Event>, sqlx::Error> {
    let now = format_at(chrono::Utc::now());
    macro_rules! append {
        ($tx:ident, $insert:expr) => {{
            let last: Option<(i64, String)> =
                sqlx::query_as(LAST).fetch_optional(&mut *$tx).await?;
            let (mut seq, mut prev) = last.unwrap_or((0, GENESIS_HASH.to_owned()));
            let mut sealed = Vec::with_capacity(batch.len());
            for new in batch {
                seq += 1;
                let e = Event::seal(
                    new,
                    seq,
                    uuid::Uuid::new_v4().to_string(),
                    now.clone(),
                    prev,
                );
                prev = e.hash.clone();
                sqlx::query($insert)
                    .bind(e.seq)
                    .bind(&e.id)
                    .bind(&e.at)
                    .bind(&e.actor)
                    .bind(&e.kind)
                    .bind(&e.tool)
                    .bind(&e.runner)
                    .bind(e.args.as_ref().map(Value::to_string))
                    .bind(&e.reason)
                    .bind(&e.call_id)
                    .bind(&e.approval_id)
                    .bind(&e.outcome)
                    .bind(&e.result_digest)
                    .bind(e.detail.as_ref().map(Value::to_string))
                    .bind(&e.prev_hash)
                    .bind(&e.hash)
                    .execute(&mut *$tx)
                    .await?;
                sealed.push(e);
            }
            $tx.commit().await?;
            Ok(sealed)
        }};
    }
    db.guard(async move {
        match db.pool() {
            Pool::Pg(pool) => {
                let mut tx = pool.begin().await?;
                sqlx::query("SELECT pg_advisory_xact_lock($1)")
                    .bind(PG_AUDIT_LOCK)
                    .execute(&mut *tx)
                    .await?;
                append!(tx, PG_INSERT)
            }
            Pool::Sqlite(pool) => {
                // IMMEDIATE takes the write lock up front, so reading the last hash and
                // appending after it cannot interleave with another writer.
                let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
                append!(tx, SQLITE_INSERT)
            }
        }
    })
    .await
}

/// Filters of `emisar audit query` (and later the HTTP API). Every filter is optional.
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
    let cast = if pg { "::timestamptz" } else { "" };
    if let Some(since) = filter.since {
        binds.push(format_at(since));
        clauses.push(format!("at >= ${}{cast}", binds.len()));
    }
    if let Some(until) = filter.until {
        binds.push(format_at(until));
        clauses.push(format!("at < ${}{cast}", binds.len()));
    }
    let after = filter.after_seq.unwrap_or(0);
    clauses.push(format!("seq > {after}"));
    let columns = if pg { PG_COLUMNS } else { SQLITE_COLUMNS };
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

/// Walks the chain from `since` (or the start) and reports the first broken link.
pub async fn verify(db: &Db, since: Option<i64>) -> Result<VerifyReport, sqlx::Error> {
    let since = since.unwrap_or(1).max(1);
    let pg = db.is_postgres();
    let columns = if pg { PG_COLUMNS } else { SQLITE_COLUMNS };
    let anchor_sql = "SELECT seq, hash FROM audit_events WHERE seq = $1";
    let sql = format!("SELECT {columns} FROM audit_events WHERE seq >= $1 ORDER BY seq");
    with_pool!(db, pool => {
        let anchor: Option<(i64, String)> = if since > 1 {
            let a = sqlx::query_as(anchor_sql).bind(since - 1).fetch_optional(pool).await?;
            if a.is_none() {
                return Ok(VerifyReport {
                    broken: Some(super::BrokenLink { seq: since - 1, problem: "the event before --since does not exist".into() }),
                    ..Default::default()
                });
            }
            a
        } else {
            None
        };
        let mut verifier = Verifier::new(anchor);
        let mut rows = sqlx::query_as::<_, Row>(AssertSqlSafe(sql)).bind(since).fetch(pool);
        while let Some(row) = rows.try_next().await? {
            if !verifier.feed(&row.into_event()?) {
                break;
            }
        }
        Ok(verifier.finish())
    })
}
