//! Signed-note keys as text: the private key `PRIVATE+KEY+name+hex(id)+base64(0x01 ‖ seed)`
//! (the format of Go's `sumdb/note` and `signed_note`), and verifier keys
//! `name+hex(id)+base64(type ‖ public key)`: type 0x01 for a log's Ed25519 note signatures,
//! 0x04 for a witness's `cosignature/v1`.
//!
//! One Ed25519 key serves a witness both ways, as omniwitness and litewitness do: its
//! cosignatures are type 0x04 with their own key ID, and the same private key text stores it.
//! Errors name the rule a text broke and never repeat the private key.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use ed25519_dalek::{SigningKey, VerifyingKey};

use super::cosignature::{CosignatureVerifier, Cosigner, KeyTextError};

/// The signature type byte of plain Ed25519 signed notes.
pub const ED25519: u8 = 0x01;

/// An Ed25519 signed-note private key with its name.
pub struct NoteKey {
    name: String,
    key: SigningKey,
}

impl std::fmt::Debug for NoteKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NoteKey({})", self.name)
    }
}

fn check_name(name: &str) -> Result<(), KeyTextError> {
    if !signed_note::is_key_name_valid(name) {
        return Err(KeyTextError(
            "a key name must be non-empty, without spaces or `+`".into(),
        ));
    }
    if name.len() > 256 || name.chars().any(char::is_control) {
        return Err(KeyTextError(
            "a key name must be at most 256 bytes, without control characters".into(),
        ));
    }
    Ok(())
}

impl NoteKey {
    /// A new random key named `name` (e.g. `witness.example.org/w1`).
    pub fn generate(name: &str) -> Result<Self, KeyTextError> {
        let mut seed = [0u8; 32];
        getrandom::fill(&mut seed)
            .map_err(|e| KeyTextError(format!("failed to draw random bytes: {e}")))?;
        Self::from_seed(name, seed)
    }

    /// The key of a known 32-byte seed (tests, known-answer vectors).
    pub fn from_seed(name: &str, seed: [u8; 32]) -> Result<Self, KeyTextError> {
        check_name(name)?;
        Ok(NoteKey {
            name: name.to_owned(),
            key: SigningKey::from_bytes(&seed),
        })
    }

    /// Parses the private key text `PRIVATE+KEY+name+hex(id)+base64(0x01 ‖ seed)`.
    pub fn parse(text: &str) -> Result<Self, KeyTextError> {
        let text = text.trim_end_matches(['\n', '\r']);
        let rest = text
            .strip_prefix("PRIVATE+KEY+")
            .ok_or_else(|| KeyTextError("a private key text starts with `PRIVATE+KEY+`".into()))?;
        let (name, id, key) = split_verifier_key(rest)?;
        if key.first() != Some(&ED25519) {
            return Err(KeyTextError(
                "a private key must be of type 0x01 (Ed25519)".into(),
            ));
        }
        let seed: [u8; 32] = key[1..]
            .try_into()
            .map_err(|_| KeyTextError("a private key holds a 32-byte Ed25519 seed".into()))?;
        let k = NoteKey::from_seed(name, seed)?;
        if k.key_id() != id {
            return Err(KeyTextError(format!(
                "the key ID {id:08x} does not match the name and key"
            )));
        }
        Ok(k)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    fn encoded_public(&self) -> Vec<u8> {
        let mut v = vec![ED25519];
        v.extend_from_slice(self.key.verifying_key().as_bytes());
        v
    }

    /// The key ID of its Ed25519 note signatures.
    pub fn key_id(&self) -> u32 {
        signed_note::key_id(&self.name, &self.encoded_public())
    }

    /// The private key text; write it only to a file only its owner reads.
    pub fn private_text(&self) -> String {
        let mut v = vec![ED25519];
        v.extend_from_slice(self.key.as_bytes());
        format!(
            "PRIVATE+KEY+{}+{:08x}+{}",
            self.name,
            self.key_id(),
            B64.encode(v)
        )
    }

    /// The verifier key text of its Ed25519 note signatures (a log's key).
    pub fn verifier_key(&self) -> String {
        format!(
            "{}+{:08x}+{}",
            self.name,
            self.key_id(),
            B64.encode(self.encoded_public())
        )
    }

    /// A signer of Ed25519 note signatures (a log signing its checkpoints).
    pub fn signer(&self) -> signed_note::StandardSigner {
        signed_note::StandardSigner::new(&self.private_text())
            .expect("signed_note reads the private key text this type writes")
    }

    /// The public key.
    pub fn public(&self) -> VerifyingKey {
        self.key.verifying_key()
    }

    /// The same key as a `cosignature/v1` cosigner (a witness).
    pub fn cosigner(&self) -> Cosigner {
        Cosigner::new(&self.name, self.key.clone())
    }

    /// The verifier key text of its `cosignature/v1` cosignatures.
    pub fn cosigner_key(&self) -> String {
        super::cosignature::verifier_key(&self.name, &self.key.verifying_key())
    }
}

/// Splits `name+hex(id)+base64(type ‖ key)` and checks its shape (not the type).
pub(super) fn split_verifier_key(text: &str) -> Result<(&str, u32, Vec<u8>), KeyTextError> {
    let shape = || KeyTextError("a verifier key is `name+hex8(key ID)+base64(key)`".into());
    let (name, rest) = text.split_once('+').ok_or_else(shape)?;
    let (id, key) = rest.split_once('+').ok_or_else(shape)?;
    check_name(name)?;
    if id.len() != 8 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(KeyTextError(
            "the key ID must be 8 hexadecimal digits".into(),
        ));
    }
    let id = u32::from_str_radix(id, 16).map_err(|_| shape())?;
    let key = B64
        .decode(key)
        .map_err(|_| KeyTextError("the key must be standard base64".into()))?;
    if key.is_empty() {
        return Err(KeyTextError("the key is empty".into()));
    }
    Ok((name, id, key))
}

