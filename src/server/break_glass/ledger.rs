//! Break-glass windows as the audit log tells them (issue 47): which windows were opened, by
//! whom, which calls ran inside each, and whether people signed a review afterwards. The
//! portal and `emisar audit break-glass` list windows from here.
//!
//! A window is a grant whose text says `break_glass true` (`protocol/approval/grant.rs`). Its
//! life is in the log: `grant.requested` (with the text people sign), `grant.signed`,
//! `grant.active`, `grant.used` (one per call, naming the call), `grant.revoked` or
//! `grant.expired`, and at last `break_glass.reviewed` (the signed review,
//! `protocol/approval/review.rs`).
//!
//! *Invariant:* a window's state is read from the log alone, never from the grants or
//! reviews tables: a window whose rows were deleted from the store still shows, unreviewed,
//! from its events; and a `break_glass.reviewed` event counts only when its review text and
//! signatures pass [`review::check`] against the approvers file, for this window's own grant
//! text (its id and SHA-256) and its close: a review of another window, of an edited text,
//! signed before the window closed, or carrying signatures that do not verify (an event a
//! database writer appended with valid chain hashes) leaves the window unreviewed, with the
//! reason in [`Window::review_refused`]. With no approvers file to check against, no review
//! counts.
//!
//! *Retention:* a window whose `grant.requested` is no longer in the log (the operator cut the
//! log's oldest events, "Retention of the audit log") is still listed while any of its
//! flagged calls (`grant.used` with `break_glass: true`) or its review is kept: from the grant
//! text its `break_glass.reviewed` event carries (`window`), or, with none, as a window known
//! only by its calls, closed and unreviewed, whose [`Window::review_refused`] says why. So no
//! cut hides a flagged call that nobody reviewed.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::protocol::approval::Approvers;
use crate::protocol::approval::grant::{Grant, Runners};
use crate::protocol::approval::review::{self, ReviewProof};
use crate::protocol::approval::statement::parse_utc;
use crate::protocol::audit_event::Event;

/// The audit event kinds a window's life is read from.
pub mod events {
    use crate::server::audit::kind;

    pub const GRANT_REQUESTED: &str = kind::GRANT_REQUESTED;
    pub const GRANT_SIGNED: &str = kind::GRANT_SIGNED;
    pub const GRANT_ACTIVE: &str = kind::GRANT_ACTIVE;
    pub const GRANT_USED: &str = kind::GRANT_USED;
    pub const GRANT_REVOKED: &str = kind::GRANT_REVOKED;
    pub const GRANT_EXPIRED: &str = kind::GRANT_EXPIRED;
    pub const BREAK_GLASS_REVIEWED: &str = kind::BREAK_GLASS_REVIEWED;
    /// Every kind above, for a reader that fetches them from the log.
    pub const ALL: &[&str] = &[
        GRANT_REQUESTED,
        GRANT_SIGNED,
        GRANT_ACTIVE,
        GRANT_USED,
        GRANT_REVOKED,
        GRANT_EXPIRED,
        BREAK_GLASS_REVIEWED,
    ];
}

/// Where a window stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum State {
    /// Asked for; not yet signed by enough people.
    Requested,
    /// Signed by enough people, not revoked, not expired: calls inside it run.
    Open,
    /// Revoked or expired, and no review binds it yet.
    ClosedUnreviewed,
    /// People signed a review of it, and its signatures verify against the approvers file.
    Reviewed,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Requested => "requested",
            State::Open => "open",
            State::ClosedUnreviewed => "closed-unreviewed",
            State::Reviewed => "reviewed",
        }
    }

    /// Whether people still owe this window a review.
    pub fn unreviewed(self) -> bool {
        self != State::Reviewed
    }
}

/// One call made inside a window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WindowCall {
    pub call_id: Option<String>,
    pub tool: Option<String>,
    pub runners: Vec<String>,
    /// Who called (the agent's audit actor).
    pub actor: String,
    pub at: String,
    /// The `grant.used` event's sequence number.
    pub seq: i64,
}

