//! Small helpers both the server and the node use: backoff, error chains, config files,
//! sockets.

pub mod backoff;
pub mod config;
mod errors;
pub mod net;
pub mod process;

pub use backoff::Backoff;
pub use errors::error_chain;
