//! The store: [`Approvals`] over either backend, the one SQL of each statement (`Db::sql`
//! adapts it), and [`Approvals::transition`], the one way a request changes.

use std::sync::Arc;

use chrono::Utc;
use serde_json::{Value, json};
use sqlx::{AssertSqlSafe, Row};
use tokio::sync::broadcast;

use super::notify::{Changed, listen, notify_committed};
use super::{Approval, ApprovalError, Change, Due, Lock, State, text};
use crate::protocol::approval::Plan;
use crate::server::audit::{AuditLog, format_at};
use crate::server::db::{Db, Pool};
use crate::with_pool;

#[derive(Clone)]
pub struct Approvals {
    db: Db,
    audit: AuditLog,
    pub(super) changes: broadcast::Sender<Changed>,
    /// SQLite only: the row lock (a single replica, so a process mutex is the whole lock).
    local: Arc<tokio::sync::Mutex<()>>,
    /// PostgreSQL: transitions in flight ([`TRANSITION_SLOTS`]), each holding a pooled
    /// connection while its audit event is written (through another pooled connection).
    in_flight: Arc<tokio::sync::Semaphore>,
}

/// PostgreSQL transitions in flight at once. Kept below the pool size
/// ([`crate::server::db::PG_POOL_SIZE`]) so the audit writer, which the transitions wait on,
/// always finds a connection. Ten, so that ten approvals clicked at once all go through
/// together: with four they went in three waves (A/B of the approval bench, 10 at once, p95
/// 33-37 ms with four against 28-31 ms with ten).
const TRANSITION_SLOTS: usize = 10;

const PG_COLUMNS: &str = "id, call_id, tool, risk, args::text AS args, shown_args::text AS shown_args, runners::text AS runners, runner_chosen, raw, reason, requester, requester_name, on_behalf_of, pack_sha256, preview::text AS preview, required_approvals, approvals::text AS approvals, state, note, decided_by, result::text AS result, to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') AS created_at, to_char(expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') AS expires_at, to_char(updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') AS updated_at, statement, plan, decision";
const INSERT: &str = "INSERT INTO approvals (id, call_id, tool, risk, args, shown_args, runners, runner_chosen, raw, reason, requester, requester_name, pack_sha256, preview, required_approvals, approvals, state, note, decided_by, result, created_at, expires_at, updated_at, on_behalf_of, statement, plan) VALUES ($1,$2,$3,$4,$5::jsonb,$6::jsonb,$7::jsonb,$8,$9,$10,$11,$12,$13,$14::jsonb,$15,$16::jsonb,$17,$18,$19,$20::jsonb,$21::timestamptz,$22::timestamptz,$23::timestamptz,$24,$25,$26)";
const UPDATE: &str = "UPDATE approvals SET state = $2, approvals = $3::jsonb, note = $4, decided_by = $5, result = $6::jsonb, updated_at = $7::timestamptz, decision = $8 WHERE id = $1";
const SQLITE_COLUMNS: &str = "id, call_id, tool, risk, args, shown_args, runners, runner_chosen, raw, reason, requester, requester_name, on_behalf_of, pack_sha256, preview, required_approvals, approvals, state, note, decided_by, result, created_at, expires_at, updated_at, statement, plan, decision";