/// The review people signed of a window, as the log holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WindowReview {
    pub at: String,
    /// Who submitted it.
    pub actor: String,
    /// The people of the approvers file whose signatures the server verified.
    pub signed_by: Vec<String>,
    pub note: String,
    pub seq: i64,
}

/// A break-glass window as the log tells it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Window {
    pub id: String,
    pub state: State,
    pub agent: String,
    pub runners: Vec<String>,
    pub reason: String,
    pub expires_at: String,
    pub required: u32,
    /// Who asked for it (`grant.requested`'s actor), and when.
    pub opened_by: String,
    pub opened_at: String,
    /// The people who signed it, in the order they did.
    pub signed_by: Vec<String>,
    /// When it became active (enough people signed).
    pub active_at: Option<String>,
    /// When and why it closed before or at its expiry: `revoked` or `expired`.
    pub closed: Option<(String, String)>,
    pub calls: Vec<WindowCall>,
    pub review: Option<WindowReview>,
    /// Why a `break_glass.reviewed` event of this window does not count (the newest such
    /// event's reason), when none does: its signatures do not verify, it was signed before the
    /// window closed, or there is no approvers file to check it against.
    #[serde(default)]
    pub review_refused: Option<String>,
    /// The grant text people signed.
    pub text: String,
}

impl Window {
    /// When the window closed, in seconds since the epoch: its revocation or expiry event, or
    /// its expiry, whichever is first; `None` while it is still open at `now`.
    pub fn closed_unix(&self, now: u64) -> Option<u64> {
        let expires = parse_utc(&self.expires_at);
        let event = self
            .closed
            .as_ref()
            .and_then(|(at, _)| at.get(..19))
            .and_then(|at| parse_utc(&format!("{at}Z")));
        match (event, expires) {
            (Some(e), Some(x)) => Some(e.min(x)),
            (Some(e), None) => Some(e),
            (None, Some(x)) if now >= x || self.closed.is_some() => Some(x),
            _ => None,
        }
    }
}

/// The break-glass windows among `events` (any order; the kinds of [`events::ALL`]), oldest
/// first, each in its state at `now` (seconds since the epoch). A `break_glass.reviewed`
/// event counts only when it passes [`review::check`] against `approvers` (none: no review
/// counts).
pub fn windows(events: &[Event], now: u64, approvers: Option<&Approvers>) -> Vec<Window> {
    let mut sorted: Vec<&Event> = events.iter().collect();
    sorted.sort_by_key(|e| e.seq);
    let mut found: BTreeMap<String, Window> = BTreeMap::new();
    for event in &sorted {
        if event.kind == events::GRANT_REQUESTED
            && let Some(window) = opened(event)
        {
            found.entry(window.id.clone()).or_insert(window);
        }
    }
    // Retention may have cut a window's request: its review carries the grant text, and its
    // flagged calls still name it.
    for event in &sorted {
        if event.kind == events::BREAK_GLASS_REVIEWED
            && let Some(window) = reviewed_window(event)
        {
            found.entry(window.id.clone()).or_insert(window);
        }
    }
    for event in &sorted {
        if event.kind == events::GRANT_USED
            && event
                .detail
                .as_ref()
                .and_then(|d| d.get("break_glass"))
                .and_then(Value::as_bool)
                == Some(true)
            && let Some(id) = grant_of(event)
        {
            found
                .entry(id.to_owned())
                .or_insert_with(|| cut_window(id, event));
        }
    }
    let mut reviews: BTreeMap<String, Vec<&Event>> = BTreeMap::new();
    for event in sorted {
        let Some(window) = grant_of(event).and_then(|id| found.get_mut(id)) else {
            continue;
        };
        if event.kind == events::BREAK_GLASS_REVIEWED {
            reviews.entry(window.id.clone()).or_default().push(event);
        } else {
            follow(window, event);
        }
    }
    let mut list: Vec<Window> = found.into_values().collect();
    for window in &mut list {
        for event in reviews.get(&window.id).into_iter().flatten() {
            match review_of(window, event, now, approvers) {
                Ok(r) => {
                    window.review = Some(r);
                    window.review_refused = None;
                    break;
                }
                Err(why) => window.review_refused = Some(why),
            }
        }
        window.state = state_of(window, now);
    }
    list.sort_by(|a, b| a.opened_at.cmp(&b.opened_at).then(a.id.cmp(&b.id)));
    list
}

