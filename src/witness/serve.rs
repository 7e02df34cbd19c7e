//! `emisar witness`: load witness.toml, the key and the state, bind, serve `POST
//! /add-checkpoint` over HTTPS (or plain HTTP when the config says so) until stopped; and
//! `emisar witness keygen`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::add::{Answer, Log, Witness};
use super::config::WitnessConfig;
use super::state::StateFile;
use crate::tlog::keys::{NoteKey, Verifiers};
use crate::util::net::ConnectionCap;

/// The largest request body: a checkpoint with its signatures and 63 proof lines fit in a few
/// KiB; anything over this is refused with 413 before it is read further.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// Reads the witness key (refused when others may read it).
pub fn read_key(path: &Path) -> anyhow::Result<NoteKey> {
    let text = crate::util::files::read_private(path, "the witness's")?;
    NoteKey::parse(&text).with_context(|| format!("{} is not a witness key", path.display()))
}

/// `emisar witness keygen`: a new key named `name` in `path` (mode 0600, never overwriting);
/// returns the verifier key of its cosignatures, for the logs' and runners' configs.
pub fn keygen(name: &str, path: &Path) -> anyhow::Result<String> {
    let key = NoteKey::generate(name).map_err(|e| anyhow::anyhow!("--name: {e}"))?;
    crate::util::files::create_private(path, format!("{}\n", key.private_text()).as_bytes())?;
    Ok(key.cosigner_key())
}

/// A witness bound and ready to serve.
pub struct WitnessServer {
    listener: TcpListener,
    router: Router,
    tls: Option<Arc<rustls::ServerConfig>>,
    connections: ConnectionCap,
    verifier_key: String,
}

impl WitnessServer {
    /// Loads the key and the state, binds `config.listen`.
    pub async fn build(config: &WitnessConfig) -> anyhow::Result<Self> {
        config
            .check()
            .map_err(|problems| anyhow::anyhow!("{}", problems.join("; ")))?;
        let key = read_key(&config.key_file)?;
        let mut logs = BTreeMap::new();
        for log in &config.logs {
            let keys = Verifiers::parse(log.keys.iter().map(String::as_str))
                .map_err(|e| anyhow::anyhow!("log {}: {e}", log.origin))?;
            logs.insert(log.origin.clone(), Log { keys });
        }
        let file = StateFile::open(&config.state_dir)?;
        let witness = Witness::new(key.cosigner(), logs, file)?;
        let verifier_key = witness.verifier_key();
        let tls = match (&config.tls_cert_file, &config.tls_key_file) {
            (Some(cert), Some(key)) => {
                Some(crate::util::tls::server_config_from_files(cert, key)?.0)
            }
            _ => None,
        };
        let listener = TcpListener::bind(&config.listen)
            .await
            .with_context(|| format!("failed to listen on {}", config.listen))?;
        Ok(WitnessServer {
            listener,
            router: router(Arc::new(witness)),
            tls,
            connections: ConnectionCap::new(config.max_connections_per_address),
            verifier_key,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    /// The verifier key of this witness's cosignatures.
    pub fn verifier_key(&self) -> &str {
        &self.verifier_key
    }

    pub async fn run_until_stopped(self, shutdown: CancellationToken) -> std::io::Result<()> {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        tracing::info!(
            addr = %self.local_addr(),
            key = %self.verifier_key,
            "witness listening at {scheme}://…/add-checkpoint"
        );
        match self.tls {
            Some(tls) => {
                crate::util::tls::serve_https_capped(
                    self.listener,
                    self.router,
                    tls,
                    Some(self.connections),
                    shutdown,
                )
                .await
            }
            None => {
                axum::serve(
                    crate::util::net::capped(self.listener, self.connections),
                    self.router
                        .into_make_service_with_connect_info::<SocketAddr>(),
                )
                .with_graceful_shutdown(shutdown.cancelled_owned())
                .await
            }
        }
    }
}

/// The witness's routes: `POST /add-checkpoint` (tlog-witness), nothing else.
pub fn router(witness: Arc<Witness>) -> Router {
    Router::new()
        .route("/add-checkpoint", post(add_checkpoint))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(witness)
}

async fn add_checkpoint(State(witness): State<Arc<Witness>>, body: axum::body::Bytes) -> Response {
    let text = |status: StatusCode, body: String| {
        (
            status,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            body,
        )
            .into_response()
    };
    match witness.add_checkpoint(&body).await {
        Answer::Cosigned(lines) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            lines,
        )
            .into_response(),
        Answer::Conflict(size) => (
            StatusCode::CONFLICT,
            [(header::CONTENT_TYPE, "text/x.tlog.size")],
            format!("{size}\n"),
        )
            .into_response(),
        Answer::BadRequest(rule) => text(StatusCode::BAD_REQUEST, format!("{rule}\n")),
        Answer::Forbidden(why) => text(StatusCode::FORBIDDEN, format!("{why}\n")),
        Answer::UnknownLog => text(StatusCode::NOT_FOUND, "unknown log origin\n".into()),
        Answer::Inconsistent(why) => text(StatusCode::UNPROCESSABLE_ENTITY, format!("{why}\n")),
        Answer::Internal => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the witness could not record the checkpoint; nothing was cosigned\n".into(),
        ),
    }
}
