//! C2SP `tlog-cosignature` (`cosignature/v1`): a witness's timestamped Ed25519 signature over a
//! checkpoint, as a signed-note signature of type 0x04.
//!
//! Written here because `signed_note` verifies and signs only type 0x01 (plain Ed25519 notes);
//! its `Signer`/`Verifier` traits are public, so this plugs into its notes. The signed message
//! is `cosignature/v1\ntime <T>\n` followed by the checkpoint text; the note signature is the
//! key ID (SHA-256(name ‖ "\n" ‖ 0x04 ‖ public key)[..4]), then T as a big-endian u64, then the
//! 64-byte Ed25519 signature. The verifier key text is `name+hex(key ID)+base64(0x04 ‖ key)`.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use ed25519_dalek::{Signer as _, SigningKey, VerifyingKey};

/// The signature type byte of `cosignature/v1`.
pub const COSIGNATURE_V1: u8 = 0x04;

/// The message a `cosignature/v1` signs: two header lines, then the checkpoint text (which
/// ends in a newline).
pub fn signed_message(timestamp: u64, checkpoint_text: &[u8]) -> Vec<u8> {
    let mut m = format!("cosignature/v1\ntime {timestamp}\n").into_bytes();
    m.extend_from_slice(checkpoint_text);
    m
}

/// The key ID of a `cosignature/v1` key.
pub fn key_id(name: &str, key: &VerifyingKey) -> u32 {
    let mut encoded = vec![COSIGNATURE_V1];
    encoded.extend_from_slice(key.as_bytes());
    signed_note::key_id(name, &encoded)
}

/// The verifier key text of a `cosignature/v1` key: `name+hex(id)+base64(0x04 ‖ key)`.
pub fn verifier_key(name: &str, key: &VerifyingKey) -> String {
    let mut encoded = vec![COSIGNATURE_V1];
    encoded.extend_from_slice(key.as_bytes());
    format!("{name}+{:08x}+{}", key_id(name, key), B64.encode(encoded))
}

/// The timestamp of a `cosignature/v1` note signature (its bytes after the key ID), if it has
/// the shape of one: 8 + 64 bytes, and a time that fits an i64, as the spec requires.
pub fn timestamp(signature: &[u8]) -> Option<u64> {
    if signature.len() != 8 + 64 {
        return None;
    }
    let t = u64::from_be_bytes(signature[..8].try_into().ok()?);
    (t <= i64::MAX as u64).then_some(t)
}

/// A witness's `cosignature/v1` signer. The timestamp is the current time in seconds, never 0.
pub struct Cosigner {
    name: String,
    key: SigningKey,
    id: u32,
}

impl Cosigner {
    /// `name` must be a valid note key name (non-empty, no spaces, no `+`).
    pub fn new(name: &str, key: SigningKey) -> Self {
        let id = key_id(name, &key.verifying_key());
        Cosigner {
            name: name.to_owned(),
            key,
            id,
        }
    }

    /// This cosigner's verifier key text.
    pub fn verifier_key(&self) -> String {
        verifier_key(&self.name, &self.key.verifying_key())
    }

    /// The note signature bytes (after the key ID) over `checkpoint_text` at `timestamp`.
    pub fn sign_at(&self, timestamp: u64, checkpoint_text: &[u8]) -> Vec<u8> {
        let sig = self.key.sign(&signed_message(timestamp, checkpoint_text));
        [&timestamp.to_be_bytes()[..], &sig.to_bytes()[..]].concat()
    }
}

impl signed_note::Signer for Cosigner {
    fn name(&self) -> &str {
        &self.name
    }
    fn key_id(&self) -> u32 {
        self.id
    }
    fn sign(&self, msg: &[u8]) -> Result<Vec<u8>, signature_v2::Error> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_err(|_| signature_v2::Error::new())?
            .as_secs()
            .max(1);
        Ok(self.sign_at(now, msg))
    }
}

/// Verifies `cosignature/v1` signatures of one witness key.
#[derive(Debug)]
pub struct CosignatureVerifier {
    name: String,
    key: VerifyingKey,
    id: u32,
}

/// A verifier key text was refused; the message names the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct KeyTextError(pub String);

impl CosignatureVerifier {
    pub fn new(name: &str, key: VerifyingKey) -> Self {
        CosignatureVerifier {
            name: name.to_owned(),
            id: key_id(name, &key),
            key,
        }
    }

