//! People: local users with argon2 password hashes, their portal sessions, and the CSRF
//! token each session carries.
//!
//! Invariant: only hashes are stored (argon2 for passwords, which people choose and can be
//! guessed; SHA-256 for session ids, which are 256 random bits). A session cookie never
//! decides a state change alone: the session's CSRF token must come with it.

use std::time::Duration;

use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use base64::Engine;
use serde_json::json;

use crate::digest::sha256_hex;
use crate::server::audit::{AuditLog, NewEvent, RefusalKey, format_at, kind};
use crate::server::db::Db;
use crate::server::principal::Role;
use crate::with_pool;

/// How long a portal session lasts.
pub(crate) const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// The shortest password `emisar user add` accepts.
pub(crate) const MIN_PASSWORD: usize = 12;
/// The longest password, in bytes, anywhere: checked before hashing, so a 2 MB "password"
/// costs nothing.
pub(crate) const MAX_PASSWORD: usize = 1024;
/// The longest a login waits for a turn at password hashing before it is told to retry.
const HASHING_WAIT: Duration = Duration::from_secs(10);

/// Turns at password hashing. argon2 takes tens of milliseconds of CPU by design; it runs on
/// the blocking pool, and never on more cores than this, so a flood of logins cannot starve
/// the async workers that serve everyone else (MCP calls, approvals, health checks).
static HASHING: std::sync::LazyLock<tokio::sync::Semaphore> = std::sync::LazyLock::new(|| {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    tokio::sync::Semaphore::new((cores / 2).max(1))
});

#[derive(Debug, thiserror::Error)]
pub enum UserError {
    #[error("{0}")]
    Invalid(String),
    #[error("the user name or password is wrong")]
    BadLogin,
    #[error("too many logins are being checked at once: try again in a moment")]
    Busy,
    #[error(transparent)]
    Store(#[from] sqlx::Error),
    #[error(transparent)]
    Audit(#[from] crate::server::audit::AuditError),
}

/// A logged-in person.
#[derive(Debug, Clone)]
pub struct Session {
    /// A local user's name, or `person:<id>` for a person signed in through the provider.
    pub user: String,
    /// The broadest of `roles` ([`Role::None`] when there is none).
    pub role: Role,
    /// Every role the person holds: a local user's one, or what the provider's groups granted.
    pub roles: Vec<Role>,
    pub csrf: String,
    /// The SHA-256 of the session id (the id itself lives only in the cookie).
    pub id_hash: String,
    /// Set for a person signed in through the OpenID provider: the name to show them.
    pub display_name: Option<String>,
}

impl Session {
    /// How the audit log names the person of this session.
    pub(crate) fn actor(&self) -> String {
        if self.display_name.is_some() {
            self.user.clone()
        } else {
            format!("{}:{}", self.role.as_str(), self.user)
        }
    }
}

/// 256 random bits, URL-safe.
pub(crate) fn random_token() -> Result<String, UserError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)
        .map_err(|e| UserError::Invalid(format!("failed to get random bytes: {e}")))?;
    Ok(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
}

fn hash_password(password: &str) -> Result<String, UserError> {
    let mut salt = [0u8; 16];
    getrandom::fill(&mut salt)
        .map_err(|e| UserError::Invalid(format!("failed to get random bytes: {e}")))?;
    let salt = SaltString::encode_b64(&salt).map_err(|e| UserError::Invalid(e.to_string()))?;
    argon2::Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| UserError::Invalid(format!("failed to hash the password: {e}")))
}

/// Runs `work` (argon2) on the blocking pool once a hashing turn is free.
async fn hashing<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, UserError> {
    let _turn = tokio::time::timeout(HASHING_WAIT, HASHING.acquire())
        .await
        .map_err(|_| UserError::Busy)?
        .expect("the hashing semaphore is never closed");
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| UserError::Invalid(format!("password hashing failed: {e}")))
}

fn verify_password(password: &str, hash: &str) -> bool {
    PasswordHash::new(hash).is_ok_and(|h| {
        argon2::Argon2::default()
            .verify_password(password.as_bytes(), &h)
            .is_ok()
    })
}

