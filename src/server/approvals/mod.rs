//! Approval requests: the queue that calls the policy sends to humans (risk:high, and
//! risk:low unless lowered) wait in until they decide.
//!
//! A request is bound at creation to the exact call (tool, args, runners, reason, requester,
//! pack digest and the preview captured then). Its states:
//!
//! ```text
//! pending ─▶ approved ─▶ executing ─▶ executed | failed | unknown | halted
//!    └─▶ denied | expired | withdrawn                                  │
//!                          executing ◀─ people's decision: resume, retry ─┤
//!                                         people's decision: abort ─▶ aborted
//! ```
//!
//! Every transition goes through [`Approvals::transition`]: lock the row, decide the change
//! with a pure function of the row, make its audit event durable, write the row, announce
//! it. On PostgreSQL the lock is a row lock (`FOR UPDATE`, or `FOR UPDATE SKIP LOCKED` for
//! claims and sweeps), so several `emisar serve` replicas on one database execute an
//! approval exactly once; announcements fan out with LISTEN/NOTIFY. SQLite serves a single
//! replica, and the lock is a mutex in this process.
//!
//! # Layout
//!
//! - this file: the request as stored ([`Approval`], its [`Vote`]s), who acts on it
//!   ([`Actor`]), how a transition locks ([`Lock`]), what the sweeper asks for ([`Due`]), and
//!   [`ApprovalError`];
//! - `state.rs`: the pure state machine: the [`State`]s, a person's [`Verdict`] and
//!   [`decide`], a plain [`moved`], each giving the [`Change`] with its audit events;
//! - `halted.rs`: the pure way on from `halted`: a decision proposed ([`halted::propose`]),
//!   voted for with signatures ([`halted::vote`]) and carried out, with where it halted
//!   ([`Halt`]);
//! - `store.rs`: [`Approvals`], the SQL of both backends and [`Approvals::transition`];
//! - `notify.rs`: the announcements ([`Changed`]): [`Approvals::subscribe`], the NOTIFY sent
//!   after a commit and the LISTEN task that relays other replicas' changes.
//!
//! Invariant: no transition is written whose audit event is not durable; `executing` is
//! entered once from `approved`, and once more per decision people took on a halt; nothing moves a request out of `executing` except its
//! outcome or, after a crash, `unknown` (never a re-run).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::protocol::approval::{Choice, Signature, Signed};
use crate::server::audit::{AuditError, NewEvent};

pub mod halted;
mod notify;
mod state;
mod store;
#[cfg(test)]
pub(crate) mod testing;

pub use halted::Halt;
pub use notify::Changed;
pub use state::{Change, State, Verdict, decide, moved};
pub use store::Approvals;

/// One human's yes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct Vote {
    pub user: String,
    pub at: String,
    /// Why they said yes, when they said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Their signature over the request's statement, when the request is signed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<Signature>,
    /// What the server found when it verified the signature: the person of the approvers
    /// file, the key id, the algorithm and the statement's hash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signed: Option<Signed>,
}

/// An approval request, as stored.
#[derive(Debug, Clone, Serialize)]
pub struct Approval {
    pub id: String,
    pub call_id: String,
    pub tool: String,
    pub risk: String,
    /// What the runners receive (secret params in clear): never shown, never serialized.
    #[serde(skip)]
    pub args: Map<String, Value>,
    /// What humans and the audit log see.
    #[serde(rename = "args")]
    pub shown_args: Value,
    pub runners: Vec<String>,
    /// True when the server chose the runner. Serialized as `runner_chosen`, the name the
    /// approvals API has always given it.
    #[serde(rename = "runner_chosen")]
    pub runner_chosen_by_server: bool,
    #[serde(skip)]
    pub raw: bool,
    pub reason: String,
    /// The audit actor of the requester, e.g. `agent:deploy-bot`.
    pub requester: String,
    /// The requester's name: nobody by this name may approve the request.
    #[serde(skip)]
    pub requester_name: String,
    /// The person the requesting agent acted for (`person:<id>`, from its OAuth token): they
    /// may not approve the request either.
    pub on_behalf_of: Option<String>,
    #[serde(skip)]
    pub pack_sha256: String,
    /// Per runner: `{ok, output, vars, seal, sealed_vars}` of the preview run at request
    /// time; `sealed_vars` is the canonical JSON text of the vars exactly as the runner sealed
    /// them (text, so no store can renormalise a number in it).
    pub preview: Option<Value>,
    pub required_approvals: u32,
    /// The approvers' votes so far (one per person). Serialized as `approvals`, the name
    /// the API and the portal have always read.
    #[serde(rename = "approvals")]
    pub votes: Vec<Vote>,
    pub state: State,
    /// Why the request ended as it did: the denial's note, or why the execution failed or
    /// never started. Serialized as `outcome_note`, so it is not taken for an approver's
    /// note (`approvals[].note`); the API also shows it as `note` until the next release.
    #[serde(rename = "outcome_note")]
    pub note: Option<String>,
    /// The statement people sign (`crate::protocol::approval::Statement`'s text), when the
    /// request's runners check people's signatures; shown by the API with its hash.
    #[serde(skip)]
    pub statement: Option<String>,
    /// The rollout its runners run in: waves in order, each gated, with the pause between
    /// them (fixed at request time; part of the statement people sign).
    pub plan: crate::protocol::approval::Plan,
    /// People's decision on the halted rollout, while it gathers votes and once taken (the
    /// latest; the audit log has every one); null until someone proposes one.
    #[serde(default)]
    pub decision: Option<RolloutDecision>,
    /// The actor whose decision settled the request.
    pub decided_by: Option<String>,
    /// The call's outcome (per-runner results) once executed.
    pub result: Option<Value>,
    pub created_at: String,
    pub expires_at: String,
    pub updated_at: String,
}

