//! TLS pieces both the server and the runner use: certificate fingerprints, loading a PEM
//! certificate chain and key into a rustls server configuration, and serving an axum router
//! over HTTPS.
//!
//! Invariants: every rustls configuration names its crypto provider (aws-lc-rs, the one
//! reqwest and sqlx already use), so nothing depends on a process-wide default provider; an
//! HTTPS listener handshakes each connection in its own task with a deadline, so a slow or
//! silent client never holds up other accepts, and with a cap ([`serve_https_capped`]) a
//! connection over its address's cap is closed before its handshake; every accepted socket
//! has `TCP_NODELAY` set (answers are written in several small pieces, and Nagle's algorithm
//! with delayed ACKs would add tens of milliseconds to each).

use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use crate::util::net::{ConnectionCap, Counted};

/// How long a client may take to complete its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The crypto provider every rustls configuration here is built with.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// The SHA-256 of a certificate's DER encoding, written `sha256:<64 lowercase hex>`: what
/// `emisar runner fingerprint` prints, what `tls_fingerprint` pins and what a joining runner
/// sends.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

const FINGERPRINT_PREFIX: &str = "sha256:";

impl Fingerprint {
    pub fn of(der: &[u8]) -> Self {
        Fingerprint(Sha256::digest(der).into())
    }

