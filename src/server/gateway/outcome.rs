//! What a call gives back: its outcome per runner, where its approval request stands, and
//! why it was refused.

use serde::Serialize;
use serde_json::{Value, json};

use crate::server::approvals::{Approval, ApprovalError, State};
use crate::server::audit::AuditError;

/// Why a call was refused. Each refusal an agent could act on differently has its own
/// variant and a stable [`CallError::kind`] (documented for agents in docs/agent-guide.md):
/// wait and call again, rephrase, ask for approval again, or stop.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("unknown tool: {0}")]
    UnknownTool(String),
    #[error("invalid arguments for `{tool}`: {}", .errors.join("; "))]
    Invalid { tool: String, errors: Vec<String> },
    /// The policy says no (the agent's tools or runners, a runner's allowlist).
    #[error("refused: {0}")]
    DeniedByPolicy(String),
    /// A value outside a target runner's `[allowlists]` (as the runner reported them): it
    /// could never run there, so no approval is asked for.
    #[error("refused: {0}")]
    OutsideRunnerAllowlist(String),
    /// The target runners check people's signatures for this write, and their approvers could
    /// never give them (no rule for the tool, too few people with keys, a file the server does
    /// not carry): nobody is asked.
    #[error("refused: {0}")]
    SignaturesUnsatisfiable(String),
    #[error(
        "refused: `{tool}` has secret params and needs approval: emisar cannot yet keep a secret in a pending request, so it refuses the call"
    )]
    NeedsApprovalSecret { tool: String },
    #[error("refused: the preview failed, so no approval was requested: {0}")]
    PreviewFailed(String),
    /// A break-glass call whose record no witness quorum cosigned in time: nothing ran.
    #[error("refused: {0}")]
    NotWitnessed(String),
    #[error("refused: approval request {approval_id} was denied by {by}: {note}")]
    DeniedByHuman {
        approval_id: String,
        by: String,
        note: String,
    },
    #[error("refused: approval request {approval_id} {why}")]
    Expired { approval_id: String, why: String },
    #[error(
        "refused: approval request {approval_id} was withdrawn (its call was cancelled); nothing ran"
    )]
    Withdrawn { approval_id: String },
    #[error(
        "refused: agent `{agent}` already has {pending} approval requests pending, the most allowed (max_pending_per_agent = {max}); wait for them to be decided, or withdraw one"
    )]
    TooManyPending {
        agent: String,
        pending: u64,
        max: u32,
    },
    #[error(
        "refused: agent `{agent}` already has {waiting} grants waiting for people's signatures, the most allowed (max_pending_per_agent = {max}); wait for them to be signed or to expire"
    )]
    TooManyGrantsAsked {
        agent: String,
        waiting: u64,
        max: u32,
    },
    #[error(
        "rate limited: agent `{agent}` may make {per_second} calls per second (bursts of {burst}); retry in {retry_after_ms} ms"
    )]
    RateLimited {
        agent: String,
        per_second: u32,
        burst: u32,
        retry_after_ms: u64,
    },
    #[error("refused: the audit log cannot record this call ({0}), so nothing was run")]
    AuditUnavailable(AuditError),
    #[error("{0}")]
    Approval(#[from] ApprovalError),
    #[error("cancelled by the client{0}")]
    Cancelled(String),
}

impl CallError {
    /// A stable, machine-readable name for this refusal. Agents branch on it; the text
    /// beside it is for people and may change.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            CallError::UnknownTool(_) => "unknown_tool",
            CallError::Invalid { .. } => "invalid_arguments",
            CallError::DeniedByPolicy(_) => "denied_by_policy",
            CallError::OutsideRunnerAllowlist(_) => "outside_runner_allowlist",
            CallError::SignaturesUnsatisfiable(_) => "signatures_unsatisfiable",
            CallError::NeedsApprovalSecret { .. } => "needs_approval_secret",
            CallError::PreviewFailed(_) => "preview_failed",
            CallError::NotWitnessed(_) => "not_witnessed",
            CallError::DeniedByHuman { .. } => "denied_by_human",
            CallError::Expired { .. } => "expired",
            CallError::Withdrawn { .. } => "withdrawn",
            CallError::TooManyPending { .. } | CallError::TooManyGrantsAsked { .. } => {
                "too_many_pending"
            }
            CallError::RateLimited { .. } => "rate_limited",
            CallError::AuditUnavailable(_) => "audit_unavailable",
            CallError::Approval(ApprovalError::NotFound(_)) => "unknown_approval",
            CallError::Approval(ApprovalError::Audit(_)) => "audit_unavailable",
            CallError::Approval(ApprovalError::Store(_)) => "store_unavailable",
            CallError::Approval(ApprovalError::Refused(_) | ApprovalError::WrongState { .. }) => {
                "approval_refused"
            }
            CallError::Cancelled(_) => "cancelled",
        }
    }

    /// The refusal as an agent reads it: `{kind, message}` and the facts it may act on (the
    /// request id, when to retry, which arguments were wrong).
    pub(crate) fn to_json(&self) -> Value {
        let mut error = json!({"kind": self.kind(), "message": self.to_string()});
        match self {
            CallError::Invalid { errors, .. } => error["errors"] = json!(errors),
            CallError::DeniedByHuman { approval_id, .. }
            | CallError::Expired { approval_id, .. }
            | CallError::Withdrawn { approval_id } => error["approval_id"] = json!(approval_id),
            CallError::RateLimited { retry_after_ms, .. } => {
                error["retry_after_ms"] = json!(retry_after_ms);
            }
            CallError::TooManyPending { pending, max, .. }
            | CallError::TooManyGrantsAsked {
                waiting: pending,
                max,
                ..
            } => {
                error["pending"] = json!(pending);
                error["max"] = json!(max);
            }
            _ => {}
        }
        error
    }
}

