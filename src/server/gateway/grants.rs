//! The server's side of grants (issue 47): an agent asks for one (`emisar.request_grant`)
//! and reads its own (`emisar.grants`); people sign and revoke them (the grants API and
//! `emisar grants`); a call that needs approval runs at once under an active grant that
//! admits it ([`Gateway::under_grant`], step 5 of `call.rs`), carrying the grant's text and
//! signatures to its runners, which check them again; a revocation is pushed to every runner
//! (`POST /v1/grants/revoked`) until each acknowledged it or the grant expired.
//!
//! *Invariants:* a signature is verified against the server's approvers file before it is
//! stored, and a grant is active only once the file's quorum holds over its text for every
//! write it covers; nobody signs a grant they (or the agent acting for them) asked for; a
//! call runs under a grant only if the grant is active in the store, not revoked in the log,
//! within its expiry, signed by enough people (checked again, as its runners will), admits
//! the call on every target runner, and leaves a use for it in total and on every target
//! runner, counted from the log under the grant's lock and recorded (`grant.used` with the
//! call's `tool.called`, one append) before that lock is released; an agent reads only its
//! own grants.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value, json};

use super::call::Args;
use super::dispatch::AuditedCall;
use super::outcome::{CallError, CallOutcome, RunnerResult};
use super::state::{Gateway, OfferedTool};
use crate::pack::{Risk, ToolRef};
use crate::protocol::approval::grant::{self, Constraint, Grant, GrantProof, Runners};
use crate::protocol::approval::{Signature, verify_quorum, verify_signature};
use crate::protocol::signing::RevokedGrant;
use crate::selector::Selector;
use crate::server::approvals::Vote;
use crate::server::audit::{NewEvent, format_at, kind};
use crate::server::grants::{GrantRow, Status, Uses};
use crate::server::principal::{Principal, Role};

/// The most grants `emisar.grants` and one page of the API list.
const MAX_LISTED: i64 = 200;
/// The longest revocation reason, in characters.
const MAX_REVOKE_REASON_CHARS: usize = 2000;

