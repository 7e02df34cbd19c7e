//! The notice schedule of one request, as a pure function of how long it has waited: which
//! steps are due (each escalation group, the latest reminder, the expiry) and who each one
//! goes to. The store's claims (`claims.rs`) make each step go out once.

use std::time::Duration;

use super::config::Group;

/// One step of a request's schedule. Its [`Step::key`] is what the store claims.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    /// Escalation group `i` is told of the request.
    Group(usize),
    /// Reminder `k`, due `k` reminder intervals after the request was made.
    Reminder(u64),
    /// The request expired unanswered.
    Expired,
}

impl Step {
    /// The step's claim key: `group:0`, `reminder:3`, `expired`.
    pub(crate) fn key(&self) -> String {
        match self {
            Step::Group(i) => format!("group:{i}"),
            Step::Reminder(k) => format!("reminder:{k}"),
            Step::Expired => "expired".into(),
        }
    }
}

/// The groups in order and the reminder interval.
#[derive(Debug, Clone)]
pub(crate) struct Schedule {
    pub groups: Vec<Group>,
    pub reminder_every: Option<Duration>,
}

impl Schedule {
    /// The steps due for a pending request that has waited `waited`: every group whose delay
    /// has passed, and the latest reminder (one missed while no replica ran is not sent late).
    pub(crate) fn due(&self, waited: Duration) -> Vec<Step> {
        let mut steps: Vec<Step> = (0..self.groups.len())
            .filter(|&i| self.groups[i].after <= waited)
            .map(Step::Group)
            .collect();
        if let Some(every) = self.reminder_every.filter(|e| !e.is_zero()) {
            let k = (waited.as_millis() / every.as_millis()) as u64;
            if k >= 1 {
                steps.push(Step::Reminder(k));
            }
        }
        steps
    }

    /// Who `step` goes to. A group: its own targets. A reminder: every group told before it
    /// was due (a group told at the same moment has just heard). The expiry: every group told
    /// before the request expired after `waited`.
    pub(crate) fn targets(&self, step: &Step, waited: Duration) -> Vec<String> {
        match step {
            Step::Group(i) => self
                .groups
                .get(*i)
                .map(|g| g.targets.clone())
                .unwrap_or_default(),
            Step::Reminder(k) => {
                let at = self.reminder_every.unwrap_or_default() * (*k as u32);
                self.told_before(|after| after < at)
            }
            Step::Expired => self.told_before(|after| after <= waited),
        }
    }

    /// Every group's targets, each once, in order: who hears of an emergency at once.
    pub(crate) fn everyone(&self) -> Vec<String> {
        self.told_before(|_| true)
    }

    /// The targets of every group whose delay `passed`, each once, in order.
    fn told_before(&self, passed: impl Fn(Duration) -> bool) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for group in self.groups.iter().filter(|g| passed(g.after)) {
            for target in &group.targets {
                if !out.contains(target) {
                    out.push(target.clone());
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schedule() -> Schedule {
        let group = |secs, targets: &[&str]| Group {
            after: Duration::from_secs(secs),
            targets: targets.iter().map(|t| t.to_string()).collect(),
        };
        Schedule {
            groups: vec![group(0, &["slack"]), group(600, &["mail", "slack"])],
            reminder_every: Some(Duration::from_secs(600)),
        }
    }

    #[test]
    fn groups_come_in_order_and_reminders_one_at_a_time() {
        let s = schedule();
        let secs = Duration::from_secs;
        assert_eq!(s.due(secs(0)), [Step::Group(0)]);
        assert_eq!(s.due(secs(599)), [Step::Group(0)]);
        assert_eq!(
            s.due(secs(600)),
            [Step::Group(0), Step::Group(1), Step::Reminder(1)]
        );
        // Only the latest reminder: two missed ones are not sent late.
        assert_eq!(s.due(secs(1850))[2], Step::Reminder(3));
        assert_eq!(s.targets(&Step::Group(1), secs(600)), ["mail", "slack"]);
        // The first reminder falls with the second group: only the first hears it again.
        assert_eq!(s.targets(&Step::Reminder(1), secs(600)), ["slack"]);
        assert_eq!(s.targets(&Step::Reminder(2), secs(1200)), ["slack", "mail"]);
        assert_eq!(s.targets(&Step::Expired, secs(300)), ["slack"]);
        assert_eq!(s.targets(&Step::Expired, secs(900)), ["slack", "mail"]);
        let keys: Vec<String> = [Step::Group(1), Step::Reminder(2), Step::Expired]
            .iter()
            .map(Step::key)
            .collect();
        assert_eq!(keys, ["group:1", "reminder:2", "expired"]);
        assert_eq!(s.everyone(), ["slack", "mail"]);
    }
}
