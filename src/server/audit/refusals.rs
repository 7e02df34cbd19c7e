//! Refusals a caller repeats, counted in memory and written as one `refusal.repeated` event
//! per caller, kind and class of refusal and window, so that a flood of them costs a bounded
//! number of audit rows however fast it comes.
//!
//! The first refusal of each (kind, caller, class) in a window is written as its own event,
//! exactly as before; every further one in the same window is only counted, with the first
//! and the last of them kept as samples. At the end of the window the counts are written as
//! aggregate events and the window starts afresh (so the next refusal is again its own event).
//! A caller therefore costs at most two rows per kind and class a window.
//!
//! Only refusals a caller can repeat at will are counted this way: rate-limited and
//! unknown-tool calls, refused joins and failed logins. Other refusals (invalid arguments,
//! policy denials) stay one event each; they come only after the rate limit, which they
//! count against, so once the rate-limited refusals are aggregated they are bounded by it.
//!
//! Invariants: the state is bounded. Past [`MAX_KEYS`] distinct keys in one window, further
//! new keys are folded into one overflow key per kind (actor `system`), never a new entry. A
//! count is never lost on a clean stop: the flusher writes what it holds when told to stop,
//! and `Application::run_until_stopped` flushes again once the last request has finished.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::chain::{NewEvent, format_at, kind};

/// How long one window lasts. A minute: an auditor reads at most one summary per caller and
/// kind of refusal a minute, and it matches the per-minute limits on logins and joins; a
/// crash loses at most this much of the counts (a clean stop loses nothing).
pub const WINDOW: Duration = Duration::from_secs(60);

/// The most distinct keys one window tracks before it folds new ones into an overflow key.
pub(crate) const MAX_KEYS: usize = 10_000;

/// The actor of an overflow aggregate: many callers, none of them named.
pub(crate) const OVERFLOW_ACTOR: &str = "system:overflow";

/// What one aggregate counts: refusals of one `kind` (e.g. `tool.rejected`), for one
/// `caller` (its actor, e.g. `agent:ci`, or `address:203.0.113.7` for the unauthenticated),
/// of one `class` (e.g. `rate_limited`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RefusalKey {
    pub kind: &'static str,
    pub caller: String,
    pub class: &'static str,
}

/// Whether a refusal must be written as its own event or was counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Noted {
    /// The first of its key in this window: write it.
    First,
    /// Counted; it will be in the window's aggregate.
    Counted,
    /// Counted under the overflow key of its kind (too many distinct keys this window).
    Folded,
}

/// The repeats of one key in the current window.
#[derive(Debug, Clone, Default)]
struct Tally {
    count: u64,
    /// The first and the last repeat (the refusal written on its own is not among them).
    first: Option<(DateTime<Utc>, Value)>,
    last: Option<(DateTime<Utc>, Value)>,
}

impl Tally {
    fn add(&mut self, at: DateTime<Utc>, sample: Value) {
        self.count += 1;
        if self.first.is_none() {
            self.first = Some((at, sample));
        } else {
            self.last = Some((at, sample));
        }
    }

    /// Takes in a tally of the same key that could not be written: the counts add up and
    /// the older first and the newer last sample are kept.
    fn merge(&mut self, older: Tally) {
        if older.count == 0 {
            return;
        }
        let newer = std::mem::replace(self, older);
        self.count += newer.count;
        let newest = newer.last.or(newer.first);
        if newest.is_some() {
            self.last = newest;
        }
    }
}

/// The counts of the current window.
#[derive(Debug, Default)]
pub(crate) struct Refusals {
    window: HashMap<RefusalKey, Tally>,
    /// Keys folded into an overflow key this window (for the overflow aggregate's detail).
    folded_callers: u64,
}

impl Refusals {
    /// Notes one refusal of `key`, described by `event` (the event that would be written),
    /// at `at`.
    pub(crate) fn note(&mut self, key: RefusalKey, event: &NewEvent, at: DateTime<Utc>) -> Noted {
        if let Some(tally) = self.window.get_mut(&key) {
            tally.add(at, sample(event, at));
            return Noted::Counted;
        }
        if self.window.len() >= MAX_KEYS {
            let overflow = RefusalKey {
                kind: key.kind,
                caller: OVERFLOW_ACTOR.into(),
                class: "overflow",
            };
            self.folded_callers += 1;
            self.window
                .entry(overflow)
                .or_default()
                .add(at, sample(event, at));
            return Noted::Folded;
        }
        self.window.insert(key, Tally::default());
        Noted::First
    }

    /// How many keys the window tracks.
    #[cfg(test)]
    fn tracked(&self) -> usize {
        self.window.len()
    }

