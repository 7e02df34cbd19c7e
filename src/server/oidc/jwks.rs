//! The provider's signing keys (JWKS), fetched once, cached, and fetched again when a token
//! names a key id the cache does not hold (the provider rotated its key) or when the cached
//! set is older than [`MAX_AGE`] (a key the provider withdrew stops being trusted).
//!
//! *Invariants:* a refresh caused by an unknown `kid` happens at most once per
//! `min_refresh_interval`, and concurrent lookups share one fetch, so a flood of tokens with
//! made-up key ids costs the provider at most one request per interval. Only asymmetric
//! signature keys are kept (RSA, EC P-256/P-384, Ed25519); a symmetric (`oct`) key or one
//! marked `use: enc` is never used to verify, so a public key can never double as an HMAC
//! secret. A failed refresh keeps the keys already held.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, KeyAlgorithm, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};
use serde::Deserialize;
use tokio::sync::{Mutex, RwLock};
use tokio::time::Instant;

use super::fetch::{FetchError, METADATA_LIMIT, get_json};
use super::jwt::TokenError;

/// A cached key set older than this is fetched again at the next lookup.
pub(crate) const MAX_AGE: Duration = Duration::from_secs(3600);
/// Keys beyond this many in one set are ignored.
const MAX_KEYS: usize = 100;

/// One verification key and the algorithms it may verify.
pub(crate) struct VerifyKey {
    pub kid: Option<String>,
    pub key: DecodingKey,
    pub algorithms: Vec<Algorithm>,
}

impl std::fmt::Debug for VerifyKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerifyKey")
            .field("kid", &self.kid)
            .field("algorithms", &self.algorithms)
            .finish_non_exhaustive()
    }
}

struct Loaded {
    keys: Vec<Arc<VerifyKey>>,
    at: Instant,
}

/// The key set of one provider.
pub struct JwksCache {
    http: reqwest::Client,
    uri: String,
    min_refresh_interval: Duration,
    keys: RwLock<Option<Loaded>>,
    /// Held while fetching, so concurrent misses wait for one fetch instead of each fetching.
    fetching: Mutex<()>,
    fetches: AtomicU64,
}

#[derive(Deserialize)]
struct RawSet {
    keys: Vec<serde_json::Value>,
}

/// May an unknown `kid` cause a fetch now? Pure, so the rate limit is tested without a clock.
pub(crate) fn may_refresh(
    last_fetch: Option<Instant>,
    now: Instant,
    min_interval: Duration,
) -> bool {
    last_fetch.is_none_or(|at| now.saturating_duration_since(at) >= min_interval)
}

/// The signature algorithms a JWK may verify, or `None` when it is not a usable signing key.
pub(crate) fn algorithms_for(jwk: &Jwk) -> Option<Vec<Algorithm>> {
    if matches!(jwk.common.public_key_use, Some(ref u) if *u != PublicKeyUse::Signature) {
        return None;
    }
    let by_type = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => vec![
            Algorithm::RS256,
            Algorithm::RS384,
            Algorithm::RS512,
            Algorithm::PS256,
            Algorithm::PS384,
            Algorithm::PS512,
        ],
        AlgorithmParameters::EllipticCurve(ec) => match ec.curve {
            EllipticCurve::P256 => vec![Algorithm::ES256],
            EllipticCurve::P384 => vec![Algorithm::ES384],
            _ => return None,
        },
        AlgorithmParameters::OctetKeyPair(okp) => match okp.curve {
            EllipticCurve::Ed25519 => vec![Algorithm::EdDSA],
            _ => return None,
        },
        // Symmetric keys and unknown key types never verify anything here.
        _ => return None,
    };
    match jwk.common.key_algorithm {
        None => Some(by_type),
        Some(declared) => {
            let alg = key_algorithm(declared)?;
            by_type.contains(&alg).then(|| vec![alg])
        }
    }
}

fn key_algorithm(k: KeyAlgorithm) -> Option<Algorithm> {
    Some(match k {
        KeyAlgorithm::RS256 => Algorithm::RS256,
        KeyAlgorithm::RS384 => Algorithm::RS384,
        KeyAlgorithm::RS512 => Algorithm::RS512,
        KeyAlgorithm::PS256 => Algorithm::PS256,
        KeyAlgorithm::PS384 => Algorithm::PS384,
        KeyAlgorithm::PS512 => Algorithm::PS512,
        KeyAlgorithm::ES256 => Algorithm::ES256,
        KeyAlgorithm::ES384 => Algorithm::ES384,
        KeyAlgorithm::EdDSA => Algorithm::EdDSA,
        _ => return None,
    })
}