/// Adds a person. Agents are not people: `role` must be approver, auditor or admin.
pub async fn add(
    db: &Db,
    audit: &AuditLog,
    name: &str,
    role: Role,
    password: &str,
    added_by: &str,
) -> Result<(), UserError> {
    crate::util::input::identifier("name", name).map_err(UserError::Invalid)?;
    if role == Role::Agent {
        return Err(UserError::Invalid(
            "`role` must be approver, auditor or admin: agents get tokens (`emisar token issue`), not logins".into(),
        ));
    }
    if password.chars().count() < MIN_PASSWORD {
        return Err(UserError::Invalid(format!(
            "`password` must be at least {MIN_PASSWORD} characters"
        )));
    }
    crate::util::input::secret("password", password, MAX_PASSWORD).map_err(UserError::Invalid)?;
    let owned = password.to_owned();
    let hash = hashing(move || hash_password(&owned)).await??;
    let exists = with_pool!(db, pool => sqlx::query_scalar::<_, String>("SELECT name FROM users WHERE name = $1")
        .bind(name)
        .fetch_optional(pool)
        .await?);
    if exists.is_some() {
        return Err(UserError::Invalid(format!(
            "`name`: user `{name}` exists already"
        )));
    }
    audit
        .append(NewEvent {
            actor: added_by.to_owned(),
            kind: kind::USER_ADDED.into(),
            outcome: Some("ok".into()),
            detail: Some(json!({"user": name, "role": role.as_str()})),
            ..Default::default()
        })
        .await?;
    let now = format_at(chrono::Utc::now());
    let sql = db.sql("INSERT INTO users (name, role, password_hash, created_at) VALUES ($1, $2, $3, $4::timestamptz)");
    with_pool!(db, pool => sqlx::query(sql).bind(name).bind(role.as_str()).bind(&hash).bind(&now).execute(pool).await.map(|_| ())?);
    Ok(())
}

/// Removes a person: their sessions end and their API tokens are revoked at once (a
/// replica that cached a token stops accepting it within 10 s). Their past votes stay in
/// the approval history and the audit log.
pub(crate) async fn remove(
    db: &Db,
    audit: &AuditLog,
    name: &str,
    removed_by: &str,
) -> Result<(), UserError> {
    let Some(role) = role_of(db, name).await? else {
        return Err(UserError::Invalid(format!(
            "`name`: there is no user `{name}`"
        )));
    };
    audit
        .append(NewEvent {
            actor: removed_by.to_owned(),
            kind: kind::USER_REMOVED.into(),
            outcome: Some("ok".into()),
            detail: Some(json!({"user": name, "role": role.as_str()})),
            ..Default::default()
        })
        .await?;
    let now = format_at(chrono::Utc::now());
    let revoke = db.sql("UPDATE agent_tokens SET revoked_at = $2::timestamptz WHERE agent = $1 AND role <> 'agent' AND revoked_at IS NULL");
    with_pool!(db, pool => {
        let mut tx = pool.begin().await?;
        sqlx::query(revoke).bind(name).bind(&now).execute(&mut *tx).await?;
        sqlx::query("DELETE FROM sessions WHERE user_name = $1").bind(name).execute(&mut *tx).await?;
        sqlx::query("DELETE FROM users WHERE name = $1").bind(name).execute(&mut *tx).await?;
        tx.commit().await?;
    });
    Ok(())
}

/// A person as `emisar user list` shows them (never the password hash).
#[derive(Debug, Clone)]
pub(crate) struct UserInfo {
    pub name: String,
    pub role: String,
    pub created_at: String,
    /// Portal sessions that have not expired.
    pub sessions: i64,
}

/// Every local user, by name.
pub(crate) async fn list(db: &Db) -> Result<Vec<UserInfo>, UserError> {
    let now = format_at(chrono::Utc::now());
    let sql = format!(
        "SELECT u.name, u.role, {}, (SELECT COUNT(*) FROM sessions s WHERE s.user_name = u.name AND s.expires_at > $1::timestamptz) FROM users u ORDER BY u.name",
        db.at_text("u.created_at")
    );
    let rows: Vec<(String, String, String, i64)> =
        with_pool!(db, pool => sqlx::query_as(db.sql(sql)).bind(&now).fetch_all(pool).await?);
    Ok(rows
        .into_iter()
        .map(|(name, role, created_at, sessions)| UserInfo {
            name,
            role,
            created_at,
            sessions,
        })
        .collect())
}

/// What a role or password change ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ended {
    pub sessions: u64,
    pub tokens: u64,
}

