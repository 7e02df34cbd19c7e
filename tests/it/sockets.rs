//! Every TCP connection emisar accepts or opens, over plain HTTP and over TLS, has
//! `TCP_NODELAY` set: the server's and the runner's accepted sockets and the server's
//! connections to its runners. An MCP answer is an SSE stream written in several small
//! pieces; with Nagle's algorithm on, a client that keeps its connection alive (as every MCP
//! SDK does) waits for its own delayed ACK, ~40 ms per call. How long a call takes is
//! measured in scripts/bench; this test checks the cause.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{BorrowedFd, RawFd};

use nix::sys::socket::{SockaddrStorage, getpeername, getsockname, getsockopt, sockopt};
use serde_json::json;

use crate::harness::app::Options;
use crate::harness::certs::{TestCa, self_signed};
use crate::harness::{Backend, RunnerSpec, spawn_app};
use crate::mcp_calls::{call, traefik_with_dead_backends};

/// One connected TCP socket of this process.
#[derive(Debug)]
struct Connection {
    local: SocketAddr,
    peer: SocketAddr,
    nodelay: bool,
}

fn socket_addr(addr: &SockaddrStorage) -> Option<SocketAddr> {
    if let Some(v4) = addr.as_sockaddr_in() {
        return Some(SocketAddr::from((v4.ip(), v4.port())));
    }
    addr.as_sockaddr_in6()
        .map(|v6| SocketAddr::from((v6.ip(), v6.port())))
}

/// The connected TCP sockets of this process (listeners, UDP and Unix sockets left out).
// Reading a socket option needs the descriptor borrowed, which the standard library allows
// only through `unsafe`; the product itself has none (tidy.rs).
#[allow(unsafe_code)]
fn connections() -> Vec<Connection> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let Ok(fd) = entry.file_name().to_string_lossy().parse::<RawFd>() else {
            continue;
        };
        let is_socket = std::fs::read_link(entry.path())
            .is_ok_and(|target| target.to_string_lossy().starts_with("socket:"));
        if !is_socket {
            continue;
        }
        // SAFETY: the descriptor is only read (names and an option); if another thread
        // closed it since the listing, the calls fail and it is left out.
        let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
        let (Ok(local), Ok(peer)) = (
            getsockname::<SockaddrStorage>(fd),
            getpeername::<SockaddrStorage>(fd),
        ) else {
            continue;
        };
        let (Some(local), Some(peer)) = (socket_addr(&local), socket_addr(&peer)) else {
            continue;
        };
        let Ok(nodelay) = getsockopt(&borrowed, sockopt::TcpNoDelay) else {
            continue;
        };
        found.push(Connection {
            local,
            peer,
            nodelay,
        });
    }
    found
}

fn port_of(url: &str) -> u16 {
    reqwest::Url::parse(url).unwrap().port().unwrap()
}

async fn every_connection_emisar_accepts_or_opens_has_nodelay(backend: Backend) {
    let (traefik, _dead) = traefik_with_dead_backends().await;
    let app = spawn_app(
        backend,
        vec![RunnerSpec::new("node-1").service("traefik", &traefik.api_url)],
        Default::default(),
    )
    .await;
    let client = app.mcp_client().await;
    for _ in 0..2 {
        let res = call(
            &client,
            "traefik.ping",
            json!({"runners": ["node-1"], "reason": "are the sockets tuned?"}),
        )
        .await;
        assert_eq!(res.is_error, Some(false), "{res:?}");
    }
    // A kept-alive connection of our own, open while the sockets are looked at.
    let server_port = port_of(&app.mcp_url);
    let mut raw = TcpStream::connect(("127.0.0.1", server_port)).unwrap();
    raw.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .unwrap();
    let mut first = [0u8; 12];
    raw.read_exact(&mut first).unwrap();
    assert_eq!(&first, b"HTTP/1.1 200");

    assert_every_connection_has_nodelay(server_port, port_of(&app.runner_urls["node-1"]));
    drop(raw);
    client.cancel().await.unwrap();
}
crate::both_backends!(every_connection_emisar_accepts_or_opens_has_nodelay);

/// The connections the server accepted on `server_port`, the runner accepted on
/// `runner_port`, and the server opened to the runner: at least one of each, and none with
/// Nagle's algorithm on.
fn assert_every_connection_has_nodelay(server_port: u16, runner_port: u16) {
    let all = connections();
    let accepted_by_server: Vec<_> = all
        .iter()
        .filter(|c| c.local.port() == server_port)
        .collect();
    let accepted_by_runner: Vec<_> = all
        .iter()
        .filter(|c| c.local.port() == runner_port)
        .collect();
    let opened_to_runner: Vec<_> = all
        .iter()
        .filter(|c| c.peer.port() == runner_port)
        .collect();
    for (what, group) in [
        ("accepted by the server", &accepted_by_server),
        ("accepted by the runner", &accepted_by_runner),
        ("opened by the server to its runner", &opened_to_runner),
    ] {
        assert!(!group.is_empty(), "no connection {what} is open: {all:?}");
        for c in group.iter() {
            assert!(
                c.nodelay,
                "a connection {what} has Nagle's algorithm on: {c:?}"
            );
        }
    }
}