/// Why a grant operation of people or agents failed.
#[derive(Debug, thiserror::Error)]
pub enum GrantError {
    /// Unknown, or (for an agent) another agent's: the two read the same.
    #[error("no grant has id `{0}`")]
    NotFound(String),
    /// The input breaks a rule; the text names the field and the rule.
    #[error("{0}")]
    Invalid(String),
    /// The person may not do this, or the grant is not in a state that allows it.
    #[error("refused: {0}")]
    Refused(String),
    #[error("refused: the audit log cannot record this ({0}), so nothing changed")]
    Audit(#[from] crate::server::audit::AuditError),
    #[error("the grant store is unavailable: {0}")]
    Store(#[from] sqlx::Error),
}

/// A grant as people and its agent read it: the row, what it allows in words, and how many
/// calls remain.
pub(super) fn view(row: &GrantRow, uses: &Uses) -> Value {
    let grant = Grant::parse(&row.text).ok();
    let (calls, per_runner) = grant
        .as_ref()
        .map_or((0, 0), |g| (g.max_calls, g.max_calls_per_runner));
    let runners_used: BTreeMap<&String, Value> = uses
        .per_runner
        .iter()
        .map(|(r, n)| {
            (
                r,
                json!({"used": n, "left": per_runner.saturating_sub(*n).min(calls.saturating_sub(uses.total))}),
            )
        })
        .collect();
    json!({
        "grant_id": row.id,
        "agent": row.agent,
        "status": row.status,
        "break_glass": row.break_glass,
        "expires_at": row.expires_at,
        "requested_at": row.requested_at,
        "requested_by": row.requester_name,
        "on_behalf_of": row.on_behalf_of,
        "tools": grant.as_ref().map(|g| g.tools.clone()),
        "runners": grant.as_ref().map(|g| runners_json(&g.runners)),
        "args": grant.as_ref().map(|g| args_json(&g.args)),
        "reason": grant.as_ref().map(|g| g.reason.clone()),
        "calls": calls,
        "calls_per_runner": per_runner,
        "calls_used": uses.total,
        "calls_left": calls.saturating_sub(uses.total),
        "runners_used": runners_used,
        "required": row.required,
        "signed_by": row.signatures.iter().filter_map(|v| v.signed.as_ref().map(|s| s.person.clone())).collect::<Vec<_>>(),
        "signatures": row.signatures,
        "decided_at": row.decided_at,
        "revoked_at": row.revoked_at,
        "revoked_by": row.revoked_by,
        "revoke_reason": row.revoke_reason,
        "text": row.text,
        "sha256": crate::digest::sha256_hex(row.text.as_bytes()),
        "sign": {"cli": format!("emisar grants approve {} --ssh-key PATH", row.id)},
    })
}

fn runners_json(runners: &Runners) -> Value {
    match runners {
        Runners::Names(names) => json!({"names": names}),
        Runners::Labels(selector) => json!({"labels": selector.to_string()}),
    }
}

fn args_json(args: &BTreeMap<String, Constraint>) -> Value {
    args.iter()
        .map(|(name, c)| {
            let v = match c {
                Constraint::In(values) => json!({"in": values}),
                Constraint::Range { min, max } => json!({"min": min, "max": max}),
            };
            (name.clone(), v)
        })
        .collect::<Map<String, Value>>()
        .into()
}

/// What `emisar.request_grant` asks for, read from its arguments (schema-checked first).
struct Ask {
    tools: Vec<String>,
    runners: Runners,
    args: BTreeMap<String, Constraint>,
    calls: u32,
    calls_per_runner: u32,
    expires_in_secs: u64,
}

/// Reads `emisar.request_grant`'s arguments; an error names the field and the rule.
fn read_ask(params: &Map<String, Value>, max_lifetime: u64) -> Result<Ask, String> {
    let mut tools: Vec<String> = params["tools"]
        .as_array()
        .ok_or("`tools`: a list of tool names or globs")?
        .iter()
        .map(|t| {
            t.as_str()
                .map(str::to_owned)
                .ok_or("`tools`: each is a string")
        })
        .collect::<Result<_, _>>()?;
    tools.sort();
    tools.dedup();
    let runners = read_runners(&params["runners"])?;
    let args =
        match params.get("args") {
            None => BTreeMap::new(),
            Some(Value::Object(map)) => map
                .iter()
                .map(|(name, c)| Ok((name.clone(), read_constraint(name, c)?)))
                .collect::<Result<_, String>>()?,
            Some(_) => return Err(
                "`args`: an object of argument name → {\"in\": [...]} or {\"min\": a, \"max\": b}"
                    .into(),
            ),
        };
    let whole = |field: &str| -> Result<Option<u64>, String> {
        match params.get(field) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or_else(|| format!("`{field}` must be a whole number of at least 1")),
        }
    };
    let calls = whole("calls")?.ok_or("`calls` is required: the most calls in all")?;
    let calls_per_runner = whole("calls_per_runner")?.unwrap_or(calls);
    let expires_in_secs = whole("expires_in_secs")?.ok_or("`expires_in_secs` is required")?;
    if !(1..=max_lifetime).contains(&expires_in_secs) {
        return Err(format!(
            "`expires_in_secs` must be 1 to {max_lifetime} (this server's max_grant_lifetime_secs)"
        ));
    }
    let count = |field: &str, n: u64| {
        u32::try_from(n)
            .ok()
            .filter(|n| (1..=grant::MAX_CALLS).contains(n))
            .ok_or_else(|| format!("`{field}` must be 1 to {}", grant::MAX_CALLS))
    };
    let calls = count("calls", calls)?;
    let calls_per_runner = count("calls_per_runner", calls_per_runner)?;
    if calls_per_runner > calls {
        return Err("`calls_per_runner` must be at most `calls`".into());
    }
    Ok(Ask {
        tools,
        runners,
        args,
        calls,
        calls_per_runner,
        expires_in_secs,
    })
}

/// `runners`: `{"names": [...]}` or `{"labels": {"k": "v"}}`.
fn read_runners(v: &Value) -> Result<Runners, String> {
    const RULE: &str =
        "`runners` is {\"names\": [\"edge-1\", …]} or {\"labels\": {\"role\": \"edge\"}}";
    let Value::Object(map) = v else {
        return Err(RULE.into());
    };
    match (map.get("names"), map.get("labels"), map.len()) {
        (Some(Value::Array(names)), None, 1) => {
            let mut names: Vec<String> = names
                .iter()
                .map(|n| {
                    n.as_str()
                        .filter(|n| crate::util::input::is_identifier(n))
                        .map(str::to_owned)
                        .ok_or("`runners.names`: each is a runner's name")
                })
                .collect::<Result<_, _>>()?;
            names.sort();
            names.dedup();
            if names.is_empty() {
                return Err("`runners.names` lists at least one runner".into());
            }
            Ok(Runners::Names(names))
        }
        (None, Some(Value::Object(labels)), 1) => {
            if labels.is_empty() {
                return Err("`runners.labels` has at least one label".into());
            }
            let text = labels
                .iter()
                .map(|(k, v)| match v.as_str() {
                    Some(v) => Ok(format!("{k}={v}")),
                    None => Err(format!("`runners.labels.{k}` must be a string")),
                })
                .collect::<Result<Vec<_>, _>>()?
                .join(",");
            Selector::parse(&text)
                .map(Runners::Labels)
                .map_err(|e| format!("`runners.labels`: {e}"))
        }
        _ => Err(RULE.into()),
    }
}

/// One argument's constraint: `{"in": [...]}` or `{"min": a, "max": b}`.
fn read_constraint(name: &str, v: &Value) -> Result<Constraint, String> {
    let rule = || {
        format!(
            "`args.{name}` is {{\"in\": [values]}} or {{\"min\": a, \"max\": b}} (whole numbers)"
        )
    };
    let Value::Object(map) = v else {
        return Err(rule());
    };
    match (map.get("in"), map.get("min"), map.get("max"), map.len()) {
        (Some(Value::Array(values)), None, None, 1) => {
            let mut values = values.clone();
            values.sort_by_key(Value::to_string);
            values.dedup();
            Ok(Constraint::In(values))
        }
        (None, Some(min), Some(max), 2) => match (min.as_i64(), max.as_i64()) {
            (Some(min), Some(max)) => Ok(Constraint::Range { min, max }),
            _ => Err(rule()),
        },
        _ => Err(rule()),
    }
}

/// Why no grant let a call run, one line per grant looked at (`grant G: …`).
pub(super) type NotCovered = Vec<String>;

impl Gateway {
    /// The write tools `patterns` cover among those `caller` may use (by the policy in force).
    fn covered_tools(&self, caller: Option<&Principal>, patterns: &[String]) -> Vec<ToolRef> {
        let policy = self.policy();
        let globs: Vec<glob::Pattern> = patterns
            .iter()
            .filter_map(|p| glob::Pattern::new(p).ok())
            .collect();
        self.tools
            .values()
            .filter_map(|o| o.tool.clone())
            .filter(|t| policy.risk(t) != Risk::Read)
            .filter(|t| globs.iter().any(|g| g.matches(&t.name)))
            .filter(|t| caller.is_none_or(|c| policy.may_use_tool(c, &t.name)))
            .collect()
    }

