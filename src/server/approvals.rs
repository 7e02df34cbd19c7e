//! Approval requests: the queue that calls the policy sends to humans (risk:high, and
//! risk:low unless lowered) wait in until they decide.
//!
//! A request is bound at creation to the exact call (tool, args, runners, reason, requester,
//! pack digest and the preview captured then). Its states:
//!
//! ```text
//! pending ─▶ approved ─▶ executing ─▶ executed | failed | unknown
//!    └─▶ denied | expired | withdrawn
//! ```
//!
//! Every transition goes through [`Approvals::transition`]: lock the row, decide the change
//! with a pure function of the row, make its audit event durable, write the row, announce
//! it. On PostgreSQL the lock is a row lock (`FOR UPDATE`, or `FOR UPDATE SKIP LOCKED` for
//! claims and sweeps), so several `emisar serve` replicas on one database execute an
//! approval exactly once; announcements fan out with LISTEN/NOTIFY. SQLite serves a single
//! replica, and the lock is a mutex in this process.
//!
//! Invariant: no transition is written whose audit event is not durable; `executing` is
//! entered once per request, and nothing moves a request out of `executing` except its
//! outcome or, after a crash, `unknown` (never a re-run).

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::{Map, Value, json};
use sqlx::{AssertSqlSafe, Row};
use tokio::sync::broadcast;

use crate::protocol::approval::{Signature, Signed};
use crate::server::audit::{AuditError, AuditLog, NewEvent, format_at};
use crate::server::db::{Db, Pool};
use crate::with_pool;

/// The PostgreSQL channel that carries approval changes between replicas.
const CHANNEL: &str = "emisar_approvals";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    Pending,
    Approved,
    Denied,
    Expired,
    Withdrawn,
    Executing,
    Executed,
    Failed,
    Unknown,
}

impl State {
    pub const ALL: [State; 9] = [
        State::Pending,
        State::Approved,
        State::Denied,
        State::Expired,
        State::Withdrawn,
        State::Executing,
        State::Executed,
        State::Failed,
        State::Unknown,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            State::Pending => "pending",
            State::Approved => "approved",
            State::Denied => "denied",
            State::Expired => "expired",
            State::Withdrawn => "withdrawn",
            State::Executing => "executing",
            State::Executed => "executed",
            State::Failed => "failed",
            State::Unknown => "unknown",
        }
    }

    pub fn parse(s: &str) -> Result<State, String> {
        State::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| {
                format!(
                    "`state` must be one of {}",
                    State::ALL.map(State::as_str).join(", ")
                )
            })
    }

    /// No further transition will happen.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            State::Denied
                | State::Expired
                | State::Withdrawn
                | State::Executed
                | State::Failed
                | State::Unknown
        )
    }
}

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
    /// The denial note, or why execution failed.
    pub note: Option<String>,
    /// The statement people sign (`crate::protocol::approval::Statement`'s text), when the
    /// request's runners check people's signatures; shown by the API with its hash.
    #[serde(skip)]
    pub statement: Option<String>,
    /// The actor whose decision settled the request.
    pub decided_by: Option<String>,
    /// The call's outcome (per-runner results) once executed.
    pub result: Option<Value>,
    pub created_at: String,
    pub expires_at: String,
    pub updated_at: String,
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

// A verdict lives for one decision and is never stored in bulk, so the size of a signed yes
// (a signature and what verifying it found) costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    Approve {
        note: Option<String>,
        /// The person's signature over the request's statement, as they sent it.
        signature: Option<Signature>,
        /// The server's verification of `signature` (set by the gateway, never by a client).
        signed: Option<Signed>,
    },
    Deny {
        note: String,
    },
}

