//! Sockets: every TCP connection emisar accepts has Nagle's algorithm off.
//!
//! An MCP answer is an SSE stream written in several small pieces (priming event, data, end of
//! the chunked body). With Nagle's algorithm on, a client that keeps its connection alive, as
//! every MCP SDK does, waits for its own delayed ACK before the last piece arrives: ~40 ms per
//! call instead of ~1 ms. Outgoing connections are reqwest's, which sets `TCP_NODELAY` by
//! default.

use std::net::SocketAddr;

use axum::serve::{Listener, ListenerExt};
use tokio::net::{TcpListener, TcpStream};

/// `listener`, with `TCP_NODELAY` set on every connection it accepts.
pub fn without_nagle(listener: TcpListener) -> impl Listener<Io = TcpStream, Addr = SocketAddr> {
    listener.tap_io(|tcp| {
        if let Err(error) = tcp.set_nodelay(true) {
            tracing::warn!(%error, "could not turn Nagle's algorithm off on an accepted connection");
        }
    })
}
