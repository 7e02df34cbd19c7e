//! A provider that may be down when emisar starts: its metadata and keys are discovered once at
//! start, and if that fails, again in the background with capped, fully jittered backoff until
//! it succeeds. Meanwhile everything that does not need the provider keeps working (local
//! login, emisar's own tokens), and what does need it answers with the reason it is missing.
//!
//! *Invariants:* the server never waits for the provider to start; at most one discovery is in
//! flight per provider; retries never run in a tight loop; once discovered, the value is never
//! replaced (key rotation is the key cache's business, not this one's).

use std::future::Future;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::util::Backoff;

/// The first wait between retries and its cap: a provider that restarts is back within a
/// few seconds, and one that is down for long is asked about twice a minute.
const RETRY_BASE: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(30);

enum Status<T> {
    Ready(Arc<T>),
    /// Why it is not there yet, and how many discoveries failed so far.
    Waiting {
        problem: String,
        attempts: u32,
    },
}

/// A value discovered from a provider, now or later.
pub struct Discovered<T> {
    /// What this is, for logs: e.g. "the OpenID provider".
    what: &'static str,
    status: RwLock<Status<T>>,
}

impl<T: Send + Sync + 'static> Discovered<T> {
    /// A value that is already there.
    pub(crate) fn ready(what: &'static str, value: T) -> Arc<Self> {
        Arc::new(Discovered {
            what,
            status: RwLock::new(Status::Ready(Arc::new(value))),
        })
    }

    /// A value whose first discovery failed with `problem`: `attempt` is retried in the
    /// background until it succeeds or `shutdown` is cancelled.
    pub(crate) fn retrying<F, Fut>(
        what: &'static str,
        problem: String,
        attempt: F,
        shutdown: CancellationToken,
    ) -> Arc<Self>
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<T, String>> + Send,
    {
        tracing::warn!(error = %problem, "{what} is unavailable; local login and emisar tokens keep working, retrying in the background");
        let this = Arc::new(Discovered {
            what,
            status: RwLock::new(Status::Waiting {
                problem,
                attempts: 1,
            }),
        });
        let backoff = Backoff::try_new(RETRY_BASE, RETRY_MAX).expect("valid bounds");
        let me = this.clone();
        tokio::spawn(async move {
            let mut failures: u32 = 1;
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(backoff.delay(failures)) => {}
                }
                match attempt().await {
                    Ok(value) => {
                        tracing::info!(after_attempts = failures + 1, "{} is available", me.what);
                        *me.status.write().unwrap_or_else(|p| p.into_inner()) =
                            Status::Ready(Arc::new(value));
                        return;
                    }
                    Err(problem) => {
                        failures = failures.saturating_add(1);
                        tracing::warn!(error = %problem, attempts = failures, "{} is still unavailable", me.what);
                        *me.status.write().unwrap_or_else(|p| p.into_inner()) = Status::Waiting {
                            problem,
                            attempts: failures,
                        };
                    }
                }
            }
        });
        this
    }

    /// The value, or why it is not there yet.
    pub(crate) fn get(&self) -> Result<Arc<T>, String> {
        match &*self.status.read().unwrap_or_else(|p| p.into_inner()) {
            Status::Ready(v) => Ok(v.clone()),
            Status::Waiting { problem, attempts } => Err(format!(
                "{} is unavailable ({problem}); {attempts} attempt{} so far, retrying",
                self.what,
                if *attempts == 1 { "" } else { "s" }
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test(start_paused = true)]
    async fn retries_until_the_provider_answers() {
        let calls = Arc::new(AtomicU32::new(0));
        let counter = calls.clone();
        let d = Discovered::retrying(
            "the test provider",
            "connection refused".into(),
            move || {
                let n = counter.fetch_add(1, Ordering::SeqCst);
                async move {
                    if n < 3 {
                        Err(format!("refused {n}"))
                    } else {
                        Ok(42)
                    }
                }
            },
            CancellationToken::new(),
        );
        let e = d.get().unwrap_err();
        assert!(
            e.starts_with(
                "the test provider is unavailable (connection refused); 1 attempt so far"
            ),
            "{e}"
        );
        // Backoff waits are at most 30 s each: ten minutes of paused time is plenty.
        for _ in 0..600 {
            if d.get().is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        assert_eq!(*d.get().unwrap(), 42);
        assert_eq!(calls.load(Ordering::SeqCst), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_stops_the_retries() {
        let calls = Arc::new(AtomicU32::new(0));
        let counter = calls.clone();
        let stop = CancellationToken::new();
        let d = Discovered::<u32>::retrying(
            "the test provider",
            "down".into(),
            move || {
                counter.fetch_add(1, Ordering::SeqCst);
                async { Err("down".to_string()) }
            },
            stop.clone(),
        );
        tokio::time::sleep(Duration::from_secs(120)).await;
        let before = calls.load(Ordering::SeqCst);
        assert!(before >= 1, "it retried");
        stop.cancel();
        tokio::time::sleep(Duration::from_secs(600)).await;
        assert_eq!(calls.load(Ordering::SeqCst), before);
        assert!(d.get().unwrap_err().contains("attempts so far"));
    }
}