fn from_row<R>(row: &R) -> Result<Approval, sqlx::Error>
where
    R: Row,
    for<'a> &'a str: sqlx::ColumnIndex<R>,
    for<'a> String: sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
    for<'a> Option<String>: sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
    for<'a> bool: sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
    for<'a> i32: sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
{
    fn json<T: serde::de::DeserializeOwned>(column: &str, text: &str) -> Result<T, sqlx::Error> {
        serde_json::from_str(text).map_err(|e| sqlx::Error::ColumnDecode {
            index: column.to_owned(),
            source: Box::new(e),
        })
    }
    let opt_json = |column: &str| -> Result<Option<Value>, sqlx::Error> {
        row.try_get::<Option<String>, _>(column)?
            .map(|t| json(column, &t))
            .transpose()
    };
    let state: String = row.try_get("state")?;
    let runners: Vec<String> = json("runners", &row.try_get::<String, _>("runners")?)?;
    Ok(Approval {
        id: row.try_get("id")?,
        call_id: row.try_get("call_id")?,
        tool: row.try_get("tool")?,
        risk: row.try_get("risk")?,
        args: json("args", &row.try_get::<String, _>("args")?)?,
        shown_args: json("shown_args", &row.try_get::<String, _>("shown_args")?)?,
        runners: runners.clone(),
        runner_chosen_by_server: row.try_get("runner_chosen")?,
        raw: row.try_get("raw")?,
        reason: row.try_get("reason")?,
        requester: row.try_get("requester")?,
        requester_name: row.try_get("requester_name")?,
        on_behalf_of: row.try_get("on_behalf_of")?,
        pack_sha256: row.try_get("pack_sha256")?,
        preview: opt_json("preview")?,
        required_approvals: row.try_get::<i32, _>("required_approvals")?.max(1) as u32,
        votes: json("approvals", &row.try_get::<String, _>("approvals")?)?,
        state: State::parse(&state).map_err(|e| sqlx::Error::ColumnDecode {
            index: "state".into(),
            source: e.into(),
        })?,
        note: row.try_get("note")?,
        statement: row.try_get("statement")?,
        // A request made before rollouts ran on all its runners at once: one wave.
        plan: match row.try_get::<Option<String>, _>("plan")? {
            Some(plan) => json("plan", &plan)?,
            None => Plan::one_wave(&runners),
        },
        decision: match row.try_get::<Option<String>, _>("decision")? {
            Some(d) => Some(json("decision", &d)?),
            None => None,
        },
        decided_by: row.try_get("decided_by")?,
        result: opt_json("result")?,
        created_at: row.try_get("created_at")?,
        expires_at: row.try_get("expires_at")?,
        updated_at: row.try_get("updated_at")?,
    })
}

impl Approvals {
    /// The store, and (on PostgreSQL) a task that relays other replicas' changes until
    /// `shutdown`.
    pub fn new(
        db: Db,
        audit: AuditLog,
        shutdown: tokio_util::sync::CancellationToken,
    ) -> Approvals {
        let (changes, _) = broadcast::channel(1024);
        let approvals = Approvals {
            db,
            audit,
            changes,
            local: Arc::default(),
            in_flight: Arc::new(tokio::sync::Semaphore::new(TRANSITION_SLOTS)),
        };
        if let Pool::Pg(_) = approvals.db.pool() {
            tokio::spawn(listen(
                approvals.db.clone(),
                approvals.changes.clone(),
                shutdown,
            ));
        }
        approvals
    }

    /// Stores a new pending request; its `approval.requested` event must already be durable.
    pub(crate) async fn insert(&self, a: &Approval) -> Result<(), ApprovalError> {
        // One statement and bind order for both backends (`Db::sql` drops the casts).
        macro_rules! insert {
            ($sql:expr) => {
                sqlx::query(self.db.sql($sql))
                    .bind(&a.id)
                    .bind(&a.call_id)
                    .bind(&a.tool)
                    .bind(&a.risk)
                    .bind(text(&a.args))
                    .bind(text(&a.shown_args))
                    .bind(text(&a.runners))
                    .bind(a.runner_chosen_by_server)
                    .bind(a.raw)
                    .bind(&a.reason)
                    .bind(&a.requester)
                    .bind(&a.requester_name)
                    .bind(&a.pack_sha256)
                    .bind(a.preview.as_ref().map(text))
                    .bind(a.required_approvals as i32)
                    .bind(text(&a.votes))
                    .bind(a.state.as_str())
                    .bind(&a.note)
                    .bind(&a.decided_by)
                    .bind(a.result.as_ref().map(text))
                    .bind(&a.created_at)
                    .bind(&a.expires_at)
                    .bind(&a.updated_at)
                    .bind(&a.on_behalf_of)
                    .bind(&a.statement)
                    .bind(text(&a.plan))
            };
        }
        self.db
            .guard(async {
                match self.db.pool() {
                    Pool::Pg(pool) => {
                        insert!(INSERT).execute(pool).await?;
                        notify_committed(pool, a).await;
                        Ok(())
                    }
                    Pool::Sqlite(pool) => insert!(INSERT).execute(pool).await.map(|_| ()),
                }
            })
            .await?;
        self.announce(a);
        Ok(())
    }

