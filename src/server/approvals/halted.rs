//! A halted rollout's way on, pure: one person proposes a decision (resume, retry or abort,
//! [`propose`]), people vote for it with their signatures over its text ([`vote`]), and the
//! vote that makes it enough carries it out in the same transition: `executing` for a resume
//! or a retry, `aborted` for an abort. No IO, no clock but the `now` it is given.
//!
//! *Invariants:* only a halted request moves here; a decision needs as many people as the
//! request did (an abort, which runs nothing, one), under the same rules as an approval (not
//! the requester, a role that may approve the tool, one vote per person and per signer, one
//! kind of sign-in); a vote counts only for the decision its voter saw (its id), never for one
//! that replaced it; and a decision lets run only runners the halt left unrun, plus, for a
//! retry, the one that failed.

use chrono::{DateTime, Utc};
use serde_json::json;

use super::state::{
    Change, State, Verdict, check_first_vote_of, check_one_kind_of_sign_in,
    check_person_counts_once, check_voter,
};
use super::{Actor, Approval, ApprovalError, RolloutDecision, Vote};
use crate::protocol::approval::statement::hash_text;
use crate::protocol::approval::{Choice, Decision};
use crate::server::audit::{format_at, kind};

/// Where a rollout halted: the wave, the runner whose write or gate failed (none when the
/// wave could not start), and the runners of later waves, never called. Kept in the
/// request's outcome (`result.halt`), which the agent reads too.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Halt {
    pub wave: u32,
    pub runner: Option<String>,
    pub not_run: Vec<String>,
}

/// Where the request's rollout halted, from its stored outcome.
pub(crate) fn halt_of(row: &Approval) -> Option<Halt> {
    let halt = row.result.as_ref()?.get("halt")?.clone();
    serde_json::from_value(halt).ok()
}

/// The runners a decision lets run: the ones the halt left unrun, and for a retry the one
/// whose write or gate failed, first.
pub(crate) fn runners_for(halt: &Halt, choice: Choice) -> Vec<String> {
    let mut runners = match choice {
        Choice::Abort => return Vec::new(),
        Choice::Resume => halt.not_run.clone(),
        Choice::Retry => halt.runner.iter().chain(&halt.not_run).cloned().collect(),
    };
    runners.sort();
    runners.dedup();
    runners
}

