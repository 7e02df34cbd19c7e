//! Verifying a JWT from the provider: the signature against its key set, then the registered
//! claims (`iss`, `aud`, `exp`, `nbf`, `iat`), each failure its own [`TokenError`].
//!
//! jsonwebtoken checks the signature and the algorithm; the claims are checked here, by
//! [`check_claims`], because its claim errors carry neither the expected nor the found value
//! and it reads the clock itself, while ours name both and take `now` as an argument (so the
//! checks are pure and property-tested).
//!
//! *Invariants:* no claim is trusted before the signature verified; the algorithm must be one
//! the key may verify (never `none`, never HMAC); a token without `iss`, `aud` or `exp` is
//! refused.

use jsonwebtoken::{Algorithm, Validation};
use serde_json::{Map, Value};

use super::fetch::FetchError;
use super::jwks::JwksCache;

/// The largest token accepted, in bytes; real ones are a few KiB.
pub(crate) const MAX_TOKEN_LEN: usize = 16 * 1024;

pub(crate) type Claims = Map<String, Value>;

#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("the token is not a well-formed JWT: {0}")]
    Malformed(String),
    #[error(
        "the token is signed with `{0}`, which is not accepted (RS*, PS*, ES256, ES384, EdDSA only)"
    )]
    UnsupportedAlgorithm(String),
    #[error(
        "the token's header has no `kid` and the provider has more than one key for its algorithm"
    )]
    MissingKeyId,
    #[error("the token is signed by key `{kid}`, which is not in the provider's key set")]
    UnknownKey { kid: String },
    #[error("the token says `{alg}` but key `{kid}` is not a key for that algorithm")]
    KeyAlgorithmMismatch { kid: String, alg: String },
    #[error(
        "the token's signature does not verify (it was altered, or not signed by the provider)"
    )]
    BadSignature,
    #[error("the token was issued by `{found}`, not by the configured issuer `{expected}`")]
    WrongIssuer { expected: String, found: String },
    #[error("the token is for audience {found:?}, not for `{expected}`")]
    WrongAudience {
        expected: String,
        found: Vec<String>,
    },
    #[error("the token names authorized party `{found}`, not this client `{expected}`")]
    WrongAuthorizedParty { expected: String, found: String },
    #[error("the token expired at {exp} (now {now}, {leeway} s of clock skew allowed)")]
    Expired { exp: i64, now: i64, leeway: u64 },
    #[error("the token is not valid before {nbf} (now {now}, {leeway} s of clock skew allowed)")]
    NotYetValid { nbf: i64, now: i64, leeway: u64 },
    #[error(
        "the token was issued in the future, at {iat} (now {now}, {leeway} s of clock skew allowed)"
    )]
    IssuedInFuture { iat: i64, now: i64, leeway: u64 },
    #[error("the token has no `{0}` claim")]
    MissingClaim(&'static str),
    #[error("the token's `{name}` claim {rule}")]
    InvalidClaim { name: String, rule: String },
    #[error("the ID token's nonce does not match the nonce sent with this sign-in")]
    NonceMismatch,
    #[error("the ID token has no nonce, but one was sent with this sign-in")]
    MissingNonce,
    #[error("the token does not carry the required scope `{0}`")]
    MissingScope(String),
    #[error("cannot verify the token: {0}")]
    KeySet(FetchError),
}

impl TokenError {
    /// A short, stable name for metrics and logs.
    pub(crate) fn code(&self) -> &'static str {
        match self {
            TokenError::Malformed(_) => "malformed",
            TokenError::UnsupportedAlgorithm(_) => "unsupported_algorithm",
            TokenError::MissingKeyId => "missing_kid",
            TokenError::UnknownKey { .. } => "unknown_key",
            TokenError::KeyAlgorithmMismatch { .. } => "key_algorithm_mismatch",
            TokenError::BadSignature => "bad_signature",
            TokenError::WrongIssuer { .. } => "wrong_issuer",
            TokenError::WrongAudience { .. } => "wrong_audience",
            TokenError::WrongAuthorizedParty { .. } => "wrong_azp",
            TokenError::Expired { .. } => "expired",
            TokenError::NotYetValid { .. } => "not_yet_valid",
            TokenError::IssuedInFuture { .. } => "issued_in_future",
            TokenError::MissingClaim(_) => "missing_claim",
            TokenError::InvalidClaim { .. } => "invalid_claim",
            TokenError::NonceMismatch => "nonce_mismatch",
            TokenError::MissingNonce => "missing_nonce",
            TokenError::MissingScope(_) => "missing_scope",
            TokenError::KeySet(_) => "key_set_unavailable",
        }
    }
}

/// What the registered claims must say.
#[derive(Debug, Clone)]
pub(crate) struct Expected<'a> {
    pub issuer: &'a str,
    pub audience: &'a str,
    /// Unix seconds.
    pub now: i64,
    pub leeway_secs: u64,
    /// ID tokens must carry `iat`; access tokens need not.
    pub require_iat: bool,
}

