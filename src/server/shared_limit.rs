//! Rate limits across replicas (PostgreSQL only): behind each replica's own token bucket
//! (governor: an agent's in `gateway/state.rs`, a login address's in `login_limits.rs`), one
//! bucket per key in the `rate_buckets` table, which every replica shares, so that N replicas
//! together admit about what one would. Each [`SharedLimit`] is one kind of key (its prefix
//! in the table) with one quota.
//!
//! The shared bucket is the algorithm governor runs (GCRA, the generic cell rate algorithm),
//! with the same quota: a row holds the key's theoretical arrival time `tat` (microseconds
//! on the database's clock, the one clock every replica reads, so replicas' clocks may
//! differ); a call fits when `max(tat, now) + interval - now <= burst × interval`, and moves
//! `tat` to `max(tat, now) + interval`. What a replica remembers is the key's *debt*,
//! `tat - now`, as the database last said it, aged on the replica's own monotonic clock.
//!
//! No round trip while a key is well under its limit: a replica admits a call on its own
//! ([`admit_locally`]) while the remembered debt plus the calls it admitted and has not yet
//! reported fill at most half the bucket, and it holds fewer than `local_budget` such calls
//! (`rate × FLUSH_EVERY`, at least 1). Every [`FLUSH_EVERY`] one statement adds those calls of
//! every key to the shared buckets, whether they fit or not (they were admitted), and
//! brings back each key's debt. Past that, each call takes one atomic statement that admits
//! it only if it fits. A flood costs no more statements than that: what the replica's own
//! bucket refuses never reaches this one.
//!
//! Bound: over any time `t`, a key is admitted at most `burst + rate × t` calls (what one
//! bucket of the quota admits) plus `N × local_budget` for N replicas. Only calls admitted
//! locally can push a bucket past full, each replica holds at most `local_budget` unreported
//! at a time, and a bucket past full refuses every replica's atomic statement until it has
//! drained below full again, so the excess never accumulates. Calls admitted locally count
//! from when they are reported (up to `FLUSH_EVERY` later), which errs on the strict side: a
//! lone replica may refuse up to `local_budget` calls earlier than its own bucket would.
//!
//! If the store cannot be reached, the replica falls back to its own bucket alone (see
//! [`SharedLimit::admit`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::PgPool;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::server::db::{Db, Pool};

/// How often a replica reports the calls it admitted on its own and learns the buckets'
/// debts. Shorter costs more statements while buckets are busy; longer lets each replica
/// admit more on its own (`local_budget` grows with it), so the bound above grows too.
/// 50 ms: at the default 20 calls/s, one call per replica per flush.
pub(crate) const FLUSH_EVERY: Duration = Duration::from_millis(50);

/// Buckets whose `tat` passed this long ago are deleted (they are full, as if absent); and the
/// replica forgets keys it has heard nothing of for as long.
const FORGET_AFTER: Duration = Duration::from_secs(60);

/// The database's clock, in microseconds since the epoch (`now()`: the statement's start,
/// the same in every part of one statement).
macro_rules! now_us {
    () => {
        "(extract(epoch FROM now()) * 1000000)::bigint"
    };
}

/// One call, if it fits: `$1` key, `$2` interval, `$3` tolerance (µs). `taken` is the new
/// `tat` when it fitted; `held` the `tat` before the statement (the main query sees the table
/// as it was), from which a refusal's wait is computed.
const TAKE_ONE: &str = concat!(
    "WITH taken AS (",
    "INSERT INTO rate_buckets AS b (key, tat) VALUES ($1, ",
    now_us!(),
    " + $2) ",
    "ON CONFLICT (key) DO UPDATE SET tat = greatest(b.tat, ",
    now_us!(),
    ") + $2 ",
    "WHERE greatest(b.tat, ",
    now_us!(),
    ") + $2 - ",
    now_us!(),
    " <= $3 RETURNING tat) ",
    "SELECT (SELECT tat FROM taken), (SELECT tat FROM rate_buckets WHERE key = $1), ",
    now_us!()
);

/// Calls already admitted, for many buckets at once: `$1` keys, `$2` counts, `$3` interval.
const ADD_ADMITTED: &str = concat!(
    "INSERT INTO rate_buckets AS b (key, tat) ",
    "SELECT key, ",
    now_us!(),
    " + n * $3 FROM UNNEST($1::text[], $2::bigint[]) AS f(key, n) ",
    "ON CONFLICT (key) DO UPDATE SET tat = greatest(b.tat, ",
    now_us!(),
    ") + (excluded.tat - ",
    now_us!(),
    ") RETURNING key, tat - ",
    now_us!()
);

