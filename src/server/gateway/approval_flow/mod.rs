//! The approval part of the call path: request (with preview) → wait (with progress) →
//! decide (people) → execute (exactly once, across replicas) → expire and sweep.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use super::builtins::{APPROVAL_STATUS_TOOL, APPROVAL_WAIT_TOOL};
use super::call::{CallContext, on_behalf_of};
use super::dispatch::Record;
use super::outcome::{ApprovalInfo, CallError, CallOutcome, RunnerResult};
use super::state::Gateway;
use crate::digest::{canonical_json, json_digest};
use crate::pack::ToolRef;
use crate::protocol::Mode;
use crate::server::approvals::{self, Actor, Approval, ApprovalError, Due, Lock, State, Verdict};
use crate::server::audit::{NewEvent, format_at, kind};
use crate::server::principal::Principal;
use crate::server::runners::client::Dispatch;
use crate::server::webhook::Notice;

/// A call that needs approval, after validation and policy.
pub(super) struct Request<'a> {
    pub(super) call_id: String,
    pub(super) tool: &'a ToolRef,
    pub(super) principal: &'a Principal,
    pub(super) params: Map<String, Value>,
    pub(super) shown_args: Value,
    pub(super) runners: Vec<String>,
    pub(super) runner_chosen_by_server: bool,
    pub(super) raw: bool,
    pub(super) reason: String,
    pub(super) approvers: u32,
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
    pub(super) async fn request_approval(&self, r: Request<'_>) -> Result<Approval, CallError> {
        let actor = r.principal.actor();
        let tool = r.tool;
        if tool.secret_params().next().is_some() {
            // A request keeps the args its execution will use; a secret would sit in the
            // approvals table in clear. Refuse until requests can hold secrets sealed.
            let err = CallError::NeedsApprovalSecret {
                tool: tool.name.clone(),
            };
            return Err(self.refuse_request(r, err).await);
        }
        // Checked before the preview runs, so a flood of requests runs no previews. Requests
        // made at the same moment can pass together and overshoot by their number.
        let max = self.limits.max_pending_per_agent;
        let pending = self.approvals.pending_of(&r.principal.name).await?;
        if pending >= u64::from(max) {
            let err = CallError::TooManyPending {
                agent: r.principal.name.clone(),
                pending,
                max,
            };
            return Err(self.refuse_request(r, err).await);
        }
        // Runners that check people's signatures: as many people as their approvers file
        // needs, or a refusal now when it could never be satisfied (nobody is asked).
        let signed_by = match self.signatures_needed(&tool.name, &r.runners, r.approvers) {
            Ok(needed) => needed,
            Err(why) => {
                let err = CallError::SignaturesUnsatisfiable(why);
                return Err(self.refuse_request(r, err).await);
            }
        };
        let required = signed_by.unwrap_or(r.approvers);
        let record = Record {
            actor: &actor,
            tool: &tool.name,
            args: &r.shown_args,
            reason: Some(&r.reason),
            call_id: &r.call_id,
            approval_id: None,
            on_behalf_of: r.principal.on_behalf_of.as_deref(),
        };
        let how =
            json!({"needs_approval": true, "approvers": required, "signed": signed_by.is_some()});
        self.audit
            .append(record.tool_called(&r.runners, r.runner_chosen_by_server, how))
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
                let dispatch = Dispatch::new(
                    &r.call_id,
                    &tool.name,
                    &pack_sha256,
                    &r.params,
                    Mode::Preview,
                );
                let answers = futures::future::join_all(
                    r.runners
                        .iter()
                        .map(|name| self.dispatch_one(name, tool, &dispatch)),
                )
                .await;
                let mut per_runner = Map::new();
                let mut failures = Vec::new();
                // What operators read behind each failure (the agent reads `failures`).
                let mut details = Vec::new();
                for (name, answer) in r.runners.iter().zip(answers) {
                    match answer {
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
                        detail: Some(
                            json!({"mode": "preview", "error": why, "error_detail": details.join("; ")}),
                        ),
                        ..Default::default()
                    };
                    self.audit
                        .append(event)
                        .await
                        .map_err(CallError::AuditUnavailable)?;
                    return Err(CallError::PreviewFailed(why));
                }
                Some(Value::Object(per_runner))
            }
        };
        let now = chrono::Utc::now();
        let ttl = chrono::Duration::from_std(self.limits.approval_ttl)
            .unwrap_or(chrono::Duration::minutes(15));
        let id = uuid::Uuid::new_v4().to_string();
        let statement = match signed_by {
            None => None,
            Some(_) => {
                let start_within = chrono::Duration::from_std(self.limits.approved_start_within)
                    .unwrap_or(chrono::Duration::minutes(5));
                let text = self.statement_for(
                    &id,
                    &tool.name,
                    &pack_sha256,
                    &r.params,
                    &r.runners,
                    preview.as_ref(),
                    required,
                    &actor,
                    // Whole seconds, rounded up: the statement's form has no fraction.
                    now + ttl + start_within + chrono::Duration::seconds(1),
                );
                match text {
                    Ok(text) => Some(text),
                    Err(e) => {
                        let err = CallError::SignaturesUnsatisfiable(format!(
                            "the statement to sign could not be written: {e}"
                        ));
                        return Err(self.refuse_request(r, err).await);
                    }
                }
            }
        };
        let approval = Approval {
            id,
            call_id: r.call_id,
            tool: tool.name.clone(),
            risk: self.policy().risk(tool).as_str().to_owned(),
            args: r.params,
            shown_args: r.shown_args,
            runners: r.runners,
            runner_chosen_by_server: r.runner_chosen_by_server,
            raw: r.raw,
            reason: r.reason,
            requester: actor.clone(),
            requester_name: r.principal.name.clone(),
            on_behalf_of: r.principal.on_behalf_of.clone(),
            pack_sha256,
            preview,
            required_approvals: required,
            votes: Vec::new(),
            state: State::Pending,
            note: None,
            statement,
            decided_by: None,
            result: None,
            created_at: format_at(now),
            expires_at: format_at(now + ttl),
            updated_at: format_at(now),
        };
        let mut event = approval.event(
            &actor,
            kind::APPROVAL_REQUESTED,
            on_behalf_of(
                json!({"runners": approval.runners, "required_approvals": approval.required_approvals,
                       "expires_at": approval.expires_at}),
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
                        row.votes.len(),
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
            .transition(&row.id, Lock::Wait, |r| {
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
            .transition(id, Lock::SkipLocked, |r| {
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
                    json!({"expires_at": r.expires_at, "votes": r.votes.len()}),
                    now,
                )
            })
            .await;
        match result {
            Ok(_) | Err(ApprovalError::WrongState { .. }) => {}
            Err(e) => tracing::error!(error = %e, approval_id = %id, "could not expire"),
        }
    }

    /// A person's decision on a pending request. The decision that approves it also claims
    /// it (`approval.executing`) in the same transition, so this replica runs it: the two
    /// events share one audit commit and the row one commit, where a separate claim took
    /// two more, in sequence, between the click and the runner call.
    pub async fn decide(
        self: &Arc<Self>,
        who: &Principal,
        id: &str,
        verdict: Verdict,
    ) -> Result<Approval, ApprovalError> {
        let policy = self.policy();
        let row = self
            .approvals
            .transition(id, Lock::Wait, |r| {
                // The tool comes from the locked row: no second read to learn it.
                let actor = Actor {
                    name: who.name.clone(),
                    actor: who.actor(),
                    // A person from the provider may hold several roles; any one that may
                    // approve this tool is enough.
                    may_approve: who
                        .roles
                        .iter()
                        .any(|role| policy.may_approve(*role, &r.tool)),
                };
                let now = chrono::Utc::now();
                let verdict = self.verify_vote(r, &verdict)?;
                let decided = approvals::decide(r, &actor, &verdict, now)?;
                if decided.row.state != State::Approved {
                    return Ok(decided);
                }
                let claim = claim(&decided.row, now)?;
                Ok(decided.then(claim))
            })
            .await?
            .expect("a transition that waits for the lock always returns the row");
        if row.state == State::Executing {
            let me = self.clone();
            let claimed = row.clone();
            tokio::spawn(async move { me.run_claimed(claimed).await });
        }
        Ok(row)
    }

    /// Claims an approved request nobody claimed (exactly once across replicas: the sweep
    /// finds it when the replica that approved it stopped before its claim committed), then
    /// runs it.
    pub async fn execute_approved(&self, id: &str) {
        let start_within = self.limits.approved_start_within;
        let claimed = self
            .approvals
            .transition(id, Lock::SkipLocked, |r| {
                if r.state == State::Approved && too_late_to_start(r, start_within) {
                    // Left for the sweeper, which expires it and says why.
                    return Err(ApprovalError::WrongState {
                        state: r.state,
                        wanted: "approved recently enough to start",
                    });
                }
                claim(r, chrono::Utc::now())
            })
            .await;
        match claimed {
            Ok(Some(row)) => self.run_claimed(row).await,
            // Another replica holds it, or it moved on already: not ours to run.
            Ok(None) | Err(ApprovalError::WrongState { .. }) => {}
            Err(e) => {
                tracing::error!(error = %e, approval_id = %id, "could not claim an approved request");
            }
        }
    }

    /// Runs a request this replica claimed (`executing`): calls its runners with the approval
    /// id and the preview's vars, and records the outcome.
    async fn run_claimed(&self, row: Approval) {
        let id = &row.id;
        let started = Instant::now();
        let (results, problem) = self.run_approved(&row).await;
        let ok = problem.is_none() && results.iter().all(|r| r.ok);
        let note = problem.or_else(|| {
            results
                .iter()
                .find_map(|r| r.error.as_ref().map(|e| format!("{}: {e}", r.runner)))
        });
        let outcome = CallOutcome::of_approval(&row, results);
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
            on_behalf_of: row.on_behalf_of.as_deref(),
        };
        let proof = self.proof_for(row);
        let witnessed = if self.needs_witnessed(row) {
            match self.witnessed_for(row).await {
                Ok(w) => Some(w),
                Err(why) => return (Vec::new(), Some(why)),
            }
        } else {
            None
        };
        let results = futures::future::join_all(row.runners.iter().map(|name| {
            let record = &record;
            let proof = proof.as_ref();
            let witnessed = witnessed.as_ref();
            async move {
                let preview = row.preview_vars(name);
                let dispatch = Dispatch {
                    preview: preview.as_ref().map(|(vars, _)| vars),
                    preview_seal: preview.as_ref().and_then(|(_, seal)| seal.as_deref()),
                    raw: row.raw,
                    approval_id: Some(&row.id),
                    approval: proof,
                    witnessed,
                    ..Dispatch::new(
                        &row.call_id,
                        &row.tool,
                        &row.pack_sha256,
                        &row.args,
                        Mode::Execute,
                    )
                };
                self.run_on(name, tool, &dispatch, record).await
            }
        }))
        .await;
        (results, None)
    }

    /// Expires an approved request whose execution never started within
    /// `approved_start_within` of its approval; nothing runs.
    async fn expire_approved(&self, id: &str) {
        let start_within = self.limits.approved_start_within;
        let result = self
            .approvals
            .transition(id, Lock::SkipLocked, |r| {
                if r.state == State::Approved && !too_late_to_start(r, start_within) {
                    return Err(ApprovalError::WrongState {
                        state: r.state,
                        wanted: "expired",
                    });
                }
                let why = format!(
                    "was approved at {}, but its execution did not start within {} s of the approval; nothing ran: ask again",
                    r.updated_at,
                    start_within.as_secs()
                );
                let mut change = approvals::moved(
                    r,
                    &[State::Approved],
                    State::Expired,
                    "system",
                    kind::APPROVAL_EXPIRED,
                    json!({"approved_at": r.updated_at, "why": why}),
                    chrono::Utc::now(),
                )?;
                change.row.note = Some(why);
                Ok(change)
            })
            .await;
        match result {
            Ok(_) | Err(ApprovalError::WrongState { .. }) => {}
            Err(e) => tracing::error!(error = %e, approval_id = %id, "could not expire"),
        }
    }

    /// Expires overdue requests (pending past their expiry, approved but never started
    /// within `approved_start_within`), executes approved ones nobody claimed (their replica
    /// stopped between the decision and the claim), and marks executions that outlived
    /// every deadline `unknown`: a crash interrupted them, and they are never re-run.
    pub async fn sweep(&self) {
        let now = chrono::Utc::now();
        for id in self.due(State::Pending, now, Due::Expiry).await {
            self.expire(&id).await;
        }
        let stale = now
            - chrono::Duration::from_std(self.limits.approved_start_within)
                .unwrap_or(chrono::Duration::minutes(5));
        for id in self.due(State::Approved, stale, Due::LastChange).await {
            self.expire_approved(&id).await;
        }
        let orphaned = now - chrono::Duration::seconds(10);
        for id in self.due(State::Approved, orphaned, Due::LastChange).await {
            self.execute_approved(&id).await;
        }
        let lost = now
            - chrono::Duration::from_std(self.limits.call_timeout * 2 + Duration::from_secs(60))
                .unwrap_or(chrono::Duration::minutes(5));
        for id in self.due(State::Executing, lost, Due::LastChange).await {
            self.mark_interrupted(&id).await;
        }
    }

    /// The requests in `state` whose `due` time is before `before`. A failure to list them is
    /// logged and leaves this part of the sweep empty: the next sweep tries again.
    async fn due(
        &self,
        state: State,
        before: chrono::DateTime<chrono::Utc>,
        due: Due,
    ) -> Vec<String> {
        match self.approvals.ids_in(state, &format_at(before), due).await {
            Ok(ids) => ids,
            Err(e) => {
                tracing::warn!(error = %e, state = state.as_str(), "approval sweep could not list requests");
                Vec::new()
            }
        }
    }

    /// `executing` → `unknown` for an execution that outlived every deadline: a crash
    /// interrupted it, and it is never re-run.
    async fn mark_interrupted(&self, id: &str) {
        let result = self
            .approvals
            .transition(id, Lock::SkipLocked, |r| {
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

/// `approved` → `executing`: this replica will run the request, audited with who approved it.
fn claim(
    r: &Approval,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<approvals::Change, ApprovalError> {
    let by = r.decided_by.clone().unwrap_or_else(|| "system".into());
    approvals::moved(
        r,
        &[State::Approved],
        State::Executing,
        &by,
        kind::APPROVAL_EXECUTING,
        json!({"runners": r.runners, "approvals": r.votes}),
        now,
    )
}

/// Whether an approved request's execution may no longer start: more than `within` since
/// the approval that settled it (an unreadable time counts as too late).
fn too_late_to_start(row: &Approval, within: Duration) -> bool {
    let Ok(approved) = chrono::DateTime::parse_from_rfc3339(&row.updated_at) else {
        return true;
    };
    let within = chrono::Duration::from_std(within).unwrap_or(chrono::Duration::minutes(5));
    approved.with_timezone(&chrono::Utc) + within <= chrono::Utc::now()
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
pub(super) fn settled(row: &Approval) -> Result<Option<CallOutcome>, CallError> {
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
        State::Denied => Err(CallError::DeniedByHuman {
            approval_id: row.id.clone(),
            by: row
                .decided_by
                .clone()
                .unwrap_or_else(|| "an approver".into()),
            note: row.note.clone().unwrap_or_default(),
        }),
        State::Expired => Err(CallError::Expired {
            approval_id: row.id.clone(),
            why: match &row.note {
                Some(note) => note.clone(),
                None => format!(
                    "expired at {} before enough humans approved it; nothing ran",
                    row.expires_at
                ),
            },
        }),
        State::Withdrawn => Err(CallError::Withdrawn {
            approval_id: row.id.clone(),
        }),
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
            let mut outcome = stored
                .and_then(Result::ok)
                .unwrap_or_else(|| CallOutcome::of_approval(row, Vec::new()));
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

pub(super) fn pending_outcome(row: &Approval, waited: Duration) -> CallOutcome {
    CallOutcome {
        approval: Some(ApprovalInfo {
            approval_id: row.id.clone(),
            state: row.state,
            expires_at: row.expires_at.clone(),
            message: format!(
                "waiting for a human to approve ({} of {} approvals) after {} s; call {APPROVAL_WAIT_TOOL} with this approval_id to wait again, or {APPROVAL_STATUS_TOOL} to check",
                row.votes.len(),
                row.required_approvals,
                waited.as_secs()
            ),
            decided_by: row.decided_by.clone(),
            note: row.note.clone(),
        }),
        ..CallOutcome::of_approval(row, Vec::new())
    }
}
