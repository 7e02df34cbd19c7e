//! OpenID Connect Back-Channel Logout 1.0: the provider tells emisar, server to server, that a
//! person's session at the provider ended, with a signed logout token; emisar ends the portal
//! sessions that came from it.
//!
//! *Invariants:* a logout token is acted on only when its signature verifies against the
//! provider's key set, its `iss` is the configured issuer, its `aud` is this client, it is
//! within `exp`/`iat`, it carries the back-channel logout event, it has no `nonce` (so an ID
//! token can never pass as one), and it names a session (`sid`) or a person (`sub`).

use serde_json::Value;

use super::jwt::{Claims, Expected, TokenError, check_claims};

/// The member of `events` that makes a JWT a logout token (§2.4).
pub(crate) const BACKCHANNEL_EVENT: &str = "http://schemas.openid.net/event/backchannel-logout";

/// What a verified logout token says ended.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LogoutRequest {
    /// The provider's session id: only the portal sessions opened from it end.
    pub sid: Option<String>,
    /// The person at the provider: without `sid`, all their portal sessions end.
    pub subject: Option<String>,
}

fn optional_string(claims: &Claims, name: &str) -> Result<Option<String>, TokenError> {
    match claims.get(name) {
        None => Ok(None),
        Some(Value::String(s)) if !s.is_empty() => Ok(Some(s.clone())),
        Some(_) => Err(TokenError::InvalidClaim {
            name: name.into(),
            rule: "must be a non-empty string".into(),
        }),
    }
}

/// The checks after the signature (§2.6). Pure: `now` is given.
pub(crate) fn check_logout_claims(
    claims: &Claims,
    issuer: &str,
    client_id: &str,
    now: i64,
    leeway_secs: u64,
) -> Result<LogoutRequest, TokenError> {
    check_claims(
        claims,
        &Expected {
            issuer,
            audience: client_id,
            now,
            leeway_secs,
            require_iat: true,
        },
    )?;
    let is_logout = claims
        .get("events")
        .and_then(Value::as_object)
        .is_some_and(|events| events.get(BACKCHANNEL_EVENT).is_some_and(Value::is_object));
    if !is_logout {
        return Err(TokenError::InvalidClaim {
            name: "events".into(),
            rule: format!("must hold the back-channel logout event `{BACKCHANNEL_EVENT}`"),
        });
    }
    if claims.contains_key("nonce") {
        return Err(TokenError::InvalidClaim {
            name: "nonce".into(),
            rule: "must be absent from a logout token".into(),
        });
    }
    let request = LogoutRequest {
        sid: optional_string(claims, "sid")?,
        subject: optional_string(claims, "sub")?,
    };
    if request.sid.is_none() && request.subject.is_none() {
        return Err(TokenError::InvalidClaim {
            name: "sid".into(),
            rule: "or `sub` must name the session or the person that logged out".into(),
        });
    }
    Ok(request)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const NOW: i64 = 1_800_000_000;

    fn claims(edit: impl FnOnce(&mut Value)) -> Claims {
        let mut v = json!({"iss": "https://sso.example.com", "aud": "emisar", "iat": NOW,
                           "exp": NOW + 120, "jti": "j", "sub": "u1", "sid": "s1",
                           "events": {BACKCHANNEL_EVENT: {}}});
        edit(&mut v);
        v.as_object().unwrap().clone()
    }

    fn check(c: &Claims) -> Result<LogoutRequest, TokenError> {
        check_logout_claims(c, "https://sso.example.com", "emisar", NOW, 60)
    }

    #[test]
    fn a_logout_token_names_the_session_and_the_person() {
        assert_eq!(
            check(&claims(|_| {})).unwrap(),
            LogoutRequest {
                sid: Some("s1".into()),
                subject: Some("u1".into())
            }
        );
        let only_sub = check(&claims(|c| {
            c.as_object_mut().unwrap().remove("sid");
        }))
        .unwrap();
        assert_eq!(only_sub.sid, None);
    }

    #[test]
    fn what_is_not_a_logout_token_is_refused() {
        for (edit, want) in [
            (
                Box::new(|c: &mut Value| c["events"] = json!({})) as Box<dyn Fn(&mut Value)>,
                "back-channel logout event",
            ),
            (Box::new(|c| c["nonce"] = json!("n")), "`nonce` claim"),
            (
                Box::new(|c| {
                    let m = c.as_object_mut().unwrap();
                    m.remove("sid");
                    m.remove("sub");
                }),
                "must name the session or the person",
            ),
            (Box::new(|c| c["aud"] = json!("other")), "not for `emisar`"),
            (Box::new(|c| c["exp"] = json!(NOW - 600)), "expired"),
            (Box::new(|c| c["sid"] = json!(7)), "`sid` claim"),
        ] {
            let e = check(&claims(edit)).unwrap_err().to_string();
            assert!(e.contains(want), "{e} does not say {want}");
        }
    }
}
