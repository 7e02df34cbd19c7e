//! The server's store of grants (issue 47): people's signed, time-boxed mandate for an
//! agent's writes (`crate::protocol::approval::grant`). Owns the `grants` table (the
//! canonical text people sign, the status, the verified signatures, who asked, decided and
//! revoked, and when) and reads how many calls ran under a grant from the audit log.
//!
//! *Invariants:* a grant's uses are counted from its `grant.used` events in the audit log,
//! never from a column anyone can rewrite, and a `grant.revoked` event in the log ends the
//! grant whatever its row says; a use is counted and recorded under the grant's lock (a
//! PostgreSQL advisory lock shared by every replica, and this process's own), so two calls
//! never take the same last use; a status only moves forward (requested → active → revoked
//! or expired), each move a guarded `UPDATE` that names the status it leaves.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;

use crate::server::approvals::Vote;
use crate::server::db::Db;
use crate::with_pool;

/// Where a grant stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Asked for; not enough people signed yet.
    Requested,
    /// Signed by enough people: calls it admits run under it until it expires or is revoked.
    Active,
    Revoked,
    Expired,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Requested => "requested",
            Status::Active => "active",
            Status::Revoked => "revoked",
            Status::Expired => "expired",
        }
    }

    pub fn parse(s: &str) -> Result<Status, String> {
        match s {
            "requested" => Ok(Status::Requested),
            "active" => Ok(Status::Active),
            "revoked" => Ok(Status::Revoked),
            "expired" => Ok(Status::Expired),
            other => Err(format!(
                "`status` must be requested, active, revoked or expired, not `{}`",
                other.escape_debug()
            )),
        }
    }

    /// Still open: it may yet run calls (requested) or runs them (active).
    pub fn is_open(self) -> bool {
        matches!(self, Status::Requested | Status::Active)
    }
}

/// A grant as stored.
#[derive(Debug, Clone, Serialize)]
pub struct GrantRow {
    pub id: String,
    /// The audit actor it is for (`agent:NAME`).
    pub agent: String,
    /// The caller's name that asked (compared, like an approval's requester, with signers).
    pub requester_name: String,
    pub on_behalf_of: Option<String>,
    /// The canonical text people sign (`emisar-grant/v1`).
    pub text: String,
    pub status: Status,
    pub required: u32,
    /// Each person's signature, verified against the approvers file before it was stored.
    pub signatures: Vec<Vote>,
    pub break_glass: bool,
    pub expires_at: String,
    pub requested_at: String,
    pub decided_at: Option<String>,
    pub decided_by: Option<String>,
    pub revoked_at: Option<String>,
    pub revoked_by: Option<String>,
    pub revoke_reason: Option<String>,
}

impl GrantRow {
    /// Whether it is past its expiry at `now`.
    pub fn expired_at(&self, now: chrono::DateTime<chrono::Utc>) -> bool {
        chrono::DateTime::parse_from_rfc3339(&self.expires_at)
            .map(|t| t.with_timezone(&chrono::Utc) <= now)
            .unwrap_or(true)
    }
}

/// How many calls ran under a grant, as the audit log has them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Uses {
    /// The calls run under it, one per runner each `grant.used` names.
    pub total: u32,
    pub per_runner: BTreeMap<String, u32>,
    /// The log holds a `grant.revoked` event for it.
    pub revoked: bool,
    /// The seq of its `grant.requested` event: from there on no event may be missing.
    pub requested_seq: Option<i64>,
}