/// A person proposes `choice` for a halted request: the decision people will sign, with id
/// `id` (a UUIDv7 made now) and `expires_at`. The same choice proposed while one is pending
/// is that one (the row as it is, no event); another choice replaces it, and its votes with
/// it.
pub fn propose(
    row: &Approval,
    who: &Actor,
    choice: Choice,
    id: String,
    expires_at: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Result<Change, ApprovalError> {
    if row.state != State::Halted {
        return Err(ApprovalError::WrongState {
            state: row.state,
            wanted: "halted",
        });
    }
    check_voter(row, who)?;
    if let Some(pending) = &row.decision
        && !pending.taken
        && pending.choice == choice
        && !expired(pending, now)
    {
        return Ok(Change {
            row: row.clone(),
            events: Vec::new(),
        });
    }
    let halt = halt_of(row).ok_or_else(|| {
        ApprovalError::Refused(
            "the request's stored outcome does not say where its rollout halted; ask again for the runners still to change".into(),
        )
    })?;
    let runners = runners_for(&halt, choice);
    if runners.is_empty() && choice != Choice::Abort {
        return Err(ApprovalError::Refused(format!(
            "`choice`: a {} would run nothing (no runner failed or was left unrun); abort it instead",
            choice.as_str()
        )));
    }
    let decision = Decision {
        id: id.clone(),
        approval_id: row.id.clone(),
        // Where people do not sign, the statement is the empty text: the runners check only
        // the decision's id and runners, under the server's signature.
        statement_sha256: hex::encode(hash_text(row.statement.as_deref().unwrap_or(""))),
        halted_wave: halt.wave,
        choice,
        runners: runners.clone(),
        expires_at: expires_at.format("%Y-%m-%dT%H:%M:%SZ").to_string(),
    };
    let text = decision
        .text()
        .map_err(|e| ApprovalError::Refused(e.to_string()))?;
    let required = match choice {
        Choice::Abort => 1,
        Choice::Resume | Choice::Retry => row.required_approvals,
    };
    let replaces = row
        .decision
        .as_ref()
        .filter(|d| !d.taken)
        .map(|d| d.id.clone());
    let mut next = row.clone();
    next.updated_at = format_at(now);
    next.decision = Some(RolloutDecision {
        id: id.clone(),
        choice,
        runners: runners.clone(),
        text: text.clone(),
        expires_at: decision.expires_at.clone(),
        proposed_by: who.actor.clone(),
        required,
        votes: Vec::new(),
        taken: false,
    });
    let event = row.event(
        &who.actor,
        kind::ROLLOUT_DECISION_PROPOSED,
        json!({"decision_id": id, "choice": choice, "runners": runners, "required": required,
               "halted_wave": halt.wave, "replaces": replaces, "text": text}),
    );
    Ok(Change {
        row: next,
        events: vec![event],
    })
}

/// A person votes for the pending decision `decision_id` (the one they read), with their
/// signature over its text where people sign (`verdict` as the gateway verified it). The vote
/// that makes it enough carries it out: `executing` (the caller runs it) or `aborted`.
pub fn vote(
    row: &Approval,
    who: &Actor,
    decision_id: &str,
    verdict: &Verdict,
    now: DateTime<Utc>,
) -> Result<Change, ApprovalError> {
    if row.state != State::Halted {
        return Err(ApprovalError::WrongState {
            state: row.state,
            wanted: "halted",
        });
    }
    let Verdict::Approve {
        note,
        signature,
        signed,
    } = verdict
    else {
        return Err(ApprovalError::Refused(
            "a rollout decision takes votes for it; to stop the rollout, propose `abort`".into(),
        ));
    };
    let pending = pending_decision(row, decision_id, now)?;
    check_stored(row, pending)?;
    check_voter(row, who)?;
    check_signature_kind(row, signature.is_some(), signed.is_some())?;
    check_first_vote_of(&pending.votes, &who.name)?;
    check_person_counts_once(&pending.votes, signed.as_ref())?;
    check_one_kind_of_sign_in(&pending.votes, &who.name)?;
    let vote = Vote {
        user: who.name.clone(),
        at: format_at(now),
        note: note.clone(),
        signature: signature.clone(),
        signed: signed.clone(),
    };
    Ok(counted(row, pending, vote, &who.actor))
}

/// The decision `decision_id` of a halted request, if it is the one waiting for votes and
/// has not expired; otherwise why not (replaced, unknown, expired).
fn pending_decision<'r>(
    row: &'r Approval,
    decision_id: &str,
    now: DateTime<Utc>,
) -> Result<&'r RolloutDecision, ApprovalError> {
    let pending = match &row.decision {
        Some(d) if d.id == decision_id && !d.taken => d,
        Some(d) if !d.taken => {
            return Err(ApprovalError::Refused(format!(
                "`decision_id`: decision {decision_id} was replaced by decision {} ({}): read it and sign that one",
                d.id,
                d.choice.as_str()
            )));
        }
        _ => {
            return Err(ApprovalError::Refused(format!(
                "`decision_id`: no decision {decision_id} is waiting for votes on this request"
            )));
        }
    };
    if expired(pending, now) {
        return Err(ApprovalError::Refused(format!(
            "decision {decision_id} expired at {}; propose it again",
            pending.expires_at
        )));
    }
    Ok(pending)
}

/// A vote is signed exactly when the request's runners check people's signatures (it has a
/// statement), and a signature counts only as the gateway verified it (`verified`).
fn check_signature_kind(
    row: &Approval,
    signature: bool,
    verified: bool,
) -> Result<(), ApprovalError> {
    let why = match (row.statement.is_some(), signature, verified) {
        (false, false, _) | (true, true, true) => return Ok(()),
        (true, false, _) => {
            "`signature`: this request's runners check people's signatures: sign the decision's text (`emisar approvals resume|retry|abort ID` signs with your SSH key; the portal, with your passkey)"
        }
        (false, true, _) => {
            "`signature`: this request's runners do not check signatures; vote without one"
        }
        (true, true, false) => "`signature`: not verified by the server",
    };
    Err(ApprovalError::Refused(why.into()))
}

