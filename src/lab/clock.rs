//! Lab time: the wall clock at start-up plus the real time elapsed since, times a speed,
//! plus whatever a test advanced it by.
//!
//! Everything that changes with time in the lab (Nomad's restart counts, uptimes, BGP
//! session ages) reads this clock, so a test freezes it (speed 0) and advances it instead of
//! sleeping, and a demo can run it faster than real time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

#[derive(Debug)]
pub struct LabClock {
    started_real: Instant,
    started_wall: SystemTime,
    speed: f64,
    /// Added by `advance`, in milliseconds.
    offset_ms: AtomicU64,
}

impl LabClock {
    /// Lab time runs `speed` times as fast as real time (0 freezes it). The speed must be a
    /// finite number from 0 to 1000.
    pub fn new(speed: f64) -> Result<LabClock, String> {
        if !speed.is_finite() || !(0.0..=1000.0).contains(&speed) {
            return Err(format!(
                "speed must be a number from 0 (frozen) to 1000, got {speed}"
            ));
        }
        Ok(LabClock {
            started_real: Instant::now(),
            started_wall: SystemTime::now(),
            speed,
            offset_ms: AtomicU64::new(0),
        })
    }

    /// Real time.
    pub fn real() -> LabClock {
        LabClock::new(1.0).expect("1 is a valid speed")
    }

    /// Time stands still until advanced.
    pub fn frozen() -> LabClock {
        LabClock::new(0.0).expect("0 is a valid speed")
    }

    /// The wall-clock time the lab started at (lab time 0).
    pub fn started(&self) -> SystemTime {
        self.started_wall
    }

    pub fn speed(&self) -> f64 {
        self.speed
    }

    /// The current lab time.
    pub fn now(&self) -> SystemTime {
        self.started_wall + self.elapsed()
    }

    /// Lab time since the start.
    pub fn elapsed(&self) -> Duration {
        self.started_real.elapsed().mul_f64(self.speed)
            + Duration::from_millis(self.offset_ms.load(Ordering::SeqCst))
    }

    /// Moves lab time forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.offset_ms
            .fetch_add(by.as_millis() as u64, Ordering::SeqCst);
    }
}

/// Seconds since the Unix epoch.
pub fn unix_secs(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

/// Nanoseconds since the Unix epoch (Nomad's event times).
pub fn unix_nanos(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos() as u64
}

/// RFC 3339 UTC with seconds, as Consul and Nomad print times.
pub fn rfc3339(t: SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(t).to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frozen_time_moves_only_when_advanced() {
        let c = LabClock::frozen();
        let t0 = c.now();
        assert_eq!(c.now(), t0);
        c.advance(Duration::from_secs(70));
        assert_eq!(c.now(), t0 + Duration::from_secs(70));
    }

    #[test]
    fn speed_is_checked() {
        assert!(LabClock::new(-1.0).unwrap_err().contains("speed"));
        assert!(LabClock::new(f64::NAN).is_err());
        assert!(LabClock::new(1001.0).is_err());
        assert!(LabClock::new(10.0).is_ok());
    }
}