impl Verdict {
    /// A plain yes: no note, no signature.
    pub fn approve() -> Verdict {
        Verdict::Approve {
            note: None,
            signature: None,
            signed: None,
        }
    }
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

/// A row change and the audit events that record it, in order (none only when the events
/// that record it were written already, as the per-runner outcomes of an execution are).
pub struct Change {
    pub row: Approval,
    pub events: Vec<NewEvent>,
}

impl Change {
    /// This change, then `next` (a change of the row this one produced) as one transition:
    /// `next`'s row, recorded by both changes' events.
    pub fn then(mut self, next: Change) -> Change {
        self.events.extend(next.events);
        Change {
            row: next.row,
            events: self.events,
        }
    }
}

/// Whether `name` is a person signed in through the OpenID provider (`person:<id>`), not a
/// local user (local names are identifiers, which never hold `:`).
fn is_provider_person(name: &str) -> bool {
    name.starts_with(crate::server::principal::PERSON_PREFIX)
}

/// What happened to the request after a decision. Refused: a request that is not pending or
/// has expired; a decision by its requester or by the person it was asked for on behalf of;
/// a role the policy does not let decide the tool; a second vote by the same name; and a
/// vote by a local user on a request a provider person voted for, or the other way round.
pub fn decide(
    row: &Approval,
    who: &Actor,
    verdict: &Verdict,
    now: DateTime<Utc>,
) -> Result<Change, ApprovalError> {
    if row.state != State::Pending {
        return Err(ApprovalError::WrongState {
            state: row.state,
            wanted: "pending",
        });
    }
    if row.expired_at(now) {
        return Err(ApprovalError::Refused(format!(
            "the request expired at {}; the agent must ask again",
            row.expires_at
        )));
    }
    if who.name == row.requester_name {
        return Err(ApprovalError::Refused(
            "you requested this yourself: someone else must decide".into(),
        ));
    }
    if row.on_behalf_of.as_deref() == Some(who.name.as_str()) {
        return Err(ApprovalError::Refused(format!(
            "agent `{}` asked for this on your behalf: someone else must decide",
            row.requester_name
        )));
    }
    if !who.may_approve {
        return Err(ApprovalError::Refused(format!(
            "`{}` may not decide requests for `{}` (policy roles)",
            who.actor, row.tool
        )));
    }
    let at = format_at(now);
    let mut next = row.clone();
    next.updated_at = at.clone();
    match verdict {
        Verdict::Deny { note } => {
            if note.trim().is_empty() {
                return Err(ApprovalError::Refused(
                    "`note`: a denial needs a note the agent will read".into(),
                ));
            }
            next.state = State::Denied;
            next.note = Some(note.clone());
            next.decided_by = Some(who.actor.clone());
            let event = row.event(
                &who.actor,
                crate::server::audit::kind::APPROVAL_DENIED,
                json!({"note": note}),
            );
            Ok(Change {
                row: next,
                events: vec![event],
            })
        }
        Verdict::Approve {
            note,
            signature,
            signed,
        } => {
            if row.votes.iter().any(|v| v.user == who.name) {
                return Err(ApprovalError::Refused(
                    "you approved this already: another approver must add theirs".into(),
                ));
            }
            match (&row.statement, signature, signed) {
                (None, None, _) | (Some(_), Some(_), Some(_)) => {}
                (Some(_), None, _) => {
                    return Err(ApprovalError::Refused(
                        "`signature`: this request's runners run it only with people's signatures: sign its statement (`emisar approvals approve ID` signs with your SSH key; the portal, with your passkey)".into(),
                    ));
                }
                (None, Some(_), _) => {
                    return Err(ApprovalError::Refused(
                        "`signature`: this request has no statement to sign (its runners do not check signatures); approve it without one".into(),
                    ));
                }
                (Some(_), Some(_), None) => {
                    return Err(ApprovalError::Refused(
                        "`signature`: not verified by the server".into(),
                    ));
                }
            }
            if let Some(s) = signed
                && let Some(v) = row
                    .votes
                    .iter()
                    .find(|v| v.signed.as_ref().is_some_and(|o| o.person == s.person))
            {
                return Err(ApprovalError::Refused(format!(
                    "`signature`: `{}` of the approvers file signed this already (as `{}`): one person counts once, whatever the sign-in",
                    s.person, v.user
                )));
            }
            // One human may hold a local user and a provider identity (`alice` and
            // `person:alice@corp`), and nothing links the two: the votes of one request must
            // all come from one kind of sign-in, within which a name is one person.
            if let Some(first) = row.votes.first()
                && is_provider_person(&first.user) != is_provider_person(&who.name)
            {
                let (theirs, yours) = if is_provider_person(&first.user) {
                    ("people signed in through the provider", "a local user")
                } else {
                    ("local users", "signed in through the provider")
                };
                return Err(ApprovalError::Refused(format!(
                    "this request's approvals so far are by {theirs} and you are {yours}: all approvals of one request come from one kind of sign-in, so one person with both cannot count twice"
                )));
            }
            next.votes.push(Vote {
                user: who.name.clone(),
                at,
                note: note.clone(),
                signature: signature.clone(),
                signed: signed.clone(),
            });
            let votes = next.votes.len() as u32;
            if votes >= row.required_approvals {
                next.state = State::Approved;
                next.decided_by = Some(who.actor.clone());
            }
            let mut detail =
                json!({"votes": votes, "required": row.required_approvals, "state": next.state});
            if let Some(note) = note {
                detail["note"] = json!(note);
            }
            // Everything an auditor needs to verify the signature again, offline.
            if let (Some(statement), Some(signature), Some(signed)) =
                (&row.statement, signature, signed)
            {
                detail["statement"] = json!(statement);
                detail["signature"] = json!(signature);
                detail["signed"] = json!(signed);
            }
            let event = row.event(
                &who.actor,
                crate::server::audit::kind::APPROVAL_APPROVED,
                detail,
            );
            Ok(Change {
                row: next,
                events: vec![event],
            })
        }
    }
}

/// A plain move from one state to another, audited with `kind` by `actor`.
pub fn moved(
    row: &Approval,
    from: &[State],
    to: State,
    actor: &str,
    kind: &str,
    detail: Value,
    now: DateTime<Utc>,
) -> Result<Change, ApprovalError> {
    if !from.contains(&row.state) {
        return Err(ApprovalError::WrongState {
            state: row.state,
            wanted: from[0].as_str(),
        });
    }
    let mut next = row.clone();
    next.state = to;
    next.updated_at = format_at(now);
    let event = row.event(actor, kind, detail);
    Ok(Change {
        row: next,
        events: vec![event],
    })
}

/// An announcement that a request was created or changed.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Changed {
    pub id: String,
    pub state: State,
}

