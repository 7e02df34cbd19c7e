//! The joined runners: listed and removed by `emisar runner list|remove`, and read into every
//! replica's registry (added, changed and, once removed, forgotten). Runners from a server's
//! config are never touched here.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::kind;
use crate::server::audit::{AuditLog, NewEvent};
use crate::server::config::RunnerEntry;
use crate::server::db::Db;
use crate::server::runners::registry::Registry;
use crate::with_pool;

/// A joined runner as `emisar runner list` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct JoinedRunner {
    pub name: String,
    pub url: String,
    pub labels: BTreeMap<String, String>,
    pub packs: Vec<String>,
    pub joined_at: String,
    pub last_heartbeat: Option<String>,
    pub join_token_id: Option<String>,
}

type RunnerRow = (
    String,
    String,
    String,
    String,
    String,
    Option<String>,
    Option<String>,
);

/// Every joined runner, by name.
pub async fn joined_runners(db: &Db) -> anyhow::Result<Vec<JoinedRunner>> {
    let sql = format!(
        "SELECT name, url, labels::text, packs::text, {}, {}, join_token_id FROM runners ORDER BY name",
        db.at_text("joined_at"),
        db.at_text("last_heartbeat"),
    );
    let rows: Vec<RunnerRow> =
        with_pool!(db, pool => sqlx::query_as(db.sql(sql)).fetch_all(pool).await?);
    rows.into_iter()
        .map(
            |(name, url, labels, packs, joined_at, last_heartbeat, join_token_id)| {
                Ok(JoinedRunner {
                    name,
                    url,
                    labels: serde_json::from_str(&labels)?,
                    packs: serde_json::from_str(&packs)?,
                    joined_at,
                    last_heartbeat,
                    join_token_id,
                })
            },
        )
        .collect()
}

/// Removes joined runner `name`: its row goes, and with it its credential (the only copy of
/// the runner token's hash); every replica forgets it at its next sync. Returns `false` when
/// no runner of that name joined. Audited before it is written.
pub async fn remove_runner(
    db: &Db,
    audit: &AuditLog,
    name: &str,
    by: &str,
) -> anyhow::Result<bool> {
    let sql = db.sql("SELECT url FROM runners WHERE name = $1");
    let found: Option<(String,)> =
        with_pool!(db, pool => sqlx::query_as(sql).bind(name).fetch_optional(pool).await?);
    let Some((url,)) = found else {
        return Ok(false);
    };
    audit
        .append(NewEvent {
            actor: by.to_owned(),
            kind: kind::RUNNER_REMOVED.into(),
            runner: Some(name.to_owned()),
            outcome: Some("ok".into()),
            detail: Some(json!({"url": url})),
            ..Default::default()
        })
        .await?;
    let sql = db.sql("DELETE FROM runners WHERE name = $1");
    with_pool!(db, pool => sqlx::query(sql).bind(name).execute(pool).await.map(|_| ())?);
    Ok(true)
}

/// Loads the joined runners into `registry` now and every `interval` (so a runner that
/// joined through another replica is known here too, and one removed anywhere is forgotten
/// here), until `shutdown`. Runners from the config are never touched.
pub fn spawn_sync(
    db: Db,
    registry: Arc<Registry>,
    interval: Duration,
    shutdown: CancellationToken,
) {
    tokio::spawn(async move {
        let mut shadowed = BTreeSet::new();
        loop {
            let read_at = tokio::time::Instant::now();
            let sql =
                db.sql("SELECT name, url, labels::text, packs::text, tls_fingerprint FROM runners");
            #[expect(clippy::type_complexity, reason = "one row of the runners table")]
            let rows: Result<Vec<(String, String, String, String, Option<String>)>, _> = db
                .guard(async { with_pool!(&db, pool => sqlx::query_as(sql).fetch_all(pool).await) })
                .await;
            match rows {
                Ok(rows) => {
                    let present: BTreeSet<String> = rows.iter().map(|r| r.0.clone()).collect();
                    for (name, url, labels, packs, tls_fingerprint) in rows {
                        if registry.is_configured(&name) {
                            if shadowed.insert(name.clone()) {
                                tracing::warn!(runner = %name, "a joined runner has the name of a runner in this server's config and is ignored; remove it with `emisar runner remove {name}`");
                            }
                            continue;
                        }
                        let (Ok(labels), Ok(packs)) =
                            (serde_json::from_str(&labels), serde_json::from_str(&packs))
                        else {
                            tracing::error!(runner = %name, "unreadable labels or packs in the runners table");
                            continue;
                        };
                        if registry.get(&name).is_none_or(|e| {
                            e.url != url
                                || e.labels != labels
                                || e.packs.as_ref() != Some(&packs)
                                || e.tls_fingerprint != tls_fingerprint
                        }) && let Err(e) = registry.upsert_joined(RunnerEntry {
                            name: name.clone(),
                            url,
                            tls_fingerprint,
                            packs: Some(packs),
                            labels,
                        }) {
                            // A row this replica cannot trust as stored (an http:// URL while
                            // this replica has no insecure_http) stays out of its registry.
                            tracing::error!(runner = %name, error = %format!("{e:#}"), "joined runner not loaded");
                        }
                    }
                    for name in registry.retain_joined(&present, read_at) {
                        tracing::info!(runner = %name, "a joined runner was removed; forgotten");
                    }
                }
                Err(e) => tracing::warn!(error = %e, "could not read joined runners"),
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(interval) => {}
            }
        }
    });
}
