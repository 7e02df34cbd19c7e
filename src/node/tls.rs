//! The runner's TLS identity: the certificate and key from runner.toml, or else a self-signed
//! certificate the runner creates once and keeps in its `state_dir`.
//!
//! Invariants: a created private key is written mode 0600 (in a directory created 0700) and
//! only ever replaced when it or its certificate is missing; the fingerprint the runner
//! prints and sends when it joins is the one of the certificate it serves.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;

use super::config::RunnerConfig;
use crate::util::tls::{Fingerprint, server_config_from_files};

/// What the runner serves HTTPS with.
pub struct RunnerTls {
    pub config: Arc<rustls::ServerConfig>,
    /// Of the end-entity certificate: what the server pins.
    pub fingerprint: Fingerprint,
    /// Where the certificate is, for messages.
    pub cert_file: PathBuf,
}

/// The runner's TLS identity, or `None` when it serves plain HTTP (`insecure_http` and no
/// certificate configured). Creates the self-signed certificate on first use.
pub fn identity(config: &RunnerConfig) -> anyhow::Result<Option<RunnerTls>> {
    let (cert_file, key_file) = match (&config.tls_cert_file, &config.tls_key_file) {
        (Some(cert), Some(key)) => (cert.clone(), key.clone()),
        _ if !config.serves_tls() => return Ok(None),
        _ => self_signed(config)?,
    };
    let (tls, fingerprint) = server_config_from_files(&cert_file, &key_file)?;
    Ok(Some(RunnerTls {
        config: tls,
        fingerprint,
        cert_file,
    }))
}

/// The self-signed certificate and key in `state_dir/tls/`, created if either is missing.
fn self_signed(config: &RunnerConfig) -> anyhow::Result<(PathBuf, PathBuf)> {
    let dir = config.state_dir.join("tls");
    let cert_file = dir.join("runner.crt");
    let key_file = dir.join("runner.key");
    if cert_file.exists() && key_file.exists() {
        let mode = std::fs::metadata(&key_file)?.permissions().mode();
        if mode & 0o077 != 0 {
            tracing::warn!(key = %key_file.display(), mode = format!("{:o}", mode & 0o777), "the runner's TLS key is readable by others than its owner; chmod 600 it");
        }
        return Ok((cert_file, key_file));
    }
    crate::util::files::create_private_dir(&dir).with_context(|| {
        format!(
            "failed to create {} (state_dir must be writable by the runner)",
            dir.display()
        )
    })?;
    // The certificate names the runner and loopback; the server pins it by fingerprint and
    // does not check names, so these are for people who look at it.
    let mut names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
    if config
        .name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-')
    {
        names.push(config.name.clone());
    }
    let mut params = rcgen::CertificateParams::new(names)
        .context("failed to describe the runner's certificate")?;
    params.distinguished_name.push(
        rcgen::DnType::CommonName,
        format!("emisar runner {}", config.name),
    );
    let key = rcgen::KeyPair::generate().context("failed to generate the runner's TLS key")?;
    let cert = params
        .self_signed(&key)
        .context("failed to sign the runner's certificate")?;
    // Each written whole with its mode from the first byte on, so a crash never leaves half
    // a key.
    crate::util::files::replace(&key_file, key.serialize_pem().as_bytes(), 0o600)?;
    crate::util::files::replace(&cert_file, cert.pem().as_bytes(), 0o644)?;
    tracing::info!(cert = %cert_file.display(), fingerprint = %Fingerprint::of(cert.der()), "created the runner's self-signed TLS certificate");
    Ok((cert_file, key_file))
}

/// `emisar runner fingerprint`: the fingerprint of the certificate this runner serves (made
/// now if it has none yet), for operators who list the runner in emisar.toml.
pub fn fingerprint(config: &RunnerConfig) -> anyhow::Result<Fingerprint> {
    match identity(config)? {
        Some(tls) => Ok(tls.fingerprint),
        None => anyhow::bail!(
            "this runner serves plain HTTP (insecure_http = true and no tls_cert_file), so it has no certificate to pin"
        ),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn the_self_signed_certificate_is_made_once_and_its_key_is_private() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = RunnerConfig::with_name("edge-1");
        config.server_public_key_file = Some("unused.pub".into());
        config.state_dir = dir.path().join("state");
        let first = identity(&config).unwrap().unwrap();
        let again = identity(&config).unwrap().unwrap();
        assert_eq!(first.fingerprint, again.fingerprint, "kept, not remade");
        assert_eq!(fingerprint(&config).unwrap(), first.fingerprint);
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&config.state_dir.join("tls/runner.key")), 0o600);
        assert_eq!(mode(&config.state_dir.join("tls")), 0o700);

        config.insecure_http = true;
        assert!(identity(&config).unwrap().is_none());
        let err = fingerprint(&config).unwrap_err().to_string();
        assert!(err.contains("insecure_http"), "{err}");
    }
}