const FORGET: &str = concat!("DELETE FROM rate_buckets WHERE tat < ", now_us!(), " - $1");

/// A quota in the units of the shared bucket.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Quota {
    /// One call's worth of time: 1 s / rate.
    interval: Duration,
    /// A full bucket's worth: burst × interval.
    tolerance: Duration,
    /// The most calls a replica admits on its own before reporting them.
    local_budget: u32,
}

impl Quota {
    /// `per_second` calls a second, bursts of `burst`: governor's `Quota::per_second(..)
    /// .allow_burst(..)`.
    pub(crate) fn per_second(per_second: u32, burst: u32) -> Quota {
        Quota::every(Duration::from_secs(1), per_second, burst)
    }

    /// `n` calls a minute, bursts of `n`: governor's `Quota::per_minute(n).allow_burst(n)`.
    pub(crate) fn per_minute(n: u32) -> Quota {
        Quota::every(Duration::from_secs(60), n, n)
    }

    fn every(period: Duration, n: u32, burst: u32) -> Quota {
        let interval = period / n.max(1);
        let in_one_flush = FLUSH_EVERY.as_nanos() / interval.as_nanos().max(1);
        Quota {
            interval,
            tolerance: interval * burst.max(1),
            local_budget: u32::try_from(in_one_flush).unwrap_or(u32::MAX).max(1),
        }
    }
}

/// Whether a replica may admit a call without asking the store: it holds fewer than
/// `local_budget` unreported calls, and the key's debt as last heard (aged), plus those
/// calls, plus this one, fill at most half the bucket.
fn admit_locally(debt: Duration, unreported: u32, quota: &Quota) -> bool {
    unreported < quota.local_budget
        && debt + quota.interval * (unreported + 1) <= quota.tolerance / 2
}

/// What a replica knows of one key's shared bucket.
#[derive(Debug)]
struct Bucket {
    /// The debt (`tat - now`) the store last answered, and when it answered.
    debt: Duration,
    heard_at: Instant,
    /// Calls admitted here and not yet added to the shared bucket (a flush in flight
    /// included: they are subtracted when it answers).
    unreported: u32,
}

impl Bucket {
    /// Whether the replica keeps this key at `now`: it holds calls to report, or heard of the
    /// key within `forget_after`.
    fn remembered(&self, now: Instant, forget_after: Duration) -> bool {
        self.unreported > 0 || now.saturating_duration_since(self.heard_at) < forget_after
    }

    fn debt_now(&self, now: Instant) -> Duration {
        self.debt
            .saturating_sub(now.saturating_duration_since(self.heard_at))
    }
}

/// The shared half of one kind of rate limit. Built for PostgreSQL only: on SQLite there is
/// one process, and its own bucket is the whole limit.
pub(crate) struct SharedLimit {
    db: Db,
    pool: PgPool,
    /// Put before each key in the table, so kinds of keys never meet: `agent:`, ….
    prefix: &'static str,
    quota: Quota,
    buckets: Mutex<HashMap<String, Bucket>>,
    /// Set while the store does not answer, so the fallback is logged once per outage.
    degraded: AtomicBool,
}

impl SharedLimit {
    /// The shared half of the limit on `prefix` keys, reporting to the store until
    /// `shutdown`; `None` unless the store is PostgreSQL.
    pub(crate) fn start(
        db: &Db,
        prefix: &'static str,
        quota: Quota,
        shutdown: &CancellationToken,
    ) -> Option<Arc<SharedLimit>> {
        let Pool::Pg(pool) = db.pool() else {
            return None;
        };
        let shared = Arc::new(SharedLimit {
            db: db.clone(),
            pool: pool.clone(),
            prefix,
            quota,
            buckets: Mutex::new(HashMap::new()),
            degraded: AtomicBool::new(false),
        });
        shared.clone().spawn_flusher(shutdown.clone());
        Some(shared)
    }