/// Where an approval request stands, as the agent sees it.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct ApprovalInfo {
    pub approval_id: String,
    pub state: State,
    pub expires_at: String,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<String>,
    /// Why the request ended as it did: the denial's note, or why the execution failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome_note: Option<String>,
    /// `outcome_note` under its old name, kept for one release (docs/agent-guide.md).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct CallOutcome {
    pub call_id: String,
    pub tool: String,
    /// True when the server chose the runner (cluster-scoped tool called without `runners`).
    pub runner_chosen_by_server: bool,
    pub results: Vec<RunnerResult>,
    /// Set when the call went through an approval request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<ApprovalInfo>,
    /// Where the rollout halted, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub halt: Option<crate::server::approvals::Halt>,
    /// Set when the call ran under a grant: its id (`grant_id`) and which use it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant: Option<Value>,
}

impl CallOutcome {
    /// The outcome of the call an approval request stands for, with `results` and no
    /// approval information yet.
    pub(super) fn of_approval(row: &Approval, results: Vec<RunnerResult>) -> Self {
        CallOutcome {
            call_id: row.call_id.clone(),
            tool: row.tool.clone(),
            runner_chosen_by_server: row.runner_chosen_by_server,
            results,
            approval: None,
            halt: None,
            grant: None,
        }
    }

    pub(crate) fn all_failed(&self) -> bool {
        !self.results.is_empty() && self.results.iter().all(|r| !r.ok)
    }

    /// The agent should read this as a failure.
    pub(crate) fn is_error(&self) -> bool {
        self.all_failed()
            || self
                .approval
                .as_ref()
                .is_some_and(|a| matches!(a.state, State::Failed | State::Unknown | State::Halted))
    }
}

