//! The audit filters as people and programs give them (text: the query string of
//! `GET /api/audit`, the flags of `emisar audit query|export`), and the one function that
//! turns them into an [`AuditFilter`] or says which field is wrong.
//!
//! Invariant: the HTTP API and the CLI build their filters here and nowhere else, so both
//! accept and refuse the same input, and the CLI can send the same params to the API.

use super::store::AuditFilter;

/// Every event kind the server writes: a `kind` filter outside this list is refused (it
/// would silently match nothing).
pub const KINDS: &[&str] = &[
    super::kind::TOOL_CALLED,
    super::kind::TOOL_REJECTED,
    super::kind::CALL_EXECUTED,
    super::kind::CALL_FAILED,
    super::kind::CALL_UNKNOWN,
    super::kind::TOKEN_ISSUED,
    super::kind::TOKEN_REVOKED,
    super::kind::SERVER_STARTED,
    super::kind::APPROVAL_REQUESTED,
    super::kind::APPROVAL_APPROVED,
    super::kind::APPROVAL_DENIED,
    super::kind::APPROVAL_EXPIRED,
    super::kind::APPROVAL_WITHDRAWN,
    super::kind::APPROVAL_EXECUTING,
    super::kind::TASK_CREATED,
    super::kind::ROLLOUT_WAVE,
    super::kind::ROLLOUT_GATE,
    super::kind::ROLLOUT_HALTED,
    super::kind::ROLLOUT_DECISION_PROPOSED,
    super::kind::ROLLOUT_DECIDED,
    super::kind::BREAK_GLASS_REVIEWED,
    super::kind::POLICY_LOADED,
    super::kind::USER_ADDED,
    super::kind::USER_REMOVED,
    super::kind::USER_ROLE_CHANGED,
    super::kind::USER_PASSWORD_CHANGED,
    super::kind::LOGIN,
    super::kind::LOGIN_FAILED,
    super::kind::LOGOUT,
    super::kind::JOIN_TOKEN_ISSUED,
    super::kind::JOIN_TOKEN_REVOKED,
    super::kind::RUNNER_JOINED,
    super::kind::RUNNER_JOIN_REFUSED,
    super::kind::RUNNER_REGISTERED,
    super::kind::RUNNER_REMOVED,
    super::kind::PASSKEY_REGISTERED,
    super::kind::PASSKEY_REMOVED,
    super::kind::PASSKEY_SIGN_COUNT_REFUSED,
    super::kind::REFUSAL_REPEATED,
    super::kind::WITNESS_REFUSED,
    super::kind::GRANT_REQUESTED,
    super::kind::GRANT_SIGNED,
    super::kind::GRANT_ACTIVE,
    super::kind::GRANT_USED,
    super::kind::GRANT_REVOKED,
    super::kind::GRANT_REVOCATION_DELIVERED,
    super::kind::GRANT_EXPIRED,
];

/// Every outcome an event records.
pub const OUTCOMES: &[&str] = &["ok", "refused", "error"];

/// The longest text filter accepted.
const MAX_FILTER_CHARS: usize = 256;
/// The longest page one query returns.
pub const MAX_PAGE: i64 = 1000;

/// The filters as text. Every one is optional; `cursor` is the `next_cursor` of the previous
/// page.
#[derive(Debug, Clone, Default, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct AuditParams {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub until: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub actor: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runner: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approval_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cursor: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<i64>,
}

impl AuditFilter {
    /// The filter `params` ask for, or a message naming the field and the rule it broke.
    pub(crate) fn from_params(
        params: AuditParams,
        default_limit: i64,
    ) -> Result<AuditFilter, String> {
        let q = params;
        let time = |field: &str,
                    v: &Option<String>|
         -> Result<Option<chrono::DateTime<chrono::Utc>>, String> {
            v.as_deref()
                .map(|t| {
                    chrono::DateTime::parse_from_rfc3339(t)
                        .map(|t| t.with_timezone(&chrono::Utc))
                        .map_err(|e| {
                            format!(
                                "`{field}` must be an RFC 3339 time such as 2026-11-30T00:00:00Z: {e}"
                            )
                        })
                })
                .transpose()
        };
        let since = time("since", &q.since)?;
        let until = time("until", &q.until)?;
        let after_seq = match q.cursor.as_deref().map(str::parse::<i64>) {
            None => None,
            Some(Ok(n)) if n >= 0 => Some(n),
            Some(_) => {
                return Err("`cursor` must be the next_cursor of a previous page".into());
            }
        };
        // Filters are compared with stored text; one that holds NUL or is longer than
        // anything stored is refused here rather than by the store (which would fail).
        for (field, value) in [
            ("tool", &q.tool),
            ("runner", &q.runner),
            ("actor", &q.actor),
            ("kind", &q.kind),
            ("call_id", &q.call_id),
            ("approval_id", &q.approval_id),
            ("outcome", &q.outcome),
        ] {
            if let Some(v) = value {
                crate::util::input::line(field, v, MAX_FILTER_CHARS)?;
            }
        }
        if let Some(k) = &q.kind
            && !KINDS.contains(&k.as_str())
        {
            return Err(format!(
                "`kind` `{k}` is not an event kind; the kinds are: {}",
                KINDS.join(", ")
            ));
        }
        if let Some(o) = &q.outcome
            && !OUTCOMES.contains(&o.as_str())
        {
            return Err(format!(
                "`outcome` `{o}` is not an outcome; the outcomes are: {}",
                OUTCOMES.join(", ")
            ));
        }
        let limit = q.limit.unwrap_or(default_limit);
        if !(1..=MAX_PAGE).contains(&limit) {
            return Err(format!("`limit` must be between 1 and {MAX_PAGE}"));
        }
        Ok(AuditFilter {
            tool: q.tool,
            runner: q.runner,
            actor: q.actor,
            kind: q.kind,
            call_id: q.call_id,
            approval_id: q.approval_id,
            outcome: q.outcome,
            since,
            until,
            after_seq,
            limit,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_kinds_and_outcomes_list_the_valid_ones() {
        let err = AuditFilter::from_params(
            AuditParams {
                kind: Some("bogus".into()),
                ..Default::default()
            },
            100,
        )
        .unwrap_err();
        assert!(
            err.starts_with("`kind` `bogus` is not an event kind")
                && err.contains("tool.rejected")
                && err.contains("runner.joined"),
            "{err}"
        );
        let err = AuditFilter::from_params(
            AuditParams {
                outcome: Some("fine".into()),
                ..Default::default()
            },
            100,
        )
        .unwrap_err();
        assert!(
            err.contains("the outcomes are: ok, refused, error"),
            "{err}"
        );
        let f = AuditFilter::from_params(
            AuditParams {
                kind: Some("tool.called".into()),
                outcome: Some("ok".into()),
                since: Some("2026-11-30T00:00:00Z".into()),
                cursor: Some("7".into()),
                ..Default::default()
            },
            100,
        )
        .unwrap();
        assert_eq!((f.after_seq, f.limit), (Some(7), 100));
        assert!(f.since.is_some());
    }
}
