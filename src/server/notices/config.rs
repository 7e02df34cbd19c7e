//! `[notices]` in emisar.toml: the email targets, the escalation groups, the reminders and
//! how often each replica looks for a step that is due; and the checks that name the field
//! and the rule a bad value breaks.

use std::time::Duration;

use serde::Deserialize;

use super::email::EmailConfig;
use crate::server::notices::webhook::WebhookConfig;

/// The longest `after_secs` or `reminder_every_secs` may say: a week, as the longest a request
/// may live (`approval_ttl_secs`).
const MAX_DELAY_SECS: u64 = 7 * 24 * 3600;
/// `check_every_ms` bounds: often enough for a test's one-second escalation, never a busy loop.
const CHECK_EVERY_MS: std::ops::RangeInclusive<u64> = 100..=60_000;

/// `[notices]`: who hears about approval requests and grants, when, and how often again (a
/// break-glass window's notices go to every group at once).
#[derive(schemars::JsonSchema, Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoticesConfig {
    /// Email targets: one `[[notices.email]]` table each (SMTP). Default: none.
    #[serde(default)]
    pub email: Vec<EmailConfig>,
    /// Groups of targets in order, each told `after_secs` after the request was made if
    /// nobody has decided by then: `[[notices.escalation]]` with `after_secs` and `targets`
    /// (target names: a webhook's or email's `name`, else `webhooks[0]`,
    /// `notices.email[0]`…). Default: one group, every target, at once.
    #[serde(default)]
    pub escalation: Vec<EscalationGroup>,
    /// Remind every group told so far, every this many seconds after the request was made,
    /// until it is decided or expires (1 to 604800), e.g. `reminder_every_secs = 600`.
    /// Default: no reminders.
    #[serde(default)]
    pub reminder_every_secs: Option<u64>,
    /// How often each replica looks for a step that is due, in milliseconds (100 to 60000);
    /// a new request and every decision are looked at as they happen. Default 5000.
    #[serde(default = "default_check_every_ms")]
    pub check_every_ms: u64,
}

impl Default for NoticesConfig {
    fn default() -> Self {
        NoticesConfig {
            email: Vec::new(),
            escalation: Vec::new(),
            reminder_every_secs: None,
            check_every_ms: default_check_every_ms(),
        }
    }
}

fn default_check_every_ms() -> u64 {
    5_000
}

/// One `[[notices.escalation]]` group.
#[derive(schemars::JsonSchema, Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EscalationGroup {
    /// Seconds after the request was made (0 to 604800; each group later than the one
    /// before), e.g. `after_secs = 900`.
    pub after_secs: u64,
    /// The targets told, by name, e.g. `targets = ["oncall-slack", "oncall-mail"]`.
    pub targets: Vec<String>,
}

/// A group as the schedule uses it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Group {
    pub after: Duration,
    pub targets: Vec<String>,
}

/// The name of webhook `i`: its `name`, else `webhooks[i]`.
pub(crate) fn webhook_name(i: usize, hook: &WebhookConfig) -> String {
    hook.name
        .clone()
        .unwrap_or_else(|| format!("webhooks[{i}]"))
}

/// The name of email target `i`: its `name`, else `notices.email[i]`.
pub(crate) fn email_name(i: usize, email: &EmailConfig) -> String {
    email
        .name
        .clone()
        .unwrap_or_else(|| format!("notices.email[{i}]"))
}

impl NoticesConfig {
    /// Every target's name, webhooks first, in the order of the config.
    pub(crate) fn target_names(&self, webhooks: &[WebhookConfig]) -> Vec<String> {
        let hooks = webhooks.iter().enumerate().map(|(i, h)| webhook_name(i, h));
        let emails = self.email.iter().enumerate().map(|(i, e)| email_name(i, e));
        hooks.chain(emails).collect()
    }

    /// The groups in order: the configured ones, or every target at once when none is.
    pub(crate) fn groups(&self, webhooks: &[WebhookConfig]) -> Vec<Group> {
        if self.escalation.is_empty() {
            let targets = self.target_names(webhooks);
            if targets.is_empty() {
                return Vec::new();
            }
            return vec![Group {
                after: Duration::ZERO,
                targets,
            }];
        }
        self.escalation
            .iter()
            .map(|g| Group {
                after: Duration::from_secs(g.after_secs),
                targets: g.targets.clone(),
            })
            .collect()
    }

