//! How the server knows it is talking to the runner it means: one HTTP client per runner,
//! built from how that runner is trusted.
//!
//! - `tls_fingerprint` (configured, or sent when the runner joined): the runner's end-entity
//!   certificate is pinned; its names and dates are not checked (it is usually self-signed),
//!   its handshake signature is.
//! - otherwise `runner_ca_file`: the chain must lead to that CA and name the URL's host.
//! - otherwise the system's trust store, with the host checked.
//! - `http://` only with `insecure_http` (the config check refuses it before this).
//!
//! Invariant: a runner whose certificate does not match its pin is never sent a call (the
//! handshake fails before any request byte), and the error names the runner and both
//! fingerprints. Each runner has its own client, so its kept-alive connections are its own.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, OtherError, SignatureScheme};

use super::networks::{AllowedResolver, JoinNetworks, literal_ip};
use crate::server::config::{RunnerEntry, check_runner_url};
use crate::util::tls::{Fingerprint, provider, read_certificates};

/// How long connecting to a runner (TCP and TLS) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// The server-wide part of how runners are trusted.
#[derive(Clone)]
pub(crate) struct RunnerTrust {
    ca: Option<Arc<rustls::RootCertStore>>,
    insecure_http: bool,
    /// Where joined runners may be reached (`[join] allowed_networks`).
    joined: Arc<JoinNetworks>,
}

impl RunnerTrust {
    pub(crate) fn new(runner_ca_file: Option<&Path>, insecure_http: bool) -> anyhow::Result<Self> {
        let ca = match runner_ca_file {
            None => None,
            Some(path) => {
                let mut roots = rustls::RootCertStore::empty();
                for cert in read_certificates(path).context("runner_ca_file")? {
                    roots.add(cert).with_context(|| {
                        format!(
                            "runner_ca_file {}: not a usable CA certificate",
                            path.display()
                        )
                    })?;
                }
                Some(Arc::new(roots))
            }
        };
        Ok(RunnerTrust {
            ca,
            insecure_http,
            joined: Arc::new(JoinNetworks::default_with(Vec::new())),
        })
    }

    /// Joined runners may be reached only where `networks` allows.
    pub(crate) fn with_join_networks(mut self, networks: JoinNetworks) -> Self {
        self.joined = Arc::new(networks);
        self
    }

    /// Whether `http://` runner URLs are allowed.
    pub(crate) fn insecure_http(&self) -> bool {
        self.insecure_http
    }

    /// Where joined runners may be reached.
    pub(crate) fn join_networks(&self) -> &JoinNetworks {
        &self.joined
    }

    /// The client of a joined runner: like [`RunnerTrust::client`], and it connects only to
    /// addresses in the join networks. An address in the URL is checked here; a name is
    /// checked on every connection, by the resolver.
    pub(crate) fn joined_client(&self, entry: &RunnerEntry) -> anyhow::Result<reqwest::Client> {
        let url = reqwest::Url::parse(&entry.url)
            .with_context(|| format!("runner `{}` url is not a URL", entry.name))?;
        let port = url
            .port_or_known_default()
            .with_context(|| format!("runner `{}` url has no port", entry.name))?;
        if let Some(ip) = literal_ip(&url)
            && let Some(why) = self.joined.refuses(std::net::SocketAddr::new(ip, port))
        {
            anyhow::bail!("runner `{}` is not reached: {why}", entry.name);
        }
        let resolver = Arc::new(AllowedResolver::new(self.joined.clone(), port));
        self.build(entry, Some(resolver))
    }

    /// The client that calls (and probes) the runner `entry` describes.
    pub(crate) fn client(&self, entry: &RunnerEntry) -> anyhow::Result<reqwest::Client> {
        self.build(entry, None)
    }

