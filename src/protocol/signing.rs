//! The server's Ed25519 key and the claims of the tokens it signs for runners: a call token
//! (one runner call), a health token (the prober reading a runner's `/healthz` details) and a
//! revocation token (grants the runner must no longer run any call under).
//!
//! Invariant: a runner executes only a call whose token verifies with the server's public key,
//! names this runner as audience, lives at most [`MAX_TOKEN_LIFETIME`] seconds, carries a `jti`
//! never seen before, and whose tool, argument digest and pack digest match the request and
//! the runner's own packs; and it executes a risk:high tool only under an approval id (once)
//! or when the claims say the server's policy lowered it (naming that policy).
//!
//! Invariant: every token names its [`Purpose`], and each verifier accepts only its own: a
//! health token never runs a call, and a call token never reads a runner's health details.

use std::path::Path;

use anyhow::Context;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ed25519_dalek::SigningKey;
use ed25519_dalek::pkcs8::spki::der::pem::LineEnding;
use ed25519_dalek::pkcs8::{EncodePrivateKey, EncodePublicKey};
use jsonwebtoken::{Algorithm, DecodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

/// The longest a signed call may live, in seconds.
pub const MAX_TOKEN_LIFETIME: u64 = 60;
/// What the server actually uses: short, so a stolen token is useless almost at once.
pub const TOKEN_LIFETIME: u64 = 30;
pub const ISSUER: &str = "emisar";

/// What a token signed for a runner is for. Both kinds are signed with the same key for the
/// same audience, so the purpose is what keeps one from standing in for the other.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Purpose {
    /// Run one call ([`CallClaims`]).
    Call,
    /// Read the runner's `/healthz` details ([`HealthClaims`]).
    Health,
    /// Tell the runner which grants were revoked ([`RevokeClaims`]).
    Revoke,
}

impl Purpose {
    pub fn as_str(self) -> &'static str {
        match self {
            Purpose::Call => "call",
            Purpose::Health => "health",
            Purpose::Revoke => "revoke",
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CallClaims {
    pub iss: String,
    /// The runner's name.
    pub aud: String,
    pub iat: u64,
    pub exp: u64,
    /// Always [`Purpose::Call`]; required, so a token without it runs nothing.
    pub purpose: Purpose,
    /// Single-use id: a runner refuses a second call with the same one.
    pub jti: String,
    /// The audit call id this execution belongs to.
    pub call_id: String,
    pub tool: String,
    /// SHA-256 of the canonical JSON of the whole request body (tool, args, mode, preview).
    pub request_sha256: String,
    /// SHA-256 of the pack file the server resolved the tool from.
    pub pack_sha256: String,
    /// The approval this execution carries out. A runner refuses to execute a risk:high tool
    /// without one, and refuses a second execution under the same one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_id: Option<String>,
    /// Set when the policy in force lowered a risk:high tool to run without approval: the
    /// SHA-256 of that policy (as audited in `policy.loaded`). Without an approval id, a
    /// runner executes a risk:high tool only when this is present, and logs which policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lowered_by_policy: Option<String>,
}

/// The claims of a health token: the server's prober may read this runner's details (its
/// name, pack digests and allowlists) until `exp`. It carries no `jti`: reading the details
/// twice changes nothing, and the token lives [`TOKEN_LIFETIME`] seconds.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct HealthClaims {
    pub iss: String,
    /// The runner's name.
    pub aud: String,
    pub iat: u64,
    pub exp: u64,
    /// Always [`Purpose::Health`].
    pub purpose: Purpose,
}

impl HealthClaims {
    /// A health token's claims for `runner`, valid from now for [`TOKEN_LIFETIME`] seconds.
    pub fn for_runner(runner: &str) -> Self {
        let iat = now();
        HealthClaims {
            iss: ISSUER.to_owned(),
            aud: runner.to_owned(),
            iat,
            exp: iat + TOKEN_LIFETIME,
            purpose: Purpose::Health,
        }
    }
}

/// The claims of a revocation token: the grants this runner must run nothing more under.
/// Anyone holding `server.key` may send one; it only ever takes authority away, so it carries
/// no `jti`, and sending it twice changes nothing.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RevokeClaims {
    pub iss: String,
    /// The runner's name.
    pub aud: String,
    pub iat: u64,
    pub exp: u64,
    /// Always [`Purpose::Revoke`].
    pub purpose: Purpose,
    pub grants: Vec<RevokedGrant>,
}