impl Uses {
    /// Adds one `grant.*` event of the log, by its kind and detail.
    fn count(&mut self, seq: i64, kind: &str, detail: &Value) {
        match kind {
            k if k == kind::GRANT_USED => {
                let runners: Vec<&str> = detail["runners"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .collect();
                self.total += runners.len().max(1) as u32;
                for runner in runners {
                    *self.per_runner.entry(runner.to_owned()).or_default() += 1;
                }
            }
            k if k == kind::GRANT_REVOKED => self.revoked = true,
            k if k == kind::GRANT_REQUESTED => {
                self.requested_seq = Some(self.requested_seq.map_or(seq, |s| s.min(seq)));
            }
            _ => {}
        }
    }
}

use crate::server::audit::kind;

/// One call made under a grant: its `grant.used` event.
#[derive(Debug, Clone)]
pub struct UsedEvent {
    /// Who called, e.g. `agent:ops-bot`.
    pub actor: String,
    pub tool: String,
    pub call_id: String,
    /// `grant`, `use`, `runners`, `break_glass`…
    pub detail: Value,
}

/// The columns of a `SELECT` of grants, timestamps as fixed-width text on both backends.
fn columns(db: &Db) -> String {
    format!(
        "id, agent, requester_name, on_behalf_of, text, status, required, signatures, break_glass, {} AS expires_at, {} AS requested_at, {} AS decided_at, decided_by, {} AS revoked_at, revoked_by, revoke_reason",
        db.at_text("expires_at"),
        db.at_text("requested_at"),
        db.at_text("decided_at"),
        db.at_text("revoked_at"),
    )
}

type Raw = (
    String,
    String,
    String,
    Option<String>,
    String,
    String,
    i64,
    String,
    bool,
    String,
    String,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
);

fn from_raw(r: Raw) -> Result<GrantRow, sqlx::Error> {
    let decode = |e: String| sqlx::Error::Decode(e.into());
    Ok(GrantRow {
        id: r.0,
        agent: r.1,
        requester_name: r.2,
        on_behalf_of: r.3,
        text: r.4,
        status: Status::parse(&r.5).map_err(decode)?,
        required: u32::try_from(r.6).map_err(|e| decode(e.to_string()))?,
        signatures: serde_json::from_str(&r.7).map_err(|e| decode(e.to_string()))?,
        break_glass: r.8,
        expires_at: r.9,
        requested_at: r.10,
        decided_at: r.11,
        decided_by: r.12,
        revoked_at: r.13,
        revoked_by: r.14,
        revoke_reason: r.15,
    })
}

/// The grants table, on whichever backend the server runs.
#[derive(Clone)]
pub struct Grants {
    db: Db,
    /// This process's side of a grant's lock (the other is PostgreSQL's advisory lock).
    local: Arc<tokio::sync::Mutex<()>>,
}

/// Held while a call counts and records its use of a grant, and while a grant is revoked.
pub struct UseLock {
    _local: tokio::sync::OwnedMutexGuard<()>,
    /// The transaction holding PostgreSQL's advisory lock, released when it ends.
    _pg: Option<sqlx::Transaction<'static, sqlx::Postgres>>,
}

impl Grants {
    pub fn new(db: Db) -> Grants {
        Grants {
            db,
            local: Arc::new(tokio::sync::Mutex::new(())),
        }
    }

    pub fn db(&self) -> &Db {
        &self.db
    }

    /// Stores a new grant, as requested.
    pub async fn insert(&self, row: &GrantRow) -> Result<(), sqlx::Error> {
        let sql = self.db.sql(
            "INSERT INTO grants (id, agent, requester_name, on_behalf_of, text, status, required, signatures, break_glass, expires_at, requested_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10::timestamptz, $11::timestamptz)",
        );
        let signatures = serde_json::to_string(&row.signatures).expect("votes are JSON");
        let db = &self.db;
        db.guard(async {
            with_pool!(db, pool => {
                sqlx::query(sql)
                    .bind(&row.id)
                    .bind(&row.agent)
                    .bind(&row.requester_name)
                    .bind(&row.on_behalf_of)
                    .bind(&row.text)
                    .bind(row.status.as_str())
                    .bind(i64::from(row.required))
                    .bind(&signatures)
                    .bind(row.break_glass)
                    .bind(&row.expires_at)
                    .bind(&row.requested_at)
                    .execute(pool)
                    .await
                    .map(drop)
            })
        })
        .await
    }

    /// Grant `id`, if there is one.
    pub async fn get(&self, id: &str) -> Result<Option<GrantRow>, sqlx::Error> {
        let sql = self.db.sql(format!(
            "SELECT {} FROM grants WHERE id = $1",
            columns(&self.db)
        ));
        let db = &self.db;
        let raw = db
            .guard(async {
                with_pool!(db, pool => {
                    sqlx::query_as::<_, Raw>(sql).bind(id).fetch_optional(pool).await
                })
            })
            .await?;
        raw.map(from_raw).transpose()
    }

    /// Grants newest first: `agent`'s only when given, of one `status` when given.
    pub async fn list(
        &self,
        agent: Option<&str>,
        status: Option<Status>,
        limit: i64,
    ) -> Result<Vec<GrantRow>, sqlx::Error> {
        let sql = self.db.sql(format!(
            "SELECT {} FROM grants WHERE ($1::text IS NULL OR agent = $1) AND ($2::text IS NULL OR status = $2) ORDER BY id DESC LIMIT $3",
            columns(&self.db)
        ));
        let db = &self.db;
        let raws = db
            .guard(async {
                with_pool!(db, pool => {
                    sqlx::query_as::<_, Raw>(sql)
                        .bind(agent)
                        .bind(status.map(Status::as_str))
                        .bind(limit)
                        .fetch_all(pool)
                        .await
                })
            })
            .await?;
        raws.into_iter().map(from_raw).collect()
    }

