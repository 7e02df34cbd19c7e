//! Keeps a run of failed audit appends to a few log lines instead of one per failure: the
//! first failure with its error, then one summary with counts per interval while failures go
//! on, then one line when an append succeeds again. The audit writer summarises its failed
//! batches with it, and the call path its failed read appends (one per refused read while the
//! store is down: thousands a minute under load).
//!
//! *Invariant:* what is logged is decided by [`FailureLog`], which reads no clock (the caller
//! gives `now`), so the decision is unit-tested without waiting.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// While appends keep failing, one log line per this interval.
pub(crate) const SUMMARY_INTERVAL: Duration = Duration::from_secs(10);

/// How one kind of failure reads in the log.
#[derive(Debug)]
pub(crate) struct Wording {
    /// The first failure of a run, with its error: "audit batch not written".
    pub failed: &'static str,
    /// What keeps failing, as the summaries name it: "audit writes".
    pub what: &'static str,
    /// What one failure is, plural: "batches".
    pub units: &'static str,
}

/// The decision: which line, if any, a failure or a success calls for.
#[derive(Debug)]
pub(crate) struct FailureLog {
    interval: Duration,
    outage: Option<Outage>,
}

#[derive(Debug)]
struct Outage {
    since: Instant,
    last_line: Instant,
    units: u64,
    events: u64,
    /// Failed since the last line was logged.
    recent_units: u64,
    recent_events: u64,
}

#[derive(Debug, PartialEq)]
pub(crate) enum Line {
    /// The first failure of a run.
    Failed,
    StillFailing {
        units: u64,
        events: u64,
        for_secs: u64,
    },
    Recovered {
        units: u64,
        events: u64,
        after_secs: u64,
    },
}

impl FailureLog {
    pub(crate) fn new(interval: Duration) -> Self {
        FailureLog {
            interval,
            outage: None,
        }
    }

    /// One more failure (of `events` events) at `now`.
    pub(crate) fn failed(&mut self, now: Instant, events: usize) -> Option<Line> {
        let events = events as u64;
        let Some(o) = &mut self.outage else {
            self.outage = Some(Outage {
                since: now,
                last_line: now,
                units: 1,
                events,
                recent_units: 0,
                recent_events: 0,
            });
            return Some(Line::Failed);
        };
        o.units += 1;
        o.events += events;
        o.recent_units += 1;
        o.recent_events += events;
        if now.duration_since(o.last_line) < self.interval {
            return None;
        }
        let line = Line::StillFailing {
            units: o.recent_units,
            events: o.recent_events,
            for_secs: now.duration_since(o.since).as_secs(),
        };
        o.last_line = now;
        o.recent_units = 0;
        o.recent_events = 0;
        Some(line)
    }

    /// A success at `now`: closes the run, if there was one.
    pub(crate) fn written(&mut self, now: Instant) -> Option<Line> {
        self.outage.take().map(|o| Line::Recovered {
            units: o.units,
            events: o.events,
            after_secs: now.duration_since(o.since).as_secs(),
        })
    }
}

impl Line {
    /// Logs the line in `wording`; `error` is the failure's (unused by `Recovered`).
    pub(crate) fn log(&self, wording: &Wording, error: &str) {
        let Wording {
            failed,
            what,
            units: unit_name,
        } = wording;
        match self {
            Line::Failed => tracing::error!(
                error,
                "{failed}; while {what} keep failing, one summary every {}s",
                SUMMARY_INTERVAL.as_secs()
            ),
            Line::StillFailing {
                units,
                events,
                for_secs,
            } => tracing::error!(
                error,
                units,
                events,
                "{what} still failing for {for_secs}s: {units} more {unit_name} ({events} events) not written"
            ),
            Line::Recovered {
                units,
                events,
                after_secs,
            } => tracing::warn!(
                units,
                events,
                "{what} recovered after {after_secs}s; {units} {unit_name} ({events} events) were not written meanwhile"
            ),
        }
    }
}

/// A [`FailureLog`] that many tasks report to at once (the call path's reads). A success
/// costs one atomic load while nothing is failing, so the path that succeeds takes no lock.
#[derive(Debug)]
pub(crate) struct SharedFailureLog {
    wording: &'static Wording,
    failing: AtomicBool,
    log: Mutex<FailureLog>,
}

impl SharedFailureLog {
    pub(crate) fn new(wording: &'static Wording, interval: Duration) -> Self {
        SharedFailureLog {
            wording,
            failing: AtomicBool::new(false),
            log: Mutex::new(FailureLog::new(interval)),
        }
    }

    /// A failure of `events` events, with its error.
    pub(crate) fn failed(&self, events: usize, error: &str) {
        let line = {
            let mut log = self.log.lock().unwrap_or_else(|p| p.into_inner());
            self.failing.store(true, Ordering::Release);
            log.failed(Instant::now(), events)
        };
        if let Some(line) = line {
            line.log(self.wording, error);
        }
    }

    /// A success: says the failures ended, if they were going on.
    pub(crate) fn written(&self) {
        if !self.failing.load(Ordering::Acquire) {
            return;
        }
        let line = {
            let mut log = self.log.lock().unwrap_or_else(|p| p.into_inner());
            self.failing.store(false, Ordering::Release);
            log.written(Instant::now())
        };
        if let Some(line) = line {
            line.log(self.wording, "");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outage_is_logged_once_then_summarised_then_closed() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut log = FailureLog::new(s(10));
        assert_eq!(log.written(t0), None, "nothing to say while all is well");
        assert_eq!(log.failed(t0, 3), Some(Line::Failed));
        // A thousand failures within the interval: silence.
        for i in 0..1000 {
            assert_eq!(log.failed(t0 + Duration::from_millis(i * 9), 2), None);
        }
        assert_eq!(
            log.failed(t0 + s(10), 1),
            Some(Line::StillFailing {
                units: 1001,
                events: 2001,
                for_secs: 10
            })
        );
        assert_eq!(log.failed(t0 + s(15), 1), None);
        assert_eq!(
            log.failed(t0 + s(20), 1),
            Some(Line::StillFailing {
                units: 2,
                events: 2,
                for_secs: 20
            })
        );
        assert_eq!(
            log.written(t0 + s(21)),
            Some(Line::Recovered {
                units: 1004,
                events: 2006,
                after_secs: 21
            })
        );
        assert_eq!(log.written(t0 + s(22)), None);
        assert_eq!(
            log.failed(t0 + s(30), 1),
            Some(Line::Failed),
            "a new outage"
        );
    }

    #[test]
    fn a_shared_log_closes_its_outage_once() {
        static WORDING: Wording = Wording {
            failed: "x not written",
            what: "x writes",
            units: "xs",
        };
        let shared = SharedFailureLog::new(&WORDING, Duration::from_secs(10));
        shared.written();
        assert!(shared.log.lock().unwrap().outage.is_none());
        shared.failed(2, "down");
        shared.failed(2, "down");
        assert!(shared.failing.load(Ordering::Acquire));
        assert_eq!(shared.log.lock().unwrap().outage.as_ref().unwrap().units, 2);
        shared.written();
        assert!(!shared.failing.load(Ordering::Acquire));
        assert!(shared.log.lock().unwrap().outage.is_none());
    }
}