/// One revoked grant: its id, and its expiry (unix seconds), past which the runner need not
/// remember it (the grant runs nothing after it anyway).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RevokedGrant {
    pub id: String,
    pub expires: u64,
}

impl RevokeClaims {
    /// A revocation token's claims for `runner`, valid from now for [`TOKEN_LIFETIME`] seconds.
    pub fn for_runner(runner: &str, grants: Vec<RevokedGrant>) -> Self {
        let iat = now();
        RevokeClaims {
            iss: ISSUER.to_owned(),
            aud: runner.to_owned(),
            iat,
            exp: iat + TOKEN_LIFETIME,
            purpose: Purpose::Revoke,
            grants,
        }
    }
}

/// Fails fast if jsonwebtoken has no crypto backend (it would panic on first use otherwise).
pub fn ensure_crypto_provider() -> anyhow::Result<()> {
    if jsonwebtoken::crypto::CryptoProvider::try_get_default().is_none() {
        anyhow::bail!("jsonwebtoken has no crypto provider: enable exactly one of its backends");
    }
    Ok(())
}

/// Signs runner calls as compact JWS (EdDSA), the form [`CallVerifier`] reads.
///
/// Written here rather than with `jsonwebtoken::encode`: that builds the key pair from the
/// PKCS#8 bytes on every call, deriving the public key again, a second Ed25519 scalar
/// multiplication as costly as the signature itself (a profile of the server at 50 clients
/// put it at 3 % of the server's CPU). The key is read once here; the header is the one
/// jsonwebtoken writes, and Ed25519 is deterministic, so the tokens are byte for byte those
/// of `jsonwebtoken::encode` (a test holds that).
///
/// The signature is aws-lc's (the Ed25519 that rustls and jsonwebtoken already link), not
/// ed25519-dalek's: on the 2-core AMD EPYC bench machine of 2026-12-05 it signed a call's token
/// in 10.6 µs against dalek's 19.9 µs (dalek's fixed-base multiplication has no vectorised
/// backend); end to end the A/B could not tell the two apart (docs/BENCHMARKS.md, "Call tokens signed with aws-lc").
/// The PEM is still read with dalek, and the key pair built from its seed and public key,
/// which aws-lc checks agree.
pub struct CallSigner {
    key: aws_lc_rs::signature::Ed25519KeyPair,
    /// The encoded header, `base64url({"typ":"JWT","alg":"EdDSA"})`, the same for every call.
    header: String,
}

impl CallSigner {
    pub fn from_pem(pem: &str) -> anyhow::Result<Self> {
        use ed25519_dalek::pkcs8::DecodePrivateKey;
        let key = SigningKey::from_pkcs8_pem(pem).context("failed to read the signing key")?;
        let key = aws_lc_rs::signature::Ed25519KeyPair::from_seed_and_public_key(
            key.as_bytes(),
            key.verifying_key().as_bytes(),
        )
        .map_err(|e| anyhow::anyhow!("failed to load the signing key: {e}"))?;
        let header = serde_json::to_vec(&Header::new(Algorithm::EdDSA))
            .context("failed to encode the JWS header")?;
        Ok(CallSigner {
            key,
            header: URL_SAFE_NO_PAD.encode(header),
        })
    }

    pub fn from_file(path: &Path) -> anyhow::Result<Self> {
        let pem = std::fs::read_to_string(path)
            .with_context(|| format!("failed to read signing key {}", path.display()))?;
        Self::from_pem(&pem)
    }

    /// `header.claims.signature`, each part base64url without padding (RFC 7515, 7.1); the
    /// signature covers `header.claims` as ASCII.
    pub fn sign<C: Serialize>(&self, claims: &C) -> anyhow::Result<String> {
        let claims = serde_json::to_vec(claims).context("failed to encode the token's claims")?;
        let mut token = String::with_capacity(self.header.len() + claims.len() * 4 / 3 + 90);
        token.push_str(&self.header);
        token.push('.');
        URL_SAFE_NO_PAD.encode_string(claims, &mut token);
        let signature = self.key.sign(token.as_bytes());
        token.push('.');
        URL_SAFE_NO_PAD.encode_string(signature.as_ref(), &mut token);
        Ok(token)
    }
}

