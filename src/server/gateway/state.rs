//! The gateway itself: the tools it offers (pack tools and built-ins, each with its input
//! schema and validator), how it is tuned, and the policy in force (swapped whole on reload,
//! audited as `policy.loaded`).

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use serde_json::{Map, Value, json};
use tokio::sync::Semaphore;

use super::builtins::builtin_tools;
use crate::pack::{PackSet, Risk, ToolRef};
use crate::server::approvals::Approvals;
use crate::server::audit::failure_log::{SUMMARY_INTERVAL, SharedFailureLog, Wording};
use crate::server::audit::{AuditLog, NewEvent, kind};
use crate::server::policy::Policy;
use crate::server::principal::Principal;
use crate::server::runners::RetryBudget;
use crate::server::runners::client::RunnerClient;
use crate::server::runners::registry::Registry;
use crate::server::secrets::AuditKey;

/// The most runner calls in flight at once, across all tool calls of this server.
const MAX_IN_FLIGHT: usize = 256;

/// How reads whose append failed read in the log (`audit/failure_log.rs` decides when).
static UNAUDITED_READS: Wording = Wording {
    failed: "could not audit a read and its outcomes; its results were withheld",
    what: "audit appends of reads",
    units: "reads",
};

/// A tool as the gateway offers it: the pack tool plus its full input schema.
///
/// The name stands because it says what this is beside the pack's [`ToolRef`] it wraps: a
/// tool as offered to agents (`tools/list`, `tools/call`), a pack tool or a built-in.
pub struct OfferedTool {
    /// The pack tool; `None` for emisar's own built-in tools.
    pub tool: Option<ToolRef>,
    pub name: String,
    pub description: String,
    pub risk: Risk,
    /// Pack params + `runners` + `reason` (+ `raw`): the MCP input schema. Shared, not
    /// copied: rmcp asks for the tool (and so its schema) on every `tools/call`.
    pub input_schema: Arc<Map<String, Value>>,
    pub(super) validator: jsonschema::Validator,
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
    /// An approved request whose execution has not started this long after the deciding
    /// approval expires instead: people approved a change for now, not for whenever a
    /// replica gets to it (say, after an outage of the store).
    pub approved_start_within: Duration,
    /// The most approval requests one agent may have pending at once.
    pub max_pending_per_agent: u32,
    /// The longest a grant may live, from its request to its expiry.
    pub max_grant_lifetime: Duration,
    /// How often a revoked grant is sent again to a runner that did not acknowledge it.
    pub revocation_retry: Duration,
}

impl Limits {
    pub(crate) fn new(call_timeout: Duration, rate_per_second: u32, rate_burst: u32) -> Limits {
        Limits {
            call_timeout,
            rate_per_second,
            rate_burst,
            approval_ttl: Duration::from_secs(15 * 60),
            approval_wait: Duration::from_secs(120),
            progress_every: Duration::from_secs(10),
            approved_start_within: Duration::from_secs(5 * 60),
            max_pending_per_agent: 20,
            max_grant_lifetime: Duration::from_secs(
                crate::protocol::approval::grant::DEFAULT_MAX_LIFETIME_SECS,
            ),
            revocation_retry: super::grants::DEFAULT_REVOCATION_RETRY,
        }
    }
}

/// The call path's state: the tools it offers, the runners and the stores it reaches, its
/// limits and the policy in force. Built once from [`GatewayParts`].
pub struct Gateway {
    pub(super) packs: Arc<PackSet>,
    pub(super) tools: BTreeMap<String, OfferedTool>,
    pub(super) runners: Arc<Registry>,
    pub(super) audit: AuditLog,
    pub(super) client: RunnerClient,
    pub(super) limits: Limits,
    /// This replica's bucket per agent (on SQLite, one process, the whole rate limit).
    pub(super) limiter: DefaultKeyedRateLimiter<String>,
    /// On PostgreSQL, the buckets every replica shares, asked after `limiter` admits.
    pub(super) shared_limit: Option<Arc<crate::server::shared_limit::SharedLimit>>,
    pub(super) retry_budget: RetryBudget,
    pub(super) in_flight: Semaphore,
    pub(super) audit_key: Option<AuditKey>,
    pub(super) approvals: Approvals,
    /// People's grants to agents (`grants.rs`), in the approvals' store.
    pub(super) grants: crate::server::grants::Grants,
    /// Swapped whole on reload; each call decides under one version.
    pub(super) policy: std::sync::RwLock<Arc<Policy>>,
    /// `approvers_file`: requests are signed by people (see `signatures.rs`).
    pub(super) approvers: Option<Arc<super::signatures::ServerApprovers>>,
    /// `[transparency]` with witnesses: approvals carry witnessed proofs to runners that
    /// require them (see `witnessed.rs`).
    pub(super) witnessing: Option<super::witnessed::Witnessing>,
    /// Reads whose one append failed (each one's results withheld), logged as the audit
    /// writer logs its failed batches: the first, then a summary every 10 s, then the end.
    pub(super) read_failures: SharedFailureLog,
}

