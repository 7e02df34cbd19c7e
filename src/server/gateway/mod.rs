//! The call path. Every tool call takes this one route, in this order:
//!
//! 1. **rate limit** the agent (a token bucket on a monotonic clock, and on PostgreSQL one
//!    shared by the replicas), before any work, so refusals of unknown names count too;
//! 2. **find** the tool (a tool the caller may not use is reported as unknown);
//! 3. **validate** the arguments against the tool's input schema, and `runners` against the
//!    runners that serve the tool's pack and that the caller may target (the token's and the
//!    policy's selectors);
//! 4. **admit or refuse**, the one step that refuses a call it found, audited as
//!    `tool.rejected`: invalid arguments or runners; then the **policy** (`policy::decide`,
//!    pure): allow, deny, or needs approval (a risk:high tool the policy lowered carries the
//!    policy's digest in the signed call); then what a target runner would refuse anyway (a
//!    value outside its allowlist, before anyone is asked to approve it; a lowering its
//!    approvers file does not allow);
//! 5. **audit intent** (`tool.called`): a write's is durable before anything runs, or nothing
//!    runs; a read's is appended with its outcomes at step 7 (below);
//!    a call that needs approval then runs its read-only *preview* on the runners, becomes a
//!    pending request (`approval.requested`, at most `max_pending_per_agent` per agent) and
//!    waits for humans ([`Gateway::wait`], with progress), or, for a client that declared MCP
//!    Tasks, is answered at once with a task to poll (`tasks.rs`); the decision that approves it
//!    claims it in the same transition ([`Gateway::decide`]: `approval.executing`, exactly
//!    once; the sweep's [`Gateway::execute_approved`] claims one whose replica stopped first,
//!    within `approved_start_within` of the approval) and carries on at step 6 with the
//!    approval id and the preview's values under their runner's seal in the signed call;
//! 6. **dispatch** to every named runner in parallel, each with its own deadline, through its
//!    circuit breaker; a read that could not reach its runner may be retried once, within
//!    the retry budget; writes never are;
//! 7. **audit outcome** per runner (`call.executed` / `call.failed`): a write's as each lands;
//!    a read's, once every runner answered, in one append with its intent (a read has no side
//!    effect, so one commit instead of two in sequence);
//! 8. hand the per-runner results back: a result whose outcome is not durable is withheld.
//!
//! Invariant: no runner is called for a write whose intent is not in the audit log, and no
//! result reaches the agent before its outcome and its call's intent are.

mod approval_flow;
mod break_glass;
mod builtins;
mod call;
mod dispatch;
mod grants;
mod outcome;
mod redact;
mod signatures;
mod state;
mod tasks;
mod witnessed;

/// A runner as the gateway shows it to a caller (`Gateway::runners_visible_to`): the API and
/// the portal serve this view, never the registry behind it.
pub(crate) use crate::server::runners::registry::RunnerStatus;
pub use break_glass::WindowAsk;
pub use builtins::{
    APPROVAL_STATUS_TOOL, APPROVAL_WAIT_TOOL, GRANTS_TOOL, REQUEST_GRANT_TOOL, RUNNERS_TOOL,
};
pub use call::{Answer, CallContext, Progress, ToolCall};
pub use grants::GrantError;
pub use outcome::{ApprovalInfo, CallError, CallOutcome, RunnerResult};
pub use signatures::ServerApprovers;
pub(crate) use state::GatewayParts;
pub use state::{Gateway, Limits, OfferedTool};
pub use tasks::{POLL_INTERVAL_MS, TaskError, TaskState, TaskView};
pub(crate) use witnessed::Witnessing;
