//! `emisar witness`: load witness.toml, the key and the state, bind, serve `POST
//! /add-checkpoint` and `GET /checkpoint/<origin>` over HTTPS (or plain HTTP when the config
//! says so) until stopped; and `emisar witness keygen`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use axum::Router;
use axum::extract::rejection::PathRejection;
use axum::extract::{DefaultBodyLimit, Path as UrlPath, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::add::{Answer, Latest, Log, Witness};
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
            "witness listening at {scheme}://…/add-checkpoint (and GET …/checkpoint/<origin>)"
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

/// The longest origin `GET /checkpoint/<origin>` looks up (a note key name is at most 256
/// bytes; an origin is one line of a checkpoint that fits the body limit).
pub const MAX_ORIGIN_BYTES: usize = 1024;

/// The witness's routes: `POST /add-checkpoint` (tlog-witness) and `GET
/// /checkpoint/<origin>` (the latest checkpoint it cosigned for that log), nothing else.
pub fn router(witness: Arc<Witness>) -> Router {
    Router::new()
        .route("/add-checkpoint", post(add_checkpoint))
        .route("/checkpoint/{*origin}", get(latest_checkpoint))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(witness)
}

fn text(status: StatusCode, body: String) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body,
    )
        .into_response()
}

/// `GET /checkpoint/<origin>`, the origin percent-encoded as one path segment (`/` as `%2F`;
/// an unencoded `/` is read the same): the latest checkpoint this witness cosigned for that
/// log, as a signed note with the log's signature and this witness's cosignature line; 404
/// for an origin it does not witness or has cosigned nothing of yet. Changes nothing.
async fn latest_checkpoint(
    State(witness): State<Arc<Witness>>,
    origin: Result<UrlPath<String>, PathRejection>,
) -> Response {
    let origin = match origin {
        Ok(UrlPath(origin)) => origin,
        Err(e) => {
            return text(
                StatusCode::BAD_REQUEST,
                format!(
                    "origin: the path is /checkpoint/<origin>, the origin percent-encoded UTF-8 ({e})\n"
                ),
            );
        }
    };
    if origin.len() > MAX_ORIGIN_BYTES {
        return text(
            StatusCode::BAD_REQUEST,
            format!("origin: at most {MAX_ORIGIN_BYTES} bytes\n"),
        );
    }
    match witness.latest(&origin).await {
        Latest::Cosigned(note) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            note,
        )
            .into_response(),
        Latest::UnknownLog => text(
            StatusCode::NOT_FOUND,
            format!("unknown log origin {origin:?}: this witness does not witness it\n"),
        ),
        Latest::NoneYet => text(
            StatusCode::NOT_FOUND,
            format!("this witness has cosigned no checkpoint of {origin:?} yet\n"),
        ),
        Latest::Internal => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the witness could not read back the checkpoint it cosigned\n".into(),
        ),
    }
}

