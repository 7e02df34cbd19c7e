//! A call that needs approval becomes a pending request: refused before anything is stored
//! when it holds a secret, when its agent has too many pending or when no one could sign it;
//! else its intent is audited, its preview runs on every target and the request is stored
//! bound to all of it.

use serde_json::{Map, Value, json};

use super::super::call::on_behalf_of;
use super::super::dispatch::AuditedCall;
use super::super::outcome::CallError;
use super::super::state::Gateway;
use crate::digest::{canonical_json, json_digest};
use crate::pack::ToolRef;
use crate::protocol::Mode;
use crate::server::approvals::{Approval, State};
use crate::server::audit::{NewEvent, format_at, kind};
use crate::server::principal::Principal;
use crate::server::runners::client::{Dispatch, RunnerAnswer, RunnerError};

/// A call that needs approval, after validation and policy.
pub(in crate::server::gateway) struct Request<'a> {
    pub(in crate::server::gateway) call_id: String,
    pub(in crate::server::gateway) tool: &'a ToolRef,
    pub(in crate::server::gateway) principal: &'a Principal,
    pub(in crate::server::gateway) params: Map<String, Value>,
    pub(in crate::server::gateway) shown_args: Value,
    pub(in crate::server::gateway) runners: Vec<String>,
    pub(in crate::server::gateway) runner_chosen_by_server: bool,
    pub(in crate::server::gateway) raw: bool,
    pub(in crate::server::gateway) reason: String,
    pub(in crate::server::gateway) approvers: u32,
}

impl Gateway {
    /// Refuses a request before it is stored: audited as `tool.rejected` with the args and
    /// reason it came with, and `err` (whose text is the record's error) handed back.
    async fn refuse_request(&self, r: Request<'_>, err: CallError) -> CallError {
        let why = err.to_string();
        self.refuse(
            r.principal,
            &r.tool.name,
            r.shown_args,
            Some(r.reason),
            why,
            err,
        )
        .await
    }

    /// Audits the intent, runs the tool's read-only preview on every target, and stores a
    /// pending request bound to all of it.
    pub(in crate::server::gateway) async fn request_approval(
        &self,
        r: Request<'_>,
    ) -> Result<Approval, CallError> {
        let signed_by = match self.may_ask_people(&r).await? {
            Ok(signed_by) => signed_by,
            Err(refusal) => return Err(self.refuse_request(r, refusal).await),
        };
        let required = signed_by.unwrap_or(r.approvers);
        let actor = r.principal.actor();
        // A UUIDv7: its time says when the request was made, which signers and runners bound
        // its lifetime by (`protocol::approval::check_lifetime`). Made before the intent, so
        // `tool.called` names the request and an auditor finds the whole story by its id.
        let now = chrono::Utc::now();
        let id = uuid::Uuid::now_v7().to_string();
        self.audit_request_intent(&r, &actor, &id, required, signed_by.is_some())
            .await?;
        let tool = r.tool;
        let pack_sha256 = self
            .packs
            .pack(&tool.pack)
            .expect("tool has a pack")
            .digest
            .clone();
        let preview = match &tool.preview {
            None => None,
            Some(_) => Some(self.run_preview(&r, &actor, &pack_sha256).await?),
        };
        let ttl = chrono::Duration::from_std(self.limits.approval_ttl)
            .unwrap_or(chrono::Duration::minutes(15));
        // The rollout, fixed now: the runners in the order the call named them (the first
        // are the canary), in waves as the policy's `rollout` line for the tool says.
        let plan = self.policy().rollout_for(&tool.name).0.plan(&r.runners);
        let mut filed = Filed {
            id,
            actor,
            risk: self.policy().risk(tool).as_str().to_owned(),
            pack_sha256,
            preview,
            required,
            statement: None,
            plan,
            now,
            ttl,
        };
        if signed_by.is_some() {
            match self.statement_of(&r, &filed) {
                Ok(text) => filed.statement = Some(text),
                Err(refusal) => return Err(self.refuse_request(r, refusal).await),
            }
        }
        self.file_request(pending_request(r, filed)).await
    }