#[derive(Clone)]
pub struct Approvals {
    db: Db,
    audit: AuditLog,
    changes: broadcast::Sender<Changed>,
    /// SQLite only: the row lock (a single replica, so a process mutex is the whole lock).
    local: Arc<tokio::sync::Mutex<()>>,
    /// PostgreSQL: transitions in flight ([`TRANSITION_SLOTS`]), each holding a pooled
    /// connection while its audit event is written (through another pooled connection).
    in_flight: Arc<tokio::sync::Semaphore>,
}

/// PostgreSQL transitions in flight at once. Kept below the pool size
/// ([`crate::server::db::PG_POOL_SIZE`]) so the audit writer, which the transitions wait on,
/// always finds a connection. Ten, so that ten approvals clicked at once all go through
/// together: with four they went in three waves (A/B of the approval bench, 10 at once, p95
/// 33-37 ms with four against 28-31 ms with ten).
const TRANSITION_SLOTS: usize = 10;

const PG_COLUMNS: &str = "id, call_id, tool, risk, args::text AS args, shown_args::text AS shown_args, runners::text AS runners, runner_chosen, raw, reason, requester, requester_name, on_behalf_of, pack_sha256, preview::text AS preview, required_approvals, approvals::text AS approvals, state, note, decided_by, result::text AS result, to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') AS created_at, to_char(expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') AS expires_at, to_char(updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') AS updated_at, statement";
const INSERT: &str = "INSERT INTO approvals (id, call_id, tool, risk, args, shown_args, runners, runner_chosen, raw, reason, requester, requester_name, pack_sha256, preview, required_approvals, approvals, state, note, decided_by, result, created_at, expires_at, updated_at, on_behalf_of, statement) VALUES ($1,$2,$3,$4,$5::jsonb,$6::jsonb,$7::jsonb,$8,$9,$10,$11,$12,$13,$14::jsonb,$15,$16::jsonb,$17,$18,$19,$20::jsonb,$21::timestamptz,$22::timestamptz,$23::timestamptz,$24,$25)";
const UPDATE: &str = "UPDATE approvals SET state = $2, approvals = $3::jsonb, note = $4, decided_by = $5, result = $6::jsonb, updated_at = $7::timestamptz WHERE id = $1";
const SQLITE_COLUMNS: &str = "id, call_id, tool, risk, args, shown_args, runners, runner_chosen, raw, reason, requester, requester_name, on_behalf_of, pack_sha256, preview, required_approvals, approvals, state, note, decided_by, result, created_at, expires_at, updated_at, statement";

