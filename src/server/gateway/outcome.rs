//! What a call gives back: its outcome per runner, where its approval request stands, and
//! why it was refused.

use serde::Serialize;
use serde_json::Value;

use crate::server::approvals::{ApprovalError, State};
use crate::server::audit::AuditError;

#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("unknown tool: {0}")]
    UnknownTool(String),
    #[error("invalid arguments for `{tool}`: {}", .errors.join("; "))]
    Invalid { tool: String, errors: Vec<String> },
    #[error("refused: {0}")]
    Denied(String),
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

/// Where an approval request stands, as the agent sees it.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct ApprovalInfo {
    pub approval_id: String,
    pub state: State,
    pub expires_at: String,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<String>,
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
}

impl CallOutcome {
    pub fn all_failed(&self) -> bool {
        !self.results.is_empty() && self.results.iter().all(|r| !r.ok)
    }

    /// The agent should read this as a failure.
    pub fn is_error(&self) -> bool {
        self.all_failed()
            || self
                .approval
                .as_ref()
                .is_some_and(|a| matches!(a.state, State::Failed | State::Unknown))
    }
}

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct RunnerResult {
    pub runner: String,
    pub ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub duration_ms: u64,
}
