//! Steps 6 and 7: dispatch to one runner through its breaker (a read that could not reach
//! its runner may be retried once, within the retry budget; writes never are), and the
//! audited outcome of each runner: for a write one append per outcome as it lands (its
//! intent is already durable); for a read one append of the intent and every outcome.

use std::time::Instant;

use serde_json::{Value, json};

use super::outcome::RunnerResult;
use super::state::Gateway;
use crate::digest::json_digest;
use crate::pack::{Risk, ToolRef};
use crate::protocol::Mode;
use crate::server::audit::{NewEvent, kind};
use crate::server::runners::client::{Dispatch, RunnerAnswer, RunnerError};
use crate::server::runners::registry::rejection_message;

impl Gateway {
    /// One runner, through its breaker; a read that could not reach the runner is retried
    /// once if the retry budget allows. Writes are never retried.
    pub(super) async fn dispatch_one(
        &self,
        name: &str,
        tool: &ToolRef,
        d: &Dispatch<'_>,
    ) -> Result<RunnerAnswer, RunnerError> {
        let Some(endpoint) = self.runners.endpoint(name) else {
            return Err(RunnerError::Unreachable {
                detail: format!("runner `{name}` is not configured"),
            });
        };
        self.retry_budget.deposit();
        let mut attempt = 0;
        loop {
            if let Err(rejection) = self.runners.admit(name) {
                return Err(RunnerError::CircuitOpen(rejection_message(&rejection)));
            }
            let _permit = self
                .in_flight
                .acquire()
                .await
                .expect("the semaphore is never closed");
            let answer = self
                .client
                .call(name, &endpoint, d, self.limits.call_timeout)
                .await;
            match &answer {
                // A health gate asks again while the service comes back: one try that fails is
                // expected, and the gate says once, at WARN, if none passed.
                Err(e) if d.mode == Mode::Verify => {
                    tracing::debug!(runner = name, tool = d.tool, call_id = d.call_id,
                        error_kind = e.kind(), detail = %e.detail(), "a health gate's try failed");
                }
                // The agent reads a kind and a short reason; the operator reads this.
                Err(e) => {
                    tracing::warn!(runner = name, tool = d.tool, call_id = d.call_id,
                        error_kind = e.kind(), detail = %e.detail(), "runner call failed");
                }
                Ok(_) => {}
            }
            let runner_failure = match &answer {
                Err(
                    e @ (RunnerError::Unreachable { .. }
                    | RunnerError::Untrusted { .. }
                    | RunnerError::Timeout(_)
                    | RunnerError::BadAnswer { .. }),
                ) => Some(e),
                Err(e @ RunnerError::Refused { status, .. }) if *status >= 500 => Some(e),
                _ => None,
            };
            self.runners.record(name, runner_failure);
            let retryable = matches!(answer, Err(RunnerError::Unreachable { .. }));
            if retryable
                && attempt == 0
                && tool.risk == Risk::Read
                && self.retry_budget.try_withdraw()
            {
                attempt += 1;
                continue;
            }
            return answer;
        }
    }

    /// Step 6 and 7 for one runner: the call through [`Self::dispatch_one`], then its audited
    /// outcome (`call.executed` or `call.failed`). A result whose outcome could not be
    /// recorded is withheld.
    pub(super) async fn run_on(
        &self,
        name: &str,
        tool: &ToolRef,
        dispatch: &Dispatch<'_>,
        audited: &AuditedCall<'_>,
    ) -> RunnerResult {
        let answered = self.answer_of(name, tool, dispatch).await;
        let event = answered.outcome_event(name, audited);
        if self
            .audit
            .append(event)
            .await
            .inspect_err(|e| {
                tracing::error!(error = %e, tool = audited.tool, runner = name, call_id = audited.call_id, "could not audit a call outcome");
            })
            .is_err()
        {
            // The store's error is in the server's log, not in the answer.
            return withheld(answered.result);
        }
        answered.result
    }

