//! The server's side of a runner's identity over HTTP: a join with a join token, a
//! re-registration with the runner's own credential, and heartbeats. See the module
//! invariants in `fleet`.
//!
//! A runner's URL must be https (http only with `insecure_http`), and the fingerprint of the
//! certificate it sends when it joins or re-registers is stored with it and pinned: calls go
//! to that certificate only.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use serde_json::json;
use sqlx::{PgPool, SqlitePool};

use super::join_tokens::check_labels;
use super::{
    FleetError, MAX_LABELS, MAX_PACKS, MAX_URL_LEN, NameRule, RUNNER_PREFIX, kind, random_secret,
};
use crate::digest::sha256_hex;
use crate::protocol::{JoinRequest, JoinResponse, RegisterRequest, RegisterResponse};
use crate::server::audit::{AuditLog, NewEvent, RefusalKey, format_at};
use crate::server::config::RunnerEntry;
use crate::server::db::{Db, Pool};
use crate::server::runners::registry::Registry;
use crate::util::input::is_identifier;
use crate::with_pool;

/// What a usable join token grants, as the consuming `UPDATE` returned it.
#[derive(Debug)]
struct Grant {
    id: String,
    name: NameRule,
    labels: BTreeMap<String, String>,
    /// The packs the token grants; the runner serves those of them it announces.
    packs: BTreeSet<String>,
}

/// A row the consuming `UPDATE` returns: the token's id, runner name, name pattern, labels
/// (JSON) and packs (JSON).
type Consumed = (String, Option<String>, Option<String>, String, String);

impl Grant {
    /// The grant a consumed token use carries. Labels or packs that do not parse grant
    /// nothing (they were written by `issue_join_token` as JSON, so this is a damaged row).
    fn from_consumed((id, name, pattern, labels, packs): Consumed) -> Self {
        Grant {
            id,
            name: NameRule::from_columns(name, pattern),
            labels: serde_json::from_str(&labels).unwrap_or_default(),
            packs: serde_json::from_str(&packs).unwrap_or_default(),
        }
    }

    /// The packs a runner announcing `announced` serves under this grant: both lists.
    fn served(&self, announced: &BTreeMap<String, String>) -> Vec<String> {
        split_packs(&self.packs, announced).0
    }
}

/// One join's values, fixed before the store is touched, and the request they are for.
struct Attempt<'r> {
    request: &'r JoinRequest,
    /// The join token's hash.
    hash: String,
    now: String,
    runner_token_hash: String,
    tls_fingerprint: Option<String>,
}

/// An attempt's outcome inside its transaction: the grant the runner joined with, or why it
/// may not join (`None`: no use of the token was left to consume).
type Attempted = Result<Grant, Option<Refusal>>;

/// The JSON columns of the runner row a granted join inserts.
#[derive(Debug, PartialEq)]
struct RunnerRow {
    labels: String,
    /// The announced packs the grant lets the runner serve.
    served: String,
    /// The packs the grant names.
    granted: String,
}

impl RunnerRow {
    fn new(grant: &Grant, request: &JoinRequest) -> Self {
        RunnerRow {
            labels: serde_json::to_string(&grant.labels).expect("labels are JSON"),
            served: serde_json::to_string(&grant.served(&request.packs)).expect("packs are JSON"),
            granted: serde_json::to_string(&grant.packs).expect("packs are JSON"),
        }
    }
}

/// The attempt's outcome once the runner's insert ran: joined, or refused because a runner
/// of that name joined before (the insert wrote nothing).
fn inserted_or_joined(grant: Grant, inserted: bool, request: &JoinRequest) -> Attempted {
    if inserted {
        Ok(grant)
    } else {
        Err(Some(Refusal::new(
            already_joined(&request.name),
            Some(&grant),
        )))
    }
}

/// The announced packs, split into those `granted` names (served) and the rest (announced,
/// never served), each in name order.
fn split_packs(
    granted: &BTreeSet<String>,
    announced: &BTreeMap<String, String>,
) -> (Vec<String>, Vec<String>) {
    announced.keys().cloned().partition(|p| granted.contains(p))
}

/// A join the server will not make: the status it answers with and why.
#[derive(Debug)]
struct Refusal {
    error: FleetError,
    join_token_id: Option<String>,
}

impl Refusal {
    fn new(error: FleetError, grant: Option<&Grant>) -> Self {
        Refusal {
            error,
            join_token_id: grant.map(|g| g.id.clone()),
        }
    }
}

/// Whether a join token can be used now: its id, or why not.
enum Usable {
    Yes(String),
    No(Refusal),
}