fn accepted(alg: Algorithm) -> bool {
    matches!(
        alg,
        Algorithm::RS256
            | Algorithm::RS384
            | Algorithm::RS512
            | Algorithm::PS256
            | Algorithm::PS384
            | Algorithm::PS512
            | Algorithm::ES256
            | Algorithm::ES384
            | Algorithm::EdDSA
    )
}

/// Checks the signature of `token` against `jwks` and returns its claims (not yet checked).
pub async fn verify_signature(token: &str, jwks: &JwksCache) -> Result<Claims, TokenError> {
    if token.len() > MAX_TOKEN_LEN {
        return Err(TokenError::Malformed(format!(
            "longer than {MAX_TOKEN_LEN} bytes"
        )));
    }
    let header =
        jsonwebtoken::decode_header(token).map_err(|e| TokenError::Malformed(e.to_string()))?;
    if !accepted(header.alg) {
        return Err(TokenError::UnsupportedAlgorithm(format!(
            "{:?}",
            header.alg
        )));
    }
    let key = jwks.key_for(header.kid.as_deref(), header.alg).await?;
    if !key.algorithms.contains(&header.alg) {
        return Err(TokenError::KeyAlgorithmMismatch {
            kid: key.kid.clone().unwrap_or_default(),
            alg: format!("{:?}", header.alg),
        });
    }
    let mut validation = Validation::new(header.alg);
    validation.required_spec_claims.clear();
    validation.validate_exp = false;
    validation.validate_nbf = false;
    validation.validate_aud = false;
    let data = jsonwebtoken::decode::<Claims>(token, &key.key, &validation).map_err(|e| match e
        .kind()
    {
        jsonwebtoken::errors::ErrorKind::InvalidSignature => TokenError::BadSignature,
        _ => TokenError::Malformed(e.to_string()),
    })?;
    Ok(data.claims)
}

/// A NumericDate claim (RFC 7519 §2): a JSON number of seconds; fractions are dropped.
fn numeric_date(claims: &Claims, name: &'static str) -> Result<Option<i64>, TokenError> {
    match claims.get(name) {
        None => Ok(None),
        Some(Value::Number(n)) => n
            .as_i64()
            .or_else(|| n.as_f64().filter(|f| f.is_finite()).map(|f| f as i64))
            .map(Some)
            .ok_or_else(|| TokenError::InvalidClaim {
                name: name.into(),
                rule: "must be a number of seconds".into(),
            }),
        Some(_) => Err(TokenError::InvalidClaim {
            name: name.into(),
            rule: "must be a number of seconds".into(),
        }),
    }
}

/// `aud` as a list: a string is one audience (RFC 7519 §4.1.3).
pub(crate) fn audiences(claims: &Claims) -> Result<Vec<String>, TokenError> {
    match claims.get("aud") {
        None => Err(TokenError::MissingClaim("aud")),
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| TokenError::InvalidClaim {
                        name: "aud".into(),
                        rule: "must be a string or an array of strings".into(),
                    })
            })
            .collect(),
        Some(_) => Err(TokenError::InvalidClaim {
            name: "aud".into(),
            rule: "must be a string or an array of strings".into(),
        }),
    }
}

/// Checks `iss`, `aud`, `exp`, `nbf` and `iat` against `e`. Pure: `now` is given.
pub(crate) fn check_claims(claims: &Claims, e: &Expected<'_>) -> Result<(), TokenError> {
    let iss = match claims.get("iss") {
        None => return Err(TokenError::MissingClaim("iss")),
        Some(Value::String(s)) => s,
        Some(_) => {
            return Err(TokenError::InvalidClaim {
                name: "iss".into(),
                rule: "must be a string".into(),
            });
        }
    };
    if iss != e.issuer {
        return Err(TokenError::WrongIssuer {
            expected: e.issuer.to_owned(),
            found: iss.clone(),
        });
    }
    let aud = audiences(claims)?;
    if !aud.iter().any(|a| a == e.audience) {
        return Err(TokenError::WrongAudience {
            expected: e.audience.to_owned(),
            found: aud,
        });
    }
    let leeway = e.leeway_secs as i64;
    let exp = numeric_date(claims, "exp")?.ok_or(TokenError::MissingClaim("exp"))?;
    if e.now.saturating_sub(leeway) >= exp {
        return Err(TokenError::Expired {
            exp,
            now: e.now,
            leeway: e.leeway_secs,
        });
    }
    if let Some(nbf) = numeric_date(claims, "nbf")?
        && e.now.saturating_add(leeway) < nbf
    {
        return Err(TokenError::NotYetValid {
            nbf,
            now: e.now,
            leeway: e.leeway_secs,
        });
    }
    match numeric_date(claims, "iat")? {
        None if e.require_iat => return Err(TokenError::MissingClaim("iat")),
        Some(iat) if e.now.saturating_add(leeway) < iat => {
            return Err(TokenError::IssuedInFuture {
                iat,
                now: e.now,
                leeway: e.leeway_secs,
            });
        }
        _ => {}
    }
    Ok(())
}

