//! The spine of the call path: [`Gateway::call_with`] runs steps 1 to 8 in order, each a few
//! lines that call out to the function that does the step. Every step that refuses audits the
//! refusal (`tool.rejected`) before it returns; the refusals a caller can repeat at will
//! (rate limited, unknown tool) are counted per caller and window after the first
//! (`audit/refusals.rs`), so no caller grows the audit log faster than its limits.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use super::approval_flow::{Request, Rolled, Rollout};
use super::dispatch::AuditedCall;
use super::outcome::{CallError, CallOutcome};
use super::state::{Gateway, OfferedTool};
use super::tasks::TaskView;
use crate::pack::{Risk, Scope, ToolRef, allowlist_admits, shown_value};
use crate::protocol::Mode;
use crate::selector::Selector;
use crate::server::audit::{NewEvent, RefusalKey, kind};
use crate::server::policy::{self, Decision, Policy};
use crate::server::principal::Principal;
use crate::server::runners::client::Dispatch;

/// A call as the MCP adapter hands it over.
#[derive(Debug, Clone)]
pub struct ToolCall {
    pub principal: Principal,
    pub tool: String,
    pub args: Map<String, Value>,
}

/// What a call may do while it waits for humans: report progress, notice that the client
/// gave up, or, when the client declared MCP Tasks, not wait at all.
#[derive(Clone, Default)]
pub struct CallContext {
    pub cancel: CancellationToken,
    pub progress: Option<Progress>,
    /// The client declared the Tasks extension: a call that files an approval request is
    /// answered with a task at once (`tasks.rs`) instead of waiting.
    pub tasks: bool,
}

/// How a call is answered: with its outcome, or, for a client that declared Tasks and a
/// call that waits for people, with a task to poll.
#[derive(Debug)]
pub enum Answer {
    Now(CallOutcome),
    Task(TaskView),
}

/// Sends one progress message to the client.
pub type Progress = Arc<dyn Fn(String) -> futures::future::BoxFuture<'static, ()> + Send + Sync>;

/// A call's arguments once the ones that steer emisar are split off: `params` is what goes
/// to the runners.
pub(super) struct Args {
    pub(super) params: Map<String, Value>,
    pub(super) reason: Option<String>,
    pub(super) raw: bool,
    /// The runners the caller named.
    pub(super) named: Vec<String>,
}

/// Where a call goes.
struct Targets {
    runners: Vec<String>,
    /// True when the server chose the runner (a cluster-scoped tool called without `runners`).
    runner_chosen_by_server: bool,
}

/// A pack tool's call after step 3: its arguments, where it goes, and what is wrong with it
/// (step 4 refuses it then).
struct Resolved {
    args: Args,
    targets: Targets,
    /// The arguments as the audit log keeps them (secret params as keyed HMAC).
    shown_args: Value,
    /// What the agent reads is wrong: schema errors, and bad `runners` or `selector`.
    errors: Vec<String>,
    /// Why each runner the caller named and may not target is out of its reach: for the
    /// audit log only.
    out_of_reach: Vec<String>,
}

/// How step 4 lets a call go on.
#[derive(Debug, PartialEq)]
enum Admission {
    /// It runs now. A risk:high tool the policy lets run without approval carries the
    /// policy's digest to the runner, which otherwise executes risk:high tools only under an
    /// approval.
    Run { lowered_by_policy: Option<String> },
    /// It runs once this many people approved it.
    NeedsApproval { approvers: u32 },
}

/// Why step 4 refuses a call: what the caller gets back, and what the audit log reads.
#[derive(Debug)]
struct Refusal {
    err: CallError,
    why: String,
}

impl Gateway {
    /// A call with no way to report progress or be cancelled (tests, the stdio bridge).
    pub async fn call(&self, call: ToolCall) -> Result<CallOutcome, CallError> {
        match self.call_with(call, &CallContext::default()).await? {
            Answer::Now(outcome) => Ok(outcome),
            Answer::Task(_) => unreachable!("a task is made only for a context that asks for one"),
        }
    }