/// The server's side of runners' identity. One per process, shared by the HTTP handlers.
pub struct Fleet {
    db: Db,
    audit: AuditLog,
    registry: Arc<Registry>,
    /// Handed to runners that join, so they can verify the calls this server signs.
    server_public_key: String,
    /// SQLite only (a single replica): joins one at a time, so the decision made in a
    /// rolled-back transaction still holds when it is repeated after the audit event.
    local: tokio::sync::Mutex<()>,
    /// PostgreSQL: joins in flight, each holding a pooled connection (and the token's row
    /// lock) while its audit event is written through another. Kept well below the pool
    /// size so the audit writer always finds a connection. A refused join gives its slot
    /// back before it is audited, and a token that cannot be used never takes one.
    in_flight: tokio::sync::Semaphore,
    /// Join attempts per client address, checked before anything else.
    limits: super::JoinLimits,
    /// Writes heartbeats, those that arrive together with one statement.
    heartbeats: super::heartbeats::Heartbeats,
}

const CONSUME: &str = "UPDATE join_tokens SET uses = uses + 1 WHERE token_hash = $1 AND revoked_at IS NULL AND expires_at > $2::timestamptz AND uses < max_uses RETURNING id, runner_name, name_pattern, labels::text, packs::text";
const INSERT_RUNNER: &str = "INSERT INTO runners (name, url, labels, packs, runner_token_hash, joined_at, last_heartbeat, join_token_id, tls_fingerprint, granted_packs) VALUES ($1, $2, $3::jsonb, $4::jsonb, $5, $6::timestamptz, $6::timestamptz, $7, $8, $9::jsonb) ON CONFLICT (name) DO NOTHING RETURNING name";

impl Fleet {
    pub(crate) fn new(
        db: Db,
        audit: AuditLog,
        registry: Arc<Registry>,
        server_public_key: String,
        joins_per_minute: u32,
    ) -> Self {
        Fleet {
            heartbeats: super::heartbeats::Heartbeats::new(db.clone()),
            db,
            audit,
            registry,
            server_public_key,
            local: tokio::sync::Mutex::new(()),
            in_flight: tokio::sync::Semaphore::new(4),
            limits: super::JoinLimits::per_minute(joins_per_minute),
        }
    }

    /// Joins a runner with the join token whose secret is `secret`, for a request from
    /// `client` (the address the join limits count); see the module's invariants.
    pub(crate) async fn join(
        &self,
        client: IpAddr,
        secret: &str,
        request: JoinRequest,
    ) -> Result<JoinResponse, FleetError> {
        let tls_fingerprint = self.admit(client, &request).await?;
        let runner_token =
            random_secret(RUNNER_PREFIX).map_err(|e| FleetError::Invalid(e.to_string()))?;
        let attempt = Attempt {
            request: &request,
            hash: sha256_hex(secret.as_bytes()),
            now: format_at(chrono::Utc::now()),
            runner_token_hash: sha256_hex(runner_token.as_bytes()),
            tls_fingerprint,
        };
        self.check_token_and_url(client, &attempt).await?;
        let grant = match self.db.pool() {
            Pool::Pg(pool) => self.join_on_postgres(pool, client, &attempt).await?,
            Pool::Sqlite(pool) => self.join_on_sqlite(pool, client, &attempt).await?,
        };
        let tls_fingerprint = attempt.tls_fingerprint;
        Ok(self.welcome(&request, grant, tls_fingerprint, runner_token))
    }

    /// The checks a join passes before the store is read: the request's shape (the pin it
    /// carries is the answer), then the client's join limit. A refusal is audited.
    async fn admit(
        &self,
        client: IpAddr,
        request: &JoinRequest,
    ) -> Result<Option<String>, FleetError> {
        let tls_fingerprint =
            match check_join_request(request, self.registry.trust().insecure_http()) {
                Ok(pin) => pin,
                Err(e) => {
                    self.audit_refusal(client, shape_refusal(request, &e), &e, false)
                        .await;
                    return Err(e);
                }
            };
        // Before the store: a flood of joins from one address stops here. (The shape checks
        // above need no store, so malformed requests are not counted against the limit.)
        if let Err(limited) = self.limits.check(client) {
            crate::server::metrics::join_rate_limited();
            let e = FleetError::TooMany(limited.message());
            self.audit_refusal(client, shape_refusal(request, &e), &e, false)
                .await;
            return Err(e);
        }
        Ok(tls_fingerprint)
    }

    /// The checks that need the store but take no join slot or lock: the token is usable,
    /// and the URL points into the join networks. A refusal is audited.
    async fn check_token_and_url(
        &self,
        client: IpAddr,
        attempt: &Attempt<'_>,
    ) -> Result<(), FleetError> {
        // A token that cannot be used (made up, revoked, expired, used up) is refused here,
        // before a join slot or the join lock is taken, so a flood of them never queues the
        // joins that can succeed. (A token used up between here and the consuming `UPDATE`
        // is still refused there.)
        if let Usable::No(refusal) = self.usable(&attempt.hash).await? {
            return Err(self
                .refuse(client, attempt.request, &attempt.hash, Some(refusal))
                .await);
        }
        // Where the URL points, only for a usable token and after the limit: a name is
        // resolved here, which nobody without a token may make the server do at will.
        if let Err(e) = self.check_networks(&attempt.request.url).await {
            self.audit_refusal(client, shape_refusal(attempt.request, &e), &e, true)
                .await;
            return Err(e);
        }
        Ok(())
    }