/// People's decision on a halted rollout (`crate::protocol::approval::decision`): proposed by
/// one person, signed like an approval, taken once enough people voted for it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RolloutDecision {
    /// The decision's id, a UUIDv7 (the `decision` line of its text).
    pub id: String,
    pub choice: Choice,
    /// The runners it lets run (none for an abort).
    pub runners: Vec<String>,
    /// The text people sign, and the runners check.
    pub text: String,
    /// When it stops holding (RFC 3339).
    pub expires_at: String,
    /// Who proposed it (an audit actor).
    pub proposed_by: String,
    /// How many people it needs: one to abort, the request's own count to run anything more.
    pub required: u32,
    pub votes: Vec<Vote>,
    /// True once its votes were enough and it was carried out.
    pub taken: bool,
}

impl Approval {
    pub fn expired_at(&self, now: DateTime<Utc>) -> bool {
        DateTime::parse_from_rfc3339(&self.expires_at)
            .map(|t| t.with_timezone(&Utc) <= now)
            .unwrap_or(true)
    }

    /// The vars `runner`'s execution will use (exactly as the runner sealed them) and the
    /// runner's seal over them.
    pub fn preview_vars(&self, runner: &str) -> Option<(Map<String, Value>, Option<String>)> {
        let answer = self.preview.as_ref()?.get(runner)?;
        let vars = match answer.get("sealed_vars").and_then(Value::as_str) {
            Some(text) => serde_json::from_str(text).ok()?,
            None => answer.get("vars")?.as_object()?.clone(),
        };
        let seal = answer
            .get("seal")
            .and_then(Value::as_str)
            .map(str::to_owned);
        Some((vars, seal))
    }

    /// Per runner, the preview values its execution will use: what people see before they
    /// approve.
    pub fn execution_vars(&self) -> Option<Value> {
        let preview = self.preview.as_ref()?.as_object()?;
        Some(Value::Object(
            preview
                .keys()
                .filter_map(|runner| {
                    let (vars, _) = self.preview_vars(runner)?;
                    Some((runner.clone(), Value::Object(vars)))
                })
                .collect(),
        ))
    }

    /// An audit event about this request: every event about one carries its tool, runner
    /// (when there is one), shown arguments, reason, call id and approval id.
    pub(crate) fn event(&self, actor: &str, kind: &str, detail: Value) -> NewEvent {
        NewEvent {
            actor: actor.to_owned(),
            kind: kind.to_owned(),
            tool: Some(self.tool.clone()),
            runner: (self.runners.len() == 1).then(|| self.runners[0].clone()),
            args: Some(self.shown_args.clone()),
            reason: Some(self.reason.clone()),
            call_id: Some(self.call_id.clone()),
            approval_id: Some(self.id.clone()),
            detail: Some(detail),
            ..Default::default()
        }
    }
}

/// Who is acting on a request.
#[derive(Debug, Clone)]
pub struct Actor {
    /// The person's or agent's name (compared with the requester's).
    pub name: String,
    /// The audit actor, e.g. `approver:alice`.
    pub actor: String,
    /// The human role may approve this tool (from the policy).
    pub may_approve: bool,
}

/// How [`Approvals::transition`] takes a request's row lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lock {
    /// Wait for whoever holds it: a decision, a withdrawal or an outcome must be recorded.
    Wait,
    /// Give up at once if another replica holds it: sweeps and claims, where another
    /// replica already doing the work is as good as doing it here. (On SQLite there is no
    /// other replica: it waits like [`Lock::Wait`].)
    SkipLocked,
}

/// Which of a request's times [`Approvals::ids_in`] compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// When the request expires.
    Expiry,
    /// When the request last changed state.
    LastChange,
}

#[derive(Debug, thiserror::Error)]
pub enum ApprovalError {
    #[error("no approval request has id `{0}`")]
    NotFound(String),
    #[error("refused: {0}")]
    Refused(String),
    #[error("the request is {state}, not {wanted}", state = .state.as_str())]
    WrongState { state: State, wanted: &'static str },
    #[error("refused: the audit log cannot record this ({0}), so nothing changed")]
    Audit(#[from] AuditError),
    #[error("the approval store is unavailable: {0}")]
    Store(#[from] sqlx::Error),
}

/// The JSON text of a stored column (`store`) and of a NOTIFY payload (`notify`).
fn text(v: &impl Serialize) -> String {
    serde_json::to_string(v).expect("approval fields are JSON")
}
