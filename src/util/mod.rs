//! Small helpers both the server and the node use: backoff, error chains, config files, TLS
//! (fingerprints, PEM files, serving HTTPS).

pub mod backoff;
pub mod config;
mod errors;
pub mod process;
pub mod tls;

pub use backoff::Backoff;
pub use errors::error_chain;
