//! The audit log: every call, decision and outcome, append-only and hash-chained.
//!
//! `chain` is pure (event shape, the event text and its hash, verification), `writer` is the
//! single task that appends events in group-committed batches, `store` holds the per-backend
//! SQL, `lock` the advisory lock every writer of the log takes, `verify` walks the stored chain, `refusals` counts the refusals a caller repeats and
//! writes them as one event per caller and window, `failure_log` keeps a run of failed appends
//! to a few log lines (the writer's batches, the call path's reads), `activity` counts events,
//! calls, refusals and approvals per time bucket for the portal's chart.

pub mod activity;
mod chain;
pub mod checkpoints;
pub(crate) mod failure_log;
mod filter;
mod lock;
pub mod proofs;
mod refusals;
pub mod signed;
mod store;
pub mod tree;
mod verify;
mod writer;

pub use chain::{
    BrokenLink, Event, EventText, GENESIS_HASH, MAX_LISTED, NewEvent, VerifyReport, format_at,
    hash_v, kind,
};
pub use filter::{AuditParams, KINDS, MAX_PAGE, OUTCOMES};
pub use refusals::{Noted, RefusalKey, WINDOW as REFUSAL_WINDOW};
pub use store::{AuditFilter, COLUMNS, query};
pub use verify::verify;
pub use writer::{AuditError, AuditLog};