    /// `emisar.request_grant`: the grant `caller` asks for, checked, audited
    /// (`grant.requested`) and stored; answered with its id, the text people sign, how many
    /// must, and how they sign it.
    pub(super) async fn request_grant_tool(
        &self,
        caller: &Principal,
        offered: &OfferedTool,
        args: Args,
        mut errors: Vec<String>,
    ) -> Result<CallOutcome, CallError> {
        let reason = args.reason.clone();
        let grant = if errors.is_empty() {
            match self.grant_asked(caller, &args) {
                Ok(grant) => Some(grant),
                Err(e) => {
                    errors.push(e);
                    None
                }
            }
        } else {
            None
        };
        let (Some((grant, text)), true) = (grant, errors.is_empty()) else {
            self.reject(caller, &offered.name, None, reason, errors.join("; "))
                .await;
            return Err(CallError::Invalid {
                tool: offered.name.clone(),
                errors,
            });
        };
        let now = chrono::Utc::now();
        // As for approval requests: one agent waits on at most `max_pending_per_agent` grants
        // at once, so a flood of asks fills neither the table nor people's notices. Requests
        // made at the same moment can pass together and overshoot by their number.
        let max = self.limits.max_pending_per_agent;
        let waiting = self
            .grants
            .list(Some(&grant.agent), Some(Status::Requested), i64::from(max))
            .await
            .map_err(|e| CallError::Approval(e.into()))?
            .iter()
            .filter(|g| !g.expired_at(now))
            .count() as u64;
        if waiting >= u64::from(max) {
            return Err(CallError::TooManyGrantsAsked {
                agent: caller.name.clone(),
                waiting,
                max,
            });
        }
        let row = GrantRow {
            id: grant.id.clone(),
            agent: grant.agent.clone(),
            requester_name: caller.name.clone(),
            on_behalf_of: caller.on_behalf_of.clone(),
            text: text.clone(),
            status: Status::Requested,
            required: grant.required,
            signatures: vec![],
            break_glass: false,
            expires_at: grant.expires_at.clone(),
            requested_at: format_at(now),
            decided_at: None,
            decided_by: None,
            revoked_at: None,
            revoked_by: None,
            revoke_reason: None,
        };
        let event = NewEvent {
            actor: caller.actor(),
            kind: kind::GRANT_REQUESTED.into(),
            tool: Some(offered.name.clone()),
            reason: reason.clone(),
            outcome: Some("ok".into()),
            detail: Some(super::call::on_behalf_of(
                json!({"grant": grant.id, "text": text, "required": grant.required, "expires_at": grant.expires_at}),
                caller.on_behalf_of.as_deref(),
            )),
            ..Default::default()
        };
        self.audit
            .append(event)
            .await
            .map_err(CallError::AuditUnavailable)?;
        self.grants
            .insert(&row)
            .await
            .map_err(|e| CallError::Approval(e.into()))?;
        let mut output = view(&row, &Uses::default());
        output["message"] = json!(format!(
            "grant {} asked for: {} people of the approvers file must sign it (`emisar grants approve {}`); once they have, calls it admits run without a new request. `emisar.grants` shows where it stands.",
            grant.id, grant.required, grant.id
        ));
        Ok(builtin_outcome(&offered.name, output))
    }

    /// The grant `caller` asks for in `args`, with its text; or what is wrong with it.
    fn grant_asked(&self, caller: &Principal, args: &Args) -> Result<(Grant, String), String> {
        let Some(server) = &self.approvers else {
            return Err("this server has no approvers_file: a grant is signed by the people of one, so none can be asked for".into());
        };
        let max = self.limits.max_grant_lifetime.as_secs();
        let ask = read_ask(&args.params, max)?;
        let reason = args
            .reason
            .clone()
            .filter(|r| !r.trim().is_empty())
            .ok_or("`reason` is required: people read it when they sign")?;
        let covered = self.covered_tools(Some(caller), &ask.tools);
        for pattern in &ask.tools {
            let glob = glob::Pattern::new(pattern)
                .map_err(|e| format!("`tools`: `{pattern}` is not a glob: {e}"))?;
            if !covered.iter().any(|t| glob.matches(&t.name)) {
                return Err(format!(
                    "`tools`: `{pattern}` covers no write tool this agent may use"
                ));
            }
        }
        // A write whose preview captures values runs only with the values people saw when
        // they approved it: no grant can stand in for that.
        if let Some(tool) = covered.iter().find(|t| t.needs_preview_values()) {
            return Err(format!(
                "`tools`: `{}` runs only with the values its preview captures when people approve it, so no grant can cover it",
                tool.name
            ));
        }
        let mut required = 1;
        for tool in &covered {
            match server.approvers.rule(&tool.name) {
                Some(rule) if rule.grants => required = required.max(rule.approvals),
                _ => {
                    return Err(format!(
                        "`tools`: the approvers file's rule for `{}` does not let grants run it (`grants = true`)",
                        tool.name
                    ));
                }
            }
        }
        if let Runners::Names(names) = &ask.runners {
            let policy = self.policy();
            if let Some(name) = names
                .iter()
                .find(|n| self.may_target(caller, &policy, n).is_none())
            {
                return Err(format!(
                    "`runners.names`: {} is not a runner this agent may use",
                    crate::util::input::describe(name)
                ));
            }
        }
        if let Some(name) = ask.args.keys().find(|a| {
            !covered
                .iter()
                .any(|t| t.params.iter().any(|p| &p.name == *a))
        }) {
            return Err(format!(
                "`args.{name}`: no granted tool takes an argument `{name}`"
            ));
        }
        let expires = chrono::Utc::now() + chrono::Duration::seconds(ask.expires_in_secs as i64);
        let grant = Grant {
            id: uuid::Uuid::now_v7().to_string(),
            agent: caller.actor(),
            break_glass: false,
            tools: ask.tools,
            runners: ask.runners,
            args: ask.args,
            max_calls: ask.calls,
            max_calls_per_runner: ask.calls_per_runner,
            required,
            reason,
            expires_at: expires.format("%Y-%m-%dT%H:%M:%SZ").to_string(),
        };
        let text = grant.text().map_err(|e| e.to_string())?;
        Ok((grant, text))
    }

