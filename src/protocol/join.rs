//! The wire format of a runner's identity: the join token (`emj_…`), the join handshake
//! (`POST /api/runners/join` with a join token) and re-registration after a restart
//! (`POST /api/runners/register` with the runner's own credential).
//!
//! A join token carries, next to its secret, the fingerprints of the server it was issued by
//! (`emj_SECRET.key=HEX`). The runner presents only the secret; it keeps the fingerprints to
//! check the join answer, so that whoever sits between the runner and the server cannot hand
//! it their own key. Both sides parse and render tokens here, so the format has one owner.
//!
//! Invariant: a token that does not parse is refused before anything is sent, and no error
//! message or `Debug` output ever contains the secret.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// What every join token starts with.
pub const JOIN_TOKEN_PREFIX: &str = "emj_";
/// The shortest and longest secret (after the prefix) a join token may carry. The server
/// issues 43 characters (32 random bytes, URL-safe base64).
const SECRET_LEN: std::ops::RangeInclusive<usize> = 32..=128;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JoinRequest {
    pub name: String,
    /// Where the server reaches this runner.
    pub url: String,
    /// The labels this runner expects. The join token decides the labels it gets; labels
    /// asked for here that the token does not grant refuse the join. Empty: the token's.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// The packs it serves, with their digests.
    pub packs: BTreeMap<String, String>,
    /// `sha256:<hex>` of the certificate the runner serves at `url`; the server pins it and
    /// refuses to call a runner that presents another.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_fingerprint: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JoinResponse {
    pub runner_token: String,
    pub server_public_key: String,
    pub heartbeat_interval_ms: u64,
    /// The labels the server gave this runner (those of its join token).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// The packs the server will call this runner for: those it announced that its join
    /// token grants. The server never sends calls of any other pack.
    #[serde(default)]
    pub packs: Vec<String>,
}

/// `POST /api/runners/register`, sent with the runner token (`Authorization: Bearer emr_…`)
/// by a runner that joined before and restarted. It may change where it is reached and what
/// it serves, never its name or labels: those are the server's, set at join.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegisterRequest {
    pub url: String,
    pub packs: BTreeMap<String, String>,
    /// `sha256:<hex>` of the certificate the runner serves at `url` now, as in
    /// [`JoinRequest::tls_fingerprint`]: the server pins it in place of the one it had.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_fingerprint: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RegisterResponse {
    /// The name the credential belongs to.
    pub runner: String,
    pub heartbeat_interval_ms: u64,
}

/// The answer to `POST /api/runners/heartbeat`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HeartbeatResponse {
    /// The name the credential belongs to.
    pub runner: String,
    /// The interval the runner is to keep from now on (the server lengthens it as the fleet
    /// grows). Absent from servers before it was added: the runner keeps the one it has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_interval_ms: Option<u64>,
}

/// The fingerprints of the server that issued a join token.
///
/// Each is written `kind=HEX` after the secret, separated by dots. Only `key` exists today;
/// another kind (the server's TLS certificate, say) is added as a field here and an arm in
/// [`ServerPins::parse_item`]. A kind this runner does not know refuses the token, so a pin
/// is never silently ignored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerPins {
    /// Lowercase hex SHA-256 of the server's Ed25519 public key in SPKI DER form
    /// ([`crate::protocol::signing::key_fingerprint`]).
    pub key_sha256: String,
}

impl ServerPins {
    fn render(&self) -> String {
        format!("key={}", self.key_sha256)
    }

    fn parse(items: &str) -> Result<Self, JoinTokenError> {
        let mut key = None;
        for item in items.split('.') {
            let (kind, hex) = item.split_once('=').ok_or_else(|| {
                JoinTokenError(format!(
                    "its fingerprint part `{}` must be `kind=HEX` items separated by dots",
                    printable(item)
                ))
            })?;
            let hex = parse_sha256_hex(kind, hex)?;
            Self::parse_item(kind, hex, &mut key)?;
        }
        let key_sha256 = key.ok_or_else(|| {
            JoinTokenError("it carries no `key=` fingerprint of the server's key".into())
        })?;
        Ok(ServerPins { key_sha256 })
    }

    fn parse_item(kind: &str, hex: String, key: &mut Option<String>) -> Result<(), JoinTokenError> {
        match kind {
            "key" if key.is_none() => *key = Some(hex),
            "key" => return Err(JoinTokenError("it carries `key=` twice".into())),
            other => {
                return Err(JoinTokenError(format!(
                    "it carries a fingerprint of kind `{}`, which this runner does not know (it knows `key`): upgrade the runner",
                    printable(other)
                )));
            }
        }
        Ok(())
    }
}