    /// PostgreSQL: the attempt and its audit event commit together, the token's row locked
    /// (and a join slot held) in between; a refusal is audited after the slot is given back.
    async fn join_on_postgres(
        &self,
        pool: &PgPool,
        client: IpAddr,
        attempt: &Attempt<'_>,
    ) -> Result<Grant, FleetError> {
        let (slot, mut tx) = self.db.begin_holding_slot(pool, &self.in_flight).await?;
        match self.attempt_on_postgres(&mut tx, attempt).await? {
            Ok(grant) => {
                self.audit
                    .append(joined_event(
                        attempt.request,
                        &grant,
                        &attempt.tls_fingerprint,
                    ))
                    .await?;
                tx.commit().await?;
                Ok(grant)
            }
            Err(refusal) => {
                tx.rollback().await?;
                // The refusal is audited without the slot: it is another join's.
                drop(slot);
                Err(self
                    .refuse(client, attempt.request, &attempt.hash, refusal)
                    .await)
            }
        }
    }

    /// SQLite cannot keep its write lock while the audit writer commits, so the decision is
    /// made in a transaction that is rolled back, the event made durable, and the same
    /// statements repeated and committed; the mutex keeps other joins out in between.
    async fn join_on_sqlite(
        &self,
        pool: &SqlitePool,
        client: IpAddr,
        attempt: &Attempt<'_>,
    ) -> Result<Grant, FleetError> {
        let lock = self.local.lock().await;
        let mut tx = self.db.guard(pool.begin()).await?;
        let decided = self.attempt_on_sqlite(&mut tx, attempt).await?;
        tx.rollback().await?;
        let grant = match decided {
            Ok(grant) => grant,
            Err(refusal) => {
                drop(lock);
                return Err(self
                    .refuse(client, attempt.request, &attempt.hash, refusal)
                    .await);
            }
        };
        self.audit
            .append(joined_event(
                attempt.request,
                &grant,
                &attempt.tls_fingerprint,
            ))
            .await?;
        let mut tx = self.db.guard(pool.begin()).await?;
        match self.attempt_on_sqlite(&mut tx, attempt).await? {
            Ok(_) => {
                tx.commit().await?;
                Ok(grant)
            }
            Err(refusal) => {
                // Another process (the CLI) changed the token or the runner between the two
                // attempts.
                tx.rollback().await?;
                drop(lock);
                Err(self
                    .refuse(client, attempt.request, &attempt.hash, refusal)
                    .await)
            }
        }
    }

    /// One attempt on PostgreSQL: consume a use of the token, decide, insert the runner; the
    /// caller commits or rolls back.
    async fn attempt_on_postgres(
        &self,
        tx: &mut sqlx::PgConnection,
        attempt: &Attempt<'_>,
    ) -> Result<Attempted, FleetError> {
        let consumed: Option<Consumed> = sqlx::query_as(self.db.sql(CONSUME))
            .bind(&attempt.hash)
            .bind(&attempt.now)
            .fetch_optional(&mut *tx)
            .await?;
        let grant = match self.granted(consumed, attempt.request) {
            Ok(grant) => grant,
            Err(refusal) => return Ok(Err(refusal)),
        };
        let row = RunnerRow::new(&grant, attempt.request);
        let inserted: Option<(String,)> = sqlx::query_as(self.db.sql(INSERT_RUNNER))
            .bind(&attempt.request.name)
            .bind(&attempt.request.url)
            .bind(&row.labels)
            .bind(&row.served)
            .bind(&attempt.runner_token_hash)
            .bind(&attempt.now)
            .bind(&grant.id)
            .bind(&attempt.tls_fingerprint)
            .bind(&row.granted)
            .fetch_optional(&mut *tx)
            .await?;
        Ok(inserted_or_joined(
            grant,
            inserted.is_some(),
            attempt.request,
        ))
    }

    /// One attempt on SQLite: the same statements as [`Self::attempt_on_postgres`].
    async fn attempt_on_sqlite(
        &self,
        tx: &mut sqlx::SqliteConnection,
        attempt: &Attempt<'_>,
    ) -> Result<Attempted, FleetError> {
        let consumed: Option<Consumed> = sqlx::query_as(self.db.sql(CONSUME))
            .bind(&attempt.hash)
            .bind(&attempt.now)
            .fetch_optional(&mut *tx)
            .await?;
        let grant = match self.granted(consumed, attempt.request) {
            Ok(grant) => grant,
            Err(refusal) => return Ok(Err(refusal)),
        };
        let row = RunnerRow::new(&grant, attempt.request);
        let inserted: Option<(String,)> = sqlx::query_as(self.db.sql(INSERT_RUNNER))
            .bind(&attempt.request.name)
            .bind(&attempt.request.url)
            .bind(&row.labels)
            .bind(&row.served)
            .bind(&attempt.runner_token_hash)
            .bind(&attempt.now)
            .bind(&grant.id)
            .bind(&attempt.tls_fingerprint)
            .bind(&row.granted)
            .fetch_optional(&mut *tx)
            .await?;
        Ok(inserted_or_joined(
            grant,
            inserted.is_some(),
            attempt.request,
        ))
    }

