//! WebAuthn assertions over an approval statement, checked the same way by the server and by
//! every runner (WebAuthn Level 3, §7.2 "Verifying an Authentication Assertion", the steps that
//! apply when the challenge is the statement's hash).
//!
//! Written here rather than with webauthn-rs: webauthn-rs picks its own random challenge for
//! every ceremony and will not take one (its maintainers declined the feature), while ours must
//! be the SHA-256 of the statement; and the runner verifies too, where webauthn-rs's tree (RSA,
//! P-384, P-521, x509, argon2) does not belong. The checks are a few comparisons and one
//! signature with RustCrypto's `p256` and `ed25519-dalek`.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Deserialize;
use sha2::{Digest, Sha256};

/// The COSE algorithms a passkey may use here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum CoseAlg {
    /// ECDSA P-256 with SHA-256 (COSE -7), what most platform passkeys use.
    ES256,
    /// Ed25519 (COSE -8).
    EdDSA,
}

impl CoseAlg {
    pub fn cose(self) -> i64 {
        match self {
            CoseAlg::ES256 => -7,
            CoseAlg::EdDSA => -8,
        }
    }
}

/// A passkey as an approvers file and the server's store hold it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PasskeyPublic {
    pub credential_id: Vec<u8>,
    pub alg: CoseAlg,
    /// SubjectPublicKeyInfo, DER.
    pub public_key: Vec<u8>,
}

/// Who the passkeys were made for: the portal's RP id and the origins it is served from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelyingParty {
    pub rp_id: String,
    pub origins: Vec<String>,
}

/// One `navigator.credentials.get` answer, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assertion {
    pub credential_id: Vec<u8>,
    pub authenticator_data: Vec<u8>,
    pub client_data_json: Vec<u8>,
    pub signature: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WebauthnError {
    #[error("passkey: `{0}` is not valid for {1}")]
    Malformed(&'static str, &'static str),
    #[error("passkey: the assertion is for another credential")]
    OtherCredential,
    #[error("passkey: `clientDataJSON.type` must be `{0}`")]
    Type(&'static str),
    #[error("passkey: the signed challenge is not this statement's hash")]
    Challenge,
    #[error("passkey: the origin is not one of the portal's origins")]
    Origin,
    #[error("passkey: a cross-origin assertion is refused")]
    CrossOrigin,
    #[error("passkey: the authenticator signed for another relying party id")]
    RpId,
    #[error("passkey: the authenticator did not confirm user presence (UP)")]
    Presence,
    #[error("passkey: the authenticator did not verify the user (UV: PIN or biometrics)")]
    Verification,
    #[error("passkey: the signature does not verify with this passkey")]
    Signature,
}

#[derive(Deserialize)]
struct ClientData {
    #[serde(rename = "type")]
    ty: String,
    challenge: String,
    origin: String,
    #[serde(default, rename = "crossOrigin")]
    cross_origin: bool,
}

/// The checks of one assertion: `clientDataJSON` type `webauthn.get`, its challenge exactly
/// `challenge`, its origin one of the RP's and not cross-origin; the authenticator data's RP id
/// hash the RP's, user presence and user verification set; and the signature over
/// `authenticatorData ‖ SHA-256(clientDataJSON)` with the passkey's key.
pub fn verify_assertion(
    rp: &RelyingParty,
    key: &PasskeyPublic,
    challenge: &[u8],
    a: &Assertion,
) -> Result<(), WebauthnError> {
    if a.credential_id != key.credential_id {
        return Err(WebauthnError::OtherCredential);
    }
    let cd: ClientData = serde_json::from_slice(&a.client_data_json)
        .map_err(|_| WebauthnError::Malformed("client_data_json", "clientDataJSON"))?;
    if cd.ty != "webauthn.get" {
        return Err(WebauthnError::Type("webauthn.get"));
    }
    let signed_challenge = URL_SAFE_NO_PAD
        .decode(cd.challenge.as_bytes())
        .map_err(|_| WebauthnError::Challenge)?;
    if signed_challenge != challenge {
        return Err(WebauthnError::Challenge);
    }
    if !rp.origins.iter().any(|o| *o == cd.origin) {
        return Err(WebauthnError::Origin);
    }
    if cd.cross_origin {
        return Err(WebauthnError::CrossOrigin);
    }
    let ad = &a.authenticator_data;
    if ad.len() < 37 {
        return Err(WebauthnError::Malformed(
            "authenticator_data",
            "authenticator data (37 bytes at least)",
        ));
    }
    if ad[..32] != Sha256::digest(rp.rp_id.as_bytes())[..] {
        return Err(WebauthnError::RpId);
    }
    let flags = ad[32];
    if flags & 0x01 == 0 {
        return Err(WebauthnError::Presence);
    }
    if flags & 0x04 == 0 {
        return Err(WebauthnError::Verification);
    }
    let mut signed = Vec::with_capacity(ad.len() + 32);
    signed.extend_from_slice(ad);
    signed.extend_from_slice(&Sha256::digest(&a.client_data_json));
    match key.alg {
        CoseAlg::ES256 => {
            use p256::ecdsa::signature::Verifier;
            use p256::pkcs8::DecodePublicKey;
            let vk = p256::ecdsa::VerifyingKey::from_public_key_der(&key.public_key)
                .map_err(|_| WebauthnError::Malformed("public_key", "a P-256 SPKI key"))?;
            let sig = p256::ecdsa::Signature::from_der(&a.signature)
                .map_err(|_| WebauthnError::Signature)?;
            vk.verify(&signed, &sig)
                .map_err(|_| WebauthnError::Signature)
        }
        CoseAlg::EdDSA => {
            use ed25519_dalek::pkcs8::DecodePublicKey;
            let vk = ed25519_dalek::VerifyingKey::from_public_key_der(&key.public_key)
                .map_err(|_| WebauthnError::Malformed("public_key", "an Ed25519 SPKI key"))?;
            let sig = ed25519_dalek::Signature::from_slice(&a.signature)
                .map_err(|_| WebauthnError::Signature)?;
            vk.verify_strict(&signed, &sig)
                .map_err(|_| WebauthnError::Signature)
        }
    }
}