    /// The call path, top to bottom.
    pub(crate) async fn call_with(
        &self,
        call: ToolCall,
        ctx: &CallContext,
    ) -> Result<Answer, CallError> {
        let caller = &call.principal;

        // 1. Rate limit, per agent, before any work: refusals of unknown names count too, so
        //    an agent cannot flood the audit log with them.
        self.rate_limit(caller, &call.tool).await?;

        // 2. Find the tool. A name that is not an identifier is refused without being
        //    repeated; a tool the caller may not use is reported as unknown.
        let offered = self.find(caller, &call.tool).await?;

        // 3. Validate the arguments against the input schema and split off `reason`,
        //    `runners` and `raw`; a built-in tool answers here. For a pack tool, resolve the
        //    runners the call goes to. The call decides under one version of the policy,
        //    from here on.
        let (args, errors) = validate(offered, call.args);
        let Some(tool) = &offered.tool else {
            return self
                .builtin_call(caller, offered, args, errors, ctx)
                .await
                .map(Answer::Now);
        };
        let policy = self.policy();
        let resolved = self.resolve(caller, &policy, tool, args, errors);

        // 4. Admit the call, or refuse it, audited as `tool.rejected`: invalid arguments or
        //    runners, the policy's denial, a value a target runner's allowlist refuses, or
        //    a lowering a target runner's approvers file does not allow.
        let admission = match self.admit(caller, &policy, tool, &resolved) {
            Ok(admission) => admission,
            Err(Refusal { err, why }) => {
                let (shown_args, reason) = (resolved.shown_args, resolved.args.reason);
                return Err(self
                    .refuse(caller, &tool.name, shown_args, reason, why, err)
                    .await);
            }
        };

        // 5 to 8. Audit the intent durably before anything runs (fail closed), dispatch,
        //    audit each outcome and hand the results back; or, for a call that needs
        //    approval, become a pending request and wait for people. The call's id is
        //    time-ordered (UUIDv7), as event ids are: see `store::chain_after`.
        let call_id = uuid::Uuid::now_v7().to_string();
        match admission {
            Admission::Run { lowered_by_policy } => {
                let lowered_by_policy = lowered_by_policy.as_deref();
                self.run_now(caller, &policy, tool, resolved, call_id, lowered_by_policy)
                    .await
                    .map(Answer::Now)
            }
            // A call that needs people runs at once under an active grant of the caller's
            // that admits it and has a use left (`grants.rs`); else people are asked, and
            // the agent reads why no grant covered it.
            Admission::NeedsApproval { approvers } => {
                let (runners, params) = (&resolved.targets.runners, &resolved.args.params);
                match self.under_grant(caller, tool, runners, params).await? {
                    Ok(grant) => self
                        .run_under_grant(caller, &policy, tool, resolved, call_id, grant)
                        .await
                        .map(Answer::Now),
                    Err(not_covered) => self
                        .ask_people(caller, tool, resolved, call_id, approvers, ctx)
                        .await
                        .map(|answer| with_not_covered(answer, &not_covered)),
                }
            }
        }
    }

    /// Step 1: a token bucket per agent, on a monotonic clock; once this replica's admits,
    /// on PostgreSQL the agent's bucket shared by every replica (`server/shared_limit.rs`).
    async fn rate_limit(&self, caller: &Principal, tool: &str) -> Result<(), CallError> {
        let wait = match self.limiter.check_key(&caller.name) {
            Err(not_until) => not_until.wait_time_from(governor::clock::Clock::now(
                &governor::clock::DefaultClock::default(),
            )),
            Ok(()) => match &self.shared_limit {
                None => return Ok(()),
                Some(shared) => match shared.admit(&caller.name).await {
                    Ok(()) => return Ok(()),
                    Err(wait) => wait,
                },
            },
        };
        crate::server::metrics::rate_limited(&caller.name);
        let err = CallError::RateLimited {
            agent: caller.name.clone(),
            per_second: self.limits.rate_per_second,
            burst: self.limits.rate_burst,
            retry_after_ms: wait.as_millis() as u64 + 1,
        };
        self.reject_repeatable(caller, tool, err.to_string(), "rate_limited")
            .await;
        Err(err)
    }

    /// Step 2: the tool, if `caller` may use it. The agent learns nothing about tools it may
    /// not use; the audit log says which it was. A name that is not an identifier cannot be a
    /// tool: it is refused as unknown, described by its length, never repeated.
    async fn find(&self, caller: &Principal, name: &str) -> Result<&OfferedTool, CallError> {
        if let Some(offered) = self.tool_for(caller, name) {
            return Ok(offered);
        }
        let why = if let Err(e) = crate::util::input::identifier("name", name) {
            format!("unknown tool: {e}")
        } else if self.tools.contains_key(name) {
            format!(
                "tool `{name}` is hidden from agent `{}` by the policy (`agents.{}.tools`)",
                caller.name, caller.name
            )
        } else {
            format!("unknown tool `{name}`")
        };
        self.reject_repeatable(caller, name, why, "unknown_tool")
            .await;
        Err(CallError::UnknownTool(
            if crate::util::input::is_identifier(name) {
                name.to_owned()
            } else {
                crate::util::input::describe(name)
            },
        ))
    }