    /// Whether the call may be put to people: `Ok(people the runners' approvers files need,
    /// where one checks signatures)`, or `Err(the refusal)`, checked before anything runs. The
    /// outer error is the store's, which could not count the agent's pending requests.
    async fn may_ask_people(
        &self,
        r: &Request<'_>,
    ) -> Result<Result<Option<u32>, CallError>, CallError> {
        let tool = r.tool;
        if tool.secret_params().next().is_some() {
            // A request keeps the args its execution will use; a secret would sit in the
            // approvals table in clear. Refuse until requests can hold secrets sealed.
            return Ok(Err(CallError::NeedsApprovalSecret {
                tool: tool.name.clone(),
            }));
        }
        // Checked before the preview runs, so a flood of requests runs no previews. Requests
        // made at the same moment can pass together and overshoot by their number.
        let max = self.limits.max_pending_per_agent;
        let pending = self.approvals.pending_of(&r.principal.name).await?;
        if pending >= u64::from(max) {
            return Ok(Err(CallError::TooManyPending {
                agent: r.principal.name.clone(),
                pending,
                max,
            }));
        }
        // Runners that check people's signatures: as many people as their approvers file
        // needs, or a refusal now when it could never be satisfied (nobody is asked).
        Ok(self
            .signatures_needed(&tool.name, &r.runners, r.approvers)
            .map_err(CallError::SignaturesUnsatisfiable))
    }

    /// `tool.called` for a call that will wait for people, naming request `id`.
    async fn audit_request_intent(
        &self,
        r: &Request<'_>,
        actor: &str,
        id: &str,
        required: u32,
        signed: bool,
    ) -> Result<(), CallError> {
        let audited = AuditedCall {
            actor,
            tool: &r.tool.name,
            args: &r.shown_args,
            reason: Some(&r.reason),
            call_id: &r.call_id,
            approval_id: Some(id),
            on_behalf_of: r.principal.on_behalf_of.as_deref(),
        };
        let how = json!({"needs_approval": true, "approvers": required, "signed": signed});
        self.audit
            .append(audited.tool_called(&r.runners, r.runner_chosen_by_server, how))
            .await
            .map(|_| ())
            .map_err(CallError::AuditUnavailable)
    }

    /// The statement people will sign for the request, or the refusal when it cannot be
    /// written. Its expiry is the request's, plus the time an approved request has to start,
    /// in whole seconds rounded up (the statement's form has no fraction).
    fn statement_of(&self, r: &Request<'_>, f: &Filed) -> Result<String, CallError> {
        let start_within = chrono::Duration::from_std(self.limits.approved_start_within)
            .unwrap_or(chrono::Duration::minutes(5));
        self.statement_for(
            &f.id,
            &r.tool.name,
            &f.pack_sha256,
            &r.params,
            &r.runners,
            f.preview.as_ref(),
            &f.plan,
            f.required,
            &f.actor,
            f.now + f.ttl + start_within + chrono::Duration::seconds(1),
        )
        .map_err(|e| {
            CallError::SignaturesUnsatisfiable(format!(
                "the statement to sign could not be written: {e}"
            ))
        })
    }

    /// Audits a new request (`approval.requested`, with the preview's digest, its plan and its
    /// statement's digest) and stores it; the notices (`server::notices`) hear of it from the
    /// store and tell people.
    async fn file_request(&self, approval: Approval) -> Result<Approval, CallError> {
        let actor = &approval.requester;
        let mut event = approval.event(
            actor,
            kind::APPROVAL_REQUESTED,
            on_behalf_of(
                // The count of people, the plan and the statement as asked for: the run
                // holds the stored request to them (`execute.rs`, `as_requested`).
                json!({"runners": approval.runners, "required_approvals": approval.required_approvals,
                       "expires_at": approval.expires_at, "plan": approval.plan,
                       "statement_sha256": approval.statement.as_deref().map(statement_digest)}),
                approval.on_behalf_of.as_deref(),
            ),
        );
        if let Some(p) = &approval.preview {
            event.result_digest = Some(json_digest(p));
        }
        self.audit
            .append(event)
            .await
            .map_err(CallError::AuditUnavailable)?;
        self.approvals.insert(&approval).await?;
        crate::server::metrics::tool_call(&approval.tool, "pending");
        Ok(approval)
    }

    /// Runs the tool's read-only preview on every target of `r`. Its answers, as the request
    /// keeps them; or, when a runner failed or did not seal what it captured, `call.failed`
    /// audited and the call refused.
    async fn run_preview(
        &self,
        r: &Request<'_>,
        actor: &str,
        pack_sha256: &str,
    ) -> Result<Value, CallError> {
        let tool = r.tool;
        let dispatch = Dispatch::new(
            &r.call_id,
            &tool.name,
            pack_sha256,
            &r.params,
            Mode::Preview,
        );
        let answers = futures::future::join_all(
            r.runners
                .iter()
                .map(|name| self.dispatch_one(name, tool, &dispatch)),
        )
        .await;
        let captures = tool.needs_preview_values();
        let PreviewFailed { failures, details } = match previews(&r.runners, answers, captures) {
            Ok(per_runner) => return Ok(Value::Object(per_runner)),
            Err(failed) => failed,
        };
        let why = failures.join("; ");
        let event = NewEvent {
            actor: actor.to_owned(),
            kind: kind::CALL_FAILED.into(),
            tool: Some(tool.name.clone()),
            args: Some(r.shown_args.clone()),
            reason: Some(r.reason.clone()),
            call_id: Some(r.call_id.clone()),
            outcome: Some("error".into()),
            detail: Some(
                json!({"mode": "preview", "error": why, "error_detail": details.join("; ")}),
            ),
            ..Default::default()
        };
        self.audit
            .append(event)
            .await
            .map_err(CallError::AuditUnavailable)?;
        Err(CallError::PreviewFailed(why))
    }
}

