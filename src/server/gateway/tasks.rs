//! MCP Tasks (`io.modelcontextprotocol/tasks`, SEP-2663) for calls that wait for people.
//!
//! Owns the `approval_tasks` table and the three things a task does: a call that filed an
//! approval request, from a client that declared Tasks, gets a task instead of a held-open
//! wait ([`Gateway::file_task`]); `tasks/get` reads the request's state on any replica
//! ([`Gateway::task`], mapped by [`task_state`]); `tasks/cancel` withdraws a pending request
//! through the same transition and audit event as a cancelled call
//! ([`Gateway::cancel_task`]).
//!
//! Invariants: a task id is 256 random bits, stored only as its SHA-256; a task answers only
//! to the caller that created it (its audit actor and, for an OAuth agent, the person it acts
//! for), and to anyone else exactly as an unknown id does; a task has no state of its own,
//! so it can never disagree with its request; creating a task is audited (`task.created`)
//! before its row is written, and a cancel is the request's `approval.withdrawn`.

use base64::Engine as _;
use serde_json::json;

use super::approval_flow::settled_outcome;
use super::outcome::{CallError, CallOutcome};
use super::state::Gateway;
use crate::digest::sha256_hex;
use crate::server::approvals::{self, Approval, ApprovalError, Lock, State};
use crate::server::audit::{NewEvent, format_at, kind};
use crate::server::principal::Principal;
use crate::with_pool;

/// How often a client is asked to poll (`pollIntervalMs`): people take minutes, not
/// milliseconds.
pub const POLL_INTERVAL_MS: u64 = 2000;

/// A task as `tasks/get` shows it.
#[derive(Debug)]
pub struct TaskView {
    /// The id the client holds (never stored; the table keeps its SHA-256).
    pub id: String,
    pub created_at: String,
    /// When the request last changed.
    pub updated_at: String,
    pub state: TaskState,
}

/// A request's state in the spec's terms.
#[derive(Debug)]
pub enum TaskState {
    /// Still waiting for people, being executed, or halted until people decide: the message
    /// says which. Not `input_required`: that status carries `inputRequests`, requests the
    /// *client* must answer, and emisar never asks the client anything: the people who
    /// decide answer in the portal or the CLI, out of band.
    Working(String),
    /// The call's result, exactly as a waiting call would have returned it (a failed or
    /// aborted execution is a result with `isError`, as it is for the call).
    Completed(Box<CallOutcome>),
    /// Denied or expired: the refusal the waiting call would have returned.
    Failed(CallError),
    /// Withdrawn (by `tasks/cancel`, or a cancelled call).
    Cancelled,
}

