//! Policy: may this caller run this tool now? Pure and synchronous.
//!
//! Invariant: no IO, no clock, no randomness; the same inputs always give the same decision.
//! Today the rule is the skeleton's: reads run, every write is refused because the approval
//! queue that writes need does not exist yet.

use crate::pack::{Risk, Tool};
use crate::tokens::Principal;

#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    Allow,
    /// Runs only after this many humans approve it.
    NeedsApproval {
        approvers: u32,
    },
    Deny(String),
}

pub fn decide(tool: &Tool, _caller: &Principal) -> Decision {
    match tool.risk {
        Risk::Read => Decision::Allow,
        Risk::Low | Risk::High => Decision::NeedsApproval { approvers: 1 },
    }
}

/// Whether a human with `role` may decide requests for `tool`.
pub fn may_approve(role: crate::tokens::Role, _tool: &str) -> bool {
    matches!(
        role,
        crate::tokens::Role::Approver | crate::tokens::Role::Admin
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pack::PackSet;

    fn caller() -> Principal {
        Principal {
            agent: "a".into(),
            token_id: "t".into(),
            role: crate::tokens::Role::Agent,
            selector: None,
        }
    }

    #[test]
    fn reads_are_allowed() {
        let packs = PackSet::load(None).unwrap();
        for tool in packs.tools().filter(|t| t.risk == Risk::Read) {
            assert_eq!(decide(tool, &caller()), Decision::Allow, "{}", tool.name);
        }
    }
}
