//! People's passkeys (WebAuthn) on the server: the registration ceremony's challenge (one
//! per session, single use, five minutes), the `passkeys` table, listing and removal. The
//! checks of what a browser returns are `protocol::approval::webauthn`'s, the same code the
//! runners verify approvals with.
//!
//! Invariants: a registration is accepted only with the challenge this server gave the same
//! session (or API token) within [`CHALLENGE_TTL`], taken from the store before it is checked,
//! so it is never used twice, even by a registration that fails; a credential id belongs to
//! one passkey (unique in the table: the runners count people by their keys); every
//! registration and removal is audited before it is written; a passkey's signature counter
//! only grows ([`advance_sign_count`], per credential, from the one its registration
//! reported), so an assertion from a clone of the authenticator is refused.

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use serde_json::json;

use crate::protocol::approval::webauthn::{
    self, CoseAlg, PasskeyPublic, RelyingParty, WebauthnError,
};
use crate::server::audit::{AuditLog, NewEvent, format_at, kind};
use crate::server::db::Db;
use crate::with_pool;

/// How long a registration challenge is good for.
pub(crate) const CHALLENGE_TTL: Duration = Duration::from_secs(5 * 60);
/// The longest name a person gives a passkey, in characters.
pub(crate) const MAX_NAME_CHARS: usize = 64;
/// The most passkeys one person may register.
pub(crate) const MAX_PER_PERSON: i64 = 20;
/// The longest attestation object or client data accepted, in bytes (base64url decoded).
const MAX_CEREMONY_BYTES: usize = 16 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum PasskeyError {
    /// The request broke a rule (400).
    #[error("{0}")]
    Invalid(String),
    /// The browser's answer failed a WebAuthn check (400).
    #[error("the passkey was refused: {0}")]
    Refused(#[from] webauthn::WebauthnError),
    /// No registration is under way for this session, or it expired or was used (400).
    #[error(
        "no passkey registration is under way for this session (none was started, it was used, or it is older than 5 minutes): start again"
    )]
    NoChallenge,
    /// Not the caller's to see or change (403).
    #[error("{0}")]
    Forbidden(String),
    /// No such passkey, or not the caller's (404).
    #[error("there is no passkey `{0}` of yours")]
    NotFound(String),
    /// The credential is registered already (409).
    #[error("this passkey's credential is registered already")]
    Duplicate,
    /// The server has no relying party configured (409: a setting, not the request).
    #[error("{0}")]
    NotConfigured(String),
    #[error(transparent)]
    Store(#[from] sqlx::Error),
    #[error(transparent)]
    Audit(#[from] crate::server::audit::AuditError),
}

/// A registered passkey as its owner (and admins) see it: everything an approvers file
/// needs (`credential_id`, `alg`, `public_key`), never anything secret (a passkey has
/// nothing secret on the server).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Passkey {
    pub id: String,
    pub user: String,
    /// base64url without padding.
    pub credential_id: String,
    pub alg: CoseAlg,
    /// SubjectPublicKeyInfo DER, standard base64.
    pub public_key: String,
    pub name: String,
    pub created_at: String,
    pub last_used_at: Option<String>,
}

impl Passkey {
    /// The key as `webauthn` verifies with it.
    pub fn public(&self) -> Result<PasskeyPublic, PasskeyError> {
        let corrupt =
            || PasskeyError::Invalid(format!("passkey `{}` is stored malformed", self.id));
        Ok(PasskeyPublic {
            credential_id: URL_SAFE_NO_PAD
                .decode(&self.credential_id)
                .map_err(|_| corrupt())?,
            alg: self.alg,
            public_key: STANDARD.decode(&self.public_key).map_err(|_| corrupt())?,
        })
    }
}