/// The `error_kind` of a runner a halted rollout never called (`approval_flow/rollout.rs`).
pub(super) const NOT_RUN: &str = "not_run";
/// The `error_kind` of a runner whose write ran and whose health gate then failed.
pub(super) const GATE_FAILED: &str = "gate_failed";

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct RunnerResult {
    pub runner: String,
    pub ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
    /// What the agent reads of a failure on this runner: a short reason, never the runner's
    /// raw answer or a transport error (those are in the server's log).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// A stable name for the failure (`runner_unreachable`, `runner_refused`, `action_failed`,
    /// …; docs/agent-guide.md lists them), to branch on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_kind: Option<String>,
    pub duration_ms: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::audit::AuditError;
    use crate::server::runners::client::RunnerError;

    /// One of each refusal. `every_variant_is_here` fails to compile when a variant is added
    /// and not listed here, so a new kind cannot miss the documents test below.
    fn one_of_each() -> Vec<CallError> {
        let id = || "0190c0de-0000-7000-8000-000000000000".to_string();
        vec![
            CallError::UnknownTool("x".into()),
            CallError::Invalid {
                tool: "x".into(),
                errors: vec![],
            },
            CallError::DeniedByPolicy("x".into()),
            CallError::OutsideRunnerAllowlist("x".into()),
            CallError::SignaturesUnsatisfiable("x".into()),
            CallError::NeedsApprovalSecret { tool: "x".into() },
            CallError::PreviewFailed("x".into()),
            CallError::NotWitnessed(String::new()),
            CallError::DeniedByHuman {
                approval_id: id(),
                by: "ann".into(),
                note: "no".into(),
            },
            CallError::Expired {
                approval_id: id(),
                why: "expired".into(),
            },
            CallError::Withdrawn { approval_id: id() },
            CallError::TooManyPending {
                agent: "a".into(),
                pending: 20,
                max: 20,
            },
            CallError::TooManyGrantsAsked {
                agent: "a".into(),
                waiting: 20,
                max: 20,
            },
            CallError::RateLimited {
                agent: "a".into(),
                per_second: 1,
                burst: 1,
                retry_after_ms: 1,
            },
            CallError::AuditUnavailable(AuditError::QueueFull),
            CallError::Approval(ApprovalError::NotFound(id())),
            CallError::Approval(ApprovalError::Refused("x".into())),
            CallError::Approval(ApprovalError::WrongState {
                state: State::Denied,
                wanted: "pending",
            }),
            CallError::Approval(ApprovalError::Audit(AuditError::QueueFull)),
            CallError::Approval(ApprovalError::Store(sqlx::Error::PoolClosed)),
            CallError::Cancelled(String::new()),
        ]
    }

    #[allow(dead_code)]
    fn every_variant_is_here(e: &CallError) {
        // No `_` arm on purpose: a new variant breaks this match until it is in `one_of_each`.
        match e {
            CallError::UnknownTool(_)
            | CallError::Invalid { .. }
            | CallError::DeniedByPolicy(_)
            | CallError::OutsideRunnerAllowlist(_)
            | CallError::SignaturesUnsatisfiable(_)
            | CallError::NeedsApprovalSecret { .. }
            | CallError::PreviewFailed(_)
            | CallError::NotWitnessed(_)
            | CallError::DeniedByHuman { .. }
            | CallError::Expired { .. }
            | CallError::Withdrawn { .. }
            | CallError::TooManyPending { .. }
            | CallError::TooManyGrantsAsked { .. }
            | CallError::RateLimited { .. }
            | CallError::AuditUnavailable(_)
            | CallError::Approval(
                ApprovalError::NotFound(_)
                | ApprovalError::Refused(_)
                | ApprovalError::WrongState { .. }
                | ApprovalError::Audit(_)
                | ApprovalError::Store(_),
            )
            | CallError::Cancelled(_) => {}
        }
    }

    /// The first column of the markdown table whose header's first cell is `header`: the
    /// backquoted names, in order.
    fn table_column(doc: &str, header: &str) -> Vec<String> {
        let mut lines = doc
            .lines()
            .skip_while(|l| !l.starts_with(&format!("| {header} |")));
        assert!(
            lines.next().is_some(),
            "docs/agent-guide.md has no table headed `{header}`"
        );
        lines
            .skip(1) // the |---| line
            .take_while(|l| l.starts_with('|'))
            .map(|l| {
                l.split('|')
                    .nth(1)
                    .unwrap()
                    .trim()
                    .trim_matches('`')
                    .to_string()
            })
            .collect()
    }

    const AGENT_GUIDE: &str = include_str!("../../../docs/agent-guide.md");

    /// The kinds agents branch on are a contract: every kind the server can send is in the
    /// agent guide's table, and the table lists no kind the server never sends.
    /// `unknown_tool` is the one refusal that is a JSON-RPC error, documented below the table.
    #[test]
    fn every_refusal_kind_is_documented_and_every_documented_kind_exists() {
        let mut sent: Vec<&str> = one_of_each().iter().map(CallError::kind).collect();
        sent.sort();
        sent.dedup();
        let mut documented = table_column(AGENT_GUIDE, "`kind`");
        assert!(AGENT_GUIDE.contains(r#"`{"kind": "unknown_tool"}`"#));
        documented.push("unknown_tool".into());
        documented.sort();
        assert_eq!(
            sent, documented,
            "CallError::kind against docs/agent-guide.md's `kind` table"
        );
    }

    /// The same for a runner's failure (`error_kind` in a result): `RunnerError::kind`, and
    /// `outcome_not_recorded`, which the gateway gives when it withholds a result.
    #[test]
    fn every_runner_error_kind_is_documented_and_every_documented_kind_exists() {
        let errors = [
            RunnerError::Unreachable {
                detail: String::new(),
            },
            RunnerError::Untrusted {
                detail: String::new(),
            },
            RunnerError::Timeout(std::time::Duration::from_secs(1)),
            RunnerError::Refused {
                status: 403,
                reason: None,
                detail: String::new(),
            },
            RunnerError::ActionFailed(String::new()),
            RunnerError::BadAnswer {
                detail: String::new(),
            },
            RunnerError::CircuitOpen(String::new()),
        ];
        for e in &errors {
            // No `_` arm: a new variant breaks this match until it is in `errors` above.
            match e {
                RunnerError::Unreachable { .. }
                | RunnerError::Untrusted { .. }
                | RunnerError::Timeout(_)
                | RunnerError::Refused { .. }
                | RunnerError::ActionFailed(_)
                | RunnerError::BadAnswer { .. }
                | RunnerError::CircuitOpen(_) => {}
            }
        }
        let mut sent: Vec<&str> = errors.iter().map(RunnerError::kind).collect();
        sent.push("outcome_not_recorded");
        sent.push(NOT_RUN);
        sent.push(GATE_FAILED);
        sent.sort();
        let mut documented = table_column(AGENT_GUIDE, "`error_kind`");
        documented.sort();
        assert_eq!(
            sent, documented,
            "RunnerError::kind against docs/agent-guide.md's `error_kind` table"
        );
    }
}
