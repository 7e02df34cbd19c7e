//! Notices of grants and break-glass windows (issue 47): a grant asked for, a window asked
//! for, a window open, and every call made inside a window, sent to the same targets as the
//! approval requests' notices.
//!
//! Who hears:
//! - a grant an agent asks for: the escalation groups in order, each `after_secs` after it
//!   was asked for while it is still requested (as an approval request; no reminders, no
//!   expiry notice);
//! - a break-glass window asked for (`break_glass.requested`), open (`break_glass.open`), and
//!   each call inside it (`break_glass.call`): every group at once, since it is an emergency.
//!
//! *Invariants:* each announcement is claimed in the store before it is sent
//! (`grant_notice_steps`, primary key `(grant_id, step)`, the steps `group:<i>`,
//! `requested`, `open` and `call:<call id>`), so two replicas never send the same one and a
//! restarted server sends nothing already sent; a claim taken and then not sent (a crash
//! between the two) loses that one announcement, never sends it twice. The table is
//! `notice_steps`' twin rather than `notice_steps` itself, whose rows name an approval.
//!
//! What is announced is read from the store on every pass, never handed over by the call
//! path: the grants table (requested grants, windows and whether people opened them) and the
//! audit log (each window's `grant.used` events flagged `break_glass`), so a call inside a
//! window is never slowed by its announcement, and a call made through any replica is
//! announced by whichever replica claims it first. A pass runs at every change of the local
//! audit log (shortly after, at most every [`AUDIT_WAKE`]) and every `check_every_ms`.
//!
//! Every notice links to the grant's page in the portal (`public_url` + `/#/grants/<id>`),
//! where people sign it; none carries anything that decides.

use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

use super::schedule::Step;
use super::{Message, Notices, claims};
use crate::protocol::approval::grant::{Grant, Runners};
use crate::server::audit::format_at;
use crate::server::grants::{GrantRow, Status, UsedEvent};

/// After a change of the local audit log, how long a pass waits for the next ones: passes
/// run at most this often on a busy log.
pub(super) const AUDIT_WAKE: Duration = Duration::from_millis(100);

/// How long after a grant's expiry its announcements are still sent (a replica that was down
/// when they fell due).
const LATE: chrono::Duration = chrono::Duration::hours(1);

/// What a grant's notice tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GrantEvent {
    /// An agent asked for a grant.
    Requested,
    /// A person opened a break-glass window: people must sign it.
    BreakGlassRequested,
    /// Enough people signed the window: the agent's writes on its runners run now.
    BreakGlassOpen,
    /// A call inside the window.
    BreakGlassCall,
}

impl GrantEvent {
    /// The generic webhook's `event`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            GrantEvent::Requested => "grant.requested",
            GrantEvent::BreakGlassRequested => "break_glass.requested",
            GrantEvent::BreakGlassOpen => "break_glass.open",
            GrantEvent::BreakGlassCall => "break_glass.call",
        }
    }
}

/// A grant or a window, or a call inside a window, as people are told about it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct GrantNotice {
    /// Written as the body's `event` by the webhook.
    #[serde(skip)]
    pub event: GrantEvent,
    /// The grant's id; a window's is its grant's.
    pub grant_id: String,
    pub break_glass: bool,
    /// The audit actor it is for, e.g. `agent:ops-bot`.
    pub agent: String,
    /// Who asked for it: the agent's name, or the person who opened the window.
    pub requested_by: String,
    /// Why it was asked for: the grant's (the window's) reason.
    pub reason: String,
    /// The tools it covers (names or globs; a window: `*`).
    pub tools: Vec<String>,
    /// The runners it covers (by name, or `labels: <selector>`); a call: the runners it
    /// runs on.
    pub runners: Vec<String>,
    /// RFC 3339 UTC.
    pub expires_at: String,
    /// How many people must sign it.
    pub required: u32,
    /// Who signed it (an open window).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub signed_by: Vec<String>,
    /// A call: the tool called.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// A call: its id in the audit log.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
    /// The grant's page, where people review and sign it.
    pub portal_url: Option<String>,
}

/// The page of grant (or window) `id`, as the portal routes it.
pub(crate) fn grant_page(public_url: &str, id: &str) -> String {
    format!("{}/#/grants/{id}", public_url.trim_end_matches('/'))
}

