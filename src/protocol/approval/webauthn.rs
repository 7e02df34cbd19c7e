//! Passkeys (WebAuthn) for signed approvals, pure: read a registration into the passkey's
//! public key ([`parse_registration`]), and verify an assertion over a challenge the caller
//! chose ([`verify_assertion`]). The server uses both (registration in the portal, and a look
//! at an approval's signature before it is stored); the runner uses only the second, with
//! the passkeys of its own approvers file and the challenge it rebuilt from the call it
//! received: the SHA-256 of the approval's statement.
//!
//! Why not `webauthn-rs`: it picks its own random challenge for every ceremony and keeps it
//! private (its maintainers declined a caller-chosen one), while ours must be the
//! statement's hash, so that the signature binds exactly what runs; and its crypto stack is
//! OpenSSL or a second set of RustCrypto curves, which neither the runner nor the server
//! links. What it would check for an assertion is the short list of WebAuthn Level 3 §7.2
//! below, written out here.
//!
//! The crates: ES256 with `aws-lc-rs` (rustls already links it into both binaries; its
//! ECDSA verifier takes the DER signature WebAuthn carries and an SPKI or SEC1 key, and
//! writes the SPKI DER we store, so a P-256 signature adds no second implementation to the
//! runner), EdDSA with `ed25519-dalek` (the call signing keys' crate; strict verification),
//! CBOR with `ciborium` (reading one item from a slice stops right after it, which is how
//! the COSE key's end inside the authenticator data is found).
//!
//! Invariants: nothing here trusts an attestation statement (the "none" format and any
//! other are read only for the credential, since whoever registers is already signed in);
//! user presence and user verification are required in both ceremonies; a
//! [`WebauthnError`] names the check and the rule, never the refused bytes. The signature
//! counter is decided here ([`check_sign_count`]) and remembered by the server, per
//! credential.

use std::fmt;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ciborium::value::Value;
use sha2::{Digest, Sha256};

/// A passkey's signature algorithm, as COSE (RFC 9053) numbers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum CoseAlg {
    /// ECDSA over P-256 with SHA-256 (COSE -7): what almost every passkey uses.
    ES256,
    /// Ed25519 (COSE -8).
    EdDSA,
}

impl CoseAlg {
    /// The COSE algorithm number (`pubKeyCredParams[].alg`).
    pub fn cose(self) -> i64 {
        match self {
            CoseAlg::ES256 => -7,
            CoseAlg::EdDSA => -8,
        }
    }

    /// The name in approvers files and the API: `ES256` or `EdDSA`.
    pub fn as_str(self) -> &'static str {
        match self {
            CoseAlg::ES256 => "ES256",
            CoseAlg::EdDSA => "EdDSA",
        }
    }

    /// The algorithm a name stands for (`ES256`, `EdDSA`).
    pub fn parse(name: &str) -> Option<CoseAlg> {
        match name {
            "ES256" => Some(CoseAlg::ES256),
            "EdDSA" => Some(CoseAlg::EdDSA),
            _ => None,
        }
    }
}

impl fmt::Display for CoseAlg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A passkey as an approvers file and the server's store hold it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PasskeyPublic {
    /// The credential id the authenticator chose (the browser's `rawId`).
    pub credential_id: Vec<u8>,
    pub alg: CoseAlg,
    /// The public key as SubjectPublicKeyInfo DER (RFC 5280; RFC 8410 for Ed25519).
    pub public_key: Vec<u8>,
}

/// Who the passkeys are for: the RP ID the authenticator hashes into its data, and the
/// origins (`https://host[:port]`) the browser may report in the client data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelyingParty {
    pub rp_id: String,
    pub origins: Vec<String>,
}

/// What a browser's `navigator.credentials.get` returns, decoded from base64url.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assertion {
    pub credential_id: Vec<u8>,
    pub authenticator_data: Vec<u8>,
    pub client_data_json: Vec<u8>,
    pub signature: Vec<u8>,
}

