//! Small helpers both the server and the node use: backoff, error chains, config files,
//! files replaced whole (`files`), sockets, TLS (fingerprints, PEM files, serving HTTPS), and the door's checks on text from
//! outside.

pub mod backoff;
pub mod config;
pub mod door;
mod errors;
pub mod files;
pub mod net;
pub mod process;
pub mod tls;

pub use backoff::Backoff;
pub use errors::error_chain;
