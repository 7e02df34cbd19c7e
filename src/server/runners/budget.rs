//! A retry budget: retries may be at most a small share of calls. Each call deposits
//! `ratio` of a token (up to `cap`); each retry withdraws a whole one. When the budget is
//! empty, failures are returned as they are instead of being retried: retries
//! must never multiply the load on something already failing.

use std::sync::Mutex;

pub struct RetryBudget {
    tokens: Mutex<f64>,
    ratio: f64,
    cap: f64,
}

impl RetryBudget {
    pub(crate) fn new(ratio: f64, cap: f64) -> Self {
        RetryBudget {
            tokens: Mutex::new(cap.min(1.0)),
            ratio,
            cap,
        }
    }

    pub(crate) fn deposit(&self) {
        let mut t = self.tokens.lock().unwrap_or_else(|p| p.into_inner());
        *t = (*t + self.ratio).min(self.cap);
    }

    /// Takes a token for one retry, if there is one.
    pub(crate) fn try_withdraw(&self) -> bool {
        let mut t = self.tokens.lock().unwrap_or_else(|p| p.into_inner());
        if *t >= 1.0 {
            *t -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_stay_a_small_share_of_calls() {
        let b = RetryBudget::new(0.1, 10.0);
        let mut retries = 0;
        for _ in 0..1000 {
            b.deposit();
            if b.try_withdraw() {
                retries += 1;
            }
        }
        assert!(retries <= 101, "{retries} retries for 1000 calls");
        assert!(retries >= 99);
    }
}
