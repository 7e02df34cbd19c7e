//! Notices that reach people: a request waiting for approval, a reminder that it still waits,
//! and its expiry unanswered, sent to webhooks (generic JSON or Slack-compatible) and email
//! (SMTP), group after group as configured (`[notices]`); and grants asked for, break-glass
//! windows asked for and open, and every call inside a window (`grants.rs`, whose module doc
//! says who hears which).
//!
//! Every replica runs [`Notices::run`]: it wakes on every new request and decision (the
//! store's change announcements, from all replicas on PostgreSQL) and every
//! `check_every_ms`, reads the pending requests and the steps already claimed from the store,
//! and for each step now due ([`schedule::Schedule::due`]) claims it (`notice_steps`, one
//! row per step, unique) before it sends it: two replicas never send the same step, a
//! restart resumes the schedule where the store left it, and a decided request has no steps
//! due. A claim is taken before the send, so a crash between the two loses that one step
//! (at most once, never twice).
//!
//! Every notice links to the page where people sign (`public_url` + `/#/approvals/<id>`, a
//! grant's `/#/grants/<id>`) and none carries anything that decides. Sending never blocks the
//! caller ([`targets::Targets::send`]).

pub mod config;
pub mod email;
pub mod webhook;

mod claims;
mod grants;
mod schedule;
mod targets;

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use self::config::NoticesConfig;
pub(crate) use self::grants::{GrantEvent, GrantNotice};
use self::schedule::{Schedule, Step};
use self::targets::Targets;
use self::webhook::{Settings, WebhookConfig};
use crate::server::approvals::{Approval, Approvals, State};
use crate::server::audit::AuditLog;
use crate::server::db::Db;
use crate::server::grants::Grants;

/// What a notice tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NoticeEvent {
    /// A group hears of the request for the first time.
    Requested,
    /// It still waits.
    Reminder,
    /// It expired before people decided.
    Expired,
}

impl NoticeEvent {
    /// The generic webhook's `event`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            NoticeEvent::Requested => "approval.requested",
            NoticeEvent::Reminder => "approval.reminder",
            NoticeEvent::Expired => "approval.expired",
        }
    }
}

/// A request, as people are told about it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Notice {
    /// Written as the body's `event` by the webhook.
    #[serde(skip)]
    pub event: NoticeEvent,
    pub approval_id: String,
    pub tool: String,
    pub runners: Vec<String>,
    /// The audit actor of the caller, e.g. `agent:deploy-bot`.
    pub requester: String,
    pub reason: String,
    pub risk: String,
    /// RFC 3339 UTC.
    pub expires_at: String,
    /// The page where people review and sign it.
    pub portal_url: Option<String>,
    /// An expiry: how long the request waited, in seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waited_secs: Option<u64>,
}

/// What a target delivers: a notice of an approval request, or of a grant.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Message {
    Approval(Notice),
    Grant(GrantNotice),
}

impl Message {
    /// The id it is about (the approval's or the grant's), as logs name it.
    pub(crate) fn id(&self) -> &str {
        match self {
            Message::Approval(n) => &n.approval_id,
            Message::Grant(n) => &n.grant_id,
        }
    }

    /// The generic webhook's `event`.
    pub(crate) fn event(&self) -> &'static str {
        match self {
            Message::Approval(n) => n.event.as_str(),
            Message::Grant(n) => n.event.as_str(),
        }
    }
}

impl From<Notice> for Message {
    fn from(n: Notice) -> Message {
        Message::Approval(n)
    }
}

/// `95` → `1 min 35 s`: how long a request waited, for people.
pub(crate) fn waited_text(secs: u64) -> String {
    match (secs / 3600, secs % 3600 / 60, secs % 60) {
        (0, 0, s) => format!("{s} s"),
        (0, m, 0) => format!("{m} min"),
        (0, m, s) => format!("{m} min {s} s"),
        (h, m, _) => format!("{h} h {m} min"),
    }
}

/// The page where people sign request `id`, as the portal routes it.
pub(crate) fn approval_page(public_url: &str, id: &str) -> String {
    format!("{}/#/approvals/{id}", public_url.trim_end_matches('/'))
}

/// The notice scheduler of one replica.
pub(crate) struct Notices {
    db: Db,
    approvals: Approvals,
    grants: Grants,
    audit: AuditLog,
    targets: Targets,
    schedule: Schedule,
    public_url: Option<String>,
    check_every: Duration,
}

