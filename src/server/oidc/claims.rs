//! From verified claims to emisar's names: a person's audit identity (`person:<value>`), the
//! roles their groups grant, an agent's name and the person it acts for.
//!
//! *Invariants:* only claims of a token whose signature and registered claims were verified
//! reach this module; every name it returns has passed a shape check (no control characters or
//! whitespace, bounded length), since it is written to the audit log and shown in the portal;
//! an unmapped or malformed group grants nothing rather than failing the sign-in.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::config::PersonRole;
use super::jwt::Claims;

pub use crate::server::principal::PERSON_PREFIX;

/// The longest identity value accepted, in bytes.
pub(crate) const MAX_NAME_LEN: usize = 255;
/// Groups beyond this many in one claim are ignored.
const MAX_GROUPS: usize = 1000;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimError {
    #[error("the token has no `{0}` claim")]
    Missing(String),
    #[error("the token's `{claim}` claim {rule}")]
    Invalid { claim: String, rule: &'static str },
}

/// The value at `path`: the claim named exactly `path` when there is one (claim names may
/// contain dots, e.g. namespaced URLs), otherwise the dotted path through nested objects
/// (`realm_access.roles`).
pub(crate) fn claim_at<'a>(claims: &'a Claims, path: &str) -> Option<&'a Value> {
    if let Some(v) = claims.get(path) {
        return Some(v);
    }
    let mut parts = path.split('.');
    let mut value = claims.get(parts.next()?)?;
    for part in parts {
        value = value.as_object()?.get(part)?;
    }
    Some(value)
}

/// A claim as a list of strings: a string is one entry, an array gives its string entries
/// (others skipped), anything else gives none.
pub(crate) fn strings(value: Option<&Value>) -> Vec<&str> {
    match value {
        Some(Value::String(s)) => vec![s.as_str()],
        Some(Value::Array(items)) => items
            .iter()
            .take(MAX_GROUPS)
            .filter_map(Value::as_str)
            .collect(),
        _ => Vec::new(),
    }
}

/// The roles granted by the groups in `roles_claim`; none when the claim is absent or no
/// group is mapped.
pub(crate) fn roles_for(
    claims: &Claims,
    roles_claim: &str,
    group_roles: &BTreeMap<&str, BTreeSet<PersonRole>>,
) -> BTreeSet<PersonRole> {
    strings(claim_at(claims, roles_claim))
        .into_iter()
        .filter_map(|g| group_roles.get(g))
        .flatten()
        .copied()
        .collect()
}

/// A name fit for the audit log: 1 to [`MAX_NAME_LEN`] bytes, no whitespace or control
/// characters.
pub(crate) fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_NAME_LEN
        && !s.chars().any(|c| c.is_control() || c.is_whitespace())
}

fn string_claim<'a>(claims: &'a Claims, claim: &str) -> Result<&'a str, ClaimError> {
    match claim_at(claims, claim) {
        None | Some(Value::Null) => Err(ClaimError::Missing(claim.to_owned())),
        Some(Value::String(s)) if is_name(s) => Ok(s),
        Some(Value::String(_)) => Err(ClaimError::Invalid {
            claim: claim.to_owned(),
            rule: "must be 1 to 255 bytes without spaces or control characters",
        }),
        Some(_) => Err(ClaimError::Invalid {
            claim: claim.to_owned(),
            rule: "must be a string",
        }),
    }
}

/// The person's identity in the audit log: `person:<value of identity_claim>`.
pub(crate) fn person_identity(claims: &Claims, identity_claim: &str) -> Result<String, ClaimError> {
    Ok(format!(
        "{PERSON_PREFIX}{}",
        string_claim(claims, identity_claim)?
    ))
}

/// The agent named by `agent_claim`: it must be an agent name the policy can know (an
/// identifier: letters, digits, `_ . @ -`, starting with a letter or digit, at most 128).
pub(crate) fn agent_name(claims: &Claims, agent_claim: &str) -> Result<String, ClaimError> {
    let name = string_claim(claims, agent_claim)?;
    if !crate::util::input::is_identifier(name) {
        return Err(ClaimError::Invalid {
            claim: agent_claim.to_owned(),
            rule: "must be an agent name: letters, digits, `_ . @ -`, starting with a letter or digit, at most 128",
        });
    }
    Ok(name.to_owned())
}

