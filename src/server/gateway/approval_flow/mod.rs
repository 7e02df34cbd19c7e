//! The approval part of the call path: request (with preview) → wait (with progress) →
//! decide (people) → execute (exactly once, across replicas) → expire and sweep.
//!
//! # Layout
//!
//! - `request.rs`: a call that needs approval becomes a pending request: its refusals before
//!   anything is stored, the audited intent, the preview on every target (`previews` turns
//!   the runners' answers into what the request keeps), the statement people sign;
//! - `wait.rs`: waiting for the request to settle with progress, withdrawing it when the call
//!   is cancelled, expiring it, and the agent's view of it (`settled_outcome`, `pending_outcome`);
//! - `execute.rs`: a person's decision, which claims an approved request in the same
//!   transition (`claim`), and running a claimed one once with the values stored at request
//!   time; an approval too old to start (`too_late_to_start`) is expired instead;
//! - `rollout.rs`: a claimed request's runners wave by wave as its plan says, each wave's
//!   health gate (the tool's `verify`), and the halt at the first failed write or gate;
//! - `halted.rs`: people's signed decision on a halted rollout (resume, retry, abort):
//!   proposed, voted for, and carried out by `execute.rs` with the decision on every call;
//! - `sweep.rs`: the periodic sweep that expires overdue requests, runs approved ones nobody
//!   claimed, and marks lost executions `unknown`.
//!
//! Each pure step (`previews`, `settled_outcome`, `pending_outcome`, `claim`, `too_late_to_start`)
//! is tested in its file; the whole flow, against real runners and both stores, in
//! `tests/it/approvals.rs`.

mod execute;
mod halted;
mod request;
mod rollout;
mod sweep;
mod wait;

pub(super) use request::Request;
pub(super) use rollout::{ROLLOUT_ACTOR, Rolled, Rollout};
pub(super) use wait::{pending_outcome, settled_outcome};