    fn build(
        &self,
        entry: &RunnerEntry,
        resolver: Option<Arc<AllowedResolver>>,
    ) -> anyhow::Result<reqwest::Client> {
        let what = format!("runner `{}` url", entry.name);
        check_runner_url(&what, &entry.url, self.insecure_http)?;
        let builder = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy();
        let builder = match resolver {
            Some(resolver) => builder.dns_resolver(resolver),
            None => builder,
        };
        let tls = match (&entry.tls_fingerprint, &self.ca) {
            // A plain-HTTP runner's client never makes a TLS handshake, but without a TLS
            // config reqwest would load the system's trust store for it: ~40 ms of a debug
            // build per client, 8 s for a server starting with 200 runners. One config without
            // roots, built once, costs nothing and could trust nothing.
            _ if entry.url.starts_with("http://") => Some(no_tls().clone()),
            (Some(pin), _) => {
                let pin = Fingerprint::parse(pin)
                    .map_err(|e| anyhow::anyhow!("runner `{}` tls_fingerprint {e}", entry.name))?;
                Some(pinned_config(&entry.name, pin)?)
            }
            (None, Some(roots)) => Some(for_one_runner(
                rustls::ClientConfig::builder_with_provider(provider())
                    .with_safe_default_protocol_versions()?
                    .with_root_certificates(roots.clone())
                    .with_no_client_auth(),
            )),
            // The system's trust store: reqwest's default verifier.
            (None, None) => None,
        };
        let builder = match tls {
            Some(tls) => builder.tls_backend_preconfigured(tls),
            None => builder,
        };
        builder
            .https_only(entry.url.starts_with("https://"))
            .build()
            .with_context(|| format!("failed to build the HTTP client of runner `{}`", entry.name))
    }
}

/// The TLS config of a plain-HTTP runner's client: no roots, so it could complete no
/// handshake (`https_only` is off for such a client, and redirects are never followed).
fn no_tls() -> &'static rustls::ClientConfig {
    static CONFIG: std::sync::OnceLock<rustls::ClientConfig> = std::sync::OnceLock::new();
    CONFIG.get_or_init(|| {
        rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("the provider supports the default protocol versions")
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth()
    })
}

fn pinned_config(runner: &str, pin: Fingerprint) -> anyhow::Result<rustls::ClientConfig> {
    let provider = provider();
    let verifier = Arc::new(PinnedVerifier {
        runner: runner.to_owned(),
        pin,
        provider: provider.clone(),
    });
    Ok(for_one_runner(
        rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_no_client_auth(),
    ))
}

/// `config` keeping TLS sessions (to resume instead of a full handshake) for one server
/// name: each runner's client talks to that runner alone. rustls' default cache holds 256
/// names and allocates for all of them up front: 11 MiB for a fleet of 1,000 pinned runners,
/// against 2 MiB with this (measured with 1,000 configs).
fn for_one_runner(mut config: rustls::ClientConfig) -> rustls::ClientConfig {
    config.resumption = rustls::client::Resumption::in_memory_sessions(1);
    config
}

/// Accepts exactly the pinned end-entity certificate. Names and validity dates are not
/// checked: the pin is the identity (like an SSH host key), which is what lets a runner serve
/// the self-signed certificate it made itself. The handshake signature is still verified, so
/// only the holder of that certificate's key gets through.
#[derive(Debug)]
struct PinnedVerifier {
    runner: String,
    pin: Fingerprint,
    provider: Arc<CryptoProvider>,
}

/// A runner presented a certificate other than its pinned one.
#[derive(Debug, thiserror::Error)]
#[error(
    "runner `{runner}` presented TLS certificate {presented}, but {pinned} is pinned for it (tls_fingerprint): the call was not sent"
)]
pub(crate) struct PinMismatch {
    pub runner: String,
    pub presented: Fingerprint,
    pub pinned: Fingerprint,
}

