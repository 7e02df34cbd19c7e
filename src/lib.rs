//! emisar: a governed operations server for AI agents.
//!
//! # Layout
//!
//! Three rooms that never import each other except through the wire types:
//!
//! - [`server`] (`emisar serve`): the MCP adapter, the call path ([`server::gateway`]), the
//!   approval queue, the policy, the hash-chained audit log, the store, the portal and API,
//!   and the server's side of its runners (sign, send, breakers, health).
//! - [`node`] (`emisar runner`, and the small `emisar-runner` binary): the per-node agent that
//!   verifies signed calls, re-validates them against its own packs and executes them.
//! - [`protocol`]: what crosses the wire between the two (call request and answer, the signed
//!   call claims, the join handshake).
//!
//! Both sides also share the building blocks: [`pack`] (the YAML tool packs), [`digest`]
//! (canonical JSON and SHA-256, pure), [`selector`] (label selectors, pure), [`tlog`] (the
//! transparency log's Merkle tree, proofs, checkpoints and cosignatures, pure) and [`util`]
//! (backoff, error chains, config files).
//!
//! [`witness`] (`emisar witness`) is a separate small process that cosigns another log's
//! checkpoints (C2SP tlog-witness); it uses [`tlog`] and [`util`], nothing of the server.
//!
//! At the top, the composition roots put the rooms together: [`cli`] (every subcommand),
//! [`dev`] (`emisar dev`: a server and a local runner in one process), `lab` (`emisar lab`:
//! a fleet-wide 502 incident on one machine; nothing in the product imports it, and only the
//! `lab` cargo feature builds it: the package's binary leaves it out) and [`stdio_bridge`]
//! (`emisar mcp-stdio`).

// A `pub` item no one outside its crate can reach says less than it claims: mark it
// `pub(crate)` or `pub(super)`, so `pub` always means "part of the crate's API". Test-only
// code is no API, so the lint leaves the test build alone.
#![cfg_attr(not(test), warn(unreachable_pub))]

#[cfg(feature = "server")]
pub mod cli;
#[cfg(feature = "server")]
pub mod dev;
pub mod digest;
#[cfg(feature = "lab")]
pub mod lab;
pub mod node;
pub mod pack;
pub mod protocol;
pub mod selector;
#[cfg(feature = "server")]
pub mod server;
#[cfg(feature = "server")]
pub mod stdio_bridge;
pub mod tlog;
pub mod util;
pub mod witness;
