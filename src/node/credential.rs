//! The runner's own credential: what it earned by joining a server once (its runner token
//! and the server's key it pinned), kept in `state_dir/credential.json` so that after a
//! restart it re-registers instead of joining again.
//!
//! Invariants: the state dir is created with mode 0700 and the file written with mode 0600,
//! atomically (a temporary file, synced, then renamed), so a crash never leaves half a
//! credential. A credential file that others may read is refused, not used.

use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};

const FILE: &str = "credential.json";

#[derive(Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Credential {
    /// The server's base URL, as the runner was told to join it.
    pub server: String,
    /// The runner's name at that server.
    pub runner: String,
    /// `emr_…`: authenticates heartbeats and re-registration.
    pub runner_token: String,
    /// The server's Ed25519 public key (SPKI PEM), checked at join against the join token's
    /// fingerprint; every signed call is verified with it.
    pub server_public_key: String,
}

impl std::fmt::Debug for Credential {
    // The runner token is a credential: never print it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credential")
            .field("server", &self.server)
            .field("runner", &self.runner)
            .finish_non_exhaustive()
    }
}

impl Credential {
    /// Is this the credential of runner `name` at `server`?
    pub fn is_for(&self, server: &str, name: &str) -> bool {
        same_server(&self.server, server) && self.runner == name
    }
}

/// Two spellings of one server URL (a trailing slash does not make another server).
fn same_server(a: &str, b: &str) -> bool {
    a.trim_end_matches('/') == b.trim_end_matches('/')
}

/// The state dir and the credential in it.
pub struct CredentialStore {
    dir: PathBuf,
}

impl CredentialStore {
    pub fn new(dir: &Path) -> Self {
        CredentialStore {
            dir: dir.to_owned(),
        }
    }

    pub fn path(&self) -> PathBuf {
        self.dir.join(FILE)
    }

    /// Creates the state dir (mode 0700) if needed and checks a file can be written there, so
    /// that a join, which spends its token, never succeeds only to find it cannot save.
    pub fn prepare(&self) -> anyhow::Result<()> {
        if !self.dir.exists() {
            crate::util::files::create_private_dir(&self.dir)
                .with_context(|| format!("failed to create state_dir {}", self.dir.display()))?;
        }
        let probe = self.dir.join(".write-check");
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&probe)
            .with_context(|| {
                format!(
                    "state_dir {} is not writable: the runner keeps its credential there",
                    self.dir.display()
                )
            })?;
        std::fs::remove_file(&probe)
            .with_context(|| format!("failed to remove {}", probe.display()))?;
        Ok(())
    }

    /// The stored credential, if there is one.
    pub fn load(&self) -> anyhow::Result<Option<Credential>> {
        let path = self.path();
        let meta = match std::fs::metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                return Err(e).with_context(|| format!("failed to read {}", path.display()));
            }
        };
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            anyhow::bail!(
                "{} is readable or writable by others (mode {mode:o}): it holds this runner's credential; `chmod 600` it",
                path.display()
            );
        }
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("failed to read {}", path.display()))?;
        let credential = serde_json::from_str(&text).with_context(|| {
            format!(
                "{} is not a runner credential; remove it to join again",
                path.display()
            )
        })?;
        Ok(Some(credential))
    }

    /// Writes `credential` (mode 0600), replacing any earlier one atomically.
    pub fn save(&self, credential: &Credential) -> anyhow::Result<()> {
        let text = serde_json::to_string_pretty(credential).expect("a credential is JSON");
        crate::util::files::replace_private(&self.dir, FILE, text.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn credential() -> Credential {
        Credential {
            server: "http://emisar.example:7700/".into(),
            runner: "edge-1".into(),
            runner_token: "emr_secret".into(),
            server_public_key: "-----BEGIN PUBLIC KEY-----\n".into(),
        }
    }

    #[test]
    fn saved_private_and_loaded_back() {
        let tmp = tempfile::tempdir().unwrap();
        let store = CredentialStore::new(&tmp.path().join("state"));
        store.prepare().unwrap();
        let dir_mode = std::fs::metadata(tmp.path().join("state"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(dir_mode & 0o777, 0o700);
        assert_eq!(store.load().unwrap(), None);
        store.save(&credential()).unwrap();
        let mode = std::fs::metadata(store.path())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let loaded = store.load().unwrap().unwrap();
        assert_eq!(loaded, credential());
        assert!(loaded.is_for("http://emisar.example:7700", "edge-1"));
        assert!(!loaded.is_for("http://other:7700", "edge-1"));
        assert!(!loaded.is_for("http://emisar.example:7700", "edge-2"));
        assert!(!format!("{loaded:?}").contains("emr_secret"));

        std::fs::set_permissions(store.path(), std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = store.load().unwrap_err().to_string();
        assert!(err.contains("readable or writable by others"), "{err}");
    }
}
