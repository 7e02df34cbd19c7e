//! OpenSSH signatures (the SSHSIG format of `ssh-keygen -Y sign`) over approval statements and
//! approvers files, Ed25519 keys only, through RustCrypto's `ssh-key` (which parses the armored
//! blob, checks the namespace and that the key inside the signature is the expected one, then
//! the Ed25519 signature over the SSHSIG signed-data, SHA-512 of the message).

use ssh_key::{Algorithm, HashAlg, PublicKey, SshSig};

/// The namespace of a person's signature over an approval statement.
pub const APPROVAL_NAMESPACE: &str = "emisar-approval";
/// The namespace of an organisation root key's signature over an approvers file.
pub const APPROVERS_NAMESPACE: &str = "emisar-approvers";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SshSigError {
    #[error("`{field}`: not an OpenSSH public key line (`ssh-ed25519 AAAA… comment`)")]
    PublicKey { field: String },
    #[error("`{field}`: only ssh-ed25519 keys are accepted, not {alg}")]
    Algorithm { field: String, alg: String },
    #[error("not an armored SSH signature (-----BEGIN SSH SIGNATURE-----)")]
    Armor,
    #[error("the signature's namespace is `{0}`, not `{1}`")]
    Namespace(String, &'static str),
    #[error("the signature was made with another key than {0}")]
    OtherKey(String),
    #[error("the signature does not verify for {0} over this text")]
    Invalid(String),
}

/// An Ed25519 OpenSSH public key read from a `ssh-ed25519 AAAA… comment` line.
pub fn read_public_key(field: &str, line: &str) -> Result<PublicKey, SshSigError> {
    let key = PublicKey::from_openssh(line.trim()).map_err(|_| SshSigError::PublicKey {
        field: field.to_owned(),
    })?;
    if key.algorithm() != Algorithm::Ed25519 {
        return Err(SshSigError::Algorithm {
            field: field.to_owned(),
            alg: key.algorithm().to_string(),
        });
    }
    Ok(key)
}

/// `SHA256:…`, the fingerprint `ssh-keygen -l` prints: the key id in audit events.
pub fn key_id(key: &PublicKey) -> String {
    key.fingerprint(HashAlg::Sha256).to_string()
}

/// The public key inside an armored signature (not yet trusted: compare it with known keys).
pub fn signer_key(armored: &str) -> Result<PublicKey, SshSigError> {
    let sig = SshSig::from_pem(armored.trim()).map_err(|_| SshSigError::Armor)?;
    Ok(PublicKey::from(sig.public_key().clone()))
}

/// Verifies `armored` as `key`'s signature over `message` in `namespace`.
pub fn verify(
    key: &PublicKey,
    namespace: &'static str,
    message: &[u8],
    armored: &str,
) -> Result<(), SshSigError> {
    let sig = SshSig::from_pem(armored.trim()).map_err(|_| SshSigError::Armor)?;
    if sig.namespace() != namespace {
        return Err(SshSigError::Namespace(
            sig.namespace().to_owned(),
            namespace,
        ));
    }
    if sig.public_key() != key.key_data() {
        return Err(SshSigError::OtherKey(key_id(key)));
    }
    key.verify(namespace, message, &sig)
        .map_err(|_| SshSigError::Invalid(key_id(key)))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use ssh_key::{LineEnding, PrivateKey};

    /// A deterministic Ed25519 key for tests.
    pub(crate) fn test_key(seed: u8) -> PrivateKey {
        let kp = ssh_key::private::Ed25519Keypair::from_seed(&[seed; 32]);
        PrivateKey::from(kp)
    }

    pub(crate) fn sign(key: &PrivateKey, namespace: &str, msg: &[u8]) -> String {
        key.sign(namespace, HashAlg::Sha512, msg)
            .unwrap()
            .to_pem(LineEnding::LF)
            .unwrap()
    }

    #[test]
    fn a_signature_verifies_only_for_its_key_namespace_and_message() {
        let alice = test_key(1);
        let bob = test_key(2);
        let sig = sign(&alice, APPROVAL_NAMESPACE, b"statement");
        let a = alice.public_key();
        verify(a, APPROVAL_NAMESPACE, b"statement", &sig).unwrap();
        assert!(matches!(
            verify(a, APPROVAL_NAMESPACE, b"statement!", &sig),
            Err(SshSigError::Invalid(_))
        ));
        assert!(matches!(
            verify(a, APPROVERS_NAMESPACE, b"statement", &sig),
            Err(SshSigError::Namespace(..))
        ));
        assert!(matches!(
            verify(bob.public_key(), APPROVAL_NAMESPACE, b"statement", &sig),
            Err(SshSigError::OtherKey(_))
        ));
        assert!(matches!(
            verify(a, APPROVAL_NAMESPACE, b"statement", "garbage"),
            Err(SshSigError::Armor)
        ));
        assert_eq!(&signer_key(&sig).unwrap(), a);
    }

    #[test]
    fn only_ed25519_public_keys_are_read() {
        let line = test_key(1).public_key().to_openssh().unwrap();
        read_public_key("ssh", &line).unwrap();
        assert!(matches!(
            read_public_key("ssh", "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQ x"),
            Err(SshSigError::PublicKey { .. } | SshSigError::Algorithm { .. })
        ));
        assert!(read_public_key("ssh", "not a key").is_err());
    }
}
