//! Files a process keeps for itself: written whole or not at all.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use anyhow::Context;

/// Replaces `dir/name` with `bytes`, durably, before returning: a fresh temporary file in the
/// same directory (mode 0600), fsynced, renamed over the old one, then the directory fsynced. A
/// crash leaves the old file or the new one, never a mix.
pub fn replace_private(dir: &Path, name: &str, bytes: &[u8]) -> anyhow::Result<()> {
    let path = dir.join(name);
    let tmp = dir.join(format!(".{name}.tmp"));
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("failed to create {}", tmp.display()))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .with_context(|| format!("failed to write {}", tmp.display()))?;
    std::fs::rename(&tmp, &path)
        .with_context(|| format!("failed to replace {}", path.display()))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("failed to sync {}", dir.display()))
}

/// Reads a private key file, refused when others may read or write it: `what` names the key
/// in the error (`the witness's`, `the audit log's`).
pub fn read_private(path: &Path, what: &str) -> anyhow::Result<String> {
    use std::os::unix::fs::PermissionsExt;
    let meta =
        std::fs::metadata(path).with_context(|| format!("failed to read {}", path.display()))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        anyhow::bail!(
            "{} is readable or writable by others (mode {mode:o}): it holds {what} private key; \
             `chmod 600` it",
            path.display()
        );
    }
    std::fs::read_to_string(path).with_context(|| format!("failed to read {}", path.display()))
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
