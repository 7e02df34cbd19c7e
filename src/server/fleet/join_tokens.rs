//! Join tokens: issued with a lifetime, a number of uses, an optional name or name pattern
//! and the labels and packs they grant; listed (never the token) and revoked. Only the SHA-256 of a
//! token's secret is stored; the token carries the fingerprint of the issuing server's key.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::Serialize;
use serde_json::json;

use super::{MAX_JOIN_TOKEN_TTL, MAX_JOIN_TOKEN_USES, MAX_LABELS, MAX_PACKS, kind, random_secret};
use crate::digest::sha256_hex;
use crate::protocol::{JoinToken, ServerPins};
use crate::server::audit::{AuditLog, NewEvent, format_at};
use crate::server::db::Db;
use crate::util::input::is_identifier;
use crate::with_pool;

/// Which names a runner joining with a token may take.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", content = "value", rename_all = "snake_case")]
pub enum NameRule {
    Any,
    Exact(String),
    /// A glob (`*`, `?`, `[…]`) over the whole name, e.g. `edge-*`.
    Pattern(String),
}

impl NameRule {
    /// From `--name` or `--name-pattern` (at most one).
    pub(crate) fn parse(name: Option<&str>, pattern: Option<&str>) -> Result<Self, String> {
        match (name, pattern) {
            (None, None) => Ok(NameRule::Any),
            (Some(_), Some(_)) => Err("give --name or --name-pattern, not both".into()),
            (Some(name), None) => {
                if !is_identifier(name) {
                    return Err(format!(
                        "--name `{name}` must be an identifier (letters, digits and `_.@-`, at most 128 characters)"
                    ));
                }
                Ok(NameRule::Exact(name.to_owned()))
            }
            (None, Some(pattern)) => {
                let allowed = |c: char| c.is_ascii_alphanumeric() || "_.@-*?[]!".contains(c);
                if pattern.is_empty() || pattern.len() > 128 || !pattern.chars().all(allowed) {
                    return Err(format!(
                        "--name-pattern `{pattern}` may hold only name characters (letters, digits, `_.@-`) and the wildcards `*`, `?` and `[…]`, at most 128 characters"
                    ));
                }
                glob::Pattern::new(pattern)
                    .map_err(|e| format!("--name-pattern `{pattern}` is not a glob: {e}"))?;
                Ok(NameRule::Pattern(pattern.to_owned()))
            }
        }
    }

    pub(super) fn from_columns(name: Option<String>, pattern: Option<String>) -> Self {
        match (name, pattern) {
            (Some(name), _) => NameRule::Exact(name),
            (None, Some(pattern)) => NameRule::Pattern(pattern),
            (None, None) => NameRule::Any,
        }
    }

    fn columns(&self) -> (Option<&str>, Option<&str>) {
        match self {
            NameRule::Any => (None, None),
            NameRule::Exact(n) => (Some(n), None),
            NameRule::Pattern(p) => (None, Some(p)),
        }
    }

    pub(crate) fn matches(&self, name: &str) -> bool {
        match self {
            NameRule::Any => true,
            NameRule::Exact(n) => n == name,
            // A pattern that no longer compiles (it was checked when issued) admits nobody.
            NameRule::Pattern(p) => glob::Pattern::new(p).is_ok_and(|p| p.matches(name)),
        }
    }
}

impl std::fmt::Display for NameRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NameRule::Any => f.write_str("any name"),
            NameRule::Exact(n) => write!(f, "name {n}"),
            NameRule::Pattern(p) => write!(f, "pattern {p}"),
        }
    }
}

/// What a join token allows.
#[derive(Debug, Clone)]
pub struct JoinTokenSpec {
    pub ttl: Duration,
    pub max_uses: u32,
    pub name: NameRule,
    /// Exactly the labels a runner that joins with it gets.
    pub labels: BTreeMap<String, String>,
    /// The packs a runner that joins with it may serve: it serves those it announces and
    /// the token grants, no others. None by default: a runner whose token grants no pack
    /// joins but is never sent a call, and in particular never picked for a cluster-scoped
    /// tool (Nomad, Consul, VictoriaMetrics), whose calls carry every agent's arguments.
    pub packs: BTreeSet<String>,
}