    /// `emisar.grants`: the caller's own grants, newest first, with what remains of each.
    pub(super) async fn grants_tool(
        &self,
        caller: &Principal,
        offered: &OfferedTool,
        reason: Option<String>,
    ) -> Result<CallOutcome, CallError> {
        let rows = self
            .grants_of(Some(&caller.actor()), None)
            .await
            .map_err(unavailable)?;
        let mut listed = Vec::with_capacity(rows.len());
        for row in &rows {
            let uses = self
                .grants
                .uses(&row.id)
                .await
                .map_err(|e| CallError::Approval(e.into()))?;
            let mut v = view(row, &uses);
            // The agent needs what it may do, not who signed with which key.
            if let Some(map) = v.as_object_mut() {
                map.remove("signatures");
            }
            listed.push(v);
        }
        let output = json!({"grants": listed});
        self.audit
            .append(NewEvent {
                actor: caller.actor(),
                kind: kind::TOOL_CALLED.into(),
                tool: Some(offered.name.clone()),
                args: Some(json!({})),
                reason,
                outcome: Some("ok".into()),
                result_digest: Some(crate::digest::json_digest(&output)),
                detail: caller
                    .on_behalf_of
                    .as_ref()
                    .map(|p| json!({"on_behalf_of": p})),
                ..Default::default()
            })
            .await
            .map_err(CallError::AuditUnavailable)?;
        Ok(builtin_outcome(&offered.name, output))
    }

    /// Grants newest first (an agent's, or everyone's), each open one past its expiry
    /// marked expired first.
    pub(crate) async fn grants_of(
        &self,
        agent: Option<&str>,
        status: Option<Status>,
    ) -> Result<Vec<GrantRow>, GrantError> {
        let rows = self.grants.list(agent, None, MAX_LISTED).await?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            let row = self.expire_if_due(row).await?;
            if status.is_none_or(|s| s == row.status) {
                out.push(row);
            }
        }
        Ok(out)
    }

    /// Grant `id` as people see it, with its uses; an open one past its expiry is marked
    /// expired first.
    pub(crate) async fn grant_view(&self, id: &str) -> Result<Value, GrantError> {
        let row = self.grant_row(id).await?;
        let uses = self.grants.uses(&row.id).await?;
        Ok(view(&row, &uses))
    }

    async fn grant_row(&self, id: &str) -> Result<GrantRow, GrantError> {
        let row = self
            .grants
            .get(id)
            .await?
            .ok_or_else(|| GrantError::NotFound(id.to_owned()))?;
        self.expire_if_due(row).await
    }

    /// `row` as it stands: an open grant past its expiry is moved to expired, audited as
    /// `grant.expired` (once: the move is guarded).
    async fn expire_if_due(&self, row: GrantRow) -> Result<GrantRow, GrantError> {
        let now = chrono::Utc::now();
        if !row.status.is_open() || !row.expired_at(now) {
            return Ok(row);
        }
        if self
            .grants
            .close(&row.id, Status::Expired, None, &format_at(now), None)
            .await?
        {
            let event = grant_event(&row, "system", kind::GRANT_EXPIRED, json!({}));
            if let Err(e) = self.audit.append(event).await {
                tracing::error!(error = %e, grant = %row.id, "could not audit a grant's expiry");
            }
        }
        Ok(GrantRow {
            status: Status::Expired,
            ..row
        })
    }