    /// Step 3, second half: where a pack tool's call goes, from `runners`, a `selector`, or
    /// (for a cluster-scoped tool) the server's choice, every one of them a runner the caller
    /// may target ([`Gateway::may_target`]); and its arguments as the audit log keeps them.
    /// Problems are added to `errors` (what the agent reads); the targets are only meaningful
    /// when there are none.
    fn resolve(
        &self,
        caller: &Principal,
        policy: &Policy,
        tool: &ToolRef,
        mut args: Args,
        mut errors: Vec<String>,
    ) -> Resolved {
        let selector = take_selector(&mut args.params, &mut errors);
        let out_of_reach = self.check_named(caller, policy, tool, &args.named, &mut errors);
        let mut targets = Targets {
            runners: args.named.clone(),
            runner_chosen_by_server: false,
        };
        if errors.is_empty() {
            match self.chosen_targets(caller, policy, tool, selector.as_ref(), &args.named) {
                Ok(chosen) => targets = chosen,
                Err(e) => errors.push(e),
            }
        }
        let shown_args = self.redact(tool, &args.params);
        Resolved {
            args,
            targets,
            shown_args,
            errors,
            out_of_reach,
        }
    }

    /// Step 3: each runner the call names must be one the caller may target and one that
    /// serves the tool's pack. A named runner out of the caller's reach reads to the agent
    /// exactly as one that does not exist (in `errors`); why it is out of reach is returned,
    /// for the audit log only.
    fn check_named(
        &self,
        caller: &Principal,
        policy: &Policy,
        tool: &ToolRef,
        named: &[String],
        errors: &mut Vec<String>,
    ) -> Vec<String> {
        let mut out_of_reach = Vec::new();
        for name in named {
            match self.may_target(caller, policy, name) {
                None => {
                    errors.push(format!(
                        "`runners`: {} is not a runner this agent may use (the tool's schema and `emisar.runners` list those it may)",
                        crate::util::input::describe(name)
                    ));
                    out_of_reach.push(self.out_of_reach(caller, policy, name));
                }
                Some(r) if !r.serves(&tool.pack) => errors.push(format!(
                    "`runners`: runner `{name}` does not serve pack `{}`",
                    tool.pack
                )),
                Some(_) => {}
            }
        }
        out_of_reach
    }

    /// Step 3: the targets of a call whose named runners all passed: the named ones, the ones
    /// `selector` matches, or the server's pick for a cluster-scoped tool; or why there are
    /// none.
    fn chosen_targets(
        &self,
        caller: &Principal,
        policy: &Policy,
        tool: &ToolRef,
        selector: Option<&Selector>,
        named: &[String],
    ) -> Result<Targets, String> {
        match (selector, named.is_empty(), tool.scope) {
            (None, false, _) => Ok(Targets {
                runners: named.to_vec(),
                runner_chosen_by_server: false,
            }),
            (Some(_), false, _) => Err("give `runners` or `selector`, not both".into()),
            (Some(selector), true, scope) => self.selected(caller, policy, tool, selector, scope),
            (None, true, Scope::Node) => Err(
                "`runners`: name at least one runner, or give a `selector` such as role=edge"
                    .into(),
            ),
            (None, true, Scope::Cluster) => self
                .targetable(caller, policy, &tool.pack)
                .into_iter()
                .next()
                .map(|best| Targets {
                    runners: vec![best],
                    runner_chosen_by_server: true,
                })
                .ok_or_else(|| format!("no runner serves pack `{}`", tool.pack)),
        }
    }

    /// Step 3: the runners serving the tool's pack that the caller may target and `selector`
    /// matches; for a cluster-scoped tool, the first of them (the server's pick).
    fn selected(
        &self,
        caller: &Principal,
        policy: &Policy,
        tool: &ToolRef,
        selector: &Selector,
        scope: Scope,
    ) -> Result<Targets, String> {
        let matched: Vec<String> = self
            .targetable(caller, policy, &tool.pack)
            .into_iter()
            .filter(|n| {
                self.runners
                    .get(n)
                    .is_some_and(|r| selector.matches(&r.labels))
            })
            .collect();
        if matched.is_empty() {
            return Err(format!(
                "`selector`: no runner serving pack `{}` matches `{selector}`",
                tool.pack
            ));
        }
        let runner_chosen_by_server = scope == Scope::Cluster;
        let runners = if runner_chosen_by_server {
            matched.into_iter().take(1).collect()
        } else {
            matched
        };
        Ok(Targets {
            runners,
            runner_chosen_by_server,
        })
    }

    /// Step 4, the one step that refuses a call it found: a call with errors is refused as
    /// invalid; then the policy in force decides ([`admission`]); then what a target runner
    /// would refuse anyway is refused now ([`refused_by_runners`]).
    fn admit(
        &self,
        caller: &Principal,
        policy: &Policy,
        tool: &ToolRef,
        resolved: &Resolved,
    ) -> Result<Admission, Refusal> {
        if let Some(refusal) = invalid(&tool.name, &resolved.errors, &resolved.out_of_reach) {
            return Err(refusal);
        }
        let (runners, params) = (&resolved.targets.runners, &resolved.args.params);
        let decision = self.decide_policy(policy, caller, tool, runners, params);
        let admission = admission(decision, tool.risk, policy)?;
        let refusal = refused_by_runners(
            &admission,
            || self.outside_runner_allowlists(tool, runners, params),
            || self.lowering_refused(&tool.name, runners),
        );
        match refusal {
            Some(refusal) => Err(refusal),
            None => Ok(admission),
        }
    }

