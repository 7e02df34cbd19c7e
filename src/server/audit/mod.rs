//! The audit log: every call, decision and outcome, append-only and hash-chained.
//!
//! `chain` is pure (event shape, hashing, verification), `writer` is the single task that
//! appends events in group-committed batches, `store` holds the per-backend SQL.

mod chain;
mod store;
mod writer;

pub use chain::{BrokenLink, Event, GENESIS_HASH, NewEvent, VerifyReport, format_at, kind};
pub use store::{AuditFilter, query, verify};
pub use writer::{AuditError, AuditLog};