/// One announcement of a grant. Its [`GrantStep::key`] is what the store claims.
#[derive(Debug, Clone, PartialEq, Eq)]
enum GrantStep {
    /// Escalation group `i` is told of the grant an agent asked for.
    Group(usize),
    /// Every group is told of the window asked for.
    Requested,
    /// Every group is told the window is open.
    Open,
    /// Every group is told of a call inside the window.
    Call(UsedCall),
}

/// A call inside a window, from its `grant.used` event.
#[derive(Debug, Clone, PartialEq, Eq)]
struct UsedCall {
    call_id: String,
    actor: String,
    tool: String,
    runners: Vec<String>,
}

impl GrantStep {
    /// `group:0`, `requested`, `open`, `call:<call id>`.
    fn key(&self) -> String {
        match self {
            GrantStep::Group(i) => format!("group:{i}"),
            GrantStep::Requested => "requested".into(),
            GrantStep::Open => "open".into(),
            GrantStep::Call(call) => format!("call:{}", call.call_id),
        }
    }
}

/// The call a `grant.used` event records, if it is flagged `break_glass`.
fn window_call(used: &UsedEvent) -> Option<UsedCall> {
    if used.detail["break_glass"] != Value::Bool(true) || used.call_id.is_empty() {
        return None;
    }
    Some(UsedCall {
        call_id: used.call_id.clone(),
        actor: used.actor.clone(),
        tool: used.tool.clone(),
        runners: used.detail["runners"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect(),
    })
}

impl Notices {
    /// Sends every announcement of a grant due at `now` that nobody has claimed.
    pub(super) async fn announce_grants(
        &self,
        now: chrono::DateTime<chrono::Utc>,
    ) -> anyhow::Result<()> {
        let since = format_at(now - LATE);
        let rows = self.grants.to_announce(&since).await?;
        if rows.is_empty() {
            return Ok(());
        }
        let claimed = claims::claimed_of_grants(&self.db, &since).await?;
        let none = Default::default();
        for row in rows {
            let taken = claimed.get(&row.id).unwrap_or(&none);
            for step in self.grant_steps_due(&row, now).await? {
                if !taken.contains(&step.key()) {
                    self.send_grant_step(&row, step, now).await?;
                }
            }
        }
        Ok(())
    }

    /// The announcements of `row` due at `now`, claimed or not.
    async fn grant_steps_due(
        &self,
        row: &GrantRow,
        now: chrono::DateTime<chrono::Utc>,
    ) -> anyhow::Result<Vec<GrantStep>> {
        let requested = row.status == Status::Requested && !row.expired_at(now);
        if !row.break_glass {
            if !requested {
                return Ok(vec![]);
            }
            let waited = super::parse(&row.requested_at)
                .and_then(|at| (now - at).to_std().ok())
                .unwrap_or_default();
            return Ok(self
                .schedule
                .due(waited)
                .into_iter()
                .filter_map(|step| match step {
                    Step::Group(i) => Some(GrantStep::Group(i)),
                    _ => None,
                })
                .collect());
        }
        if requested {
            return Ok(vec![GrantStep::Requested]);
        }
        // Open once people signed it: `decided_at` is set only then.
        if row.decided_at.is_none() {
            return Ok(vec![]);
        }
        let mut steps = vec![GrantStep::Open];
        let calls = self.grants.used_events(&row.id).await?;
        steps.extend(calls.iter().filter_map(window_call).map(GrantStep::Call));
        Ok(steps)
    }

    /// Claims `step` of `row` and, if this replica got it and a request is still requested,
    /// sends it to its targets.
    async fn send_grant_step(
        &self,
        row: &GrantRow,
        step: GrantStep,
        now: chrono::DateTime<chrono::Utc>,
    ) -> anyhow::Result<()> {
        let key = step.key();
        if !claims::claim_grant(&self.db, &row.id, &key, now).await? {
            return Ok(());
        }
        let current = match step {
            // Signed (or revoked) between the read and the claim: nothing more to ask.
            GrantStep::Group(_) | GrantStep::Requested => match self.grants.get(&row.id).await? {
                Some(current) if current.status == Status::Requested => current,
                _ => return Ok(()),
            },
            GrantStep::Open | GrantStep::Call(_) => row.clone(),
        };
        let targets = match step {
            GrantStep::Group(i) => self.schedule.targets(&Step::Group(i), Duration::ZERO),
            _ => self.schedule.everyone(),
        };
        let notice = self.grant_notice(&current, step)?;
        tracing::info!(grant_id = %row.id, step = %key, event = notice.event.as_str(), targets = ?targets, "notice sent");
        self.targets.send(&targets, Message::Grant(notice));
        Ok(())
    }

    fn grant_notice(&self, row: &GrantRow, step: GrantStep) -> anyhow::Result<GrantNotice> {
        let grant = Grant::parse(&row.text)
            .map_err(|e| anyhow::anyhow!("grant {}: its text does not read: {e}", row.id))?;
        let event = match &step {
            GrantStep::Group(_) => GrantEvent::Requested,
            GrantStep::Requested => GrantEvent::BreakGlassRequested,
            GrantStep::Open => GrantEvent::BreakGlassOpen,
            GrantStep::Call(_) => GrantEvent::BreakGlassCall,
        };
        let runners = match &grant.runners {
            Runners::Names(names) => names.clone(),
            Runners::Labels(selector) => vec![format!("labels: {selector}")],
        };
        let mut notice = GrantNotice {
            event,
            grant_id: row.id.clone(),
            break_glass: row.break_glass,
            agent: row.agent.clone(),
            requested_by: row.requester_name.clone(),
            reason: grant.reason.clone(),
            tools: grant.tools.clone(),
            runners,
            expires_at: row.expires_at.clone(),
            required: row.required,
            signed_by: vec![],
            tool: None,
            call_id: None,
            portal_url: self.public_url.as_deref().map(|u| grant_page(u, &row.id)),
        };
        match step {
            GrantStep::Open => {
                notice.signed_by = row
                    .signatures
                    .iter()
                    .map(|v| v.signed.as_ref().map_or(&v.user, |s| &s.person).clone())
                    .collect();
            }
            GrantStep::Call(call) => {
                notice.agent = call.actor;
                notice.tool = Some(call.tool);
                notice.call_id = Some(call.call_id);
                notice.runners = call.runners;
            }
            GrantStep::Group(_) | GrantStep::Requested => {}
        }
        Ok(notice)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use serde_json::json;

    use super::*;

    /// A window's notice as tests use it.
    pub(crate) fn notice(event: GrantEvent) -> GrantNotice {
        GrantNotice {
            event,
            grant_id: "g-1".into(),
            break_glass: event != GrantEvent::Requested,
            agent: "agent:ops-bot".into(),
            requested_by: "alice".into(),
            reason: "INC-42: the edge\nis <down> & out".into(),
            tools: vec!["*".into()],
            runners: vec!["edge-1".into(), "edge-2".into()],
            expires_at: "2030-01-01T00:00:00Z".into(),
            required: 2,
            signed_by: vec![],
            tool: None,
            call_id: None,
            portal_url: Some(grant_page("https://emisar.example/", "g-1")),
        }
    }

    #[test]
    fn only_flagged_calls_of_the_log_are_announced_each_under_its_own_key() {
        let used = |detail: Value, call_id: &str| UsedEvent {
            actor: "agent:ops-bot".into(),
            tool: "linux.systemctl_restart".into(),
            call_id: call_id.into(),
            detail,
        };
        let flagged = used(
            json!({"grant": "g-1", "runners": ["edge-1"], "break_glass": true}),
            "c-1",
        );
        let call = window_call(&flagged).unwrap();
        assert_eq!(call.runners, ["edge-1"]);
        assert_eq!(GrantStep::Call(call).key(), "call:c-1");
        assert!(window_call(&used(json!({"grant": "g-1", "break_glass": false}), "c-2")).is_none());
        assert!(window_call(&used(json!({"grant": "g-1"}), "c-3")).is_none());
        assert!(window_call(&used(json!({"break_glass": true}), "")).is_none());
        let keys: Vec<String> = [GrantStep::Group(1), GrantStep::Requested, GrantStep::Open]
            .iter()
            .map(GrantStep::key)
            .collect();
        assert_eq!(keys, ["group:1", "requested", "open"]);
        assert_eq!(
            grant_page("https://e.example/", "g-1"),
            "https://e.example/#/grants/g-1"
        );
    }
}
