//! Portal sessions of people signed in through the OpenID provider (`provider_sessions`): they
//! have no row in `users`, since the provider holds their account.
//!
//! *Invariants:* a session carries the roles the person's groups granted at sign-in, and a new
//! sign-in by the same person gives all their live sessions its roles, so a role removed at
//! the provider takes effect at the person's next sign-in at the latest (and when the provider
//! ends the session, at once). Only the SHA-256 of a session id is stored. Every sign-in and
//! every ended session is audited under the person's identity (`person:<id>`) before the row
//! changes.

use chrono::{DateTime, Utc};
use serde_json::json;

use super::login::SignedInPerson;
use crate::digest::sha256_hex;
use crate::server::audit::{AuditLog, NewEvent, format_at, kind};
use crate::server::db::Db;
use crate::server::principal::Role;
use crate::server::users::{Session, UserError, random_token};
use crate::with_pool;

use super::config::PersonRole;

/// The emisar roles of a person's provider roles.
pub(crate) fn roles_of(person: &SignedInPerson) -> Vec<Role> {
    person
        .roles
        .iter()
        .map(|r| match r {
            PersonRole::Approver => Role::Approver,
            PersonRole::Auditor => Role::Auditor,
            PersonRole::Admin => Role::Admin,
        })
        .collect()
}

fn roles_text(roles: &[Role]) -> String {
    roles
        .iter()
        .map(|r| r.as_str())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Roles as stored; a name this version does not know grants nothing.
fn parse_roles(text: &str) -> Vec<Role> {
    text.split(' ')
        .filter_map(|r| Role::parse(r).ok())
        .filter(|r| *r != Role::Agent)
        .collect()
}

/// Opens a session for a person the provider vouched for. Returns the session and its id
/// (for the cookie). The `login` event names the person, the provider and the roles.
pub async fn open(
    db: &Db,
    audit: &AuditLog,
    person: &SignedInPerson,
) -> Result<(Session, String), UserError> {
    let roles = roles_of(person);
    let expires = DateTime::<Utc>::from_timestamp(person.session_expires_at, 0)
        .ok_or_else(|| UserError::Invalid("the session lifetime is out of range".into()))?;
    let id = random_token()?;
    let session = Session {
        user: person.identity.clone(),
        role: Role::broadest(&roles),
        roles: roles.clone(),
        csrf: random_token()?,
        id_hash: sha256_hex(id.as_bytes()),
        display_name: Some(person.display_name.clone()),
    };
    audit
        .append(NewEvent {
            actor: person.identity.clone(),
            kind: kind::LOGIN.into(),
            outcome: Some("ok".into()),
            detail: Some(json!({
                "provider": person.issuer,
                "subject": person.subject,
                "roles": roles.iter().map(|r| r.as_str()).collect::<Vec<_>>(),
                "session_expires_at": format_at(expires),
            })),
            ..Default::default()
        })
        .await?;
    let now = format_at(Utc::now());
    let text = roles_text(&roles);
    let update = db.sql("UPDATE provider_sessions SET roles = $1 WHERE identity = $2 AND expires_at > $3::timestamptz");
    let insert = db.sql("INSERT INTO provider_sessions (id_hash, identity, display_name, roles, csrf_token, issuer, subject, provider_session, created_at, expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9::timestamptz, $10::timestamptz)");
    with_pool!(db, pool => {
        let mut tx = pool.begin().await?;
        sqlx::query(update).bind(&text).bind(&person.identity).bind(&now).execute(&mut *tx).await?;
        sqlx::query(insert)
            .bind(&session.id_hash)
            .bind(&person.identity)
            .bind(&person.display_name)
            .bind(&text)
            .bind(&session.csrf)
            .bind(&person.issuer)
            .bind(&person.subject)
            .bind(&person.provider_session)
            .bind(&now)
            .bind(format_at(expires))
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
    });
    Ok((session, id))
}

/// The live provider session with this id, if any.
pub(crate) async fn find(db: &Db, id: &str) -> Result<Option<Session>, UserError> {
    let id_hash = sha256_hex(id.as_bytes());
    let now = format_at(Utc::now());
    let sql = db.sql("SELECT identity, display_name, roles, csrf_token FROM provider_sessions WHERE id_hash = $1 AND expires_at > $2::timestamptz");
    let row = db
        .guard(async {
            with_pool!(db, pool => sqlx::query_as::<_, (String, String, String, String)>(sql)
                .bind(&id_hash)
                .bind(&now)
                .fetch_optional(pool)
                .await)
        })
        .await?;
    Ok(row.map(|(identity, display_name, roles, csrf)| {
        let roles = parse_roles(&roles);
        Session {
            user: identity,
            role: Role::broadest(&roles),
            roles,
            csrf,
            id_hash,
            display_name: Some(display_name),
        }
    }))
}

/// Ends one session (the person logged out of emisar; the provider's session is theirs).
pub(crate) async fn close(db: &Db, audit: &AuditLog, s: &Session) -> Result<(), UserError> {
    with_pool!(db, pool => sqlx::query("DELETE FROM provider_sessions WHERE id_hash = $1").bind(&s.id_hash).execute(pool).await.map(|_| ())?);
    audit
        .append(NewEvent {
            actor: s.actor(),
            kind: kind::LOGOUT.into(),
            outcome: Some("ok".into()),
            ..Default::default()
        })
        .await?;
    Ok(())
}

/// Ends the sessions the provider says ended (back-channel logout): those of its session
/// `sid`, or every session of `subject` when it names no session. Returns how many ended.
pub(crate) async fn end_by_provider(
    db: &Db,
    audit: &AuditLog,
    issuer: &str,
    sid: Option<&str>,
    subject: Option<&str>,
) -> Result<u64, UserError> {
    if sid.is_none() && subject.is_none() {
        return Ok(0);
    }
    let filter = "issuer = $1 AND ($2::text IS NULL OR provider_session = $2) AND ($3::text IS NULL OR subject = $3)";
    let select = db.sql(format!(
        "SELECT DISTINCT identity FROM provider_sessions WHERE {filter}"
    ));
    let identities: Vec<String> = with_pool!(db, pool => sqlx::query_scalar(select)
        .bind(issuer)
        .bind(sid)
        .bind(subject)
        .fetch_all(pool)
        .await?);
    for identity in &identities {
        audit
            .append(NewEvent {
                actor: identity.clone(),
                kind: kind::LOGOUT.into(),
                outcome: Some("ok".into()),
                detail: Some(json!({"by": "provider", "provider": issuer})),
                ..Default::default()
            })
            .await?;
    }
    let delete = db.sql(format!("DELETE FROM provider_sessions WHERE {filter}"));
    let ended = with_pool!(db, pool => sqlx::query(delete)
        .bind(issuer)
        .bind(sid)
        .bind(subject)
        .execute(pool)
        .await?
        .rows_affected());
    Ok(ended)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_round_trip_and_unknown_names_grant_nothing() {
        let roles = vec![Role::Approver, Role::Admin];
        assert_eq!(parse_roles(&roles_text(&roles)), roles);
        assert!(parse_roles("").is_empty());
        assert_eq!(
            parse_roles("owner approver agent none"),
            vec![Role::Approver]
        );
        assert_eq!(Role::broadest(&[]), Role::None);
        assert_eq!(Role::broadest(&[Role::Auditor, Role::Admin]), Role::Admin);
    }
}