/// The request with `vote` counted for `pending`: the vote that makes it enough takes the
/// decision (`executing` for a resume or a retry, `aborted` for an abort), and the event
/// carries what an auditor needs to verify a signature again, offline.
fn counted(row: &Approval, pending: &RolloutDecision, vote: Vote, actor: &str) -> Change {
    let mut decision = pending.clone();
    let note = vote.note.clone();
    let signature = vote.signature.clone().zip(vote.signed.clone());
    let mut next = row.clone();
    next.updated_at = vote.at.clone();
    decision.votes.push(vote);
    let votes = decision.votes.len() as u32;
    if votes >= decision.required {
        decision.taken = true;
        next.state = match decision.choice {
            Choice::Abort => State::Aborted,
            Choice::Resume | Choice::Retry => State::Executing,
        };
        if decision.choice == Choice::Abort {
            next.note = Some(format!(
                "{} (the rollout was aborted by people's decision {}; the runners marked `not_run` never changed)",
                row.note.as_deref().unwrap_or("halted"),
                decision.id
            ));
        }
    }
    let mut detail = json!({"decision_id": decision.id, "choice": decision.choice,
        "votes": votes, "required": decision.required, "state": next.state,
        "runners": decision.runners});
    if let Some(note) = note {
        detail["note"] = json!(note);
    }
    if let Some((signature, signed)) = signature {
        detail["text"] = json!(decision.text);
        detail["signature"] = json!(signature);
        detail["signed"] = json!(signed);
    }
    let event = row.event(actor, kind::ROLLOUT_DECIDED, detail);
    next.decision = Some(decision);
    Change {
        row: next,
        events: vec![event],
    }
}

/// The pending decision as stored is the one [`propose`] would make for the request as it
/// stands: its text names this approval, its statement, the halt's wave, its choice and
/// exactly the runners the halt gives that choice (a store edited between proposal and votes
/// gets no vote counted).
fn check_stored(row: &Approval, pending: &RolloutDecision) -> Result<(), ApprovalError> {
    let changed = |what: &str| {
        ApprovalError::Refused(format!(
            "decision {}: {what} differs from what the request's halt gives (the store was changed): propose it again",
            pending.id
        ))
    };
    let d = Decision::parse(&pending.text).map_err(|e| changed(&e.to_string()))?;
    let halt = halt_of(row).ok_or_else(|| changed("the halt"))?;
    let wanted = runners_for(&halt, pending.choice);
    if d.id != pending.id || d.approval_id != row.id || d.choice != pending.choice {
        return Err(changed("its id, approval or choice"));
    }
    if d.statement_sha256 != hex::encode(hash_text(row.statement.as_deref().unwrap_or(""))) {
        return Err(changed("its statement"));
    }
    if d.runners != wanted || pending.runners != wanted || d.halted_wave != halt.wave {
        return Err(changed("`runners`"));
    }
    let required = match pending.choice {
        Choice::Abort => 1,
        Choice::Resume | Choice::Retry => row.required_approvals,
    };
    if pending.required != required {
        return Err(changed("the count of people it needs"));
    }
    Ok(())
}

fn expired(d: &RolloutDecision, now: DateTime<Utc>) -> bool {
    DateTime::parse_from_rfc3339(&d.expires_at).map_or(true, |t| t.with_timezone(&Utc) <= now)
}

#[cfg(test)]
mod tests {
    use super::super::testing::{at, row, who};
    use super::*;

    fn halted() -> Approval {
        Approval {
            state: State::Halted,
            runners: ["e1", "e2", "e3", "e4"].map(String::from).to_vec(),
            required_approvals: 2,
            result: Some(
                json!({"results": [], "halt": {"wave": 2, "runner": "e2", "not_run": ["e4", "e3"]}}),
            ),
            note: Some("wave 2 of 3: runner `e2`: its health gate failed".into()),
            ..row()
        }
    }

    const ID: &str = "0193f4d0-0000-7000-8000-000000000001";

    fn proposed(choice: Choice) -> Approval {
        let now = at("2026-11-30T10:20:00Z");
        propose(
            &halted(),
            &who("alice"),
            choice,
            ID.into(),
            at("2026-11-30T10:40:00Z"),
            now,
        )
        .unwrap()
        .row
    }