impl JoinTokenSpec {
    /// One join, any name, no labels, no packs, for `ttl`.
    pub fn once(ttl: Duration) -> Self {
        JoinTokenSpec {
            ttl,
            max_uses: 1,
            name: NameRule::Any,
            labels: BTreeMap::new(),
            packs: BTreeSet::new(),
        }
    }

    /// What an operator should hear before handing this token out: a token that admits any
    /// name lets whoever holds it pick the name its runner is known by.
    pub(crate) fn warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        if self.name == NameRule::Any {
            warnings.push(
                "this token admits ANY runner name: whoever holds it chooses the name its runner is known (and sorted) by; bind it with --name NAME (or --name-pattern 'edge-*')".into(),
            );
        }
        if self.packs.is_empty() {
            warnings.push(
                "this token grants no pack: a runner that joins with it is never sent a call; grant packs with --pack NAME".into(),
            );
        }
        warnings
    }

    pub(crate) fn check(&self) -> Result<(), String> {
        if self.ttl.is_zero() || self.ttl > MAX_JOIN_TOKEN_TTL {
            return Err(format!(
                "--ttl must be between 1s and {}d: a join token is needed once per runner",
                MAX_JOIN_TOKEN_TTL.as_secs() / 86_400
            ));
        }
        if !(1..=MAX_JOIN_TOKEN_USES).contains(&self.max_uses) {
            return Err(format!(
                "--uses must be between 1 and {MAX_JOIN_TOKEN_USES}"
            ));
        }
        if matches!(self.name, NameRule::Exact(_)) && self.max_uses > 1 {
            return Err(
                "--name binds the token to one runner, which joins once: use --uses 1, or --name-pattern for several".into(),
            );
        }
        check_labels("--label", &self.labels)?;
        check_pack_names("--pack", &self.packs)
    }
}

/// Pack names a join token grants: identifiers, at most [`MAX_PACKS`].
pub(super) fn check_pack_names(field: &str, packs: &BTreeSet<String>) -> Result<(), String> {
    if packs.len() > MAX_PACKS {
        return Err(format!("{field}: at most {MAX_PACKS} packs"));
    }
    if let Some(bad) = packs.iter().find(|p| !is_identifier(p)) {
        return Err(format!(
            "{field} {}: a pack name is an identifier (letters, digits and `_.@-`, at most 128 characters)",
            crate::util::input::describe(bad)
        ));
    }
    Ok(())
}

pub(super) fn check_labels(field: &str, labels: &BTreeMap<String, String>) -> Result<(), String> {
    if labels.len() > MAX_LABELS {
        return Err(format!("{field}: at most {MAX_LABELS} labels"));
    }
    for (k, v) in labels {
        if !is_identifier(k) || !is_identifier(v) {
            return Err(format!(
                "{field}: `{k}={v}` must be identifiers (letters, digits and `_.@-`, at most 128 characters)"
            ));
        }
    }
    Ok(())
}

/// Parses `--label k=v`.
pub fn parse_label(text: &str) -> Result<(String, String), String> {
    let (k, v) = text
        .split_once('=')
        .ok_or_else(|| format!("--label `{text}` must be key=value"))?;
    let labels = BTreeMap::from([(k.to_owned(), v.to_owned())]);
    check_labels("--label", &labels)?;
    Ok((k.to_owned(), v.to_owned()))
}

/// A join token as issued: shown once.
#[derive(Debug)]
pub struct IssuedJoinToken {
    pub id: String,
    /// `emj_SECRET.key=FINGERPRINT`: the whole token, for the operator.
    pub token: String,
    pub expires_at: String,
}

