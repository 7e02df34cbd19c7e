//! People sign the review of a closed break-glass window (issue 47): the first signer proposes
//! the review's text with a note, the others sign that text, and once enough people did, the
//! server verifies the whole quorum again, writes `break_glass.reviewed` to the audit log, and
//! marks the row. The `break_glass_reviews` table holds a review while it is signed; the log
//! is what makes a window reviewed ([`super::ledger`]).
//!
//! *Invariants:* a review is only of a window the audit log shows (its grant text from its
//! `grant.requested` event, never from the grants table), closed (revoked or expired) and not
//! reviewed yet; every signature's text passes [`review::check_unsigned`] (the window's id and
//! text, a visible note, proposed no earlier than the window closed and not in the future)
//! before anything is stored, so a first signer cannot store a proposal that can never count;
//! each signature is verified against the server's approvers file before it is stored, each
//! person counts once; and the event (the review's text, every signature, and the window's
//! grant text, so the review still verifies once retention cut the window's request) is written only
//! after [`review::check`] holds over every stored signature, so a row edited in the database
//! makes nothing reviewed, and the listing checks the event again ([`super::ledger`]).
//!
//! *Replacing a proposal:* a proposal that has not reached its quorum blocks other texts for
//! [`PROPOSAL_HOLD_SECS`] after it was proposed. After that, or at once if its text no longer
//! passes [`review::check_unsigned`] (a row stored before that check, or edited), anyone who may
//! sign proposes another text in its place, and the signatures of the old one are dropped. So
//! one person's proposal blocks the others for an hour at most: they then propose their own,
//! which that person cannot displace for the next hour.

use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::Row;

use super::ledger::{self, State, Window};
use crate::protocol::approval::review::{self, Review, ReviewProof};
use crate::protocol::approval::{Approvers, Signature, Signed, verify_signature};
use crate::server::audit::{self, AuditError, AuditFilter, AuditLog, NewEvent, kind};
use crate::server::db::Db;
use crate::with_pool;

/// How long a proposal that has not reached its quorum holds the window against another text,
/// from when it was proposed (one hour).
pub const PROPOSAL_HOLD_SECS: i64 = 3600;

/// One person's signature of a review, as the row keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReviewVote {
    /// The signed-in user who sent it.
    pub user: String,
    pub signature: Signature,
    /// Who of the approvers file it verified as.
    pub signed: Signed,
}

/// A review being signed, or signed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReviewRow {
    pub window_id: String,
    pub text: String,
    pub votes: Vec<ReviewVote>,
    /// `signing` or `reviewed`.
    pub status: String,
    pub proposed_by: String,
    pub proposed_at: String,
    pub reviewed_at: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error("no break-glass window {0} in the audit log")]
    NotFound(String),
    /// The request broke a rule: the message names the field.
    #[error("{0}")]
    Refused(String),
    /// The window is not in a state that allows it (open, or reviewed already).
    #[error("{0}")]
    Conflict(String),
    #[error(transparent)]
    Store(#[from] sqlx::Error),
    #[error(transparent)]
    Audit(#[from] AuditError),
}

/// Who signs: the signed-in user's name and audit actor.
pub struct Signer<'a> {
    pub user: &'a str,
    pub actor: &'a str,
}

/// The break-glass windows of the log and their reviews.
#[derive(Clone)]
pub struct Reviews {
    db: Db,
    audit: AuditLog,
    /// The server's approvers file: reviews are signed by its people and checked against it
    /// (None: no review is signed, and none in the log counts).
    approvers: Option<Approvers>,
}

impl Reviews {
    pub fn new(db: Db, audit: AuditLog, approvers: Option<Approvers>) -> Reviews {
        Reviews {
            db,
            audit,
            approvers,
        }
    }

    /// Every break-glass window the audit log shows ([`windows_in_log`]), its reviews checked
    /// against the server's approvers file.
    pub async fn windows(&self, now: u64) -> Result<Vec<Window>, sqlx::Error> {
        windows_in_log(&self.db, now, self.approvers.as_ref()).await
    }