impl Notices {
    /// The scheduler of `config`, its targets' workers started; `None` when no target is
    /// configured. An email target whose password cannot be read is an error naming it.
    pub(crate) fn start(
        webhooks: &[WebhookConfig],
        notices: &NoticesConfig,
        public_url: Option<&str>,
        approvals: &Approvals,
        audit: &AuditLog,
        shutdown: &CancellationToken,
    ) -> anyhow::Result<Option<Arc<Notices>>> {
        let targets = Targets::start(webhooks, &notices.email, shutdown, Settings::default())?;
        if targets.is_empty() {
            return Ok(None);
        }
        Ok(Some(Arc::new(Notices {
            db: approvals.db().clone(),
            approvals: approvals.clone(),
            grants: Grants::new(approvals.db().clone()),
            audit: audit.clone(),
            targets,
            schedule: Schedule {
                groups: notices.groups(webhooks),
                reminder_every: notices.reminder_every_secs.map(Duration::from_secs),
            },
            public_url: public_url.map(str::to_owned),
            check_every: Duration::from_millis(notices.check_every_ms),
        })))
    }

    /// Looks for due steps until `shutdown`: at every change of a request and every
    /// `check_every`; and for grants' announcements also shortly after every change of this
    /// replica's audit log (a grant asked for or signed, a call inside a window).
    pub(crate) fn spawn(self: Arc<Self>, shutdown: CancellationToken) {
        let mut changes = self.approvals.subscribe();
        let mut appended = self.audit.appended();
        let mut log_open = true;
        tokio::spawn(async move {
            let mut woken_by_log = false;
            let mut requests_at: Option<tokio::time::Instant> = None;
            loop {
                let now = tokio::time::Instant::now();
                let requests = looks_at_requests(woken_by_log, requests_at, now, self.check_every);
                if requests {
                    requests_at = Some(now);
                }
                self.tick(chrono::Utc::now(), requests).await;
                woken_by_log = false;
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = changes.recv() => {}
                    changed = appended.changed(), if log_open => match changed {
                        Ok(()) => {
                            // Let a burst of appends settle: one pass for all of them.
                            tokio::time::sleep(grants::AUDIT_WAKE).await;
                            woken_by_log = true;
                        }
                        Err(_) => log_open = false,
                    },
                    _ = tokio::time::sleep(self.check_every) => {}
                }
            }
        });
    }

    /// Sends every step due at `now` that nobody has claimed: the grants' announcements, and
    /// the requests' steps when `requests`. A store that cannot be read is logged; the next
    /// tick tries again.
    async fn tick(&self, now: chrono::DateTime<chrono::Utc>, requests: bool) {
        if requests {
            if let Err(e) = self.announce_pending(now).await {
                tracing::warn!(error = %e, "notices could not read the pending requests");
            }
            if let Err(e) = self.announce_expired(now).await {
                tracing::warn!(error = %e, "notices could not read the expired requests");
            }
        }
        if let Err(e) = self.announce_grants(now).await {
            tracing::warn!(error = %e, "notices could not read the grants to announce");
        }
    }

    async fn announce_pending(&self, now: chrono::DateTime<chrono::Utc>) -> anyhow::Result<()> {
        let pending = self
            .approvals
            .list(Some(State::Pending), None, 1000)
            .await?;
        let claimed = claims::claimed_of_pending(&self.db).await?;
        for request in pending.iter().filter(|r| !r.expired_at(now)) {
            let waited = waited(request, now);
            let taken = claimed.get(&request.id);
            for step in self.schedule.due(waited) {
                if taken.is_some_and(|t| t.contains(&step.key())) {
                    continue;
                }
                self.send_step(request, &step, waited, now).await?;
            }
        }
        Ok(())
    }

    async fn announce_expired(&self, now: chrono::DateTime<chrono::Utc>) -> anyhow::Result<()> {
        let since = now - chrono::Duration::hours(1);
        for id in claims::expired_unannounced(&self.db, since).await? {
            let request = self.approvals.get(&id).await?;
            let waited = expired_after(&request);
            self.send_step(&request, &Step::Expired, waited, now)
                .await?;
        }
        Ok(())
    }

    /// Claims `step` of `request` and, if this replica got it and the request is still in
    /// the state the step is for, sends it to its targets.
    async fn send_step(
        &self,
        request: &Approval,
        step: &Step,
        waited: Duration,
        now: chrono::DateTime<chrono::Utc>,
    ) -> anyhow::Result<()> {
        if !claims::claim(&self.db, &request.id, &step.key(), now).await? {
            return Ok(());
        }
        // Decided between the read and the claim: nothing more to say.
        let current = self.approvals.get(&request.id).await?;
        let wanted = if *step == Step::Expired {
            State::Expired
        } else {
            State::Pending
        };
        if current.state != wanted {
            return Ok(());
        }
        let targets = self.schedule.targets(step, waited);
        tracing::info!(approval_id = %request.id, step = %step.key(), targets = ?targets, "notice sent");
        self.targets
            .send(&targets, self.notice(&current, step, waited).into());
        Ok(())
    }

    fn notice(&self, a: &Approval, step: &Step, waited: Duration) -> Notice {
        let event = match step {
            Step::Group(_) => NoticeEvent::Requested,
            Step::Reminder(_) => NoticeEvent::Reminder,
            Step::Expired => NoticeEvent::Expired,
        };
        Notice {
            event,
            approval_id: a.id.clone(),
            tool: a.tool.clone(),
            runners: a.runners.clone(),
            requester: a.requester.clone(),
            reason: a.reason.clone(),
            risk: a.risk.clone(),
            expires_at: a.expires_at.clone(),
            portal_url: self.public_url.as_deref().map(|u| approval_page(u, &a.id)),
            waited_secs: (event == NoticeEvent::Expired).then_some(waited.as_secs()),
        }
    }
}