/// Everything a gateway is built from, each part decided by the server config (`app.rs`).
pub(crate) struct GatewayParts {
    pub(crate) packs: Arc<PackSet>,
    pub(crate) runners: Arc<Registry>,
    pub(crate) audit: AuditLog,
    pub(crate) client: RunnerClient,
    pub(crate) limits: Limits,
    /// Keys the HMAC of secret params in the audit log; a pack tool with a secret param
    /// needs it.
    pub(crate) audit_key: Option<AuditKey>,
    pub(crate) approvals: Approvals,
    /// `approvers_file`: requests are signed by its people (see `signatures.rs`).
    pub(crate) approvers: Option<super::signatures::ServerApprovers>,
    /// On PostgreSQL, agents' rate limits also hold across the replicas sharing the store.
    pub(crate) shared_limit: Option<Arc<crate::server::shared_limit::SharedLimit>>,
    /// Approved executions to runners with `require_witnessed` wait for a checkpoint the
    /// witness quorum cosigned and carry the approval's inclusion proof in it.
    pub(crate) witnessing: Option<super::witnessed::Witnessing>,
}

impl Gateway {
    /// The gateway of `parts`, offering every pack tool and the built-ins, under the built-in
    /// policy until [`Gateway::load_policy`] puts another in force. Refused: a tool with
    /// secret params and no `audit_key` to keep them.
    pub(crate) fn new(parts: GatewayParts) -> anyhow::Result<Self> {
        let tools = offered_tools(&parts.packs, parts.audit_key.is_some())?;
        crate::server::metrics::known_tools(tools.keys().map(String::as_str));
        let limits = parts.limits;
        Ok(Gateway {
            packs: parts.packs,
            tools,
            runners: parts.runners,
            audit: parts.audit,
            client: parts.client,
            limiter: RateLimiter::keyed(agent_quota(&limits)),
            shared_limit: parts.shared_limit,
            limits,
            retry_budget: RetryBudget::new(0.1, 10.0),
            in_flight: Semaphore::new(MAX_IN_FLIGHT),
            audit_key: parts.audit_key,
            grants: crate::server::grants::Grants::new(parts.approvals.db().clone()),
            approvals: parts.approvals,
            policy: std::sync::RwLock::new(Arc::new(Policy::builtin())),
            approvers: parts.approvers.map(Arc::new),
            read_failures: SharedFailureLog::new(&UNAUDITED_READS, SUMMARY_INTERVAL),
            witnessing: parts.witnessing,
        })
    }