/// A verifier of one key, from its text: type 0x01 (a log's Ed25519 note signatures) or 0x04
/// (a witness's `cosignature/v1`).
pub fn verifier(text: &str) -> Result<Box<dyn signed_note::Verifier + Send + Sync>, KeyTextError> {
    let (name, id, key) = split_verifier_key(text)?;
    match key[0] {
        ED25519 => {
            let bytes: [u8; 32] = key[1..]
                .try_into()
                .map_err(|_| KeyTextError("the key must be 32 bytes of Ed25519".into()))?;
            VerifyingKey::from_bytes(&bytes)
                .map_err(|_| KeyTextError("the key is not an Ed25519 public key".into()))?;
            if signed_note::key_id(name, &key) != id {
                return Err(KeyTextError(format!(
                    "the key ID {id:08x} does not match the name and key"
                )));
            }
            let v = signed_note::StandardVerifier::new(text)
                .map_err(|e| KeyTextError(format!("the key was refused: {e}")))?;
            Ok(Box::new(v))
        }
        super::cosignature::COSIGNATURE_V1 => {
            Ok(Box::new(CosignatureVerifier::from_verifier_key(text)?))
        }
        other => Err(KeyTextError(format!(
            "unknown key type 0x{other:02x} (known: 0x01 Ed25519, 0x04 cosignature/v1)"
        ))),
    }
}

/// Checks the witnesses a checkpoint's reader trusts, the one rule the server's
/// `[transparency]` and a runner's `require_witnessed` share: every witness key is a
/// `cosignature/v1` key (type 0x04), no two are one key (under one name or two), none is the
/// log's own key (whoever holds it would be its own witness), and the quorum is at least 1 and
/// at most the keys. `field` names the setting in errors, e.g. `witness_keys`.
pub fn check_witnesses(
    log_key: &str,
    field: &str,
    witness_keys: &[&str],
    quorum: usize,
    quorum_field: &str,
) -> Result<(), KeyTextError> {
    let (_, _, log) = split_verifier_key(log_key)?;
    let mut seen: Vec<Vec<u8>> = Vec::new();
    for (i, text) in witness_keys.iter().enumerate() {
        let (_, _, key) =
            split_verifier_key(text).map_err(|e| KeyTextError(format!("{field}[{i}]: {e}")))?;
        if key[0] != super::cosignature::COSIGNATURE_V1 {
            return Err(KeyTextError(format!(
                "{field}[{i}]: a witness key must be a cosignature/v1 key (type 0x04, `emisar witness keygen` prints it), not type 0x{:02x}",
                key[0]
            )));
        }
        if key[1..] == log[1..] {
            return Err(KeyTextError(format!(
                "{field}[{i}]: this is the log's own key: a log cannot witness itself"
            )));
        }
        if seen.contains(&key) {
            return Err(KeyTextError(format!(
                "{field}[{i}]: the same key as an earlier witness: each witness counts once"
            )));
        }
        seen.push(key);
    }
    if quorum == 0 || quorum > witness_keys.len() {
        return Err(KeyTextError(format!(
            "{quorum_field}: {quorum} must be between 1 and the {} witness keys",
            witness_keys.len()
        )));
    }
    Ok(())
}