    /// The window `id` as the log shows it.
    pub async fn window(&self, id: &str, now: u64) -> Result<Window, ReviewError> {
        self.windows(now)
            .await?
            .into_iter()
            .find(|w| w.id == id)
            .ok_or_else(|| ReviewError::NotFound(id.to_owned()))
    }

    /// The review of window `id` being signed or signed, if any.
    pub async fn row(&self, id: &str) -> Result<Option<ReviewRow>, sqlx::Error> {
        let sql = "SELECT window_id, text, signatures, status, proposed_by, proposed_at, reviewed_at FROM break_glass_reviews WHERE window_id = $1";
        self.db
            .guard(async {
                with_pool!(self.db, pool => {
                    let Some(r) = sqlx::query(sql).bind(id).fetch_optional(pool).await? else {
                        return Ok(None);
                    };
                    let votes: String = r.try_get("signatures")?;
                    Ok(Some(ReviewRow {
                        window_id: r.try_get("window_id")?,
                        text: r.try_get("text")?,
                        votes: serde_json::from_str(&votes)
                            .map_err(|e| sqlx::Error::Decode(Box::new(e)))?,
                        status: r.try_get("status")?,
                        proposed_by: r.try_get("proposed_by")?,
                        proposed_at: r.try_get("proposed_at")?,
                        reviewed_at: r.try_get("reviewed_at")?,
                    }))
                })
            })
            .await
    }