/// The same over TLS: the server's and the runner's HTTPS listeners accept through their own
/// acceptor (not the plain listener's), so they are checked on their own.
async fn every_tls_connection_emisar_accepts_or_opens_has_nodelay(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let server_ca = TestCa::new(d, "server");
    let server_cert = server_ca.issue(d, "server", &["localhost", "127.0.0.1"]);
    let runner_cert = self_signed(d, "node-1");
    let (traefik, _dead) = traefik_with_dead_backends().await;
    let app = spawn_app(
        backend,
        vec![
            RunnerSpec::new("node-1")
                .service("traefik", &traefik.api_url)
                .https(
                    runner_cert.clone(),
                    Some(runner_cert.fingerprint.to_string()),
                ),
        ],
        Options {
            server_tls: Some(server_cert),
            client_ca_file: Some(server_ca.file.clone()),
            insecure_http: Some(false),
            ..Default::default()
        },
    )
    .await;
    assert!(app.mcp_url.starts_with("https://"), "{}", app.mcp_url);
    assert!(app.runner_urls["node-1"].starts_with("https://"));
    let client = app.mcp_client().await;
    for _ in 0..2 {
        let res = call(
            &client,
            "traefik.ping",
            json!({"runners": ["node-1"], "reason": "are the TLS sockets tuned?"}),
        )
        .await;
        assert_eq!(res.is_error, Some(false), "{res:?}");
    }
    // A kept-alive TLS connection of our own, open while the sockets are looked at.
    let http = app.http();
    let answer = http
        .get(format!("{}/healthz", app.base_url()))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    assert_every_connection_has_nodelay(port_of(&app.mcp_url), port_of(&app.runner_urls["node-1"]));
    drop(http);
    client.cancel().await.unwrap();
}
crate::both_backends!(every_tls_connection_emisar_accepts_or_opens_has_nodelay);

/// Whether the server closed `stream` (end of stream or a reset) within two seconds, without
/// the test sending a byte.
async fn closed_at_once(stream: &mut tokio::net::TcpStream) -> bool {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 64];
    matches!(
        tokio::time::timeout(std::time::Duration::from_secs(2), stream.read(&mut buf)).await,
        Ok(Ok(0) | Err(_))
    )
}

/// A connection over `max_connections_per_address` is closed as soon as it is accepted, on
/// plain HTTP and (before the handshake) on HTTPS; a connection that ends gives its place
/// back. The test's connections all come from 127.0.0.1.
async fn a_connection_over_the_per_address_cap_is_closed_at_once(backend: Backend, tls: bool) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let mut options = crate::harness::app::Options {
        max_connections_per_address: Some(3),
        ..Default::default()
    };
    if tls {
        let ca = crate::harness::certs::TestCa::new(dir.path(), "server");
        options.server_tls = Some(ca.issue(dir.path(), "server", &["localhost", "127.0.0.1"]));
        options.client_ca_file = Some(ca.file.clone());
    }
    let app = spawn_app(backend, vec![], options).await;
    let addr = app
        .base_url()
        .trim_start_matches("https://")
        .trim_start_matches("http://")
        .to_owned();
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(tokio::net::TcpStream::connect(&addr).await.unwrap());
    }
    for stream in &mut held {
        assert!(
            !closed_at_once(stream).await,
            "a connection within the cap was closed"
        );
    }
    let mut over = tokio::net::TcpStream::connect(&addr).await.unwrap();
    assert!(
        closed_at_once(&mut over).await,
        "a fourth connection from one address stayed open (cap 3, tls {tls})"
    );
    // One ends; its place comes back once the server has seen it go.
    drop(held.pop());
    let started = std::time::Instant::now();
    loop {
        let mut again = tokio::net::TcpStream::connect(&addr).await.unwrap();
        if !closed_at_once(&mut again).await {
            if !tls {
                again
                    .write_all(
                        b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
                    )
                    .await
                    .unwrap();
                let mut answer = String::new();
                again.read_to_string(&mut answer).await.unwrap();
                assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
            }
            break;
        }
        assert!(
            // A generous bound on a condition: the place comes back as soon as the server has
            // seen the close.
            started.elapsed() < std::time::Duration::from_secs(30),
            "the place of a closed connection never came back"
        );
    }
}

async fn a_connection_over_the_per_address_cap_is_closed_at_once_on_http(backend: Backend) {
    a_connection_over_the_per_address_cap_is_closed_at_once(backend, false).await;
}
crate::both_backends!(a_connection_over_the_per_address_cap_is_closed_at_once_on_http);

async fn a_connection_over_the_per_address_cap_is_closed_at_once_on_https(backend: Backend) {
    a_connection_over_the_per_address_cap_is_closed_at_once(backend, true).await;
}
crate::both_backends!(a_connection_over_the_per_address_cap_is_closed_at_once_on_https);
