//! Sockets: every TCP connection emisar accepts has Nagle's algorithm off.
//!
//! An MCP answer is an SSE stream written in several small pieces (priming event, data, end of
//! the chunked body). With Nagle's algorithm on, a client that keeps its connection alive, as
//! every MCP SDK does, waits for its own delayed ACK before the last piece arrives: ~40 ms per
//! call instead of ~1 ms. Outgoing connections are reqwest's, which sets `TCP_NODELAY` by
//! default.

use axum::serve::{ListenerExt, TapIo};
use tokio::net::{TcpListener, TcpStream};

/// `listener`, with `TCP_NODELAY` set on every connection it accepts. The type is named (not
/// `impl Listener`) so that axum's `ConnectInfo<SocketAddr>` still applies to it.
pub fn without_nagle(listener: TcpListener) -> TapIo<TcpListener, fn(&mut TcpStream)> {
    listener.tap_io(nodelay)
}

fn nodelay(tcp: &mut TcpStream) {
    if let Err(error) = tcp.set_nodelay(true) {
        tracing::warn!(%error, "could not turn Nagle's algorithm off on an accepted connection");
    }
}
