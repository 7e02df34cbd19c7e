//! The call path. Every tool call takes this one route, in this order:
//!
//! 1. **find** the tool (a tool the caller may not use is reported as unknown);
//! 2. **rate limit** the agent (a token bucket on a monotonic clock);
//! 3. **validate** the arguments against the tool's input schema, and `runners` against the
//!    runners that serve the tool's pack (rejections are audited as `tool.rejected`);
//! 4. **policy** (`policy::decide`, pure): reads run, writes are refused for now (audited);
//! 5. **audit intent** (`tool.called`): durable before anything runs, or nothing runs;
//! 6. **dispatch** to every named runner in parallel, each with its own deadline, through its
//!    circuit breaker; a read that could not reach its runner may be retried once, within
//!    the retry budget; writes never are;
//! 7. **audit outcome** per runner (`call.executed` / `call.failed`);
//! 8. hand the per-runner results back.
//!
//! Invariant: no runner is called for a call whose intent is not in the audit log.

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use serde::Serialize;
use serde_json::{Map, Value, json};
use tokio::sync::Semaphore;

use crate::audit::{AuditError, AuditLog, NewEvent, kind};
use crate::digest::json_digest;
use crate::pack::{PackSet, Risk, Scope, ToolRef};
use crate::policy::{self, Decision, Policy};
use crate::runner::Mode;
use crate::runner::RetryBudget;
use crate::runner::client::{Dispatch, RunnerAnswer, RunnerClient, RunnerError};
use crate::runner::registry::{Registry, rejection_message};
use crate::secrets::AuditKey;
use crate::selector::Selector;
use crate::tokens::Principal;

/// The built-in tool that shows runner health to agents.
pub const RUNNERS_TOOL: &str = "emisar.runners";
/// The most runner calls in flight at once, across all tool calls of this server.
const MAX_IN_FLIGHT: usize = 256;

/// A tool as the gateway offers it: the pack tool plus its full input schema.
pub struct OfferedTool {
    /// The pack tool; `None` for emisar's own built-in tools.
    pub tool: Option<ToolRef>,
    pub name: String,
    pub description: String,
    pub risk: Risk,
    /// Pack params + `runners` + `reason` (+ `raw`): the MCP input schema.
    pub input_schema: Map<String, Value>,
    validator: jsonschema::Validator,
}

/// A call as the MCP adapter hands it over.
#[derive(Debug, Clone)]
pub struct ToolCall {
    pub principal: Principal,
    pub tool: String,
    pub args: Map<String, Value>,
}

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
}

#[derive(Debug, Clone, Serialize)]
pub struct CallOutcome {
    pub call_id: String,
    pub tool: String,
    /// True when the server chose the runner (cluster-scoped tool called without `runners`).
    pub runner_chosen_by_server: bool,
    pub results: Vec<RunnerResult>,
}