/// The usable keys of a JWKS document; keys this server cannot use are skipped, not errors
/// (providers publish encryption keys and other types next to their signing keys).
pub(crate) fn parse_key_set(doc: &[serde_json::Value]) -> Vec<Arc<VerifyKey>> {
    doc.iter()
        .take(MAX_KEYS)
        .filter_map(|raw| {
            let jwk: Jwk = serde_json::from_value(raw.clone()).ok()?;
            let algorithms = algorithms_for(&jwk)?;
            let key = DecodingKey::from_jwk(&jwk).ok()?;
            Some(Arc::new(VerifyKey {
                kid: jwk.common.key_id.clone(),
                key,
                algorithms,
            }))
        })
        .collect()
}

/// The key for a token's `kid` and `alg` among `keys`: by `kid` when the token names one;
/// without a `kid`, only when exactly one key can verify `alg`.
fn pick(keys: &[Arc<VerifyKey>], kid: Option<&str>, alg: Algorithm) -> Option<Arc<VerifyKey>> {
    match kid {
        Some(kid) => keys.iter().find(|k| k.kid.as_deref() == Some(kid)).cloned(),
        None => {
            let mut fitting = keys.iter().filter(|k| k.algorithms.contains(&alg));
            match (fitting.next(), fitting.next()) {
                (Some(k), None) => Some(k.clone()),
                _ => None,
            }
        }
    }
}

impl JwksCache {
    pub fn new(http: reqwest::Client, uri: String, min_refresh_interval: Duration) -> Self {
        JwksCache {
            http,
            uri,
            min_refresh_interval,
            keys: RwLock::new(None),
            fetching: Mutex::new(()),
            fetches: AtomicU64::new(0),
        }
    }

    pub fn uri(&self) -> &str {
        &self.uri
    }

    /// How many times the key set was fetched (for tests and metrics).
    pub fn fetch_count(&self) -> u64 {
        self.fetches.load(Ordering::Relaxed)
    }

    /// The key ids currently held.
    pub async fn kids(&self) -> Vec<Option<String>> {
        self.keys
            .read()
            .await
            .as_ref()
            .map(|l| l.keys.iter().map(|k| k.kid.clone()).collect())
            .unwrap_or_default()
    }

    async fn fetch(&self) -> Result<Vec<Arc<VerifyKey>>, FetchError> {
        self.fetches.fetch_add(1, Ordering::Relaxed);
        let set: RawSet = get_json(&self.http, &self.uri, METADATA_LIMIT).await?;
        Ok(parse_key_set(&set.keys))
    }

    /// Fetches the set unless another caller fetched it after `seen` (the fetch time this
    /// caller looked at). Returns the keys held afterwards.
    async fn refresh(&self, seen: Option<Instant>) -> Result<Vec<Arc<VerifyKey>>, FetchError> {
        let _one_at_a_time = self.fetching.lock().await;
        if let Some(l) = self.keys.read().await.as_ref()
            && seen.is_none_or(|s| l.at > s)
        {
            return Ok(l.keys.clone());
        }
        match self.fetch().await {
            Ok(keys) => {
                *self.keys.write().await = Some(Loaded {
                    keys: keys.clone(),
                    at: Instant::now(),
                });
                Ok(keys)
            }
            Err(e) => {
                let mut held = self.keys.write().await;
                match held.as_mut() {
                    Some(l) => {
                        // Keep the keys we had, and count the failure as a fetch so a dead
                        // provider is not asked again before the interval passes.
                        tracing::warn!(jwks_uri = %self.uri, error = %e, "failed to refresh the provider's key set; keeping the cached keys");
                        l.at = Instant::now();
                        Ok(l.keys.clone())
                    }
                    None => Err(e),
                }
            }
        }
    }