/// The verifiers of a set of key texts, for `signed_note::Note::verify`.
pub struct Verifiers(Vec<Box<dyn signed_note::Verifier + Send + Sync>>);

impl Verifiers {
    pub fn parse<'a>(texts: impl IntoIterator<Item = &'a str>) -> Result<Self, KeyTextError> {
        texts
            .into_iter()
            .map(verifier)
            .collect::<Result<Vec<_>, _>>()
            .map(Verifiers)
    }
}

impl signed_note::Verifiers for Verifiers {
    fn verifier(
        &self,
        name: &str,
        id: u32,
    ) -> Result<&dyn signed_note::Verifier, signed_note::VerificationError> {
        self.0
            .iter()
            .find(|v| v.name() == name && v.key_id() == id)
            .map(|v| v.as_ref() as &dyn signed_note::Verifier)
            .ok_or_else(|| signed_note::VerificationError::UnknownKey {
                name: name.to_owned(),
                id,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use signed_note::Note;

    /// Go's sumdb/note `TestSign`: this private key signs this text to this signature line.
    #[test]
    fn go_sumdb_note_sign_vector() {
        let k = NoteKey::parse(
            "PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz",
        )
        .unwrap();
        assert_eq!(
            k.verifier_key(),
            "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"
        );
        let mut n = Note::new(b"If you think cryptography is the answer to your problem,\nthen you don't know what your problem is.\n", &[]).unwrap();
        n.add_sigs(&[&k.signer()]).unwrap();
        assert!(n.to_bytes().ends_with("\n\n— PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqdngotpRZb6KE6RyyBwJnAM=\n".as_bytes()));
        assert_eq!(
            NoteKey::parse(&k.private_text()).unwrap().private_text(),
            k.private_text()
        );
    }

    /// The c2sp.org/signed-note example verifies with its key; one changed byte does not; a
    /// signature of an unknown key is ignored, not an error, while one known one verifies.
    #[test]
    fn signed_note_spec_example() {
        let vkey = "example.com/foo+530d903a+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k";
        let msg = "This is an example message.\n\n— example.com/foo Uw2QOkn8srV1yJGh2VYRlL1Tnagv1YEq6TfXppzi2ONncAlTgK7Ztg1ERYNZXsYjOBH3mFXmRKuwHjG1Yu72IneyaQM=\n";
        let known = Verifiers::parse([vkey]).unwrap();
        Note::from_bytes(msg.as_bytes())
            .unwrap()
            .verify(&known)
            .unwrap();
        let changed = msg.replace("example message", "exampel message");
        assert!(
            Note::from_bytes(changed.as_bytes())
                .unwrap()
                .verify(&known)
                .is_err()
        );
        let other = NoteKey::from_seed("other.example/k", [3; 32]).unwrap();
        let mut n = Note::from_bytes(msg.as_bytes()).unwrap();
        n.add_sigs(&[&other.signer()]).unwrap();
        let (ok, ignored) = n.verify(&known).unwrap();
        assert_eq!((ok.len(), ignored.len()), (1, 1));
    }

    #[test]
    fn bad_key_texts_are_refused_by_rule() {
        let k = NoteKey::from_seed("log.example/a", [9; 32]).unwrap();
        let good = k.verifier_key();
        assert!(verifier(&good).is_ok());
        assert!(verifier(&k.cosigner_key()).is_ok());
        let cases = [
            ("log.example/a", "name+hex8"),
            ("log example+00000000+AQ==", "without spaces"),
            ("log.example/a+1234+AQ==", "8 hexadecimal"),
            ("log.example/a+0000000g+AQ==", "8 hexadecimal"),
            ("log.example/a+00000000+!!", "base64"),
            ("log.example/a+00000000+BwAA", "unknown key type 0x07"),
        ];
        for (text, rule) in cases {
            let e = verifier(text).err().unwrap();
            assert!(e.0.contains(rule), "{text}: {e}");
        }
        let wrong_id = format!("log.example/a+00000000{}", &good[good.len() - 45..]);
        assert!(
            verifier(&wrong_id)
                .err()
                .unwrap()
                .0
                .contains("does not match")
        );
        assert!(NoteKey::parse("PRIVATE+KEY+x").is_err());
        assert!(
            NoteKey::parse(&good)
                .err()
                .unwrap()
                .0
                .contains("PRIVATE+KEY+")
        );
    }
}