    /// Step 4: the policy in force decides, from the tool, the caller, the target runners'
    /// labels and the arguments.
    fn decide_policy(
        &self,
        policy: &Policy,
        caller: &Principal,
        tool: &ToolRef,
        targets: &[String],
        params: &Map<String, Value>,
    ) -> Decision {
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
            caller,
            runners: &runners,
            args: params,
        };
        policy::decide(policy, &request)
    }

    /// Step 4, for a call that needs approval: the first value that a target runner's
    /// allowlist refuses, as that runner reported its `[allowlists]` in its last health
    /// answer. A runner whose allowlists the server has not read yet is left to refuse the
    /// call itself. The check is the runner's own ([`allowlist_admits`]), so the two cannot
    /// disagree.
    fn outside_runner_allowlists(
        &self,
        tool: &ToolRef,
        targets: &[String],
        params: &Map<String, Value>,
    ) -> Option<String> {
        for runner in targets {
            let Some(lists) = self.runners.allowlists(runner) else {
                continue;
            };
            for param in tool.params.iter() {
                let (Some(list_name), Some(value)) = (&param.allowlist, params.get(&param.name))
                else {
                    continue;
                };
                let admitted = lists
                    .get(list_name)
                    .is_some_and(|list| allowlist_admits(&param.kind, value, list));
                if !admitted {
                    return Some(format!(
                        "`{}` = {} is not in runner `{runner}`'s allowlist `{list_name}` ([allowlists] in its runner.toml), so it could never run there; no approval was requested",
                        param.name,
                        shown_value(param, value)
                    ));
                }
            }
        }
        None
    }

    /// Steps 5 to 8 for a call that needs no approval. A read its pack declares without side
    /// effect, and the policy has not raised, goes to every target at once; its intent and
    /// every outcome are then one durable append, before the agent reads anything (if it
    /// fails, every result is withheld). A write's intent is durable before it is sent; it
    /// then rolls out in waves ([`Self::write_in_waves`]).
    async fn run_now(
        &self,
        caller: &Principal,
        policy: &Policy,
        tool: &ToolRef,
        resolved: Resolved,
        call_id: String,
        lowered_by_policy: Option<&str>,
    ) -> Result<CallOutcome, CallError> {
        let actor = caller.actor();
        let audited = AuditedCall {
            actor: &actor,
            tool: &tool.name,
            args: &resolved.shown_args,
            reason: resolved.args.reason.as_deref(),
            call_id: &call_id,
            approval_id: None,
            on_behalf_of: caller.on_behalf_of.as_deref(),
        };
        let dispatch = self.dispatch(tool, &resolved.args, &call_id, lowered_by_policy);
        let intent = intent(&audited, &resolved.targets, lowered_by_policy);
        let runners = &resolved.targets.runners;
        let (results, halt) = if runs_as_read(tool, policy) {
            let results = self
                .read_on_all(tool, &dispatch, runners, &audited, intent)
                .await;
            (results, None)
        } else {
            self.audit
                .append(intent)
                .await
                .map_err(CallError::AuditUnavailable)?;
            let rolled = self
                .write_in_waves(policy, tool, &dispatch, runners, &audited)
                .await;
            (rolled.results, rolled.halt)
        };
        // 8. Hand the per-runner results back.
        let outcome = CallOutcome {
            call_id,
            tool: tool.name.clone(),
            runner_chosen_by_server: resolved.targets.runner_chosen_by_server,
            results,
            approval: None,
            halt,
            grant: None,
        };
        crate::server::metrics::tool_call(
            &tool.name,
            if outcome.all_failed() { "error" } else { "ok" },
        );
        Ok(outcome)
    }

    /// Steps 5 to 8 for a call that needs approval and runs under a grant instead: its
    /// intent names the grant and the use, and is one append with the use (`grant.used`),
    /// made before the grant's lock is released; then it runs as any write, each runner
    /// given the grant's text and signatures, which it checks again.
    async fn run_under_grant(
        &self,
        caller: &Principal,
        policy: &Policy,
        tool: &ToolRef,
        resolved: Resolved,
        call_id: String,
        grant: super::grants::GrantUse,
    ) -> Result<CallOutcome, CallError> {
        let actor = caller.actor();
        let audited = AuditedCall {
            actor: &actor,
            tool: &tool.name,
            args: &resolved.shown_args,
            reason: resolved.args.reason.as_deref(),
            call_id: &call_id,
            approval_id: None,
            on_behalf_of: caller.on_behalf_of.as_deref(),
        };
        let runners = &resolved.targets.runners;
        let mut how = json!({"grant": grant.id, "grant_use": grant.number});
        if grant.break_glass {
            how["break_glass"] = json!(true);
        }
        let intent = audited.tool_called(runners, resolved.targets.runner_chosen_by_server, how);
        let used = grant.used_event(&audited, runners);
        let appended = self
            .audit
            .append_all(vec![intent, used])
            .await
            .map_err(CallError::AuditUnavailable)?;
        drop(grant.lock);
        // A break-glass call runs only once the log that records it is witnessed: its
        // `grant.used` in a checkpoint the witness quorum cosigned, so no server can run it
        // and then hide it.
        if grant.break_glass {
            let used_id = appended.last().map(|e| e.id.clone()).unwrap_or_default();
            if let Err(why) = self.witnessed_event(&used_id).await {
                let why = format!(
                    "break-glass call {call_id} under window {}: {why}",
                    grant.id
                );
                let (shown_args, reason) = (resolved.shown_args, resolved.args.reason);
                return Err(self
                    .refuse(
                        caller,
                        &tool.name,
                        shown_args,
                        reason,
                        why.clone(),
                        CallError::NotWitnessed(why),
                    )
                    .await);
            }
        }
        let dispatch = Dispatch {
            grant: Some(&grant.proof),
            ..self.dispatch(tool, &resolved.args, &call_id, None)
        };
        let rolled = self
            .write_in_waves(policy, tool, &dispatch, runners, &audited)
            .await;
        let outcome = CallOutcome {
            call_id,
            tool: tool.name.clone(),
            runner_chosen_by_server: resolved.targets.runner_chosen_by_server,
            results: rolled.results,
            approval: None,
            halt: rolled.halt,
            grant: Some(json!({"grant_id": grant.id, "use": grant.number})),
        };
        crate::server::metrics::tool_call(
            &tool.name,
            if outcome.all_failed() { "error" } else { "ok" },
        );
        Ok(outcome)
    }

    /// What steps 6 and 7 send each runner: the call, signed per runner by the client.
    fn dispatch<'a>(
        &'a self,
        tool: &'a ToolRef,
        args: &'a Args,
        call_id: &'a str,
        lowered_by_policy: Option<&'a str>,
    ) -> Dispatch<'a> {
        let pack_sha256 = &self.packs.pack(&tool.pack).expect("tool has a pack").digest;
        Dispatch {
            raw: args.raw,
            lowered_by_policy,
            ..Dispatch::new(
                call_id,
                &tool.name,
                pack_sha256,
                &args.params,
                Mode::Execute,
            )
        }
    }

    /// Steps 6 and 7 for a write whose intent is durable: dispatch in waves (the policy's
    /// rollout for the tool), each wave's health gate before the next, halting at the first
    /// failure; each outcome audited as it lands.
    async fn write_in_waves(
        &self,
        policy: &Policy,
        tool: &ToolRef,
        dispatch: &Dispatch<'_>,
        runners: &[String],
        audited: &AuditedCall<'_>,
    ) -> Rolled {
        let plan = policy.rollout_for(&tool.name).0.plan(runners);
        let rollout = Rollout {
            plan: &plan,
            tool,
            pack_sha256: dispatch.pack_sha256,
            args: dispatch.args,
            audited,
            no_wave_from: None,
            only: None,
            first_wave_recorded: false,
        };
        self.roll_out(&rollout, |name: String, wave| async move {
            let dispatch = Dispatch {
                wave: Some(wave),
                ..*dispatch
            };
            self.run_on(&name, tool, &dispatch, audited).await
        })
        .await
    }

    /// Step 5 for a call that needs approval: it becomes a pending request (its intent
    /// audited and its preview run first, `approval_flow/request.rs`), and the call waits
    /// for people's decision ([`Gateway::wait`]).
    async fn ask_people(
        &self,
        caller: &Principal,
        tool: &ToolRef,
        resolved: Resolved,
        call_id: String,
        approvers: u32,
        ctx: &CallContext,
    ) -> Result<Answer, CallError> {
        let request = Request {
            call_id,
            tool,
            principal: caller,
            params: resolved.args.params,
            shown_args: resolved.shown_args,
            runners: resolved.targets.runners,
            runner_chosen_by_server: resolved.targets.runner_chosen_by_server,
            raw: resolved.args.raw,
            reason: resolved.args.reason.unwrap_or_default(),
            approvers,
        };
        let pending = self.request_approval(request).await?;
        if ctx.tasks {
            match self.file_task(caller, &pending).await {
                Ok(task) => return Ok(Answer::Task(task)),
                // The request stands; the client waits for it as one without Tasks would.
                Err(e) => {
                    tracing::error!(error = %e, approval_id = %pending.id, "could not file a task; waiting instead")
                }
            }
        }
        self.wait(&pending, ctx).await.map(Answer::Now)
    }

    /// Refuses a call that passed validation: [`Self::reject`] records it (its shown args,
    /// its reason and `why`), and `err` is what the caller gets back.
    pub(super) async fn refuse(
        &self,
        caller: &Principal,
        tool: &str,
        shown_args: Value,
        reason: Option<String>,
        why: String,
        err: CallError,
    ) -> CallError {
        self.reject(caller, tool, Some(shown_args), reason, why)
            .await;
        err
    }

    /// Records a refused call as `tool.rejected`. The call is refused whether or not the
    /// record could be written.
    ///
    /// What came from outside is stored only in a safe form: a tool name that is not an
    /// identifier, and any argument that is not short text (see
    /// [`crate::util::input::for_audit`]), are kept as their rendering (escaped preview,
    /// length, SHA-256).
    ///
    /// Refusals that pass the rate limit (invalid arguments, policy denials) are written one
    /// event each: they count against the rate limit, so they are bounded by it. The two a
    /// caller can repeat beyond it go through [`Self::reject_repeatable`].
    pub(super) async fn reject(
        &self,
        who: &Principal,
        tool: &str,
        args: Option<Value>,
        reason: Option<String>,
        why: String,
    ) {
        let event = rejected_event(who, tool, args, reason, why);
        let logged = logged_tool(&event);
        if let Err(e) = self.audit.append(event).await {
            // The call is refused either way; the missing record is itself worth an alarm.
            tracing::error!(error = %e, tool = %logged, "could not audit a rejected call");
        }
    }

    /// Records a refusal the caller can repeat as fast as it likes (rate limited, unknown
    /// tool): the first of its `class` in the window as `tool.rejected`, the rest counted
    /// into one `refusal.repeated` event per caller and window, so a flood of them costs
    /// bounded rows.
    async fn reject_repeatable(
        &self,
        who: &Principal,
        tool: &str,
        why: String,
        class: &'static str,
    ) {
        let event = rejected_event(who, tool, None, None, why);
        let logged = logged_tool(&event);
        let key = RefusalKey {
            kind: kind::TOOL_REJECTED,
            caller: event.actor.clone(),
            class,
        };
        if let Err(e) = self.audit.refused(key, event).await {
            tracing::error!(error = %e, tool = %logged, "could not audit a rejected call");
        }
    }
}