/// Which check refused a registration or an assertion: the field and the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WebauthnError {
    #[error(
        "clientDataJSON must be a JSON object with string `type`, `challenge` and `origin` (and a boolean `crossOrigin` if present)"
    )]
    ClientDataJson,
    #[error("clientDataJSON.type must be `{expected}`")]
    Type { expected: &'static str },
    #[error(
        "clientDataJSON.challenge must be the expected challenge (its bytes in base64url without padding)"
    )]
    Challenge,
    #[error("clientDataJSON.origin must be one of the relying party's origins")]
    Origin,
    #[error(
        "clientDataJSON.crossOrigin must not be true (the ceremony ran in a cross-origin frame)"
    )]
    CrossOrigin,
    #[error(
        "authenticatorData is too short: it must hold rpIdHash (32 bytes), flags (1) and signCount (4){more}"
    )]
    AuthenticatorData { more: &'static str },
    #[error("authenticatorData.rpIdHash must be the SHA-256 of the relying party id")]
    RpIdHash,
    #[error("authenticatorData.flags must have UP set (the user was present)")]
    UserPresent,
    #[error("authenticatorData.flags must have UV set (the user was verified: PIN or biometric)")]
    UserVerified,
    #[error("credential_id must be the passkey's own credential id")]
    CredentialId,
    #[error(
        "signature does not verify over authenticatorData ‖ SHA-256(clientDataJSON) with the passkey's {alg} key"
    )]
    Signature { alg: CoseAlg },
    #[error(
        "public_key must be an {alg} SubjectPublicKeyInfo (DER) for a passkey whose alg is {alg}"
    )]
    PublicKey { alg: CoseAlg },
    #[error("attestationObject must be a CBOR map whose `authData` is a byte string")]
    AttestationObject,
    #[error(
        "authenticatorData.flags must have AT set: a registration carries the attested credential data"
    )]
    NoAttestedCredential,
    #[error(
        "credentialPublicKey must be an ES256 (EC2, P-256) or EdDSA (OKP, Ed25519) COSE key: {rule}"
    )]
    CoseKey { rule: &'static str },
    #[error(
        "authenticatorData.signCount must be greater than the last one seen from this passkey ({stored}), and it is {asserted}: the passkey may have been cloned"
    )]
    SignCount { stored: u32, asserted: u32 },
}

/// Whether the user-verified flag is required. Always required through the public
/// functions; the published test vectors that lack it are checked for everything else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Uv {
    Required,
    #[cfg(test)]
    NotRequired,
}

/// WebAuthn L3 §7.2 checks: clientData.type == "webauthn.get", challenge == expected (exact
/// bytes after base64url decoding), origin ∈ rp.origins, crossOrigin not true,
/// authData.rpIdHash == SHA-256(rp_id), flags UP and UV set, signature over
/// authData ‖ SHA-256(clientDataJSON) with the passkey's key and alg. The assertion's
/// credential id must be the passkey's (the credential the browser was allowed to use).
pub fn verify_assertion(
    rp: &RelyingParty,
    key: &PasskeyPublic,
    challenge: &[u8],
    a: &Assertion,
) -> Result<(), WebauthnError> {
    check_assertion(rp, key, challenge, a, Uv::Required)
}

fn check_assertion(
    rp: &RelyingParty,
    key: &PasskeyPublic,
    challenge: &[u8],
    a: &Assertion,
    uv: Uv,
) -> Result<(), WebauthnError> {
    if a.credential_id != key.credential_id {
        return Err(WebauthnError::CredentialId);
    }
    check_client_data(rp, &a.client_data_json, "webauthn.get", challenge)?;
    check_authenticator_data(rp, &a.authenticator_data, uv)?;
    let mut signed = Vec::with_capacity(a.authenticator_data.len() + 32);
    signed.extend_from_slice(&a.authenticator_data);
    signed.extend_from_slice(&Sha256::digest(&a.client_data_json));
    verify_signature(key, &signed, &a.signature)
}

/// Registration (attestation "none" accepted; others: the attestation statement is not
/// trusted, only the credential is read): clientData.type == "webauthn.create", challenge,
/// origin, rpIdHash, UP+UV, AT flag, credential id and COSE key → PasskeyPublic.
pub fn parse_registration(
    rp: &RelyingParty,
    challenge: &[u8],
    attestation_object: &[u8],
    client_data_json: &[u8],
) -> Result<PasskeyPublic, WebauthnError> {
    read_registration(
        rp,
        challenge,
        attestation_object,
        client_data_json,
        Uv::Required,
    )
}

fn read_registration(
    rp: &RelyingParty,
    challenge: &[u8],
    attestation_object: &[u8],
    client_data_json: &[u8],
    uv: Uv,
) -> Result<PasskeyPublic, WebauthnError> {
    check_client_data(rp, client_data_json, "webauthn.create", challenge)?;
    let auth_data = attestation_auth_data(attestation_object)?;
    let flags = check_authenticator_data(rp, &auth_data, uv)?;
    if flags & FLAG_AT == 0 {
        return Err(WebauthnError::NoAttestedCredential);
    }
    // After rpIdHash (32), flags (1), signCount (4): aaguid (16), credentialIdLength (2,
    // big-endian), credentialId, credentialPublicKey (one CBOR item), then extensions.
    const SHORT: WebauthnError = WebauthnError::AuthenticatorData {
        more: ", then aaguid (16), credentialIdLength (2), credentialId and credentialPublicKey",
    };
    let rest = auth_data.get(37 + 16..).ok_or(SHORT)?;
    let (len, rest) = rest.split_first_chunk::<2>().ok_or(SHORT)?;
    let len = usize::from(u16::from_be_bytes(*len));
    if len == 0 || len > MAX_CREDENTIAL_ID {
        return Err(WebauthnError::AuthenticatorData {
            more: ", and a credentialId of 1 to 1023 bytes",
        });
    }
    let (credential_id, cose) = (rest.get(..len).ok_or(SHORT)?, &rest[len..]);
    let (alg, public_key) = cose_to_spki(cose)?;
    Ok(PasskeyPublic {
        credential_id: credential_id.to_vec(),
        alg,
        public_key,
    })
}