    /// Parses `sha256:<64 hex digits>` (either case); the error says what the text must be.
    pub fn parse(text: &str) -> Result<Self, String> {
        let rule =
            "must be `sha256:` followed by 64 hex digits (what `emisar runner fingerprint` prints)";
        let hex_part = text
            .strip_prefix(FINGERPRINT_PREFIX)
            .ok_or_else(|| format!("`{text}` {rule}"))?;
        let mut bytes = [0u8; 32];
        hex::decode_to_slice(hex_part, &mut bytes).map_err(|_| format!("`{text}` {rule}"))?;
        Ok(Fingerprint(bytes))
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{FINGERPRINT_PREFIX}{}", hex::encode(self.0))
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Every certificate in a PEM file, in order (a chain starts with the end-entity one).
pub fn read_certificates(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .with_context(|| format!("failed to read certificates from {}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("{} is not a readable PEM file", path.display()))?;
    if certs.is_empty() {
        anyhow::bail!("{} holds no PEM CERTIFICATE", path.display());
    }
    Ok(certs)
}

/// The private key in a PEM file (PKCS#8, PKCS#1 or SEC1).
pub fn read_private_key(path: &Path) -> anyhow::Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_file(path)
        .with_context(|| format!("failed to read a PEM private key from {}", path.display()))
}

/// A server configuration from a certificate chain (end-entity first) and its key, offering
/// HTTP/2 and HTTP/1.1. A key that does not match the certificate is refused here, at start.
pub fn server_config(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .context("the TLS provider supports no protocol version")?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .context("the TLS certificate and key do not make a usable pair")?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A server configuration from PEM files (`cert_file` may hold a chain).
pub fn server_config_from_files(
    cert_file: &Path,
    key_file: &Path,
) -> anyhow::Result<(Arc<rustls::ServerConfig>, Fingerprint)> {
    let chain = read_certificates(cert_file)?;
    let fingerprint = Fingerprint::of(&chain[0]);
    let key = read_private_key(key_file)?;
    let config = server_config(chain, key).with_context(|| {
        format!(
            "{} and {} do not make a usable TLS identity",
            cert_file.display(),
            key_file.display()
        )
    })?;
    Ok((config, fingerprint))
}

/// Serves `router` over HTTPS on `listener` until `shutdown`, then stops accepting and waits
/// for open connections to finish (as `axum::serve`'s graceful shutdown does).
///
/// axum-server does the accepting: it handshakes each connection in its own task, bounded by
/// [`HANDSHAKE_TIMEOUT`], so the accept loop never waits on a client.
pub async fn serve_https(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    tls: Arc<rustls::ServerConfig>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    serve_https_capped(listener, router, tls, None, shutdown).await
}

/// [`serve_https`], closing at once (before the handshake) a connection over `cap`.
pub async fn serve_https_capped(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    tls: Arc<rustls::ServerConfig>,
    cap: Option<ConnectionCap>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    use axum_server::accept::NoDelayAcceptor;
    use axum_server::tls_rustls::{RustlsAcceptor, RustlsConfig};

    let handle = axum_server::Handle::<std::net::SocketAddr>::new();
    let acceptor = RustlsAcceptor::new(RustlsConfig::from_config(tls))
        .handshake_timeout(HANDSHAKE_TIMEOUT)
        .acceptor(NoDelayAcceptor::new());
    let acceptor = CapAcceptor {
        inner: acceptor,
        cap,
    };
    let stopper = handle.clone();
    tokio::spawn(async move {
        shutdown.cancelled().await;
        stopper.graceful_shutdown(None);
    });
    axum_server::Server::from_listener(listener)
        .acceptor(acceptor)
        .handle(handle)
        .accept_error_handler(|peer, error| {
            // Failed handshakes are the client's business (a scanner, a client that does not
            // trust this certificate); the client sees the error, the log only notes it.
            tracing::debug!(peer = ?peer, %error, "TLS connection not accepted");
        })
        // The peer's address reaches handlers as `ConnectInfo`, as on plain HTTP.
        .serve(router.into_make_service_with_connect_info::<std::net::SocketAddr>())
        .await
}

/// Takes a place under the connection's address's cap before `inner` (the TLS handshake)
/// runs, and refuses the connection when there is none: it is dropped, which closes it.
#[derive(Clone)]
struct CapAcceptor<A> {
    inner: A,
    cap: Option<ConnectionCap>,
}

impl<A, S> axum_server::accept::Accept<tokio::net::TcpStream, S> for CapAcceptor<A>
where
    A: axum_server::accept::Accept<tokio::net::TcpStream, S> + Clone + Send + 'static,
    A::Future: Send,
    A::Stream: Send + 'static,
    A::Service: Send + 'static,
    S: Send + 'static,
{
    type Stream = Counted<A::Stream>;
    type Service = A::Service;
    type Future = std::pin::Pin<
        Box<dyn Future<Output = std::io::Result<(Self::Stream, Self::Service)>> + Send>,
    >;

    fn accept(&self, stream: tokio::net::TcpStream, service: S) -> Self::Future {
        let place = match (&self.cap, stream.peer_addr()) {
            (None, _) => None,
            (Some(cap), Ok(peer)) => match cap.admit(peer.ip()) {
                Some(place) => Some(place),
                None => {
                    return Box::pin(std::future::ready(Err(std::io::Error::other(
                        "its address holds the most connections it may",
                    ))));
                }
            },
            (Some(_), Err(e)) => return Box::pin(std::future::ready(Err(e))),
        };
        let accepting = self.inner.accept(stream, service);
        Box::pin(async move {
            let (stream, service) = accepting.await?;
            Ok((Counted::new(stream, place), service))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_round_trip_and_bad_ones_say_the_rule() {
        let f = Fingerprint::of(b"certificate bytes");
        let text = f.to_string();
        assert!(
            text.starts_with("sha256:") && text.len() == 7 + 64,
            "{text}"
        );
        assert_eq!(Fingerprint::parse(&text).unwrap(), f);
        assert_eq!(
            Fingerprint::parse(&text.to_uppercase().replace("SHA256:", "sha256:")).unwrap(),
            f
        );
        let not_hex = format!("{}g", &text[..text.len() - 1]);
        for bad in [
            "",
            "sha256:",
            "sha1:00",
            &text[7..],
            &format!("{text}00"),
            &not_hex,
        ] {
            let err = Fingerprint::parse(bad).unwrap_err();
            assert!(err.contains("64 hex digits"), "{bad}: {err}");
        }
    }

    /// A client that connects and says nothing holds its own task, not the accept loop: a
    /// second client gets its answer while the first is still silent.
    #[tokio::test]
    async fn a_silent_client_does_not_hold_up_others() {
        let made = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into()]).unwrap();
        let key = PrivateKeyDer::try_from(made.signing_key.serialize_der()).unwrap();
        let tls = server_config(vec![made.cert.der().clone()], key).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let router = axum::Router::new().route("/", axum::routing::get(|| async { "hello" }));
        let server = tokio::spawn(serve_https(listener, router, tls, stop.clone()));
        let _silent = tokio::net::TcpStream::connect(addr).await.unwrap();
        let client = reqwest::Client::builder()
            .tls_certs_only([reqwest::Certificate::from_der(made.cert.der()).unwrap()])
            .build()
            .unwrap();
        let answer = tokio::time::timeout(
            Duration::from_secs(30),
            client.get(format!("https://{addr}/")).send(),
        )
        .await
        .expect("answered while another client was silent")
        .unwrap();
        assert_eq!(answer.text().await.unwrap(), "hello");
        stop.cancel();
        // The silent connection is still open: shutdown does not wait for its handshake.
        tokio::time::timeout(Duration::from_secs(30), server)
            .await
            .expect("stops promptly")
            .unwrap()
            .unwrap();
    }

    #[test]
    fn a_key_that_does_not_match_its_certificate_is_refused() {
        let a = rcgen::generate_simple_self_signed(vec!["a.test".into()]).unwrap();
        let b = rcgen::generate_simple_self_signed(vec!["b.test".into()]).unwrap();
        let key = PrivateKeyDer::try_from(b.signing_key.serialize_der()).unwrap();
        let err = server_config(vec![a.cert.der().clone()], key).unwrap_err();
        assert!(format!("{err:#}").contains("usable pair"), "{err:#}");
    }
}