fn from_row<R>(row: &R) -> Result<Approval, sqlx::Error>
where
    R: Row,
    for<'a> &'a str: sqlx::ColumnIndex<R>,
    for<'a> String: sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
    for<'a> Option<String>: sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
    for<'a> bool: sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
    for<'a> i32: sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
{
    fn json<T: serde::de::DeserializeOwned>(column: &str, text: &str) -> Result<T, sqlx::Error> {
        serde_json::from_str(text).map_err(|e| sqlx::Error::ColumnDecode {
            index: column.to_owned(),
            source: Box::new(e),
        })
    }
    let opt_json = |column: &str| -> Result<Option<Value>, sqlx::Error> {
        row.try_get::<Option<String>, _>(column)?
            .map(|t| json(column, &t))
            .transpose()
    };
    let state: String = row.try_get("state")?;
    Ok(Approval {
        id: row.try_get("id")?,
        call_id: row.try_get("call_id")?,
        tool: row.try_get("tool")?,
        risk: row.try_get("risk")?,
        args: json("args", &row.try_get::<String, _>("args")?)?,
        shown_args: json("shown_args", &row.try_get::<String, _>("shown_args")?)?,
        runners: json("runners", &row.try_get::<String, _>("runners")?)?,
        runner_chosen_by_server: row.try_get("runner_chosen")?,
        raw: row.try_get("raw")?,
        reason: row.try_get("reason")?,
        requester: row.try_get("requester")?,
        requester_name: row.try_get("requester_name")?,
        on_behalf_of: row.try_get("on_behalf_of")?,
        pack_sha256: row.try_get("pack_sha256")?,
        preview: opt_json("preview")?,
        required_approvals: row.try_get::<i32, _>("required_approvals")?.max(1) as u32,
        votes: json("approvals", &row.try_get::<String, _>("approvals")?)?,
        state: State::parse(&state).map_err(|e| sqlx::Error::ColumnDecode {
            index: "state".into(),
            source: e.into(),
        })?,
        note: row.try_get("note")?,
        statement: row.try_get("statement")?,
        decided_by: row.try_get("decided_by")?,
        result: opt_json("result")?,
        created_at: row.try_get("created_at")?,
        expires_at: row.try_get("expires_at")?,
        updated_at: row.try_get("updated_at")?,
    })
}

fn text(v: &impl Serialize) -> String {
    serde_json::to_string(v).expect("approval fields are JSON")
}

impl Approvals {
    /// The store, and (on PostgreSQL) a task that relays other replicas' changes until
    /// `shutdown`.
    pub fn new(
        db: Db,
        audit: AuditLog,
        shutdown: tokio_util::sync::CancellationToken,
    ) -> Approvals {
        let (changes, _) = broadcast::channel(1024);
        let approvals = Approvals {
            db,
            audit,
            changes,
            local: Arc::default(),
            in_flight: Arc::new(tokio::sync::Semaphore::new(TRANSITION_SLOTS)),
        };
        if let Pool::Pg(_) = approvals.db.pool() {
            tokio::spawn(listen(
                approvals.db.clone(),
                approvals.changes.clone(),
                shutdown,
            ));
        }
        approvals
    }

    /// Every creation and state change, on this replica and (PostgreSQL) every other.
    pub fn subscribe(&self) -> broadcast::Receiver<Changed> {
        self.changes.subscribe()
    }

    fn announce(&self, row: &Approval) {
        let _ = self.changes.send(Changed {
            id: row.id.clone(),
            state: row.state,
        });
    }

    /// Stores a new pending request; its `approval.requested` event must already be durable.
    pub async fn insert(&self, a: &Approval) -> Result<(), ApprovalError> {
        // One statement and bind order for both backends (`Db::sql` drops the casts).
        macro_rules! insert {
            ($sql:expr) => {
                sqlx::query(self.db.sql($sql))
                    .bind(&a.id)
                    .bind(&a.call_id)
                    .bind(&a.tool)
                    .bind(&a.risk)
                    .bind(text(&a.args))
                    .bind(text(&a.shown_args))
                    .bind(text(&a.runners))
                    .bind(a.runner_chosen_by_server)
                    .bind(a.raw)
                    .bind(&a.reason)
                    .bind(&a.requester)
                    .bind(&a.requester_name)
                    .bind(&a.pack_sha256)
                    .bind(a.preview.as_ref().map(text))
                    .bind(a.required_approvals as i32)
                    .bind(text(&a.votes))
                    .bind(a.state.as_str())
                    .bind(&a.note)
                    .bind(&a.decided_by)
                    .bind(a.result.as_ref().map(text))
                    .bind(&a.created_at)
                    .bind(&a.expires_at)
                    .bind(&a.updated_at)
                    .bind(&a.on_behalf_of)
                    .bind(&a.statement)
            };
        }
        self.db
            .guard(async {
                match self.db.pool() {
                    Pool::Pg(pool) => {
                        insert!(INSERT).execute(pool).await?;
                        notify_committed(pool, a).await;
                        Ok(())
                    }
                    Pool::Sqlite(pool) => insert!(INSERT).execute(pool).await.map(|_| ()),
                }
            })
            .await?;
        self.announce(a);
        Ok(())
    }