    /// Stores the signatures of a grant still `requested`, and its new status (active once
    /// enough people signed, with who decided it and when). False: it is no longer
    /// requested, or another signature was stored since `before` of them were read.
    pub async fn sign(
        &self,
        id: &str,
        before: usize,
        signatures: &[Vote],
        status: Status,
        decided: Option<(&str, &str)>,
    ) -> Result<bool, sqlx::Error> {
        let sql = self.db.sql(
            "UPDATE grants SET signatures = $2, status = $3, decided_by = $4, decided_at = $5::timestamptz WHERE id = $1 AND status = 'requested' AND signatures = $6",
        );
        let before_text = serde_json::to_string(&signatures[..before]).expect("votes are JSON");
        let text = serde_json::to_string(signatures).expect("votes are JSON");
        let db = &self.db;
        let done = db
            .guard(async {
                with_pool!(db, pool => {
                    sqlx::query(sql)
                        .bind(id)
                        .bind(&text)
                        .bind(status.as_str())
                        .bind(decided.map(|d| d.0))
                        .bind(decided.map(|d| d.1))
                        .bind(&before_text)
                        .execute(pool)
                        .await
                        .map(|r| r.rows_affected())
                })
            })
            .await?;
        Ok(done == 1)
    }

    /// Moves an open grant (requested or active) to `to` (revoked or expired), with who did
    /// it, when and why for a revocation. False: it was not open.
    pub async fn close(
        &self,
        id: &str,
        to: Status,
        by: Option<&str>,
        at: &str,
        reason: Option<&str>,
    ) -> Result<bool, sqlx::Error> {
        let sql = self.db.sql(
            "UPDATE grants SET status = $2, revoked_by = $3, revoked_at = CASE WHEN $2 = 'revoked' THEN $4::timestamptz ELSE revoked_at END, revoke_reason = $5 WHERE id = $1 AND status IN ('requested', 'active')",
        );
        let db = &self.db;
        let done = db
            .guard(async {
                with_pool!(db, pool => {
                    sqlx::query(sql)
                        .bind(id)
                        .bind(to.as_str())
                        .bind(by)
                        .bind(at)
                        .bind(reason)
                        .execute(pool)
                        .await
                        .map(|r| r.rows_affected())
                })
            })
            .await?;
        Ok(done == 1)
    }

    /// The grants revoked whose expiry is still ahead: what every runner must be told.
    pub async fn revoked_unexpired(&self) -> Result<Vec<GrantRow>, sqlx::Error> {
        let now = crate::server::audit::format_at(chrono::Utc::now());
        let sql = self.db.sql(format!(
            "SELECT {} FROM grants WHERE status = 'revoked' AND expires_at > $1::timestamptz ORDER BY id",
            columns(&self.db)
        ));
        let db = &self.db;
        let raws = db
            .guard(async {
                with_pool!(db, pool => {
                    sqlx::query_as::<_, Raw>(sql).bind(&now).fetch_all(pool).await
                })
            })
            .await?;
        raws.into_iter().map(from_raw).collect()
    }

    /// The grants notices may still have to announce (`server::notices::grants`): every grant
    /// whose expiry is after `since` and that is still requested or is a break-glass window,
    /// oldest first, at most 1000.
    pub async fn to_announce(&self, since: &str) -> Result<Vec<GrantRow>, sqlx::Error> {
        let sql = self.db.sql(format!(
            "SELECT {} FROM grants WHERE expires_at > $1::timestamptz AND (status = 'requested' OR break_glass) ORDER BY id LIMIT 1000",
            columns(&self.db)
        ));
        let db = &self.db;
        let raws = db
            .guard(async {
                with_pool!(db, pool => {
                    sqlx::query_as::<_, Raw>(sql).bind(since).fetch_all(pool).await
                })
            })
            .await?;
        raws.into_iter().map(from_raw).collect()
    }