    /// Parses `name+hex(id)+base64(0x04 ‖ key)`.
    pub fn from_verifier_key(text: &str) -> Result<Self, KeyTextError> {
        let (name, id, key) = super::keys::split_verifier_key(text)?;
        if key.first() != Some(&COSIGNATURE_V1) {
            return Err(KeyTextError(
                "a witness key must be of type 0x04 (cosignature/v1)".into(),
            ));
        }
        let bytes: [u8; 32] = key[1..]
            .try_into()
            .map_err(|_| KeyTextError("the key must be 32 bytes of Ed25519".into()))?;
        let key = VerifyingKey::from_bytes(&bytes)
            .map_err(|_| KeyTextError("the key is not an Ed25519 public key".into()))?;
        let v = CosignatureVerifier::new(name, key);
        if v.id != id {
            return Err(KeyTextError(format!(
                "the key ID {id:08x} does not match the name and key (want {:08x})",
                v.id
            )));
        }
        Ok(v)
    }
}

impl signed_note::Verifier for CosignatureVerifier {
    fn name(&self) -> &str {
        &self.name
    }
    fn key_id(&self) -> u32 {
        self.id
    }
    fn verify(&self, msg: &[u8], sig: &[u8]) -> bool {
        let Some(t) = timestamp(sig) else {
            return false;
        };
        let Ok(s) = ed25519_dalek::Signature::from_slice(&sig[8..]) else {
            return false;
        };
        self.key.verify_strict(&signed_message(t, msg), &s).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use signed_note::{Note, Verifier as _, VerifierList};

    /// The signature line of the c2sp.org/tlog-cosignature example: key ID 8d66cf3f, then the
    /// timestamp of the example's signed message, `time 1679315147`.
    #[test]
    fn spec_example_line_has_the_v1_layout() {
        let s = signed_note::Signature::from_bytes(
            "— witness.example.com/w1 jWbPPwAAAABkGFDLEZMHwSRaJNiIDoe9DYn/zXcrtPHeolMI5OWXEhZCB9dlrDJsX3b2oyin1nPZqhf5nNo0xUe+mbIUBkBIfZ+qnA==".as_bytes(),
        )
        .unwrap();
        assert_eq!(s.id(), 0x8d66cf3f);
        assert_eq!(timestamp(s.signature()), Some(1679315147));
    }

    #[test]
    fn spec_example_signed_message() {
        let text = b"example.com/behind-the-sofa\n20852163\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n";
        assert_eq!(
            signed_message(1679315147, text),
            b"cosignature/v1\ntime 1679315147\nexample.com/behind-the-sofa\n20852163\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n"
        );
    }

    #[test]
    fn cosign_then_verify_and_refuse_changes() {
        let c = Cosigner::new("witness.example/w1", SigningKey::from_bytes(&[7; 32]));
        let v = CosignatureVerifier::from_verifier_key(&c.verifier_key()).unwrap();
        let text = b"log.example/a\n5\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n";
        let mut note = Note::new(text, &[]).unwrap();
        note.add_sigs(&[&c]).unwrap();
        let (ok, _) = note
            .verify(&VerifierList::new(vec![Box::new(
                CosignatureVerifier::from_verifier_key(&c.verifier_key()).unwrap(),
            )]))
            .unwrap();
        assert!(timestamp(ok[0].signature()).unwrap() > 0);

        let sig = c.sign_at(1679315147, text);
        assert!(v.verify(text, &sig));
        let mut other = sig.clone();
        other[7] ^= 1; // the timestamp is signed
        assert!(!v.verify(text, &other));
        assert!(!v.verify(
            b"log.example/a\n6\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n",
            &sig
        ));
        let mut big = sig.clone();
        big[0] = 0x80; // beyond i64::MAX
        assert!(!v.verify(text, &big));
        assert!(!v.verify(text, &sig[..71]));
    }

    #[test]
    fn verifier_keys_are_checked() {
        let c = Cosigner::new("witness.example/w1", SigningKey::from_bytes(&[7; 32]));
        let good = c.verifier_key();
        let (name, rest) = good.split_once('+').unwrap();
        assert!(CosignatureVerifier::from_verifier_key(&format!("{name}x+{rest}")).is_err());
        // An Ed25519 note key (type 0x01) is not a cosignature key.
        let ed = super::super::keys::NoteKey::from_seed("witness.example/w1", [7; 32])
            .unwrap()
            .verifier_key();
        let e = CosignatureVerifier::from_verifier_key(&ed).unwrap_err();
        assert!(e.0.contains("0x04"), "{e}");
    }
}