/// The signature counter in authenticator data (`signCount`: 4 bytes, big-endian, after
/// rpIdHash and flags).
pub fn sign_count(authenticator_data: &[u8]) -> Result<u32, WebauthnError> {
    authenticator_data
        .get(33..37)
        .and_then(|b| <[u8; 4]>::try_from(b).ok())
        .map(u32::from_be_bytes)
        .ok_or(WebauthnError::AuthenticatorData { more: "" })
}

/// The signature counter a registration starts from (the attestation object's `authData`).
pub fn registration_sign_count(attestation_object: &[u8]) -> Result<u32, WebauthnError> {
    sign_count(&attestation_auth_data(attestation_object)?)
}

/// WebAuthn L3 §7.2, the signCount step: when the authenticator keeps a counter (`asserted`
/// or the last one seen, `stored`, is not zero), an assertion's counter must be greater than
/// the last one; otherwise two authenticators share the credential, a clone. Returns the
/// counter to remember, or `None` when the authenticator keeps none (both zero, as synced
/// passkeys report). The caller remembers the counter per credential, which is why this
/// check is not in [`verify_assertion`]: a runner, which sees signatures only as the
/// executions it receives arrive, in any order, keeps none.
pub fn check_sign_count(stored: u32, asserted: u32) -> Result<Option<u32>, WebauthnError> {
    if stored == 0 && asserted == 0 {
        return Ok(None);
    }
    if asserted > stored {
        Ok(Some(asserted))
    } else {
        Err(WebauthnError::SignCount { stored, asserted })
    }
}

/// The longest credential id WebAuthn allows (L3 §5.8.3: at most 1023 bytes).
const MAX_CREDENTIAL_ID: usize = 1023;
const FLAG_UP: u8 = 0x01;
const FLAG_UV: u8 = 0x04;
const FLAG_AT: u8 = 0x40;

#[derive(serde::Deserialize)]
struct ClientData {
    #[serde(rename = "type")]
    ty: String,
    challenge: String,
    origin: String,
    #[serde(rename = "crossOrigin", default)]
    cross_origin: Option<bool>,
}

/// §7.1 steps 7–10 / §7.2 steps 10–13: the client data is parsed as JSON (browsers add keys
/// of their own, so it is never compared as text) and its fields compared one by one.
fn check_client_data(
    rp: &RelyingParty,
    json: &[u8],
    expected: &'static str,
    challenge: &[u8],
) -> Result<(), WebauthnError> {
    let cd: ClientData = serde_json::from_slice(json).map_err(|_| WebauthnError::ClientDataJson)?;
    if cd.ty != expected {
        return Err(WebauthnError::Type { expected });
    }
    match URL_SAFE_NO_PAD.decode(&cd.challenge) {
        Ok(bytes) if bytes == challenge => {}
        _ => return Err(WebauthnError::Challenge),
    }
    if !rp.origins.contains(&cd.origin) {
        return Err(WebauthnError::Origin);
    }
    if cd.cross_origin == Some(true) {
        return Err(WebauthnError::CrossOrigin);
    }
    Ok(())
}

/// §7.1 steps 13–15 / §7.2 steps 15–17: the RP ID hash and the UP and UV flags. Returns the
/// flags.
fn check_authenticator_data(
    rp: &RelyingParty,
    auth_data: &[u8],
    uv: Uv,
) -> Result<u8, WebauthnError> {
    if auth_data.len() < 37 {
        return Err(WebauthnError::AuthenticatorData { more: "" });
    }
    if auth_data[..32] != Sha256::digest(rp.rp_id.as_bytes())[..] {
        return Err(WebauthnError::RpIdHash);
    }
    let flags = auth_data[32];
    if flags & FLAG_UP == 0 {
        return Err(WebauthnError::UserPresent);
    }
    if uv == Uv::Required && flags & FLAG_UV == 0 {
        return Err(WebauthnError::UserVerified);
    }
    Ok(flags)
}