    /// Admits one call of `key`, or says how long until one would fit. Well under the
    /// limit this touches no store; above half the bucket it is one statement.
    ///
    /// When the store does not answer, the call is admitted on the replica's own bucket
    /// alone (logged once, counted in `emisar_rate_limit_fallbacks_total`). Failing closed
    /// would only add refusals of calls that cannot succeed anyway: a tool call needs its
    /// audit append and a login its user's row, in the same store. Each replica's own bucket
    /// still holds the key to the quota per replica meanwhile.
    pub(crate) async fn admit(&self, key: &str) -> Result<(), Duration> {
        let now = Instant::now();
        {
            let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
            // Looked up by `&str` first, so a known key costs no allocation.
            if !buckets.contains_key(key) {
                buckets.insert(
                    key.to_owned(),
                    Bucket {
                        debt: Duration::ZERO,
                        heard_at: now,
                        unreported: 0,
                    },
                );
            }
            let known = buckets.get_mut(key).expect("inserted above");
            if admit_locally(known.debt_now(now), known.unreported, &self.quota) {
                known.unreported += 1;
                return Ok(());
            }
        }
        let answer = self
            .db
            .guard(
                sqlx::query_as::<_, (Option<i64>, Option<i64>, i64)>(TAKE_ONE)
                    .bind(format!("{}{key}", self.prefix))
                    .bind(micros(self.quota.interval))
                    .bind(micros(self.quota.tolerance))
                    .fetch_one(&self.pool),
            )
            .await;
        let (taken, held, db_now) = match answer {
            Ok(row) => {
                self.recovered();
                row
            }
            Err(e) => {
                self.fell_back(&e);
                return Ok(());
            }
        };
        let (admitted, tat) = match (taken, held) {
            (Some(tat), _) => (true, tat),
            (None, held) => (false, held.unwrap_or(db_now)),
        };
        let debt = Duration::from_micros(u64::try_from(tat - db_now).unwrap_or(0));
        self.heard(key, debt);
        if admitted {
            Ok(())
        } else {
            Err((debt + self.quota.interval).saturating_sub(self.quota.tolerance))
        }
    }

    /// Records what the store said of `key`'s debt.
    fn heard(&self, key: &str, debt: Duration) {
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(known) = buckets.get_mut(key) {
            known.debt = debt;
            known.heard_at = Instant::now();
        }
    }

    /// Reports every key's unreported calls in one statement and learns their debts.
    async fn flush(&self) {
        let (keys, counts): (Vec<String>, Vec<i64>) = {
            let buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
            buckets
                .iter()
                .filter(|(_, a)| a.unreported > 0)
                .map(|(k, a)| (k.clone(), i64::from(a.unreported)))
                .unzip()
        };
        if keys.is_empty() {
            return;
        }
        let answer = self
            .db
            .guard(
                sqlx::query_as::<_, (String, i64)>(ADD_ADMITTED)
                    .bind(
                        keys.iter()
                            .map(|k| format!("{}{k}", self.prefix))
                            .collect::<Vec<_>>(),
                    )
                    .bind(&counts)
                    .bind(micros(self.quota.interval))
                    .fetch_all(&self.pool),
            )
            .await;
        let debts: HashMap<String, i64> = match answer {
            Ok(rows) => {
                self.recovered();
                rows.into_iter()
                    .filter_map(|(k, debt)| Some((k.strip_prefix(self.prefix)?.to_owned(), debt)))
                    .collect()
            }
            // The calls are forgotten rather than kept: admitted while the store was away,
            // they were bounded by this replica's own bucket, and adding them later would
            // refuse calls made after the store came back.
            Err(e) => {
                self.fell_back(&e);
                HashMap::new()
            }
        };
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        for (key, count) in keys.iter().zip(counts) {
            let Some(known) = buckets.get_mut(key) else {
                continue;
            };
            known.unreported = known
                .unreported
                .saturating_sub(u32::try_from(count).unwrap_or(u32::MAX));
            if let Some(debt) = debts.get(key) {
                known.debt = Duration::from_micros(u64::try_from(*debt).unwrap_or(0));
                known.heard_at = now;
            }
        }
    }

    /// Deletes the buckets long full (of every kind), and forgets the keys heard of long ago,
    /// so the table and this map hold only keys that called within `FORGET_AFTER`.
    async fn forget_old(&self) {
        {
            let now = Instant::now();
            let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
            buckets.retain(|_, a| a.remembered(now, FORGET_AFTER));
        }
        let deleted = self
            .db
            .guard(
                sqlx::query(FORGET)
                    .bind(micros(FORGET_AFTER))
                    .execute(&self.pool),
            )
            .await;
        if let Err(e) = deleted {
            tracing::debug!(error = %e, "old rate buckets were not deleted; the next round will");
        }
    }