    /// The grant of the token use the consuming `UPDATE` returned, if the request may join
    /// with it; `Err(None)` when no use was left to consume.
    fn granted(
        &self,
        consumed: Option<Consumed>,
        request: &JoinRequest,
    ) -> Result<Grant, Option<Refusal>> {
        let grant = Grant::from_consumed(consumed.ok_or(None)?);
        match self.decide(&grant, request) {
            Ok(()) => Ok(grant),
            Err(e) => Err(Some(Refusal::new(e, Some(&grant)))),
        }
    }

    /// Loads a joined runner into the registry and answers it. The URL and pin were checked
    /// before the join was written, so loading fails only if no client can be built at all;
    /// the row stays and the sync tries again.
    fn welcome(
        &self,
        request: &JoinRequest,
        grant: Grant,
        tls_fingerprint: Option<String>,
        runner_token: String,
    ) -> JoinResponse {
        let (packs, unserved) = split_packs(&grant.packs, &request.packs);
        if !unserved.is_empty() {
            tracing::warn!(runner = %request.name, packs = ?unserved, "a joined runner announced packs its join token does not grant; it is never sent their calls");
        }
        if let Err(e) = self.registry.upsert_joined(RunnerEntry {
            name: request.name.clone(),
            url: request.url.clone(),
            tls_fingerprint,
            packs: Some(packs.clone()),
            labels: grant.labels.clone(),
        }) {
            tracing::error!(runner = %request.name, error = %format!("{e:#}"), "joined runner not loaded");
        }
        self.registry.record_heartbeat(&request.name, Ok(()));
        JoinResponse {
            runner_token,
            server_public_key: self.server_public_key.clone(),
            heartbeat_interval_ms: self.heartbeat_interval_ms(),
            labels: grant.labels,
            packs,
        }
    }

    /// The URL's host (an address, or every address its name resolves to now) lies in the
    /// join networks; the runner's client checks again on every connection.
    async fn check_networks(&self, url: &str) -> Result<(), FleetError> {
        let parsed = reqwest::Url::parse(url)
            .map_err(|_| FleetError::Invalid("`url` is not a URL".into()))?;
        self.registry
            .trust()
            .join_networks()
            .check_url(&parsed)
            .await
            .map_err(FleetError::Forbidden)
    }

    /// May a runner named and labelled as `request` join with `grant`? The last check (no
    /// runner of that name joined before) is the insert itself.
    fn decide(&self, grant: &Grant, request: &JoinRequest) -> Result<(), FleetError> {
        if !grant.name.matches(&request.name) {
            return Err(FleetError::Forbidden(match &grant.name {
                NameRule::Exact(n) => format!(
                    "this join token is for runner `{n}`, not `{}`",
                    request.name
                ),
                other => format!(
                    "this join token admits runners by {other}; `{}` does not match",
                    request.name
                ),
            }));
        }
        let not_granted: Vec<String> = request
            .labels
            .iter()
            .filter(|(k, v)| grant.labels.get(*k) != Some(*v))
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        if !not_granted.is_empty() {
            let granted: Vec<String> = grant
                .labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            return Err(FleetError::Forbidden(format!(
                "this join token does not grant the labels {} (it grants {}): a runner gets exactly its join token's labels; leave `labels` out of the runner's config or issue a token with them",
                not_granted.join(", "),
                if granted.is_empty() {
                    "none".into()
                } else {
                    granted.join(", ")
                }
            )));
        }
        if self.registry.is_configured(&request.name) {
            return Err(FleetError::Conflict(format!(
                "`{}` is a runner in the server's config; a join cannot replace it: give the joining runner another name",
                request.name
            )));
        }
        Ok(())
    }

    /// Audits a refused join and returns the error to answer with. A refusal the audit log
    /// cannot record is still a refusal (and logged). Called holding no join slot or lock.
    async fn refuse(
        &self,
        client: IpAddr,
        request: &JoinRequest,
        hash: &str,
        refusal: Option<Refusal>,
    ) -> FleetError {
        let refusal = match refusal {
            Some(r) => r,
            None => match self.why_unusable(hash).await {
                Ok(r) => r,
                Err(e) => return e,
            },
        };
        let event = NewEvent {
            actor: format!("runner:{}", request.name),
            kind: kind::RUNNER_JOIN_REFUSED.into(),
            runner: Some(request.name.clone()),
            outcome: Some("refused".into()),
            detail: Some(json!({
                "reason": refusal.error.to_string(),
                "join_token_id": refusal.join_token_id,
                "url": request.url,
                "labels": request.labels,
            })),
            ..Default::default()
        };
        let token_known = refusal.join_token_id.is_some();
        self.audit_refusal(client, event, &refusal.error, token_known)
            .await;
        refusal.error
    }

