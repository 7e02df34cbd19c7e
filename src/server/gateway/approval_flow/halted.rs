//! People's decision on a halted rollout: a person proposes resume, retry or abort (the
//! decision's text, which people sign like a statement, `protocol::approval::decision`);
//! people vote for it, each signature verified as it comes; the vote that makes it enough
//! carries it out in the same transition, and a resume or a retry then runs on this replica
//! (`execute.rs`, with the decision carried to every runner it names). The pure rules are in
//! `approvals/halted.rs`.

use std::sync::Arc;

use super::super::state::Gateway;
use crate::protocol::approval::Choice;
use crate::server::approvals::{self, Actor, Approval, ApprovalError, Lock, State, Verdict};
use crate::server::principal::Principal;

impl Gateway {
    /// `who` proposes `choice` for the halted request `id`: the request with its decision
    /// (pending, to be signed), or the pending one when it is the same choice.
    pub async fn propose_decision(
        &self,
        who: &Principal,
        id: &str,
        choice: Choice,
    ) -> Result<Approval, ApprovalError> {
        let lives = self.limits.approval_ttl + self.limits.approved_start_within;
        let row = self
            .approvals
            .transition(id, Lock::Wait, |r| {
                let now = chrono::Utc::now();
                let expires = now + chrono::Duration::from_std(lives).unwrap_or_default();
                let decision_id = uuid::Uuid::now_v7().to_string();
                let actor = self.actor_for(who, r);
                approvals::halted::propose(r, &actor, choice, decision_id, expires, now)
            })
            .await?
            .expect("a transition that waits for the lock always returns the row");
        Ok(row)
    }

    /// `who` votes for the pending decision `decision_id` on the halted request `id` (with a
    /// signature over its text where people sign). The vote that makes it enough carries it
    /// out: an abort ends the request; a resume or a retry runs now, on this replica.
    pub async fn vote_decision(
        self: &Arc<Self>,
        who: &Principal,
        id: &str,
        decision_id: &str,
        verdict: Verdict,
    ) -> Result<Approval, ApprovalError> {
        self.check_sign_count(who, id, &verdict, |r, v| {
            self.verify_decision_vote(r, decision_id, v)
        })
        .await?;
        let row = self
            .approvals
            .transition(id, Lock::Wait, |r| {
                let actor = self.actor_for(who, r);
                let verdict = self.verify_decision_vote(r, decision_id, &verdict)?;
                approvals::halted::vote(r, &actor, decision_id, &verdict, chrono::Utc::now())
            })
            .await?
            .expect("a transition that waits for the lock always returns the row");
        if row.state == State::Executing {
            let me = self.clone();
            let claimed = row.clone();
            tokio::spawn(async move { me.run_claimed(claimed).await });
        }
        Ok(row)
    }

    /// Who `who` is for a decision on `row`: any one of their roles that may approve its tool
    /// is enough.
    pub(super) fn actor_for(&self, who: &Principal, row: &Approval) -> Actor {
        let policy = self.policy();
        Actor {
            name: who.name.clone(),
            actor: who.actor(),
            may_approve: who
                .roles
                .iter()
                .any(|role| policy.may_approve(*role, &row.tool)),
        }
    }
}