    /// Flushes every [`FLUSH_EVERY`] and forgets old buckets at start and every
    /// [`FORGET_AFTER`], until `shutdown` (`replicas::a_replica_deletes_only_buckets_long_full`
    /// holds the start's round to deleting exactly the old rows).
    fn spawn_flusher(self: Arc<Self>, shutdown: CancellationToken) {
        tokio::spawn(async move {
            let mut flush = tokio::time::interval(FLUSH_EVERY);
            flush.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut forget = tokio::time::interval(FORGET_AFTER);
            forget.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = flush.tick() => self.flush().await,
                    _ = forget.tick() => self.forget_old().await,
                }
            }
        });
    }

    fn fell_back(&self, e: &sqlx::Error) {
        crate::server::metrics::rate_limit_fallback();
        if !self.degraded.swap(true, Ordering::Relaxed) {
            tracing::warn!(error = %e, kind = self.prefix, "the shared rate limit is unreachable; this replica limits on its own until it answers");
        }
    }

    fn recovered(&self) {
        if self.degraded.swap(false, Ordering::Relaxed) {
            tracing::info!(kind = self.prefix, "the shared rate limit answers again");
        }
    }
}

fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_quota_in_bucket_units() {
        let q = Quota::per_second(20, 40);
        assert_eq!(q.interval, Duration::from_millis(50));
        assert_eq!(q.tolerance, Duration::from_secs(2));
        assert_eq!(q.local_budget, 1, "20/s × 50 ms");
        assert_eq!(Quota::per_second(1000, 1000).local_budget, 50);
        assert_eq!(Quota::per_second(1, 1).local_budget, 1, "never below one");
        let login = Quota::per_minute(30);
        assert_eq!(login.interval, Duration::from_secs(2));
        assert_eq!(login.tolerance, Duration::from_secs(60));
        assert_eq!(login.local_budget, 1);
    }

    #[test]
    fn well_under_the_limit_a_call_is_admitted_locally() {
        let q = Quota::per_second(20, 40);
        assert!(admit_locally(Duration::ZERO, 0, &q));
        // Half the bucket is 1 s of debt: a call that brings it to exactly half still passes.
        assert!(admit_locally(Duration::from_millis(950), 0, &q));
        assert!(!admit_locally(Duration::from_millis(951), 0, &q));
    }

    #[test]
    fn unreported_calls_count_and_are_capped_by_the_local_budget() {
        let q = Quota::per_second(1000, 1000);
        assert_eq!(q.local_budget, 50);
        assert!(admit_locally(Duration::ZERO, 49, &q));
        assert!(
            !admit_locally(Duration::ZERO, 50, &q),
            "the budget is spent"
        );
        // Half the bucket is 500 ms = 500 calls: 450 ms of debt and 49 unreported is 499 +1.
        assert!(admit_locally(Duration::from_millis(450), 49, &q));
        assert!(!admit_locally(Duration::from_millis(451), 49, &q));
    }

    #[test]
    fn a_bucket_of_one_always_asks_the_store() {
        let q = Quota::per_second(5, 1);
        assert!(!admit_locally(Duration::ZERO, 0, &q));
    }

    /// A key is forgotten once nothing was heard of it for `FORGET_AFTER` and it has no
    /// calls left to report; never earlier, and never with calls to report.
    #[test]
    fn a_key_is_forgotten_only_when_long_silent_and_reported() {
        let then = Instant::now();
        let after = Duration::from_secs(60);
        let bucket = |unreported| Bucket {
            debt: Duration::ZERO,
            heard_at: then,
            unreported,
        };
        assert!(bucket(0).remembered(then, after));
        assert!(bucket(0).remembered(then + Duration::from_secs(59), after));
        assert!(!bucket(0).remembered(then + after, after));
        assert!(!bucket(0).remembered(then + Duration::from_secs(3600), after));
        // Calls admitted and not reported yet keep the key, however old.
        assert!(bucket(1).remembered(then + Duration::from_secs(3600), after));
    }

    #[test]
    fn remembered_debt_drains_with_time() {
        let then = Instant::now();
        let agent = Bucket {
            debt: Duration::from_millis(300),
            heard_at: then,
            unreported: 0,
        };
        assert_eq!(
            agent.debt_now(then + Duration::from_millis(100)),
            Duration::from_millis(200)
        );
        assert_eq!(
            agent.debt_now(then + Duration::from_secs(5)),
            Duration::ZERO
        );
    }
}