/// The grant id an event's detail names.
fn grant_of(event: &Event) -> Option<&str> {
    event.detail.as_ref()?.get("grant")?.as_str()
}

/// The window a `grant.requested` event opens, when its text is a break-glass window's.
fn opened(event: &Event) -> Option<Window> {
    let text = event.detail.as_ref()?.get("text")?.as_str()?;
    let grant = Grant::parse(text).ok()?;
    if grant_of(event) != Some(grant.id.as_str()) {
        return None;
    }
    let mut window = window_of(grant, text)?;
    window.opened_by = event.actor.clone();
    window.opened_at = event.at.clone();
    Some(window)
}

/// The window of `grant` (whose text is `text`), when it is a break-glass window.
fn window_of(grant: Grant, text: &str) -> Option<Window> {
    if !grant.break_glass {
        return None;
    }
    let runners = match &grant.runners {
        Runners::Names(names) => names.clone(),
        Runners::Labels(_) => return None,
    };
    Some(Window {
        id: grant.id,
        state: State::Requested,
        agent: grant.agent,
        runners,
        reason: grant.reason,
        expires_at: grant.expires_at,
        required: grant.required,
        opened_by: String::new(),
        opened_at: String::new(),
        signed_by: Vec::new(),
        active_at: None,
        closed: None,
        calls: Vec::new(),
        review: None,
        review_refused: None,
        text: text.to_owned(),
    })
}

/// The window a `break_glass.reviewed` event's grant text (`window`) tells, when its
/// `grant.requested` is no longer in the log.
fn reviewed_window(event: &Event) -> Option<Window> {
    let text = event.detail.as_ref()?.get("window")?.as_str()?;
    let grant = Grant::parse(text).ok()?;
    if grant_of(event) != Some(grant.id.as_str()) {
        return None;
    }
    let mut window = window_of(grant, text)?;
    window.opened_by = NOT_IN_LOG.into();
    window.opened_at = event.at.clone();
    Some(window)
}

/// Who opened a window whose request the log no longer holds.
const NOT_IN_LOG: &str = "(not in the kept log)";

/// A window known only by a flagged call `event` of it: its request and grant text are no
/// longer in the log (cut by retention). Closed and unreviewed: nothing here can be checked.
fn cut_window(id: &str, event: &Event) -> Window {
    Window {
        id: id.to_owned(),
        state: State::ClosedUnreviewed,
        agent: event.actor.clone(),
        runners: Vec::new(),
        reason: String::new(),
        expires_at: String::new(),
        required: 0,
        opened_by: NOT_IN_LOG.into(),
        opened_at: event.at.clone(),
        signed_by: Vec::new(),
        active_at: None,
        closed: None,
        calls: Vec::new(),
        review: None,
        review_refused: Some(CUT.into()),
        text: String::new(),
    }
}

/// Why a window known only by its calls is not reviewed.
pub const CUT: &str = "the window's grant.requested is not in the kept log (cut by retention): its flagged calls are listed, but no review can be checked against its grant text here; check it in the archive";