/// A call people were asked for, answered with why no grant covered it (`grant G: 3 of 3
/// calls used`), when a grant was looked at: in its approval's message.
fn with_not_covered(mut answer: Answer, not_covered: &[String]) -> Answer {
    if let (Answer::Now(outcome), false) = (&mut answer, not_covered.is_empty())
        && let Some(approval) = outcome.approval.as_mut()
    {
        approval.message = format!(
            "{} (no grant covered this call: {})",
            approval.message,
            not_covered.join("; ")
        );
    }
    answer
}

/// Step 3, first half: schema errors, and the arguments with `reason`, `raw` and `runners`
/// split off.
///
/// At the door, before the schema: no string anywhere in the arguments holds NUL (whatever
/// a pack's pattern allows), and `reason` is text without control or invisible formatting
/// characters. A reason that breaks the rule is not kept, so it is never audited.
fn validate(offered: &OfferedTool, whole: Map<String, Value>) -> (Args, Vec<String>) {
    let secret: Vec<&str> = offered
        .tool
        .as_ref()
        .map(|t| t.secret_params().collect())
        .unwrap_or_default();
    // Checked as one Value, without copying the arguments (they can be large).
    let whole = Value::Object(whole);
    let mut errors = crate::util::input::nul_free("arguments", &whole)
        .err()
        .into_iter()
        .collect::<Vec<_>>();
    errors.extend(
        crate::pack::validate_args(&offered.validator, &whole, &secret)
            .err()
            .unwrap_or_default(),
    );
    let Value::Object(mut params) = whole else {
        unreachable!("wrapped as an object just above")
    };
    let reason = params
        .remove("reason")
        .and_then(|v| v.as_str().map(str::to_owned))
        .filter(
            |r| match crate::util::input::text("reason", r, crate::pack::REASON_MAX_CHARS) {
                Ok(()) => true,
                Err(e) => {
                    errors.push(e);
                    false
                }
            },
        );
    let raw = params
        .remove("raw")
        .and_then(|v| v.as_bool())
        .unwrap_or(false);
    // A pack tool's `runners` says where it goes; a built-in's (`emisar.request_grant`) is
    // its own argument.
    let named: Vec<String> = match offered.tool {
        Some(_) => params
            .remove("runners")
            .and_then(|v| serde_json::from_value(v).ok())
            .unwrap_or_default(),
        None => Vec::new(),
    };
    (
        Args {
            params,
            reason,
            raw,
            named,
        },
        errors,
    )
}