pub struct CallVerifier {
    key: DecodingKey,
    validation: Validation,
}

#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error("the token is invalid: {0}")]
    Invalid(String),
    #[error("the token lives {0} s, more than the {MAX_TOKEN_LIFETIME} s allowed")]
    TooLong(u64),
    #[error("the token is a {} token, not a {} token", .found.as_str(), .expected.as_str())]
    WrongPurpose { expected: Purpose, found: Purpose },
}

impl CallVerifier {
    pub fn from_pem(pem: &str, runner_name: &str) -> anyhow::Result<Self> {
        ensure_crypto_provider()?;
        let mut validation = Validation::new(Algorithm::EdDSA);
        validation.set_audience(&[runner_name]);
        validation.set_issuer(&[ISSUER]);
        validation.set_required_spec_claims(&["exp", "aud", "iss"]);
        validation.leeway = 5;
        Ok(CallVerifier {
            key: DecodingKey::from_ed_pem(pem.as_bytes())
                .context("failed to read the server public key")?,
            validation,
        })
    }

    /// A call token's claims, if the token is one for this runner and for a call.
    pub fn verify(&self, token: &str) -> Result<CallClaims, VerifyError> {
        self.decode(token, Purpose::Call)
    }

    /// A health token's claims, if the token is one for this runner and for reading health.
    pub fn verify_health(&self, token: &str) -> Result<HealthClaims, VerifyError> {
        self.decode(token, Purpose::Health)
    }

    /// A revocation token's claims, if the token is one for this runner and for revoking.
    pub fn verify_revoke(&self, token: &str) -> Result<RevokeClaims, VerifyError> {
        self.decode(token, Purpose::Revoke)
    }

    /// Signature, issuer, audience and expiry; then the lifetime and the purpose the token
    /// names, both read before the claims of that purpose, so a token of the other kind is
    /// refused for its purpose rather than for a field it lacks.
    fn decode<C: serde::de::DeserializeOwned>(
        &self,
        token: &str,
        expected: Purpose,
    ) -> Result<C, VerifyError> {
        #[derive(Deserialize)]
        struct Common {
            iat: u64,
            exp: u64,
            purpose: Purpose,
        }
        let claims = jsonwebtoken::decode::<serde_json::Value>(token, &self.key, &self.validation)
            .map_err(|e| VerifyError::Invalid(e.to_string()))?
            .claims;
        let common = Common::deserialize(&claims)
            .map_err(|e| VerifyError::Invalid(format!("its claims do not read: {e}")))?;
        let lifetime = common.exp.saturating_sub(common.iat);
        if lifetime > MAX_TOKEN_LIFETIME {
            return Err(VerifyError::TooLong(lifetime));
        }
        if common.purpose != expected {
            return Err(VerifyError::WrongPurpose {
                expected,
                found: common.purpose,
            });
        }
        C::deserialize(claims)
            .map_err(|e| VerifyError::Invalid(format!("its claims do not read: {e}")))
    }
}

/// A fresh Ed25519 key pair as (private PKCS#8 PEM, public SPKI PEM).
pub fn generate_keypair() -> anyhow::Result<(String, String)> {
    use getrandom::{SysRng, rand_core::UnwrapErr};
    let key = SigningKey::generate(&mut UnwrapErr(SysRng));
    let private = key
        .to_pkcs8_pem(LineEnding::LF)
        .context("failed to encode the private key")?
        .to_string();
    let public = key
        .verifying_key()
        .to_public_key_pem(LineEnding::LF)
        .context("failed to encode the public key")?;
    Ok((private, public))
}

/// Writes a key pair to `private` (mode 0600) and `public`.
pub fn write_keypair(private: &Path, public: &Path) -> anyhow::Result<()> {
    let (private_pem, public_pem) = generate_keypair()?;
    // Neither file is replaced: runners trust the public key they were given, and a new one
    // written over it would leave them refusing the server (or trusting a key whose private
    // half is elsewhere). Both are created new, and the private key is removed again when
    // the public one cannot be, so a refusal leaves nothing half-written.
    create_new(private, &private_pem, 0o600)?;
    if let Err(e) = create_new(public, &public_pem, 0o644) {
        let _ = std::fs::remove_file(private);
        return Err(e);
    }
    Ok(())
}

