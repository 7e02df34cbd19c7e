//! emisar's own tools, answered by the server itself: `emisar.runners` (runner health),
//! `emisar.approval_status` / `emisar.approval_wait` (the caller's own approval requests
//! only), and `emisar.request_grant` / `emisar.grants` (the caller's own grants, `grants.rs`).
//! They run nothing on a node.

use std::time::Duration;

use serde_json::{Map, Value, json};

use super::approval_flow::{pending_outcome, settled_outcome};
use super::call::{Args, CallContext};
use super::outcome::{CallError, CallOutcome, RunnerResult};
use super::state::{Gateway, OfferedTool};
use crate::digest::json_digest;
use crate::pack::Risk;
use crate::server::approvals::ApprovalError;
use crate::server::audit::{NewEvent, kind};
use crate::server::principal::Principal;

/// The built-in tool that shows runner health to agents.
pub const RUNNERS_TOOL: &str = "emisar.runners";
/// The built-in tool that reports on one of the caller's approval requests.
pub const APPROVAL_STATUS_TOOL: &str = "emisar.approval_status";
/// The built-in tool that waits (again) for one of the caller's approval requests.
pub const APPROVAL_WAIT_TOOL: &str = "emisar.approval_wait";

/// The built-in tool an agent asks people for a grant with.
pub const REQUEST_GRANT_TOOL: &str = "emisar.request_grant";
/// The built-in tool that lists the caller's grants and what remains of each.
pub const GRANTS_TOOL: &str = "emisar.grants";

const ASKING: &str = "Why you are asking. Recorded in the audit log.";

/// The built-in tools, each with its input schema.
pub(super) fn builtin_tools() -> anyhow::Result<Vec<OfferedTool>> {
    let object = |properties: Value, required: Value| {
        let mut schema = Map::new();
        schema.insert("type".into(), json!("object"));
        schema.insert("properties".into(), properties);
        schema.insert("required".into(), required);
        schema.insert("additionalProperties".into(), json!(false));
        schema
    };
    let approval_schema = || {
        object(
            json!({
                "approval_id": {"type": "string", "pattern": "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$",
                                "description": "The approval_id a pending call returned."},
                "reason": crate::pack::reason_schema(ASKING),
            }),
            json!(["approval_id", "reason"]),
        )
    };
    Ok(vec![
        OfferedTool::new(
            None,
            REQUEST_GRANT_TOOL,
            "Asks people for a grant: a signed, time-boxed mandate under which your writes of the named tools, on the named runners, with arguments within the given constraints, run without a new approval each, up to `calls` in all and `calls_per_runner` on one runner. Answers at once with the grant id and the text people sign; `emisar.grants` shows when it is active. A call it does not cover is asked of people as before.",
            Risk::Read,
            object(
                grant_request_properties(),
                json!(["tools", "runners", "calls", "expires_in_secs", "reason"]),
            ),
        )?,
        OfferedTool::new(
            None,
            GRANTS_TOOL,
            "Your grants, newest first: status (requested, active, revoked, expired), expiry, what each allows, and how many calls remain in all and per runner.",
            Risk::Read,
            object(
                json!({"reason": crate::pack::reason_schema(ASKING)}),
                json!(["reason"]),
            ),
        )?,
        OfferedTool::new(
            None,
            RUNNERS_TOOL,
            "emisar's runners and their health: breaker state (closed, half-open, open) and since when, last heartbeat, last call. (Why a runner failed is in the server's log and, for admins, in `/api/runners`.)",
            Risk::Read,
            object(
                json!({"reason": crate::pack::reason_schema(ASKING)}),
                json!(["reason"]),
            ),
        )?,
        OfferedTool::new(
            None,
            APPROVAL_STATUS_TOOL,
            "Where one of your approval requests stands (pending, approved, denied with the approver's note, expired, executing, executed with its result, failed). Returns at once.",
            Risk::Read,
            approval_schema(),
        )?,
        OfferedTool::new(
            None,
            APPROVAL_WAIT_TOOL,
            "Waits for humans to decide one of your approval requests, with progress notifications, and returns the call's result once it ran (or the request id again if nobody decided yet). Cancelling this call withdraws a request that is still pending.",
            Risk::Read,
            approval_schema(),
        )?,
    ])
}