    /// Checks what serde cannot; each error names the field and the rule it broke.
    pub(crate) fn check(
        &self,
        webhooks: &[WebhookConfig],
        public_url: Option<&str>,
    ) -> Result<(), String> {
        for (i, email) in self.email.iter().enumerate() {
            email.check(&format!("notices.email[{i}]"))?;
        }
        let names = self.target_names(webhooks);
        check_unique_names(&names)?;
        self.check_escalation(&names)?;
        if let Some(every) = self.reminder_every_secs
            && !(1..=MAX_DELAY_SECS).contains(&every)
        {
            return Err(format!(
                "notices.reminder_every_secs: must be between 1 and {MAX_DELAY_SECS}, not {every}"
            ));
        }
        if !CHECK_EVERY_MS.contains(&self.check_every_ms) {
            return Err(format!(
                "notices.check_every_ms: must be between {} and {}, not {}",
                CHECK_EVERY_MS.start(),
                CHECK_EVERY_MS.end(),
                self.check_every_ms
            ));
        }
        if !names.is_empty() && public_url.is_none() {
            return Err(
                "public_url: must be set when webhooks or notices.email are: every notice links to the approval page"
                    .into(),
            );
        }
        Ok(())
    }

    fn check_escalation(&self, names: &[String]) -> Result<(), String> {
        let mut previous: Option<u64> = None;
        for (i, group) in self.escalation.iter().enumerate() {
            let field = format!("notices.escalation[{i}]");
            if group.after_secs > MAX_DELAY_SECS {
                return Err(format!(
                    "{field}.after_secs: must be at most {MAX_DELAY_SECS}, not {}",
                    group.after_secs
                ));
            }
            if previous.is_some_and(|p| group.after_secs <= p) {
                return Err(format!(
                    "{field}.after_secs: must be later than the group before ({} s)",
                    previous.unwrap_or_default()
                ));
            }
            previous = Some(group.after_secs);
            if group.targets.is_empty() {
                return Err(format!("{field}.targets: must name at least one target"));
            }
            for (j, target) in group.targets.iter().enumerate() {
                if !names.contains(target) {
                    return Err(format!(
                        "{field}.targets[{j}]: `{}` is not a target (known: {})",
                        target.escape_debug(),
                        names.join(", ")
                    ));
                }
            }
        }
        Ok(())
    }
}

fn check_unique_names(names: &[String]) -> Result<(), String> {
    let mut seen = std::collections::BTreeSet::new();
    for name in names {
        if name.is_empty() || name.chars().any(char::is_control) {
            return Err(format!(
                "target name `{}`: must be non-empty without control characters",
                name.escape_debug()
            ));
        }
        if !seen.insert(name) {
            return Err(format!(
                "target name `{}`: two targets have it; names must be unique",
                name.escape_debug()
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> NoticesConfig {
        toml::from_str(text).unwrap()
    }

    fn hooks() -> Vec<WebhookConfig> {
        toml::from_str::<toml::Table>(
            "[[h]]\nurl = \"https://hooks.example/a\"\nname = \"slack\"\n[[h]]\nurl = \"https://hooks.example/b\"",
        )
        .unwrap()["h"]
            .clone()
            .try_into()
            .unwrap()
    }

    const MAIL: &str = "[[email]]\nhost = \"smtp.example\"\nfrom = \"emisar@example.com\"\nto = [\"ops@example.com\"]\n";

    #[test]
    fn without_escalation_every_target_is_one_group_at_once() {
        let c = config(MAIL);
        c.check(&hooks(), Some("https://e.example")).unwrap();
        assert_eq!(
            c.groups(&hooks()),
            [Group {
                after: Duration::ZERO,
                targets: vec![
                    "slack".into(),
                    "webhooks[1]".into(),
                    "notices.email[0]".into()
                ],
            }]
        );
    }

    #[test]
    fn errors_name_the_field_and_the_rule() {
        let cases = [
            (
                "[[escalation]]\nafter_secs = 0\ntargets = [\"slack\"]\n[[escalation]]\nafter_secs = 0\ntargets = [\"webhooks[1]\"]",
                "notices.escalation[1].after_secs: must be later than the group before (0 s)",
            ),
            (
                "[[escalation]]\nafter_secs = 0\ntargets = [\"slack\", \"pager\"]",
                "notices.escalation[0].targets[1]: `pager` is not a target",
            ),
            (
                "[[escalation]]\nafter_secs = 0\ntargets = []",
                "notices.escalation[0].targets: must name at least one target",
            ),
            (
                "[[escalation]]\nafter_secs = 604801\ntargets = [\"slack\"]",
                "notices.escalation[0].after_secs: must be at most 604800",
            ),
            (
                "reminder_every_secs = 0",
                "notices.reminder_every_secs: must be between 1 and 604800, not 0",
            ),
            (
                "check_every_ms = 10",
                "notices.check_every_ms: must be between 100 and 60000, not 10",
            ),
        ];
        for (text, want) in cases {
            let err = config(text)
                .check(&hooks(), Some("https://e.example"))
                .unwrap_err();
            assert!(err.starts_with(want), "{text}: {err}");
        }
        let err = config("").check(&hooks(), None).unwrap_err();
        assert!(err.starts_with("public_url: must be set"), "{err}");
        let mut twice = hooks();
        twice[1].name = Some("slack".into());
        let err = config("")
            .check(&twice, Some("https://e.example"))
            .unwrap_err();
        assert!(err.contains("`slack`: two targets have it"), "{err}");
    }
}
