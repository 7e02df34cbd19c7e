//! The server's side of a runner call: sign, send, wait at most the deadline, read the answer.
//!
//! Invariant: what a [`RunnerError`] displays is all an agent ever reads of a failed call: a
//! stable [`RunnerError::kind`] and a short reason. A runner's raw answer body and the
//! transport's errors (which name hosts, addresses and certificates of whatever the URL
//! reaches) stay in [`RunnerError::detail`], for the server's log and for admins. Only a
//! runner's own structured refusal (`{"error": "…"}`, which our runner writes, such as "not
//! in this runner's allowlist") reaches the agent, and only as [`clean_line`] makes it: one
//! line of at most [`MAX_REASON_CHARS`] characters with no control or invisible characters.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};

use crate::protocol::approval::ApprovalProof;
use crate::protocol::signing::{CallClaims, CallSigner, ISSUER, Purpose, TOKEN_LIFETIME, now};
use crate::protocol::{CallRequest, CallResponse, Mode};
use crate::server::config::RunnerEntry;
use crate::util::error_chain;

/// The most bytes the server reads from one runner answer.
const MAX_ANSWER_BYTES: usize = 8 * 1024 * 1024;

/// The most characters of a runner's own refusal or action error an agent reads.
pub(crate) const MAX_REASON_CHARS: usize = 300;
/// The most characters of an operator's detail (a raw body, a transport error) kept.
const MAX_DETAIL_CHARS: usize = 1000;
/// The most characters of an action's error (written by the runner about its service) kept.
const MAX_ACTION_ERROR_CHARS: usize = 4000;

/// Why one runner call failed. The `Display` text is what the agent reads; `detail` fields
/// are for the server's log and admins only (see the module's invariant).
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum RunnerError {
    /// The connection failed (refused, reset, DNS, a TLS handshake that did not complete).
    #[error("runner unreachable: the connection failed (the server's log has the details)")]
    Unreachable { detail: String },
    /// The runner's TLS identity is not the one it is trusted as (e.g. not its pinned
    /// certificate). Nothing was sent; retrying would not help.
    #[error(
        "runner not trusted: it did not present the TLS identity it is trusted as, so nothing was sent (the server's log has the details)"
    )]
    Untrusted { detail: String },
    #[error("runner did not answer within {} ms", .0.as_millis())]
    Timeout(Duration),
    /// A non-2xx answer. `reason` is the runner's own `{"error": …}`, cleaned; anything else
    /// the body held is only in `detail`.
    #[error("runner refused the call (HTTP {status}){}", .reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default())]
    Refused {
        status: u16,
        reason: Option<String>,
        detail: String,
    },
    /// The runner ran the action and it failed: the runner's words about its service, cleaned.
    #[error("{0}")]
    ActionFailed(String),
    #[error("runner sent an answer emisar cannot read (the server's log has the details)")]
    BadAnswer { detail: String },
    /// Not called: the runner's breaker is open. The text is built from agent-safe reasons.
    #[error("{0}")]
    CircuitOpen(String),
}

impl RunnerError {
    /// A stable, machine-readable name for this failure (documented in docs/agent-guide.md).
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            RunnerError::Unreachable { .. } => "runner_unreachable",
            RunnerError::Untrusted { .. } => "runner_untrusted",
            RunnerError::Timeout(_) => "runner_timeout",
            RunnerError::Refused { .. } => "runner_refused",
            RunnerError::ActionFailed(_) => "action_failed",
            RunnerError::BadAnswer { .. } => "runner_bad_answer",
            RunnerError::CircuitOpen(_) => "circuit_open",
        }
    }

    /// The failure as operators read it (the server's log, `last_error` for admins): the
    /// agent's text and what lies behind it, cleaned of control characters and bounded.
    pub(crate) fn detail(&self) -> String {
        match self {
            RunnerError::Unreachable { detail }
            | RunnerError::Untrusted { detail }
            | RunnerError::BadAnswer { detail }
            | RunnerError::Refused { detail, .. } => format!("{self}: {detail}"),
            RunnerError::Timeout(_)
            | RunnerError::ActionFailed(_)
            | RunnerError::CircuitOpen(_) => self.to_string(),
        }
    }
}

/// `text` as one line an agent or a log may show: control and invisible characters (those
/// the door refuses in text, see [`crate::util::input::refused_in_text`]) and line breaks
/// become spaces, and past `max_chars` characters it is cut with `…`.
pub(crate) fn clean_line(text: &str, max_chars: usize) -> String {
    clean(text, max_chars, |c| {
        crate::util::input::refused_in_text(c) || c.is_control()
    })
}