/// Step 3: the `selector` argument, split off the params and parsed; a selector that does not
/// parse is an error.
fn take_selector(params: &mut Map<String, Value>, errors: &mut Vec<String>) -> Option<Selector> {
    let text = params
        .remove("selector")
        .and_then(|v| v.as_str().map(str::to_owned))?;
    Selector::parse(&text)
        .map_err(|e| errors.push(format!("`selector`: {e}")))
        .ok()
}

/// Step 4's first refusal: a call with `errors` is invalid. The agent reads the errors; the
/// audit log also reads what the agent is not told, why a runner it named is out of its
/// reach.
fn invalid(tool: &str, errors: &[String], out_of_reach: &[String]) -> Option<Refusal> {
    if errors.is_empty() {
        return None;
    }
    let mut errors = errors.to_vec();
    errors.dedup();
    let why = errors
        .iter()
        .chain(out_of_reach)
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join("; ");
    let err = CallError::Invalid {
        tool: tool.to_owned(),
        errors,
    };
    Some(Refusal { err, why })
}

/// Step 4, the policy's part: its denial is refused; a call that needs approval needs at
/// least one person; a risk:high tool the policy allows without approval is lowered by it,
/// and carries its digest.
fn admission(decision: Decision, risk: Risk, policy: &Policy) -> Result<Admission, Refusal> {
    match decision {
        Decision::Deny(why) => Err(Refusal {
            err: CallError::DeniedByPolicy(why.clone()),
            why,
        }),
        Decision::NeedsApproval { approvers } => Ok(Admission::NeedsApproval {
            approvers: approvers.max(1),
        }),
        Decision::Allow => Ok(Admission::Run {
            lowered_by_policy: (risk == Risk::High).then(|| policy.digest()),
        }),
    }
}

