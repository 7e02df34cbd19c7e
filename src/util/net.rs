//! Sockets: every TCP connection emisar accepts has Nagle's algorithm off, and the server's
//! listeners hold at most so many connections open per client address.
//!
//! An MCP answer is an SSE stream written in several small pieces (priming event, data, end of
//! the chunked body). With Nagle's algorithm on, a client that keeps its connection alive, as
//! every MCP SDK does, waits for its own delayed ACK before the last piece arrives: ~40 ms per
//! call instead of ~1 ms. Outgoing connections are reqwest's, which sets `TCP_NODELAY` by
//! default.
//!
//! Invariant: a connection over its address's cap ([`ConnectionCap`]) is closed as soon as
//! it is accepted, before a byte is read from it; a counted connection gives its place back
//! when it is dropped, however it ends. IPv6 clients are counted per /64, the block one host
//! usually holds.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use axum::serve::{Listener, ListenerExt, TapIo};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

/// `listener`, with `TCP_NODELAY` set on every connection it accepts. The type is named (not
/// `impl Listener`) so that axum's `ConnectInfo<SocketAddr>` still applies to it.
pub fn without_nagle(listener: TcpListener) -> TapIo<TcpListener, fn(&mut TcpStream)> {
    listener.tap_io(nodelay)
}

/// [`without_nagle`], holding at most `cap`'s connections open per client address. The
/// server's plain-HTTP listener.
pub fn capped(
    listener: TcpListener,
    cap: ConnectionCap,
) -> TapIo<Capped, fn(&mut Counted<TcpStream>)> {
    Capped {
        inner: listener,
        cap,
    }
    .tap_io(nodelay_counted)
}

fn nodelay(tcp: &mut TcpStream) {
    if let Err(error) = tcp.set_nodelay(true) {
        tracing::warn!(%error, "could not turn Nagle's algorithm off on an accepted connection");
    }
}

fn nodelay_counted(tcp: &mut Counted<TcpStream>) {
    nodelay(&mut tcp.inner);
}

/// The address a client is counted under (connections here, logins and joins in their
/// limits): the IPv4 address, or the IPv6 /64.
pub fn counted_as(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1))),
        v4 => v4,
    }
}

/// How many connections each client address holds open on one server, and the most it may.
#[derive(Clone, Debug)]
pub struct ConnectionCap {
    per_address: usize,
    open: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

impl ConnectionCap {
    /// At most `per_address` open connections from one address (at least one).
    pub fn new(per_address: usize) -> Self {
        ConnectionCap {
            per_address: per_address.max(1),
            open: Arc::default(),
        }
    }

    /// A place for one more connection from `peer`, or `None` when its address holds the
    /// most it may already.
    pub fn admit(&self, peer: IpAddr) -> Option<Place> {
        let key = counted_as(peer);
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let n = open.entry(key).or_insert(0);
        if *n >= self.per_address {
            return None;
        }
        *n += 1;
        Some(Place {
            cap: self.clone(),
            key,
        })
    }

    /// How many connections `peer`'s address holds open now.
    pub fn open(&self, peer: IpAddr) -> usize {
        let open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        open.get(&counted_as(peer)).copied().unwrap_or(0)
    }
}

/// One open connection's place under its address's cap, given back when dropped.
#[derive(Debug)]
pub struct Place {
    cap: ConnectionCap,
    key: IpAddr,
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut open = self.cap.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = open.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.key);
            }
        }
    }
}

/// A connection that holds its [`Place`] for as long as it lives.
#[derive(Debug)]
pub struct Counted<T> {
    inner: T,
    /// None on a listener without a cap.
    _place: Option<Place>,
}

impl<T> Counted<T> {
    pub fn new(inner: T, place: Option<Place>) -> Self {
        Counted {
            inner,
            _place: place,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Counted<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Counted<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// A TCP listener that closes, as soon as it is accepted, a connection over its address's
/// cap.
pub struct Capped {
    inner: TcpListener,
    cap: ConnectionCap,
}

impl Listener for Capped {
    type Io = Counted<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let (stream, peer) = Listener::accept(&mut self.inner).await;
            match self.cap.admit(peer.ip()) {
                Some(place) => return (Counted::new(stream, Some(place)), peer),
                None => {
                    // Dropping the stream closes it; the client sees the connection end.
                    tracing::debug!(%peer, "connection closed: its address holds the most connections it may");
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_are_counted_per_address_and_given_back() {
        let cap = ConnectionCap::new(2);
        let a: IpAddr = "198.51.100.1".parse().unwrap();
        let b: IpAddr = "198.51.100.2".parse().unwrap();
        let first = cap.admit(a).unwrap();
        let _second = cap.admit(a).unwrap();
        assert!(cap.admit(a).is_none());
        assert!(cap.admit(b).is_some());
        drop(first);
        assert_eq!(cap.open(a), 1);
        assert!(cap.admit(a).is_some());
        // One IPv6 /64 is one address; an IPv4-mapped address is the IPv4 one.
        let cap = ConnectionCap::new(1);
        let _v6 = cap.admit("2001:db8:1:2::1".parse().unwrap()).unwrap();
        assert!(cap.admit("2001:db8:1:2:ffff::9".parse().unwrap()).is_none());
        let _v4 = cap.admit(a).unwrap();
        assert!(cap.admit("::ffff:198.51.100.1".parse().unwrap()).is_none());
    }
}
