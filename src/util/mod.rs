//! Small helpers both the server and the node use: backoff, error chains, config files.

pub mod backoff;
pub mod config;
mod errors;

pub use backoff::Backoff;
pub use errors::error_chain;