/// The person an agent acts for, `person:<value>`, when the claim is configured. A configured
/// claim that is absent from the token means the agent acts for nobody (a headless agent);
/// one that is present but malformed is an error.
pub(crate) fn on_behalf_of(
    claims: &Claims,
    claim: Option<&str>,
) -> Result<Option<String>, ClaimError> {
    let Some(claim) = claim else { return Ok(None) };
    match person_identity(claims, claim) {
        Ok(p) => Ok(Some(p)),
        Err(ClaimError::Missing(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn claims(v: Value) -> Claims {
        v.as_object().unwrap().clone()
    }

    fn mapping() -> BTreeMap<&'static str, BTreeSet<PersonRole>> {
        BTreeMap::from([
            ("ops", BTreeSet::from([PersonRole::Approver])),
            ("audit", BTreeSet::from([PersonRole::Auditor])),
            (
                "sre",
                BTreeSet::from([PersonRole::Approver, PersonRole::Admin]),
            ),
        ])
    }

    #[test]
    fn groups_from_an_array_a_string_or_a_nested_path() {
        let c = claims(json!({"groups": ["ops", "other", 7, "audit"]}));
        assert_eq!(
            roles_for(&c, "groups", &mapping()),
            BTreeSet::from([PersonRole::Approver, PersonRole::Auditor])
        );
        let c = claims(json!({"groups": "sre"}));
        assert_eq!(
            roles_for(&c, "groups", &mapping()),
            BTreeSet::from([PersonRole::Approver, PersonRole::Admin])
        );
        let c = claims(json!({"realm_access": {"roles": ["audit"]}}));
        assert_eq!(
            roles_for(&c, "realm_access.roles", &mapping()),
            BTreeSet::from([PersonRole::Auditor])
        );
        let c = claims(json!({"https://example.com/groups": ["ops"]}));
        assert_eq!(
            roles_for(&c, "https://example.com/groups", &mapping()),
            BTreeSet::from([PersonRole::Approver])
        );
    }

    #[test]
    fn no_mapped_group_means_no_role() {
        for c in [
            json!({}),
            json!({"groups": ["nobody"]}),
            json!({"groups": {"ops": true}}),
            json!({"groups": null}),
            json!({"groups": ["OPS", "ops "]}),
        ] {
            assert!(roles_for(&claims(c), "groups", &mapping()).is_empty());
        }
    }

    #[test]
    fn identities_are_checked_at_the_door() {
        let c = claims(
            json!({"sub": "a1b2", "preferred_username": "alice@example.com",
                              "bad": "ali ce", "num": 5, "nl": "a\nb", "empty": ""}),
        );
        assert_eq!(person_identity(&c, "sub").unwrap(), "person:a1b2");
        assert_eq!(
            person_identity(&c, "preferred_username").unwrap(),
            "person:alice@example.com"
        );
        for (claim, want) in [
            ("bad", "without spaces"),
            ("nl", "without spaces or control"),
            ("empty", "1 to 255 bytes"),
            ("num", "must be a string"),
            ("missing", "has no `missing` claim"),
        ] {
            let e = person_identity(&c, claim).unwrap_err().to_string();
            assert!(e.contains(want), "{claim}: {e}");
        }
    }

    #[test]
    fn agents_must_be_policy_names() {
        let c = claims(json!({"client_id": "deploy-bot", "weird": "bot/../x", "sub": "u1"}));
        assert_eq!(agent_name(&c, "client_id").unwrap(), "deploy-bot");
        assert!(
            agent_name(&c, "weird")
                .unwrap_err()
                .to_string()
                .contains("must be an agent name")
        );
        assert_eq!(on_behalf_of(&c, None).unwrap(), None);
        assert_eq!(on_behalf_of(&c, Some("act_for")).unwrap(), None);
        assert_eq!(
            on_behalf_of(&c, Some("sub")).unwrap().as_deref(),
            Some("person:u1")
        );
        assert!(on_behalf_of(&c, Some("weird")).is_ok());
        let bad = claims(json!({"act_for": ["x"]}));
        assert!(on_behalf_of(&bad, Some("act_for")).is_err());
    }

    proptest! {
        /// Whatever the provider puts in the claim, only exact, mapped group names grant roles,
        /// and identities that come out are always printable, bounded names.
        #[test]
        fn arbitrary_claims_grant_only_mapped_roles(
            groups in proptest::collection::vec(any::<String>(), 0..20),
            name in any::<String>(),
        ) {
            let c = claims(json!({"groups": groups.clone(), "name": name}));
            let roles = roles_for(&c, "groups", &mapping());
            let mut want = BTreeSet::new();
            for g in &groups {
                if let Some(r) = mapping().get(g.as_str()) { want.extend(r.iter().copied()); }
            }
            prop_assert_eq!(roles, want);
            if let Ok(p) = person_identity(&c, "name") {
                let v = p.strip_prefix("person:").unwrap();
                prop_assert!(is_name(v));
            }
        }
    }
}
