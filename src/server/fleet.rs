//! Runners that join: join tokens, the join handshake, heartbeats, and keeping every
//! replica's registry in step with the `runners` table.
//!
//! A runner presents a join token once and gets back its own runner token (for heartbeats)
//! and the server's public key (to verify calls). Only hashes of both tokens are stored.
//! The runner's URL must be https (http only with `insecure_http`), and the fingerprint of
//! the certificate it sends is stored with it and pinned: calls go to that certificate only.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::digest::sha256_hex;
use crate::pack::is_identifier;
use crate::protocol::{JoinRequest, JoinResponse};
use crate::server::audit::{AuditLog, NewEvent, format_at};
use crate::server::config::RunnerEntry;
use crate::server::db::Db;
use crate::server::runners::registry::Registry;
use crate::with_pool;

const JOIN_PREFIX: &str = "emj_";
const RUNNER_PREFIX: &str = "emr_";
/// How often a joined runner sends a heartbeat.
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error("{0}")]
    Invalid(String),
    #[error("the token is unknown, expired or revoked")]
    Unauthorized,
    #[error("the store failed: {0}")]
    Store(#[from] sqlx::Error),
    #[error("the audit log cannot record this: {0}")]
    Audit(#[from] crate::server::audit::AuditError),
}

fn random_token(prefix: &str) -> Result<String, FleetError> {
    let mut secret = [0u8; 32];
    getrandom::fill(&mut secret).map_err(|e| FleetError::Invalid(format!("no randomness: {e}")))?;
    Ok(format!(
        "{prefix}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(secret)
    ))
}

/// Issues a join token valid for `ttl`; returns (id, token). Audited; the token is not.
pub async fn issue_join_token(
    db: &Db,
    audit: &AuditLog,
    ttl: Duration,
    by: &str,
) -> anyhow::Result<(String, String)> {
    let token = random_token(JOIN_PREFIX)?;
    let id = uuid::Uuid::new_v4().to_string();
    let now = chrono::Utc::now();
    let expires_at = format_at(now + chrono::Duration::from_std(ttl)?);
    audit
        .append(NewEvent {
            actor: by.to_owned(),
            kind: "join_token.issued".into(),
            outcome: Some("ok".into()),
            detail: Some(json!({"join_token_id": id, "expires_at": expires_at})),
            ..Default::default()
        })
        .await?;
    let sql = db.sql("INSERT INTO join_tokens (id, token_hash, created_at, expires_at) VALUES ($1, $2, $3::timestamptz, $4::timestamptz)");
    with_pool!(db, pool => {
        sqlx::query(sql)
            .bind(&id)
            .bind(sha256_hex(token.as_bytes()))
            .bind(format_at(now))
            .bind(&expires_at)
            .execute(pool)
            .await?;
    });
    Ok((id, token))
}

/// Checks a join token and registers (or re-registers) the runner.
pub async fn join(
    db: &Db,
    audit: &AuditLog,
    registry: &Arc<Registry>,
    join_token: &str,
    request: JoinRequest,
    server_public_key: &str,
) -> Result<JoinResponse, FleetError> {
    if !is_identifier(&request.name) {
        return Err(FleetError::Invalid(format!(
            "`name` `{}` must be an identifier",
            request.name
        )));
    }
    if request.url.len() > 500 {
        return Err(FleetError::Invalid(
            "`url` is longer than 500 characters".into(),
        ));
    }
    crate::server::config::check_runner_url(
        "`url`",
        &request.url,
        registry.trust().insecure_http(),
    )
    .map_err(|e| FleetError::Invalid(format!("{e} (on the server)")))?;
    let tls_fingerprint = match &request.tls_fingerprint {
        None => None,
        Some(text) => {
            let pin = crate::util::tls::Fingerprint::parse(text)
                .map_err(|e| FleetError::Invalid(format!("`tls_fingerprint` {e}")))?;
            if !request.url.starts_with("https://") {
                return Err(FleetError::Invalid(format!(
                    "`tls_fingerprint` pins a certificate, but `url` `{}` is not https://",
                    request.url
                )));
            }
            Some(pin.to_string())
        }
    };
    for (k, v) in &request.labels {
        if !is_identifier(k) || !is_identifier(v) {
            return Err(FleetError::Invalid(format!(
                "`labels`: `{k}={v}` must be identifiers"
            )));
        }
    }
    let now = format_at(chrono::Utc::now());
    let sql = db.sql("SELECT id FROM join_tokens WHERE token_hash = $1 AND revoked_at IS NULL AND expires_at > $2::timestamptz");
    let hash = sha256_hex(join_token.as_bytes());
    let found: Option<(String,)> = db
        .guard(async { with_pool!(db, pool => sqlx::query_as(sql).bind(&hash).bind(&now).fetch_optional(pool).await) })
        .await?;
    let Some((join_token_id,)) = found else {
        return Err(FleetError::Unauthorized);
    };
    let runner_token = random_token(RUNNER_PREFIX)?;
    let packs: Vec<String> = request.packs.keys().cloned().collect();
    audit
        .append(NewEvent {
            actor: format!("runner:{}", request.name),
            kind: "runner.joined".into(),
            runner: Some(request.name.clone()),
            outcome: Some("ok".into()),
            detail: Some(json!({"url": request.url, "labels": request.labels, "packs": request.packs, "join_token_id": join_token_id, "tls_fingerprint": tls_fingerprint})),
            ..Default::default()
        })
        .await?;
    let sql = db.sql("INSERT INTO runners (name, url, labels, packs, runner_token_hash, joined_at, last_heartbeat, tls_fingerprint) VALUES ($1, $2, $3::jsonb, $4::jsonb, $5, $6::timestamptz, $6::timestamptz, $7) ON CONFLICT (name) DO UPDATE SET url = EXCLUDED.url, labels = EXCLUDED.labels, packs = EXCLUDED.packs, runner_token_hash = EXCLUDED.runner_token_hash, joined_at = EXCLUDED.joined_at, last_heartbeat = EXCLUDED.last_heartbeat, tls_fingerprint = EXCLUDED.tls_fingerprint");
    db.guard(async {
        with_pool!(db, pool => {
            sqlx::query(sql)
                .bind(&request.name)
                .bind(&request.url)
                .bind(serde_json::to_string(&request.labels).expect("labels are JSON"))
                .bind(serde_json::to_string(&packs).expect("packs are JSON"))
                .bind(sha256_hex(runner_token.as_bytes()))
                .bind(&now)
                .bind(&tls_fingerprint)
                .execute(pool)
                .await
                .map(|_| ())
        })
    })
    .await?;
    registry
        .upsert(RunnerEntry {
            name: request.name.clone(),
            url: request.url,
            tls_fingerprint,
            packs: Some(packs),
            labels: request.labels,
        })
        .map_err(|e| FleetError::Invalid(format!("{e:#}")))?;
    registry.record_heartbeat(&request.name, Ok(()));
    Ok(JoinResponse {
        runner_token,
        server_public_key: server_public_key.to_owned(),
        heartbeat_interval_ms: HEARTBEAT_INTERVAL.as_millis() as u64,
    })
}

/// Records a heartbeat from the runner that holds `runner_token`; returns its name.
pub async fn heartbeat(
    db: &Db,
    registry: &Registry,
    runner_token: &str,
) -> Result<String, FleetError> {
    let now = format_at(chrono::Utc::now());
    let sql = db.sql("UPDATE runners SET last_heartbeat = $2::timestamptz WHERE runner_token_hash = $1 RETURNING name");
    let hash = sha256_hex(runner_token.as_bytes());
    let name: Option<(String,)> = db
        .guard(async { with_pool!(db, pool => sqlx::query_as(sql).bind(&hash).bind(&now).fetch_optional(pool).await) })
        .await?;
    let Some((name,)) = name else {
        return Err(FleetError::Unauthorized);
    };
    registry.record_heartbeat(&name, Ok(()));
    Ok(name)
}

/// Loads the joined runners into `registry` now and every `interval` (so a runner that
/// joined through another replica is known here too), until `shutdown`.
pub fn spawn_sync(
    db: Db,
    registry: Arc<Registry>,
    interval: Duration,
    shutdown: CancellationToken,
) {
    tokio::spawn(async move {
        loop {
            let sql =
                db.sql("SELECT name, url, labels::text, packs::text, tls_fingerprint FROM runners");
            #[expect(clippy::type_complexity, reason = "one row of the runners table")]
            let rows: Result<Vec<(String, String, String, String, Option<String>)>, _> = db
                .guard(async { with_pool!(&db, pool => sqlx::query_as(sql).fetch_all(pool).await) })
                .await;
            match rows {
                Ok(rows) => {
                    for (name, url, labels, packs, tls_fingerprint) in rows {
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
                        }) && let Err(e) = registry.upsert(RunnerEntry {
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