    /// Ends the window: the aggregates to write (one per key with repeats), and the tallies
    /// they came from, to give back with [`Refusals::restore`] if they cannot be written.
    fn take(&mut self) -> Vec<(RefusalKey, Tally)> {
        self.folded_callers = 0;
        self.window
            .drain()
            .filter(|(_, tally)| tally.count > 0)
            .collect()
    }

    /// Gives back tallies whose aggregates could not be written, so they go out with the
    /// next window's. A key given back counts as seen: its next refusal is counted too.
    fn restore(&mut self, tallies: Vec<(RefusalKey, Tally)>) {
        for (key, tally) in tallies {
            self.window.entry(key).or_default().merge(tally);
        }
    }
}

/// A refusal as a sample in an aggregate: when, and what its own event would have said.
fn sample(event: &NewEvent, at: DateTime<Utc>) -> Value {
    let mut sample = json!({"at": format_at(at), "actor": event.actor});
    for (field, value) in [
        ("tool", event.tool.as_ref().map(|t| json!(t))),
        ("runner", event.runner.as_ref().map(|r| json!(r))),
        ("reason", event.reason.as_ref().map(|r| json!(r))),
        ("args", event.args.clone()),
        ("detail", event.detail.clone()),
    ] {
        if let Some(value) = value {
            sample[field] = value;
        }
    }
    sample
}

/// The `refusal.repeated` event for one key's repeats.
fn aggregate(key: &RefusalKey, tally: &Tally, window: Duration) -> NewEvent {
    let first = tally.first.as_ref();
    let last = tally.last.as_ref().or(first);
    NewEvent {
        actor: key.caller.clone(),
        kind: kind::REFUSAL_REPEATED.into(),
        outcome: Some("refused".into()),
        detail: Some(json!({
            "kind": key.kind,
            "class": key.class,
            "count": tally.count,
            "first_at": first.map(|(at, _)| format_at(*at)),
            "last_at": last.map(|(at, _)| format_at(*at)),
            "first": first.map(|(_, s)| s),
            "last": last.map(|(_, s)| s),
            "window_secs": window.as_secs(),
        })),
        ..Default::default()
    }
}

/// The shared counts, and how to write them.
#[derive(Debug, Clone, Default)]
pub(super) struct RefusalCounter {
    state: Arc<Mutex<Refusals>>,
    /// Held for the whole of a flush, so a flush that finds the window empty returns only
    /// after any flush already under way has written what it took: the last flush at a stop
    /// then means everything counted is durable.
    flushing: Arc<tokio::sync::Mutex<()>>,
}

/// Aggregates written in one `append_all` (one transaction each).
const FLUSH_CHUNK: usize = 256;

