//! The call path. Every tool call takes this one route, in this order:
//!
//! 1. **find** the tool (a tool the caller may not use is reported as unknown);
//! 2. **rate limit** the agent (a token bucket on a monotonic clock);
//! 3. **validate** the arguments against the tool's input schema, and `runners` against the
//!    runners that serve the tool's pack (rejections are audited as `tool.rejected`);
//! 4. **policy** (`policy::decide`, pure): allow, deny (audited), or needs approval;
//! 5. **audit intent** (`tool.called`): durable before anything runs, or nothing runs;
//!    a call that needs approval then runs its read-only *preview* on the runners, becomes a
//!    pending request (`approval.requested`) and waits for humans ([`Gateway::wait`], with
//!    progress); once approved, [`Gateway::execute_approved`] claims it exactly once
//!    (`approval.executing`) and carries on at step 6 with the approval id in the signed call;
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
use tokio_util::sync::CancellationToken;

use crate::digest::json_digest;
use crate::pack::{PackSet, Risk, Scope, ToolRef};
use crate::protocol::Mode;
use crate::selector::Selector;
use crate::server::approvals::{self, Actor, Approval, ApprovalError, Approvals, State, Verdict};
use crate::server::audit::{AuditError, AuditLog, NewEvent, format_at, kind};
use crate::server::policy::{self, Decision, Policy};
use crate::server::runners::RetryBudget;
use crate::server::runners::client::{Dispatch, RunnerAnswer, RunnerClient, RunnerError};
use crate::server::runners::registry::{Registry, rejection_message};
use crate::server::secrets::AuditKey;
use crate::server::tokens::Principal;
use crate::server::webhook::{Notice, Notifier};

/// The built-in tool that shows runner health to agents.
pub const RUNNERS_TOOL: &str = "emisar.runners";
/// The built-in tool that reports on one of the caller's approval requests.
pub const APPROVAL_STATUS_TOOL: &str = "emisar.approval_status";
/// The built-in tool that waits (again) for one of the caller's approval requests.
pub const APPROVAL_WAIT_TOOL: &str = "emisar.approval_wait";
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
    #[error("{0}")]
    Approval(#[from] ApprovalError),
    #[error("cancelled by the client{0}")]
    Cancelled(String),
}

/// What a call may do while it waits for humans: report progress, and notice that the
/// client gave up.
#[derive(Clone, Default)]
pub struct CallContext {
    pub cancel: CancellationToken,
    pub progress: Option<Progress>,
}

/// Sends one progress message to the client.
pub type Progress = Arc<dyn Fn(String) -> futures::future::BoxFuture<'static, ()> + Send + Sync>;

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

/// How the gateway is tuned; all of it comes from the server config.
pub struct Limits {
    /// Each runner's deadline for one call.
    pub call_timeout: Duration,
    pub rate_per_second: u32,
    pub rate_burst: u32,
    /// How long a request waits for its approvers before it expires.
    pub approval_ttl: Duration,
    /// How long one MCP call waits for the decision before returning the request id.
    pub approval_wait: Duration,
    /// How often a waiting call sends progress (below the MCP session idle timeout).
    pub progress_every: Duration,
}

impl Limits {
    pub fn new(call_timeout: Duration, rate_per_second: u32, rate_burst: u32) -> Limits {
        Limits {
            call_timeout,
            rate_per_second,
            rate_burst,
            approval_ttl: Duration::from_secs(15 * 60),
            approval_wait: Duration::from_secs(120),
            progress_every: Duration::from_secs(10),
        }
    }
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
    approvals: Approvals,
    /// Swapped whole on reload; each call decides under one version.
    policy: std::sync::RwLock<Arc<Policy>>,
    /// Tells people about new requests; never blocks the call path.
    notifier: Option<Notifier>,
    /// Where people reach the portal, for links in notices.
    public_url: Option<String>,
}

