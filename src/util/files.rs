//! Files a process keeps for itself: written whole or not at all.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use anyhow::Context;

/// Replaces `dir/name` with `bytes`, durably, before returning, readable by this user only
/// (mode 0600); see [`replace`].
pub fn replace_private(dir: &Path, name: &str, bytes: &[u8]) -> anyhow::Result<()> {
    replace(&dir.join(name), bytes, 0o600)
}

/// Replaces the file at `path` with `bytes`, durably, before returning: a fresh temporary
/// file in the same directory (created with `mode`, less the umask), fsynced, renamed over
/// the old one, then the directory fsynced. A crash leaves the old file or the new one, never
/// a mix.
pub fn replace(path: &Path, bytes: &[u8], mode: u32) -> anyhow::Result<()> {
    let name = path
        .file_name()
        .with_context(|| format!("{} names no file", path.display()))?;
    let dir = directory_of(path);
    let tmp = dir.join(format!(".{}.tmp", name.to_string_lossy()));
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .with_context(|| format!("failed to create {}", tmp.display()))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .with_context(|| format!("failed to write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("failed to replace {}", path.display()))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("failed to sync {}", dir.display()))
}

/// The directory a file at `path` is in (`.` for a bare file name).
fn directory_of(path: &Path) -> &Path {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    }
}

/// Reads a private key file, refused when others may read or write it: `what` names the key
/// in the error (`the witness's`, `the audit log's`). The rule is PostgreSQL's for its TLS
/// key: a key owned by anyone but root is `0600` (no group or other bits); a key owned by
/// root may also be read by its group (`root:emisar 0640`, as the package makes
/// `server.key`), and never by others.
pub fn read_private(path: &Path, what: &str) -> anyhow::Result<String> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let meta =
        std::fs::metadata(path).with_context(|| format!("failed to read {}", path.display()))?;
    if let Some(why) = private_mode_refused(meta.uid(), meta.permissions().mode() & 0o777) {
        anyhow::bail!("{}: {why}: it holds {what} private key", path.display());
    }
    std::fs::read_to_string(path).with_context(|| format!("failed to read {}", path.display()))
}

/// Why a private key file owned by `uid` with `mode` may not be used, if it may not.
fn private_mode_refused(uid: u32, mode: u32) -> Option<String> {
    let (allowed, fix) = match uid {
        0 => (
            0o640,
            "root's key may be 0640 for its group (`chmod 640` it, `chgrp` the service's group) \
             or `chmod 600`",
        ),
        _ => (
            0o600,
            "a key not owned by root must be 0600 (`chmod 600` it), or root's with 0640",
        ),
    };
    (mode & !allowed != 0).then(|| format!("mode {mode:o} is too open for a private key: {fix}"))
}

/// Creates a directory only its owner may enter (mode 0700), with any parents it needs (also
/// 0700); an existing one is left as it is. A runner's `state_dir` holds its credential, its
/// keys and the ledger of executed approvals.
pub fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// Writes a new private key file (mode 0600, synced); an existing file is never overwritten.
pub fn create_private(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| {
            format!(
                "failed to create {} (an existing key is never overwritten)",
                path.display()
            )
        })?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .with_context(|| format!("failed to write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn mode_of(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn a_file_is_replaced_whole_with_the_mode_asked_for() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("approvers.toml");
        std::fs::write(&path, "old").unwrap();
        // A temporary file a crash left behind is no obstacle.
        std::fs::write(dir.path().join(".approvers.toml.tmp"), "half").unwrap();
        replace(&path, b"new", 0o644).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new");
        assert_eq!(mode_of(&path), 0o644);
        replace_private(dir.path(), "approvers.toml", b"newer").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "newer");
        assert_eq!(mode_of(&path), 0o600);
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, ["approvers.toml"], "no temporary file is left");
    }

    #[test]
    fn a_file_is_replaced_in_the_directory_it_is_in() {
        assert_eq!(directory_of(Path::new("approvers.toml")), Path::new("."));
        assert_eq!(directory_of(Path::new("./approvers.toml")), Path::new("."));
        assert_eq!(
            directory_of(Path::new("/etc/emisar/a.toml")),
            Path::new("/etc/emisar")
        );
        let err = replace(Path::new("/"), b"x", 0o600).unwrap_err();
        assert!(err.to_string().contains("names no file"), "{err}");
    }

    /// PostgreSQL's rule: a key not owned by root has no group or other bits; one owned by
    /// root may be group-readable; nobody's key is readable by others or group-writable.
    #[test]
    fn a_private_key_follows_postgresqls_rule() {
        assert_eq!(private_mode_refused(1000, 0o600), None);
        assert_eq!(private_mode_refused(1000, 0o400), None);
        assert_eq!(private_mode_refused(0, 0o600), None);
        assert_eq!(private_mode_refused(0, 0o640), None);
        for (uid, mode) in [
            (1000, 0o640),
            (1000, 0o604),
            (0, 0o660),
            (0, 0o644),
            (0, 0o700),
        ] {
            let why = private_mode_refused(uid, mode).expect("refused");
            assert!(
                why.starts_with(&format!("mode {mode:o} is too open")),
                "{uid} {mode:o}: {why}"
            );
        }
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("log.key");
        std::fs::write(&key, "k").unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o604)).unwrap();
        let err = read_private(&key, "the audit log's")
            .unwrap_err()
            .to_string();
        assert!(err.contains("mode 604 is too open"), "{err}");
        assert!(
            err.ends_with("it holds the audit log's private key"),
            "{err}"
        );
    }

    /// A state directory is made 0700, its missing parents too.
    #[test]
    fn a_private_directory_is_the_owners_alone() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("var/state");
        create_private_dir(&state).unwrap();
        assert_eq!(mode_of(&state), 0o700);
        assert_eq!(mode_of(&dir.path().join("var")), 0o700);
        create_private_dir(&state).unwrap();
    }
}