    /// The columns to select, per backend (PostgreSQL hands JSON and times back as text).
    fn columns(&self) -> &'static str {
        match self.db.pool() {
            Pool::Pg(_) => PG_COLUMNS,
            Pool::Sqlite(_) => SQLITE_COLUMNS,
        }
    }

    pub async fn get(&self, id: &str) -> Result<Approval, ApprovalError> {
        let sql = format!("SELECT {} FROM approvals WHERE id = $1", self.columns());
        let row = self
            .db
            .guard(async {
                with_pool!(self.db, pool => {
                    match sqlx::query(AssertSqlSafe(sql)).bind(id).fetch_optional(pool).await? {
                        Some(r) => from_row(&r).map(Some),
                        None => Ok(None),
                    }
                })
            })
            .await?;
        row.ok_or_else(|| ApprovalError::NotFound(id.to_owned()))
    }

    /// Newest first; `state` narrows the list, `requester` limits it to one requester.
    pub async fn list(
        &self,
        state: Option<State>,
        requester_name: Option<&str>,
        limit: i64,
    ) -> Result<Vec<Approval>, ApprovalError> {
        let sql = self.db.sql(format!(
            "SELECT {} FROM approvals WHERE ($1::text IS NULL OR state = $1) AND ($2::text IS NULL OR requester_name = $2) ORDER BY created_at DESC, id LIMIT $3",
            self.columns()
        ));
        let rows = self
            .db
            .guard(async {
                with_pool!(self.db, pool => {
                    sqlx::query(sql)
                        .bind(state.map(State::as_str))
                        .bind(requester_name)
                        .bind(limit)
                        .fetch_all(pool)
                        .await?
                        .iter()
                        .map(from_row)
                        .collect::<Result<Vec<_>, _>>()
                })
            })
            .await?;
        Ok(rows)
    }

    /// How many requests of agent `name` are pending and not yet past their expiry.
    pub async fn pending_of(&self, name: &str) -> Result<u64, ApprovalError> {
        let sql = self.db.sql(
            "SELECT COUNT(*) FROM approvals WHERE state = $1 AND requester_name = $2 AND expires_at > $3::timestamptz",
        );
        let now = format_at(Utc::now());
        let n = self
            .db
            .guard(async {
                with_pool!(self.db, pool => {
                    sqlx::query_scalar::<_, i64>(sql)
                        .bind(State::Pending.as_str())
                        .bind(name)
                        .bind(&now)
                        .fetch_one(pool)
                        .await
                })
            })
            .await?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// Ids in `state` whose `due` time is before `before`, for the sweeper.
    pub async fn ids_in(
        &self,
        state: State,
        before: &str,
        due: Due,
    ) -> Result<Vec<String>, ApprovalError> {
        let column = match due {
            Due::Expiry => "expires_at",
            Due::LastChange => "updated_at",
        };
        let sql = self.db.sql(format!(
            "SELECT id FROM approvals WHERE state = $1 AND {column} <= $2::timestamptz LIMIT 100"
        ));
        let ids = self
            .db
            .guard(async {
                with_pool!(self.db, pool => {
                    sqlx::query_scalar::<_, String>(sql)
                        .bind(state.as_str())
                        .bind(before)
                        .fetch_all(pool)
                        .await
                })
            })
            .await?;
        Ok(ids)
    }

    /// The one way a request changes: lock the row (with [`Lock::SkipLocked`], give up at
    /// once if another replica holds it, returning `Ok(None)`), let `change` decide from the
    /// locked row, make the audit event durable, write the row, announce it.
    pub async fn transition<F>(
        &self,
        id: &str,
        lock: Lock,
        change: F,
    ) -> Result<Option<Approval>, ApprovalError>
    where
        F: FnOnce(&Approval) -> Result<Change, ApprovalError>,
    {
        // Writes the changed columns; one statement for both backends.
        macro_rules! update {
            ($a:expr) => {
                sqlx::query(self.db.sql(UPDATE))
                    .bind(&$a.id)
                    .bind($a.state.as_str())
                    .bind(text(&$a.votes))
                    .bind(&$a.note)
                    .bind(&$a.decided_by)
                    .bind($a.result.as_ref().map(text))
                    .bind(&$a.updated_at)
            };
        }
        let written = match self.db.pool() {
            Pool::Pg(pool) => {
                let (_slot, mut tx) = self.db.begin_holding_slot(pool, &self.in_flight).await?;
                let clause = match lock {
                    Lock::SkipLocked => "FOR UPDATE SKIP LOCKED",
                    Lock::Wait => "FOR UPDATE",
                };
                let sql = format!("SELECT {PG_COLUMNS} FROM approvals WHERE id = $1 {clause}");
                let Some(row) = sqlx::query(AssertSqlSafe(sql))
                    .bind(id)
                    .fetch_optional(&mut *tx)
                    .await?
                else {
                    if lock == Lock::SkipLocked && self.exists(id).await? {
                        return Ok(None);
                    }
                    return Err(ApprovalError::NotFound(id.to_owned()));
                };
                let current = from_row(&row)?;
                let Change { row, events } = change(&current)?;
                self.audit.append_all(events).await?;
                update!(&row).execute(&mut *tx).await?;
                tx.commit().await?;
                notify_committed(pool, &row).await;
                row
            }
            Pool::Sqlite(_) => {
                // A SQLite store belongs to one process, so no other replica can hold the
                // request: `local` only puts this process's transitions (of every request)
                // in order, and both kinds of lock wait their turn. Giving up on a busy
                // `local`, as SKIP LOCKED gives up on a row, left every claim of a burst of
                // approvals but the first to the next sweep. A claim that waited finds the
                // request as the one before it left it, and `change` decides from that.
                let _held = self.local.lock().await;
                let current = self.get(id).await?;
                let Change { row, events } = change(&current)?;
                self.audit.append_all(events).await?;
                let Pool::Sqlite(pool) = self.db.pool() else {
                    unreachable!("this arm is SQLite's")
                };
                self.db.guard(update!(&row).execute(pool)).await?;
                row
            }
        };
        self.announce(&written);
        Ok(Some(written))
    }

    /// Ends an execution: `executing` → `state`, with the call's outcome. When runners were
    /// called, their per-runner outcome events (written before this) record it; when none
    /// was (the execution failed before dispatch), it is recorded here as `call.failed`.
    pub async fn finish(
        &self,
        id: &str,
        state: State,
        result: Value,
        note: Option<String>,
    ) -> Result<(), ApprovalError> {
        self.transition(id, Lock::Wait, |r| {
            if r.state != State::Executing {
                return Err(ApprovalError::WrongState {
                    state: r.state,
                    wanted: "executing",
                });
            }
            let nothing_ran = result["results"].as_array().is_none_or(Vec::is_empty);
            let events = Vec::from_iter(nothing_ran.then(|| {
                let mut e = r.event(
                    &r.requester,
                    crate::server::audit::kind::CALL_FAILED,
                    json!({"error": note, "state": state}),
                );
                e.outcome = Some("error".into());
                e
            }));
            let mut row = r.clone();
            row.state = state;
            row.result = Some(result);
            row.note = note;
            row.updated_at = format_at(Utc::now());
            Ok(Change { row, events })
        })
        .await
        .map(|_| ())
    }

    async fn exists(&self, id: &str) -> Result<bool, ApprovalError> {
        match self.get(id).await {
            Ok(_) => Ok(true),
            Err(ApprovalError::NotFound(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// Tells every replica that `a` changed, once its change has committed.
///
/// Not inside the change's own transaction: PostgreSQL serialises the commits of notifying
/// transactions (each holds a database-wide lock from before its commit record until the
/// end, flush included), so ten approvals clicked at once committed one flush after the
/// other. This statement commits on its own without waiting for its flush
/// (`synchronous_commit` off for it alone): the notification is only a hint, since waiters
/// also poll, and one lost in a crash delays an update without losing it. A failure to send
/// it is logged, never the change's failure.
async fn notify_committed(pool: &sqlx::PgPool, a: &Approval) {
    let payload = text(&Changed {
        id: a.id.clone(),
        state: a.state,
    });
    let sent =
        sqlx::query("SELECT set_config('synchronous_commit', 'off', true), pg_notify($1, $2)")
            .bind(CHANNEL)
            .bind(payload)
            .execute(pool)
            .await;
    if let Err(e) = sent {
        tracing::warn!(error = %e, approval_id = %a.id, "could not tell the other replicas of an approval change; they see it when they next poll");
    }
}

/// Relays NOTIFY payloads into the local channel. The connection goes through the store's
/// gate like every other: during an outage it waits for the gate to reopen instead of
/// reconnecting on its own. Waiters also poll, so a gap delays an update but never loses one.
async fn listen(
    db: Db,
    changes: broadcast::Sender<Changed>,
    shutdown: tokio_util::sync::CancellationToken,
) {
    let Pool::Pg(pool) = db.pool().clone() else {
        return;
    };
    let backoff =
        crate::util::Backoff::try_new(Duration::from_millis(200), Duration::from_secs(30))
            .expect("valid bounds");
    let mut failures = 0u32;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = db.until_up() => {}
        }
        let attempt = async {
            let mut listener = sqlx::postgres::PgListener::connect_with(&pool).await?;
            // A lost connection must come back here, not be re-made inside the listener
            // (through the pool's own connect retries, past the gate).
            listener.eager_reconnect(false);
            listener.listen(CHANNEL).await?;
            loop {
                let Some(n) = listener.try_recv().await? else {
                    // Reported as a connection error, so the guard closes the gate.
                    return Err(sqlx::Error::Io(std::io::Error::new(
                        std::io::ErrorKind::ConnectionAborted,
                        "the LISTEN connection was lost",
                    )));
                };
                if let Ok(changed) = serde_json::from_str::<Changed>(n.payload()) {
                    let _ = changes.send(changed);
                }
            }
        };
        let started = std::time::Instant::now();
        tokio::select! {
            _ = shutdown.cancelled() => return,
            result = db.guard::<()>(attempt) => {
                if let Err(e) = result {
                    tracing::warn!(error = %e, "approval change listener lost its connection");
                }
            }
        }
        // A gap between outages (or an error that is not the store being down) still backs
        // off, so a listener that keeps failing never spins.
        if started.elapsed() > Duration::from_secs(60) {
            failures = 0;
        }
        failures = failures.saturating_add(1);
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(backoff.delay(failures)) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row() -> Approval {
        Approval {
            id: "a1".into(),
            call_id: "c1".into(),
            tool: "linux.systemctl_restart".into(),
            risk: "high".into(),
            args: Map::new(),
            shown_args: json!({"unit": "consul"}),
            runners: vec!["hvn05".into()],
            runner_chosen_by_server: false,
            raw: false,
            reason: "r".into(),
            requester: "agent:bot".into(),
            requester_name: "bot".into(),
            on_behalf_of: Some("person:dana".into()),
            pack_sha256: "p".into(),
            preview: None,
            required_approvals: 1,
            votes: vec![],
            state: State::Pending,
            note: None,
            statement: None,
            decided_by: None,
            result: None,
            created_at: "2026-11-30T10:00:00.000000Z".into(),
            expires_at: "2026-11-30T10:15:00.000000Z".into(),
            updated_at: "2026-11-30T10:00:00.000000Z".into(),
        }
    }

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn who(name: &str) -> Actor {
        Actor {
            name: name.into(),
            actor: format!("approver:{name}"),
            may_approve: true,
        }
    }

    #[test]
    fn one_request_is_approved_by_one_kind_of_sign_in() {
        let now = at("2026-11-30T10:05:00Z");
        let mut r = row();
        r.on_behalf_of = None;
        r.required_approvals = 2;
        let person = |name: &str| Actor {
            name: format!("person:{name}"),
            actor: format!("person:{name}"),
            may_approve: true,
        };
        // A local user, then the same human's provider identity: refused.
        let once = decide(&r, &who("alice"), &Verdict::approve(), now)
            .unwrap()
            .row;
        let err = decide(&once, &person("alice@corp"), &Verdict::approve(), now)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("one kind of sign-in"), "{err}");
        // The other way round too.
        let once = decide(&r, &person("alice@corp"), &Verdict::approve(), now)
            .unwrap()
            .row;
        let err = decide(&once, &who("alice"), &Verdict::approve(), now)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("one kind of sign-in"), "{err}");
        // Two of one kind count; a denial is never refused for the kind.
        let twice = decide(&once, &person("bob@corp"), &Verdict::approve(), now).unwrap();
        assert_eq!(twice.row.state, State::Approved);
        let deny = Verdict::Deny { note: "no".into() };
        assert!(decide(&once, &who("carol"), &deny, now).is_ok());
        let once = decide(&r, &who("alice"), &Verdict::approve(), now)
            .unwrap()
            .row;
        let twice = decide(&once, &who("bob"), &Verdict::approve(), now).unwrap();
        assert_eq!(twice.row.state, State::Approved);
    }

    #[test]
    fn decisions() {
        let now = at("2026-11-30T10:05:00Z");
        let late = at("2026-11-30T10:15:00Z");
        let two = Approval {
            required_approvals: 2,
            ..row()
        };
        let cannot = Actor {
            may_approve: false,
            ..who("carol")
        };
        let deny = |note: &str| Verdict::Deny { note: note.into() };
        // (name, row, who, verdict, now, Ok(new state) or Err(substring))
        type Case = (
            &'static str,
            Approval,
            Actor,
            Verdict,
            DateTime<Utc>,
            Result<State, &'static str>,
        );
        let cases: Vec<Case> = vec![
            (
                "approve",
                row(),
                who("alice"),
                Verdict::approve(),
                now,
                Ok(State::Approved),
            ),
            (
                "deny with note",
                row(),
                who("alice"),
                deny("not now"),
                now,
                Ok(State::Denied),
            ),
            (
                "deny without note",
                row(),
                who("alice"),
                deny("  "),
                now,
                Err("needs a note"),
            ),
            (
                "self approval",
                row(),
                who("bot"),
                Verdict::approve(),
                now,
                Err("yourself"),
            ),
            (
                "self denial",
                row(),
                who("bot"),
                deny("x"),
                now,
                Err("yourself"),
            ),
            (
                "approval by the person the agent acted for",
                row(),
                who("person:dana"),
                Verdict::approve(),
                now,
                Err("on your behalf"),
            ),
            (
                "denial by the person the agent acted for",
                row(),
                who("person:dana"),
                deny("x"),
                now,
                Err("on your behalf"),
            ),
            (
                "expired",
                row(),
                who("alice"),
                Verdict::approve(),
                late,
                Err("expired"),
            ),
            (
                "role may not",
                row(),
                cannot,
                Verdict::approve(),
                now,
                Err("may not decide"),
            ),
            (
                "first of two",
                two.clone(),
                who("alice"),
                Verdict::approve(),
                now,
                Ok(State::Pending),
            ),
            (
                "already approved",
                Approval {
                    state: State::Approved,
                    ..row()
                },
                who("alice"),
                Verdict::approve(),
                now,
                Err("approved, not pending"),
            ),
            (
                "same approver twice",
                Approval {
                    votes: vec![Vote {
                        user: "alice".into(),
                        at: "x".into(),
                        ..Default::default()
                    }],
                    ..two.clone()
                },
                who("alice"),
                Verdict::approve(),
                now,
                Err("already"),
            ),
            (
                "second of two",
                Approval {
                    votes: vec![Vote {
                        user: "alice".into(),
                        at: "x".into(),
                        ..Default::default()
                    }],
                    ..two
                },
                who("bob"),
                Verdict::approve(),
                now,
                Ok(State::Approved),
            ),
        ];
        for (name, row, who, verdict, now, want) in cases {
            let got = decide(&row, &who, &verdict, now);
            match (got, want) {
                (Ok(change), Ok(state)) => {
                    assert_eq!(change.row.state, state, "{name}");
                    let [event] = &change.events[..] else {
                        panic!("{name}: a decision is audited by one event");
                    };
                    assert_eq!(event.approval_id.as_deref(), Some("a1"), "{name}");
                    assert_eq!(event.actor, who.actor, "{name}");
                }
                (Err(e), Err(needle)) => {
                    assert!(e.to_string().contains(needle), "{name}: {e}")
                }
                (got, want) => panic!("{name}: got {:?}, want {want:?}", got.map(|c| c.row.state)),
            }
        }
    }

    /// On SQLite, claims of several approved requests at once all succeed: a claim waits for
    /// the process's other transitions instead of being left to the next sweep.
    #[tokio::test]
    async fn on_sqlite_claims_made_together_all_go_through() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("emisar.db").display());
        let (db, _) = Db::connect_and_migrate(&url).await.unwrap();
        let audit = AuditLog::start(db.clone());
        let store = Approvals::new(db, audit, tokio_util::sync::CancellationToken::new());
        let ids: Vec<String> = (0..10).map(|i| format!("a{i}")).collect();
        for (i, id) in ids.iter().enumerate() {
            let r = Approval {
                id: id.clone(),
                call_id: format!("c{i}"),
                state: State::Approved,
                ..row()
            };
            store.insert(&r).await.unwrap();
        }
        let claims = ids.iter().map(|id| {
            store.transition(id, Lock::SkipLocked, |r| {
                moved(
                    r,
                    &[State::Approved],
                    State::Executing,
                    "approver:alice",
                    "approval.executing",
                    json!({}),
                    Utc::now(),
                )
            })
        });
        let results = futures::future::join_all(claims).await;
        for (id, r) in ids.iter().zip(results) {
            let claimed = r.unwrap_or_else(|e| panic!("claim of {id}: {e}"));
            assert_eq!(
                claimed.map(|a| a.state),
                Some(State::Executing),
                "the claim of {id} was given up while another transition ran"
            );
        }
    }

    #[test]
    fn only_listed_states_move() {
        let now = at("2026-11-30T10:05:00Z");
        let r = moved(
            &row(),
            &[State::Approved],
            State::Executing,
            "x",
            "k",
            json!({}),
            now,
        );
        assert!(matches!(
            r,
            Err(ApprovalError::WrongState {
                state: State::Pending,
                ..
            })
        ));
        let approved = Approval {
            state: State::Approved,
            ..row()
        };
        let r = moved(
            &approved,
            &[State::Approved],
            State::Executing,
            "x",
            "k",
            json!({}),
            now,
        );
        assert_eq!(r.unwrap().row.state, State::Executing);
    }
}