/// Why a preview did not give the request what it needs.
#[derive(Debug, PartialEq)]
struct PreviewFailed {
    /// Per runner that failed, what the agent reads.
    failures: Vec<String>,
    /// What operators read behind each runner's error (a runner that did not seal has none).
    details: Vec<String>,
}

/// What the server fixed for a request when it was made, beside what the call brought.
struct Filed {
    id: String,
    actor: String,
    risk: String,
    pack_sha256: String,
    preview: Option<Value>,
    required: u32,
    statement: Option<String>,
    plan: crate::protocol::approval::Plan,
    now: chrono::DateTime<chrono::Utc>,
    ttl: chrono::Duration,
}

/// The pending request a call and what was fixed for it make: nobody has voted, it expires
/// `ttl` after it was made.
fn pending_request(r: Request<'_>, f: Filed) -> Approval {
    Approval {
        id: f.id,
        call_id: r.call_id,
        tool: r.tool.name.clone(),
        risk: f.risk,
        args: r.params,
        shown_args: r.shown_args,
        runners: r.runners,
        runner_chosen_by_server: r.runner_chosen_by_server,
        raw: r.raw,
        reason: r.reason,
        requester: f.actor,
        requester_name: r.principal.name.clone(),
        on_behalf_of: r.principal.on_behalf_of.clone(),
        pack_sha256: f.pack_sha256,
        preview: f.preview,
        required_approvals: f.required,
        votes: Vec::new(),
        state: State::Pending,
        note: None,
        statement: f.statement,
        plan: f.plan,
        decision: None,
        decided_by: None,
        result: None,
        created_at: format_at(f.now),
        expires_at: format_at(f.now + f.ttl),
        updated_at: format_at(f.now),
    }
}

/// The preview a request keeps, from each target's answer in `runners`' order: per runner
/// `{ok, output, vars, seal, sealed_vars}`, `sealed_vars` being the canonical text of the vars
/// exactly as the runner sealed them; or every failure, where an answer without a seal is
/// one (its execution could not use the values). A preview that `captures` nothing only
/// shows: per runner `{ok, output}`, no values for the execution, the statement or a proof
/// to bind.
fn previews(
    runners: &[String],
    answers: Vec<Result<RunnerAnswer, RunnerError>>,
    captures: bool,
) -> Result<Map<String, Value>, PreviewFailed> {
    let mut per_runner = Map::new();
    let mut failures = Vec::new();
    let mut details = Vec::new();
    for (name, answer) in runners.iter().zip(answers) {
        match answer {
            Ok(a) if !captures => {
                per_runner.insert(name.clone(), json!({"ok": true, "output": a.output}));
            }
            Ok(a) if a.seal.is_none() => failures.push(format!(
                "preview on `{name}`: the runner did not seal the values it captured, so its execution could not use them (is it an older runner?)"
            )),
            Ok(a) => {
                let sealed = canonical_json(&Value::Object(a.vars.clone()));
                per_runner.insert(
                    name.clone(),
                    json!({"ok": true, "output": a.output, "vars": a.vars,
                           "seal": a.seal, "sealed_vars": sealed}),
                );
            }
            Err(e) => {
                failures.push(format!("preview on `{name}`: {e}"));
                details.push(format!("preview on `{name}`: {}", e.detail()));
            }
        }
    }
    if failures.is_empty() {
        Ok(per_runner)
    } else {
        Err(PreviewFailed { failures, details })
    }
}