/// The input of `emisar.request_grant`.
fn grant_request_properties() -> Value {
    json!({
        "tools": {"type": "array", "minItems": 1, "maxItems": 64,
                  "items": {"type": "string", "minLength": 1, "maxLength": 128},
                  "description": "Tool names or globs (`nomad.job_*`) the grant covers; writes only."},
        "runners": {"type": "object",
                    "description": "The runners it covers: {\"names\": [\"edge-1\"]} or {\"labels\": {\"role\": \"edge\"}}.",
                    "properties": {
                        "names": {"type": "array", "minItems": 1, "items": {"type": "string"}},
                        "labels": {"type": "object", "additionalProperties": {"type": "string"}}
                    },
                    "additionalProperties": false},
        "args": {"type": "object",
                 "description": "Per argument, what it must be: {\"in\": [values]} or {\"min\": a, \"max\": b} (whole numbers). An argument not named here is not constrained.",
                 "additionalProperties": {"type": "object"}},
        "calls": {"type": "integer", "minimum": 1, "maximum": 1000, "description": "The most calls in all."},
        "calls_per_runner": {"type": "integer", "minimum": 1, "maximum": 1000,
                             "description": "The most calls on one runner (default: `calls`)."},
        "expires_in_secs": {"type": "integer", "minimum": 1,
                            "description": "How long it lives from now, at most the server's max_grant_lifetime_secs (default 3600)."},
        "reason": crate::pack::reason_schema("Why you need it; people read it when they sign. Recorded in the audit log."),
    })
}

impl Gateway {
    /// Steps 3 to 8 for a built-in tool.
    pub(super) async fn builtin_call(
        &self,
        caller: &Principal,
        offered: &OfferedTool,
        mut args: Args,
        mut errors: Vec<String>,
        ctx: &CallContext,
    ) -> Result<CallOutcome, CallError> {
        if offered.name == REQUEST_GRANT_TOOL {
            return self.request_grant_tool(caller, offered, args, errors).await;
        }
        if offered.name == GRANTS_TOOL && errors.is_empty() {
            return self.grants_tool(caller, offered, args.reason).await;
        }
        // `emisar.grants` with errors is refused as `emisar.runners` refuses them.
        if offered.name == RUNNERS_TOOL || offered.name == GRANTS_TOOL {
            return self
                .runners_tool(caller, offered, args.reason, errors)
                .await;
        }
        let approval_id = args
            .params
            .remove("approval_id")
            .and_then(|v| v.as_str().map(str::to_owned));
        match approval_id {
            Some(id) if errors.is_empty() => {
                self.approval_tool(caller, offered, &id, args.reason, ctx)
                    .await
            }
            _ => {
                if errors.is_empty() {
                    errors.push("`approval_id` is required".into());
                }
                self.reject(caller, &offered.name, None, args.reason, errors.join("; "))
                    .await;
                Err(CallError::Invalid {
                    tool: offered.name.clone(),
                    errors,
                })
            }
        }
    }

    /// `emisar.runners`: the health of the runners the caller may see.
    async fn runners_tool(
        &self,
        principal: &Principal,
        offered: &OfferedTool,
        reason: Option<String>,
        errors: Vec<String>,
    ) -> Result<CallOutcome, CallError> {
        let actor = principal.actor();
        if !errors.is_empty() {
            self.reject(principal, &offered.name, None, reason, errors.join("; "))
                .await;
            return Err(CallError::Invalid {
                tool: offered.name.clone(),
                errors,
            });
        }
        // Time-ordered, as every call id (see `store::chain_after`).
        let call_id = uuid::Uuid::now_v7().to_string();
        // A token limited to a selector sees only its runners, here as everywhere.
        let visible = self.runners_visible_to(principal);
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
                detail: behalf_detail(principal),
                ..Default::default()
            })
            .await
            .map_err(CallError::AuditUnavailable)?;
        Ok(CallOutcome {
            call_id,
            tool: offered.name.clone(),
            runner_chosen_by_server: false,
            approval: None,
            halt: None,
            grant: None,
            results: vec![RunnerResult {
                runner: "emisar".into(),
                ok: true,
                output: Some(output),
                truncated: false,
                error: None,
                error_kind: None,
                duration_ms: 0,
            }],
        })
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
            Ok(row) if row.requester_name == principal.name => Ok(row),
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
                detail: behalf_detail(principal),
                ..Default::default()
            })
            .await
            .map_err(CallError::AuditUnavailable)?;
        let row = row?;
        if offered.name == APPROVAL_WAIT_TOOL {
            return self.wait(&row, ctx).await;
        }
        Ok(settled_outcome(&row)?.unwrap_or_else(|| pending_outcome(&row, Duration::ZERO)))
    }
}

/// The detail of a built-in tool's event: only the person the agent acts for, if any, so
/// every event of its calls names that person.
fn behalf_detail(principal: &Principal) -> Option<Value> {
    principal
        .on_behalf_of
        .as_ref()
        .map(|p| json!({"on_behalf_of": p}))
}
