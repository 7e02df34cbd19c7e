//! The wire format between server and runner: `POST /v1/call` with a signed bearer token.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The body of `POST /v1/call`. The token in `Authorization` signs its digest.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallRequest {
    pub tool: String,
    /// The pack params only: no `runners`, no `reason`.
    pub args: Map<String, Value>,
}

/// The runner's answer to an accepted call (HTTP 200). A refused call gets a 4xx with
/// `{"error": "..."}` instead.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "lowercase")]
pub enum CallResponse {
    /// The action ran and its result was shaped by the pack's output program.
    Ok {
        output: Value,
        /// True when the service's answer exceeded the output cap and was cut.
        truncated: bool,
        duration_ms: u64,
    },
    /// The action ran (or tried to) and failed: the service was down, answered an error, or
    /// the command exited non-zero or timed out.
    Failed { error: String, duration_ms: u64 },
}