impl ServerCertVerifier for PinnedVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let presented = Fingerprint::of(end_entity);
        if presented == self.pin {
            return Ok(ServerCertVerified::assertion());
        }
        Err(rustls::Error::InvalidCertificate(CertificateError::Other(
            OtherError(Arc::new(PinMismatch {
                runner: self.runner.clone(),
                presented,
                pinned: self.pin,
            })),
        )))
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// The pin mismatch behind a failed request, if that is why it failed. rustls's error sits
/// inside `io::Error`s (nested: the TLS stream's inside the connector's), whose `source()`
/// skips the error they wrap, so each one is opened by hand.
pub(crate) fn pin_mismatch<'a>(
    error: &'a (dyn std::error::Error + 'static),
) -> Option<&'a PinMismatch> {
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(rustls::Error::InvalidCertificate(CertificateError::Other(OtherError(inner)))) =
            e.downcast_ref::<rustls::Error>()
            && let Some(mismatch) = inner.downcast_ref::<PinMismatch>()
        {
            return Some(mismatch);
        }
        next = match e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(wrapped) => Some(wrapped as &(dyn std::error::Error + 'static)),
            None => e.source(),
        };
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verifier(pin: Fingerprint) -> PinnedVerifier {
        PinnedVerifier {
            runner: "edge-1".into(),
            pin,
            provider: provider(),
        }
    }

    fn verify(v: &PinnedVerifier, cert: &CertificateDer<'_>) -> Result<(), rustls::Error> {
        v.verify_server_cert(
            cert,
            &[],
            &ServerName::try_from("10.0.0.5").unwrap(),
            &[],
            UnixTime::now(),
        )
        .map(|_| ())
    }

    #[test]
    fn the_pinned_certificate_is_accepted_whatever_its_names() {
        let runner = rcgen::generate_simple_self_signed(vec!["elsewhere.test".into()]).unwrap();
        let v = verifier(Fingerprint::of(runner.cert.der()));
        verify(&v, runner.cert.der()).unwrap();
    }

    #[test]
    fn another_certificate_is_refused_naming_the_runner_and_both_fingerprints() {
        let pinned = rcgen::generate_simple_self_signed(vec!["a.test".into()]).unwrap();
        let impostor = rcgen::generate_simple_self_signed(vec!["a.test".into()]).unwrap();
        let v = verifier(Fingerprint::of(pinned.cert.der()));
        let err = verify(&v, impostor.cert.der()).unwrap_err();
        let mismatch = pin_mismatch(&err).expect("the error is a pin mismatch");
        let text = mismatch.to_string();
        assert!(text.contains("runner `edge-1`"), "{text}");
        assert!(
            text.contains(&Fingerprint::of(impostor.cert.der()).to_string()),
            "{text}"
        );
        assert!(
            text.contains(&Fingerprint::of(pinned.cert.der()).to_string()),
            "{text}"
        );
    }

    /// The whole way: a real handshake against an HTTPS server, through the client the
    /// registry would use, with the right pin and with a wrong one.
    #[tokio::test]
    async fn a_pinned_client_reaches_its_runner_and_refuses_an_impostor() {
        let served = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let key =
            rustls::pki_types::PrivateKeyDer::try_from(served.signing_key.serialize_der()).unwrap();
        let tls = crate::util::tls::server_config(vec![served.cert.der().clone()], key).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("https://{}", listener.local_addr().unwrap());
        let stop = tokio_util::sync::CancellationToken::new();
        let router = axum::Router::new().route("/healthz", axum::routing::get(|| async { "ok" }));
        tokio::spawn(crate::util::tls::serve_https(
            listener,
            router,
            tls,
            stop.clone(),
        ));
        let trust = RunnerTrust::new(None, false).unwrap();
        let entry = |pin: String| RunnerEntry {
            name: "edge-1".into(),
            url: url.clone(),
            tls_fingerprint: Some(pin),
            ..Default::default()
        };
        let right = trust
            .client(&entry(Fingerprint::of(served.cert.der()).to_string()))
            .unwrap();
        let body = right
            .get(format!("{url}/healthz"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert_eq!(body, "ok");

        let other = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let wrong = trust
            .client(&entry(Fingerprint::of(other.cert.der()).to_string()))
            .unwrap();
        let err = wrong
            .get(format!("{url}/healthz"))
            .send()
            .await
            .unwrap_err();
        let mismatch = pin_mismatch(&err).unwrap_or_else(|| {
            panic!(
                "not reported as a pin mismatch: {}",
                crate::util::error_chain(&err)
            )
        });
        assert_eq!(mismatch.presented, Fingerprint::of(served.cert.der()));
        stop.cancel();
    }

    #[test]
    fn plain_http_needs_insecure_http() {
        let entry = RunnerEntry {
            name: "edge-1".into(),
            url: "http://10.0.0.5:7701".into(),
            ..Default::default()
        };
        let err = RunnerTrust::new(None, false)
            .unwrap()
            .client(&entry)
            .unwrap_err()
            .to_string();
        assert!(err.contains("insecure_http"), "{err}");
        RunnerTrust::new(None, true)
            .unwrap()
            .client(&entry)
            .unwrap();
    }
}
