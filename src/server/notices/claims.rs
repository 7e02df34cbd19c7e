//! The store side of notices: which steps of which requests (`notice_steps`) and which
//! announcements of which grants (`grant_notice_steps`) have been claimed, and the claim
//! itself, an insert that only one replica can make (each table's primary key).

use std::collections::{BTreeMap, BTreeSet};

use crate::server::approvals::State;
use crate::server::audit::format_at;
use crate::server::db::Db;
use crate::with_pool;

/// Claims `step` of request `id`: true when this call inserted the claim (and so sends the
/// step), false when someone already had it.
pub(crate) async fn claim(
    db: &Db,
    id: &str,
    step: &str,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<bool, sqlx::Error> {
    insert_claim(
        db,
        "INSERT INTO notice_steps (approval_id, step, claimed_at) VALUES ($1, $2, $3::timestamptz) ON CONFLICT DO NOTHING",
        id,
        step,
        now,
    )
    .await
}

/// Claims announcement `step` of grant `id` (`requested`, `group:0`, `open`, `call:<id>`):
/// true when this call inserted the claim (and so sends it), false when someone already had it.
pub(crate) async fn claim_grant(
    db: &Db,
    id: &str,
    step: &str,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<bool, sqlx::Error> {
    insert_claim(
        db,
        "INSERT INTO grant_notice_steps (grant_id, step, claimed_at) VALUES ($1, $2, $3::timestamptz) ON CONFLICT DO NOTHING",
        id,
        step,
        now,
    )
    .await
}

/// The claimed announcements of every grant whose expiry is after `since`, by grant id.
pub(crate) async fn claimed_of_grants(
    db: &Db,
    since: &str,
) -> Result<BTreeMap<String, BTreeSet<String>>, sqlx::Error> {
    let sql = db.sql(
        "SELECT s.grant_id, s.step FROM grant_notice_steps s JOIN grants g ON g.id = s.grant_id WHERE g.expires_at > $1::timestamptz",
    );
    let rows = db
        .guard(async {
            with_pool!(db, pool => {
                sqlx::query_as::<_, (String, String)>(sql)
                    .bind(since)
                    .fetch_all(pool)
                    .await
            })
        })
        .await?;
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (id, step) in rows {
        out.entry(id).or_default().insert(step);
    }
    Ok(out)
}

/// Runs one claim's `insert` (`$1` the id, `$2` the step, `$3` when): whether it inserted.
async fn insert_claim(
    db: &Db,
    insert: &'static str,
    id: &str,
    step: &str,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<bool, sqlx::Error> {
    let sql = db.sql(insert);
    let now = format_at(now);
    let inserted = db
        .guard(async {
            with_pool!(db, pool => {
                sqlx::query(sql)
                    .bind(id)
                    .bind(step)
                    .bind(&now)
                    .execute(pool)
                    .await
                    .map(|done| done.rows_affected())
            })
        })
        .await?;
    Ok(inserted == 1)
}

/// The claimed steps of every pending request, by request id.
pub(crate) async fn claimed_of_pending(
    db: &Db,
) -> Result<BTreeMap<String, BTreeSet<String>>, sqlx::Error> {
    let sql = db.sql(
        "SELECT s.approval_id, s.step FROM notice_steps s JOIN approvals a ON a.id = s.approval_id WHERE a.state = $1",
    );
    let rows = db
        .guard(async {
            with_pool!(db, pool => {
                sqlx::query_as::<_, (String, String)>(sql)
                    .bind(State::Pending.as_str())
                    .fetch_all(pool)
                    .await
            })
        })
        .await?;
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (id, step) in rows {
        out.entry(id).or_default().insert(step);
    }
    Ok(out)
}

/// Requests that expired unanswered since `since` (state `expired` with no note: an approved
/// request that never started carries one), whose people were told of them and not yet of
/// the expiry.
pub(crate) async fn expired_unannounced(
    db: &Db,
    since: chrono::DateTime<chrono::Utc>,
) -> Result<Vec<String>, sqlx::Error> {
    let sql = db.sql(
        "SELECT a.id FROM approvals a WHERE a.state = $1 AND a.note IS NULL AND a.expires_at > $2::timestamptz \
         AND EXISTS (SELECT 1 FROM notice_steps s WHERE s.approval_id = a.id) \
         AND NOT EXISTS (SELECT 1 FROM notice_steps s WHERE s.approval_id = a.id AND s.step = 'expired') LIMIT 100",
    );
    let since = format_at(since);
    db.guard(async {
        with_pool!(db, pool => {
            sqlx::query_scalar::<_, String>(sql)
                .bind(State::Expired.as_str())
                .bind(&since)
                .fetch_all(pool)
                .await
        })
    })
    .await
}