    /// Records a refused join as `runner.join_refused`. The refusals anyone can repeat
    /// without a real token (a malformed request, the join limit, an unknown token) are
    /// counted per client address (the endpoint is unauthenticated, so the address is the
    /// caller): the first of its class in the window is its own event, the rest one
    /// `refusal.repeated`. A refusal of a real token (`token_known`: used up, expired,
    /// revoked, a name or labels it does not grant) is one event each: it takes a token an
    /// operator issued, and it comes after the join limit, which bounds it.
    async fn audit_refusal(
        &self,
        client: IpAddr,
        event: NewEvent,
        error: &FleetError,
        token_known: bool,
    ) {
        let written = match repeatable_class(error, token_known) {
            Some(class) => {
                let key = RefusalKey {
                    kind: kind::RUNNER_JOIN_REFUSED,
                    caller: format!("address:{client}"),
                    class,
                };
                self.audit.refused(key, event).await.map(|_| ())
            }
            None => self.audit.append(event).await.map(|_| ()),
        };
        if let Err(e) = written {
            tracing::error!(error = %e, "a refused join could not be audited");
        }
    }

    /// Why the consuming `UPDATE` found no usable token with this hash.
    async fn why_unusable(&self, hash: &str) -> Result<Refusal, FleetError> {
        Ok(match self.usable(hash).await? {
            Usable::No(refusal) => refusal,
            // Usable after all: it was in use by a concurrent join that gave it back.
            Usable::Yes(id) => Refusal {
                error: FleetError::Unauthorized(format!(
                    "join token {id} was busy with another join: try again"
                )),
                join_token_id: Some(id),
            },
        })
    }

    /// Whether a join can use the token with this hash now, and if not why.
    async fn usable(&self, hash: &str) -> Result<Usable, FleetError> {
        let now = format_at(chrono::Utc::now());
        let sql = self.db.sql(format!(
            "SELECT id, revoked_at IS NOT NULL, expires_at <= $2::timestamptz, uses, max_uses, {} FROM join_tokens WHERE token_hash = $1",
            self.db.at_text("expires_at")
        ));
        let row: Option<(String, bool, bool, i32, i32, String)> = self
            .db
            .guard(async { with_pool!(self.db, pool => sqlx::query_as(sql).bind(hash).bind(&now).fetch_optional(pool).await) })
            .await?;
        let Some((id, revoked, expired, uses, max_uses, expires_at)) = row else {
            return Ok(Usable::No(Refusal {
                error: FleetError::Unauthorized("the join token is unknown".into()),
                join_token_id: None,
            }));
        };
        let why = if revoked {
            format!("join token {id} was revoked")
        } else if expired {
            format!("join token {id} expired at {expires_at}")
        } else if uses >= max_uses {
            format!(
                "join token {id} is used up ({uses} of {max_uses} joins): a restarting runner re-registers with its own credential; a new runner needs a new join token"
            )
        } else {
            return Ok(Usable::Yes(id));
        };
        Ok(Usable::No(Refusal {
            error: FleetError::Unauthorized(why),
            join_token_id: Some(id),
        }))
    }