    /// The policy in force.
    pub(crate) fn policy(&self) -> Arc<Policy> {
        self.policy
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Checks `policy` against the loaded packs, records `policy.loaded` (with its digest
    /// and source) and puts it in force. A policy that does not check is not loaded, and
    /// the refusal is audited too.
    pub(crate) async fn load_policy(
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
    pub(crate) fn tools_for<'a>(
        &'a self,
        caller: &'a Principal,
    ) -> impl Iterator<Item = &'a OfferedTool> + 'a {
        let policy = self.policy();
        self.tools
            .values()
            .filter(move |t| t.tool.is_none() || policy.may_use_tool(caller, &t.name))
    }

    pub(crate) fn tool_for(&self, caller: &Principal, name: &str) -> Option<&OfferedTool> {
        self.tools
            .get(name)
            .filter(|t| t.tool.is_none() || self.policy().may_use_tool(caller, name))
    }

    /// The input schema `caller` sees for `offered`: pack tools list the runners it may name.
    pub(crate) fn schema_for(
        &self,
        caller: &Principal,
        offered: &OfferedTool,
    ) -> Arc<Map<String, Value>> {
        match &offered.tool {
            Some(tool) => {
                let mut names = self.targetable(caller, &self.policy(), &tool.pack);
                names.sort();
                Arc::new(crate::pack::with_runner_names(
                    (*offered.input_schema).clone(),
                    &names,
                ))
            }
            None => offered.input_schema.clone(),
        }
    }

    /// The runner `name`, if `caller` may target it: the token's selector and the policy's
    /// runner selector for the agent both admit its labels. The one notion of "runners this
    /// caller may target", behind the runners a tool's schema lists ([`Gateway::schema_for`]),
    /// the runners a call may name or select, and the runner the server picks for a
    /// cluster-scoped tool: a runner outside it is as unknown to the caller as one that does
    /// not exist.
    pub(super) fn may_target(
        &self,
        caller: &Principal,
        policy: &Policy,
        name: &str,
    ) -> Option<crate::server::config::RunnerEntry> {
        self.runners.get(name).filter(|r| {
            caller
                .selector
                .as_ref()
                .is_none_or(|s| s.matches(&r.labels))
                && policy
                    .runner_selector(caller)
                    .is_none_or(|s| s.matches(&r.labels))
        })
    }

    /// Why `name` is not a runner `caller` may target, for the operator (the audit log's
    /// `tool.rejected`), never for the agent, which learns nothing about runners outside its
    /// reach: no such runner, or the line that keeps it out (the token's selector, the
    /// policy's `agents.NAME.runners`) with the runner's labels.
    pub(super) fn out_of_reach(&self, caller: &Principal, policy: &Policy, name: &str) -> String {
        let Some(runner) = self.runners.get(name) else {
            return format!("no runner is named {}", crate::util::input::describe(name));
        };
        let labels: Vec<String> = runner
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let labels = labels.join(",");
        let mut rules = Vec::new();
        if let Some(selector) = &caller.selector
            && !selector.matches(&runner.labels)
        {
            rules.push(format!(
                "the selector `{selector}` of agent `{}`'s token",
                caller.name
            ));
        }
        if let Some((line, selector)) = policy.runner_rule(caller)
            && !selector.matches(&runner.labels)
        {
            rules.push(format!("the policy's `{line} = \"{selector}\"`"));
        }
        format!(
            "runner `{name}` (labels `{labels}`) is outside the runners agent `{}` may use: {}",
            caller.name,
            rules.join(" and ")
        )
    }

    /// The runners serving `pack` that `caller` may target, healthiest first (the order the
    /// server picks in).
    pub(super) fn targetable(
        &self,
        caller: &Principal,
        policy: &Policy,
        pack: &str,
    ) -> Vec<String> {
        self.runners
            .serving(pack, None)
            .into_iter()
            .filter(|name| self.may_target(caller, policy, name).is_some())
            .collect()
    }

    /// The status of every runner `caller`'s token may see (its selector admits the labels),
    /// for the `emisar.runners` tool and `GET /api/runners`. Only admins read `last_error`: it
    /// holds transport errors and runner answers that name hosts, addresses and certificates
    /// of whatever a runner's URL reaches; everyone else reads the breaker and health alone.
    pub(crate) fn runners_visible_to(
        &self,
        caller: &Principal,
    ) -> Vec<crate::server::runners::registry::RunnerStatus> {
        let admin = caller.role == crate::server::principal::Role::Admin;
        self.runners
            .snapshot()
            .into_iter()
            .filter(|r| {
                caller
                    .selector
                    .as_ref()
                    .is_none_or(|s| s.matches(&r.labels))
            })
            .map(|mut r| {
                if !admin {
                    r.last_error = None;
                }
                r
            })
            .collect()
    }

    /// A tool by name, whoever asks (for schema lookups, not for authorization).
    pub(crate) fn tool(&self, name: &str) -> Option<&OfferedTool> {
        self.tools.get(name)
    }

    pub(crate) fn audit(&self) -> &AuditLog {
        &self.audit
    }

    /// The people of the server's `approvers_file`, who sign (None: no file).
    pub(crate) fn approvers(&self) -> Option<&crate::protocol::approval::Approvers> {
        self.approvers.as_deref().map(|a| &a.approvers)
    }

    pub(crate) fn runners(&self) -> &Arc<Registry> {
        &self.runners
    }

    pub(crate) fn approvals(&self) -> &Approvals {
        &self.approvals
    }

    pub(crate) fn packs(&self) -> &PackSet {
        &self.packs
    }
}

/// The tools a gateway offers: every tool of `packs`, then the built-ins. A tool with secret
/// params needs an audit key (`has_audit_key`), which keeps them as a keyed HMAC.
fn offered_tools(
    packs: &PackSet,
    has_audit_key: bool,
) -> anyhow::Result<BTreeMap<String, OfferedTool>> {
    let mut tools = BTreeMap::new();
    for tool in packs.tools() {
        if !has_audit_key && tool.secret_params().next().is_some() {
            anyhow::bail!(
                "tool `{}` has secret params, which the audit log stores as a keyed HMAC: set audit_key_file",
                tool.name
            );
        }
        let offered = OfferedTool::new(
            Some(tool.clone()),
            &tool.name,
            &tool.description,
            tool.risk,
            crate::pack::input_schema(tool),
        )?;
        tools.insert(tool.name.clone(), offered);
    }
    for builtin in builtin_tools()? {
        tools.insert(builtin.name.clone(), builtin);
    }
    Ok(tools)
}

/// Each agent's token bucket: `rate_per_second`, up to `rate_burst` at once (at least 1 each).
fn agent_quota(limits: &Limits) -> Quota {
    Quota::per_second(NonZeroU32::new(limits.rate_per_second.max(1)).expect("max(1)"))
        .allow_burst(NonZeroU32::new(limits.rate_burst.max(1)).expect("max(1)"))
}

impl OfferedTool {
    /// The tool `name` with its input schema, and the validator compiled from it.
    pub(super) fn new(
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
            input_schema: Arc::new(input_schema),
            validator,
        })
    }
}
