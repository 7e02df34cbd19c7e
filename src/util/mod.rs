//! Small helpers both the server and the node use: backoff, error chains, config files,
//! sockets, and the door's checks on text from outside.

pub mod backoff;
pub mod config;
pub mod door;
mod errors;
pub mod net;
pub mod process;

pub use backoff::Backoff;
pub use errors::error_chain;
