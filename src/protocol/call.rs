//! The wire format between server and runner: `POST /v1/call` with a signed bearer token.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::digest::json_digest;
use crate::protocol::approval::ApprovalProof;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Run the tool's steps.
    #[default]
    Execute,
    /// Run only the tool's read-only preview steps (at request time, for the approver).
    Preview,
    /// Run only the tool's read-only verify steps (a rollout's health gate, after the write).
    Verify,
}

/// The body of `POST /v1/call`. The token in `Authorization` signs its digest.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallRequest {
    pub tool: String,
    /// The pack params only: no `runners`, no `reason`, no `raw`.
    pub args: Map<String, Value>,
    #[serde(default)]
    pub mode: Mode,
    /// The vars the preview captured, bound into the approval; required to execute a tool
    /// that has a preview.
    #[serde(default)]
    pub preview: Option<Map<String, Value>>,
    /// The runner's own seal over `preview`, from its preview answer: the runner executes
    /// with preview values only when it finds its seal on exactly them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preview_seal: Option<String>,
    /// Return the unshaped result instead of the pack's output program.
    #[serde(default)]
    pub raw: bool,
    /// The people's signatures an approved execution carries (see
    /// [`crate::protocol::approval`]); a runner with `require_signed_approvals` checks them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<ApprovalProof>,
    /// The approval's `approval.approved` event with its inclusion proof in a witnessed
    /// checkpoint (see [`crate::protocol::witnessed`]); a runner with `require_witnessed`
    /// checks it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub witnessed: Option<crate::protocol::witnessed::WitnessedApproval>,
    /// The salt of the secret params' commitments in the signed arguments (see
    /// [`crate::protocol::approval::statement::signed_args`]), for an approved execution of a
    /// tool with secret params.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_salt: Option<String>,
    /// The rollout wave (1-based) this execution of an approved request runs in; a runner
    /// that checks people's signatures refuses a wave the signed plan does not place it in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wave: Option<u32>,
    /// People's decision to resume or retry a halted rollout (see
    /// [`crate::protocol::approval::decision`]), when this execution runs under one: a runner
    /// runs a retried write a second time only under a decision that names it, and one that
    /// checks people's signatures takes the decision's expiry for the statement's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<crate::protocol::approval::DecisionProof>,
    /// People's grant this execution runs under instead of an approval (see
    /// [`crate::protocol::approval::grant`]); a runner checks its signatures and limits and
    /// counts its calls before anything runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant: Option<crate::protocol::approval::grant::GrantProof>,
}

impl CallRequest {
    /// What the call token signs: every field of the request.
    pub fn digest(&self) -> String {
        json_digest(&serde_json::to_value(self).expect("a call request is JSON"))
    }
}

/// The runner's answer to an accepted call (HTTP 200). A refused call gets a 4xx with
/// `{"error": "..."}` instead.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "lowercase")]
pub enum CallResponse {
    /// The steps ran and the result was shaped by the pack's output program.
    Ok {
        output: Value,
        /// True when a service's answer exceeded the output cap and was cut.
        truncated: bool,
        duration_ms: u64,
        /// The vars the steps captured (a preview's are bound into the approval).
        #[serde(default, skip_serializing_if = "Map::is_empty")]
        vars: Map<String, Value>,
        /// A preview's answer only: the runner's seal over `vars` for this call and these
        /// arguments, which the execution must hand back with them.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        seal: Option<String>,
    },
    /// A step failed (the service was down or answered an error, a command exited non-zero
    /// or timed out) or a precondition did not hold; the steps after it did not run.
    Failed { error: String, duration_ms: u64 },
}