/// Like [`clean_line`], keeping tabs and line breaks (an action's error may quote a
/// program's output over several lines).
pub(crate) fn clean_text(text: &str, max_chars: usize) -> String {
    clean(text, max_chars, crate::util::input::refused_in_text)
}

fn clean(text: &str, max_chars: usize, refused: impl Fn(char) -> bool) -> String {
    let mut out: String = text
        .chars()
        .take(max_chars)
        .map(|c| if refused(c) { ' ' } else { c })
        .collect();
    if text.chars().nth(max_chars).is_some() {
        out.push('…');
    }
    out
}

/// What the operator reads of a transport error (never the agent).
fn detail_of(e: &reqwest::Error) -> String {
    clean_line(&error_chain(e), MAX_DETAIL_CHARS)
}

/// A non-2xx answer: the runner's own `{"error": "…"}`, cleaned, for the agent; the body as
/// it came (cleaned and bounded) for the operator.
fn refusal(status: u16, body: &[u8]) -> RunnerError {
    let reason = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v.get("error").and_then(Value::as_str).map(str::to_owned))
        .map(|r| clean_line(&r, MAX_REASON_CHARS));
    RunnerError::Refused {
        status,
        reason,
        detail: format!(
            "body: {}",
            clean_line(&String::from_utf8_lossy(body), MAX_DETAIL_CHARS)
        ),
    }
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
#[derive(Clone, Copy)]
pub(crate) struct Dispatch<'a> {
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
    /// People's signatures over the approved request's statement, when it is signed.
    pub approval: Option<&'a ApprovalProof>,
    /// The approval's event with its inclusion proof in a witnessed checkpoint, for runners
    /// that require it.
    pub witnessed: Option<&'a crate::protocol::witnessed::WitnessedApproval>,
    /// The salt of the secret params' commitments in the signed arguments.
    pub secret_salt: Option<&'a str>,
    /// The rollout wave this execution runs in.
    pub wave: Option<u32>,
    /// People's decision to resume or retry the halted rollout this execution continues.
    pub decision: Option<&'a crate::protocol::approval::DecisionProof>,
    /// People's grant this execution runs under instead of an approval.
    pub grant: Option<&'a crate::protocol::approval::grant::GrantProof>,
}

impl<'a> Dispatch<'a> {
    /// A call of `tool` from the pack whose digest is `pack_sha256`, in `mode`, with nothing
    /// that carries it further: no preview values, no approval (signed or witnessed), no lowering, shaped output.
    /// A caller adds what it has with `Dispatch { raw, .., ..Dispatch::new(…) }`.
    pub(crate) fn new(
        call_id: &'a str,
        tool: &'a str,
        pack_sha256: &'a str,
        args: &'a Map<String, Value>,
        mode: Mode,
    ) -> Self {
        Dispatch {
            call_id,
            tool,
            pack_sha256,
            args,
            mode,
            preview: None,
            preview_seal: None,
            raw: false,
            approval_id: None,
            lowered_by_policy: None,
            approval: None,
            witnessed: None,
            secret_salt: None,
            wave: None,
            decision: None,
            grant: None,
        }
    }
}

/// A runner as the server reaches it: its entry and the HTTP client that trusts exactly that
/// runner (its pinned certificate, or the runner CA), with its own pool of connections.
#[derive(Clone)]
pub(crate) struct Endpoint {
    pub entry: RunnerEntry,
    pub http: reqwest::Client,
}

/// Signs calls; each runner's own client (in its [`Endpoint`]) sends them.
#[derive(Clone)]
pub(crate) struct RunnerClient {
    signer: Arc<CallSigner>,
}

/// What a failed send says to operators, with a pinned certificate's mismatch spelled out.
pub(crate) fn describe_send_error(e: &reqwest::Error) -> String {
    match super::tls::pin_mismatch(e) {
        Some(mismatch) => clean_line(&mismatch.to_string(), MAX_DETAIL_CHARS),
        None => detail_of(e),
    }
}

fn send_error(e: &reqwest::Error) -> RunnerError {
    match super::tls::pin_mismatch(e) {
        Some(mismatch) => RunnerError::Untrusted {
            detail: clean_line(&mismatch.to_string(), MAX_DETAIL_CHARS),
        },
        None => RunnerError::Unreachable {
            detail: detail_of(e),
        },
    }
}

impl RunnerClient {
    pub(crate) fn new(signer: Arc<CallSigner>) -> Self {
        RunnerClient { signer }
    }