/// Starts a registration for `user`, from the session or token `owner`: a fresh random
/// challenge replaces any earlier one of the same owner. Returns the challenge.
pub(crate) async fn start(db: &Db, owner: &str, user: &str) -> Result<[u8; 32], PasskeyError> {
    let mut challenge = [0u8; 32];
    getrandom::fill(&mut challenge)
        .map_err(|e| PasskeyError::Invalid(format!("failed to get random bytes: {e}")))?;
    let now = chrono::Utc::now();
    let expires = now + chrono::Duration::from_std(CHALLENGE_TTL).expect("five minutes");
    let (now, expires) = (format_at(now), format_at(expires));
    let sweep = db.sql("DELETE FROM passkey_challenges WHERE expires_at <= $1::timestamptz");
    let upsert = db.sql(
        "INSERT INTO passkey_challenges (owner, user_name, challenge, expires_at) VALUES ($1, $2, $3, $4::timestamptz) \
         ON CONFLICT (owner) DO UPDATE SET user_name = excluded.user_name, challenge = excluded.challenge, expires_at = excluded.expires_at",
    );
    let encoded = URL_SAFE_NO_PAD.encode(challenge);
    db.guard(async {
        with_pool!(db, pool => {
            let mut tx = pool.begin().await?;
            sqlx::query(sweep).bind(&now).execute(&mut *tx).await?;
            sqlx::query(upsert).bind(owner).bind(user).bind(&encoded).bind(&expires).execute(&mut *tx).await?;
            tx.commit().await
        })
    })
    .await?;
    Ok(challenge)
}

/// What the browser's `navigator.credentials.create` returned, as the finish route reads it.
pub(crate) struct Registration<'a> {
    pub name: &'a str,
    /// base64url, as the browser's `rawId`.
    pub credential_id: &'a str,
    pub attestation_object: &'a str,
    pub client_data_json: &'a str,
}

/// Finishes the registration `owner` started for `user`: takes (and so uses up) its
/// challenge, checks the browser's answer against it and `rp`, audits, stores.
pub(crate) async fn finish(
    db: &Db,
    audit: &AuditLog,
    rp: &RelyingParty,
    owner: &str,
    user: &str,
    actor: &str,
    r: Registration<'_>,
) -> Result<Passkey, PasskeyError> {
    crate::util::input::line("name", r.name, MAX_NAME_CHARS).map_err(PasskeyError::Invalid)?;
    if r.name.trim().is_empty() {
        return Err(PasskeyError::Invalid(
            "`name` must say which passkey this is (e.g. `laptop`)".into(),
        ));
    }
    let decode = |field: &str, text: &str| {
        if text.len() > MAX_CEREMONY_BYTES * 4 / 3 + 4 {
            return Err(PasskeyError::Invalid(format!(
                "`{field}` must be at most {MAX_CEREMONY_BYTES} bytes"
            )));
        }
        URL_SAFE_NO_PAD.decode(text).map_err(|_| {
            PasskeyError::Invalid(format!("`{field}` must be base64url without padding"))
        })
    };
    let credential_id = decode("credential_id", r.credential_id)?;
    let attestation_object = decode("attestation_object", r.attestation_object)?;
    let client_data_json = decode("client_data_json", r.client_data_json)?;
    // Taken before it is checked: a challenge is good for one attempt, passed or failed.
    let challenge = take_challenge(db, owner, user).await?;
    let key = webauthn::parse_registration(rp, &challenge, &attestation_object, &client_data_json)?;
    if key.credential_id != credential_id {
        return Err(PasskeyError::Invalid(
            "`credential_id` must be the credential the attestation object carries".into(),
        ));
    }
    let initial_count = webauthn::registration_sign_count(&attestation_object)?;
    let credential_id = URL_SAFE_NO_PAD.encode(&key.credential_id);
    if find_by_credential(db, &credential_id).await?.is_some() {
        return Err(PasskeyError::Duplicate);
    }
    if count_of(db, user).await? >= MAX_PER_PERSON {
        return Err(PasskeyError::Invalid(format!(
            "a person may register at most {MAX_PER_PERSON} passkeys: remove one first"
        )));
    }
    let passkey = Passkey {
        id: uuid::Uuid::new_v4().to_string(),
        user: user.to_owned(),
        credential_id,
        alg: key.alg,
        public_key: STANDARD.encode(&key.public_key),
        name: r.name.to_owned(),
        created_at: format_at(chrono::Utc::now()),
        last_used_at: None,
    };
    audit
        .append(NewEvent {
            actor: actor.to_owned(),
            kind: kind::PASSKEY_REGISTERED.into(),
            outcome: Some("ok".into()),
            detail: Some(json!({
                "passkey": passkey.id,
                "user": passkey.user,
                "name": passkey.name,
                "credential_id": passkey.credential_id,
                "alg": passkey.alg,
                "public_key_sha256": crate::digest::sha256_hex(&key.public_key),
                "rp_id": rp.rp_id,
            })),
            ..Default::default()
        })
        .await?;
    let insert = db.sql("INSERT INTO passkeys (id, user_name, credential_id, alg, public_key, name, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7::timestamptz)");
    let inserted = db
        .guard(async {
            with_pool!(db, pool => sqlx::query(insert)
                .bind(&passkey.id)
                .bind(&passkey.user)
                .bind(&passkey.credential_id)
                .bind(passkey.alg.as_str())
                .bind(&passkey.public_key)
                .bind(&passkey.name)
                .bind(&passkey.created_at)
                .execute(pool)
                .await
                .map(|_| ()))
        })
        .await;
    match inserted {
        Ok(_) => {
            // The counter the authenticator starts from (§7.1): its first signature must
            // count past it. A counter kept from before (the credential was registered and
            // removed) is never lowered: the authenticator's own counter only grows.
            // The passkey is stored either way: without this floor its first signature sets
            // one.
            if initial_count > 0 {
                match advance_sign_count(db, &passkey.credential_id, initial_count).await {
                    Ok(()) | Err(PasskeyError::Refused(WebauthnError::SignCount { .. })) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, passkey = %passkey.id, "the counter a new passkey starts from was not stored");
                    }
                }
            }
            Ok(passkey)
        }
        // Two registrations of one credential at once: the table's unique index decides.
        Err(sqlx::Error::Database(e)) if e.is_unique_violation() => Err(PasskeyError::Duplicate),
        Err(e) => Err(e.into()),
    }
}