    /// Re-registers the runner that holds `runner_token`: its URL and packs may change, its
    /// name and labels never do. Audited (`runner.registered`) before it is written.
    pub(crate) async fn register(
        &self,
        runner_token: &str,
        request: RegisterRequest,
    ) -> Result<RegisterResponse, FleetError> {
        let insecure_http = self.registry.trust().insecure_http();
        check_url(&request.url, insecure_http)?;
        let tls_fingerprint = check_pin(&request.url, request.tls_fingerprint.as_deref())?;
        check_packs(&request.packs)?;
        self.check_networks(&request.url).await?;
        let hash = sha256_hex(runner_token.as_bytes());
        let sql = self.db.sql(
            "SELECT name, labels::text, granted_packs::text FROM runners WHERE runner_token_hash = $1",
        );
        let row: Option<(String, String, Option<String>)> = self
            .db
            .guard(async { with_pool!(self.db, pool => sqlx::query_as(sql).bind(&hash).fetch_optional(pool).await) })
            .await?;
        let Some((name, labels, granted)) = row else {
            tracing::warn!("a runner presented an unknown credential to re-register");
            return Err(unknown_credential());
        };
        if self.registry.is_configured(&name) {
            return Err(FleetError::Conflict(format!(
                "`{name}` is a runner in the server's config; a joined runner of that name is ignored: `emisar runner remove {name}` and join under another name"
            )));
        }
        // The grant fixed at the join bounds what a re-registration may serve; a row without
        // one (damaged) grants nothing.
        let granted: BTreeSet<String> = granted
            .and_then(|g| serde_json::from_str(&g).ok())
            .unwrap_or_default();
        let (packs, unserved) = split_packs(&granted, &request.packs);
        self.audit
            .append(NewEvent {
                actor: format!("runner:{name}"),
                kind: kind::RUNNER_REGISTERED.into(),
                runner: Some(name.clone()),
                outcome: Some("ok".into()),
                detail: Some(json!({"url": request.url, "packs": request.packs, "served": packs, "not_granted": unserved, "tls_fingerprint": tls_fingerprint})),
                ..Default::default()
            })
            .await?;
        let now = format_at(chrono::Utc::now());
        let sql = self.db.sql("UPDATE runners SET url = $2, packs = $3::jsonb, last_heartbeat = $4::timestamptz, tls_fingerprint = $5 WHERE runner_token_hash = $1 RETURNING name");
        let updated: Option<(String,)> = self
            .db
            .guard(async {
                with_pool!(self.db, pool => sqlx::query_as(sql)
                    .bind(&hash)
                    .bind(&request.url)
                    .bind(serde_json::to_string(&packs).expect("packs are JSON"))
                    .bind(&now)
                    .bind(&tls_fingerprint)
                    .fetch_optional(pool)
                    .await)
            })
            .await?;
        if updated.is_none() {
            // Removed between the lookup and the update.
            return Err(unknown_credential());
        }
        if let Err(e) = self.registry.upsert_joined(RunnerEntry {
            name: name.clone(),
            url: request.url,
            tls_fingerprint,
            packs: Some(packs),
            labels: serde_json::from_str(&labels).unwrap_or_default(),
        }) {
            tracing::error!(runner = %name, error = %format!("{e:#}"), "re-registered runner not loaded");
        }
        self.registry.record_heartbeat(&name, Ok(()));
        Ok(RegisterResponse {
            runner: name,
            heartbeat_interval_ms: self.heartbeat_interval_ms(),
        })
    }

    /// The heartbeat interval to tell runners now (see [`super::heartbeat_interval`]).
    fn heartbeat_interval_ms(&self) -> u64 {
        super::heartbeat_interval(self.registry.len()).as_millis() as u64
    }

    /// Records a heartbeat from the runner that holds `runner_token`; answers its name and
    /// the interval it is to keep.
    pub(crate) async fn heartbeat(
        &self,
        runner_token: &str,
    ) -> Result<crate::protocol::HeartbeatResponse, FleetError> {
        let hash = sha256_hex(runner_token.as_bytes());
        let Some(name) = self.heartbeats.beat(hash).await? else {
            return Err(unknown_credential());
        };
        // A joined runner never vouches for the health of a configured one of the same name.
        if !self.registry.is_configured(&name) {
            self.registry.record_heartbeat(&name, Ok(()));
        }
        Ok(crate::protocol::HeartbeatResponse {
            runner: name,
            heartbeat_interval_ms: Some(self.heartbeat_interval_ms()),
        })
    }
}

/// The `runner.join_refused` event of a request refused before its token was looked up (the
/// join limit, or the request's shape): only a name that is an identifier is recorded.
fn shape_refusal(request: &JoinRequest, e: &FleetError) -> NewEvent {
    let named = is_identifier(&request.name).then(|| request.name.clone());
    NewEvent {
        actor: format!("runner:{}", named.as_deref().unwrap_or("unnamed")),
        kind: kind::RUNNER_JOIN_REFUSED.into(),
        runner: named,
        outcome: Some("refused".into()),
        detail: Some(json!({"reason": e.to_string()})),
        ..Default::default()
    }
}

/// The class a refused join is counted under, when anyone can repeat it (see
/// `Fleet::audit_refusal`); `None` when it is written as its own event every time.
fn repeatable_class(e: &FleetError, token_known: bool) -> Option<&'static str> {
    match e {
        FleetError::TooMany(_) => Some("rate_limited"),
        FleetError::Invalid(_) => Some("invalid"),
        FleetError::Unauthorized(_) if !token_known => Some("unknown_token"),
        _ => None,
    }
}

fn unknown_credential() -> FleetError {
    FleetError::Unauthorized(
        "the runner credential is unknown: the runner was removed (`emisar runner remove`) or never joined; join again with a new join token".into(),
    )
}

fn already_joined(name: &str) -> FleetError {
    FleetError::Conflict(format!(
        "runner `{name}` already joined; a restarting runner re-registers with its own credential; to replace it run `emisar runner remove {name}` first"
    ))
}

