//! Secret params in the audit log: stored as a keyed HMAC, never in clear.
//!
//! An auditor who knows a candidate value (and holds the key) can check it with
//! `emisar audit hash`; without the key the stored MAC says nothing about the value.

use std::path::Path;

use anyhow::Context;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The shortest key accepted, in bytes.
const MIN_KEY_LEN: usize = 32;
pub(crate) const PREFIX: &str = "hmac-sha256:";

#[derive(Clone)]
pub struct AuditKey(Vec<u8>);

impl std::fmt::Debug for AuditKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AuditKey(..)")
    }
}

impl AuditKey {
    /// Reads a key file: at least 32 bytes (hex text, or raw bytes).
    pub fn from_file(path: &Path) -> anyhow::Result<Self> {
        let bytes = std::fs::read(path)
            .with_context(|| format!("failed to read audit key {}", path.display()))?;
        let text = String::from_utf8_lossy(&bytes);
        let key = hex::decode(text.trim()).unwrap_or(bytes);
        if key.len() < MIN_KEY_LEN {
            anyhow::bail!(
                "audit key {} must hold at least {MIN_KEY_LEN} bytes (64 hex characters)",
                path.display()
            );
        }
        Ok(AuditKey(key))
    }

    /// Writes a fresh random key (hex, mode 0600).
    pub fn generate(path: &Path) -> anyhow::Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut key = [0u8; 32];
        getrandom::fill(&mut key)
            .map_err(|e| anyhow::anyhow!("failed to get random bytes: {e}"))?;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .with_context(|| format!("failed to create {}", path.display()))?;
        f.write_all(hex::encode(key).as_bytes())?;
        Ok(())
    }

    /// The text stored in place of a secret value.
    pub fn seal(&self, value: &str) -> String {
        let mut mac =
            <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("HMAC takes any key length");
        mac.update(value.as_bytes());
        format!("{PREFIX}{}", hex::encode(mac.finalize().into_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seal_is_keyed_and_stable() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        AuditKey::generate(&a).unwrap();
        AuditKey::generate(&b).unwrap();
        let (ka, kb) = (
            AuditKey::from_file(&a).unwrap(),
            AuditKey::from_file(&b).unwrap(),
        );
        assert_eq!(ka.seal("hunter2"), ka.seal("hunter2"));
        assert_ne!(ka.seal("hunter2"), ka.seal("hunter3"));
        assert_ne!(ka.seal("hunter2"), kb.seal("hunter2"));
        assert!(ka.seal("x").starts_with(PREFIX));
        assert!(!format!("{ka:?}").contains(&hex::encode(&ka.0)));
        std::fs::write(&a, "abcd").unwrap();
        assert!(
            AuditKey::from_file(&a)
                .unwrap_err()
                .to_string()
                .contains("at least 32 bytes")
        );
    }
}
