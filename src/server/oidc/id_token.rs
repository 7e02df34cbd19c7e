//! Verifying an OpenID Connect ID token (Core §3.1.3.7): signature against the provider's key
//! set, `iss` = the configured issuer, `aud` contains this client (and `azp`, when present or
//! needed, is this client), `exp`/`nbf`/`iat` within the leeway, `sub` present, and `nonce`
//! equal to the one this server sent with the sign-in.
//!
//! *Invariant:* `verify` returns claims only when every one of those checks passed.

use std::sync::Arc;

use serde_json::Value;

use super::jwks::JwksCache;
use super::jwt::{Claims, Expected, TokenError, audiences, check_claims, verify_signature};

pub struct IdTokenVerifier {
    pub issuer: String,
    pub client_id: String,
    pub leeway_secs: u64,
    pub jwks: Arc<JwksCache>,
}

/// Compares without an early exit, so the time taken says nothing about how much matched.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The checks after the signature: registered claims, `azp`, `sub` and `nonce`. Pure.
pub(crate) fn check_id_token_claims(
    claims: &Claims,
    issuer: &str,
    client_id: &str,
    expected_nonce: &str,
    now: i64,
    leeway_secs: u64,
) -> Result<(), TokenError> {
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
    let aud = audiences(claims)?;
    match claims.get("azp") {
        Some(Value::String(azp)) if azp != client_id => {
            return Err(TokenError::WrongAuthorizedParty {
                expected: client_id.to_owned(),
                found: azp.clone(),
            });
        }
        Some(Value::String(_)) => {}
        Some(_) => {
            return Err(TokenError::InvalidClaim {
                name: "azp".into(),
                rule: "must be a string".into(),
            });
        }
        // Several audiences without `azp`: nothing says this client is the one it was for.
        None if aud.len() > 1 => return Err(TokenError::MissingClaim("azp")),
        None => {}
    }
    match claims.get("sub") {
        Some(Value::String(s)) if !s.is_empty() => {}
        Some(_) => {
            return Err(TokenError::InvalidClaim {
                name: "sub".into(),
                rule: "must be a non-empty string".into(),
            });
        }
        None => return Err(TokenError::MissingClaim("sub")),
    }
    match claims.get("nonce") {
        Some(Value::String(n)) if constant_time_eq(n.as_bytes(), expected_nonce.as_bytes()) => {
            Ok(())
        }
        Some(_) => Err(TokenError::NonceMismatch),
        None => Err(TokenError::MissingNonce),
    }
}

impl IdTokenVerifier {
    /// Verifies `token` for the sign-in that sent `expected_nonce`; `now` in Unix seconds.
    pub async fn verify(
        &self,
        token: &str,
        expected_nonce: &str,
        now: i64,
    ) -> Result<Claims, TokenError> {
        let claims = verify_signature(token, &self.jwks).await?;
        check_id_token_claims(
            &claims,
            &self.issuer,
            &self.client_id,
            expected_nonce,
            now,
            self.leeway_secs,
        )?;
        Ok(claims)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    const NOW: i64 = 1_800_000_000;

    fn good() -> Claims {
        json!({"iss": "https://sso.example.com", "aud": "emisar", "sub": "u1",
               "exp": NOW + 300, "iat": NOW, "nonce": "n-123"})
        .as_object()
        .unwrap()
        .clone()
    }

    fn check(c: &Claims) -> Result<(), TokenError> {
        check_id_token_claims(c, "https://sso.example.com", "emisar", "n-123", NOW, 60)
    }

    #[test]
    fn nonce_azp_and_sub() {
        check(&good()).unwrap();
        let mut c = good();
        c.insert("nonce".into(), json!("n-124"));
        assert!(matches!(check(&c), Err(TokenError::NonceMismatch)));
        c.insert("nonce".into(), json!(123));
        assert!(matches!(check(&c), Err(TokenError::NonceMismatch)));
        c.remove("nonce");
        assert!(matches!(check(&c), Err(TokenError::MissingNonce)));

        let mut c = good();
        c.insert("aud".into(), json!(["emisar", "other"]));
        assert!(matches!(check(&c), Err(TokenError::MissingClaim("azp"))));
        c.insert("azp".into(), json!("other"));
        let e = check(&c).unwrap_err().to_string();
        assert!(
            e.contains("authorized party `other`, not this client `emisar`"),
            "{e}"
        );
        c.insert("azp".into(), json!("emisar"));
        check(&c).unwrap();

        let mut c = good();
        c.insert("sub".into(), json!(""));
        assert!(
            check(&c)
                .unwrap_err()
                .to_string()
                .contains("`sub` claim must be")
        );
        c.remove("sub");
        assert!(
            check(&c)
                .unwrap_err()
                .to_string()
                .contains("no `sub` claim")
        );
    }

    proptest! {
        #[test]
        fn only_the_exact_nonce_passes(nonce in any::<String>()) {
            let mut c = good();
            c.insert("nonce".into(), json!(nonce.clone()));
            prop_assert_eq!(check(&c).is_ok(), nonce == "n-123");
        }
    }
}
