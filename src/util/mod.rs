//! Small helpers both the server and the node use: backoff, error chains, config files,
//! files replaced whole (`files`), sockets, TLS (fingerprints, PEM files, serving HTTPS), and
//! the checks on input (`input`: text from outside).

pub mod backoff;
pub mod config;
mod errors;
pub mod files;
pub mod input;
pub mod net;
pub mod process;
pub mod tls;

pub use backoff::Backoff;
pub use errors::error_chain;