    #[test]
    fn a_decision_lets_run_only_what_the_halt_left_and_for_a_retry_the_failed_runner() {
        let h = halt_of(&halted()).unwrap();
        assert_eq!(runners_for(&h, Choice::Resume), ["e3", "e4"]);
        assert_eq!(runners_for(&h, Choice::Retry), ["e2", "e3", "e4"]);
        assert!(runners_for(&h, Choice::Abort).is_empty());
        let row = proposed(Choice::Retry);
        let d = row.decision.as_ref().unwrap();
        assert_eq!(d.required, 2, "a retry needs the request's count");
        let parsed = Decision::parse(&d.text).unwrap();
        assert_eq!(parsed.halted_wave, 2);
        assert_eq!(parsed.runners, ["e2", "e3", "e4"]);
        assert_eq!(parsed.expires_at, "2026-11-30T10:40:00Z");
        assert_eq!(proposed(Choice::Abort).decision.unwrap().required, 1);
        // Nothing left to resume: refused, and says what to do.
        let nothing = Approval {
            result: Some(
                json!({"results": [], "halt": {"wave": 3, "runner": null, "not_run": []}}),
            ),
            ..halted()
        };
        let now = at("2026-11-30T10:20:00Z");
        let e = propose(&nothing, &who("alice"), Choice::Resume, ID.into(), now, now);
        assert!(matches!(e, Err(ApprovalError::Refused(m)) if m.contains("abort")));
    }

    #[test]
    fn only_a_halted_request_takes_decisions_and_not_from_its_requester() {
        let now = at("2026-11-30T10:20:00Z");
        for state in State::ALL.into_iter().filter(|s| *s != State::Halted) {
            let r = Approval { state, ..halted() };
            assert!(
                matches!(
                    propose(&r, &who("alice"), Choice::Resume, ID.into(), now, now),
                    Err(ApprovalError::WrongState { .. })
                ),
                "{state:?}"
            );
        }
        let requester = Actor {
            name: halted().requester_name,
            ..who("x")
        };
        assert!(propose(&halted(), &requester, Choice::Resume, ID.into(), now, now).is_err());
        let no_role = Actor {
            may_approve: false,
            ..who("carol")
        };
        assert!(propose(&halted(), &no_role, Choice::Abort, ID.into(), now, now).is_err());
    }

    #[test]
    fn enough_votes_carry_it_out_and_a_replaced_decision_takes_none() {
        let now = at("2026-11-30T10:21:00Z");
        let row = proposed(Choice::Resume);
        let one = vote(&row, &who("alice"), ID, &Verdict::approve(), now).unwrap();
        assert_eq!(one.row.state, State::Halted, "one of two");
        assert_eq!(one.events[0].kind, kind::ROLLOUT_DECIDED);
        let again = vote(&one.row, &who("alice"), ID, &Verdict::approve(), now);
        assert!(matches!(again, Err(ApprovalError::Refused(m)) if m.contains("already")));
        let two = vote(&one.row, &who("bob"), ID, &Verdict::approve(), now).unwrap();
        assert_eq!(two.row.state, State::Executing);
        assert!(two.row.decision.as_ref().unwrap().taken);
        // Taken: no more votes.
        assert!(vote(&two.row, &who("carol"), ID, &Verdict::approve(), now).is_err());
        // An abort by one person ends it.
        let abort = proposed(Choice::Abort);
        let done = vote(&abort, &who("bob"), ID, &Verdict::approve(), now).unwrap();
        assert_eq!(done.row.state, State::Aborted);
        assert!(done.row.note.unwrap().contains("aborted"));
        // Another choice replaces the pending one: a vote for the old id counts for nothing.
        let replaced = propose(
            &one.row,
            &who("bob"),
            Choice::Abort,
            "0193f4d0-0000-7000-8000-000000000002".into(),
            at("2026-11-30T10:40:00Z"),
            now,
        )
        .unwrap();
        assert_eq!(
            replaced.events[0].detail.as_ref().unwrap()["replaces"],
            json!(ID)
        );
        let stale = vote(&replaced.row, &who("bob"), ID, &Verdict::approve(), now);
        assert!(matches!(stale, Err(ApprovalError::Refused(m)) if m.contains("replaced")));
        // The same choice proposed again is the pending one, votes and all.
        let same = propose(
            &one.row,
            &who("bob"),
            Choice::Resume,
            "other".into(),
            at("2026-11-30T10:40:00Z"),
            now,
        )
        .unwrap();
        assert!(same.events.is_empty());
        assert_eq!(same.row.decision, one.row.decision);
        // Expired: refused.
        let late = vote(
            &row,
            &who("alice"),
            ID,
            &Verdict::approve(),
            at("2026-11-30T10:40:00Z"),
        );
        assert!(matches!(late, Err(ApprovalError::Refused(m)) if m.contains("expired")));
    }