/// Why a task operation failed.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    /// Unknown, or another caller's: the two read the same.
    #[error("unknown task id")]
    NotFound,
    #[error(
        "task cannot be cancelled: its approval request {approval_id} is {state}, no longer pending; only a pending request can be withdrawn"
    )]
    NotCancellable { approval_id: String, state: String },
    #[error("the store could not answer; try again")]
    Store(#[from] sqlx::Error),
    #[error("{0}")]
    Approval(#[from] ApprovalError),
}

/// Who a task belongs to: the caller's audit actor and, for an OAuth agent, the person it
/// acts for (the same client acting for another person is another owner).
fn owner_of(caller: &Principal) -> String {
    match &caller.on_behalf_of {
        Some(person) => format!("{} for {person}", caller.actor()),
        None => caller.actor(),
    }
}

/// A fresh task id: 256 bits from the operating system, base64url, with a prefix that says
/// what it is.
fn new_task_id() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)?;
    Ok(format!(
        "emtask_{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    ))
}

impl Gateway {
    /// Files a task for the pending request `a` that `caller` made: audited as
    /// `task.created`, then stored. The caller learns the id only from the answer.
    pub(crate) async fn file_task(
        &self,
        caller: &Principal,
        a: &Approval,
    ) -> Result<TaskView, CallError> {
        let id = new_task_id().map_err(|e| {
            CallError::Approval(ApprovalError::Refused(format!(
                "no randomness for a task id: {e}"
            )))
        })?;
        let owner = owner_of(caller);
        let event = NewEvent {
            actor: caller.actor(),
            kind: kind::TASK_CREATED.into(),
            tool: Some(a.tool.clone()),
            call_id: Some(a.call_id.clone()),
            approval_id: Some(a.id.clone()),
            outcome: Some("ok".into()),
            detail: Some(json!({"owner": owner, "on_behalf_of": caller.on_behalf_of})),
            ..Default::default()
        };
        self.audit
            .append(event)
            .await
            .map_err(CallError::AuditUnavailable)?;
        let now = format_at(chrono::Utc::now());
        let db = self.approvals.db();
        let sql = db.sql(
            "INSERT INTO approval_tasks (id_sha256, approval_id, owner, created_at) VALUES ($1, $2, $3, $4::timestamptz)",
        );
        db.guard(async {
            with_pool!(db, pool => {
                sqlx::query(sql)
                    .bind(sha256_hex(id.as_bytes()))
                    .bind(&a.id)
                    .bind(&owner)
                    .bind(&now)
                    .execute(pool)
                    .await
                    .map(|_| ())
            })
        })
        .await
        .map_err(|e| CallError::Approval(ApprovalError::from(e)))?;
        Ok(TaskView {
            id,
            created_at: now,
            updated_at: a.updated_at.clone(),
            state: task_state(a),
        })
    }

    /// `tasks/get`: the task `id` of `caller`, as its request stands now. A pending request
    /// past its expiry is expired first, as a waiting call would.
    pub(crate) async fn task(&self, caller: &Principal, id: &str) -> Result<TaskView, TaskError> {
        let (approval_id, created_at) = self.find_task(caller, id).await?;
        let mut row = self.approvals.get(&approval_id).await?;
        if row.state == State::Pending && row.expired_at(chrono::Utc::now()) {
            self.expire(&row.id).await;
            row = self.approvals.get(&approval_id).await?;
        }
        Ok(TaskView {
            id: id.to_owned(),
            created_at,
            updated_at: row.updated_at.clone(),
            state: task_state(&row),
        })
    }

    /// `tasks/cancel`: withdraws the task's request while it is pending, through the same
    /// transition and event (`approval.withdrawn`) as a call the agent cancelled; a withdrawn
    /// request never runs. Cancelling it again is acknowledged; a request that is no longer
    /// pending (approved, executing, done, denied, expired) is refused with its state.
    pub(crate) async fn cancel_task(&self, caller: &Principal, id: &str) -> Result<(), TaskError> {
        let (approval_id, _) = self.find_task(caller, id).await?;
        let why = "the agent cancelled its task (tasks/cancel)";
        match self
            .withdraw_pending(&approval_id, &caller.actor(), why)
            .await
        {
            Ok(()) => Ok(()),
            Err(ApprovalError::WrongState {
                state: State::Withdrawn,
                ..
            }) => Ok(()),
            Err(ApprovalError::WrongState { state, .. }) => Err(TaskError::NotCancellable {
                approval_id,
                state: state.as_str().to_owned(),
            }),
            Err(e) => Err(e.into()),
        }
    }

    /// The request and creation time of task `id`, if it is `caller`'s; else
    /// [`TaskError::NotFound`], whether the id is unknown or another caller's.
    async fn find_task(&self, caller: &Principal, id: &str) -> Result<(String, String), TaskError> {
        let db = self.approvals.db();
        let sql = db.sql(format!(
            "SELECT approval_id, {} AS created_at FROM approval_tasks WHERE id_sha256 = $1 AND owner = $2",
            db.at_text("created_at")
        ));
        let row = db
            .guard(async {
                with_pool!(db, pool => {
                    sqlx::query_as::<_, (String, String)>(sql)
                        .bind(sha256_hex(id.as_bytes()))
                        .bind(owner_of(caller))
                        .fetch_optional(pool)
                        .await
                })
            })
            .await?;
        row.ok_or(TaskError::NotFound)
    }

    /// Moves request `id` from pending to withdrawn, audited as `approval.withdrawn` by
    /// `actor` with `why`: the one withdrawal, for a cancelled call and a cancelled task.
    pub(super) async fn withdraw_pending(
        &self,
        id: &str,
        actor: &str,
        why: &str,
    ) -> Result<(), ApprovalError> {
        self.approvals
            .transition(id, Lock::Wait, |r| {
                approvals::moved(
                    r,
                    &[State::Pending],
                    State::Withdrawn,
                    actor,
                    kind::APPROVAL_WITHDRAWN,
                    json!({"why": why}),
                    chrono::Utc::now(),
                )
            })
            .await
            .map(|_| ())
    }
}

/// What a task says about request `row`: the waiting call's answer where it has one, else
/// why it is still working.
pub(in crate::server::gateway) fn task_state(row: &Approval) -> TaskState {
    match settled_outcome(row) {
        Ok(None) => TaskState::Working(working_message(row)),
        // A halted rollout waits for people's signed decision (resume, retry, abort): not
        // over yet, so still working, saying why.
        Ok(Some(outcome)) if row.state == State::Halted => TaskState::Working(
            outcome
                .approval
                .map(|a| a.message)
                .unwrap_or_else(|| "the rollout halted; waiting for people's decision".into()),
        ),
        Ok(Some(outcome)) => TaskState::Completed(Box::new(outcome)),
        Err(CallError::Withdrawn { .. }) => TaskState::Cancelled,
        Err(refused) => TaskState::Failed(refused),
    }
}

/// Why an undecided request's task is still working.
fn working_message(row: &Approval) -> String {
    match row.state {
        State::Pending => format!(
            "approval request {} for {} waits for people: {} of {} approvals; expires at {}",
            row.id,
            row.tool,
            row.votes.len(),
            row.required_approvals,
            row.expires_at
        ),
        _ => format!(
            "approval request {} for {} was approved by {}; executing",
            row.id,
            row.tool,
            row.decided_by.as_deref().unwrap_or("people")
        ),
    }
}

#[cfg(test)]
mod tests {
    use crate::server::approvals::testing::row;

    use super::*;

    fn state_of(state: State) -> TaskState {
        task_state(&Approval { state, ..row() })
    }

    #[test]
    fn an_undecided_request_is_a_working_task_saying_how_far_it_is() {
        let TaskState::Working(message) = state_of(State::Pending) else {
            panic!("pending is working");
        };
        assert!(
            message.contains("waits for people: 0 of 1 approvals"),
            "{message}"
        );
        for state in [State::Approved, State::Executing] {
            let TaskState::Working(message) = state_of(state) else {
                panic!("{state:?} is working");
            };
            assert!(message.ends_with("; executing"), "{message}");
        }
    }

    #[test]
    fn a_halted_rollout_is_working_until_people_decide() {
        let TaskState::Working(message) = state_of(State::Halted) else {
            panic!("halted is working");
        };
        assert!(message.contains("the rollout halted"), "{message}");
    }

    #[test]
    fn a_refused_request_is_a_failed_task_saying_who_or_why() {
        let denied = Approval {
            state: State::Denied,
            decided_by: Some("approver:alice".into()),
            note: Some("not now".into()),
            ..row()
        };
        let TaskState::Failed(e) = task_state(&denied) else {
            panic!("denied is failed");
        };
        assert_eq!(
            e.to_string(),
            "refused: approval request a1 was denied by approver:alice: not now"
        );
        let TaskState::Failed(e) = state_of(State::Expired) else {
            panic!("expired is failed");
        };
        assert!(e.to_string().contains("expired unanswered at"), "{e}");
    }

    #[test]
    fn a_finished_request_is_a_completed_task_and_a_withdrawn_one_cancelled() {
        for state in [
            State::Executed,
            State::Failed,
            State::Unknown,
            State::Aborted,
        ] {
            assert!(
                matches!(state_of(state), TaskState::Completed(_)),
                "{state:?} is completed"
            );
        }
        assert!(matches!(state_of(State::Withdrawn), TaskState::Cancelled));
    }

    #[test]
    fn task_ids_are_long_random_and_distinct() {
        let (a, b) = (new_task_id().unwrap(), new_task_id().unwrap());
        assert_ne!(a, b);
        assert_eq!(a.len(), "emtask_".len() + 43, "{a}");
    }

    #[test]
    fn an_oauth_agent_acting_for_another_person_is_another_owner() {
        let agent = Principal::new(
            "ops".into(),
            "t1".into(),
            crate::server::principal::Role::Agent,
            None,
        );
        let for_alice = Principal {
            on_behalf_of: Some("person:alice".into()),
            ..agent.clone()
        };
        assert_eq!(owner_of(&agent), "agent:ops");
        assert_ne!(owner_of(&agent), owner_of(&for_alice));
    }
}