/// Removes `owner`'s challenge and returns it, if it is live and was started for `user`.
async fn take_challenge(db: &Db, owner: &str, user: &str) -> Result<Vec<u8>, PasskeyError> {
    let now = format_at(chrono::Utc::now());
    let sql = db.sql("DELETE FROM passkey_challenges WHERE owner = $1 RETURNING user_name, challenge, expires_at > $2::timestamptz");
    let row: Option<(String, String, bool)> = db
        .guard(async {
            with_pool!(db, pool => sqlx::query_as(sql).bind(owner).bind(&now).fetch_optional(pool).await)
        })
        .await?;
    match row {
        Some((started_for, challenge, true)) if started_for == user => URL_SAFE_NO_PAD
            .decode(challenge)
            .map_err(|_| PasskeyError::NoChallenge),
        _ => Err(PasskeyError::NoChallenge),
    }
}

fn select(db: &Db, filter: &str) -> String {
    format!(
        "SELECT id, user_name, credential_id, alg, public_key, name, {}, {} FROM passkeys WHERE {filter} ORDER BY created_at, id",
        db.at_text("created_at"),
        db.at_text("last_used_at"),
    )
}

type Row = (
    String,
    String,
    String,
    String,
    String,
    String,
    String,
    Option<String>,
);

fn from_row(row: Row) -> Result<Passkey, PasskeyError> {
    let (id, user, credential_id, alg, public_key, name, created_at, last_used_at) = row;
    let alg = CoseAlg::parse(&alg)
        .ok_or_else(|| PasskeyError::Invalid(format!("passkey `{id}` has an unknown alg")))?;
    Ok(Passkey {
        id,
        user,
        credential_id,
        alg,
        public_key,
        name,
        created_at,
        last_used_at,
    })
}

/// `user`'s passkeys, oldest first.
pub async fn of_user(db: &Db, user: &str) -> Result<Vec<Passkey>, PasskeyError> {
    let sql = db.sql(select(db, "user_name = $1"));
    let rows: Vec<Row> = db
        .guard(async {
            with_pool!(db, pool => sqlx::query_as(sql).bind(user).fetch_all(pool).await)
        })
        .await?;
    rows.into_iter().map(from_row).collect()
}

/// The passkey with this credential id (base64url), whoever's it is.
pub(crate) async fn find_by_credential(
    db: &Db,
    credential_id: &str,
) -> Result<Option<Passkey>, PasskeyError> {
    let sql = db.sql(select(db, "credential_id = $1"));
    let row: Option<Row> = db
        .guard(async {
            with_pool!(db, pool => sqlx::query_as(sql).bind(credential_id).fetch_optional(pool).await)
        })
        .await?;
    row.map(from_row).transpose()
}

async fn count_of(db: &Db, user: &str) -> Result<i64, PasskeyError> {
    let n: i64 = db
        .guard(async {
            with_pool!(db, pool => sqlx::query_scalar("SELECT COUNT(*) FROM passkeys WHERE user_name = $1").bind(user).fetch_one(pool).await)
        })
        .await?;
    Ok(n)
}

/// How often [`advance_sign_count`] reads and writes again when another writer moved the
/// same credential's counter in between (two signatures of one passkey at the same moment).
const SIGN_COUNT_ATTEMPTS: usize = 8;

