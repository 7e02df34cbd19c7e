//! Capped exponential backoff with full jitter: the wait before attempt n is uniform in
//! [0, min(max, base · 2ⁿ)]. Every reconnect, probe and heartbeat retry waits through one.
//!
//! Written here rather than taken from `backon`: backon's jitter adds a random amount on top
//! of the exponential delay, while full jitter (the AWS architecture blog's variant) spreads
//! retries over the whole window, which is what keeps a fleet from retrying in step.

use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    base: Duration,
    max: Duration,
}

impl Backoff {
    /// Refuses bounds that would make the backoff useless: zero, or base above max.
    pub fn try_new(base: Duration, max: Duration) -> Result<Self, String> {
        if base.is_zero() {
            return Err("backoff base must be above zero".into());
        }
        if base > max {
            return Err(format!("backoff base {base:?} is above its max {max:?}"));
        }
        Ok(Backoff { base, max })
    }

    /// The cap of attempt `n` (0-based): min(max, base · 2ⁿ).
    pub fn ceiling(&self, attempt: u32) -> Duration {
        let factor = 1u32.checked_shl(attempt.min(31)).unwrap_or(u32::MAX);
        self.base
            .checked_mul(factor)
            .unwrap_or(self.max)
            .min(self.max)
    }

    /// A wait for attempt `n`, uniform in [0, ceiling(n)].
    pub fn delay(&self, attempt: u32) -> Duration {
        let ceiling = self.ceiling(attempt).as_nanos() as u64;
        Duration::from_nanos(random_below(ceiling.saturating_add(1)))
    }
}

/// A uniform random number below `bound` (bound > 0), from the OS generator.
pub fn random_below(bound: u64) -> u64 {
    let mut bytes = [0u8; 8];
    // The OS generator does not fail on Linux; were it to, no jitter is still a valid delay.
    if getrandom::fill(&mut bytes).is_err() {
        return bound / 2;
    }
    // The modulo bias is below 2^-40 for the bounds used here (delays under an hour in ns).
    u64::from_le_bytes(bytes) % bound.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn bad_bounds_are_refused() {
        assert!(Backoff::try_new(Duration::ZERO, Duration::from_secs(1)).is_err());
        assert!(Backoff::try_new(Duration::from_secs(2), Duration::from_secs(1)).is_err());
    }

    #[test]
    fn ceiling_doubles_then_caps() {
        let b = Backoff::try_new(Duration::from_millis(100), Duration::from_secs(5)).unwrap();
        let c: Vec<u64> = (0..8).map(|n| b.ceiling(n).as_millis() as u64).collect();
        assert_eq!(c, vec![100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        assert_eq!(b.ceiling(1000), Duration::from_secs(5));
    }

    proptest! {
        #[test]
        fn delays_stay_within_the_ceiling(base_ms in 1u64..10_000, extra_ms in 0u64..100_000, attempt in 0u32..100) {
            let b = Backoff::try_new(Duration::from_millis(base_ms), Duration::from_millis(base_ms + extra_ms)).unwrap();
            let d = b.delay(attempt);
            prop_assert!(d <= b.ceiling(attempt));
            prop_assert!(b.ceiling(attempt) <= Duration::from_millis(base_ms + extra_ms));
        }
    }

    #[test]
    fn delays_are_spread_not_in_step() {
        let b = Backoff::try_new(Duration::from_millis(100), Duration::from_secs(10)).unwrap();
        let delays: std::collections::BTreeSet<_> = (0..50).map(|_| b.delay(5)).collect();
        assert!(delays.len() > 40, "full jitter spreads retries");
    }
}