/// What one event of a window's life adds to it.
fn follow(window: &mut Window, event: &Event) {
    let detail = event.detail.as_ref();
    let text = |key: &str| detail.and_then(|d| d.get(key)).and_then(Value::as_str);
    match event.kind.as_str() {
        events::GRANT_SIGNED => {
            if let Some(person) = text("person") {
                window.signed_by.push(person.to_owned());
            }
        }
        events::GRANT_ACTIVE => {
            window.active_at.get_or_insert_with(|| event.at.clone());
        }
        events::GRANT_USED => window.calls.push(WindowCall {
            call_id: event.call_id.clone().or(text("call_id").map(str::to_owned)),
            tool: event.tool.clone(),
            runners: strings(detail.and_then(|d| d.get("runners"))),
            actor: event.actor.clone(),
            at: event.at.clone(),
            seq: event.seq,
        }),
        events::GRANT_REVOKED | events::GRANT_EXPIRED => {
            let why = event.kind.trim_start_matches("grant.").to_owned();
            window.closed.get_or_insert((event.at.clone(), why));
        }
        _ => {}
    }
}

/// The review event `event` records of `window`, when its text and signatures pass
/// [`review::check`] against `approvers` for the window's grant text and close; else why not.
fn review_of(
    window: &Window,
    event: &Event,
    now: u64,
    approvers: Option<&Approvers>,
) -> Result<WindowReview, String> {
    let refused = |why: String| format!("the review event #{} does not count: {why}", event.seq);
    let detail = event.detail.as_ref();
    let proof: ReviewProof = detail
        .and_then(|d| {
            serde_json::from_value(serde_json::json!({
                "text": d.get("text")?,
                "signatures": d.get("signatures")?,
            }))
            .ok()
        })
        .ok_or_else(|| refused("it carries no review text and signatures".into()))?;
    if window.text.is_empty() {
        return Err(refused(CUT.into()));
    }
    let Some(approvers) = approvers else {
        return Err(refused(
            "no approvers file to verify its signatures against".into(),
        ));
    };
    let Some(closed) = window.closed_unix(now) else {
        return Err(refused("the window is still open".into()));
    };
    let (review, signed) =
        review::check(approvers, &window.text, &proof, now, closed).map_err(refused)?;
    Ok(WindowReview {
        at: event.at.clone(),
        actor: event.actor.clone(),
        signed_by: signed.into_iter().map(|s| s.person).collect(),
        note: review.note,
        seq: event.seq,
    })
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// A window's state at `now`: reviewed once a review binds it; else closed once revoked,
/// expired in the log or past its expiry by the clock; else open once active.
fn state_of(window: &Window, now: u64) -> State {
    let past_expiry = parse_utc(&window.expires_at).is_none_or(|t| now >= t);
    if window.review.is_some() {
        State::Reviewed
    } else if window.closed.is_some() || past_expiry {
        State::ClosedUnreviewed
    } else if window.active_at.is_some() {
        State::Open
    } else {
        State::Requested
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::protocol::approval::Signature;
    use crate::protocol::approval::approvers::tests::file_with;
    use crate::protocol::approval::review::Review;
    use crate::protocol::approval::sshsig::{self, tests::sign, tests::test_key};
    use crate::protocol::approval::tests::id_at;

    fn people() -> Approvers {
        Approvers::parse(&file_with(
            &[("alice", 1), ("carol", 3)],
            "[[rule]]\ntools = \"*\"\napprovals = 1\n",
        ))
        .unwrap()
    }

    fn ssh(seed: u8, text: &str) -> Signature {
        Signature::Ssh {
            signer: format!("p{seed}"),
            signature: sign(&test_key(seed), sshsig::APPROVAL_NAMESPACE, text.as_bytes()),
        }
    }

    fn listed(events: &[Event], now: u64) -> Vec<Window> {
        windows(events, now, Some(&people()))
    }

    /// 2026-12-06T10:00:00Z.
    const T: u64 = 1_796_551_200;

    fn grant(break_glass: bool) -> Grant {
        Grant {
            id: id_at(T),
            agent: "agent:ops-bot".into(),
            break_glass,
            tools: vec!["*".into()],
            runners: Runners::Names(vec!["edge-1".into(), "edge-2".into()]),
            args: BTreeMap::new(),
            max_calls: 100,
            max_calls_per_runner: 100,
            required: 2,
            reason: "INC-7: the edge is down".into(),
            expires_at: "2026-12-06T11:00:00Z".into(),
        }
    }

    fn event(seq: i64, kind: &str, actor: &str, detail: Value) -> Event {
        Event {
            seq,
            id: format!("e{seq}"),
            at: format!("2026-12-06T10:{:02}:00.000000Z", seq),
            actor: actor.into(),
            kind: kind.into(),
            tool: None,
            runner: None,
            args: None,
            reason: None,
            call_id: None,
            approval_id: None,
            outcome: Some("ok".into()),
            result_digest: None,
            detail: Some(detail),
            prev_hash: String::new(),
            hash: String::new(),
            hash_v: 0,
        }
    }

    /// A window's life up to two calls: requested by alice, signed by alice and bob, active.
    fn life(g: &Grant) -> Vec<Event> {
        let text = g.text().unwrap();
        let id = g.id.clone();
        let mut used = event(
            5,
            events::GRANT_USED,
            "agent:ops-bot",
            json!({"grant": id, "use": 1, "call_id": "c1", "runners": ["edge-1"], "break_glass": g.break_glass}),
        );
        used.tool = Some("linux.systemctl_restart".into());
        used.call_id = Some("c1".into());
        vec![
            event(
                1,
                events::GRANT_REQUESTED,
                "user:alice",
                json!({"grant": id, "text": text, "required": 2}),
            ),
            event(
                2,
                events::GRANT_SIGNED,
                "user:alice",
                json!({"grant": id, "person": "alice"}),
            ),
            event(
                3,
                events::GRANT_SIGNED,
                "user:bob",
                json!({"grant": id, "person": "bob"}),
            ),
            event(4, events::GRANT_ACTIVE, "user:bob", json!({"grant": id})),
            used,
            event(
                6,
                events::GRANT_USED,
                "agent:ops-bot",
                json!({"grant": id, "use": 2, "call_id": "c2", "runners": ["edge-2"], "break_glass": g.break_glass}),
            ),
        ]
    }

    /// The `break_glass.reviewed` event the server writes: the review's text, signed by
    /// alice and carol (seeds 1 and 3), and the names it says signed.
    fn reviewed(seq: i64, g: &Grant, review_text: &str) -> Event {
        reviewed_with(
            seq,
            g,
            review_text,
            vec![ssh(1, review_text), ssh(3, review_text)],
        )
    }

    fn reviewed_with(seq: i64, g: &Grant, review_text: &str, signatures: Vec<Signature>) -> Event {
        event(
            seq,
            events::BREAK_GLASS_REVIEWED,
            "user:carol",
            json!({"grant": g.id, "text": review_text, "signed_by": ["alice", "carol"], "signatures": signatures}),
        )
    }

    #[test]
    fn a_window_is_open_then_closed_unreviewed_until_a_review_binds_it() {
        let g = grant(true);
        let mut log = life(&g);
        let during = T + 600;
        let list = listed(&log, during);
        assert_eq!(list.len(), 1);
        let w = &list[0];
        assert_eq!(w.state, State::Open);
        assert_eq!(w.opened_by, "user:alice");
        assert_eq!(w.signed_by, ["alice", "bob"]);
        assert_eq!(w.runners, ["edge-1", "edge-2"]);
        assert_eq!(w.calls.len(), 2);
        assert_eq!(w.calls[0].tool.as_deref(), Some("linux.systemctl_restart"));
        assert_eq!(w.calls[1].call_id.as_deref(), Some("c2"));
        assert_eq!(w.calls[1].runners, ["edge-2"]);
        // Past its expiry by the clock, with no event saying so: closed, unreviewed.
        let after = T + 3600;
        assert_eq!(listed(&log, after)[0].state, State::ClosedUnreviewed);
        // Revoked in the log: closed at once.
        log.push(event(
            7,
            events::GRANT_REVOKED,
            "user:bob",
            json!({"grant": g.id}),
        ));
        let w = &listed(&log, during)[0];
        assert_eq!(w.state, State::ClosedUnreviewed);
        assert_eq!(w.closed.as_ref().unwrap().1, "revoked");
        // A review of an edited text (another window's hash) does not count.
        let text = g.text().unwrap();
        let other = Grant {
            runners: Runners::Names(vec!["edge-1".into()]),
            ..g.clone()
        }
        .text()
        .unwrap();
        let forged = Review::of(&other, "all fine", "2026-12-06T12:00:00Z").unwrap();
        log.push(reviewed(8, &g, &forged.text().unwrap()));
        assert_eq!(listed(&log, after)[0].state, State::ClosedUnreviewed);
        // The review of this window's own text makes it reviewed.
        let review = Review::of(&text, "restarted consul twice", "2026-12-06T12:00:00Z").unwrap();
        log.push(reviewed(9, &g, &review.text().unwrap()));
        let after = T + 3 * 3600;
        let w = &listed(&log, after)[0];
        assert_eq!(w.state, State::Reviewed);
        let r = w.review.as_ref().unwrap();
        assert_eq!(r.note, "restarted consul twice");
        assert_eq!(r.signed_by, ["alice", "carol"]);
        assert_eq!(r.actor, "user:carol");
        assert_eq!(w.review_refused, None);
        // With no approvers file to check it against, the same event counts for nothing.
        let w = &windows(&log, after, None)[0];
        assert_eq!(w.state, State::ClosedUnreviewed);
        assert!(
            w.review_refused
                .as_deref()
                .unwrap()
                .contains("no approvers file"),
            "{w:?}"
        );
    }

    /// A `break_glass.reviewed` event appended by a database writer (valid chain hashes, a text
    /// binding this window) whose signatures are copies from another review, by keys outside
    /// the approvers file, too few, or made while the window was open, reviews nothing, and
    /// the listing says why.
    #[test]
    fn a_review_event_counts_only_when_its_signatures_verify_after_the_close() {
        let g = grant(true);
        let text = g.text().unwrap();
        let mut log = life(&g);
        log.push(event(
            7,
            events::GRANT_REVOKED,
            "user:bob",
            json!({"grant": g.id}),
        ));
        let after = T + 3600 * 3;
        let review = Review::of(&text, "all fine", "2026-12-06T12:00:00Z")
            .unwrap()
            .text()
            .unwrap();
        let elsewhere = Review::of(&text, "genuine", "2026-12-06T12:00:00Z")
            .unwrap()
            .text()
            .unwrap();
        let refused = |event: Event, says: &str| {
            let mut log = log.clone();
            log.push(event);
            let w = &listed(&log, after)[0];
            assert_eq!(w.state, State::ClosedUnreviewed, "{says}");
            assert!(w.review.is_none());
            let why = w.review_refused.as_deref().unwrap_or_default();
            assert!(why.contains(says), "wanted {says:?}: {why}");
        };
        // Signatures copied from a review of another text.
        refused(
            reviewed_with(8, &g, &review, vec![ssh(1, &elsewhere), ssh(3, &elsewhere)]),
            "signature",
        );
        // Real signatures over this text, by keys the approvers file does not hold.
        refused(
            reviewed_with(8, &g, &review, vec![ssh(7, &review), ssh(8, &review)]),
            "not in the approvers file",
        );
        // One person where the window needs two.
        refused(
            reviewed_with(8, &g, &review, vec![ssh(1, &review)]),
            "`required 2`",
        );
        // No signatures at all, only names.
        let mut bare = reviewed(8, &g, &review);
        bare.detail
            .as_mut()
            .unwrap()
            .as_object_mut()
            .unwrap()
            .remove("signatures");
        refused(bare, "no review text and signatures");
        // Signed by both before the revocation at 10:07: refused, naming `reviewed`.
        let early = Review::of(&text, "all fine", "2026-12-06T10:06:00Z")
            .unwrap()
            .text()
            .unwrap();
        refused(
            reviewed(8, &g, &early),
            "`reviewed`: 2026-12-06T10:06:00Z is before the window closed",
        );
        // A forged event, then the genuine one: the genuine one counts.
        log.push(reviewed_with(
            8,
            &g,
            &review,
            vec![ssh(1, &elsewhere), ssh(3, &elsewhere)],
        ));
        log.push(reviewed(9, &g, &review));
        let w = &listed(&log, after)[0];
        assert_eq!(w.state, State::Reviewed);
        assert_eq!(w.review.as_ref().unwrap().seq, 9);
        assert_eq!(w.review_refused, None);
    }

    #[test]
    fn only_break_glass_grants_are_windows_and_events_in_any_order_tell_the_same() {
        let plain = grant(false);
        assert!(listed(&life(&plain), T + 600).is_empty());
        let g = grant(true);
        let mut log = life(&g);
        log.reverse();
        let w = &listed(&log, T + 600)[0];
        assert_eq!(w.state, State::Open);
        assert_eq!(w.signed_by, ["alice", "bob"]);
        // Requested, never signed by enough people: not open.
        let w = &listed(&log[4..], T + 600)[0];
        assert_eq!(w.state, State::Requested);
        // A `grant.requested` whose detail names another id than its text is not a window.
        let mut lying = life(&g);
        lying[0].detail.as_mut().unwrap()["grant"] = json!(id_at(T + 5));
        let list = listed(&lying, T + 600);
        assert_eq!(list.len(), 1, "{list:?}");
        assert_eq!(list[0].id, g.id, "only the window its flagged calls name");
        assert_eq!(list[0].opened_by, NOT_IN_LOG);
    }

    /// Retention that cuts a window's `grant.requested` (and what came before its calls)
    /// leaves it listed while a flagged call of it is kept: closed and unreviewed, saying why;
    /// a review kept with it carries the grant text and still counts.
    #[test]
    fn a_window_whose_request_was_cut_is_listed_unreviewed_by_its_flagged_calls() {
        let g = grant(true);
        let text = g.text().unwrap();
        let mut log = life(&g);
        log.push(event(
            7,
            events::GRANT_REVOKED,
            "user:bob",
            json!({"grant": g.id}),
        ));
        let now = T + 3 * 3600;
        // The cut keeps the events from seq 6 on: the second call, the revocation.
        let kept: Vec<Event> = log.iter().filter(|e| e.seq >= 6).cloned().collect();
        let list = listed(&kept, now);
        assert_eq!(list.len(), 1, "{list:?}");
        let w = &list[0];
        assert_eq!(w.id, g.id);
        assert_eq!(w.state, State::ClosedUnreviewed);
        assert!(w.state.unreviewed());
        assert_eq!(w.calls.len(), 1);
        assert_eq!(w.calls[0].call_id.as_deref(), Some("c2"));
        assert_eq!(w.review_refused.as_deref(), Some(CUT));
        // A plain grant's calls are not flagged, and make no window.
        let plain = grant(false);
        let cut: Vec<Event> = life(&plain).into_iter().filter(|e| e.seq >= 5).collect();
        assert!(listed(&cut, now).is_empty());
        // The review, kept after the cut, carries the window's grant text: it counts.
        let review = Review::of(&text, "restarted consul twice", "2026-12-06T12:00:00Z")
            .unwrap()
            .text()
            .unwrap();
        let mut event = reviewed(8, &g, &review);
        event.detail.as_mut().unwrap()["window"] = json!(text);
        let mut kept = kept;
        kept.push(event);
        let w = &listed(&kept, now)[0];
        assert_eq!(w.state, State::Reviewed, "{w:?}");
        assert_eq!(w.calls.len(), 1);
        assert_eq!(w.review_refused, None);
    }
}