/// Issues a join token with `spec`, carrying `pins` (the fingerprints of this server's key).
/// Audited; the token is not.
pub async fn issue_join_token(
    db: &Db,
    audit: &AuditLog,
    spec: &JoinTokenSpec,
    pins: ServerPins,
    by: &str,
) -> anyhow::Result<IssuedJoinToken> {
    spec.check().map_err(anyhow::Error::msg)?;
    let token = JoinToken::new(
        random_secret(crate::protocol::join::JOIN_TOKEN_PREFIX)?,
        pins,
    )?;
    let id = uuid::Uuid::new_v4().to_string();
    let now = chrono::Utc::now();
    let expires_at = format_at(now + chrono::Duration::from_std(spec.ttl)?);
    let (name, pattern) = spec.name.columns();
    audit
        .append(NewEvent {
            actor: by.to_owned(),
            kind: kind::JOIN_TOKEN_ISSUED.into(),
            outcome: Some("ok".into()),
            detail: Some(json!({
                "join_token_id": id,
                "expires_at": expires_at,
                "max_uses": spec.max_uses,
                "name": name,
                "name_pattern": pattern,
                "labels": spec.labels,
                "packs": spec.packs,
                "server_key_sha256": token.pins.key_sha256,
            })),
            ..Default::default()
        })
        .await?;
    let sql = db.sql("INSERT INTO join_tokens (id, token_hash, created_at, expires_at, max_uses, uses, runner_name, name_pattern, labels, packs) VALUES ($1, $2, $3::timestamptz, $4::timestamptz, $5, 0, $6, $7, $8::jsonb, $9::jsonb)");
    with_pool!(db, pool => {
        sqlx::query(sql)
            .bind(&id)
            .bind(sha256_hex(token.secret().as_bytes()))
            .bind(format_at(now))
            .bind(&expires_at)
            .bind(spec.max_uses as i32)
            .bind(name)
            .bind(pattern)
            .bind(serde_json::to_string(&spec.labels).expect("labels are JSON"))
            .bind(serde_json::to_string(&spec.packs).expect("packs are JSON"))
            .execute(pool)
            .await?;
    });
    Ok(IssuedJoinToken {
        id,
        token: token.render(),
        expires_at,
    })
}

/// Where a join token stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum JoinTokenState {
    Live,
    UsedUp,
    Expired,
    Revoked,
}

impl JoinTokenState {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            JoinTokenState::Live => "live",
            JoinTokenState::UsedUp => "used up",
            JoinTokenState::Expired => "expired",
            JoinTokenState::Revoked => "revoked",
        }
    }
}

/// A join token as `emisar join-token list` shows it (never the token).
#[derive(Debug, Clone, Serialize)]
pub struct JoinTokenInfo {
    pub id: String,
    pub created_at: String,
    pub expires_at: String,
    pub uses: u32,
    pub max_uses: u32,
    pub name: NameRule,
    pub labels: BTreeMap<String, String>,
    pub packs: BTreeSet<String>,
    pub revoked_at: Option<String>,
    pub state: JoinTokenState,
}

type JoinTokenRow = (
    String,
    String,
    String,
    i32,
    i32,
    Option<String>,
    Option<String>,
    String,
    String,
    Option<String>,
);

/// Every join token, oldest first.
pub async fn list_join_tokens(db: &Db) -> anyhow::Result<Vec<JoinTokenInfo>> {
    let sql = format!(
        "SELECT id, {}, {}, uses, max_uses, runner_name, name_pattern, labels::text, packs::text, {} FROM join_tokens ORDER BY created_at, id",
        db.at_text("created_at"),
        db.at_text("expires_at"),
        db.at_text("revoked_at"),
    );
    let rows: Vec<JoinTokenRow> =
        with_pool!(db, pool => sqlx::query_as(db.sql(sql)).fetch_all(pool).await?);
    let now = format_at(chrono::Utc::now());
    rows.into_iter()
        .map(
            |(
                id,
                created_at,
                expires_at,
                uses,
                max_uses,
                name,
                pattern,
                labels,
                packs,
                revoked_at,
            )| {
                // Fixed-width UTC text compares in time order.
                let state = if revoked_at.is_some() {
                    JoinTokenState::Revoked
                } else if expires_at <= now {
                    JoinTokenState::Expired
                } else if uses >= max_uses {
                    JoinTokenState::UsedUp
                } else {
                    JoinTokenState::Live
                };
                Ok(JoinTokenInfo {
                    id,
                    created_at,
                    expires_at,
                    uses: uses.max(0) as u32,
                    max_uses: max_uses.max(0) as u32,
                    name: NameRule::from_columns(name, pattern),
                    labels: serde_json::from_str(&labels)?,
                    packs: serde_json::from_str(&packs)?,
                    revoked_at,
                    state,
                })
            },
        )
        .collect()
}

