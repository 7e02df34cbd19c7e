//! A per-runner circuit breaker: closed → open after `threshold` consecutive failures →
//! half-open after a jittered cooldown (one probe call) → closed on success, open again
//! (with a longer cooldown) on failure. One small function per transition.
//!
//! Time comes in as `tokio::time::Instant` (monotonic, and pausable in tests); the breaker
//! itself never reads a clock.

use std::time::Duration;

use tokio::time::Instant;

use crate::util::Backoff;

#[derive(Debug, Clone, PartialEq)]
pub enum State {
    Closed {
        failures: u32,
    },
    Open {
        since: Instant,
        until: Instant,
        reason: String,
        trips: u32,
    },
    /// One probe call is allowed through; others fail fast until it reports.
    HalfOpen {
        probing: bool,
        trips: u32,
        reason: String,
    },
}

#[derive(Debug, Clone)]
pub struct Breaker {
    state: State,
    threshold: u32,
    cooldown: Backoff,
    /// Wall-clock time the breaker opened, for messages (monotonic time has no date).
    opened_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// Why a call may not go through right now.
#[derive(Debug, Clone, PartialEq)]
pub struct Rejection {
    pub reason: String,
    pub since: Option<chrono::DateTime<chrono::Utc>>,
    pub retry_in: Duration,
}

impl Breaker {
    pub(crate) fn new(threshold: u32, cooldown: Backoff) -> Self {
        Breaker {
            state: State::Closed { failures: 0 },
            threshold: threshold.max(1),
            cooldown,
            opened_at: None,
        }
    }

    pub fn state(&self) -> &State {
        &self.state
    }

    /// 0 closed, 1 half-open, 2 open (for metrics).
    pub(crate) fn level(&self) -> u8 {
        match self.state {
            State::Closed { .. } => 0,
            State::HalfOpen { .. } => 1,
            State::Open { .. } => 2,
        }
    }

    pub(crate) fn name(&self) -> &'static str {
        ["closed", "half-open", "open"][self.level() as usize]
    }

    pub(crate) fn opened_at(&self) -> Option<chrono::DateTime<chrono::Utc>> {
        self.opened_at
    }

    /// May a call start now? Moves open → half-open once the cooldown has passed.
    pub(crate) fn admit(&mut self, now: Instant) -> Result<(), Rejection> {
        match &self.state {
            State::Closed { .. } => Ok(()),
            State::Open {
                until,
                reason,
                trips,
                ..
            } => {
                if now >= *until {
                    self.state = State::HalfOpen {
                        probing: true,
                        trips: *trips,
                        reason: reason.clone(),
                    };
                    Ok(())
                } else {
                    Err(Rejection {
                        reason: reason.clone(),
                        since: self.opened_at,
                        retry_in: *until - now,
                    })
                }
            }
            State::HalfOpen {
                probing: true,
                reason,
                ..
            } => Err(Rejection {
                reason: format!("{reason} (a probe call is in flight)"),
                since: self.opened_at,
                retry_in: Duration::from_secs(1),
            }),
            State::HalfOpen {
                probing: false,
                trips,
                reason,
            } => {
                self.state = State::HalfOpen {
                    probing: true,
                    trips: *trips,
                    reason: reason.clone(),
                };
                Ok(())
            }
        }
    }

    pub(crate) fn on_success(&mut self) {
        self.state = State::Closed { failures: 0 };
        self.opened_at = None;
    }

    pub(crate) fn on_failure(&mut self, now: Instant, reason: &str) {
        match &self.state {
            State::Closed { failures } if failures + 1 < self.threshold => {
                self.state = State::Closed {
                    failures: failures + 1,
                };
            }
            State::Closed { .. } => self.trip(now, reason, 0),
            State::HalfOpen { trips, .. } => {
                let trips = *trips + 1;
                self.trip(now, reason, trips)
            }
            // A call admitted before the breaker opened failed late: the breaker stays open.
            State::Open { .. } => {}
        }
    }

    fn trip(&mut self, now: Instant, reason: &str, trips: u32) {
        let cooldown = self
            .cooldown
            .delay(trips)
            .max(self.cooldown.ceiling(trips) / 2);
        self.state = State::Open {
            since: now,
            until: now + cooldown,
            reason: reason.to_owned(),
            trips,
        };
        self.opened_at.get_or_insert_with(chrono::Utc::now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn breaker() -> Breaker {
        Breaker::new(
            3,
            Backoff::try_new(Duration::from_secs(2), Duration::from_secs(60)).unwrap(),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn opens_after_threshold_and_fails_fast() {
        let mut b = breaker();
        let t = Instant::now();
        for _ in 0..2 {
            b.on_failure(t, "connection refused");
            assert!(b.admit(t).is_ok());
        }
        b.on_failure(t, "connection refused");
        let r = b.admit(t).unwrap_err();
        assert_eq!(r.reason, "connection refused");
        assert!(r.since.is_some());
        assert_eq!(b.name(), "open");
    }

    #[tokio::test(start_paused = true)]
    async fn a_success_resets_the_count() {
        let mut b = breaker();
        let t = Instant::now();
        b.on_failure(t, "x");
        b.on_failure(t, "x");
        b.on_success();
        b.on_failure(t, "x");
        b.on_failure(t, "x");
        assert!(b.admit(t).is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn half_open_lets_one_probe_through() {
        let mut b = breaker();
        let t = Instant::now();
        for _ in 0..3 {
            b.on_failure(t, "down");
        }
        tokio::time::advance(Duration::from_secs(3)).await;
        let later = Instant::now();
        assert!(b.admit(later).is_ok(), "cooldown (1–2 s) has passed");
        assert_eq!(b.name(), "half-open");
        assert!(b.admit(later).is_err(), "only one probe at a time");
        b.on_success();
        assert_eq!(b.name(), "closed");
        assert!(b.admit(later).is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_probe_reopens_with_a_longer_cooldown() {
        let mut b = breaker();
        let t = Instant::now();
        for _ in 0..3 {
            b.on_failure(t, "down");
        }
        tokio::time::advance(Duration::from_secs(3)).await;
        let t2 = Instant::now();
        b.admit(t2).unwrap();
        b.on_failure(t2, "still down");
        let State::Open { until, trips, .. } = b.state().clone() else {
            panic!("reopened")
        };
        assert_eq!(trips, 1);
        assert!(
            until - t2 >= Duration::from_secs(2),
            "second cooldown is at least half of 4 s"
        );
        assert_eq!(b.admit(t2).unwrap_err().reason, "still down");
    }
}