/// The hex SHA-256 of a statement's text, as `approval.requested` records it.
pub(super) fn statement_digest(text: &str) -> String {
    hex::encode(crate::protocol::approval::statement::hash_text(text))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_new_request_is_pending_unvoted_and_expires_its_ttl_after_it_was_made() {
        use crate::server::principal::Role;
        let packs = crate::pack::PackSet::load(None).unwrap();
        let tool = packs.tool("linux.systemctl_restart").unwrap();
        let agent = Principal {
            name: "bot".into(),
            token_id: "t".into(),
            role: Role::Agent,
            roles: vec![Role::Agent],
            selector: None,
            on_behalf_of: Some("person:alice".into()),
        };
        let r = Request {
            call_id: "c1".into(),
            tool,
            principal: &agent,
            params: json!({"unit": "consul"}).as_object().unwrap().clone(),
            shown_args: json!({"unit": "consul"}),
            runners: runners(&["r1", "r2"]),
            runner_chosen_by_server: false,
            raw: false,
            reason: "wedged".into(),
            approvers: 1,
        };
        let now = chrono::DateTime::parse_from_rfc3339("2026-12-07T00:00:00Z")
            .unwrap()
            .with_timezone(&chrono::Utc);
        let filed = Filed {
            id: "a1".into(),
            actor: "agent:bot".into(),
            risk: "high".into(),
            pack_sha256: "p".into(),
            preview: None,
            required: 2,
            statement: Some("text".into()),
            plan: crate::protocol::approval::Plan::one_wave(&runners(&["r1", "r2"])),
            now,
            ttl: chrono::Duration::minutes(15),
        };
        let a = pending_request(r, filed);
        assert_eq!(a.state, State::Pending);
        assert!(a.votes.is_empty() && a.decision.is_none() && a.result.is_none());
        assert_eq!((a.id.as_str(), a.call_id.as_str()), ("a1", "c1"));
        assert_eq!(a.tool, "linux.systemctl_restart");
        assert_eq!(a.requester, "agent:bot");
        assert_eq!(a.requester_name, "bot");
        assert_eq!(a.on_behalf_of.as_deref(), Some("person:alice"));
        assert_eq!(a.required_approvals, 2);
        assert_eq!(a.statement.as_deref(), Some("text"));
        assert_eq!(a.runners, ["r1", "r2"]);
        assert_eq!(a.created_at, "2026-12-07T00:00:00.000000Z");
        assert_eq!(a.expires_at, "2026-12-07T00:15:00.000000Z");
    }

    fn answer(vars: Value, seal: Option<&str>) -> Result<RunnerAnswer, RunnerError> {
        Ok(RunnerAnswer {
            output: json!({"plan": "+1 task"}),
            truncated: false,
            duration_ms: 3,
            vars: vars.as_object().unwrap().clone(),
            seal: seal.map(str::to_owned),
        })
    }

    fn runners(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn a_sealed_preview_is_kept_per_runner_with_the_vars_as_sealed() {
        let kept = previews(
            &runners(&["r1", "r2"]),
            vec![
                answer(json!({"index": 7, "b": "x"}), Some("seal-1")),
                answer(json!({"index": 8}), Some("seal-2")),
            ],
            true,
        )
        .unwrap();
        assert_eq!(
            Value::Object(kept),
            json!({
                "r1": {"ok": true, "output": {"plan": "+1 task"}, "vars": {"index": 7, "b": "x"},
                       "seal": "seal-1", "sealed_vars": "{\"b\":\"x\",\"index\":7}"},
                "r2": {"ok": true, "output": {"plan": "+1 task"}, "vars": {"index": 8},
                       "seal": "seal-2", "sealed_vars": "{\"index\":8}"},
            })
        );
    }

    #[test]
    fn a_preview_without_a_seal_or_with_an_error_fails_the_request() {
        let failed = previews(
            &runners(&["r1", "r2", "r3"]),
            vec![
                answer(json!({"index": 7}), None),
                answer(json!({"index": 8}), Some("seal-2")),
                Err(RunnerError::Unreachable {
                    detail: "connection refused".into(),
                }),
            ],
            true,
        )
        .unwrap_err();
        assert_eq!(
            failed.failures,
            [
                "preview on `r1`: the runner did not seal the values it captured, so its execution could not use them (is it an older runner?)",
                "preview on `r3`: runner unreachable: the connection failed (the server's log has the details)",
            ]
        );
        assert_eq!(
            failed.details,
            [
                "preview on `r3`: runner unreachable: the connection failed (the server's log has the details): connection refused"
            ],
            "operators read the detail behind an error; a missing seal has none"
        );
    }

    /// A preview that captures nothing only shows: each runner's output is kept, with no
    /// values, seal or sealed text for an execution, a statement or a proof to bind; a
    /// runner that failed still fails the request.
    #[test]
    fn a_preview_that_captures_nothing_keeps_only_what_it_shows() {
        let kept = previews(&runners(&["r1"]), vec![answer(json!({}), None)], false).unwrap();
        assert_eq!(
            Value::Object(kept),
            json!({"r1": {"ok": true, "output": {"plan": "+1 task"}}})
        );
        let failed = previews(
            &runners(&["r1", "r2"]),
            vec![
                answer(json!({}), None),
                Err(RunnerError::Unreachable {
                    detail: "connection refused".into(),
                }),
            ],
            false,
        )
        .unwrap_err();
        assert_eq!(
            failed.failures,
            [
                "preview on `r2`: runner unreachable: the connection failed (the server's log has the details)"
            ]
        );
    }
}