/// Step 4, the target runners' part: what a runner would refuse anyway is refused now. A
/// call that needs approval, with a value outside a target runner's allowlist
/// (`outside_allowlists`): it could never run there, so no one is asked to approve it (a
/// call that runs without approval gets the runner's own refusal, runner by runner). A call
/// the policy lowered, that a target runner's approvers file does not let run unapproved
/// (`lowering_refused`).
fn refused_by_runners(
    admission: &Admission,
    outside_allowlists: impl FnOnce() -> Option<String>,
    lowering_refused: impl FnOnce() -> Option<String>,
) -> Option<Refusal> {
    match admission {
        Admission::NeedsApproval { .. } => outside_allowlists().map(|why| Refusal {
            err: CallError::OutsideRunnerAllowlist(why.clone()),
            why,
        }),
        Admission::Run {
            lowered_by_policy: Some(_),
        } => lowering_refused().map(|why| Refusal {
            err: CallError::SignaturesUnsatisfiable(why.clone()),
            why,
        }),
        Admission::Run {
            lowered_by_policy: None,
        } => None,
    }
}

/// Whether a call runs as a read (steps 5 to 7 in one append): its pack declares it without
/// side effect, and the policy has not raised it.
fn runs_as_read(tool: &ToolRef, policy: &Policy) -> bool {
    tool.risk == Risk::Read && policy.risk(tool) == Risk::Read
}

/// Step 5's event, `tool.called`: where the call goes, and a lowering by the policy.
fn intent(
    audited: &AuditedCall<'_>,
    targets: &Targets,
    lowered_by_policy: Option<&str>,
) -> NewEvent {
    let how = match lowered_by_policy {
        Some(policy) => json!({"lowered_by_policy": policy}),
        None => json!({}),
    };
    audited.tool_called(&targets.runners, targets.runner_chosen_by_server, how)
}

/// The `tool.rejected` event of a refused call (see [`Gateway::reject`]).
fn rejected_event(
    who: &Principal,
    tool: &str,
    args: Option<Value>,
    reason: Option<String>,
    why: String,
) -> NewEvent {
    crate::server::metrics::tool_call(tool, "refused");
    let mut detail = json!({"error": why});
    let tool = if crate::util::input::is_identifier(tool) {
        Some(tool.to_owned())
    } else {
        detail["tool_name"] = crate::util::input::rendering(tool);
        None
    };
    NewEvent {
        actor: who.actor(),
        kind: kind::TOOL_REJECTED.into(),
        tool,
        args: args.map(|a| crate::util::input::for_audit(&a)),
        reason,
        outcome: Some("refused".into()),
        detail: Some(on_behalf_of(detail, who.on_behalf_of.as_deref())),
        ..Default::default()
    }
}

/// The tool of a rejected call as a log line may name it.
fn logged_tool(event: &NewEvent) -> String {
    event
        .tool
        .clone()
        .unwrap_or_else(|| "(not an identifier)".into())
}

