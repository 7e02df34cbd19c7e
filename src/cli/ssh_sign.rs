//! Signing with a person's OpenSSH Ed25519 key in the SSHSIG format (`ssh-keygen -Y sign`):
//! through a running ssh-agent (`SSH_AUTH_SOCK`), the habit operators already have, or from an
//! unencrypted private key file. The agent signs the SSHSIG signed-data blob; `ssh-key` wraps
//! the result into the armored signature.

use std::path::{Path, PathBuf};

use anyhow::Context;
use ssh_key::{Algorithm, HashAlg, LineEnding, PrivateKey, PublicKey, SshSig};

/// Where the key comes from: `--ssh-key PATH` (a private key file, or a `.pub` naming which
/// of the agent's keys), or else the agent's only Ed25519 key.
pub(super) fn sign(key: Option<&Path>, namespace: &str, message: &[u8]) -> anyhow::Result<String> {
    match key {
        Some(path) if path.extension().is_some_and(|e| e == "pub") => {
            let public = PublicKey::read_openssh_file(path).with_context(|| {
                format!("--ssh-key {}: not an OpenSSH public key", path.display())
            })?;
            with_agent(Some(&public), namespace, message)
        }
        Some(path) => with_file(path, namespace, message),
        None => with_agent(None, namespace, message),
    }
}

fn with_file(path: &Path, namespace: &str, message: &[u8]) -> anyhow::Result<String> {
    let key = PrivateKey::read_openssh_file(path)
        .with_context(|| format!("--ssh-key {}: not an OpenSSH private key", path.display()))?;
    if key.is_encrypted() {
        anyhow::bail!(
            "--ssh-key {}: the key is encrypted: add it to ssh-agent (`ssh-add {}`) and pass its .pub file, or leave --ssh-key out",
            path.display(),
            path.display()
        );
    }
    if key.algorithm() != Algorithm::Ed25519 {
        anyhow::bail!(
            "--ssh-key {}: only ssh-ed25519 keys sign approvals, not {}",
            path.display(),
            key.algorithm()
        );
    }
    let sig = key
        .sign(namespace, HashAlg::Sha512, message)
        .context("signing failed")?;
    Ok(sig.to_pem(LineEnding::LF)?)
}

fn with_agent(want: Option<&PublicKey>, namespace: &str, message: &[u8]) -> anyhow::Result<String> {
    let socket = std::env::var_os("SSH_AUTH_SOCK").map(PathBuf::from).context(
        "no ssh-agent: SSH_AUTH_SOCK is not set; start one (`eval $(ssh-agent)`, `ssh-add`) or pass --ssh-key with a private key file",
    )?;
    let mut agent = ssh_agent_client_rs::Client::connect(&socket)
        .with_context(|| format!("cannot reach the ssh-agent at {}", socket.display()))?;
    let identities = agent
        .list_all_identities()
        .context("the ssh-agent did not list its keys")?;
    let ed25519: Vec<_> = identities
        .iter()
        .filter(|id| {
            let data: &ssh_key::public::KeyData = (*id).into();
            data.algorithm() == Algorithm::Ed25519 && want.is_none_or(|w| w.key_data() == data)
        })
        .collect();
    let id = match (ed25519.as_slice(), want) {
        ([one], _) => *one,
        ([], Some(w)) => anyhow::bail!(
            "the ssh-agent does not hold {} (`ssh-add` it)",
            w.fingerprint(HashAlg::Sha256)
        ),
        ([], None) => anyhow::bail!(
            "the ssh-agent holds no ssh-ed25519 key: `ssh-add` yours, or pass --ssh-key"
        ),
        (_, _) => anyhow::bail!(
            "the ssh-agent holds several ssh-ed25519 keys: pass --ssh-key with the .pub of the one to sign with"
        ),
    };
    let data: &ssh_key::public::KeyData = id.into();
    let signed_data = SshSig::signed_data(namespace, HashAlg::Sha512, message)?;
    let signature = agent
        .sign_with_ref(id, &signed_data)
        .context("the ssh-agent refused to sign")?;
    let sig = SshSig::new(data.clone(), namespace, HashAlg::Sha512, signature)?;
    Ok(sig.to_pem(LineEnding::LF)?)
}