fn joined_event(
    request: &JoinRequest,
    grant: &Grant,
    tls_fingerprint: &Option<String>,
) -> NewEvent {
    let (served, not_granted) = split_packs(&grant.packs, &request.packs);
    NewEvent {
        actor: format!("runner:{}", request.name),
        kind: kind::RUNNER_JOINED.into(),
        runner: Some(request.name.clone()),
        outcome: Some("ok".into()),
        detail: Some(json!({
            "url": request.url,
            "labels": grant.labels,
            "packs": request.packs,
            "served": served,
            "not_granted": not_granted,
            "join_token_id": grant.id,
            "tls_fingerprint": tls_fingerprint,
        })),
        ..Default::default()
    }
}

/// The shape checks of a join request; returns the certificate pin it carries, normalized.
/// Messages name the field and the rule, and never echo a value that failed them (it may be
/// anything, of any length).
fn check_join_request(
    request: &JoinRequest,
    insecure_http: bool,
) -> Result<Option<String>, FleetError> {
    if !is_identifier(&request.name) {
        return Err(FleetError::Invalid(
            "`name` must be an identifier (letters, digits and `_.@-`, at most 128 characters)"
                .into(),
        ));
    }
    check_url(&request.url, insecure_http)?;
    let pin = check_pin(&request.url, request.tls_fingerprint.as_deref())?;
    check_labels("`labels`", &request.labels).map_err(|_| {
        FleetError::Invalid(format!(
            "`labels`: at most {MAX_LABELS}, each key and value an identifier"
        ))
    })?;
    check_packs(&request.packs)?;
    Ok(pin)
}

/// A runner's URL: http(s) with a host and no credentials; plain `http://` only where this
/// server allows it (`insecure_http`), since calls would travel in clear.
fn check_url(url: &str, insecure_http: bool) -> Result<(), FleetError> {
    let bad = || {
        FleetError::Invalid(format!(
            "`url` must be an http(s) URL of at most {MAX_URL_LEN} printable ASCII characters, with a host, and no credentials, query or fragment"
        ))
    };
    // Printable ASCII only: a URL parser silently drops tabs and line breaks and encodes
    // spaces, so what was checked would not be what is stored and dialled.
    if url.len() > MAX_URL_LEN || !url.chars().all(|c| c.is_ascii_graphic()) {
        return Err(bad());
    }
    let parsed = reqwest::Url::parse(url).map_err(|_| bad())?;
    // No query or fragment: the server appends `/healthz` and `/v1/call`, and a `?` or `#`
    // would turn those into a query or fragment of a path the joiner chose.
    if !matches!(parsed.scheme(), "http" | "https")
        || parsed.host_str().is_none()
        || !parsed.username().is_empty()
        || parsed.password().is_some()
        || parsed.query().is_some()
        || parsed.fragment().is_some()
    {
        return Err(bad());
    }
    if parsed.scheme() == "http" && !insecure_http {
        return Err(FleetError::Invalid(
            "`url` is plain HTTP: calls, arguments and results would travel in clear; the runner must serve https:// (or the server must set insecure_http = true, for loopback tests and `emisar dev` only)".into(),
        ));
    }
    Ok(())
}

/// The certificate fingerprint a runner sends (`sha256:<hex>`), which only an https URL can
/// use. Checked here, before anything is written, so the registry accepts what was stored.
fn check_pin(url: &str, pin: Option<&str>) -> Result<Option<String>, FleetError> {
    let Some(text) = pin else {
        return Ok(None);
    };
    let pin = crate::util::tls::Fingerprint::parse(text).map_err(|_| {
        FleetError::Invalid("`tls_fingerprint` must be `sha256:` followed by 64 hex digits".into())
    })?;
    if !url.starts_with("https://") {
        return Err(FleetError::Invalid(
            "`tls_fingerprint` pins a certificate, but `url` is not https://".into(),
        ));
    }
    Ok(Some(pin.to_string()))
}

fn check_packs(packs: &BTreeMap<String, String>) -> Result<(), FleetError> {
    if packs.len() > MAX_PACKS
        || !packs
            .iter()
            .all(|(name, digest)| is_identifier(name) && is_sha256_hex(digest))
    {
        return Err(FleetError::Invalid(format!(
            "`packs`: at most {MAX_PACKS}, each a pack name and its SHA-256 (64 lowercase hex digits)"
        )));
    }
    Ok(())
}