/// `detail` with `on_behalf_of` added when the caller is an agent acting for a person, so
/// every event of its calls names that person.
pub(super) fn on_behalf_of(mut detail: Value, person: Option<&str>) -> Value {
    if let (Some(person), Some(map)) = (person, detail.as_object_mut()) {
        map.insert("on_behalf_of".into(), json!(person));
    }
    detail
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;
    use crate::pack::PackSet;
    use crate::server::policy::Format;

    #[test]
    fn the_selector_is_split_off_and_parsed_or_named_as_the_error() {
        let mut errors = Vec::new();
        let mut params = json!({"unit": "consul"}).as_object().unwrap().clone();
        assert!(take_selector(&mut params, &mut errors).is_none());
        assert!(errors.is_empty());
        params.insert("selector".into(), json!("role=edge"));
        let selector = take_selector(&mut params, &mut errors).unwrap();
        assert_eq!(selector.to_string(), "role=edge");
        assert_eq!(Value::Object(params.clone()), json!({"unit": "consul"}));
        params.insert("selector".into(), json!("role"));
        assert!(take_selector(&mut params, &mut errors).is_none());
        assert_eq!(errors, ["`selector`: selector pair 1 must be key=value"]);
        assert!(
            !params.contains_key("selector"),
            "never sent to the runners"
        );
    }

    #[test]
    fn a_call_with_errors_is_invalid_and_the_log_reads_why_a_runner_is_out_of_reach() {
        assert!(invalid("t.x", &[], &["runner `a` is outside".into()]).is_none());
        let errors = ["`unit`: too long".to_owned(), "`unit`: too long".to_owned()];
        let reach = ["no runner is named `b`".to_owned()];
        let Refusal { err, why } = invalid("t.x", &errors, &reach).unwrap();
        assert_eq!(why, "`unit`: too long; no runner is named `b`");
        let CallError::Invalid { tool, errors } = err else {
            panic!("{err:?}")
        };
        assert_eq!(tool, "t.x");
        assert_eq!(errors, ["`unit`: too long"], "each error once");
    }

    #[test]
    fn the_policy_denies_asks_people_or_lowers_a_high_risk_tool() {
        let policy = Policy::builtin();
        let Err(Refusal { err, why }) = admission(Decision::Deny("no".into()), Risk::Read, &policy)
        else {
            panic!("a denial is refused")
        };
        assert_eq!(why, "no");
        assert!(matches!(err, CallError::DeniedByPolicy(w) if w == "no"));
        let asks =
            |approvers| admission(Decision::NeedsApproval { approvers }, Risk::High, &policy);
        assert_eq!(asks(0).unwrap(), Admission::NeedsApproval { approvers: 1 });
        assert_eq!(asks(3).unwrap(), Admission::NeedsApproval { approvers: 3 });
        let runs = |risk| admission(Decision::Allow, risk, &policy).unwrap();
        assert_eq!(
            runs(Risk::High),
            Admission::Run {
                lowered_by_policy: Some(policy.digest())
            }
        );
        for risk in [Risk::Read, Risk::Low] {
            assert_eq!(
                runs(risk),
                Admission::Run {
                    lowered_by_policy: None
                }
            );
        }
    }

    #[test]
    fn each_admission_asks_the_runners_only_what_they_would_refuse() {
        let asked = Cell::new(Vec::new());
        let ask = |what: &'static str, answer: Option<&str>| {
            let asked = &asked;
            let answer = answer.map(str::to_owned);
            move || {
                let mut so_far = asked.take();
                so_far.push(what);
                asked.set(so_far);
                answer
            }
        };
        let needs_approval = Admission::NeedsApproval { approvers: 1 };
        let lowered = Admission::Run {
            lowered_by_policy: Some("d".into()),
        };
        let plain = Admission::Run {
            lowered_by_policy: None,
        };
        let refused = |admission: &Admission| {
            refused_by_runners(
                admission,
                ask("allowlists", Some("outside")),
                ask("lowering", Some("unsigned")),
            )
        };

        let Refusal { err, why } = refused(&needs_approval).unwrap();
        assert!(matches!(err, CallError::OutsideRunnerAllowlist(w) if w == "outside"));
        assert_eq!(why, "outside");
        assert_eq!(asked.take(), ["allowlists"]);

        let Refusal { err, why } = refused(&lowered).unwrap();
        assert!(matches!(err, CallError::SignaturesUnsatisfiable(w) if w == "unsigned"));
        assert_eq!(why, "unsigned");
        assert_eq!(asked.take(), ["lowering"]);

        assert!(refused(&plain).is_none());
        assert!(asked.take().is_empty(), "a plain run asks nothing");

        let admits = refused_by_runners(&needs_approval, ask("allowlists", None), || {
            unreachable!("a call that needs approval is not lowered")
        });
        assert!(admits.is_none());
    }

    #[test]
    fn a_read_runs_as_one_only_while_the_policy_leaves_it_a_read() {
        let packs = PackSet::load(None).unwrap();
        let read = packs.tool("consul.members").unwrap();
        let write = packs.tool("linux.systemctl_restart").unwrap();
        let builtin = Policy::builtin();
        assert!(runs_as_read(read, &builtin));
        assert!(!runs_as_read(write, &builtin));
        let raised = Policy::parse("risk: {consul.members: high}", Format::Yaml).unwrap();
        assert!(!runs_as_read(read, &raised));
    }
}