    /// Steps 5 to 7 for a read, which has no side effect: every target at once, then the
    /// call's `intent` and every runner's outcome in one durable append (one transaction:
    /// all or none), and only then the results. If that append fails, every result is
    /// withheld and the log holds nothing of the call.
    pub(super) async fn read_on_all(
        &self,
        tool: &ToolRef,
        dispatch: &Dispatch<'_>,
        targets: &[String],
        audited: &AuditedCall<'_>,
        intent: NewEvent,
    ) -> Vec<RunnerResult> {
        let answered = futures::future::join_all(
            targets
                .iter()
                .map(|name| self.answer_of(name, tool, dispatch)),
        )
        .await;
        let mut events = Vec::with_capacity(1 + answered.len());
        events.push(intent);
        events.extend(
            targets
                .iter()
                .zip(&answered)
                .map(|(name, a)| a.outcome_event(name, audited)),
        );
        let size = events.len();
        let recorded = self.audit.append_all(events).await;
        let results = answered.into_iter().map(|a| a.result);
        match recorded {
            Ok(_) => {
                self.read_failures.written();
                results.collect()
            }
            Err(e) => {
                // While the store is down every read fails here: one line per failure was
                // thousands a minute, so the first is logged, then a summary every 10 s.
                tracing::debug!(error = %e, tool = audited.tool, call_id = audited.call_id, runners = targets.len(), "could not audit a read and its outcomes");
                self.read_failures.failed(size, &e.to_string());
                results.map(withheld).collect()
            }
        }
    }

    /// Step 6 for one runner: its answer as the agent will read it, with what operators read
    /// of a failure.
    async fn answer_of(&self, name: &str, tool: &ToolRef, dispatch: &Dispatch<'_>) -> Answered {
        let started = Instant::now();
        let answer = self.dispatch_one(name, tool, dispatch).await;
        let elapsed = started.elapsed();
        // What operators read of a failure; the agent reads `result.error` alone.
        let error_detail = answer.as_ref().err().map(RunnerError::detail);
        let result = to_result(name, answer, elapsed.as_millis() as u64);
        crate::server::metrics::runner_call(
            dispatch.tool,
            name,
            if result.ok { "ok" } else { "error" },
            elapsed.as_secs_f64(),
        );
        Answered {
            result,
            error_detail,
        }
    }
}

/// One runner's answer, before its outcome is recorded.
struct Answered {
    result: RunnerResult,
    /// What operators read of a failure, when there is more than the agent's `error`.
    error_detail: Option<String>,
}

impl Answered {
    /// Step 7: the outcome's event (`call.executed` or `call.failed`). The audit keeps what
    /// the agent read (`error`, `error_kind`) and, when there is more behind it, the
    /// operator's `error_detail` (cleaned and bounded like the log's): the audit log is read
    /// by auditors and admins, never by agents.
    fn outcome_event(&self, runner: &str, r: &AuditedCall<'_>) -> NewEvent {
        let result = &self.result;
        let (kind, outcome) = if result.ok {
            (kind::CALL_EXECUTED, "ok")
        } else {
            (kind::CALL_FAILED, "error")
        };
        let mut detail =
            super::call::on_behalf_of(json!({"duration_ms": result.duration_ms}), r.on_behalf_of);
        if let Some(e) = &result.error {
            detail["error"] = json!(e);
        }
        if let Some(kind) = &result.error_kind {
            detail["error_kind"] = json!(kind);
        }
        if let Some(d) = self
            .error_detail
            .as_deref()
            .filter(|d| Some(*d) != result.error.as_deref())
        {
            detail["error_detail"] = json!(d);
        }
        if let Some(output) = &result.output {
            let text = output.to_string();
            detail["excerpt"] = json!(text.chars().take(500).collect::<String>());
        }
        NewEvent {
            actor: r.actor.to_owned(),
            kind: kind.into(),
            tool: Some(r.tool.to_owned()),
            runner: Some(runner.to_owned()),
            args: Some(r.args.clone()),
            reason: r.reason.map(str::to_owned),
            call_id: Some(r.call_id.to_owned()),
            approval_id: r.approval_id.map(str::to_owned),
            outcome: Some(outcome.into()),
            result_digest: result.output.as_ref().map(json_digest),
            detail: Some(detail),
        }
    }
}

/// A result whose outcome could not be recorded: the agent reads that it ran, not what it
/// answered.
fn withheld(result: RunnerResult) -> RunnerResult {
    let name = &result.runner;
    RunnerResult {
        ok: false,
        output: None,
        truncated: false,
        error_kind: Some("outcome_not_recorded".into()),
        error: Some(format!(
            "the call ran on `{name}`, but its outcome could not be recorded (the server's log has the details); the result is withheld"
        )),
        ..result
    }
}