/// Writes `text` to a file that must not exist yet, with `mode`.
fn create_new(path: &Path, text: &str, mode: u32) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .with_context(|| match path.exists() {
            true => format!(
                "{} already exists: keygen replaces no key (move it away first)",
                path.display()
            ),
            false => format!("failed to create {}", path.display()),
        })?;
    f.write_all(text.as_bytes())
        .and_then(|()| f.sync_all())
        .with_context(|| format!("failed to write {}", path.display()))
}

/// The public key (SPKI PEM) of a private key (PKCS#8 PEM), handed to runners that join.
pub fn public_pem_of(private_pem: &str) -> anyhow::Result<String> {
    use ed25519_dalek::pkcs8::DecodePrivateKey;
    let key = SigningKey::from_pkcs8_pem(private_pem).context("failed to read the signing key")?;
    key.verifying_key()
        .to_public_key_pem(LineEnding::LF)
        .context("failed to encode the public key")
}

/// The fingerprint that pins the server's key: lowercase hex SHA-256 of the Ed25519 public
/// key in SPKI DER form. The PEM is decoded and the DER re-encoded first, so two PEM texts of
/// the same key (line endings, wrapping) have the same fingerprint.
pub fn key_fingerprint(public_pem: &str) -> anyhow::Result<String> {
    use ed25519_dalek::VerifyingKey;
    use ed25519_dalek::pkcs8::DecodePublicKey;
    let key = VerifyingKey::from_public_key_pem(public_pem.trim())
        .context("failed to read the Ed25519 public key (SPKI PEM)")?;
    let der = key
        .to_public_key_der()
        .context("failed to encode the public key")?;
    Ok(crate::digest::sha256_hex(der.as_bytes()))
}