    pub(crate) async fn call(
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
            approval: d.approval.cloned(),
            witnessed: d.witnessed.cloned(),
            secret_salt: d.secret_salt.map(str::to_owned),
            wave: d.wave,
            decision: d.decision.cloned(),
            grant: d.grant.cloned(),
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
            .map_err(|e| RunnerError::Unreachable {
                detail: format!("could not sign the call: {e:#}"),
            })?;
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
                    super::CappedRead::TooLarge => RunnerError::BadAnswer {
                        detail: format!("answer larger than {MAX_ANSWER_BYTES} bytes"),
                    },
                    super::CappedRead::Failed(e) => RunnerError::Unreachable {
                        detail: detail_of(&e),
                    },
                })?;
            if !status.is_success() {
                return Err(refusal(status.as_u16(), &bytes));
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
                Ok(CallResponse::Failed { error, .. }) => Err(RunnerError::ActionFailed(
                    clean_text(&error, MAX_ACTION_ERROR_CHARS),
                )),
                Err(e) => Err(RunnerError::BadAnswer {
                    detail: clean_line(&e.to_string(), MAX_DETAIL_CHARS),
                }),
            }
        };
        tokio::time::timeout(deadline, send)
            .await
            .unwrap_or(Err(RunnerError::Timeout(deadline)))
    }

    /// Tells `runner` that `grants` are revoked (`POST /v1/grants/revoked`, a revocation
    /// token for it, no body); Ok once it answered 2xx.
    pub(crate) async fn revoke(
        &self,
        runner: &str,
        endpoint: &Endpoint,
        grants: Vec<crate::protocol::signing::RevokedGrant>,
        deadline: Duration,
    ) -> Result<(), RunnerError> {
        let claims = crate::protocol::signing::RevokeClaims::for_runner(runner, grants);
        let token = self
            .signer
            .sign(&claims)
            .map_err(|e| RunnerError::Unreachable {
                detail: format!("could not sign the revocation: {e:#}"),
            })?;
        let url = format!(
            "{}/v1/grants/revoked",
            endpoint.entry.url.trim_end_matches('/')
        );
        let send = async {
            let mut response = endpoint
                .http
                .post(&url)
                .bearer_auth(token)
                .send()
                .await
                .map_err(|e| send_error(&e))?;
            let status = response.status();
            let bytes = super::read_capped(&mut response, MAX_ANSWER_BYTES)
                .await
                .map_err(|_| RunnerError::BadAnswer {
                    detail: "the revocation's answer could not be read".into(),
                })?;
            if status.is_success() {
                Ok(())
            } else {
                Err(refusal(status.as_u16(), &bytes))
            }
        };
        tokio::time::timeout(deadline, send)
            .await
            .unwrap_or(Err(RunnerError::Timeout(deadline)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agents_read_a_runners_own_refusal_cleaned_and_never_a_raw_body() {
        let page = refusal(502, b"<html>internal.corp\x1b[31m secret</html>");
        assert_eq!(page.to_string(), "runner refused the call (HTTP 502)");
        assert_eq!(page.kind(), "runner_refused");
        assert!(page.detail().contains("internal.corp"), "{}", page.detail());
        assert!(!page.detail().contains('\u{1b}'), "{}", page.detail());

        let long = format!(
            r#"{{"error": "not in allowlist\u202e\u0007\nnext line {}"}}"#,
            "x".repeat(1000)
        );
        let shown = refusal(403, long.as_bytes()).to_string();
        assert!(
            shown.starts_with("runner refused the call (HTTP 403): not in allowlist   next line x"),
            "{shown}"
        );
        assert!(shown.ends_with('…'), "{shown}");
        assert_eq!(
            shown.chars().count(),
            "runner refused the call (HTTP 403): ".len() + MAX_REASON_CHARS + 1
        );

        let unreachable = RunnerError::Unreachable {
            detail: "error sending request for url (https://10.0.0.1/v1/call)".into(),
        };
        assert!(!unreachable.to_string().contains("10.0.0.1"));
        assert!(unreachable.detail().contains("10.0.0.1"));
        assert_eq!(unreachable.kind(), "runner_unreachable");
    }

    #[test]
    fn action_errors_keep_their_lines_and_lose_control_characters() {
        assert_eq!(clean_text("a\nb\tc\u{7}d\u{202e}", 100), "a\nb\tc d ");
        assert_eq!(clean_line("a\nb\tc", 100), "a b c");
        assert_eq!(clean_line("abcdef", 3), "abc…");
    }
}
