//! Runners: the per-node agents that execute pack actions, and the server's client for them.
//!
//! `client` runs in the server (signs and sends calls); `agent` is `emisar runner` (verifies,
//! re-validates and executes); `exec` and `http_action` are the two kinds of action. Only
//! `exec` spawns processes.

pub mod agent;
mod backoff;
mod breaker;
mod budget;
pub mod client;
mod engine;
mod exec;
mod http_action;
pub mod join;
mod protocol;
pub mod registry;

pub use backoff::Backoff;
pub use breaker::{Breaker, Rejection};
pub use budget::RetryBudget;
pub use protocol::{CallRequest, CallResponse, Mode};