fn parse_sha256_hex(kind: &str, hex: &str) -> Result<String, JoinTokenError> {
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(JoinTokenError(format!(
            "its `{}=` fingerprint must be 64 hex digits (a SHA-256)",
            printable(kind)
        )));
    }
    Ok(hex.to_ascii_lowercase())
}

/// At most a short, printable excerpt of text from a malformed token (which is never the
/// secret: only the fingerprint part is ever quoted).
fn printable(s: &str) -> String {
    s.chars()
        .filter(|c| c.is_ascii_graphic())
        .take(24)
        .collect()
}

/// A join token: the secret the server knows (only its hash) and the fingerprints of the
/// server that issued it.
#[derive(Clone, PartialEq, Eq)]
pub struct JoinToken {
    secret: String,
    pub pins: ServerPins,
}

/// Why a join token does not parse. The message never contains the secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the join token is malformed: {0} (a join token looks like emj_SECRET.key=FINGERPRINT, as `emisar join-token issue` prints it)"
)]
pub struct JoinTokenError(String);

impl JoinToken {
    /// `secret` is `emj_` followed by URL-safe base64; `pins` name the issuing server.
    pub fn new(secret: String, pins: ServerPins) -> Result<Self, JoinTokenError> {
        check_secret(&secret)?;
        Ok(JoinToken { secret, pins })
    }

    pub fn parse(text: &str) -> Result<Self, JoinTokenError> {
        let text = text.trim();
        let (secret, pins) = text.split_once('.').ok_or_else(|| {
            JoinTokenError(
                "it has no fingerprint part after the secret (a token from an older server?): issue a new one".into(),
            )
        })?;
        check_secret(secret)?;
        Ok(JoinToken {
            secret: secret.to_owned(),
            pins: ServerPins::parse(pins)?,
        })
    }

    /// What the runner presents to the server (`Authorization: Bearer …`); the server
    /// stores only its SHA-256.
    pub fn secret(&self) -> &str {
        &self.secret
    }

    /// The whole token, as it is handed to the operator once.
    pub fn render(&self) -> String {
        format!("{}.{}", self.secret, self.pins.render())
    }
}

fn check_secret(secret: &str) -> Result<(), JoinTokenError> {
    let Some(body) = secret.strip_prefix(JOIN_TOKEN_PREFIX) else {
        return Err(JoinTokenError(format!(
            "it must start with `{JOIN_TOKEN_PREFIX}`"
        )));
    };
    if !SECRET_LEN.contains(&body.len())
        || !body
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(JoinTokenError(format!(
            "its secret must be {} to {} URL-safe base64 characters after `{JOIN_TOKEN_PREFIX}`",
            SECRET_LEN.start(),
            SECRET_LEN.end()
        )));
    }
    Ok(())
}

impl std::fmt::Debug for JoinToken {
    // The secret is a credential: never print it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JoinToken")
            .field("pins", &self.pins)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "emj_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
    const HEX: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn renders_and_parses_back() {
        let token = JoinToken::new(
            SECRET.into(),
            ServerPins {
                key_sha256: HEX.into(),
            },
        )
        .unwrap();
        let text = token.render();
        assert_eq!(text, format!("{SECRET}.key={HEX}"));
        let parsed = JoinToken::parse(&format!(" {text}\n")).unwrap();
        assert_eq!(parsed, token);
        assert_eq!(parsed.secret(), SECRET);
        let upper = JoinToken::parse(&format!("{SECRET}.key={}", HEX.to_uppercase())).unwrap();
        assert_eq!(upper.pins.key_sha256, HEX);
        assert!(!format!("{token:?}").contains(SECRET));
    }

    #[test]
    fn malformed_tokens_say_why_without_the_secret() {
        let cases = [
            (SECRET.to_owned(), "no fingerprint part"),
            (
                format!("emx_{}.key={HEX}", &SECRET[4..]),
                "must start with `emj_`",
            ),
            (format!("emj_short.key={HEX}"), "URL-safe base64"),
            (format!("{SECRET}!.key={HEX}"), "URL-safe base64"),
            (format!("{SECRET}.{HEX}"), "`kind=HEX` items"),
            (format!("{SECRET}.key=abc"), "64 hex digits"),
            (format!("{SECRET}.key={HEX}.key={HEX}"), "`key=` twice"),
            (format!("{SECRET}.tls={HEX}"), "kind `tls`"),
            (format!("{SECRET}.key={HEX}.cert={HEX}"), "kind `cert`"),
        ];
        for (text, why) in cases {
            let err = JoinToken::parse(&text).unwrap_err().to_string();
            assert!(err.contains(why), "{text}: {err}");
            assert!(err.starts_with("the join token is malformed"), "{err}");
            assert!(!err.contains(&SECRET[4..]), "the secret leaked: {err}");
        }
    }
}
