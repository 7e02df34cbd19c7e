//! The call path. Every tool call takes this one route, in this order:
//!
//! 1. **find** the tool (a tool the caller may not use is reported as unknown);
//! 2. **validate** the arguments against the tool's input schema, and `runners` against the
//!    runners that serve the tool's pack (rejections are audited as `tool.rejected`);
//! 3. **policy** (`policy::decide`, pure): reads run, writes are refused for now (audited);
//! 4. **audit intent** (`tool.called`): durable before anything runs, or nothing runs;
//! 5. **dispatch** to every named runner in parallel, each with its own deadline;
//! 6. **audit outcome** per runner (`call.executed` / `call.failed`);
//! 7. hand the per-runner results back.
//!
//! Invariant: no runner is called for a call whose intent is not in the audit log.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::audit::{AuditError, AuditLog, NewEvent, kind};
use crate::config::RunnerEntry;
use crate::digest::json_digest;
use crate::pack::{PackSet, Scope, ToolRef};
use crate::policy::{self, Decision};
use crate::runner::Mode;
use crate::runner::client::{Dispatch, RunnerClient, RunnerError};
use crate::tokens::Principal;

/// A tool as the gateway offers it: the pack tool plus its full input schema.
pub struct OfferedTool {
    pub tool: ToolRef,
    /// Pack params + `runners` + `reason`: the MCP input schema.
    pub input_schema: Map<String, Value>,
    validator: jsonschema::Validator,
    /// Runners that serve this tool's pack, in name order.
    pub runners: Vec<String>,
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
        self.results.iter().all(|r| !r.ok)
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

pub struct Gateway {
    packs: Arc<PackSet>,
    tools: BTreeMap<String, OfferedTool>,
    runners: BTreeMap<String, RunnerEntry>,
    audit: AuditLog,
    client: RunnerClient,
    /// Each runner's deadline for one call.
    call_timeout: Duration,
}

impl Gateway {
    pub fn new(
        packs: Arc<PackSet>,
        runners: Vec<RunnerEntry>,
        audit: AuditLog,
        client: RunnerClient,
        call_timeout: Duration,
    ) -> anyhow::Result<Self> {
        let runners: BTreeMap<String, RunnerEntry> =
            runners.into_iter().map(|r| (r.name.clone(), r)).collect();
        let mut tools = BTreeMap::new();
        for tool in packs.tools() {
            let serving: Vec<String> = runners
                .values()
                .filter(|r| r.serves(&tool.pack))
                .map(|r| r.name.clone())
                .collect();
            let input_schema = crate::pack::input_schema(tool, &serving);
            let validator = crate::pack::input_validator(&input_schema)
                .map_err(|e| anyhow::anyhow!("tool `{}`: {e}", tool.name))?;
            tools.insert(
                tool.name.clone(),
                OfferedTool {
                    tool: tool.clone(),
                    input_schema,
                    validator,
                    runners: serving,
                },
            );
        }
        Ok(Gateway {
            packs,
            tools,
            runners,
            audit,
            client,
            call_timeout,
        })
    }

    /// The tools `caller` may see. (Every caller sees every tool until tokens carry scopes.)
    pub fn tools_for(&self, _caller: &Principal) -> impl Iterator<Item = &OfferedTool> {
        self.tools.values()
    }

    pub fn tool_for(&self, _caller: &Principal, name: &str) -> Option<&OfferedTool> {
        self.tools.get(name)
    }

    pub fn audit(&self) -> &AuditLog {
        &self.audit
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
        let tool = &offered.tool;

        // 2. Validate. The reason and runners are split off; the rest goes to the runners.
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
        for name in &named {
            match self.runners.get(name) {
                None => errors.push(format!("`runners`: no runner is named `{name}`")),
                Some(r) if !r.serves(&tool.pack) => errors.push(format!(
                    "`runners`: runner `{name}` does not serve pack `{}`",
                    tool.pack
                )),
                Some(_) => {}
            }
        }
        let audited_args = redact(tool, &params);
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
        let (targets, chosen) = if named.is_empty() && tool.scope == Scope::Cluster {
            match offered.runners.first() {
                // Health-aware choice comes with runner health; until then, the first by name.
                Some(first) => (vec![first.clone()], true),
                None => {
                    let message = format!("no runner serves pack `{}`", tool.pack);
                    self.reject(
                        &actor,
                        &tool.name,
                        Some(audited_args),
                        reason,
                        message.clone(),
                    )
                    .await;
                    return Err(CallError::Denied(message));
                }
            }
        } else {
            (named, false)
        };

        // 3. Policy.
        if let Decision::Deny(why) = policy::decide(tool, &call.principal) {
            self.reject(&actor, &tool.name, Some(audited_args), reason, why.clone())
                .await;
            return Err(CallError::Denied(why));
        }

        // 4. Audit intent; fail closed.
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

        // 5. Dispatch in parallel; 6. audit each outcome as it lands.
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
                let url = &self.runners[name].url;
                let started = Instant::now();
                let answer = self
                    .client
                    .call(name, url, dispatch, self.call_timeout)
                    .await;
                let elapsed = started.elapsed().as_millis() as u64;
                let result = to_result(name, answer, elapsed);
                self.audit_outcome(
                    actor,
                    tool.name.as_str(),
                    name,
                    audited_args,
                    reason,
                    call_id,
                    &result,
                )
                .await;
                result
            }
        }))
        .await;

        Ok(CallOutcome {
            call_id,
            tool: tool.name.clone(),
            runner_chosen_by_server: chosen,
            results,
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
    ) {
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
        if let Err(e) = self.audit.append(event).await {
            // The action already ran; its result still goes back, and the gap is logged loudly.
            tracing::error!(error = %e, tool, runner, call_id, "could not audit a call outcome");
        }
    }
}

fn to_result(
    runner: &str,
    answer: Result<crate::runner::client::RunnerAnswer, RunnerError>,
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

/// The arguments as the audit log keeps them: secret params never in clear.
fn redact(tool: &ToolRef, params: &Map<String, Value>) -> Value {
    let mut out = params.clone();
    for name in tool.secret_params() {
        if out.contains_key(name) {
            out.insert(name.to_owned(), json!("[secret: not recorded]"));
        }
    }
    Value::Object(out)
}
