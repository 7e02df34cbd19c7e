//! What runs on a node: `emisar runner`. It imports nothing of the server; the wire types it
//! shares with the server live in [`crate::protocol`].
//!
//! `agent` is the runner's HTTP server (verifies, re-validates and executes signed calls);
//! `engine` runs a tool's steps; `exec` and `http_action` are the two kinds of action, and
//! only `exec` spawns processes; `seal` is the runner's own seal on what its previews
//! captured; `approvals` checks people's signatures on a write before it runs
//! (`require_signed_approvals`); `grants` runs a write under people's grant instead and
//! records the server's revocations; `refusal` is how the runner's endpoints refuse; `join` is
//! the runner's side of joining a server, `credential` keeps what joining earned it, so it
//! re-registers after a restart, and `tls` is the runner's TLS identity (configured, or
//! self-signed and kept in `state_dir`).
//!
//! *Invariant:* these modules form a tree (no two import each other, however indirectly):
//! `agent` sits above `grants`, which reads the runner through the view `agent` hands it, and
//! both take their refusals from `refusal`, below them.

pub mod agent;
mod approvals;
pub mod config;
pub mod credential;
pub(crate) mod engine;
pub(crate) mod exec;
mod executed;
mod grants;
pub(crate) mod http_action;
pub mod join;
mod refusal;
mod seal;
pub mod start;
pub mod tls;