/// Changes a person's role. Their portal sessions end, and their API tokens are revoked:
/// a token carries the role it was issued with, so one issued before the change would keep
/// acting with the old role. Audited before it is written.
pub(crate) async fn set_role(
    db: &Db,
    audit: &AuditLog,
    name: &str,
    role: Role,
    changed_by: &str,
) -> Result<Ended, UserError> {
    if role == Role::Agent {
        return Err(UserError::Invalid(
            "`role` must be approver, auditor or admin: agents get tokens (`emisar token issue`), not logins".into(),
        ));
    }
    let Some(old) = role_of(db, name).await? else {
        return Err(UserError::Invalid(format!(
            "`name`: there is no user `{name}`"
        )));
    };
    audit
        .append(NewEvent {
            actor: changed_by.to_owned(),
            kind: kind::USER_ROLE_CHANGED.into(),
            outcome: Some("ok".into()),
            detail: Some(json!({"user": name, "from": old.as_str(), "to": role.as_str()})),
            ..Default::default()
        })
        .await?;
    let now = format_at(chrono::Utc::now());
    let update = db.sql("UPDATE users SET role = $2 WHERE name = $1");
    let revoke = db.sql("UPDATE agent_tokens SET revoked_at = $2::timestamptz WHERE agent = $1 AND role <> 'agent' AND revoked_at IS NULL");
    let ended = with_pool!(db, pool => {
        let mut tx = pool.begin().await?;
        sqlx::query(update).bind(name).bind(role.as_str()).execute(&mut *tx).await?;
        let tokens = sqlx::query(revoke).bind(name).bind(&now).execute(&mut *tx).await?.rows_affected();
        let sessions = sqlx::query("DELETE FROM sessions WHERE user_name = $1").bind(name).execute(&mut *tx).await?.rows_affected();
        tx.commit().await?;
        Ended { sessions, tokens }
    });
    Ok(ended)
}

/// Changes a person's password (the same rules as [`add`]). Their portal sessions end;
/// their API tokens stay (they do not depend on the password). Audited before it is written,
/// the password never.
pub(crate) async fn set_password(
    db: &Db,
    audit: &AuditLog,
    name: &str,
    password: &str,
    changed_by: &str,
) -> Result<Ended, UserError> {
    if password.chars().count() < MIN_PASSWORD {
        return Err(UserError::Invalid(format!(
            "`password` must be at least {MIN_PASSWORD} characters"
        )));
    }
    crate::util::input::secret("password", password, MAX_PASSWORD).map_err(UserError::Invalid)?;
    if role_of(db, name).await?.is_none() {
        return Err(UserError::Invalid(format!(
            "`name`: there is no user `{name}`"
        )));
    }
    let owned = password.to_owned();
    let hash = hashing(move || hash_password(&owned)).await??;
    audit
        .append(NewEvent {
            actor: changed_by.to_owned(),
            kind: kind::USER_PASSWORD_CHANGED.into(),
            outcome: Some("ok".into()),
            detail: Some(json!({"user": name})),
            ..Default::default()
        })
        .await?;
    let update = db.sql("UPDATE users SET password_hash = $2 WHERE name = $1");
    let sessions = with_pool!(db, pool => {
        let mut tx = pool.begin().await?;
        sqlx::query(update).bind(name).bind(&hash).execute(&mut *tx).await?;
        let sessions = sqlx::query("DELETE FROM sessions WHERE user_name = $1").bind(name).execute(&mut *tx).await?.rows_affected();
        tx.commit().await?;
        sessions
    });
    Ok(Ended {
        sessions,
        tokens: 0,
    })
}

/// The role of user `name`, if they exist.
pub(crate) async fn role_of(db: &Db, name: &str) -> Result<Option<Role>, UserError> {
    let role = with_pool!(db, pool => sqlx::query_scalar::<_, String>("SELECT role FROM users WHERE name = $1")
        .bind(name)
        .fetch_optional(pool)
        .await?);
    Ok(role.and_then(|r| Role::parse(&r).ok()))
}