impl RefusalCounter {
    /// Notes one refusal now; see [`Refusals::note`].
    pub(super) fn note(&self, key: RefusalKey, event: &NewEvent) -> Noted {
        let noted = self.lock().note(key.clone(), event, Utc::now());
        match noted {
            Noted::First => {}
            Noted::Counted => crate::server::metrics::refusal_counted(key.kind, "counted"),
            Noted::Folded => crate::server::metrics::refusal_counted(key.kind, "folded"),
        }
        noted
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Refusals> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many keys the current window tracks.
    #[cfg(test)]
    fn tracked(&self) -> usize {
        self.lock().tracked()
    }

    /// Ends the window and writes its aggregates through `write`. What `write` refuses is
    /// kept for the next flush (and logged), never dropped. Returns how many refusals the
    /// written aggregates count.
    pub(super) async fn flush<F, Fut, E>(&self, window: Duration, write: &F) -> u64
    where
        F: Fn(Vec<NewEvent>) -> Fut,
        Fut: Future<Output = Result<(), E>>,
        E: std::fmt::Display,
    {
        let _flushing = self.flushing.lock().await;
        let tallies = self.lock().take();
        let mut written = 0;
        let mut unwritten = Vec::new();
        let mut chunks = tallies.into_iter().peekable();
        while chunks.peek().is_some() {
            let chunk: Vec<(RefusalKey, Tally)> = chunks.by_ref().take(FLUSH_CHUNK).collect();
            let events = chunk
                .iter()
                .map(|(key, tally)| aggregate(key, tally, window))
                .collect();
            match write(events).await {
                Ok(()) => written += chunk.iter().map(|(_, t)| t.count).sum::<u64>(),
                Err(e) => {
                    let count: u64 = chunk.iter().map(|(_, t)| t.count).sum();
                    tracing::error!(error = %e, refusals = count, "repeated refusals could not be audited; kept for the next window");
                    unwritten.extend(chunk);
                }
            }
        }
        if !unwritten.is_empty() {
            self.lock().restore(unwritten);
        }
        written
    }

    /// Flushes every `window` until `shutdown`, and once more then.
    pub(super) async fn run_flusher<F, Fut, E>(
        self,
        window: Duration,
        shutdown: CancellationToken,
        write: F,
    ) where
        F: Fn(Vec<NewEvent>) -> Fut,
        Fut: Future<Output = Result<(), E>>,
        E: std::fmt::Display,
    {
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + window, window);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => {
                    self.flush(window, &write).await;
                    return;
                }
                _ = tick.tick() => {
                    self.flush(window, &write).await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(caller: &str, class: &'static str) -> RefusalKey {
        RefusalKey {
            kind: kind::TOOL_REJECTED,
            caller: caller.into(),
            class,
        }
    }

    fn event(actor: &str, n: u32) -> NewEvent {
        NewEvent {
            actor: actor.into(),
            kind: kind::TOOL_REJECTED.into(),
            tool: Some(format!("nope.tool{n}")),
            detail: Some(json!({"error": "unknown tool"})),
            ..Default::default()
        }
    }

    /// A sink that keeps what it is given, or refuses while `fail` is set.
    #[derive(Clone, Default)]
    struct Sink {
        written: Arc<Mutex<Vec<NewEvent>>>,
        fail: Arc<std::sync::atomic::AtomicBool>,
    }

    impl Sink {
        fn write(
            &self,
        ) -> impl Fn(Vec<NewEvent>) -> futures::future::Ready<Result<(), String>> + use<> {
            let sink = self.clone();
            move |events| {
                if sink.fail.load(std::sync::atomic::Ordering::SeqCst) {
                    return futures::future::ready(Err("store down".to_owned()));
                }
                sink.written.lock().unwrap().extend(events);
                futures::future::ready(Ok(()))
            }
        }

        fn taken(&self) -> Vec<NewEvent> {
            std::mem::take(&mut *self.written.lock().unwrap())
        }
    }

    #[test]
    fn the_first_refusal_is_its_own_the_repeats_are_counted_with_samples() {
        let counter = RefusalCounter::default();
        let a = key("agent:a", "unknown_tool");
        assert_eq!(counter.note(a.clone(), &event("agent:a", 0)), Noted::First);
        for n in 1..=5 {
            assert_eq!(
                counter.note(a.clone(), &event("agent:a", n)),
                Noted::Counted
            );
        }
        // Another class and another caller each start with their own event.
        let limited = key("agent:a", "rate_limited");
        assert_eq!(counter.note(limited, &event("agent:a", 9)), Noted::First);
        assert_eq!(
            counter.note(key("agent:b", "unknown_tool"), &event("agent:b", 0)),
            Noted::First
        );
        assert_eq!(counter.tracked(), 3);

        let sink = Sink::default();
        let counted = futures::executor::block_on(counter.flush(WINDOW, &sink.write()));
        assert_eq!(counted, 5);
        let written = sink.taken();
        assert_eq!(written.len(), 1, "only keys with repeats: {written:#?}");
        let agg = &written[0];
        assert_eq!(agg.kind, kind::REFUSAL_REPEATED);
        assert_eq!(agg.actor, "agent:a");
        let detail = agg.detail.as_ref().unwrap();
        assert_eq!(detail["count"], 5);
        assert_eq!(detail["kind"], "tool.rejected");
        assert_eq!(detail["class"], "unknown_tool");
        assert_eq!(detail["first"]["tool"], "nope.tool1");
        assert_eq!(detail["last"]["tool"], "nope.tool5");
        assert_eq!(detail["window_secs"], 60);
        assert!(detail["first_at"].is_string() && detail["last_at"].is_string());

        // A new window: the next refusal is its own event again.
        assert_eq!(counter.tracked(), 0);
        assert_eq!(counter.note(a, &event("agent:a", 6)), Noted::First);
    }

    #[test]
    fn past_the_cap_new_keys_fold_into_one_overflow_key_per_kind() {
        let counter = RefusalCounter::default();
        for i in 0..MAX_KEYS {
            let caller = format!("address:{i}");
            assert_eq!(
                counter.note(key(&caller, "unauthorized"), &event(&caller, 0)),
                Noted::First
            );
        }
        for i in 0..1000 {
            let caller = format!("address:more{i}");
            assert_eq!(
                counter.note(key(&caller, "unauthorized"), &event(&caller, 0)),
                Noted::Folded
            );
        }
        // A key already seen is still counted under its own name.
        assert_eq!(
            counter.note(key("address:0", "unauthorized"), &event("address:0", 1)),
            Noted::Counted
        );
        assert_eq!(counter.tracked(), MAX_KEYS + 1, "never grows past the cap");

        let sink = Sink::default();
        let counted = futures::executor::block_on(counter.flush(WINDOW, &sink.write()));
        assert_eq!(counted, 1001);
        let written = sink.taken();
        let overflow = written
            .iter()
            .find(|e| e.actor == OVERFLOW_ACTOR)
            .expect("an overflow aggregate");
        assert_eq!(overflow.detail.as_ref().unwrap()["count"], 1000);
        assert_eq!(
            overflow.detail.as_ref().unwrap()["last"]["actor"],
            "address:more999"
        );
    }

    #[test]
    fn counts_that_could_not_be_written_are_kept_for_the_next_flush() {
        let counter = RefusalCounter::default();
        let a = key("agent:a", "rate_limited");
        for n in 0..4 {
            counter.note(a.clone(), &event("agent:a", n));
        }
        let sink = Sink::default();
        sink.fail.store(true, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(
            futures::executor::block_on(counter.flush(WINDOW, &sink.write())),
            0
        );
        // Two more while the store is down: counted, not written on their own.
        for n in 4..6 {
            assert_eq!(
                counter.note(a.clone(), &event("agent:a", n)),
                Noted::Counted
            );
        }
        sink.fail.store(false, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(
            futures::executor::block_on(counter.flush(WINDOW, &sink.write())),
            5
        );
        let written = sink.taken();
        assert_eq!(written.len(), 1);
        let detail = written[0].detail.as_ref().unwrap();
        assert_eq!(detail["count"], 5);
        assert_eq!(detail["first"]["tool"], "nope.tool1");
        assert_eq!(detail["last"]["tool"], "nope.tool5");
    }

    #[tokio::test]
    async fn a_flush_returns_only_after_the_flush_under_way_has_written() {
        let counter = RefusalCounter::default();
        let a = key("agent:a", "rate_limited");
        for n in 0..3 {
            counter.note(a.clone(), &event("agent:a", n));
        }
        let written = Arc::new(Mutex::new(Vec::new()));
        let (release, go) = tokio::sync::watch::channel(false);
        let started = Arc::new(tokio::sync::Notify::new());
        let slow = {
            let (written, started) = (written.clone(), started.clone());
            move |events: Vec<NewEvent>| {
                let (written, started, mut go) = (written.clone(), started.clone(), go.clone());
                async move {
                    started.notify_one();
                    let _ = go.wait_for(|g| *g).await;
                    written.lock().unwrap().extend(events);
                    Ok::<(), String>(())
                }
            }
        };
        let first = tokio::spawn({
            let counter = counter.clone();
            async move { counter.flush(WINDOW, &slow).await }
        });
        started.notified().await;
        // The first flush has taken the counts and is writing them; a second one waits.
        let second = tokio::spawn({
            let counter = counter.clone();
            let sink = Sink::default();
            async move { counter.flush(WINDOW, &sink.write()).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !second.is_finished(),
            "the second flush waits for the first"
        );
        release.send(true).unwrap();
        assert_eq!(first.await.unwrap(), 2);
        assert_eq!(second.await.unwrap(), 0);
        assert_eq!(written.lock().unwrap().len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn the_flusher_writes_at_each_window_end_and_on_stop() {
        let counter = RefusalCounter::default();
        let sink = Sink::default();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(counter.clone().run_flusher(
            WINDOW,
            shutdown.clone(),
            sink.write(),
        ));
        let a = key("agent:a", "unknown_tool");
        for n in 0..3 {
            counter.note(a.clone(), &event("agent:a", n));
        }
        // Nothing before the window ends.
        tokio::time::sleep(WINDOW - Duration::from_secs(1)).await;
        assert!(sink.taken().is_empty());
        tokio::time::sleep(Duration::from_secs(2)).await;
        let written = sink.taken();
        assert_eq!(written.len(), 1);
        assert_eq!(written[0].detail.as_ref().unwrap()["count"], 2);

        // A window with nothing repeated writes nothing.
        tokio::time::sleep(WINDOW).await;
        assert!(sink.taken().is_empty());

        // Counted in the middle of a window, then a clean stop: written at once.
        assert_eq!(counter.note(a.clone(), &event("agent:a", 7)), Noted::First);
        assert_eq!(
            counter.note(a.clone(), &event("agent:a", 8)),
            Noted::Counted
        );
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(sink.taken().is_empty());
        shutdown.cancel();
        task.await.unwrap();
        let written = sink.taken();
        assert_eq!(written.len(), 1);
        assert_eq!(written[0].detail.as_ref().unwrap()["count"], 1);
        assert_eq!(counter.tracked(), 0);
    }
}
