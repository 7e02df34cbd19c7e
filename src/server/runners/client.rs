//! The server's side of a runner call: sign, send, wait at most the deadline, read the answer.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};

use super::registry::Endpoint;
use crate::protocol::signing::{CallClaims, CallSigner, ISSUER, Purpose, TOKEN_LIFETIME, now};
use crate::protocol::{CallRequest, CallResponse, Mode};
use crate::util::error_chain;

/// The most bytes the server reads from one runner answer.
const MAX_ANSWER_BYTES: usize = 8 * 1024 * 1024;

#[derive(Debug, Clone, thiserror::Error)]
pub enum RunnerError {
    #[error("runner unreachable: {0}")]
    Unreachable(String),
    /// The runner's TLS identity is not the one it is trusted as (e.g. not its pinned
    /// certificate). Nothing was sent; retrying would not help.
    #[error("{0}")]
    Untrusted(String),
    #[error("runner did not answer within {} ms", .0.as_millis())]
    Timeout(Duration),
    #[error("runner refused the call (HTTP {status}): {message}")]
    Refused { status: u16, message: String },
    #[error("{0}")]
    ActionFailed(String),
    #[error("runner sent an answer emisar cannot read: {0}")]
    BadAnswer(String),
    #[error("{0}")]
    CircuitOpen(String),
}

#[derive(Debug, Clone)]
pub struct RunnerAnswer {
    pub output: Value,
    pub truncated: bool,
    pub duration_ms: u64,
    pub vars: Map<String, Value>,
    /// A preview's answer: the runner's seal over `vars`, handed back with them to execute.
    pub seal: Option<String>,
}

/// What one call to one runner needs besides the runner itself.
pub struct Dispatch<'a> {
    pub call_id: &'a str,
    pub tool: &'a str,
    pub pack_sha256: &'a str,
    pub args: &'a Map<String, Value>,
    pub mode: Mode,
    pub preview: Option<&'a Map<String, Value>>,
    /// The runner's seal over `preview`, from its preview answer.
    pub preview_seal: Option<&'a str>,
    pub raw: bool,
    /// Set when this execution carries out an approved request.
    pub approval_id: Option<&'a str>,
    /// Set when the policy in force (this is its SHA-256) lowered a risk:high tool to run
    /// without approval.
    pub lowered_by_policy: Option<&'a str>,
}

/// Signs calls; each runner's own client (in its [`Endpoint`]) sends them.
#[derive(Clone)]
pub struct RunnerClient {
    signer: Arc<CallSigner>,
}

/// What a failed send says, with a pinned certificate's mismatch spelled out.
pub fn describe_send_error(e: &reqwest::Error) -> String {
    match super::tls::pin_mismatch(e) {
        Some(mismatch) => mismatch.to_string(),
        None => error_chain(e),
    }
}

fn send_error(e: &reqwest::Error) -> RunnerError {
    match super::tls::pin_mismatch(e) {
        Some(mismatch) => RunnerError::Untrusted(mismatch.to_string()),
        None => RunnerError::Unreachable(error_chain(e)),
    }
}

impl RunnerClient {
    pub fn new(signer: Arc<CallSigner>) -> Self {
        RunnerClient { signer }
    }

    pub async fn call(
        &self,
        runner: &str,
        endpoint: &Endpoint,
        d: &Dispatch<'_>,
        deadline: Duration,
    ) -> Result<RunnerAnswer, RunnerError> {
        let body = CallRequest {
            tool: d.tool.to_owned(),
            args: d.args.clone(),
            mode: d.mode,
            preview: d.preview.cloned(),
            preview_seal: d.preview_seal.map(str::to_owned),
            raw: d.raw,
        };
        let iat = now();
        let claims = CallClaims {
            iss: ISSUER.to_owned(),
            aud: runner.to_owned(),
            iat,
            exp: iat + TOKEN_LIFETIME,
            purpose: Purpose::Call,
            jti: uuid::Uuid::new_v4().to_string(),
            call_id: d.call_id.to_owned(),
            tool: d.tool.to_owned(),
            request_sha256: body.digest(),
            pack_sha256: d.pack_sha256.to_owned(),
            approval_id: d.approval_id.map(str::to_owned),
            lowered_by_policy: d.lowered_by_policy.map(str::to_owned),
        };
        let token = self
            .signer
            .sign(&claims)
            .map_err(|e| RunnerError::Unreachable(format!("{e:#}")))?;
        let url = format!("{}/v1/call", endpoint.entry.url.trim_end_matches('/'));
        let send = async {
            let mut response = endpoint
                .http
                .post(&url)
                .bearer_auth(token)
                .json(&body)
                .send()
                .await
                .map_err(|e| send_error(&e))?;
            let status = response.status();
            let bytes = super::read_capped(&mut response, MAX_ANSWER_BYTES)
                .await
                .map_err(|e| match e {
                    super::CappedRead::TooLarge => RunnerError::BadAnswer(format!(
                        "answer larger than {MAX_ANSWER_BYTES} bytes"
                    )),
                    super::CappedRead::Failed(e) => RunnerError::Unreachable(error_chain(&e)),
                })?;
            if !status.is_success() {
                let message = serde_json::from_slice::<Value>(&bytes)
                    .ok()
                    .and_then(|v| v.get("error").and_then(Value::as_str).map(str::to_owned))
                    .unwrap_or_else(|| String::from_utf8_lossy(&bytes).chars().take(300).collect());
                return Err(RunnerError::Refused {
                    status: status.as_u16(),
                    message,
                });
            }
            match serde_json::from_slice::<CallResponse>(&bytes) {
                Ok(CallResponse::Ok {
                    output,
                    truncated,
                    duration_ms,
                    vars,
                    seal,
                }) => Ok(RunnerAnswer {
                    output,
                    truncated,
                    duration_ms,
                    vars,
                    seal,
                }),
                Ok(CallResponse::Failed { error, .. }) => Err(RunnerError::ActionFailed(error)),
                Err(e) => Err(RunnerError::BadAnswer(e.to_string())),
            }
        };
        tokio::time::timeout(deadline, send)
            .await
            .unwrap_or(Err(RunnerError::Timeout(deadline)))
    }
}
