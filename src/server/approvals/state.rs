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
    check_voter(row, who)?;
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