pub fn now() -> u64 {
    jsonwebtoken::get_current_timestamp()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keygen_replaces_no_key_and_leaves_nothing_half_written() {
        let dir = tempfile::tempdir().unwrap();
        let (private, public) = (dir.path().join("server.key"), dir.path().join("server.pub"));
        write_keypair(&private, &public).unwrap();
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!((mode(&private), mode(&public)), (0o600, 0o644));
        let trusted = std::fs::read_to_string(&public).unwrap();
        // A public key the runners trust, without its private half here: not written over.
        std::fs::remove_file(&private).unwrap();
        let err = write_keypair(&private, &public).unwrap_err().to_string();
        assert!(err.contains("server.pub already exists"), "{err}");
        assert!(!private.exists(), "the private key is removed again");
        assert_eq!(std::fs::read_to_string(&public).unwrap(), trusted);
        // A private key is never replaced either.
        std::fs::write(&private, "kept").unwrap();
        std::fs::remove_file(&public).unwrap();
        let err = write_keypair(&private, &public).unwrap_err().to_string();
        assert!(err.contains("server.key already exists"), "{err}");
        assert_eq!(std::fs::read_to_string(&private).unwrap(), "kept");
        assert!(!public.exists());
    }

    fn claims(aud: &str, iat: u64, exp: u64) -> CallClaims {
        CallClaims {
            iss: ISSUER.into(),
            aud: aud.into(),
            iat,
            exp,
            purpose: Purpose::Call,
            jti: "j".into(),
            call_id: "c".into(),
            tool: "traefik.ping".into(),
            request_sha256: "a".into(),
            pack_sha256: "p".into(),
            approval_id: None,
            lowered_by_policy: None,
        }
    }

    #[test]
    fn fingerprints_name_the_key_not_its_text() {
        let (_, public) = generate_keypair().unwrap();
        let (_, other) = generate_keypair().unwrap();
        let fp = key_fingerprint(&public).unwrap();
        assert_eq!(fp.len(), 64);
        assert_eq!(key_fingerprint(&public.replace('\n', "\r\n")).unwrap(), fp);
        assert_ne!(key_fingerprint(&other).unwrap(), fp);
        assert!(key_fingerprint("not a key").is_err());
    }

    #[test]
    fn tokens_are_those_jsonwebtoken_writes() {
        let (private, _) = generate_keypair().unwrap();
        let signer = CallSigner::from_pem(&private).unwrap();
        let key = jsonwebtoken::EncodingKey::from_ed_pem(private.as_bytes()).unwrap();
        let t = now();
        let mut c = claims("node-1", t, t + 30);
        c.approval_id = Some("ap-1".into());
        c.lowered_by_policy = Some("ab\"c\u{e9}\n".into());
        for c in [claims("node-1", t, t + 30), c] {
            let ours = signer.sign(&c).unwrap();
            let theirs = jsonwebtoken::encode(&Header::new(Algorithm::EdDSA), &c, &key).unwrap();
            assert_eq!(ours, theirs);
        }
    }

    #[test]
    fn round_trip_and_refusals() {
        let (private, public) = generate_keypair().unwrap();
        let signer = CallSigner::from_pem(&private).unwrap();
        let verifier = CallVerifier::from_pem(&public, "node-1").unwrap();
        let t = now();
        let ok = claims("node-1", t, t + 30);
        assert_eq!(verifier.verify(&signer.sign(&ok).unwrap()).unwrap(), ok);

        let wrong_aud = signer.sign(&claims("node-2", t, t + 30)).unwrap();
        assert!(
            verifier
                .verify(&wrong_aud)
                .unwrap_err()
                .to_string()
                .contains("InvalidAudience")
        );
        let expired = signer.sign(&claims("node-1", t - 100, t - 60)).unwrap();
        assert!(
            verifier
                .verify(&expired)
                .unwrap_err()
                .to_string()
                .contains("Expired")
        );
        let too_long = signer.sign(&claims("node-1", t, t + 3600)).unwrap();
        assert!(matches!(
            verifier.verify(&too_long),
            Err(VerifyError::TooLong(3600))
        ));

        let (other_private, _) = generate_keypair().unwrap();
        let forged = CallSigner::from_pem(&other_private)
            .unwrap()
            .sign(&ok)
            .unwrap();
        assert!(
            verifier
                .verify(&forged)
                .unwrap_err()
                .to_string()
                .contains("InvalidSignature")
        );
    }

    #[test]
    fn a_token_serves_only_its_own_purpose() {
        let (private, public) = generate_keypair().unwrap();
        let signer = CallSigner::from_pem(&private).unwrap();
        let verifier = CallVerifier::from_pem(&public, "node-1").unwrap();
        let t = now();

        let health = HealthClaims::for_runner("node-1");
        let health_token = signer.sign(&health).unwrap();
        assert_eq!(verifier.verify_health(&health_token).unwrap(), health);
        let err = verifier.verify(&health_token).unwrap_err();
        assert!(
            matches!(
                err,
                VerifyError::WrongPurpose {
                    expected: Purpose::Call,
                    found: Purpose::Health
                }
            ),
            "{err}"
        );

        let call_token = signer.sign(&claims("node-1", t, t + 30)).unwrap();
        assert!(verifier.verify(&call_token).is_ok());
        let err = verifier.verify_health(&call_token).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the token is a call token, not a health token"
        );

        // A health token for another runner, or one that lives too long, reads nothing.
        let other = signer.sign(&HealthClaims::for_runner("node-2")).unwrap();
        assert!(
            verifier
                .verify_health(&other)
                .unwrap_err()
                .to_string()
                .contains("InvalidAudience")
        );
        let mut long = HealthClaims::for_runner("node-1");
        long.exp = long.iat + 3600;
        assert!(matches!(
            verifier.verify_health(&signer.sign(&long).unwrap()),
            Err(VerifyError::TooLong(3600))
        ));

        // A token that names no purpose (as a server before purposes signed) is neither.
        let mut bare = serde_json::to_value(claims("node-1", t, t + 30)).unwrap();
        bare.as_object_mut().unwrap().remove("purpose");
        let bare = signer.sign(&bare).unwrap();
        assert!(verifier.verify(&bare).is_err());
        assert!(verifier.verify_health(&bare).is_err());
    }
}
