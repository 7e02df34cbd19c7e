//! A request to test with: pending, one approver needed, asked by agent `bot` on behalf of
//! `person:dana`, expiring at 10:15 on 2026-11-30.

use chrono::{DateTime, Utc};
use serde_json::{Map, json};

use super::{Actor, Approval, State};

pub(crate) fn row() -> Approval {
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
        plan: crate::protocol::approval::Plan::one_wave([&"hvn05".to_owned()]),
        decision: None,
        decided_by: None,
        result: None,
        created_at: "2026-11-30T10:00:00.000000Z".into(),
        expires_at: "2026-11-30T10:15:00.000000Z".into(),
        updated_at: "2026-11-30T10:00:00.000000Z".into(),
    }
}

pub(crate) fn at(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
}

pub(crate) fn who(name: &str) -> Actor {
    Actor {
        name: name.into(),
        actor: format!("approver:{name}"),
        may_approve: true,
    }
}
