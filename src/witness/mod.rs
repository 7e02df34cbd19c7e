//! `emisar witness`: a small, separately deployed process with its own Ed25519 key that
//! cosigns other logs' checkpoints by the C2SP tlog-witness protocol, only when the new
//! checkpoint provably extends the one it last cosigned for that log (a consistency proof).
//!
//! - `config.rs`: witness.toml (listen, key, state dir, TLS, the logs by origin and keys).
//! - `add.rs`: `add-checkpoint`, the protocol's one operation, and its answers.
//! - `state.rs`: the latest cosigned checkpoint per origin, written atomically before any
//!   cosignature leaves.
//! - `serve.rs`: key file and keygen, binding and serving over HTTP(S).
//!
//! *Invariant:* imports only [`crate::tlog`] and [`crate::util`]: nothing of the server or
//! the node, so it builds and runs on a host of its own.

pub mod add;
pub mod config;
pub mod serve;
pub mod state;