    /// The text people sign to review window `id` with `note`, proposed at `now`: for a signer
    /// to show and sign before [`Reviews::sign`]. The review being signed already, if there
    /// is one, whatever `note` says.
    pub async fn text_to_sign(
        &self,
        id: &str,
        note: Option<&str>,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<String, ReviewError> {
        let window = self.reviewable(id, now).await?;
        if let Some(row) = self.row(id).await? {
            return Ok(row.text);
        }
        let note = note.unwrap_or_default();
        let at = now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        Review::of(&window.text, note, &at)
            .and_then(|r| r.text())
            .map_err(|e| ReviewError::Refused(e.to_string()))
    }

    /// The window `id`, if people may review it now: in the log, closed, not reviewed.
    async fn reviewable(
        &self,
        id: &str,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<Window, ReviewError> {
        let window = self.window(id, now.timestamp().max(0) as u64).await?;
        if window.text.is_empty() {
            return Err(ReviewError::Conflict(format!(
                "`window`: {id}: {}",
                ledger::CUT
            )));
        }
        match window.state {
            State::ClosedUnreviewed => Ok(window),
            State::Reviewed => Err(ReviewError::Conflict(format!(
                "`window`: {id} is reviewed already"
            ))),
            State::Open | State::Requested => Err(ReviewError::Conflict(format!(
                "`window`: {id} is still {} until {}: revoke it or wait for its expiry, then review what was done inside it",
                window.state.as_str(),
                window.expires_at
            ))),
        }
    }

    /// `signer` signs the review `text` of window `id`, as [`Reviews::text_to_sign`] gave it:
    /// the text checked whole but for its signatures, the signature verified against the
    /// server's approvers file, stored, and once enough people signed, `break_glass.reviewed`
    /// is written to the log. A different text replaces a proposal as the module says.
    /// Returns the row.
    pub async fn sign(
        &self,
        signer: &Signer<'_>,
        id: &str,
        text: &str,
        signature: Signature,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<ReviewRow, ReviewError> {
        let Some(approvers) = self.approvers.as_ref() else {
            return Err(ReviewError::Conflict(
                "the server has no approvers_file: a break-glass review is signed by its people"
                    .into(),
            ));
        };
        let (actor, user) = (signer.actor, signer.user);
        let window = self.reviewable(id, now).await?;
        let refused = |m: String| ReviewError::Refused(m);
        let now_secs = now.timestamp().max(0) as u64;
        let closed = window.closed_unix(now_secs).unwrap_or(now_secs);
        review::check_unsigned(&window.text, text, now_secs, closed)
            .map_err(|e| refused(format!("`text`: {e}")))?;
        let proposal = || ReviewRow {
            window_id: id.to_owned(),
            text: text.to_owned(),
            votes: Vec::new(),
            status: "signing".into(),
            proposed_by: actor.to_owned(),
            proposed_at: audit::format_at(now),
            reviewed_at: None,
        };
        let mut row = match self.row(id).await? {
            Some(row) if row.text != text => {
                let holds = review::check_unsigned(&window.text, &row.text, now_secs, closed)
                    .is_ok()
                    && row.status == "signing"
                    && proposed_secs(&row)
                        .is_some_and(|at| now.timestamp() < at + PROPOSAL_HOLD_SECS);
                if holds {
                    return Err(refused(format!(
                        "`text`: window {id} is being reviewed with another text (note {:?}, proposed by {} at {}): sign that one, or propose yours once it has waited {PROPOSAL_HOLD_SECS} s without enough signatures",
                        Review::parse(&row.text).map(|r| r.note).unwrap_or_default(),
                        row.proposed_by,
                        row.proposed_at,
                    )));
                }
                proposal()
            }
            Some(row) => row,
            None => proposal(),
        };
        let signed = verify_signature(approvers, text, &signature)
            .map_err(|e| refused(format!("`signature`: {e}")))?;
        if row.votes.iter().any(|v| v.signed.person == signed.person) {
            return Err(refused(format!(
                "`signature`: {} of the approvers file signed this review already: each person counts once",
                signed.person
            )));
        }
        row.votes.push(ReviewVote {
            user: user.to_owned(),
            signature,
            signed,
        });
        let proof = ReviewProof {
            text: text.to_owned(),
            signatures: row.votes.iter().map(|v| v.signature.clone()).collect(),
        };
        let needed = people_needed(approvers, &window);
        if (row.votes.len() as u32) < needed {
            self.store(&row).await?;
            return Ok(row);
        }
        let (review, signed) =
            review::check(approvers, &window.text, &proof, now_secs, closed).map_err(refused)?;
        let signed_by: Vec<&str> = signed.iter().map(|s| s.person.as_str()).collect();
        self.audit
            .append(NewEvent {
                actor: actor.to_owned(),
                kind: kind::BREAK_GLASS_REVIEWED.into(),
                outcome: Some("ok".into()),
                detail: Some(json!({
                    "grant": window.id,
                    "window": window.text,
                    "text": text,
                    "note": review.note,
                    "signed_by": signed_by,
                    "signatures": proof.signatures,
                    "calls": window.calls.len(),
                })),
                ..Default::default()
            })
            .await?;
        row.status = "reviewed".into();
        row.reviewed_at = Some(audit::format_at(now));
        self.store(&row).await?;
        Ok(row)
    }

    /// Writes `row` (inserted the first time, its signatures and status after).
    async fn store(&self, row: &ReviewRow) -> Result<(), sqlx::Error> {
        let votes = serde_json::to_string(&row.votes).expect("votes are JSON");
        let sql = "INSERT INTO break_glass_reviews (window_id, text, signatures, status, proposed_by, proposed_at, reviewed_at) VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (window_id) DO UPDATE SET text = excluded.text, signatures = excluded.signatures, status = excluded.status, proposed_by = excluded.proposed_by, proposed_at = excluded.proposed_at, reviewed_at = excluded.reviewed_at";
        self.db
            .guard(async {
                with_pool!(self.db, pool => {
                    sqlx::query(sql)
                        .bind(&row.window_id)
                        .bind(&row.text)
                        .bind(&votes)
                        .bind(&row.status)
                        .bind(&row.proposed_by)
                        .bind(&row.proposed_at)
                        .bind(&row.reviewed_at)
                        .execute(pool)
                        .await
                        .map(drop)
                })
            })
            .await
    }
}

/// When `row` was proposed, in seconds since the epoch.
fn proposed_secs(row: &ReviewRow) -> Option<i64> {
    chrono::DateTime::parse_from_rfc3339(&row.proposed_at)
        .ok()
        .map(|t| t.timestamp())
}

/// Every break-glass window the audit log in `db` shows, oldest first, in its state at `now`
/// (seconds since the epoch): read from its events alone, a review event counting only when it
/// verifies against `approvers` ([`ledger::windows`]).
pub async fn windows_in_log(
    db: &Db,
    now: u64,
    approvers: Option<&Approvers>,
) -> Result<Vec<Window>, sqlx::Error> {
    let mut events = Vec::new();
    for kind in ledger::events::ALL {
        let mut after_seq = None;
        loop {
            let filter = AuditFilter {
                kind: Some((*kind).into()),
                after_seq,
                limit: audit::MAX_PAGE,
                ..Default::default()
            };
            let page = db.guard(audit::query(db, &filter)).await?;
            let full = page.len() as i64 == audit::MAX_PAGE;
            after_seq = page.last().map(|e| e.seq);
            events.extend(page);
            if !full {
                break;
            }
        }
    }
    Ok(ledger::windows(&events, now, approvers))
}

/// How many people a review of `window` needs: the approvers file's rule for
/// [`review::REVIEW_TOOL`] and the window's own `required`, whichever is more.
pub fn people_needed(approvers: &Approvers, window: &Window) -> u32 {
    let rule = approvers
        .rule(review::REVIEW_TOOL)
        .map_or(0, |r| r.approvals);
    rule.max(window.required)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::protocol::approval::approvers::tests::file_with;
    use crate::protocol::approval::grant::{Grant, Runners};
    use crate::protocol::approval::sshsig::{self, tests::sign, tests::test_key};
    use crate::protocol::approval::tests::id_at;

    async fn sqlite() -> (tempfile::TempDir, Db, Reviews) {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("emisar.db").display());
        let (db, _) = Db::connect_and_migrate(&url).await.unwrap();
        let reviews = Reviews::new(db.clone(), AuditLog::start(db.clone()), Some(people()));
        (dir, db, reviews)
    }

    fn people() -> Approvers {
        Approvers::parse(&file_with(
            &[("alice", 1), ("bob", 2)],
            "[[rule]]\ntools = \"*\"\napprovals = 1\nbreak_glass = true\n",
        ))
        .unwrap()
    }

    /// A window asked for `ago` seconds before `now` that lives `ttl` seconds, with its
    /// `grant.requested` and `grant.active` in the log.
    async fn window(reviews: &Reviews, now: i64, ago: i64, ttl: i64) -> Grant {
        let opened = (now - ago) as u64;
        let expires = chrono::DateTime::from_timestamp(now - ago + ttl, 0).unwrap();
        let g = Grant {
            id: id_at(opened),
            agent: "agent:ops-bot".into(),
            break_glass: true,
            tools: vec!["*".into()],
            runners: Runners::Names(vec!["edge-1".into()]),
            args: BTreeMap::new(),
            max_calls: 100,
            max_calls_per_runner: 100,
            required: 2,
            reason: "INC-9".into(),
            expires_at: expires.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        };
        let text = g.text().unwrap();
        let event = |kind: &str, detail: serde_json::Value| NewEvent {
            actor: "approver:alice".into(),
            kind: kind.into(),
            outcome: Some("ok".into()),
            detail: Some(detail),
            ..Default::default()
        };
        reviews
            .audit
            .append_all(vec![
                event(
                    ledger::events::GRANT_REQUESTED,
                    json!({"grant": g.id, "text": text}),
                ),
                event(ledger::events::GRANT_ACTIVE, json!({"grant": g.id})),
            ])
            .await
            .unwrap();
        g
    }

    fn ssh(seed: u8, text: &str) -> Signature {
        Signature::Ssh {
            signer: format!("p{seed}"),
            signature: sign(&test_key(seed), sshsig::APPROVAL_NAMESPACE, text.as_bytes()),
        }
    }

    fn state(windows: &[Window], id: &str) -> State {
        windows.iter().find(|w| w.id == id).unwrap().state
    }

    /// A closed window is unreviewed until two people sign a review with a note; one person,
    /// twice, is one; an open window is not reviewed; the rows of the table decide nothing.
    #[tokio::test]
    async fn a_window_is_reviewed_only_once_enough_people_signed_a_note_in_the_log() {
        let (_dir, db, reviews) = sqlite().await;
        let now = chrono::Utc::now();
        let t = now.timestamp();
        let closed = window(&reviews, t, 7200, 3600).await;
        let open = window(&reviews, t, 60, 3600).await;
        let secs = t as u64;
        let listed = reviews.windows(secs).await.unwrap();
        assert_eq!(state(&listed, &closed.id), State::ClosedUnreviewed);
        assert_eq!(state(&listed, &open.id), State::Open);
        // No note: refused, naming `note`.
        for note in [None, Some(""), Some("  ")] {
            let e = reviews
                .text_to_sign(&closed.id, note, now)
                .await
                .unwrap_err();
            assert!(e.to_string().contains("`note` is required"), "{e}");
        }
        // An open window is not reviewed yet.
        let e = reviews
            .text_to_sign(&open.id, Some("x"), now)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("is still open"), "{e}");
        let text = reviews
            .text_to_sign(&closed.id, Some("restarted consul"), now)
            .await
            .unwrap();
        let alice = Signer {
            user: "alice",
            actor: "approver:alice",
        };
        let bob = Signer {
            user: "bob",
            actor: "approver:bob",
        };
        let row = reviews
            .sign(&alice, &closed.id, &text, ssh(1, &text), now)
            .await
            .unwrap();
        assert_eq!(row.status, "signing");
        let e = reviews
            .sign(&alice, &closed.id, &text, ssh(1, &text), now)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("each person counts once"), "{e}");
        // A row set to `reviewed` in the database makes nothing reviewed.
        with_pool!(db, pool => {
            sqlx::query("UPDATE break_glass_reviews SET status = 'reviewed'")
                .execute(pool)
                .await
                .map(drop)
        })
        .unwrap();
        assert_eq!(
            state(&reviews.windows(secs).await.unwrap(), &closed.id),
            State::ClosedUnreviewed
        );
        // The second signer gets the text being signed, whatever note they give.
        let same = reviews
            .text_to_sign(&closed.id, Some("another"), now)
            .await
            .unwrap();
        assert_eq!(same, text);
        let row = reviews
            .sign(&bob, &closed.id, &text, ssh(2, &text), now)
            .await
            .unwrap();
        assert_eq!(row.status, "reviewed");
        let listed = reviews.windows(secs).await.unwrap();
        let w = listed.iter().find(|w| w.id == closed.id).unwrap();
        assert_eq!(w.state, State::Reviewed);
        let r = w.review.as_ref().unwrap();
        assert_eq!(r.signed_by, ["alice", "bob"]);
        assert_eq!(r.note, "restarted consul");
        // Deleting the rows leaves the review in the log.
        with_pool!(db, pool => {
            sqlx::query("DELETE FROM break_glass_reviews")
                .execute(pool)
                .await
                .map(drop)
        })
        .unwrap();
        assert_eq!(
            state(&reviews.windows(secs).await.unwrap(), &closed.id),
            State::Reviewed
        );
        let e = reviews
            .text_to_sign(&closed.id, Some("again"), now)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("reviewed already"), "{e}");
    }

    /// A vote added to the table by hand (a database writer's) is not a person's: the quorum
    /// is checked again over every stored signature, and the window stays unreviewed.
    #[tokio::test]
    async fn a_vote_forged_in_the_table_reviews_nothing() {
        let (_dir, db, reviews) = sqlite().await;
        let now = chrono::Utc::now();
        let closed = window(&reviews, now.timestamp(), 7200, 3600).await;
        let text = reviews
            .text_to_sign(&closed.id, Some("all fine"), now)
            .await
            .unwrap();
        let alice = Signer {
            user: "alice",
            actor: "approver:alice",
        };
        let row = reviews
            .sign(&alice, &closed.id, &text, ssh(1, &text), now)
            .await
            .unwrap();
        // The writer copies alice's vote and calls it carol's.
        let mut forged = row.votes[0].clone();
        forged.signed.person = "carol".into();
        let votes = serde_json::to_string(&[row.votes[0].clone(), forged]).unwrap();
        with_pool!(db, pool => {
            sqlx::query("UPDATE break_glass_reviews SET signatures = $1")
                .bind(&votes)
                .execute(pool)
                .await
                .map(drop)
        })
        .unwrap();
        let bob = Signer {
            user: "bob",
            actor: "approver:bob",
        };
        let e = reviews
            .sign(&bob, &closed.id, &text, ssh(2, &text), now)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("count once"), "{e}");
        assert_eq!(
            state(
                &reviews.windows(now.timestamp() as u64).await.unwrap(),
                &closed.id
            ),
            State::ClosedUnreviewed
        );
    }

    /// One approver cannot wedge a review: a proposal that can never count (dated before the
    /// window was asked for, or before it closed) is refused before it is stored, and a
    /// proposal that has not reached its quorum gives way to another text after
    /// [`PROPOSAL_HOLD_SECS`], or at once when its own text no longer holds.
    #[tokio::test]
    async fn one_approver_cannot_wedge_a_review() {
        let (_dir, db, reviews) = sqlite().await;
        let now = chrono::Utc::now();
        let t = now.timestamp();
        // Asked for two hours ago, lived an hour: closed an hour ago.
        let closed = window(&reviews, t, 7200, 3600).await;
        let text = reviews
            .text_to_sign(&closed.id, Some("restarted consul"), now)
            .await
            .unwrap();
        let at = |secs: i64| {
            chrono::DateTime::from_timestamp(secs, 0)
                .unwrap()
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        };
        let now_at = at(t);
        let alice = Signer {
            user: "alice",
            actor: "approver:alice",
        };
        let bob = Signer {
            user: "bob",
            actor: "approver:bob",
        };
        // Backdated before the request, or signed while the window was open: refused at the
        // first signature, naming `reviewed`, and nothing is stored.
        for (when, says) in [
            (at(t - 7300), "before the window was asked for"),
            (at(t - 3700), "before the window closed"),
        ] {
            let bad = text.replace(&now_at, &when);
            assert_ne!(bad, text);
            let e = reviews
                .sign(&alice, &closed.id, &bad, ssh(1, &bad), now)
                .await
                .unwrap_err()
                .to_string();
            assert!(e.contains("`reviewed`") && e.contains(says), "{e}");
            assert!(reviews.row(&closed.id).await.unwrap().is_none());
        }
        // Alice proposes; bob's other text waits for the hold to pass.
        reviews
            .sign(&alice, &closed.id, &text, ssh(1, &text), now)
            .await
            .unwrap();
        let other = reviews.text_to_sign(&closed.id, None, now).await.unwrap();
        assert_eq!(other, text, "the proposal is what others are given to sign");
        let mine = text.replace("restarted consul", "restarted consul and nomad");
        let e = reviews
            .sign(&bob, &closed.id, &mine, ssh(2, &mine), now)
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("is being reviewed with another text"), "{e}");
        let later = now + chrono::Duration::seconds(PROPOSAL_HOLD_SECS + 1);
        let row = reviews
            .sign(&bob, &closed.id, &mine, ssh(2, &mine), later)
            .await
            .unwrap();
        assert_eq!(row.text, mine);
        assert_eq!(row.proposed_by, "approver:bob");
        assert_eq!(row.votes.len(), 1);
        assert_eq!(reviews.row(&closed.id).await.unwrap().unwrap().text, mine);
        // Alice cannot displace bob's proposal within its hour; she can sign it.
        let e = reviews
            .sign(&alice, &closed.id, &text, ssh(1, &text), later)
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("another text"), "{e}");
        // A proposal stored before its text was checked (here, written by hand) that can never
        // count gives way at once.
        let wedged = text.replace(&now_at, &at(t - 7300));
        with_pool!(db, pool => {
            sqlx::query("UPDATE break_glass_reviews SET text = $1")
                .bind(&wedged)
                .execute(pool)
                .await
                .map(drop)
        })
        .unwrap();
        let row = reviews
            .sign(&alice, &closed.id, &text, ssh(1, &text), later)
            .await
            .unwrap();
        assert_eq!(row.text, text);
        let row = reviews
            .sign(&bob, &closed.id, &text, ssh(2, &text), later)
            .await
            .unwrap();
        assert_eq!(row.status, "reviewed");
        assert_eq!(
            state(
                &reviews.windows(later.timestamp() as u64).await.unwrap(),
                &closed.id
            ),
            State::Reviewed
        );
    }
}
