//! The state machine, pure: from a request's row, a person's decision or a plain move gives
//! the next row and the audit events that record it ([`Change`]), or says why not. No IO, no
//! clock but the `now` it is given; [`Approvals::transition`](super::Approvals::transition)
//! runs these under the row's lock.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::{Value, json};

use super::{Actor, Approval, ApprovalError, Vote};
use crate::protocol::approval::{Signature, Signed};
use crate::server::audit::{NewEvent, format_at};

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
    /// A rollout stopped at a failed health gate (or a failed write) in one wave: the runners
    /// of the later waves never ran. Only people's signed decision moves it on (`halted.rs`).
    Halted,
    /// People decided a halted rollout runs no further.
    Aborted,
}

impl State {
    pub(crate) const ALL: [State; 11] = [
        State::Pending,
        State::Approved,
        State::Denied,
        State::Expired,
        State::Withdrawn,
        State::Executing,
        State::Executed,
        State::Failed,
        State::Unknown,
        State::Halted,
        State::Aborted,
    ];

    pub(crate) fn as_str(self) -> &'static str {
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
            State::Halted => "halted",
            State::Aborted => "aborted",
        }
    }

    pub(crate) fn parse(s: &str) -> Result<State, String> {
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

    /// No further transition will happen by itself (a halted rollout waits for people's
    /// decision, which nothing but people makes).
    pub fn is_final(self) -> bool {
        matches!(
            self,
            State::Denied
                | State::Expired
                | State::Withdrawn
                | State::Executed
                | State::Failed
                | State::Unknown
                | State::Halted
                | State::Aborted
        )
    }
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

/// A row change and the audit events that record it, in order (none only when the events
/// that record it were written already, as the per-runner outcomes of an execution are).
pub struct Change {
    pub row: Approval,
    pub events: Vec<NewEvent>,
}

impl Change {
    /// This change, then `next` (a change of the row this one produced) as one transition:
    /// `next`'s row, recorded by both changes' events.
    pub(crate) fn then(mut self, next: Change) -> Change {
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
/// a role the policy does not let decide the tool; a denial without a note; a second vote by
/// the same name or the same person of the approvers file; a signature the request does not
/// call for, or one it calls for and lacks; and a vote by a local user on a request a
/// provider person voted for, or the other way round.
pub fn decide(
    row: &Approval,
    who: &Actor,
    verdict: &Verdict,
    now: DateTime<Utc>,
) -> Result<Change, ApprovalError> {
    check_open(row, now)?;
    check_voter(row, who)?;
    match verdict {
        Verdict::Deny { note } => deny(row, who, note, now),
        Verdict::Approve {
            note,
            signature,
            signed,
        } => {
            let vote = Vote {
                user: who.name.clone(),
                at: format_at(now),
                note: note.clone(),
                signature: signature.clone(),
                signed: signed.clone(),
            };
            approve(row, who, vote)
        }
    }
}

/// Whether `row` still takes decisions at `now`: pending, and not expired.
fn check_open(row: &Approval, now: DateTime<Utc>) -> Result<(), ApprovalError> {
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
    Ok(())
}

/// A denial: one is enough, and it carries a note the agent will read.
fn deny(
    row: &Approval,
    who: &Actor,
    note: &str,
    now: DateTime<Utc>,
) -> Result<Change, ApprovalError> {
    if note.trim().is_empty() {
        return Err(ApprovalError::Refused(
            "`note`: a denial needs a note the agent will read".into(),
        ));
    }
    let mut next = row.clone();
    next.updated_at = format_at(now);
    next.state = State::Denied;
    next.note = Some(note.to_owned());
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

/// A yes, `vote`, counted once it passes every rule a vote must; the request is approved
/// when it has all the votes it needs.
fn approve(row: &Approval, who: &Actor, vote: Vote) -> Result<Change, ApprovalError> {
    check_first_vote_of(&row.votes, &vote.user)?;
    check_signature_fits(row, &vote)?;
    check_person_counts_once(&row.votes, vote.signed.as_ref())?;
    check_one_kind_of_sign_in(&row.votes, &vote.user)?;
    let next = with_vote(row, who, vote);
    let event = row.event(
        &who.actor,
        crate::server::audit::kind::APPROVAL_APPROVED,
        approved_detail(row, &next),
    );
    Ok(Change {
        row: next,
        events: vec![event],
    })
}

/// One vote per name.
pub(super) fn check_first_vote_of(votes: &[Vote], user: &str) -> Result<(), ApprovalError> {
    if votes.iter().any(|v| v.user == user) {
        return Err(ApprovalError::Refused(
            "you approved this already: another approver must add theirs".into(),
        ));
    }
    Ok(())
}

/// A request with a statement takes only votes that signed it, verified by the server; one
/// without takes only votes without a signature.
fn check_signature_fits(row: &Approval, vote: &Vote) -> Result<(), ApprovalError> {
    let why = match (&row.statement, &vote.signature, &vote.signed) {
        (None, None, _) | (Some(_), Some(_), Some(_)) => return Ok(()),
        (Some(_), None, _) => {
            "`signature`: this request's runners run it only with people's signatures: sign its statement (`emisar approvals approve ID` signs with your SSH key; the portal, with your passkey)"
        }
        (None, Some(_), _) => {
            "`signature`: this request has no statement to sign (its runners do not check signatures); approve it without one"
        }
        (Some(_), Some(_), None) => "`signature`: not verified by the server",
    };
    Err(ApprovalError::Refused(why.into()))
}

/// One person of the approvers file counts once, whatever the user name they signed in as.
pub(super) fn check_person_counts_once(
    votes: &[Vote],
    signed: Option<&Signed>,
) -> Result<(), ApprovalError> {
    let Some(s) = signed else {
        return Ok(());
    };
    match votes
        .iter()
        .find(|v| v.signed.as_ref().is_some_and(|o| o.person == s.person))
    {
        Some(v) => Err(ApprovalError::Refused(format!(
            "`signature`: `{}` of the approvers file signed this already (as `{}`): one person counts once, whatever the sign-in",
            s.person, v.user
        ))),
        None => Ok(()),
    }
}

/// One human may hold a local user and a provider identity (`alice` and `person:alice@corp`),
/// and nothing links the two: the votes of one request all come from one kind of sign-in,
/// within which a name is one person.
pub(super) fn check_one_kind_of_sign_in(votes: &[Vote], user: &str) -> Result<(), ApprovalError> {
    let Some(first) = votes.first() else {
        return Ok(());
    };
    if is_provider_person(&first.user) == is_provider_person(user) {
        return Ok(());
    }
    let (theirs, yours) = if is_provider_person(&first.user) {
        ("people signed in through the provider", "a local user")
    } else {
        ("local users", "signed in through the provider")
    };
    Err(ApprovalError::Refused(format!(
        "the votes so far are by {theirs} and you are {yours}: all votes on one request (and on one decision about its rollout) come from one kind of sign-in, so one person with both cannot count twice"
    )))
}

/// `row` with `vote` added: approved by `who` if that makes enough votes.
fn with_vote(row: &Approval, who: &Actor, vote: Vote) -> Approval {
    let mut next = row.clone();
    next.updated_at = vote.at.clone();
    next.votes.push(vote);
    if next.votes.len() as u32 >= row.required_approvals {
        next.state = State::Approved;
        next.decided_by = Some(who.actor.clone());
    }
    next
}

/// `approval.approved`'s detail for the vote `next` ends with: the count, the state it made,
/// the approver's note, and everything an auditor needs to verify its signature again,
/// offline.
fn approved_detail(row: &Approval, next: &Approval) -> Value {
    let vote = next.votes.last().expect("`next` ends with the new vote");
    let mut detail = json!({
        "votes": next.votes.len() as u32,
        "required": row.required_approvals,
        "state": next.state,
    });
    if let Some(note) = &vote.note {
        detail["note"] = json!(note);
    }
    if let (Some(statement), Some(signature), Some(signed)) =
        (&row.statement, &vote.signature, &vote.signed)
    {
        detail["statement"] = json!(statement);
        detail["signature"] = json!(signature);
        detail["signed"] = json!(signed);
    }
    detail
}

/// Who may decide about a request at all: not its requester, nor the person it was asked for
/// on behalf of, and only with a role the policy lets approve its tool.
pub(super) fn check_voter(row: &Approval, who: &Actor) -> Result<(), ApprovalError> {
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
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::super::testing::{at, row, who};
    use super::*;

    /// A signed vote by `person` with `key`, as the gateway hands it over once verified.
    fn signed_vote(user: &str, person: &str, key: &str) -> Vote {
        Vote {
            user: user.into(),
            at: "2026-11-30T10:05:00.000000Z".into(),
            note: None,
            signature: Some(Signature::Ssh {
                signer: person.into(),
                signature: format!("sig by {key}"),
            }),
            signed: Some(Signed {
                person: person.into(),
                key_id: key.into(),
                alg: "ssh-ed25519".into(),
                statement_sha256: "0".repeat(64),
            }),
        }
    }

    fn plain_vote(user: &str) -> Vote {
        Vote {
            user: user.into(),
            at: "2026-11-30T10:05:00.000000Z".into(),
            ..Default::default()
        }
    }

    #[test]
    fn only_a_pending_unexpired_request_is_open() {
        let now = at("2026-11-30T10:05:00Z");
        assert!(check_open(&row(), now).is_ok());
        let approved = Approval {
            state: State::Approved,
            ..row()
        };
        assert!(matches!(
            check_open(&approved, now),
            Err(ApprovalError::WrongState {
                state: State::Approved,
                wanted: "pending"
            })
        ));
        let err = check_open(&row(), at("2026-11-30T10:15:00Z")).unwrap_err();
        assert!(err.to_string().contains("expired at"), "{err}");
    }

    #[test]
    fn a_denial_needs_a_note_and_decides_alone() {
        let now = at("2026-11-30T10:05:00Z");
        let two = Approval {
            required_approvals: 2,
            ..row()
        };
        let err = deny(&two, &who("alice"), " \n", now).err().unwrap();
        assert!(err.to_string().contains("`note`"), "{err}");
        let change = deny(&two, &who("alice"), "not now", now).unwrap();
        assert_eq!(change.row.state, State::Denied);
        assert_eq!(change.row.note.as_deref(), Some("not now"));
        assert_eq!(change.row.decided_by.as_deref(), Some("approver:alice"));
        assert_eq!(change.row.updated_at, format_at(now));
        let [event] = &change.events[..] else {
            panic!("one event")
        };
        assert_eq!(event.kind, crate::server::audit::kind::APPROVAL_DENIED);
        assert_eq!(event.detail, Some(json!({"note": "not now"})));
    }

    #[test]
    fn a_name_votes_once() {
        let voted = Approval {
            votes: vec![plain_vote("alice")],
            ..row()
        };
        assert!(check_first_vote_of(&voted.votes, "bob").is_ok());
        let err = check_first_vote_of(&voted.votes, "alice").unwrap_err();
        assert!(err.to_string().contains("approved this already"), "{err}");
    }

    #[test]
    fn a_signature_is_given_exactly_when_the_request_has_a_statement() {
        let plain = row();
        let signed_row = Approval {
            statement: Some("the statement".into()),
            ..row()
        };
        let signed = signed_vote("alice", "alice", "SHA256:one");
        let unverified = Vote {
            signed: None,
            ..signed.clone()
        };
        assert!(check_signature_fits(&plain, &plain_vote("alice")).is_ok());
        assert!(check_signature_fits(&signed_row, &signed).is_ok());
        for (name, row, vote, needle) in [
            (
                "unsigned",
                &signed_row,
                &plain_vote("alice"),
                "sign its statement",
            ),
            ("nothing to sign", &plain, &signed, "no statement to sign"),
            ("unverified", &signed_row, &unverified, "not verified"),
        ] {
            let err = check_signature_fits(row, vote).unwrap_err().to_string();
            assert!(err.contains(needle), "{name}: {err}");
        }
    }

    #[test]
    fn a_person_of_the_approvers_file_counts_once() {
        let voted = Approval {
            votes: vec![signed_vote("alice", "alice", "SHA256:one")],
            ..row()
        };
        assert!(check_person_counts_once(&voted.votes, None).is_ok());
        let bob = signed_vote("bob", "bob", "SHA256:two");
        assert!(check_person_counts_once(&voted.votes, bob.signed.as_ref()).is_ok());
        let again = signed_vote("alice-laptop", "alice", "SHA256:three");
        let err = check_person_counts_once(&voted.votes, again.signed.as_ref())
            .unwrap_err()
            .to_string();
        assert!(err.contains("signed this already (as `alice`)"), "{err}");
    }

    #[test]
    fn the_first_vote_sets_the_kind_of_sign_in() {
        assert!(check_one_kind_of_sign_in(&row().votes, "person:alice@corp").is_ok());
        let local = Approval {
            votes: vec![plain_vote("alice")],
            ..row()
        };
        assert!(check_one_kind_of_sign_in(&local.votes, "bob").is_ok());
        let err = check_one_kind_of_sign_in(&local.votes, "person:bob@corp").unwrap_err();
        assert!(err.to_string().contains("by local users"), "{err}");
        let provider = Approval {
            votes: vec![plain_vote("person:alice@corp")],
            ..row()
        };
        assert!(check_one_kind_of_sign_in(&provider.votes, "person:bob@corp").is_ok());
        let err = check_one_kind_of_sign_in(&provider.votes, "bob").unwrap_err();
        assert!(err.to_string().contains("you are a local user"), "{err}");
    }

    #[test]
    fn the_vote_that_makes_enough_approves() {
        let two = Approval {
            required_approvals: 2,
            ..row()
        };
        let once = with_vote(&two, &who("alice"), plain_vote("alice"));
        assert_eq!(once.state, State::Pending);
        assert_eq!(once.decided_by, None);
        assert_eq!(once.updated_at, "2026-11-30T10:05:00.000000Z");
        let twice = with_vote(&once, &who("bob"), plain_vote("bob"));
        assert_eq!(twice.state, State::Approved);
        assert_eq!(twice.decided_by.as_deref(), Some("approver:bob"));
        assert_eq!(twice.votes.len(), 2);
    }

    #[test]
    fn the_approved_event_holds_what_an_auditor_verifies_again() {
        let plain = row();
        let noted = Vote {
            note: Some("looks right".into()),
            ..plain_vote("alice")
        };
        let next = with_vote(&plain, &who("alice"), noted);
        assert_eq!(
            approved_detail(&plain, &next),
            json!({"votes": 1, "required": 1, "state": "approved", "note": "looks right"})
        );
        let signed_row = Approval {
            statement: Some("the statement".into()),
            required_approvals: 2,
            ..row()
        };
        let vote = signed_vote("alice", "alice", "SHA256:one");
        let next = with_vote(&signed_row, &who("alice"), vote.clone());
        assert_eq!(
            approved_detail(&signed_row, &next),
            json!({"votes": 1, "required": 2, "state": "pending",
                   "statement": "the statement",
                   "signature": vote.signature, "signed": vote.signed})
        );
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

    /// One person of the approvers file counts once, whatever the sign-in: a second local
    /// user (say, `alice-laptop`) whose signature verifies as a key of `alice`'s is refused,
    /// where the same signature by another person counts.
    #[test]
    fn one_person_of_the_approvers_file_counts_once_whatever_the_user_name() {
        use crate::protocol::approval::{Signature, Signed};
        let now = at("2026-11-30T10:05:00Z");
        let mut r = row();
        r.on_behalf_of = None;
        r.required_approvals = 2;
        r.statement = Some("the statement".into());
        let vote_of = |person: &str, key: &str| Verdict::Approve {
            note: None,
            signature: Some(Signature::Ssh {
                signer: person.into(),
                signature: format!("sig by {key}"),
            }),
            signed: Some(Signed {
                person: person.into(),
                key_id: key.into(),
                alg: "ssh-ed25519".into(),
                statement_sha256: "0".repeat(64),
            }),
        };
        let once = decide(&r, &who("alice"), &vote_of("alice", "SHA256:one"), now)
            .unwrap()
            .row;
        assert_eq!(once.state, State::Pending);
        // Alice again, under another user name and with her other key.
        let err = decide(
            &once,
            &who("alice-laptop"),
            &vote_of("alice", "SHA256:two"),
            now,
        )
        .err()
        .unwrap()
        .to_string();
        assert!(
            err.contains("`alice` of the approvers file signed this already (as `alice`)")
                && err.contains("one person counts once, whatever the sign-in"),
            "{err}"
        );
        // Bob, a person of his own, completes it.
        let twice = decide(&once, &who("bob"), &vote_of("bob", "SHA256:three"), now).unwrap();
        assert_eq!(twice.row.state, State::Approved);
        assert_eq!(twice.row.votes.len(), 2);
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