impl Gateway {
    pub fn new(
        packs: Arc<PackSet>,
        runners: Arc<Registry>,
        audit: AuditLog,
        client: RunnerClient,
        limits: Limits,
        audit_key: Option<AuditKey>,
        approvals: Approvals,
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
        let approval_schema = |what: &str| {
            let mut schema = Map::new();
            schema.insert("type".into(), json!("object"));
            schema.insert(
                "properties".into(),
                json!({
                    "approval_id": {"type": "string", "pattern": "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$",
                                    "description": "The approval_id a pending call returned."},
                    "reason": {"type": "string", "minLength": 1, "maxLength": 2000, "pattern": "\\S",
                               "description": what}
                }),
            );
            schema.insert("required".into(), json!(["approval_id", "reason"]));
            schema.insert("additionalProperties".into(), json!(false));
            schema
        };
        tools.insert(
            APPROVAL_STATUS_TOOL.into(),
            offered(
                None,
                APPROVAL_STATUS_TOOL,
                "Where one of your approval requests stands (pending, approved, denied with the approver's note, expired, executing, executed with its result, failed). Returns at once.",
                Risk::Read,
                approval_schema("Why you are asking. Recorded in the audit log."),
            )?,
        );
        tools.insert(
            APPROVAL_WAIT_TOOL.into(),
            offered(
                None,
                APPROVAL_WAIT_TOOL,
                "Waits for humans to decide one of your approval requests, with progress notifications, and returns the call's result once it ran (or the request id again if nobody decided yet). Cancelling this call withdraws a request that is still pending.",
                Risk::Read,
                approval_schema("Why you are asking. Recorded in the audit log."),
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
            approvals,
            policy: std::sync::RwLock::new(Arc::new(Policy::builtin())),
            notifier: None,
            public_url: None,
        })
    }

    /// New approval requests are announced through `notifier`, with links to `public_url`.
    pub fn set_notifier(&mut self, notifier: Notifier, public_url: Option<String>) {
        self.notifier = Some(notifier);
        self.public_url = public_url;
    }