/// Whether a pass at `now` looks at the requests too, not only the grants: always, unless the
/// log woke it; then only if the last pass that did is `check_every` old. A busy log wakes the
/// loop before `check_every` ever passes, and the requests' steps that fall due with time
/// alone (escalation, reminders, expiry) must not wait for it to calm down.
fn looks_at_requests(
    woken_by_log: bool,
    last: Option<tokio::time::Instant>,
    now: tokio::time::Instant,
    check_every: Duration,
) -> bool {
    !woken_by_log || last.is_none_or(|at| now.duration_since(at) >= check_every)
}

/// How long `a` has waited at `now`.
fn waited(a: &Approval, now: chrono::DateTime<chrono::Utc>) -> Duration {
    parse(&a.created_at)
        .and_then(|created| (now - created).to_std().ok())
        .unwrap_or_default()
}

/// How long `a` waited before it expired.
pub(crate) fn expired_after(a: &Approval) -> Duration {
    match (parse(&a.created_at), parse(&a.expires_at)) {
        (Some(created), Some(expires)) => (expires - created).to_std().unwrap_or_default(),
        _ => Duration::ZERO,
    }
}

fn parse(at: &str) -> Option<chrono::DateTime<chrono::Utc>> {
    chrono::DateTime::parse_from_rfc3339(at)
        .ok()
        .map(|t| t.with_timezone(&chrono::Utc))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A notice as tests use it.
    pub(crate) fn notice(event: NoticeEvent) -> Notice {
        Notice {
            event,
            approval_id: "ap-1".into(),
            tool: "nomad.task_resources_set".into(),
            runners: vec!["hvn05".into(), "hvn06".into()],
            requester: "agent:deploy-bot".into(),
            reason: "traefik is\nOOM-killed <again> & again".into(),
            risk: "high".into(),
            expires_at: "2030-01-01T00:00:00.000000Z".into(),
            portal_url: Some(approval_page("https://emisar.example/", "ap-1")),
            waited_secs: None,
        }
    }

    #[test]
    fn a_busy_log_never_holds_back_the_requests_past_check_every() {
        let every = Duration::from_millis(200);
        let t0 = tokio::time::Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        // Not woken by the log: always.
        assert!(looks_at_requests(false, Some(ms(0)), ms(10), every));
        // Woken by the log: the grants only, until check_every passed since the last look.
        assert!(looks_at_requests(true, None, ms(0), every));
        assert!(!looks_at_requests(true, Some(ms(0)), ms(150), every));
        assert!(looks_at_requests(true, Some(ms(0)), ms(200), every));
    }

    #[test]
    fn waited_reads_as_people_say_it() {
        let cases = [
            (0, "0 s"),
            (59, "59 s"),
            (60, "1 min"),
            (95, "1 min 35 s"),
            (3720, "1 h 2 min"),
        ];
        for (secs, want) in cases {
            assert_eq!(waited_text(secs), want);
        }
    }
}