fn to_result(
    runner: &str,
    answer: Result<RunnerAnswer, RunnerError>,
    elapsed_ms: u64,
) -> RunnerResult {
    match answer {
        Ok(a) => RunnerResult {
            runner: runner.to_owned(),
            ok: true,
            output: Some(a.output),
            truncated: a.truncated,
            error: None,
            error_kind: None,
            duration_ms: elapsed_ms,
        },
        Err(e) => RunnerResult {
            runner: runner.to_owned(),
            ok: false,
            output: None,
            truncated: false,
            error: Some(e.to_string()),
            error_kind: Some(e.kind().into()),
            duration_ms: elapsed_ms,
        },
    }
}

/// A call as its audit events name it: who, what and why, under which ids, for whom. Its
/// intent, each runner's outcome and each step of its rollout are built from it.
pub(super) struct AuditedCall<'a> {
    pub(super) actor: &'a str,
    pub(super) tool: &'a str,
    pub(super) args: &'a Value,
    pub(super) reason: Option<&'a str>,
    pub(super) call_id: &'a str,
    pub(super) approval_id: Option<&'a str>,
    /// The person the calling agent acts for, named in every event of the call.
    pub(super) on_behalf_of: Option<&'a str>,
}

impl AuditedCall<'_> {
    /// A step of the call's rollout (`rollout.wave`, `.gate`, `.halted`), by the system, for
    /// this call (and its request).
    pub(super) fn rollout_event(
        &self,
        kind: &str,
        runner: Option<&str>,
        detail: Value,
    ) -> NewEvent {
        NewEvent {
            actor: super::approval_flow::ROLLOUT_ACTOR.into(),
            kind: kind.into(),
            tool: Some(self.tool.to_owned()),
            runner: runner.map(str::to_owned),
            args: Some(self.args.clone()),
            reason: self.reason.map(str::to_owned),
            call_id: Some(self.call_id.to_owned()),
            approval_id: self.approval_id.map(str::to_owned),
            detail: Some(super::call::on_behalf_of(detail, self.on_behalf_of)),
            ..Default::default()
        }
    }

    /// The call's `tool.called` (step 5), the one place it is built: who, what and why, and
    /// in its detail where the call goes and `how` it runs (the keys of that object: lowered
    /// by the policy, or waiting for approval and from how many people).
    pub(super) fn tool_called(
        &self,
        runners: &[String],
        runner_chosen_by_server: bool,
        how: Value,
    ) -> NewEvent {
        let mut detail =
            json!({"runners": runners, "runner_chosen_by_server": runner_chosen_by_server});
        if let (Some(detail), Value::Object(how)) = (detail.as_object_mut(), how) {
            detail.extend(how);
        }
        NewEvent {
            actor: self.actor.to_owned(),
            kind: kind::TOOL_CALLED.into(),
            tool: Some(self.tool.to_owned()),
            args: Some(self.args.clone()),
            reason: self.reason.map(str::to_owned),
            call_id: Some(self.call_id.to_owned()),
            approval_id: self.approval_id.map(str::to_owned),
            detail: Some(super::call::on_behalf_of(detail, self.on_behalf_of)),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both paths' intent has one shape: where the call goes, how it runs, and for whom.
    #[test]
    fn tool_called_holds_where_how_and_for_whom() {
        let args = json!({"unit": "consul"});
        let audited = AuditedCall {
            actor: "agent:bot",
            tool: "linux.systemctl_restart",
            args: &args,
            reason: Some("stuck"),
            call_id: "c1",
            approval_id: Some("a1"),
            on_behalf_of: Some("person:alice"),
        };
        let runners = ["n1".to_owned(), "n2".to_owned()];
        let how = json!({"needs_approval": true, "approvers": 2, "signed": false});
        let event = audited.tool_called(&runners, false, how);
        assert_eq!(event.kind, kind::TOOL_CALLED);
        assert_eq!(event.args, Some(args.clone()));
        assert_eq!(event.reason.as_deref(), Some("stuck"));
        assert_eq!(event.call_id.as_deref(), Some("c1"));
        assert_eq!(
            event.approval_id.as_deref(),
            Some("a1"),
            "found by its request"
        );
        assert_eq!(
            event.detail,
            Some(
                json!({"runners": ["n1", "n2"], "runner_chosen_by_server": false,
                        "needs_approval": true, "approvers": 2, "signed": false,
                        "on_behalf_of": "person:alice"})
            )
        );
        let lowered = AuditedCall {
            on_behalf_of: None,
            ..audited
        }
        .tool_called(&runners[..1], true, json!({"lowered_by_policy": "abc"}));
        assert_eq!(
            lowered.detail,
            Some(json!({"runners": ["n1"], "runner_chosen_by_server": true,
                        "lowered_by_policy": "abc"}))
        );
    }
}