    /// The calls made under grant `id`, as the audit log has them: each `grant.used` event's
    /// actor, tool, call id and detail, in the log's order.
    pub async fn used_events(&self, id: &str) -> Result<Vec<UsedEvent>, sqlx::Error> {
        let db = &self.db;
        type Row = (String, Option<String>, Option<String>, Option<String>);
        let rows: Vec<Row> = db
            .guard(async {
                match db.pool() {
                    crate::server::db::Pool::Pg(pool) => {
                        sqlx::query_as(
                            "SELECT actor, tool, call_id, detail FROM audit_events WHERE (detail::jsonb ->> 'grant') = $1 AND kind LIKE 'grant.%' AND kind = 'grant.used' ORDER BY seq",
                        )
                        .bind(id)
                        .fetch_all(pool)
                        .await
                    }
                    crate::server::db::Pool::Sqlite(pool) => {
                        sqlx::query_as(
                            "SELECT actor, tool, call_id, detail FROM audit_events WHERE json_extract(detail, '$.grant') = $1 AND kind = 'grant.used' ORDER BY seq",
                        )
                        .bind(id)
                        .fetch_all(pool)
                        .await
                    }
                }
            })
            .await?;
        Ok(rows
            .into_iter()
            .map(|(actor, tool, call_id, detail)| UsedEvent {
                actor,
                tool: tool.unwrap_or_default(),
                call_id: call_id.unwrap_or_default(),
                detail: detail
                    .and_then(|d| serde_json::from_str::<Value>(&d).ok())
                    .unwrap_or(Value::Null),
            })
            .collect())
    }

    /// How many calls ran under grant `id`, and whether it was revoked, from the audit log.
    pub async fn uses(&self, id: &str) -> Result<Uses, sqlx::Error> {
        let db = &self.db;
        let rows: Vec<(i64, String, Option<String>)> = db
            .guard(async {
                match db.pool() {
                    crate::server::db::Pool::Pg(pool) => {
                        sqlx::query_as(
                            "SELECT seq, kind, detail FROM audit_events WHERE (detail::jsonb ->> 'grant') = $1 AND kind LIKE 'grant.%'",
                        )
                        .bind(id)
                        .fetch_all(pool)
                        .await
                    }
                    crate::server::db::Pool::Sqlite(pool) => {
                        sqlx::query_as(
                            "SELECT seq, kind, detail FROM audit_events WHERE json_extract(detail, '$.grant') = $1 AND kind LIKE 'grant.%'",
                        )
                        .bind(id)
                        .fetch_all(pool)
                        .await
                    }
                }
            })
            .await?;
        let mut uses = Uses::default();
        for (seq, kind, detail) in rows {
            let detail = detail
                .and_then(|d| serde_json::from_str::<Value>(&d).ok())
                .unwrap_or(Value::Null);
            uses.count(seq, &kind, &detail);
        }
        Ok(uses)
    }

    /// Takes grant `id`'s lock: this process's, and on PostgreSQL an advisory lock every
    /// replica takes, held until the returned guard is dropped.
    pub async fn lock(&self, id: &str) -> Result<UseLock, sqlx::Error> {
        let local = self.local.clone().lock_owned().await;
        let pg = match self.db.pool() {
            crate::server::db::Pool::Pg(pool) => {
                let mut tx = self.db.guard(pool.begin()).await?;
                sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
                    .bind(format!("emisar-grant {id}"))
                    .execute(&mut *tx)
                    .await?;
                Some(tx)
            }
            crate::server::db::Pool::Sqlite(_) => None,
        };
        Ok(UseLock {
            _local: local,
            _pg: pg,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn uses_are_counted_from_the_log_per_grant_and_runner() {
        let mut uses = Uses::default();
        uses.count(9, kind::GRANT_REQUESTED, &json!({"grant": "g"}));
        uses.count(
            12,
            kind::GRANT_USED,
            &json!({"grant": "g", "runners": ["a", "b"]}),
        );
        uses.count(
            13,
            kind::GRANT_USED,
            &json!({"grant": "g", "runners": ["a"]}),
        );
        uses.count(10, kind::GRANT_SIGNED, &json!({"grant": "g"}));
        // A call on two runners is two of the grant's calls (red team 5, B3).
        assert_eq!(uses.total, 3);
        assert_eq!(uses.requested_seq, Some(9));
        assert_eq!(
            uses.per_runner,
            BTreeMap::from([("a".to_owned(), 2), ("b".to_owned(), 1)])
        );
        assert!(!uses.revoked);
        uses.count(14, kind::GRANT_REVOKED, &json!({"grant": "g"}));
        assert!(uses.revoked);
    }

    #[test]
    fn a_status_reads_back_and_a_wrong_one_is_named() {
        for s in [
            Status::Requested,
            Status::Active,
            Status::Revoked,
            Status::Expired,
        ] {
            assert_eq!(Status::parse(s.as_str()).unwrap(), s);
        }
        assert!(Status::parse("open").unwrap_err().contains("`status`"));
        assert!(Status::Active.is_open() && !Status::Revoked.is_open());
    }
}