    #[test]
    fn a_decision_changed_in_the_store_takes_no_vote() {
        let now = at("2026-11-30T10:21:00Z");
        let row = proposed(Choice::Retry);
        // The retry's runners without the failed one: a resume under a retry's name.
        let mut edited = row.clone();
        let d = edited.decision.as_mut().unwrap();
        d.text = d.text.replace("runners e2,e3,e4", "runners e3,e4");
        d.runners = vec!["e3".into(), "e4".into()];
        let e = vote(&edited, &who("bob"), ID, &Verdict::approve(), now);
        assert!(matches!(e, Err(ApprovalError::Refused(m)) if m.contains("`runners`")));
        // The halt edited under it.
        let mut edited = row.clone();
        edited.result = Some(
            json!({"results": [], "halt": {"wave": 2, "runner": "e1", "not_run": ["e4", "e3"]}}),
        );
        assert!(vote(&edited, &who("bob"), ID, &Verdict::approve(), now).is_err());
        // Its count of people lowered (red team: a retry carried out on one vote).
        let mut edited = row.clone();
        edited.decision.as_mut().unwrap().required = 1;
        let e = vote(&edited, &who("bob"), ID, &Verdict::approve(), now);
        assert!(matches!(e, Err(ApprovalError::Refused(m)) if m.contains("count of people")));
        // Untouched, it takes the vote.
        assert!(vote(&row, &who("bob"), ID, &Verdict::approve(), now).is_ok());
    }

    #[test]
    fn where_people_sign_a_vote_needs_a_verified_signature() {
        let now = at("2026-11-30T10:21:00Z");
        let signed = Approval {
            statement: Some("the statement\n".into()),
            ..halted()
        };
        let row = propose(
            &signed,
            &who("alice"),
            Choice::Resume,
            ID.into(),
            at("2026-11-30T10:40:00Z"),
            now,
        )
        .unwrap()
        .row;
        let e = vote(&row, &who("alice"), ID, &Verdict::approve(), now);
        assert!(matches!(e, Err(ApprovalError::Refused(m)) if m.contains("`signature`")));
        let deny = Verdict::Deny { note: "no".into() };
        assert!(vote(&row, &who("alice"), ID, &deny, now).is_err());
    }

    /// A vote is signed exactly where the request's runners check signatures, and only a
    /// signature the gateway verified counts.
    #[test]
    fn a_vote_is_signed_exactly_where_the_runners_check_signatures() {
        let unsigned = halted();
        let signed = Approval {
            statement: Some("the statement\n".into()),
            ..halted()
        };
        assert!(check_signature_kind(&unsigned, false, false).is_ok());
        assert!(check_signature_kind(&signed, true, true).is_ok());
        for (row, signature, verified, says) in [
            (&signed, false, false, "check people's signatures"),
            (&unsigned, true, true, "do not check signatures"),
            (&signed, true, false, "not verified by the server"),
        ] {
            let e = check_signature_kind(row, signature, verified).unwrap_err();
            assert!(
                matches!(&e, ApprovalError::Refused(m) if m.contains(says)),
                "{e:?}"
            );
        }
    }

    /// A decision's votes come from one kind of sign-in, as an approval's do: one human with
    /// a local user and a provider identity cannot count twice toward a resume.
    #[test]
    fn a_decisions_votes_come_from_one_kind_of_sign_in() {
        let now = at("2026-11-30T10:21:00Z");
        let row = proposed(Choice::Resume);
        let local = vote(&row, &who("bob"), ID, &Verdict::approve(), now).unwrap();
        let twice = vote(
            &local.row,
            &who("person:bob@corp"),
            ID,
            &Verdict::approve(),
            now,
        );
        let Err(ApprovalError::Refused(why)) = twice else {
            panic!("a second kind of sign-in was counted");
        };
        assert!(why.contains("one kind of sign-in"), "{why}");
        let other = vote(&local.row, &who("carol"), ID, &Verdict::approve(), now).unwrap();
        assert_eq!(other.row.state, State::Executing);
    }
}
