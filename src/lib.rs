//! emisar: a governed operations server for AI agents.
//!
//! # Layout
//!
//! A tool call travels through these modules, in this order:
//!
//! - [`mcp`]: the rmcp `ServerHandler`. Turns `tools/call` into a [`gateway::ToolCall`]; no policy here.
//! - [`gateway`]: the one call path: validate → policy → audit intent → dispatch → audit outcome.
//! - [`policy`]: pure decision from (tool, caller, runners, args) to allow, needs approval or deny.
//! - [`audit`]: the append-only, hash-chained event log and its single writer task.
//! - [`runner::client`]: signs a call for one runner and sends it, with a deadline.
//! - [`runner::agent`]: the runner's HTTP server: verifies the signature, re-validates, executes.
//!
//! Around them: [`pack`] (the YAML tool packs), [`db`] (PostgreSQL or SQLite), [`tokens`]
//! (agent bearer tokens), [`signing`] (the server's Ed25519 key and the call claims),
//! [`webhook`] (approval notices to people, off the call path), [`config`], [`app`]
//! (`emisar serve`), [`dev`] (`emisar dev`) and [`cli`].

pub mod app;
pub mod approvals;
pub mod audit;
pub mod cli;
pub mod config;
pub mod db;
pub mod dev;
pub mod digest;
pub mod fleet;
pub mod gateway;
pub mod http;
pub mod mcp;
pub mod metrics;
pub mod pack;
pub mod policy;
pub mod portal;
pub mod runner;
pub mod secrets;
pub mod selector;
pub mod signing;
pub mod stdio_bridge;
pub mod tokens;
pub mod users;
pub mod webhook;