    /// The key that verifies a token with header `kid` and `alg`.
    pub(crate) async fn key_for(
        &self,
        kid: Option<&str>,
        alg: Algorithm,
    ) -> Result<Arc<VerifyKey>, TokenError> {
        let (held, at) = match self.keys.read().await.as_ref() {
            Some(l) => (l.keys.clone(), Some(l.at)),
            None => (Vec::new(), None),
        };
        let now = Instant::now();
        let stale = at.is_none_or(|at| now.saturating_duration_since(at) >= MAX_AGE);
        let mut keys = held;
        if stale {
            keys = self.refresh(at).await.map_err(TokenError::KeySet)?;
        }
        if let Some(k) = pick(&keys, kid, alg) {
            return Ok(k);
        }
        let last = self.keys.read().await.as_ref().map(|l| l.at);
        if !stale && may_refresh(last, now, self.min_refresh_interval) {
            keys = self.refresh(last).await.map_err(TokenError::KeySet)?;
            if let Some(k) = pick(&keys, kid, alg) {
                return Ok(k);
            }
        }
        Err(match kid {
            Some(kid) => TokenError::UnknownKey {
                kid: kid.to_owned(),
            },
            None => TokenError::MissingKeyId,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rsa() -> serde_json::Value {
        json!({"kty": "RSA", "kid": "r1", "use": "sig", "alg": "RS256", "e": "AQAB",
               "n": "q35oD7hOKd95mfznzpr710X68_SrWhdv3img5Hegk1LO4Aj6lLtjtuJKh6cYMDvdXg44mCfOnFAhMZOvPTGmABtx5pGSvCzRGCrad5O3m-qq3rhwQCOGiaGAQa8efRi8tDd0x17nJ4MhzXUQvVVFAcQ6dEX8HCZKgwac34Do9IaoSKqmiyIofRpL886_sCtsi3SEsuSzzAvcQIpFQvxT20wPL4MjXKTzXQAOfGpubp8h6JotjMKVaopGknEBkbXYCEfvfXEgfxs_jAS4VKP0RF8sbWHUIHS0bMDtDCWY6g1V13iXV4cYlosJNA_JXsJDza1rAbnRf55_uyXdycS_Fw"})
    }

    #[test]
    fn only_asymmetric_signing_keys_are_kept() {
        let mut enc = rsa();
        enc["use"] = json!("enc");
        enc["kid"] = json!("enc");
        let set = parse_key_set(&[
            rsa(),
            enc,
            json!({"kty": "oct", "kid": "hmac", "k": "c2VjcmV0"}),
            json!({"kty": "OKP", "crv": "Ed25519", "kid": "ed", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}),
            json!({"kty": "weird", "kid": "w"}),
            json!("not an object"),
        ]);
        let kids: Vec<_> = set.iter().map(|k| k.kid.clone().unwrap()).collect();
        assert_eq!(kids, ["r1", "ed"]);
        assert_eq!(set[0].algorithms, [Algorithm::RS256]);
        assert_eq!(set[1].algorithms, [Algorithm::EdDSA]);
    }

    #[test]
    fn a_declared_alg_narrows_and_a_mismatched_one_disqualifies() {
        let mut k = rsa();
        k.as_object_mut().unwrap().remove("alg");
        let jwk: Jwk = serde_json::from_value(k.clone()).unwrap();
        assert_eq!(algorithms_for(&jwk).unwrap().len(), 6);
        k["alg"] = json!("ES256");
        let jwk: Jwk = serde_json::from_value(k).unwrap();
        assert_eq!(algorithms_for(&jwk), None);
    }

    #[test]
    fn without_kid_only_a_single_fitting_key_is_picked() {
        let set = parse_key_set(&[rsa()]);
        assert!(pick(&set, None, Algorithm::RS256).is_some());
        assert!(pick(&set, None, Algorithm::ES256).is_none());
        let mut second = rsa();
        second["kid"] = json!("r2");
        let set = parse_key_set(&[rsa(), second]);
        assert!(pick(&set, None, Algorithm::RS256).is_none());
        assert_eq!(
            pick(&set, Some("r2"), Algorithm::RS256)
                .unwrap()
                .kid
                .as_deref(),
            Some("r2")
        );
        assert!(pick(&set, Some("r3"), Algorithm::RS256).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn refresh_is_rate_limited() {
        let min = Duration::from_secs(30);
        let t0 = Instant::now();
        assert!(may_refresh(None, t0, min));
        assert!(!may_refresh(Some(t0), t0, min));
        tokio::time::advance(Duration::from_secs(29)).await;
        assert!(!may_refresh(Some(t0), Instant::now(), min));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(may_refresh(Some(t0), Instant::now(), min));
        assert!(may_refresh(Some(t0), t0, Duration::ZERO));
    }
}