/// WebAuthn's signature counter for the credential `credential_id` (base64url): refuses
/// `asserted` unless it is greater than the last counter this server accepted from it
/// (`webauthn::check_sign_count` decides; a counter that does not grow is a cloned
/// authenticator's), else remembers it. Only a verified signature's counter may come here:
/// anyone else could move a person's counter up and lock their passkey out.
///
/// A compare-and-set on the stored counter, so two replicas never both accept one counter:
/// the write happens only if the counter is still the one the decision read.
pub(crate) async fn advance_sign_count(
    db: &Db,
    credential_id: &str,
    asserted: u32,
) -> Result<(), PasskeyError> {
    for _ in 0..SIGN_COUNT_ATTEMPTS {
        let select = db.sql("SELECT sign_count FROM passkey_sign_counts WHERE credential_id = $1");
        let insert = db.sql("INSERT INTO passkey_sign_counts (credential_id, sign_count, updated_at) VALUES ($1, $2, $3::timestamptz) ON CONFLICT (credential_id) DO NOTHING");
        let update = db.sql("UPDATE passkey_sign_counts SET sign_count = $2, updated_at = $3::timestamptz WHERE credential_id = $1 AND sign_count = $4");
        let stored: Option<i64> = db
            .guard(async {
                with_pool!(db, pool => sqlx::query_scalar(select).bind(credential_id).fetch_optional(pool).await)
            })
            .await?;
        let last = stored.map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX));
        let Some(next) = webauthn::check_sign_count(last, asserted)? else {
            return Ok(());
        };
        let now = format_at(chrono::Utc::now());
        let written: u64 = db
            .guard(async {
                with_pool!(db, pool => match stored {
                    None => sqlx::query(insert)
                        .bind(credential_id)
                        .bind(i64::from(next))
                        .bind(&now)
                        .execute(pool)
                        .await
                        .map(|r| r.rows_affected()),
                    Some(old) => sqlx::query(update)
                        .bind(credential_id)
                        .bind(i64::from(next))
                        .bind(&now)
                        .bind(old)
                        .execute(pool)
                        .await
                        .map(|r| r.rows_affected()),
                })
            })
            .await?;
        if written == 1 {
            return Ok(());
        }
    }
    Err(PasskeyError::Invalid(format!(
        "the passkey's signature counter changed {SIGN_COUNT_ATTEMPTS} times while this signature was checked: sign again"
    )))
}

/// Records that a passkey signed an approval just now.
pub async fn touch(db: &Db, credential_id: &str) -> Result<(), PasskeyError> {
    let now = format_at(chrono::Utc::now());
    let sql = db.sql("UPDATE passkeys SET last_used_at = $2::timestamptz WHERE credential_id = $1");
    db.guard(async {
        with_pool!(db, pool => sqlx::query(sql).bind(credential_id).bind(&now).execute(pool).await.map(|_| ()))
    })
    .await?;
    Ok(())
}

/// Removes passkey `id`: the caller's own, or anyone's for an admin (`any_owner`). Audited
/// before it is deleted.
pub(crate) async fn remove(
    db: &Db,
    audit: &AuditLog,
    id: &str,
    user: &str,
    any_owner: bool,
    actor: &str,
) -> Result<Passkey, PasskeyError> {
    let sql = db.sql(select(db, "id = $1"));
    let row: Option<Row> = db
        .guard(async {
            with_pool!(db, pool => sqlx::query_as(sql).bind(id).fetch_optional(pool).await)
        })
        .await?;
    let passkey = match row.map(from_row).transpose()? {
        Some(p) if any_owner || p.user == user => p,
        // Another person's passkey is, to a non-admin, one that does not exist.
        _ => return Err(PasskeyError::NotFound(id.to_owned())),
    };
    audit
        .append(NewEvent {
            actor: actor.to_owned(),
            kind: kind::PASSKEY_REMOVED.into(),
            outcome: Some("ok".into()),
            detail: Some(json!({
                "passkey": passkey.id,
                "user": passkey.user,
                "name": passkey.name,
                "credential_id": passkey.credential_id,
            })),
            ..Default::default()
        })
        .await?;
    db.guard(async {
        with_pool!(db, pool => sqlx::query("DELETE FROM passkeys WHERE id = $1").bind(id).execute(pool).await.map(|_| ()))
    })
    .await?;
    Ok(passkey)
}