impl CallOutcome {
    pub fn all_failed(&self) -> bool {
        !self.results.is_empty() && self.results.iter().all(|r| !r.ok)
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct RunnerResult {
    pub runner: String,
    pub ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub duration_ms: u64,
}

/// How the gateway is tuned; all of it comes from the server config.
pub struct Limits {
    /// Each runner's deadline for one call.
    pub call_timeout: Duration,
    pub rate_per_second: u32,
    pub rate_burst: u32,
}

pub struct Gateway {
    packs: Arc<PackSet>,
    tools: BTreeMap<String, OfferedTool>,
    runners: Arc<Registry>,
    audit: AuditLog,
    client: RunnerClient,
    limits: Limits,
    limiter: DefaultKeyedRateLimiter<String>,
    retry_budget: RetryBudget,
    in_flight: Semaphore,
    audit_key: Option<AuditKey>,
}

impl Gateway {
    pub fn new(
        packs: Arc<PackSet>,
        runners: Arc<Registry>,
        audit: AuditLog,
        client: RunnerClient,
        limits: Limits,
        audit_key: Option<AuditKey>,
    ) -> anyhow::Result<Self> {
        let mut tools = BTreeMap::new();
        for tool in packs.tools() {
            if audit_key.is_none() && tool.secret_params().next().is_some() {
                anyhow::bail!(
                    "tool `{}` has secret params, which the audit log stores as a keyed HMAC: set audit_key_file",
                    tool.name
                );
            }
            let input_schema = crate::pack::input_schema(tool);
            tools.insert(
                tool.name.clone(),
                offered(
                    Some(tool.clone()),
                    &tool.name,
                    &tool.description,
                    tool.risk,
                    input_schema,
                )?,
            );
        }
        let mut schema = Map::new();
        schema.insert("type".into(), json!("object"));
        schema.insert(
            "properties".into(),
            json!({"reason": {"type": "string", "minLength": 1, "maxLength": 2000, "pattern": "\\S",
                               "description": "Why you are asking. Recorded in the audit log."}}),
        );
        schema.insert("required".into(), json!(["reason"]));
        schema.insert("additionalProperties".into(), json!(false));
        tools.insert(
            RUNNERS_TOOL.into(),
            offered(
                None,
                RUNNERS_TOOL,
                "emisar's runners and their health: breaker state (closed, half-open, open) and since when, last heartbeat, last call, last error.",
                Risk::Read,
                schema,
            )?,
        );
        let quota =
            Quota::per_second(NonZeroU32::new(limits.rate_per_second.max(1)).expect("max(1)"))
                .allow_burst(NonZeroU32::new(limits.rate_burst.max(1)).expect("max(1)"));
        Ok(Gateway {
            packs,
            tools,
            runners,
            audit,
            client,
            limiter: RateLimiter::keyed(quota),
            limits,
            retry_budget: RetryBudget::new(0.1, 10.0),
            in_flight: Semaphore::new(MAX_IN_FLIGHT),
            audit_key,
        })
    }

    /// The tools `caller` may see. (Every caller sees every tool until tokens carry scopes.)
    pub fn tools_for(&self, _caller: &Principal) -> impl Iterator<Item = &OfferedTool> {
        self.tools.values()
    }

    pub fn tool_for(&self, _caller: &Principal, name: &str) -> Option<&OfferedTool> {
        self.tools.get(name)
    }

    /// The input schema `caller` sees for `offered`: pack tools list the runners it may name.
    pub fn schema_for(&self, caller: &Principal, offered: &OfferedTool) -> Map<String, Value> {
        match &offered.tool {
            Some(tool) => crate::pack::with_runner_names(
                offered.input_schema.clone(),
                &self
                    .runners
                    .serving_sorted(&tool.pack, caller.selector.as_ref()),
            ),
            None => offered.input_schema.clone(),
        }
    }

    /// A tool by name, whoever asks (for schema lookups, not for authorization).
    pub fn tool(&self, name: &str) -> Option<&OfferedTool> {
        self.tools.get(name)
    }

    pub fn audit(&self) -> &AuditLog {
        &self.audit
    }

    pub fn runners(&self) -> &Arc<Registry> {
        &self.runners
    }

    pub async fn call(&self, call: ToolCall) -> Result<CallOutcome, CallError> {
        let actor = call.principal.actor();
        let Some(offered) = self.tool_for(&call.principal, &call.tool) else {
            self.reject(
                &actor,
                &call.tool,
                None,
                None,
                format!("unknown tool `{}`", call.tool),
            )
            .await;
            return Err(CallError::UnknownTool(call.tool));
        };

        // 2. Rate limit, per agent, before any work.
        if let Err(not_until) = self.limiter.check_key(&call.principal.agent) {
            let wait = not_until.wait_time_from(governor::clock::Clock::now(
                &governor::clock::DefaultClock::default(),
            ));
            crate::metrics::rate_limited(&call.principal.agent);
            let err = CallError::RateLimited {
                agent: call.principal.agent.clone(),
                per_second: self.limits.rate_per_second,
                burst: self.limits.rate_burst,
                retry_after_ms: wait.as_millis() as u64 + 1,
            };
            self.reject(&actor, &offered.name, None, None, err.to_string())
                .await;
            return Err(err);
        }

        // 3. Validate. The reason, runners and raw flag are split off; the rest goes to runners.
        let whole = Value::Object(call.args.clone());
        let mut errors = crate::pack::validate_args(&offered.validator, &whole)
            .err()
            .unwrap_or_default();
        let mut params = call.args.clone();
        let reason = params
            .remove("reason")
            .and_then(|v| v.as_str().map(str::to_owned));
        let raw = params
            .remove("raw")
            .and_then(|v| v.as_bool())
            .unwrap_or(false);
        let named: Vec<String> = params
            .remove("runners")
            .and_then(|v| serde_json::from_value(v).ok())
            .unwrap_or_default();
        let Some(tool) = &offered.tool else {
            return self.builtin(&call.principal, offered, reason, errors).await;
        };
        let selector = match params
            .remove("selector")
            .and_then(|v| v.as_str().map(str::to_owned))
        {
            None => None,
            Some(text) => match Selector::parse(&text) {
                Ok(sel) => Some(sel),
                Err(e) => {
                    errors.push(format!("`selector`: {e}"));
                    None
                }
            },
        };
        // The runners this caller may target: a token limited to a selector sees only those.
        let visible = |name: &str| {
            self.runners.get(name).filter(|r| {
                call.principal
                    .selector
                    .as_ref()
                    .is_none_or(|s| s.matches(&r.labels))
            })
        };
        for name in &named {
            match visible(name) {
                None => errors.push(format!("`runners`: no runner is named `{name}`")),
                Some(r) if !r.serves(&tool.pack) => errors.push(format!(
                    "`runners`: runner `{name}` does not serve pack `{}`",
                    tool.pack
                )),
                Some(_) => {}
            }
        }
        let mut targets = named.clone();
        let mut chosen = false;
        if errors.is_empty() {
            match (&selector, named.is_empty(), tool.scope) {
                (Some(_), false, _) => errors.push("give `runners` or `selector`, not both".into()),
                (Some(sel), true, scope) => {
                    let matched: Vec<String> = self
                        .runners
                        .serving(&tool.pack, Some(sel))
                        .into_iter()
                        .filter(|n| visible(n).is_some())
                        .collect();
                    if matched.is_empty() {
                        errors.push(format!(
                            "`selector`: no runner serving pack `{}` matches `{sel}`",
                            tool.pack
                        ));
                    } else if scope == Scope::Cluster {
                        targets = matched.into_iter().take(1).collect();
                        chosen = true;
                    } else {
                        targets = matched;
                    }
                }
                (None, true, Scope::Node) => errors.push(
                    "`runners`: name at least one runner, or give a `selector` such as role=edge"
                        .into(),
                ),
                (None, true, Scope::Cluster) => {
                    match self
                        .runners
                        .serving(&tool.pack, call.principal.selector.as_ref())
                        .into_iter()
                        .next()
                    {
                        Some(best) => {
                            targets = vec![best];
                            chosen = true;
                        }
                        None => errors.push(format!("no runner serves pack `{}`", tool.pack)),
                    }
                }
                (None, false, _) => {}
            }
        }
        let audited_args = self.redact(tool, &params);
        if !errors.is_empty() {
            errors.dedup();
            let message = errors.join("; ");
            self.reject(
                &actor,
                &tool.name,
                Some(audited_args),
                reason.clone(),
                message,
            )
            .await;
            return Err(CallError::Invalid {
                tool: tool.name.clone(),
                errors,
            });
        }

        // 4. Policy. Until approvals exist, a write that needs one is refused.
        let labels: Vec<(&str, BTreeMap<String, String>)> = targets
            .iter()
            .map(|n| {
                (
                    n.as_str(),
                    self.runners.get(n).map(|r| r.labels).unwrap_or_default(),
                )
            })
            .collect();
        let runners: Vec<(&str, &BTreeMap<String, String>)> =
            labels.iter().map(|(n, l)| (*n, l)).collect();
        let request = policy::Request {
            tool,
            caller: &call.principal,
            runners: &runners,
            args: &params,
        };
        let refusal = match policy::decide(&Policy::builtin(), &request) {
            Decision::Allow => None,
            Decision::Deny(why) => Some(why),
            Decision::NeedsApproval { .. } => Some(format!(
                "`{}` is a risk:{} write and needs a human's approval; this server has no approval queue yet, so it refuses every write",
                tool.name,
                tool.risk.as_str()
            )),
        };
        if let Some(why) = refusal {
            self.reject(&actor, &tool.name, Some(audited_args), reason, why.clone())
                .await;
            return Err(CallError::Denied(why));
        }

        // 5. Audit intent; fail closed.
        let call_id = uuid::Uuid::new_v4().to_string();
        self.audit
            .append(NewEvent {
                actor: actor.clone(),
                kind: kind::TOOL_CALLED.into(),
                tool: Some(tool.name.clone()),
                args: Some(audited_args.clone()),
                reason: reason.clone(),
                call_id: Some(call_id.clone()),
                detail: Some(json!({"runners": targets, "runner_chosen_by_server": chosen})),
                ..Default::default()
            })
            .await
            .map_err(CallError::AuditUnavailable)?;

        // 6. Dispatch in parallel; 7. audit each outcome as it lands.
        let pack_sha256 = &self.packs.pack(&tool.pack).expect("tool has a pack").digest;
        let dispatch = Dispatch {
            call_id: &call_id,
            tool: &tool.name,
            pack_sha256,
            args: &params,
            mode: Mode::Execute,
            preview: None,
            raw,
        };
        let results = futures::future::join_all(targets.iter().map(|name| {
            let dispatch = &dispatch;
            let (actor, reason, audited_args, call_id) = (&actor, &reason, &audited_args, &call_id);
            async move {
                let started = Instant::now();
                let answer = self.dispatch_one(name, tool, dispatch).await;
                let elapsed = started.elapsed();
                let mut result = to_result(name, answer, elapsed.as_millis() as u64);
                crate::metrics::runner_call(
                    &tool.name,
                    name,
                    if result.ok { "ok" } else { "error" },
                    elapsed.as_secs_f64(),
                );
                let recorded = self
                    .audit_outcome(actor, tool.name.as_str(), name, audited_args, reason, call_id, &result)
                    .await;
                if let Err(e) = recorded {
                    // Nothing leaves emisar that is not on the record: withhold the result.
                    result = RunnerResult {
                        ok: false,
                        output: None,
                        truncated: false,
                        error: Some(format!(
                            "the call ran on `{name}`, but its outcome could not be recorded ({e}); the result is withheld"
                        )),
                        ..result
                    };
                }
                result
            }
        }))
        .await;
        let outcome = CallOutcome {
            call_id,
            tool: tool.name.clone(),
            runner_chosen_by_server: chosen,
            results,
        };
        crate::metrics::tool_call(
            &tool.name,
            if outcome.all_failed() { "error" } else { "ok" },
        );
        Ok(outcome)
    }

    /// One runner, through its breaker; a read that could not reach the runner is retried
    /// once if the retry budget allows. Writes are never retried.
    async fn dispatch_one(
        &self,
        name: &str,
        tool: &ToolRef,
        d: &Dispatch<'_>,
    ) -> Result<RunnerAnswer, RunnerError> {
        let Some(entry) = self.runners.get(name) else {
            return Err(RunnerError::Unreachable(format!(
                "runner `{name}` is not configured"
            )));
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
                .call(name, &entry.url, d, self.limits.call_timeout)
                .await;
            let runner_failure = match &answer {
                Err(
                    e @ (RunnerError::Unreachable(_)
                    | RunnerError::Timeout(_)
                    | RunnerError::BadAnswer(_)),
                ) => Some(e.to_string()),
                Err(RunnerError::Refused { status, message }) if *status >= 500 => {
                    Some(format!("HTTP {status}: {message}"))
                }
                _ => None,
            };
            self.runners.record(name, runner_failure.as_deref());
            let retryable = matches!(answer, Err(RunnerError::Unreachable(_)));
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

    async fn builtin(
        &self,
        principal: &Principal,
        offered: &OfferedTool,
        reason: Option<String>,
        errors: Vec<String>,
    ) -> Result<CallOutcome, CallError> {
        let actor = principal.actor();
        if !errors.is_empty() {
            self.reject(&actor, &offered.name, None, reason, errors.join("; "))
                .await;
            return Err(CallError::Invalid {
                tool: offered.name.clone(),
                errors,
            });
        }
        let call_id = uuid::Uuid::new_v4().to_string();
        // A token limited to a selector sees only its runners, here as everywhere.
        let visible: Vec<_> = self
            .runners
            .snapshot()
            .into_iter()
            .filter(|r| {
                principal
                    .selector
                    .as_ref()
                    .is_none_or(|s| s.matches(&r.labels))
            })
            .collect();
        let output = serde_json::to_value(visible).expect("runner status is JSON");
        self.audit
            .append(NewEvent {
                actor,
                kind: kind::TOOL_CALLED.into(),
                tool: Some(offered.name.clone()),
                args: Some(json!({})),
                reason,
                call_id: Some(call_id.clone()),
                outcome: Some("ok".into()),
                result_digest: Some(json_digest(&output)),
                ..Default::default()
            })
            .await
            .map_err(CallError::AuditUnavailable)?;
        Ok(CallOutcome {
            call_id,
            tool: offered.name.clone(),
            runner_chosen_by_server: false,
            results: vec![RunnerResult {
                runner: "emisar".into(),
                ok: true,
                output: Some(output),
                truncated: false,
                error: None,
                duration_ms: 0,
            }],
        })
    }

    async fn reject(
        &self,
        actor: &str,
        tool: &str,
        args: Option<Value>,
        reason: Option<String>,
        why: String,
    ) {
        crate::metrics::tool_call(tool, "refused");
        let event = NewEvent {
            actor: actor.to_owned(),
            kind: kind::TOOL_REJECTED.into(),
            tool: Some(tool.to_owned()),
            args,
            reason,
            outcome: Some("refused".into()),
            detail: Some(json!({"error": why})),
            ..Default::default()
        };
        if let Err(e) = self.audit.append(event).await {
            // The call is refused either way; the missing record is itself worth an alarm.
            tracing::error!(error = %e, tool, "could not audit a rejected call");
        }
    }

    #[expect(
        clippy::too_many_arguments,
        reason = "one audit event's fields, all needed"
    )]
    async fn audit_outcome(
        &self,
        actor: &str,
        tool: &str,
        runner: &str,
        args: &Value,
        reason: &Option<String>,
        call_id: &str,
        result: &RunnerResult,
    ) -> Result<(), AuditError> {
        let (kind, outcome) = if result.ok {
            (kind::CALL_EXECUTED, "ok")
        } else {
            (kind::CALL_FAILED, "error")
        };
        let mut detail = json!({"duration_ms": result.duration_ms});
        if let Some(e) = &result.error {
            detail["error"] = json!(e);
        }
        if let Some(output) = &result.output {
            let text = output.to_string();
            detail["excerpt"] = json!(text.chars().take(500).collect::<String>());
        }
        let event = NewEvent {
            actor: actor.to_owned(),
            kind: kind.into(),
            tool: Some(tool.to_owned()),
            runner: Some(runner.to_owned()),
            args: Some(args.clone()),
            reason: reason.clone(),
            call_id: Some(call_id.to_owned()),
            outcome: Some(outcome.into()),
            result_digest: result.output.as_ref().map(json_digest),
            detail: Some(detail),
            ..Default::default()
        };
        self.audit.append(event).await.map(|_| ()).inspect_err(|e| {
            tracing::error!(error = %e, tool, runner, call_id, "could not audit a call outcome");
        })
    }

    /// The arguments as the audit log keeps them: secret params as a keyed HMAC.
    fn redact(&self, tool: &ToolRef, params: &Map<String, Value>) -> Value {
        let mut out = params.clone();
        for name in tool.secret_params() {
            if let Some(value) = out.get(name) {
                let text = crate::pack::template_text(value).unwrap_or_else(|| value.to_string());
                let sealed = match &self.audit_key {
                    Some(key) => key.seal(&text),
                    // Unreachable: Gateway::new refuses secret params without a key.
                    None => "[secret]".to_owned(),
                };
                out.insert(name.to_owned(), json!(sealed));
            }
        }
        Value::Object(out)
    }
}

fn offered(
    tool: Option<ToolRef>,
    name: &str,
    description: &str,
    risk: Risk,
    input_schema: Map<String, Value>,
) -> anyhow::Result<OfferedTool> {
    let validator = crate::pack::input_validator(&input_schema)
        .map_err(|e| anyhow::anyhow!("tool `{name}`: {e}"))?;
    Ok(OfferedTool {
        tool,
        name: name.to_owned(),
        description: description.to_owned(),
        risk,
        input_schema,
        validator,
    })
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
            duration_ms: elapsed_ms,
        },
        Err(e) => RunnerResult {
            runner: runner.to_owned(),
            ok: false,
            output: None,
            truncated: false,
            error: Some(e.to_string()),
            duration_ms: elapsed_ms,
        },
    }
}