    /// A person's signature on grant `id`: verified against the approvers file over the
    /// grant's text, audited (`grant.signed`, and `grant.active` when it is the one that makes
    /// the quorum) and stored. The grant as it stands after.
    pub(crate) async fn sign_grant(
        &self,
        who: &Principal,
        id: &str,
        signature: Signature,
        note: Option<String>,
    ) -> Result<Value, GrantError> {
        let Some(server) = self.approvers.clone() else {
            return Err(GrantError::Refused(
                "this server has no approvers_file to verify a grant's signatures against".into(),
            ));
        };
        let lock = self.grants.lock(id).await?;
        let row = self.grant_row(id).await?;
        if row.status != Status::Requested {
            return Err(GrantError::Refused(format!(
                "grant {id} is {}, not requested: only a requested grant is signed",
                row.status.as_str()
            )));
        }
        self.check_signer(who, &row)?;
        let signed = verify_signature(&server.approvers, &row.text, &signature)
            .map_err(|e| GrantError::Refused(format!("`signature`: {e}")))?;
        // Nor with the key of the person who asked, sent from another account (red team 6,
        // B1): the approvers file's person named as the asking account (or as the person an
        // agent acts for) does not count for their own grant or window.
        if signed.person == row.requester_name
            || row.on_behalf_of.as_deref() == Some(signed.person.as_str())
        {
            return Err(GrantError::Refused(format!(
                "`signature`: {} of the approvers file asked for this grant (account `{}`{}): someone else must sign it",
                signed.person,
                row.requester_name,
                row.on_behalf_of
                    .as_deref()
                    .map(|p| format!(", on behalf of `{p}`"))
                    .unwrap_or_default()
            )));
        }
        // One account signs once, whichever keys it holds: holding another person's key does
        // not make one account two people (as for approvals: "you approved this already").
        if row.signatures.iter().any(|v| v.user == who.name) {
            return Err(GrantError::Refused(format!(
                "`{}` signed this grant already: each account signs once, and someone else must sign it too",
                who.actor()
            )));
        }
        if let Some(earlier) = row
            .signatures
            .iter()
            .find(|v| v.signed.as_ref().is_some_and(|s| s.person == signed.person))
        {
            return Err(GrantError::Refused(format!(
                "`signature`: {} of the approvers file already signed this grant (as `{}`): each person counts once",
                signed.person, earlier.user
            )));
        }
        let now = chrono::Utc::now();
        let mut votes = row.signatures.clone();
        votes.push(Vote {
            user: who.name.clone(),
            at: format_at(now),
            note,
            signature: Some(signature),
            signed: Some(signed.clone()),
        });
        let active = self.quorum_holds(&server.approvers, &row, &votes)?;
        let detail = json!({
            "person": signed.person, "key_id": signed.key_id, "alg": signed.alg,
            "signatures": votes.len(), "required": row.required,
        });
        let mut events = vec![grant_event(&row, &who.actor(), kind::GRANT_SIGNED, detail)];
        if active {
            events.push(grant_event(
                &row,
                &who.actor(),
                kind::GRANT_ACTIVE,
                json!({"signed_by": votes.iter().filter_map(|v| v.signed.as_ref().map(|s| s.person.clone())).collect::<Vec<_>>()}),
            ));
        }
        self.audit.append_all(events).await?;
        let status = if active {
            Status::Active
        } else {
            Status::Requested
        };
        let at = format_at(now);
        let decided = active.then_some((who.actor(), at));
        let stored = self
            .grants
            .sign(
                id,
                row.signatures.len(),
                &votes,
                status,
                decided.as_ref().map(|(by, at)| (by.as_str(), at.as_str())),
            )
            .await?;
        if !stored {
            return Err(GrantError::Refused(format!(
                "grant {id} changed while it was being signed; look at it again and sign it again"
            )));
        }
        drop(lock);
        self.grant_view(id).await
    }

    /// Whether `who` may sign or revoke `row`: not the one that asked (nor the person the
    /// agent acts for), and holding a role the policy lets approve every write it covers.
    fn check_signer(&self, who: &Principal, row: &GrantRow) -> Result<(), GrantError> {
        if who.name == row.requester_name {
            return Err(GrantError::Refused(
                "you asked for this grant yourself: someone else must sign it".into(),
            ));
        }
        if row.on_behalf_of.as_deref() == Some(who.name.as_str()) {
            return Err(GrantError::Refused(format!(
                "agent `{}` asked for this grant on your behalf: someone else must sign it",
                row.requester_name
            )));
        }
        let grant = Grant::parse(&row.text).map_err(|e| GrantError::Refused(e.to_string()))?;
        let policy = self.policy();
        for tool in self.covered_tools(None, &grant.tools) {
            if !who.roles.iter().any(|r| policy.may_approve(*r, &tool.name)) {
                return Err(GrantError::Refused(format!(
                    "`{}` may not approve `{}` (policy roles), so may not sign a grant covering it",
                    who.actor(),
                    tool.name
                )));
            }
        }
        Ok(())
    }