async fn add_checkpoint(State(witness): State<Arc<Witness>>, body: axum::body::Bytes) -> Response {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tlog::checkpoint;
    use crate::tlog::keys::NoteKey;
    use crate::tlog::tree::MemoryTree;

    const ORIGIN: &str = "log.example/audit";

    /// A witness of `ORIGIN` over `state_dir`, served on loopback: its URL, its key.
    async fn serve(log: &NoteKey, state_dir: &Path) -> (String, NoteKey, CancellationToken) {
        let key = NoteKey::from_seed("witness.example/w1", [7; 32]).unwrap();
        let logs = BTreeMap::from([(
            ORIGIN.to_owned(),
            Log {
                keys: Verifiers::parse([log.verifier_key().as_str()]).unwrap(),
            },
        )]);
        let witness =
            Witness::new(key.cosigner(), logs, StateFile::open(state_dir).unwrap()).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let stop = CancellationToken::new();
        let shutdown = stop.clone();
        tokio::spawn(async move {
            axum::serve(listener, router(Arc::new(witness)))
                .with_graceful_shutdown(shutdown.cancelled_owned())
                .await
        });
        (url, key, stop)
    }

    async fn get(url: &str) -> (u16, String) {
        let r = reqwest::get(url).await.unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    }

    #[tokio::test]
    async fn the_latest_cosigned_checkpoint_is_served_by_origin_and_nothing_changes() {
        let tmp = tempfile::tempdir().unwrap();
        let log = NoteKey::from_seed(ORIGIN, [1; 32]).unwrap();
        let state_dir = tmp.path().join("state");
        let (url, key, stop) = serve(&log, &state_dir).await;
        let latest = format!("{url}/checkpoint/log.example%2Faudit");

        let (status, body) = get(&format!("{url}/checkpoint/other.example%2Flog")).await;
        assert_eq!(
            (status, body.as_str()),
            (
                404,
                "unknown log origin \"other.example/log\": this witness does not witness it\n"
            )
        );
        let (status, body) = get(&latest).await;
        assert_eq!(
            (status, body.as_str()),
            (
                404,
                "this witness has cosigned no checkpoint of \"log.example/audit\" yet\n"
            )
        );

        // A checkpoint of 3 leaves, submitted with a line that claims the witness's own key.
        let mut tree = MemoryTree::default();
        for leaf in [&b"a"[..], b"b", b"c"] {
            tree.push(leaf);
        }
        let signed = checkpoint::sign(ORIGIN, 3, tree.root(), "", &log).unwrap();
        let forged = signed_note::Signature::new(
            key.name().to_owned(),
            crate::tlog::cosignature::key_id(key.name(), &key.public()),
            vec![0; 72],
        )
        .unwrap();
        let submitted = [signed.as_slice(), forged.to_bytes().as_slice()].concat();
        let http = reqwest::Client::new();
        let added = http
            .post(format!("{url}/add-checkpoint"))
            .body([b"old 0\n\n".as_slice(), submitted.as_slice()].concat())
            .send()
            .await
            .unwrap();
        assert_eq!(added.status().as_u16(), 200);
        let lines = added.text().await.unwrap();

        let state = std::fs::read(state_dir.join("witness-state.json")).unwrap();
        let (status, body) = get(&latest).await;
        assert_eq!(status, 200, "{body}");
        // The checkpoint as the log signed it, then the very cosignature add-checkpoint
        // returned; the forged line is left out.
        assert_eq!(
            body,
            format!("{}{lines}", String::from_utf8(signed).unwrap())
        );
        let (note, cp) = checkpoint::parse(body.as_bytes()).unwrap();
        assert_eq!(
            (cp.origin(), cp.size(), *cp.hash()),
            (ORIGIN, 3, tree.root())
        );
        checkpoint::verify(
            &note,
            &Verifiers::parse([log.verifier_key().as_str()]).unwrap(),
        )
        .unwrap();
        let trusted = vec![(
            key.name().to_owned(),
            Verifiers::parse([key.cosigner_key().as_str()]).unwrap(),
        )];
        assert_eq!(checkpoint::cosigned_by(&note, &trusted), [key.name()]);
        // The origin unencoded reads the same; the state file did not change.
        assert_eq!(
            get(&format!("{url}/checkpoint/{ORIGIN}")).await,
            (200, body)
        );
        assert_eq!(
            std::fs::read(state_dir.join("witness-state.json")).unwrap(),
            state
        );
        let (status, body) = get(&format!(
            "{url}/checkpoint/{}",
            "x".repeat(MAX_ORIGIN_BYTES + 1)
        ))
        .await;
        assert_eq!(
            (status, body.as_str()),
            (400, "origin: at most 1024 bytes\n")
        );
        stop.cancel();
    }

    /// A state written before the cosignature was kept: the checkpoint is cosigned when asked.
    #[tokio::test]
    async fn a_state_without_the_cosignature_is_cosigned_when_asked() {
        let tmp = tempfile::tempdir().unwrap();
        let log = NoteKey::from_seed(ORIGIN, [1; 32]).unwrap();
        let state_dir = tmp.path().join("state");
        let mut tree = MemoryTree::default();
        tree.push(b"a");
        let signed = checkpoint::sign(ORIGIN, 1, tree.root(), "", &log).unwrap();
        let mut state = super::super::state::State::default();
        state.logs.insert(
            ORIGIN.into(),
            super::super::state::Cosigned {
                size: 1,
                root: tree.root(),
                checkpoint: String::from_utf8(signed).unwrap(),
                cosignature: None,
            },
        );
        StateFile::open(&state_dir).unwrap().save(&state).unwrap();
        let (url, key, stop) = serve(&log, &state_dir).await;
        let (status, body) = get(&format!("{url}/checkpoint/log.example%2Faudit")).await;
        assert_eq!(status, 200, "{body}");
        let (note, cp) = checkpoint::parse(body.as_bytes()).unwrap();
        assert_eq!(cp.size(), 1);
        let trusted = vec![(
            key.name().to_owned(),
            Verifiers::parse([key.cosigner_key().as_str()]).unwrap(),
        )];
        assert_eq!(checkpoint::cosigned_by(&note, &trusted), [key.name()]);
        stop.cancel();
    }
}
