//! The anycast VIP as the edge firewall sees it, and the case study's probe at it.
//!
//! Every node whose BGP session is up advertises the VIP (`frr`); the firewall spreads
//! connections over the advertisers (ECMP, per connection). The probe opens one real TCP
//! connection every `PROBE_EVERY` to the Traefik of the advertiser whose turn it is (turns
//! go round the advertisers, standing in for the firewall's hash, so each advertiser gets
//! every n-th connection) and counts the refused ones, by node. A node that advertises while
//! nothing listens on it (hvn05 at the incident's start) is refused its share, as at the
//! real VIP; a node that withdrew (`frr.bgp_neighbor_shutdown`) gets none.
//!
//! Its HTTP face (loopback, no token: counts only): `GET /` answers the tally since the last
//! reset and the current advertisers, `POST /reset` zeroes the tally.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::routing::{get, post};
use serde::Serialize;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::node::World;

/// How often the probe opens a connection at the VIP.
pub const PROBE_EVERY: Duration = Duration::from_millis(50);
/// How long a connection may take before it counts as refused.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Connections at the VIP and how many were refused.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Count {
    pub connections: u64,
    pub refused: u64,
}

/// What the probe saw since the last reset: in all, and by the node each connection reached.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Tally {
    pub connections: u64,
    pub refused: u64,
    pub by_node: BTreeMap<String, Count>,
}

pub struct Vip {
    world: Arc<World>,
    tally: Mutex<Tally>,
    turn: AtomicUsize,
}

impl Vip {
    pub fn new(world: Arc<World>) -> Arc<Vip> {
        Arc::new(Vip {
            world,
            tally: Mutex::new(Tally::default()),
            turn: AtomicUsize::new(0),
        })
    }

    /// The nodes that advertise the VIP now, by name.
    pub fn advertisers(&self) -> Vec<String> {
        self.world
            .node_names()
            .into_iter()
            .filter(|n| self.world.node(n).is_some_and(|s| s.bgp.advertised() > 0))
            .collect()
    }

    pub fn tally(&self) -> Tally {
        self.tally.lock().expect("vip tally").clone()
    }

    pub fn reset(&self) {
        *self.tally.lock().expect("vip tally") = Tally::default();
    }

    /// Opens one connection at the VIP; returns the node it reached and whether it was
    /// refused, or `None` when no node advertises the VIP (nothing to connect to).
    pub async fn connect_once(&self) -> Option<(String, bool)> {
        let advertisers = self.advertisers();
        if advertisers.is_empty() {
            return None;
        }
        let node =
            advertisers[self.turn.fetch_add(1, Ordering::SeqCst) % advertisers.len()].clone();
        let addr = self.world.traefik.get(&node)?.addr();
        let connected =
            tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(addr)).await;
        let refused = !matches!(connected, Ok(Ok(_)));
        let mut tally = self.tally.lock().expect("vip tally");
        tally.connections += 1;
        let count = tally.by_node.entry(node.clone()).or_default();
        count.connections += 1;
        if refused {
            count.refused += 1;
            tally.refused += 1;
        }
        Some((node, refused))
    }

    /// Probes every `PROBE_EVERY` until `stop`.
    pub fn spawn(self: Arc<Self>, stop: CancellationToken) {
        tokio::spawn(async move {
            let mut every = tokio::time::interval(PROBE_EVERY);
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = every.tick() => {}
                }
                self.connect_once().await;
            }
        });
    }

    pub fn router(self: Arc<Self>) -> Router {
        Router::new()
            .route("/", get(read))
            .route("/reset", post(reset))
            .with_state(self)
    }
}

async fn read(State(vip): State<Arc<Vip>>) -> axum::Json<serde_json::Value> {
    let tally = vip.tally();
    axum::Json(json!({
        "connections": tally.connections,
        "refused": tally.refused,
        "by_node": tally.by_node,
        "advertisers": vip.advertisers(),
    }))
}

async fn reset(State(vip): State<Arc<Vip>>) -> axum::Json<serde_json::Value> {
    vip.reset();
    axum::Json(json!({"reset": true}))
}