    /// The policy in force.
    pub fn policy(&self) -> Arc<Policy> {
        self.policy
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Checks `policy` against the loaded packs, records `policy.loaded` (with its digest
    /// and source) and puts it in force. A policy that does not check is not loaded, and
    /// the refusal is audited too.
    pub async fn load_policy(
        &self,
        policy: Result<Policy, crate::server::policy::PolicyError>,
        source: &str,
        actor: &str,
    ) -> Result<(), anyhow::Error> {
        let checked = policy.and_then(|p| p.check(&self.packs).map(|()| p));
        let (outcome, detail) = match &checked {
            Ok(p) => ("ok", json!({"source": source, "sha256": p.digest()})),
            Err(e) => ("refused", json!({"source": source, "error": e.to_string()})),
        };
        self.audit
            .append(NewEvent {
                actor: actor.to_owned(),
                kind: kind::POLICY_LOADED.into(),
                outcome: Some(outcome.into()),
                detail: Some(detail),
                ..Default::default()
            })
            .await?;
        let policy = checked?;
        *self.policy.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(policy);
        Ok(())
    }

    /// The tools `caller` may see: the built-ins, and the pack tools the policy lets it use.
    pub fn tools_for<'a>(
        &'a self,
        caller: &'a Principal,
    ) -> impl Iterator<Item = &'a OfferedTool> + 'a {
        let policy = self.policy();
        self.tools
            .values()
            .filter(move |t| t.tool.is_none() || policy.may_use_tool(caller, &t.name))
    }

    pub fn tool_for(&self, caller: &Principal, name: &str) -> Option<&OfferedTool> {
        self.tools
            .get(name)
            .filter(|t| t.tool.is_none() || self.policy().may_use_tool(caller, name))
    }

    /// The input schema `caller` sees for `offered`: pack tools list the runners it may name.
    /// The token's selector and the policy's both narrow the list.
    pub fn schema_for(&self, caller: &Principal, offered: &OfferedTool) -> Map<String, Value> {
        match &offered.tool {
            Some(tool) => {
                let policy = self.policy();
                let names: Vec<String> = self
                    .runners
                    .serving_sorted(&tool.pack, caller.selector.as_ref())
                    .into_iter()
                    .filter(|name| match policy.runner_selector(caller) {
                        None => true,
                        Some(sel) => self
                            .runners
                            .get(name)
                            .is_some_and(|r| sel.matches(&r.labels)),
                    })
                    .collect();
                crate::pack::with_runner_names(offered.input_schema.clone(), &names)
            }
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

    pub fn approvals(&self) -> &Approvals {
        &self.approvals
    }

    pub fn packs(&self) -> &PackSet {
        &self.packs
    }

    /// A call with no way to report progress or be cancelled (tests, the stdio bridge).
    pub async fn call(&self, call: ToolCall) -> Result<CallOutcome, CallError> {
        self.call_with(call, &CallContext::default()).await
    }

    pub async fn call_with(
        &self,
        call: ToolCall,
        ctx: &CallContext,
    ) -> Result<CallOutcome, CallError> {
        let actor = call.principal.actor();
        let Some(offered) = self.tool_for(&call.principal, &call.tool) else {
            // The agent learns nothing about tools it may not use; the audit log says which.
            let why = if self.tools.contains_key(&call.tool) {
                format!(
                    "tool `{}` is hidden from agent `{}` by the policy (`agents.{}.tools`)",
                    call.tool, call.principal.agent, call.principal.agent
                )
            } else {
                format!("unknown tool `{}`", call.tool)
            };
            self.reject(&actor, &call.tool, None, None, why).await;
            return Err(CallError::UnknownTool(call.tool));
        };

        // 2. Rate limit, per agent, before any work.
        if let Err(not_until) = self.limiter.check_key(&call.principal.agent) {
            let wait = not_until.wait_time_from(governor::clock::Clock::now(
                &governor::clock::DefaultClock::default(),
            ));
            crate::server::metrics::rate_limited(&call.principal.agent);
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
            let approval_id = params
                .remove("approval_id")
                .and_then(|v| v.as_str().map(str::to_owned));
            if offered.name == RUNNERS_TOOL {
                return self.builtin(&call.principal, offered, reason, errors).await;
            }
            return match approval_id {
                Some(id) if errors.is_empty() => {
                    self.approval_tool(&call.principal, offered, &id, reason, ctx)
                        .await
                }
                _ => {
                    if errors.is_empty() {
                        errors.push("`approval_id` is required".into());
                    }
                    self.reject(&actor, &offered.name, None, reason, errors.join("; "))
                        .await;
                    Err(CallError::Invalid {
                        tool: offered.name.clone(),
                        errors,
                    })
                }
            };
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

        // 4. Policy.
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
        let approvers = match policy::decide(&self.policy(), &request) {
            Decision::Allow => None,
            Decision::NeedsApproval { approvers } => Some(approvers.max(1)),
            Decision::Deny(why) => {
                self.reject(&actor, &tool.name, Some(audited_args), reason, why.clone())
                    .await;
                return Err(CallError::Denied(why));
            }
        };

        // 5. Audit intent; fail closed.
        let call_id = uuid::Uuid::new_v4().to_string();
        if let Some(approvers) = approvers {
            if tool.secret_params().next().is_some() {
                // A request keeps the args its execution will use; a secret would sit in the
                // approvals table in clear. Refuse until requests can hold secrets sealed.
                let why = format!(
                    "`{}` has secret params and needs approval: emisar cannot yet keep a secret in a pending request, so it refuses the call",
                    tool.name
                );
                self.reject(&actor, &tool.name, Some(audited_args), reason, why.clone())
                    .await;
                return Err(CallError::Denied(why));
            }
            let request = Request {
                call_id,
                tool,
                principal: &call.principal,
                params,
                shown_args: audited_args,
                runners: targets,
                chosen,
                raw,
                reason: reason.unwrap_or_default(),
                approvers,
            };
            let pending = self.request_approval(request).await?;
            return self.wait(&pending, ctx).await;
        }
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
            approval_id: None,
        };
        let record = Record {
            actor: &actor,
            tool: &tool.name,
            args: &audited_args,
            reason: reason.as_deref(),
            call_id: &call_id,
            approval_id: None,
        };
        let results = futures::future::join_all(
            targets
                .iter()
                .map(|name| self.run_on(name, tool, &dispatch, &record)),
        )
        .await;
        let outcome = CallOutcome {
            call_id,
            tool: tool.name.clone(),
            runner_chosen_by_server: chosen,
            results,
            approval: None,
        };
        crate::server::metrics::tool_call(
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
            approval: None,
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
        crate::server::metrics::tool_call(tool, "refused");
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

    /// Steps 6 and 7 for one runner: dispatch (through its breaker), count, record the
    /// outcome. Nothing leaves emisar that is not on the record: a result whose outcome
    /// could not be recorded is withheld.
    async fn run_on(
        &self,
        name: &str,
        tool: &ToolRef,
        dispatch: &Dispatch<'_>,
        record: &Record<'_>,
    ) -> RunnerResult {
        let started = Instant::now();
        let answer = self.dispatch_one(name, tool, dispatch).await;
        let elapsed = started.elapsed();
        let mut result = to_result(name, answer, elapsed.as_millis() as u64);
        crate::server::metrics::runner_call(
            record.tool,
            name,
            if result.ok { "ok" } else { "error" },
            elapsed.as_secs_f64(),
        );
        if let Err(e) = self.audit_outcome(name, record, &result).await {
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

    async fn audit_outcome(
        &self,
        runner: &str,
        r: &Record<'_>,
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
        };
        self.audit.append(event).await.map(|_| ()).inspect_err(|e| {
            tracing::error!(error = %e, tool = r.tool, runner, call_id = r.call_id, "could not audit a call outcome");
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

/// Who and what one runner's outcome is recorded under.
struct Record<'a> {
    actor: &'a str,
    tool: &'a str,
    args: &'a Value,
    reason: Option<&'a str>,
    call_id: &'a str,
    approval_id: Option<&'a str>,
}

/// A call that needs approval, after validation and policy.
struct Request<'a> {
    call_id: String,
    tool: &'a ToolRef,
    principal: &'a Principal,
    params: Map<String, Value>,
    shown_args: Value,
    runners: Vec<String>,
    chosen: bool,
    raw: bool,
    reason: String,
    approvers: u32,
}

// The approval part of the call path: request (with preview) → wait → decide → execute.
impl Gateway {
    /// Audits the intent, runs the tool's read-only preview on every target, and stores a
    /// pending request bound to all of it.
    async fn request_approval(&self, r: Request<'_>) -> Result<Approval, CallError> {
        let actor = r.principal.actor();
        let tool = r.tool;
        self.audit
            .append(NewEvent {
                actor: actor.clone(),
                kind: kind::TOOL_CALLED.into(),
                tool: Some(tool.name.clone()),
                args: Some(r.shown_args.clone()),
                reason: Some(r.reason.clone()),
                call_id: Some(r.call_id.clone()),
                detail: Some(
                    json!({"runners": r.runners, "runner_chosen_by_server": r.chosen,
                                    "needs_approval": true, "approvers": r.approvers}),
                ),
                ..Default::default()
            })
            .await
            .map_err(CallError::AuditUnavailable)?;
        let pack_sha256 = self
            .packs
            .pack(&tool.pack)
            .expect("tool has a pack")
            .digest
            .clone();
        let preview = match &tool.preview {
            None => None,
            Some(_) => {
                let dispatch = Dispatch {
                    call_id: &r.call_id,
                    tool: &tool.name,
                    pack_sha256: &pack_sha256,
                    args: &r.params,
                    mode: Mode::Preview,
                    preview: None,
                    raw: false,
                    approval_id: None,
                };
                let answers = futures::future::join_all(
                    r.runners
                        .iter()
                        .map(|name| self.dispatch_one(name, tool, &dispatch)),
                )
                .await;
                let mut per_runner = Map::new();
                let mut failures = Vec::new();
                for (name, answer) in r.runners.iter().zip(answers) {
                    match answer {
                        Ok(a) => {
                            per_runner.insert(
                                name.clone(),
                                json!({"ok": true, "output": a.output, "vars": a.vars}),
                            );
                        }
                        Err(e) => failures.push(format!("preview on `{name}`: {e}")),
                    }
                }
                if !failures.is_empty() {
                    let why = failures.join("; ");
                    let event = NewEvent {
                        actor: actor.clone(),
                        kind: kind::CALL_FAILED.into(),
                        tool: Some(tool.name.clone()),
                        args: Some(r.shown_args.clone()),
                        reason: Some(r.reason.clone()),
                        call_id: Some(r.call_id.clone()),
                        outcome: Some("error".into()),
                        detail: Some(json!({"mode": "preview", "error": why})),
                        ..Default::default()
                    };
                    self.audit
                        .append(event)
                        .await
                        .map_err(CallError::AuditUnavailable)?;
                    return Err(CallError::Denied(format!(
                        "the preview failed, so no approval was requested: {why}"
                    )));
                }
                Some(Value::Object(per_runner))
            }
        };
        let now = chrono::Utc::now();
        let ttl = chrono::Duration::from_std(self.limits.approval_ttl)
            .unwrap_or(chrono::Duration::minutes(15));
        let approval = Approval {
            id: uuid::Uuid::new_v4().to_string(),
            call_id: r.call_id,
            tool: tool.name.clone(),
            risk: self.policy().risk(tool).as_str().to_owned(),
            args: r.params,
            shown_args: r.shown_args,
            runners: r.runners,
            runner_chosen: r.chosen,
            raw: r.raw,
            reason: r.reason,
            requester: actor.clone(),
            requester_name: r.principal.agent.clone(),
            pack_sha256,
            preview,
            required_approvals: r.approvers,
            approvals: Vec::new(),
            state: State::Pending,
            note: None,
            decided_by: None,
            result: None,
            created_at: format_at(now),
            expires_at: format_at(now + ttl),
            updated_at: format_at(now),
        };
        let mut event = NewEvent {
            actor,
            kind: kind::APPROVAL_REQUESTED.into(),
            tool: Some(approval.tool.clone()),
            runner: (approval.runners.len() == 1).then(|| approval.runners[0].clone()),
            args: Some(approval.shown_args.clone()),
            reason: Some(approval.reason.clone()),
            call_id: Some(approval.call_id.clone()),
            approval_id: Some(approval.id.clone()),
            detail: Some(
                json!({"runners": approval.runners, "required_approvals": approval.required_approvals,
                                "expires_at": approval.expires_at}),
            ),
            ..Default::default()
        };
        if let Some(p) = &approval.preview {
            event.result_digest = Some(json_digest(p));
        }
        self.audit
            .append(event)
            .await
            .map_err(CallError::AuditUnavailable)?;
        self.approvals.insert(&approval).await?;
        crate::server::metrics::tool_call(&approval.tool, "pending");
        if let Some(notifier) = &self.notifier {
            notifier.notify(Notice {
                approval_id: approval.id.clone(),
                tool: approval.tool.clone(),
                runners: approval.runners.clone(),
                requester: approval.requester.clone(),
                reason: approval.reason.clone(),
                risk: approval.risk.clone(),
                expires_at: approval.expires_at.clone(),
                portal_url: self
                    .public_url
                    .as_ref()
                    .map(|u| format!("{}/#/approvals/{}", u.trim_end_matches('/'), approval.id)),
            });
        }
        Ok(approval)
    }

    /// Waits for the request to settle, sending progress; returns its outcome, or the
    /// request as pending once `approval_wait` has passed. A cancelled call withdraws a
    /// request that is still pending.
    pub async fn wait(&self, a: &Approval, ctx: &CallContext) -> Result<CallOutcome, CallError> {
        let mut changes = self.approvals.subscribe();
        let started = Instant::now();
        let deadline = started + self.limits.approval_wait;
        let mut next_progress = started + self.limits.progress_every;
        // Changes arrive by channel; the poll covers a listener that is reconnecting.
        let poll = Duration::from_secs(2);
        loop {
            let mut row = self.approvals.get(&a.id).await?;
            if row.state == State::Pending && row.expired_at(chrono::Utc::now()) {
                // Expire it now rather than at the next sweep; if another replica holds the
                // row, the poll below picks up whatever it decided.
                self.expire(&row.id).await;
                row = self.approvals.get(&a.id).await?;
            }
            if let Some(done) = settled(&row)? {
                return Ok(done);
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(pending_outcome(&row, self.limits.approval_wait));
            }
            if now >= next_progress {
                if let Some(progress) = &ctx.progress {
                    progress(format!(
                        "approval {} for {} is {}; approvers: {}/{}; expires at {}",
                        row.id,
                        row.tool,
                        row.state.as_str(),
                        row.approvals.len(),
                        row.required_approvals,
                        row.expires_at
                    ))
                    .await;
                }
                next_progress += self.limits.progress_every;
            }
            let wake = deadline.min(next_progress).min(now + poll);
            tokio::select! {
                _ = ctx.cancel.cancelled() => {
                    self.withdraw(&row).await;
                    return Err(CallError::Cancelled(format!("; approval request {} was withdrawn if still pending", row.id)));
                }
                _ = changed(&mut changes, &a.id) => {}
                _ = tokio::time::sleep_until(wake.into()) => {}
            }
        }
    }

    async fn withdraw(&self, row: &Approval) {
        let actor = row.requester.clone();
        let result = self
            .approvals
            .transition(&row.id, false, |r| {
                approvals::moved(
                    r,
                    &[State::Pending],
                    State::Withdrawn,
                    &actor,
                    kind::APPROVAL_WITHDRAWN,
                    json!({"why": "the agent cancelled its call"}),
                    chrono::Utc::now(),
                )
            })
            .await;
        match result {
            Ok(_) | Err(ApprovalError::WrongState { .. }) => {}
            Err(e) => tracing::error!(error = %e, approval_id = %row.id, "could not withdraw"),
        }
    }

    async fn expire(&self, id: &str) {
        let result = self
            .approvals
            .transition(id, true, |r| {
                let now = chrono::Utc::now();
                if !r.expired_at(now) {
                    return Err(ApprovalError::WrongState {
                        state: r.state,
                        wanted: "expired",
                    });
                }
                approvals::moved(
                    r,
                    &[State::Pending],
                    State::Expired,
                    "system",
                    kind::APPROVAL_EXPIRED,
                    json!({"expires_at": r.expires_at, "votes": r.approvals.len()}),
                    now,
                )
            })
            .await;
        match result {
            Ok(_) | Err(ApprovalError::WrongState { .. }) => {}
            Err(e) => tracing::error!(error = %e, approval_id = %id, "could not expire"),
        }
    }

    /// `emisar.approval_status` and `emisar.approval_wait`: the caller's own requests only.
    async fn approval_tool(
        &self,
        principal: &Principal,
        offered: &OfferedTool,
        id: &str,
        reason: Option<String>,
        ctx: &CallContext,
    ) -> Result<CallOutcome, CallError> {
        let row = match self.approvals.get(id).await {
            Ok(row) if row.requester_name == principal.agent => Ok(row),
            Ok(_) | Err(ApprovalError::NotFound(_)) => Err(ApprovalError::NotFound(id.into())),
            Err(e) => Err(e),
        };
        self.audit
            .append(NewEvent {
                actor: principal.actor(),
                kind: kind::TOOL_CALLED.into(),
                tool: Some(offered.name.clone()),
                args: Some(json!({"approval_id": id})),
                reason,
                approval_id: Some(id.to_owned()),
                outcome: Some(if row.is_ok() { "ok" } else { "refused" }.into()),
                ..Default::default()
            })
            .await
            .map_err(CallError::AuditUnavailable)?;
        let row = row?;
        if offered.name == APPROVAL_WAIT_TOOL {
            return self.wait(&row, ctx).await;
        }
        Ok(settled(&row)?.unwrap_or_else(|| pending_outcome(&row, Duration::ZERO)))
    }

    /// A human's decision on a request; an approval that settles it starts the execution
    /// on this replica.
    pub async fn decide(
        self: &Arc<Self>,
        who: &Principal,
        id: &str,
        verdict: Verdict,
    ) -> Result<Approval, ApprovalError> {
        let policy = self.policy();
        let row = self
            .approvals
            .transition(id, false, |r| {
                // The tool comes from the locked row: no second read to learn it.
                let actor = Actor {
                    name: who.agent.clone(),
                    actor: who.actor(),
                    may_approve: policy.may_approve(who.role, &r.tool),
                };
                approvals::decide(r, &actor, &verdict, chrono::Utc::now())
            })
            .await?
            .expect("a transition without skip_locked always returns the row");
        if row.state == State::Approved {
            let me = self.clone();
            let id = row.id.clone();
            tokio::spawn(async move { me.execute_approved(&id).await });
        }
        Ok(row)
    }

    /// Claims an approved request (exactly once across replicas), audits `executing`,
    /// calls its runners with the approval id and the preview's vars, records the outcome.
    pub async fn execute_approved(&self, id: &str) {
        let claimed = self
            .approvals
            .transition(id, true, |r| {
                let by = r.decided_by.clone().unwrap_or_else(|| "system".into());
                approvals::moved(
                    r,
                    &[State::Approved],
                    State::Executing,
                    &by,
                    kind::APPROVAL_EXECUTING,
                    json!({"runners": r.runners, "approvals": r.approvals}),
                    chrono::Utc::now(),
                )
            })
            .await;
        let row = match claimed {
            Ok(Some(row)) => row,
            // Another replica holds it, or it moved on already: not ours to run.
            Ok(None) | Err(ApprovalError::WrongState { .. }) => return,
            Err(e) => {
                tracing::error!(error = %e, approval_id = %id, "could not claim an approved request");
                return;
            }
        };
        let started = Instant::now();
        let (results, problem) = self.run_approved(&row).await;
        let ok = problem.is_none() && results.iter().all(|r| r.ok);
        let note = problem.or_else(|| {
            results
                .iter()
                .find_map(|r| r.error.as_ref().map(|e| format!("{}: {e}", r.runner)))
        });
        let outcome = CallOutcome {
            call_id: row.call_id.clone(),
            tool: row.tool.clone(),
            runner_chosen_by_server: row.runner_chosen,
            results,
            approval: None,
        };
        crate::server::metrics::tool_call(&row.tool, if ok { "ok" } else { "error" });
        let result = serde_json::to_value(&outcome).expect("outcomes are JSON");
        let finished = self
            .approvals
            .finish(
                id,
                if ok { State::Executed } else { State::Failed },
                result,
                note,
            )
            .await;
        if let Err(e) = finished {
            tracing::error!(error = %e, approval_id = %id, "could not record the end of an execution");
        }
        tracing::info!(approval_id = %id, ok, elapsed_ms = started.elapsed().as_millis() as u64, "approved call ran");
    }

    /// Steps 6 and 7 for an approved request. The second value explains a failure that
    /// happened before any runner was called.
    async fn run_approved(&self, row: &Approval) -> (Vec<RunnerResult>, Option<String>) {
        let Some(tool) = self.packs.tool(&row.tool) else {
            return (
                Vec::new(),
                Some(format!("tool `{}` is no longer loaded", row.tool)),
            );
        };
        let pack = self.packs.pack(&tool.pack).expect("tool has a pack");
        if pack.digest != row.pack_sha256 {
            return (
                Vec::new(),
                Some(format!(
                    "pack `{}` changed since the request ({} → {}): nothing was run; ask again",
                    pack.name, row.pack_sha256, pack.digest
                )),
            );
        }
        let record = Record {
            actor: &row.requester,
            tool: &row.tool,
            args: &row.shown_args,
            reason: Some(&row.reason),
            call_id: &row.call_id,
            approval_id: Some(&row.id),
        };
        let results = futures::future::join_all(row.runners.iter().map(|name| {
            let record = &record;
            async move {
                let vars = row.preview_vars(name);
                let dispatch = Dispatch {
                    call_id: &row.call_id,
                    tool: &row.tool,
                    pack_sha256: &row.pack_sha256,
                    args: &row.args,
                    mode: Mode::Execute,
                    preview: vars.as_ref(),
                    raw: row.raw,
                    approval_id: Some(&row.id),
                };
                self.run_on(name, tool, &dispatch, record).await
            }
        }))
        .await;
        (results, None)
    }

    /// Expires overdue requests, executes approved ones nobody claimed (their replica
    /// stopped between the decision and the claim), and marks executions that outlived
    /// every deadline `unknown`: a crash interrupted them, and they are never re-run.
    pub async fn sweep(&self) {
        let now = chrono::Utc::now();
        match self
            .approvals
            .ids_in(State::Pending, &format_at(now), true)
            .await
        {
            Ok(ids) => {
                for id in ids {
                    self.expire(&id).await;
                }
            }
            Err(e) => tracing::warn!(error = %e, "approval sweep could not list pending requests"),
        }
        let orphaned = now - chrono::Duration::seconds(10);
        if let Ok(ids) = self
            .approvals
            .ids_in(State::Approved, &format_at(orphaned), false)
            .await
        {
            for id in ids {
                self.execute_approved(&id).await;
            }
        }
        let lost = now
            - chrono::Duration::from_std(self.limits.call_timeout * 2 + Duration::from_secs(60))
                .unwrap_or(chrono::Duration::minutes(5));
        if let Ok(ids) = self
            .approvals
            .ids_in(State::Executing, &format_at(lost), false)
            .await
        {
            for id in ids {
                let result = self
                    .approvals
                    .transition(&id, true, |r| {
                        let mut change = approvals::moved(
                            r,
                            &[State::Executing],
                            State::Unknown,
                            "system",
                            kind::CALL_UNKNOWN,
                            json!({"why": "execution was interrupted (the server stopped); it is not re-run: check the runners"}),
                            chrono::Utc::now(),
                        )?;
                        change.row.note = Some(
                            "execution was interrupted before its outcome was recorded; it is not re-run: check the runners".into(),
                        );
                        Ok(change)
                    })
                    .await;
                if let Err(e) = result {
                    tracing::warn!(error = %e, approval_id = %id, "could not mark an interrupted execution");
                }
            }
        }
    }

    /// Runs [`Gateway::sweep`] every `every` until `shutdown`.
    pub fn spawn_sweeper(self: &Arc<Self>, every: Duration, shutdown: CancellationToken) {
        let me = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(every) => {}
                }
                let Some(gateway) = me.upgrade() else { return };
                gateway.sweep().await;
            }
        });
    }
}

/// Returns when request `id` changed, or when changes were missed (a lagging receiver):
/// other requests' changes do not wake a waiter to re-read its own row.
async fn changed(changes: &mut tokio::sync::broadcast::Receiver<approvals::Changed>, id: &str) {
    use tokio::sync::broadcast::error::RecvError;
    loop {
        match changes.recv().await {
            Ok(c) if c.id == id => return,
            Ok(_) => {}
            Err(RecvError::Lagged(_)) => return,
            // Never while the store lives; the caller's poll still wakes it.
            Err(RecvError::Closed) => std::future::pending().await,
        }
    }
}

/// The agent's view of a request that has settled, or `None` while it is undecided.
fn settled(row: &Approval) -> Result<Option<CallOutcome>, CallError> {
    let info = |message: String| ApprovalInfo {
        approval_id: row.id.clone(),
        state: row.state,
        expires_at: row.expires_at.clone(),
        message,
        decided_by: row.decided_by.clone(),
        note: row.note.clone(),
    };
    match row.state {
        State::Pending | State::Approved | State::Executing => Ok(None),
        State::Denied => Err(CallError::Denied(format!(
            "approval request {} was denied by {}: {}",
            row.id,
            row.decided_by.as_deref().unwrap_or("an approver"),
            row.note.as_deref().unwrap_or("")
        ))),
        State::Expired => Err(CallError::Denied(format!(
            "approval request {} expired at {} before enough humans approved it; nothing ran",
            row.id, row.expires_at
        ))),
        State::Withdrawn => Err(CallError::Denied(format!(
            "approval request {} was withdrawn (its call was cancelled); nothing ran",
            row.id
        ))),
        State::Executed | State::Failed | State::Unknown => {
            // The stored outcome is one this code wrote; an unreadable one still settles
            // the call, without results, and says so in the log.
            let stored = row
                .result
                .clone()
                .map(serde_json::from_value::<CallOutcome>);
            if let Some(Err(e)) = &stored {
                tracing::error!(error = %e, approval_id = %row.id, "stored outcome unreadable");
            }
            let mut outcome = stored.and_then(Result::ok).unwrap_or_else(|| CallOutcome {
                call_id: row.call_id.clone(),
                tool: row.tool.clone(),
                runner_chosen_by_server: row.runner_chosen,
                results: Vec::new(),
                approval: None,
            });
            let message = match row.state {
                State::Executed => "approved and executed".to_owned(),
                State::Failed => format!(
                    "approved, but the execution failed: {}",
                    row.note.as_deref().unwrap_or("see the per-runner results")
                ),
                _ => row.note.clone().unwrap_or_default(),
            };
            outcome.approval = Some(info(message));
            Ok(Some(outcome))
        }
    }
}

fn pending_outcome(row: &Approval, waited: Duration) -> CallOutcome {
    CallOutcome {
        call_id: row.call_id.clone(),
        tool: row.tool.clone(),
        runner_chosen_by_server: row.runner_chosen,
        results: Vec::new(),
        approval: Some(ApprovalInfo {
            approval_id: row.id.clone(),
            state: row.state,
            expires_at: row.expires_at.clone(),
            message: format!(
                "waiting for a human to approve ({} of {} approvals) after {} s; call {APPROVAL_WAIT_TOOL} with this approval_id to wait again, or {APPROVAL_STATUS_TOOL} to check",
                row.approvals.len(),
                row.required_approvals,
                waited.as_secs()
            ),
            decided_by: row.decided_by.clone(),
            note: row.note.clone(),
        }),
    }
}