/// The `authData` of an attestation object (`{fmt, attStmt, authData}`); the statement is
/// not read, whatever its format.
fn attestation_auth_data(attestation_object: &[u8]) -> Result<Vec<u8>, WebauthnError> {
    let value: Value =
        ciborium::from_reader(attestation_object).map_err(|_| WebauthnError::AttestationObject)?;
    let entries = value
        .into_map()
        .map_err(|_| WebauthnError::AttestationObject)?;
    let mut found = None;
    for (k, v) in entries {
        if k.as_text() == Some("authData") {
            if found.is_some() {
                return Err(WebauthnError::AttestationObject);
            }
            found = Some(
                v.into_bytes()
                    .map_err(|_| WebauthnError::AttestationObject)?,
            );
        }
    }
    found.ok_or(WebauthnError::AttestationObject)
}

/// A COSE_Key (RFC 9052 §7, RFC 9053) at the start of `cose` → its algorithm and the key as
/// SPKI DER. Only the first CBOR item is read: extensions may follow it.
fn cose_to_spki(cose: &[u8]) -> Result<(CoseAlg, Vec<u8>), WebauthnError> {
    let bad = |rule| WebauthnError::CoseKey { rule };
    let value: Value = ciborium::from_reader(cose).map_err(|_| bad("not CBOR"))?;
    let entries = value.into_map().map_err(|_| bad("not a CBOR map"))?;
    let mut seen = std::collections::BTreeSet::new();
    for (k, _) in &entries {
        let label = k
            .as_integer()
            .map(i128::from)
            .ok_or(bad("every label must be an integer"))?;
        if !seen.insert(label) {
            return Err(bad("a label appears twice"));
        }
    }
    let get = |label: i128| {
        entries
            .iter()
            .find(|(k, _)| k.as_integer().map(i128::from) == Some(label))
            .map(|(_, v)| v)
    };
    let int = |label| get(label).and_then(Value::as_integer).map(i128::from);
    let coordinate = |label| -> Result<[u8; 32], WebauthnError> {
        get(label)
            .and_then(Value::as_bytes)
            .and_then(|b| <[u8; 32]>::try_from(b.as_slice()).ok())
            .ok_or(bad("a coordinate is missing or not 32 bytes"))
    };
    // kty (1), alg (3), crv (-1); x (-2), y (-3).
    match (int(1), int(3), int(-1)) {
        (Some(2), Some(-7), Some(1)) => {
            let mut sec1 = Vec::with_capacity(65);
            sec1.push(0x04); // uncompressed point
            sec1.extend_from_slice(&coordinate(-2)?);
            sec1.extend_from_slice(&coordinate(-3)?);
            let key = aws_lc_rs::signature::ParsedPublicKey::new(
                &aws_lc_rs::signature::ECDSA_P256_SHA256_ASN1,
                &sec1,
            )
            .map_err(|_| bad("the point is not on P-256"))?;
            let der = aws_lc_rs::encoding::AsDer::as_der(&key)
                .map_err(|_| bad("the point is not on P-256"))?;
            Ok((CoseAlg::ES256, der.as_ref().to_vec()))
        }
        (Some(1), Some(-8), Some(6)) => {
            let key = ed25519_dalek::VerifyingKey::from_bytes(&coordinate(-2)?)
                .map_err(|_| bad("x is not an Ed25519 point"))?;
            let der = ed25519_dalek::pkcs8::EncodePublicKey::to_public_key_der(&key)
                .map_err(|_| bad("x is not an Ed25519 point"))?;
            Ok((CoseAlg::EdDSA, der.as_bytes().to_vec()))
        }
        _ => Err(bad(
            "(kty, alg, crv) must be (2, -7, 1) for ES256 or (1, -8, 6) for EdDSA",
        )),
    }
}

/// The signature over `signed` with the passkey's key, by its algorithm: ES256 as DER
/// (ECDSA-Sig-Value, which is what authenticators return), EdDSA as 64 bytes.
fn verify_signature(
    key: &PasskeyPublic,
    signed: &[u8],
    signature: &[u8],
) -> Result<(), WebauthnError> {
    let alg = key.alg;
    match alg {
        CoseAlg::ES256 => {
            // The verifier hashes `signed` with SHA-256 itself (ES256).
            let public = aws_lc_rs::signature::ParsedPublicKey::new(
                &aws_lc_rs::signature::ECDSA_P256_SHA256_ASN1,
                &key.public_key,
            )
            .map_err(|_| WebauthnError::PublicKey { alg })?;
            public
                .verify_sig(signed, signature)
                .map_err(|_| WebauthnError::Signature { alg })
        }
        CoseAlg::EdDSA => {
            let public = <ed25519_dalek::VerifyingKey as ed25519_dalek::pkcs8::DecodePublicKey>::from_public_key_der(
                &key.public_key,
            )
            .map_err(|_| WebauthnError::PublicKey { alg })?;
            let signature = ed25519_dalek::Signature::from_slice(signature)
                .map_err(|_| WebauthnError::Signature { alg })?;
            public
                .verify_strict(signed, &signature)
                .map_err(|_| WebauthnError::Signature { alg })
        }
    }
}

#[cfg(test)]
mod tests;