/// Revokes join token `id` so no runner joins with it again. Returns `false` when there is
/// no such token or it was revoked already. Audited before it is written.
pub async fn revoke_join_token(
    db: &Db,
    audit: &AuditLog,
    id: &str,
    by: &str,
) -> anyhow::Result<bool> {
    let sql = db.sql("SELECT id FROM join_tokens WHERE id = $1 AND revoked_at IS NULL");
    let found: Option<(String,)> =
        with_pool!(db, pool => sqlx::query_as(sql).bind(id).fetch_optional(pool).await?);
    if found.is_none() {
        return Ok(false);
    }
    audit
        .append(NewEvent {
            actor: by.to_owned(),
            kind: kind::JOIN_TOKEN_REVOKED.into(),
            outcome: Some("ok".into()),
            detail: Some(json!({"join_token_id": id})),
            ..Default::default()
        })
        .await?;
    let sql = db.sql(
        "UPDATE join_tokens SET revoked_at = $2::timestamptz WHERE id = $1 AND revoked_at IS NULL",
    );
    let now = format_at(chrono::Utc::now());
    with_pool!(db, pool => sqlx::query(sql).bind(id).bind(&now).execute(pool).await.map(|_| ())?);
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn name_rules() {
        assert_eq!(NameRule::parse(None, None).unwrap(), NameRule::Any);
        let exact = NameRule::parse(Some("edge-1"), None).unwrap();
        assert!(exact.matches("edge-1") && !exact.matches("edge-10"));
        let pattern = NameRule::parse(None, Some("edge-*")).unwrap();
        assert!(pattern.matches("edge-1") && pattern.matches("edge-eu.2"));
        assert!(!pattern.matches("db-1") && !pattern.matches("xedge-1"));
        assert!(NameRule::parse(Some("a"), Some("b")).is_err());
        assert!(
            NameRule::parse(Some("no spaces"), None)
                .unwrap_err()
                .contains("--name")
        );
        assert!(
            NameRule::parse(None, Some("edge/*"))
                .unwrap_err()
                .contains("--name-pattern")
        );
        assert!(
            NameRule::parse(None, Some("edge-["))
                .unwrap_err()
                .contains("not a glob")
        );
    }

    #[test]
    fn specs_are_bounded() {
        let mut spec = JoinTokenSpec::once(Duration::from_secs(3600));
        spec.check().unwrap();
        spec.ttl = Duration::from_secs(31 * 86_400);
        assert!(spec.check().unwrap_err().contains("--ttl"));
        spec.ttl = Duration::from_secs(60);
        spec.max_uses = 0;
        assert!(spec.check().unwrap_err().contains("--uses"));
        spec.max_uses = 2;
        spec.name = NameRule::Exact("edge-1".into());
        assert!(spec.check().unwrap_err().contains("--name binds"));
        assert_eq!(
            parse_label("role=edge").unwrap(),
            ("role".into(), "edge".into())
        );
        assert!(parse_label("role").unwrap_err().contains("key=value"));
        assert!(parse_label("role=a b").unwrap_err().contains("identifiers"));
        spec.max_uses = 1;
        spec.packs = BTreeSet::from(["nomad".to_owned(), "no/pe".to_owned()]);
        let err = spec.check().unwrap_err();
        assert!(
            err.contains("--pack") && err.contains("identifier"),
            "{err}"
        );
    }

    #[test]
    fn an_open_token_says_what_it_lets_the_holder_choose() {
        let mut spec = JoinTokenSpec::once(Duration::from_secs(60));
        let warnings = spec.warnings().join("\n");
        assert!(warnings.contains("ANY runner name"), "{warnings}");
        assert!(warnings.contains("grants no pack"), "{warnings}");
        spec.name = NameRule::Exact("edge-1".into());
        spec.packs.insert("traefik".into());
        assert!(spec.warnings().is_empty());
    }
}
