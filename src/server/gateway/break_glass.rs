//! People open a break-glass window (issue 47): a grant flagged `break_glass`, for one agent,
//! over runners by name, for every tool, signed afterwards like any grant (`emisar grants
//! approve`). Asked for here, audited (`grant.requested`, by the person) and stored; it runs
//! nothing until enough people signed it.
//!
//! *Invariants:* only a person opens a window (an agent's `emisar.request_grant` never sets
//! `break_glass`); it needs the larger of two people and the approvers file's most demanding
//! rule among the rules that honour break-glass; it lives at most `max_grant_lifetime_secs`.

use serde_json::json;

use super::grants::{GrantError, view};
use super::state::Gateway;
use crate::protocol::approval::grant::{Grant, MAX_CALLS, Runners};
use crate::server::audit::{NewEvent, format_at, kind};
use crate::server::grants::{GrantRow, Status, Uses};
use crate::server::principal::{Principal, Role};

/// What people ask for when they open a window.
pub struct WindowAsk {
    /// The runners, by name.
    pub runners: Vec<String>,
    /// The agent it is for, `agent:NAME`.
    pub agent: String,
    pub ttl_secs: u64,
    pub reason: String,
}

impl Gateway {
    /// `who` opens the window `ask`: checked, audited and stored as a requested grant; answered
    /// as the grant is shown.
    pub(crate) async fn open_break_glass(
        &self,
        who: &Principal,
        ask: WindowAsk,
    ) -> Result<serde_json::Value, GrantError> {
        if !matches!(who.role, Role::Approver | Role::Admin) {
            return Err(GrantError::Refused(
                "only approvers and admins open a break-glass window".into(),
            ));
        }
        let grant = self.window_asked(ask)?;
        let text = grant
            .text()
            .map_err(|e| GrantError::Invalid(e.to_string()))?;
        let now = chrono::Utc::now();
        let row = GrantRow {
            id: grant.id.clone(),
            agent: grant.agent.clone(),
            requester_name: who.name.clone(),
            on_behalf_of: None,
            text: text.clone(),
            status: Status::Requested,
            required: grant.required,
            signatures: vec![],
            break_glass: true,
            expires_at: grant.expires_at.clone(),
            requested_at: format_at(now),
            decided_at: None,
            decided_by: None,
            revoked_at: None,
            revoked_by: None,
            revoke_reason: None,
        };
        self.audit
            .append(NewEvent {
                actor: who.actor(),
                kind: kind::GRANT_REQUESTED.into(),
                reason: Some(grant.reason.clone()),
                outcome: Some("ok".into()),
                detail: Some(json!({
                    "grant": grant.id, "text": text, "required": grant.required,
                    "expires_at": grant.expires_at, "break_glass": true,
                })),
                ..Default::default()
            })
            .await?;
        self.grants.insert(&row).await?;
        Ok(view(&row, &Uses::default()))
    }

    /// The window's grant, or what is wrong with the ask (naming the field).
    fn window_asked(&self, ask: WindowAsk) -> Result<Grant, GrantError> {
        let invalid = |m: String| GrantError::Invalid(m);
        let Some(server) = &self.approvers else {
            return Err(invalid(
                "this server has no approvers_file: a break-glass window is signed by its people"
                    .into(),
            ));
        };
        let max = self.limits.max_grant_lifetime.as_secs();
        if ask.ttl_secs == 0 || ask.ttl_secs > max {
            return Err(invalid(format!(
                "`ttl_secs` must be 1 to {max} (the server's max_grant_lifetime_secs)"
            )));
        }
        if !ask.agent.starts_with("agent:") {
            return Err(invalid(format!(
                "`agent` must be `agent:NAME`, not `{}`",
                ask.agent
            )));
        }
        let mut runners = ask.runners;
        runners.sort();
        runners.dedup();
        let most = self
            .tools
            .keys()
            .filter_map(|t| server.approvers.rule(t))
            .filter(|r| r.break_glass)
            .map(|r| r.approvals)
            .max()
            .unwrap_or(0);
        let expires = chrono::Utc::now() + chrono::Duration::seconds(ask.ttl_secs as i64);
        let grant = Grant {
            id: uuid::Uuid::now_v7().to_string(),
            agent: ask.agent,
            break_glass: true,
            tools: vec!["*".into()],
            runners: Runners::Names(runners),
            args: Default::default(),
            max_calls: MAX_CALLS,
            max_calls_per_runner: MAX_CALLS,
            required: most.max(2),
            reason: ask.reason,
            expires_at: expires.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        };
        grant.text().map_err(|e| invalid(e.to_string()))?;
        Ok(grant)
    }
}