/// Checks a password and opens a session. Returns the session and its id (for the cookie).
/// Both outcomes are audited; the password never is.
///
/// At the door, before the store or the hash: `name` must be an identifier and `password` at
/// most [`MAX_PASSWORD`] bytes without NUL ([`UserError::Invalid`], which names the field).
pub async fn login(
    db: &Db,
    audit: &AuditLog,
    name: &str,
    password: &str,
) -> Result<(Session, String), UserError> {
    check_login(name, password)?;
    let row = db
        .guard(async {
            with_pool!(db, pool => sqlx::query_as::<_, (String, String)>("SELECT role, password_hash FROM users WHERE name = $1")
                .bind(name)
                .fetch_optional(pool)
                .await)
        })
        .await?;
    // Hash even for an unknown name, so the answer takes as long either way.
    let (role, ok) = match row {
        Some((role, hash)) => {
            let password = password.to_owned();
            let ok = hashing(move || verify_password(&password, &hash)).await?;
            (Role::parse(&role).ok(), ok)
        }
        None => {
            let password = password.to_owned();
            let _ = hashing(move || hash_password(&password)).await?;
            (None, false)
        }
    };
    let Some(role) = role.filter(|_| ok) else {
        // Guessing can be repeated as fast as the login limits allow: the first failure for
        // a name in a window is its own event, the rest one `refusal.repeated` per window.
        let actor = format!("user:{name}");
        let key = RefusalKey {
            kind: kind::LOGIN_FAILED,
            caller: actor.clone(),
            class: "bad_password",
        };
        let event = NewEvent {
            actor,
            kind: kind::LOGIN_FAILED.into(),
            outcome: Some("refused".into()),
            ..Default::default()
        };
        audit.refused(key, event).await?;
        return Err(UserError::BadLogin);
    };
    let id = random_token()?;
    let session = Session {
        user: name.to_owned(),
        role,
        roles: vec![role],
        csrf: random_token()?,
        id_hash: sha256_hex(id.as_bytes()),
        display_name: None,
    };
    audit
        .append(NewEvent {
            actor: format!("{}:{name}", role.as_str()),
            kind: kind::LOGIN.into(),
            outcome: Some("ok".into()),
            ..Default::default()
        })
        .await?;
    let now = chrono::Utc::now();
    let ttl = chrono::Duration::from_std(SESSION_TTL).expect("a fixed, small duration");
    let sql = db.sql("INSERT INTO sessions (id_hash, user_name, csrf_token, created_at, expires_at) VALUES ($1, $2, $3, $4::timestamptz, $5::timestamptz)");
    with_pool!(db, pool => sqlx::query(sql)
        .bind(&session.id_hash)
        .bind(name)
        .bind(&session.csrf)
        .bind(format_at(now))
        .bind(format_at(now + ttl))
        .execute(pool)
        .await
        .map(|_| ())?);
    Ok((session, id))
}

/// The shape checks of a login, which need neither the store nor a hash.
pub(crate) fn check_login(name: &str, password: &str) -> Result<(), UserError> {
    crate::util::input::identifier("name", name).map_err(UserError::Invalid)?;
    crate::util::input::secret("password", password, MAX_PASSWORD).map_err(UserError::Invalid)
}

/// The live session with this id, if any.
pub async fn session(db: &Db, id: &str) -> Result<Option<Session>, UserError> {
    let id_hash = sha256_hex(id.as_bytes());
    let now = format_at(chrono::Utc::now());
    let sql = db.sql("SELECT s.user_name, u.role, s.csrf_token FROM sessions s JOIN users u ON u.name = s.user_name WHERE s.id_hash = $1 AND s.expires_at > $2::timestamptz");
    let row = db
        .guard(async {
            with_pool!(db, pool => sqlx::query_as::<_, (String, String, String)>(sql)
                .bind(&id_hash)
                .bind(&now)
                .fetch_optional(pool)
                .await)
        })
        .await?;
    Ok(row.and_then(|(user, role, csrf)| {
        Role::parse(&role).ok().map(|role| Session {
            user,
            role,
            roles: vec![role],
            csrf,
            id_hash,
            display_name: None,
        })
    }))
}

/// Ends a session.
pub(crate) async fn logout(db: &Db, audit: &AuditLog, s: &Session) -> Result<(), UserError> {
    with_pool!(db, pool => sqlx::query("DELETE FROM sessions WHERE id_hash = $1").bind(&s.id_hash).execute(pool).await.map(|_| ())?);
    audit
        .append(NewEvent {
            actor: format!("{}:{}", s.role.as_str(), s.user),
            kind: kind::LOGOUT.into(),
            outcome: Some("ok".into()),
            ..Default::default()
        })
        .await?;
    Ok(())
}

/// Compares two secrets in time independent of where they differ.
pub(crate) fn same_secret(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_verify_only_themselves() {
        let h = hash_password("correct horse battery").unwrap();
        assert!(h.starts_with("$argon2id$"));
        assert!(verify_password("correct horse battery", &h));
        assert!(!verify_password("correct horse batterY", &h));
        assert!(!verify_password("x", "not a hash"));
    }

    #[test]
    fn secrets_compare() {
        assert!(same_secret("abc", "abc"));
        assert!(!same_secret("abc", "abd"));
        assert!(!same_secret("abc", "ab"));
    }
}