/// Seconds since the Unix epoch, from the wall clock (token times are wall-clock times).
pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    const NOW: i64 = 1_800_000_000;

    fn expected() -> Expected<'static> {
        Expected {
            issuer: "https://sso.example.com",
            audience: "emisar",
            now: NOW,
            leeway_secs: 60,
            require_iat: true,
        }
    }

    fn good() -> Claims {
        json!({"iss": "https://sso.example.com", "aud": "emisar", "sub": "u1",
               "exp": NOW + 300, "iat": NOW - 5, "nbf": NOW - 5})
        .as_object()
        .unwrap()
        .clone()
    }

    fn with(key: &str, value: Value) -> Claims {
        let mut c = good();
        c.insert(key.into(), value);
        c
    }

    fn without(key: &str) -> Claims {
        let mut c = good();
        c.remove(key);
        c
    }

    #[test]
    fn good_claims_pass() {
        check_claims(&good(), &expected()).unwrap();
        check_claims(&with("aud", json!(["other", "emisar"])), &expected()).unwrap();
        check_claims(&with("exp", json!((NOW + 10) as f64 + 0.5)), &expected()).unwrap();
    }

    #[test]
    fn each_failure_has_its_own_message() {
        let cases: Vec<(Claims, &str)> = vec![
            (
                with("iss", json!("https://evil.example.com")),
                "issued by `https://evil.example.com`, not by the configured issuer `https://sso.example.com`",
            ),
            (without("iss"), "has no `iss` claim"),
            (with("iss", json!(1)), "`iss` claim must be a string"),
            (
                with("aud", json!("someone-else")),
                "for audience [\"someone-else\"], not for `emisar`",
            ),
            (
                with("aud", json!([1])),
                "`aud` claim must be a string or an array",
            ),
            (without("aud"), "has no `aud` claim"),
            (with("exp", json!(NOW - 61)), "expired at"),
            (without("exp"), "has no `exp` claim"),
            (
                with("exp", json!("tomorrow")),
                "`exp` claim must be a number",
            ),
            (with("nbf", json!(NOW + 61)), "not valid before"),
            (with("iat", json!(NOW + 61)), "issued in the future"),
            (without("iat"), "has no `iat` claim"),
        ];
        for (claims, want) in cases {
            let e = check_claims(&claims, &expected()).unwrap_err().to_string();
            assert!(e.contains(want), "{e} does not say {want}");
        }
    }

    #[test]
    fn leeway_is_applied_at_its_edges() {
        check_claims(&with("exp", json!(NOW - 59)), &expected()).unwrap();
        assert!(matches!(
            check_claims(&with("exp", json!(NOW - 60)), &expected()),
            Err(TokenError::Expired { .. })
        ));
        check_claims(&with("nbf", json!(NOW + 60)), &expected()).unwrap();
        let mut e = expected();
        e.require_iat = false;
        check_claims(&without("iat"), &e).unwrap();
    }

    proptest! {
        /// Whatever a token says in its claims, the check either passes or fails cleanly, and
        /// it passes only when the issuer and audience match and the times are in range.
        #[test]
        fn arbitrary_claims_never_pass_by_accident(
            iss in prop_oneof![Just(json!("https://sso.example.com")), any::<String>().prop_map(Value::from), any::<i64>().prop_map(Value::from)],
            aud in prop_oneof![Just(json!("emisar")), Just(json!(["x", "emisar"])), any::<String>().prop_map(Value::from), Just(json!([]))],
            exp in prop_oneof![any::<i64>().prop_map(Value::from), any::<f64>().prop_map(|f| json!(f)), Just(json!(null))],
            nbf in proptest::option::of(any::<i64>()),
        ) {
            let mut c = good();
            c.insert("iss".into(), iss.clone());
            c.insert("aud".into(), aud.clone());
            c.insert("exp".into(), exp.clone());
            match nbf { Some(n) => { c.insert("nbf".into(), json!(n)); } None => { c.remove("nbf"); } }
            let ok = check_claims(&c, &expected()).is_ok();
            let iss_ok = iss == json!("https://sso.example.com");
            let aud_ok = aud == json!("emisar") || aud == json!(["x", "emisar"]);
            let exp_ok = exp.as_f64().is_some_and(|e| e.is_finite() && (e as i64) > NOW - 60);
            let nbf_ok = nbf.is_none_or(|n| n <= NOW + 60);
            prop_assert_eq!(ok, iss_ok && aud_ok && exp_ok && nbf_ok);
        }
    }
}