    /// Whether `votes` make `row` active: enough distinct people of the approvers file
    /// signed its text for every write it covers (the file's rule for each, and the
    /// grant's `required`), by the very check its runners make.
    fn quorum_holds(
        &self,
        approvers: &crate::protocol::approval::Approvers,
        row: &GrantRow,
        votes: &[Vote],
    ) -> Result<bool, GrantError> {
        let signatures: Vec<Signature> = votes.iter().filter_map(|v| v.signature.clone()).collect();
        if (signatures.len() as u32) < row.required {
            return Ok(false);
        }
        let grant = Grant::parse(&row.text).map_err(|e| GrantError::Refused(e.to_string()))?;
        for tool in self.covered_tools(None, &grant.tools) {
            if let Err(e) = verify_quorum(
                approvers,
                &tool.name,
                &row.text,
                &signatures,
                grant.required,
            ) {
                // Enough people, and still short: the file asks for more (SSH signatures, a
                // stricter rule): say so rather than store a grant no runner would honour.
                if signatures.len() as u32 >= row.required {
                    return Err(GrantError::Refused(format!(
                        "`signature`: for `{}`: {e}",
                        tool.name
                    )));
                }
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// A person revokes grant `id`: audited (`grant.revoked`) and marked at once, under the
    /// grant's lock (no call is between counting and recording its use), so nothing more runs
    /// under it on any replica; then every runner is told, until it acknowledges.
    pub(crate) async fn revoke_grant(
        self: &Arc<Self>,
        who: &Principal,
        id: &str,
        reason: &str,
    ) -> Result<Value, GrantError> {
        crate::util::input::text("reason", reason, MAX_REVOKE_REASON_CHARS)
            .map_err(GrantError::Invalid)?;
        if reason.trim().is_empty() {
            return Err(GrantError::Invalid(
                "`reason`: a revocation says why".into(),
            ));
        }
        if !who
            .roles
            .iter()
            .any(|r| matches!(r, Role::Approver | Role::Admin))
        {
            return Err(GrantError::Refused(format!(
                "`{}` may not revoke grants: approvers and admins may",
                who.actor()
            )));
        }
        let lock = self.grants.lock(id).await?;
        let row = self.grant_row(id).await?;
        if !row.status.is_open() {
            return Err(GrantError::Refused(format!(
                "grant {id} is {}: only a requested or active grant is revoked",
                row.status.as_str()
            )));
        }
        let event = grant_event(
            &row,
            &who.actor(),
            kind::GRANT_REVOKED,
            json!({"reason": reason}),
        );
        self.audit.append(event).await?;
        let now = format_at(chrono::Utc::now());
        self.grants
            .close(id, Status::Revoked, Some(&who.actor()), &now, Some(reason))
            .await?;
        drop(lock);
        self.spawn_revocation(row.clone());
        self.grant_view(id).await
    }

    /// Tells every registered runner that `row` is revoked (`POST /v1/grants/revoked`),
    /// retrying each that did not answer 2xx every `health_probe_interval_ms` until it does
    /// or the grant expired; each acknowledgement audited (`grant.revocation_delivered`).
    pub(crate) fn spawn_revocation(self: &Arc<Self>, row: GrantRow) {
        let me = self.clone();
        tokio::spawn(async move { me.push_revocation(&row).await });
    }

    async fn push_revocation(&self, row: &GrantRow) {
        let Ok(grant) = Grant::parse(&row.text) else {
            return;
        };
        let Ok(expires) = grant.expires_unix() else {
            return;
        };
        let revoked = vec![RevokedGrant {
            id: row.id.clone(),
            expires,
        }];
        let mut pending: BTreeSet<String> =
            self.runners.entries().into_iter().map(|e| e.name).collect();
        let mut tries = 0u32;
        while !pending.is_empty() && crate::protocol::signing::now() < expires {
            tries += 1;
            for runner in pending.clone() {
                let Some(endpoint) = self.runners.endpoint(&runner) else {
                    pending.remove(&runner);
                    continue;
                };
                match self
                    .client
                    .revoke(
                        &runner,
                        &endpoint,
                        revoked.clone(),
                        self.limits.call_timeout,
                    )
                    .await
                {
                    Ok(()) => {
                        pending.remove(&runner);
                        let mut event = grant_event(
                            row,
                            "system",
                            kind::GRANT_REVOCATION_DELIVERED,
                            json!({"tries": tries}),
                        );
                        event.runner = Some(runner.clone());
                        if let Err(e) = self.audit.append(event).await {
                            tracing::error!(error = %e, grant = %row.id, %runner, "could not audit a delivered revocation");
                        }
                    }
                    Err(e) => {
                        tracing::warn!(grant = %row.id, %runner, tries, error = %e.detail(), "a runner did not take a grant's revocation; trying again")
                    }
                }
            }
            if !pending.is_empty() {
                tokio::time::sleep(self.limits.revocation_retry).await;
            }
        }
    }

    /// At start: tells every runner again of the grants revoked and not yet expired (a
    /// replica that revoked one may have stopped before every runner acknowledged it).
    pub(crate) async fn resend_revocations(self: &Arc<Self>) {
        match self.grants.revoked_unexpired().await {
            Ok(rows) => rows.into_iter().for_each(|row| self.spawn_revocation(row)),
            Err(e) => {
                tracing::error!(error = %e, "could not read the revoked grants to tell the runners again")
            }
        }
    }

    /// Step 5 for a call that needs approval: an active grant of the caller's that admits it
    /// on every target runner and has a use left runs it now, its use recorded with its
    /// intent under the grant's lock; else why none did, one line per grant looked at.
    pub(super) async fn under_grant(
        &self,
        caller: &Principal,
        tool: &ToolRef,
        runners: &[String],
        params: &Map<String, Value>,
    ) -> Result<Result<GrantUse, NotCovered>, CallError> {
        let Some(server) = &self.approvers else {
            return Ok(Err(vec![]));
        };
        let actor = caller.actor();
        let rows = self
            .grants_of(Some(&actor), Some(Status::Active))
            .await
            .map_err(unavailable)?;
        let mut why = Vec::new();
        for row in rows {
            let proof = GrantProof {
                text: row.text.clone(),
                signatures: row
                    .signatures
                    .iter()
                    .filter_map(|v| v.signature.clone())
                    .collect(),
                approvers: server.signed.clone(),
            };
            if let Err(e) =
                self.grant_admits(&server.approvers, &actor, tool, runners, params, &proof)
            {
                why.push(format!("grant {}: {e}", row.id));
                continue;
            }
            if row.break_glass && self.witnessing.is_none() {
                why.push(format!(
                    "grant {}: a break-glass window's calls run only witnessed, and this server has no witnesses ([transparency] witnesses in emisar.toml)",
                    row.id
                ));
                continue;
            }
            match self.take_use(&row, runners).await {
                Ok(Ok(taken)) => {
                    return Ok(Ok(GrantUse {
                        id: row.id,
                        number: taken.number,
                        break_glass: row.break_glass,
                        proof,
                        lock: taken.lock,
                    }));
                }
                Ok(Err(e)) => why.push(format!("grant {}: {e}", row.id)),
                Err(e) => {
                    tracing::error!(error = %e, grant = %row.id, "could not count a grant's uses; asking people instead");
                    why.push(format!("grant {}: its uses could not be counted", row.id));
                }
            }
        }
        Ok(Err(why))
    }

    /// Whether the grant in `proof` admits this call on every one of `runners`, signed
    /// and within its time, as each runner will check it.
    fn grant_admits(
        &self,
        approvers: &crate::protocol::approval::Approvers,
        actor: &str,
        tool: &ToolRef,
        runners: &[String],
        params: &Map<String, Value>,
        proof: &GrantProof,
    ) -> Result<(), String> {
        let now = crate::protocol::signing::now();
        let max = self.limits.max_grant_lifetime.as_secs();
        for runner in runners {
            let labels = self
                .runners
                .get(runner)
                .map(|r| r.labels)
                .unwrap_or_default();
            let call = grant::Call {
                tool: &tool.name,
                runner,
                labels: &labels,
                args: params,
                agent: Some(actor),
            };
            grant::check(approvers, &call, proof, now, max)?;
        }
        Ok(())
    }

    /// Under the grant's lock: its uses from the log, refused when revoked there or when a
    /// use more would pass `calls` or any target's `calls_per_runner`; else the lock, held
    /// until the use is recorded, and which use this is.
    async fn take_use(
        &self,
        row: &GrantRow,
        runners: &[String],
    ) -> Result<Result<Taken, String>, sqlx::Error> {
        let lock = self.grants.lock(&row.id).await?;
        // Read again under the lock: a revocation takes it too.
        let status = self.grants.get(&row.id).await?.map(|r| r.status);
        if status != Some(Status::Active) {
            return Ok(Err(format!(
                "it is {}",
                status.map_or("gone", Status::as_str)
            )));
        }
        let uses = self.grants.uses(&row.id).await?;
        let grant = match Grant::parse(&row.text) {
            Ok(g) => g,
            Err(e) => return Ok(Err(e.to_string())),
        };
        // The uses and the revocation are read from the log: a log with events missing since
        // the grant was asked for (a `grant.used` or `grant.revoked` deleted) counts nothing.
        let Some(requested_seq) = uses.requested_seq else {
            return Ok(Err(
                "the audit log holds no `grant.requested` event for it".into()
            ));
        };
        if let Some(gap) =
            crate::server::audit::proofs::missing_from(self.grants.db(), requested_seq).await?
        {
            return Ok(Err(format!(
                "the audit log is missing events since it was asked for ({gap}), so its uses and revocation cannot be counted; nothing runs under it"
            )));
        }
        if let Err(e) = uses_left(&grant, &uses, runners) {
            return Ok(Err(e));
        }
        Ok(Ok(Taken {
            number: uses.total + 1,
            lock,
        }))
    }
}

/// Whether one more call on `runners` fits `grant`'s counts, given its `uses`: each runner it
/// runs on is one of the grant's `calls`.
fn uses_left(grant: &Grant, uses: &Uses, runners: &[String]) -> Result<(), String> {
    if uses.revoked {
        return Err("the audit log has it revoked".into());
    }
    // A call counts once per runner it runs on: `calls` bounds the writes that run, as
    // `calls_per_runner` does on each runner.
    let more = runners.len().max(1) as u32;
    if uses.total + more > grant.max_calls {
        return Err(match uses.total >= grant.max_calls {
            true => format!("{} of {} calls used", uses.total, grant.max_calls),
            false => format!(
                "{} of {} calls used, and this call would run on {more} runners",
                uses.total, grant.max_calls
            ),
        });
    }
    for runner in runners {
        let used = uses.per_runner.get(runner).copied().unwrap_or(0);
        if used >= grant.max_calls_per_runner {
            return Err(format!(
                "{used} of {} calls on runner `{runner}` used",
                grant.max_calls_per_runner
            ));
        }
    }
    Ok(())
}

/// A use taken under a grant's lock.
struct Taken {
    number: u32,
    lock: crate::server::grants::UseLock,
}

/// A call's use of a grant: which grant, which use, what its runners get; the lock is held
/// until the use is in the log.
pub(super) struct GrantUse {
    pub(super) id: String,
    pub(super) number: u32,
    /// A break-glass window's: the call is flagged and waits to be witnessed before it runs.
    pub(super) break_glass: bool,
    pub(super) proof: GrantProof,
    pub(super) lock: crate::server::grants::UseLock,
}

impl GrantUse {
    /// The `grant.used` event of this use, for the call `audited` on `runners`.
    pub(super) fn used_event(&self, audited: &AuditedCall<'_>, runners: &[String]) -> NewEvent {
        NewEvent {
            actor: audited.actor.to_owned(),
            kind: kind::GRANT_USED.into(),
            tool: Some(audited.tool.to_owned()),
            call_id: Some(audited.call_id.to_owned()),
            outcome: Some("ok".into()),
            detail: Some(super::call::on_behalf_of(
                json!({"grant": self.id, "use": self.number, "call_id": audited.call_id, "runners": runners, "break_glass": self.break_glass}),
                audited.on_behalf_of,
            )),
            ..Default::default()
        }
    }
}

/// An event of `row`'s life by `actor`: its detail names the grant.
fn grant_event(row: &GrantRow, actor: &str, kind: &str, mut detail: Value) -> NewEvent {
    detail["grant"] = json!(row.id);
    NewEvent {
        actor: actor.to_owned(),
        kind: kind.into(),
        outcome: Some("ok".into()),
        detail: Some(super::call::on_behalf_of(
            detail,
            row.on_behalf_of.as_deref(),
        )),
        ..Default::default()
    }
}

/// A grant store's failure on an agent's call: the store's, as the approvals' would be.
fn unavailable(e: GrantError) -> CallError {
    match e {
        GrantError::Store(e) => CallError::Approval(e.into()),
        GrantError::Audit(e) => CallError::AuditUnavailable(e),
        other => CallError::Approval(crate::server::approvals::ApprovalError::Refused(
            other.to_string(),
        )),
    }
}

/// A built-in tool's answer: one result from `emisar` with `output`.
fn builtin_outcome(tool: &str, output: Value) -> CallOutcome {
    CallOutcome {
        call_id: uuid::Uuid::now_v7().to_string(),
        tool: tool.to_owned(),
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
    }
}

/// How long the revocation push waits between tries by default.
pub(crate) const DEFAULT_REVOCATION_RETRY: Duration = Duration::from_secs(2);

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(calls: u32, per_runner: u32) -> Grant {
        Grant {
            id: "g".into(),
            agent: "agent:a".into(),
            break_glass: false,
            tools: vec!["linux.systemctl_restart".into()],
            runners: Runners::Names(vec!["n1".into()]),
            args: BTreeMap::new(),
            max_calls: calls,
            max_calls_per_runner: per_runner,
            required: 2,
            reason: "r".into(),
            expires_at: "2030-01-01T00:00:00Z".into(),
        }
    }

    #[test]
    fn a_use_is_left_only_within_both_counts_and_never_after_a_logged_revocation() {
        let runners = ["n1".to_owned(), "n2".to_owned()];
        let mut uses = Uses::default();
        uses_left(&grant(3, 2), &uses, &runners).unwrap();
        uses.total = 3;
        let e = uses_left(&grant(3, 2), &uses, &runners).unwrap_err();
        assert_eq!(e, "3 of 3 calls used");
        // Two calls left, and a call on two runners is two of them (red team 5, B3) ...
        uses.total = 1;
        uses_left(&grant(3, 2), &uses, &runners).unwrap();
        // ... while one left does not run a call on two.
        uses.total = 2;
        let e = uses_left(&grant(3, 2), &uses, &runners).unwrap_err();
        assert_eq!(e, "2 of 3 calls used, and this call would run on 2 runners");
        uses.total = 1;
        uses.per_runner.insert("n2".into(), 2);
        let e = uses_left(&grant(3, 2), &uses, &runners).unwrap_err();
        assert_eq!(e, "2 of 2 calls on runner `n2` used");
        uses_left(&grant(3, 2), &uses, &runners[..1]).unwrap();
        uses.revoked = true;
        let e = uses_left(&grant(3, 2), &uses, &runners[..1]).unwrap_err();
        assert!(e.contains("revoked"), "{e}");
    }

    #[test]
    fn an_ask_names_the_field_and_the_rule_it_broke() {
        let read = |v: Value| read_ask(v.as_object().unwrap(), 3600);
        let ok = json!({"tools": ["linux.systemctl_restart"], "runners": {"labels": {"role": "edge"}},
                        "args": {"unit": {"in": ["traefik", "consul"]}, "memory": {"min": 0, "max": 8}},
                        "calls": 3, "expires_in_secs": 600});
        let ask = read(ok.clone()).unwrap();
        assert_eq!(ask.calls_per_runner, 3, "defaults to `calls`");
        assert_eq!(
            ask.args["unit"],
            Constraint::In(vec![json!("consul"), json!("traefik")]),
            "sorted as the text wants them"
        );
        for (field, bad, why) in [
            (
                "expires_in_secs",
                json!(3601),
                "`expires_in_secs` must be 1 to 3600",
            ),
            ("calls", json!(0), "`calls` must be 1 to 1000"),
            (
                "calls_per_runner",
                json!(4),
                "`calls_per_runner` must be at most `calls`",
            ),
            ("runners", json!({"any": 1}), "`runners` is"),
            (
                "runners",
                json!({"names": []}),
                "`runners.names` lists at least one",
            ),
            ("args", json!({"unit": {"between": 1}}), "`args.unit` is"),
            ("calls", json!("3"), "`calls` must be a whole number"),
        ] {
            let mut v = ok.clone();
            v[field] = bad;
            let e = read(v).err().unwrap();
            assert!(e.contains(why), "{field}: {e}");
        }
    }
}