    /// The store the requests are in (for what a decision checks beside them: a passkey's
    /// signature counter).
    pub(crate) fn db(&self) -> &Db {
        &self.db
    }

    /// The columns to select, per backend (PostgreSQL hands JSON and times back as text).
    fn columns(&self) -> &'static str {
        match self.db.pool() {
            Pool::Pg(_) => PG_COLUMNS,
            Pool::Sqlite(_) => SQLITE_COLUMNS,
        }
    }

    pub async fn get(&self, id: &str) -> Result<Approval, ApprovalError> {
        let sql = format!("SELECT {} FROM approvals WHERE id = $1", self.columns());
        let row = self
            .db
            .guard(async {
                with_pool!(self.db, pool => {
                    match sqlx::query(AssertSqlSafe(sql)).bind(id).fetch_optional(pool).await? {
                        Some(r) => from_row(&r).map(Some),
                        None => Ok(None),
                    }
                })
            })
            .await?;
        row.ok_or_else(|| ApprovalError::NotFound(id.to_owned()))
    }

    /// Newest first; `state` narrows the list, `requester` limits it to one requester.
    pub(crate) async fn list(
        &self,
        state: Option<State>,
        requester_name: Option<&str>,
        limit: i64,
    ) -> Result<Vec<Approval>, ApprovalError> {
        let sql = self.db.sql(format!(
            "SELECT {} FROM approvals WHERE ($1::text IS NULL OR state = $1) AND ($2::text IS NULL OR requester_name = $2) ORDER BY created_at DESC, id LIMIT $3",
            self.columns()
        ));
        let rows = self
            .db
            .guard(async {
                with_pool!(self.db, pool => {
                    sqlx::query(sql)
                        .bind(state.map(State::as_str))
                        .bind(requester_name)
                        .bind(limit)
                        .fetch_all(pool)
                        .await?
                        .iter()
                        .map(from_row)
                        .collect::<Result<Vec<_>, _>>()
                })
            })
            .await?;
        Ok(rows)
    }

    /// How many requests of agent `name` are pending and not yet past their expiry.
    pub(crate) async fn pending_of(&self, name: &str) -> Result<u64, ApprovalError> {
        let sql = self.db.sql(
            "SELECT COUNT(*) FROM approvals WHERE state = $1 AND requester_name = $2 AND expires_at > $3::timestamptz",
        );
        let now = format_at(Utc::now());
        let n = self
            .db
            .guard(async {
                with_pool!(self.db, pool => {
                    sqlx::query_scalar::<_, i64>(sql)
                        .bind(State::Pending.as_str())
                        .bind(name)
                        .bind(&now)
                        .fetch_one(pool)
                        .await
                })
            })
            .await?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// How many requests wait for people at `now`: pending and not yet past their expiry (the
    /// approval backlog, for `/metrics`). Every replica counts the same shared rows.
    pub(crate) async fn backlog(&self, now: chrono::DateTime<Utc>) -> Result<u64, ApprovalError> {
        let sql = self.db.sql(
            "SELECT COUNT(*) FROM approvals WHERE state = $1 AND expires_at > $2::timestamptz",
        );
        let now = format_at(now);
        let n = self
            .db
            .guard(async {
                with_pool!(self.db, pool => {
                    sqlx::query_scalar::<_, i64>(sql)
                        .bind(State::Pending.as_str())
                        .bind(&now)
                        .fetch_one(pool)
                        .await
                })
            })
            .await?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// Ids in `state` whose `due` time is before `before`, for the sweeper.
    pub(crate) async fn ids_in(
        &self,
        state: State,
        before: &str,
        due: Due,
    ) -> Result<Vec<String>, ApprovalError> {
        let column = match due {
            Due::Expiry => "expires_at",
            Due::LastChange => "updated_at",
        };
        let sql = self.db.sql(format!(
            "SELECT id FROM approvals WHERE state = $1 AND {column} <= $2::timestamptz LIMIT 100"
        ));
        let ids = self
            .db
            .guard(async {
                with_pool!(self.db, pool => {
                    sqlx::query_scalar::<_, String>(sql)
                        .bind(state.as_str())
                        .bind(before)
                        .fetch_all(pool)
                        .await
                })
            })
            .await?;
        Ok(ids)
    }

    /// The one way a request changes: lock the row (with [`Lock::SkipLocked`], give up at
    /// once if another replica holds it, returning `Ok(None)`), let `change` decide from the
    /// locked row, make the audit event durable, write the row, announce it.
    pub(crate) async fn transition<F>(
        &self,
        id: &str,
        lock: Lock,
        change: F,
    ) -> Result<Option<Approval>, ApprovalError>
    where
        F: FnOnce(&Approval) -> Result<Change, ApprovalError>,
    {
        // Writes the changed columns; one statement for both backends.
        macro_rules! update {
            ($a:expr) => {
                sqlx::query(self.db.sql(UPDATE))
                    .bind(&$a.id)
                    .bind($a.state.as_str())
                    .bind(text(&$a.votes))
                    .bind(&$a.note)
                    .bind(&$a.decided_by)
                    .bind($a.result.as_ref().map(text))
                    .bind(&$a.updated_at)
                    .bind($a.decision.as_ref().map(text))
            };
        }
        let written = match self.db.pool() {
            Pool::Pg(pool) => {
                let (_slot, mut tx) = self.db.begin_holding_slot(pool, &self.in_flight).await?;
                let clause = match lock {
                    Lock::SkipLocked => "FOR UPDATE SKIP LOCKED",
                    Lock::Wait => "FOR UPDATE",
                };
                let sql = format!("SELECT {PG_COLUMNS} FROM approvals WHERE id = $1 {clause}");
                let Some(row) = sqlx::query(AssertSqlSafe(sql))
                    .bind(id)
                    .fetch_optional(&mut *tx)
                    .await?
                else {
                    if lock == Lock::SkipLocked && self.exists(id).await? {
                        return Ok(None);
                    }
                    return Err(ApprovalError::NotFound(id.to_owned()));
                };
                let current = from_row(&row)?;
                let Change { row, events } = change(&current)?;
                self.audit.append_all(events).await?;
                update!(&row).execute(&mut *tx).await?;
                tx.commit().await?;
                notify_committed(pool, &row).await;
                row
            }
            Pool::Sqlite(_) => {
                // A SQLite store belongs to one process, so no other replica can hold the
                // request: `local` only puts this process's transitions (of every request)
                // in order, and both kinds of lock wait their turn. Giving up on a busy
                // `local`, as SKIP LOCKED gives up on a row, left every claim of a burst of
                // approvals but the first to the next sweep. A claim that waited finds the
                // request as the one before it left it, and `change` decides from that.
                let _held = self.local.lock().await;
                let current = self.get(id).await?;
                let Change { row, events } = change(&current)?;
                self.audit.append_all(events).await?;
                let Pool::Sqlite(pool) = self.db.pool() else {
                    unreachable!("this arm is SQLite's")
                };
                self.db.guard(update!(&row).execute(pool)).await?;
                row
            }
        };
        self.announce(&written);
        Ok(Some(written))
    }

    /// Ends an execution: `executing` → `state`, with the call's outcome. When runners were
    /// called, their per-runner outcome events (written before this) record it; when none
    /// was (the execution failed before dispatch), it is recorded here as `call.failed`.
    pub(crate) async fn finish(
        &self,
        id: &str,
        state: State,
        result: Value,
        note: Option<String>,
    ) -> Result<(), ApprovalError> {
        self.transition(id, Lock::Wait, |r| {
            if r.state != State::Executing {
                return Err(ApprovalError::WrongState {
                    state: r.state,
                    wanted: "executing",
                });
            }
            let nothing_ran = result["results"].as_array().is_none_or(Vec::is_empty);
            let events = Vec::from_iter(nothing_ran.then(|| {
                let mut e = r.event(
                    &r.requester,
                    crate::server::audit::kind::CALL_FAILED,
                    json!({"error": note, "state": state}),
                );
                e.outcome = Some("error".into());
                e
            }));
            let mut row = r.clone();
            row.state = state;
            row.result = Some(result);
            row.note = note;
            row.updated_at = format_at(Utc::now());
            Ok(Change { row, events })
        })
        .await
        .map(|_| ())
    }

    async fn exists(&self, id: &str) -> Result<bool, ApprovalError> {
        match self.get(id).await {
            Ok(_) => Ok(true),
            Err(ApprovalError::NotFound(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::moved;
    use super::super::testing::row;
    use super::*;

    /// A store on a fresh SQLite file (kept while the directory lives).
    async fn sqlite_store() -> (tempfile::TempDir, Approvals) {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("emisar.db").display());
        let (db, _) = Db::connect_and_migrate(&url).await.unwrap();
        let audit = AuditLog::start(db.clone());
        let store = Approvals::new(db, audit, tokio_util::sync::CancellationToken::new());
        (dir, store)
    }

    /// The backlog counts pending requests that have not expired yet, and nothing else: not
    /// those past their expiry that the sweep has not reached, not decided ones.
    #[tokio::test]
    async fn the_backlog_is_the_pending_requests_not_yet_expired() {
        let (_dir, store) = sqlite_store().await;
        let requests = [
            ("waiting-1", State::Pending, "2026-11-30T10:15:00.000000Z"),
            ("waiting-2", State::Pending, "2026-11-30T11:00:00.000000Z"),
            ("overdue", State::Pending, "2026-11-30T10:05:00.000000Z"),
            ("approved", State::Approved, "2026-11-30T10:15:00.000000Z"),
            ("denied", State::Denied, "2026-11-30T10:15:00.000000Z"),
        ];
        for (i, (id, state, expires_at)) in requests.into_iter().enumerate() {
            let r = Approval {
                id: id.into(),
                call_id: format!("c{i}"),
                state,
                expires_at: expires_at.into(),
                ..row()
            };
            store.insert(&r).await.unwrap();
        }
        let now = super::super::testing::at("2026-11-30T10:10:00Z");
        assert_eq!(store.backlog(now).await.unwrap(), 2);
        let later = super::super::testing::at("2026-11-30T10:30:00Z");
        assert_eq!(store.backlog(later).await.unwrap(), 1);
    }

    /// On SQLite, claims of several approved requests at once all succeed: a claim waits for
    /// the process's other transitions instead of being left to the next sweep.
    #[tokio::test]
    async fn on_sqlite_claims_made_together_all_go_through() {
        let (_dir, store) = sqlite_store().await;
        let ids: Vec<String> = (0..10).map(|i| format!("a{i}")).collect();
        for (i, id) in ids.iter().enumerate() {
            let r = Approval {
                id: id.clone(),
                call_id: format!("c{i}"),
                state: State::Approved,
                ..row()
            };
            store.insert(&r).await.unwrap();
        }
        let claims = ids.iter().map(|id| {
            store.transition(id, Lock::SkipLocked, |r| {
                moved(
                    r,
                    &[State::Approved],
                    State::Executing,
                    "approver:alice",
                    "approval.executing",
                    json!({}),
                    Utc::now(),
                )
            })
        });
        let results = futures::future::join_all(claims).await;
        for (id, r) in ids.iter().zip(results) {
            let claimed = r.unwrap_or_else(|e| panic!("claim of {id}: {e}"));
            assert_eq!(
                claimed.map(|a| a.state),
                Some(State::Executing),
                "the claim of {id} was given up while another transition ran"
            );
        }
    }
}