fn is_sha256_hex(digest: &str) -> bool {
    digest.len() == 64 && digest.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn consumed(labels: &str, packs: &str) -> Consumed {
        (
            "jt_1".into(),
            None,
            Some("edge-*".into()),
            labels.into(),
            packs.into(),
        )
    }

    fn announcing(packs: &[&str]) -> JoinRequest {
        JoinRequest {
            name: "edge-1".into(),
            url: "https://10.0.0.1:7701".into(),
            labels: BTreeMap::new(),
            packs: packs
                .iter()
                .map(|p| ((*p).into(), "ab12".repeat(16)))
                .collect(),
            tls_fingerprint: None,
        }
    }

    #[test]
    fn a_consumed_use_grants_what_its_columns_say_and_a_damaged_one_nothing() {
        let grant = Grant::from_consumed(consumed(r#"{"site":"fra"}"#, r#"["traefik"]"#));
        assert_eq!(grant.id, "jt_1");
        assert_eq!(grant.name, NameRule::Pattern("edge-*".into()));
        assert_eq!(
            grant.labels,
            BTreeMap::from([("site".into(), "fra".into())])
        );
        assert_eq!(grant.packs, BTreeSet::from(["traefik".into()]));

        let damaged = Grant::from_consumed(consumed("{not json", "[1, 2]"));
        assert!(damaged.labels.is_empty() && damaged.packs.is_empty());
    }

    #[test]
    fn the_runner_row_serves_only_the_announced_packs_the_grant_names() {
        let grant = Grant::from_consumed(consumed(r#"{"site":"fra"}"#, r#"["consul", "traefik"]"#));
        let row = RunnerRow::new(&grant, &announcing(&["traefik", "nomad"]));
        assert_eq!(
            row,
            RunnerRow {
                labels: r#"{"site":"fra"}"#.into(),
                served: r#"["traefik"]"#.into(),
                granted: r#"["consul","traefik"]"#.into(),
            }
        );
    }

    #[test]
    fn a_runner_the_insert_did_not_write_had_joined_before() {
        let request = announcing(&[]);
        let grant = || Grant::from_consumed(consumed("{}", "[]"));
        assert_eq!(
            inserted_or_joined(grant(), true, &request).unwrap().id,
            "jt_1"
        );
        let refusal = inserted_or_joined(grant(), false, &request)
            .unwrap_err()
            .expect("a refusal, not a used-up token");
        assert!(matches!(refusal.error, FleetError::Conflict(_)));
        assert!(
            refusal
                .error
                .to_string()
                .contains("`edge-1` already joined")
        );
        assert_eq!(refusal.join_token_id.as_deref(), Some("jt_1"));
    }

    #[test]
    fn join_requests_are_checked_without_echoing_values() {
        let ok = JoinRequest {
            name: "edge-1".into(),
            url: "http://10.0.0.1:7701".into(),
            labels: BTreeMap::new(),
            packs: BTreeMap::from([("traefik".into(), "ab12".repeat(16))]),
            tls_fingerprint: None,
        };
        check_join_request(&ok, true).unwrap();
        let long = "x".repeat(2_000_000);
        for bad in [
            JoinRequest {
                name: long.clone(),
                ..ok.clone()
            },
            JoinRequest {
                name: "a\0b".into(),
                ..ok.clone()
            },
            JoinRequest {
                url: format!("http://{long}"),
                ..ok.clone()
            },
            JoinRequest {
                url: "http://user:pw@host".into(),
                ..ok.clone()
            },
            JoinRequest {
                url: "file:///etc/passwd".into(),
                ..ok.clone()
            },
            JoinRequest {
                url: "http://10.0.0.1:7701/\r\nX: y".into(),
                ..ok.clone()
            },
            JoinRequest {
                url: "http://10.0.0.\t1:7701".into(),
                ..ok.clone()
            },
            JoinRequest {
                url: "http://10.0.0.1:7701/api/approvals/x/approve?".into(),
                ..ok.clone()
            },
            JoinRequest {
                url: "http://10.0.0.1:7701/latest/meta-data/#".into(),
                ..ok.clone()
            },
            JoinRequest {
                packs: BTreeMap::from([("traefik".into(), "not-a-digest".into())]),
                ..ok.clone()
            },
            JoinRequest {
                url: "https://10.0.0.1:7701".into(),
                tls_fingerprint: Some(long.clone()),
                ..ok.clone()
            },
        ] {
            let err = check_join_request(&bad, true).unwrap_err().to_string();
            assert!(
                err.len() < 200 && !err.contains("xxxx") && !err.contains("pw"),
                "{err}"
            );
        }

        // Plain HTTP only where the server allows it; a pin only on an https URL.
        let err = check_join_request(&ok, false).unwrap_err().to_string();
        assert!(err.contains("plain HTTP"), "{err}");
        let pin = format!("sha256:{}", "AB".repeat(32));
        let err = check_join_request(
            &JoinRequest {
                tls_fingerprint: Some(pin.clone()),
                ..ok.clone()
            },
            true,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("not https://"), "{err}");
        let pinned = JoinRequest {
            url: "https://10.0.0.1:7701".into(),
            tls_fingerprint: Some(pin),
            ..ok.clone()
        };
        assert_eq!(
            check_join_request(&pinned, false).unwrap(),
            Some(format!("sha256:{}", "ab".repeat(32))),
            "stored normalized"
        );
    }
}
