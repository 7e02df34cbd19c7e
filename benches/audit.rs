//! Audit log benchmark: group-commit append throughput, filtered search latency and chain
//! verification, through the real `emisar` library (writer task, store SQL, verifier).
//!
//!   DATABASE_URL=postgres://… cargo bench --bench audit
//!
//! Environment:
//! - `DATABASE_URL`: a PostgreSQL database (migrated on connect). Its audit log should be
//!   empty; the bench refuses a non-empty one unless `BENCH_SEED=0` (measure what is there).
//!   Without it the PostgreSQL part is skipped.
//! - `BENCH_EVENTS` (1000000): events to seed into PostgreSQL.
//! - `BENCH_SQLITE_EVENTS` (100000): events for the same run against a temporary SQLite
//!   file (WAL, as `emisar dev` opens it); 0 skips SQLite.
//! - `BENCH_CONCURRENCY` (256): concurrent callers while seeding.
//! - `BENCH_QUERIES` (300): timed queries per search shape (after 20 warm-up queries).
//! - `BENCH_SWEEP_SECS` (4): seconds per concurrency level of the throughput sweep; 0 skips.
//! - `BENCH_SUMMARY`: a file to write `key=value` lines to (for scripts/bench's budget table).
//!
//! Progress goes to stderr; the results go to stdout as Markdown.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use common::{Out, env_num, log, ms};
use emisar::server::audit::{self, AuditFilter, AuditLog, NewEvent, kind};
use emisar::server::db::{Db, Pool};
use serde_json::json;

const TOOLS: [&str; 20] = [
    "consul.service_health",
    "consul.members",
    "consul.catalog_services",
    "consul.autopilot_state",
    "nomad.job_status",
    "nomad.job_allocations",
    "nomad.node_status",
    "nomad.alloc_status",
    "nomad.job_resources",
    "traefik.overview",
    "traefik.routers",
    "traefik.services",
    "traefik.entrypoints",
    "frr.bgp_summary",
    "frr.neighbor",
    "linux.uptime",
    "linux.kernel_info",
    "debian.unit_status",
    "vm.query_instant",
    "vm.query_range",
];
const RUNNERS: usize = 50;
const ACTORS: usize = 200;
const PAGE: i64 = 100;

/// splitmix64: small, fast, deterministic; good enough to pick names.
#[derive(Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    /// Skewed towards low indexes: index 0 gets ~sqrt(1/n) of the picks, the last ~1/(2n).
    fn skewed(&mut self, n: usize) -> usize {
        let u = self.unit();
        ((u * u) * n as f64) as usize % n
    }
    fn range(&mut self, lo: i64, hi: i64) -> i64 {
        if hi <= lo {
            return lo;
        }
        lo + (self.next() % (hi - lo) as u64) as i64
    }
}

fn tool(r: &mut Rng) -> String {
    TOOLS[r.skewed(TOOLS.len())].to_owned()
}
fn runner_name(i: usize) -> String {
    format!("node-{i:02}")
}
fn actor_name(i: usize) -> String {
    format!("agent:agent-{i:03}")
}

/// Latency samples in microseconds.
#[derive(Default)]
struct Samples(Vec<u64>);

impl Samples {
    fn push(&mut self, d: Duration) {
        self.0.push(d.as_micros() as u64);
    }
    fn pct(&mut self, p: f64) -> f64 {
        if self.0.is_empty() {
            return f64::NAN;
        }
        self.0.sort_unstable();
        let i = ((p / 100.0) * (self.0.len() - 1) as f64).round() as usize;
        self.0[i] as f64 / 1000.0
    }
    fn max(&mut self) -> f64 {
        self.pct(100.0)
    }
}

fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// One simulated tool call's events: intent then outcome, or a rejection.
fn call_events(r: &mut Rng) -> Vec<NewEvent> {
    let actor = actor_name(r.skewed(ACTORS));
    let tool = tool(r);
    let runner = runner_name(r.below(RUNNERS));
    // As the gateway makes them (UUIDv7).
    let call_id = uuid::Uuid::now_v7().to_string();
    let args = json!({"service": format!("svc-{}", r.below(500)), "limit": 50});
    if r.unit() < 0.05 {
        return vec![NewEvent {
            actor,
            kind: kind::TOOL_REJECTED.into(),
            tool: Some(tool),
            runner: Some(runner),
            args: Some(args),
            reason: Some("params.service: `svc-x` is not in allowlist services".into()),
            call_id: Some(call_id),
            outcome: Some("refused".into()),
            ..Default::default()
        }];
    }
    let called = NewEvent {
        actor: actor.clone(),
        kind: kind::TOOL_CALLED.into(),
        tool: Some(tool.clone()),
        runner: Some(runner.clone()),
        args: Some(args),
        reason: Some("investigating elevated 5xx on the edge".into()),
        call_id: Some(call_id.clone()),
        ..Default::default()
    };
    let failed = r.unit() < 0.08;
    let outcome = NewEvent {
        actor,
        kind: if failed {
            kind::CALL_FAILED
        } else {
            kind::CALL_EXECUTED
        }
        .into(),
        tool: Some(tool),
        runner: Some(runner),
        call_id: Some(call_id),
        outcome: Some(if failed { "error" } else { "ok" }.into()),
        result_digest: (!failed).then(|| {
            format!(
                "{:016x}{:016x}{:016x}{:016x}",
                r.next(),
                r.next(),
                r.next(),
                r.next()
            )
        }),
        detail: Some(if failed {
            json!({"error": "runner unreachable: connection refused", "duration_ms": r.below(3000)})
        } else {
            json!({"duration_ms": r.below(200), "bytes": r.below(20000)})
        }),
        ..Default::default()
    };
    vec![called, outcome]
}

struct AppendStats {
    events: u64,
    calls: u64,
    wall: Duration,
    latency: Samples,
}

/// `callers` tasks each make calls (awaiting the intent before writing the outcome, as the
/// gateway does) until `budget` events are written or `deadline` passes.
async fn drive(
    audit: &AuditLog,
    callers: usize,
    budget: Option<u64>,
    deadline: Option<Duration>,
    seed: u64,
    progress: bool,
) -> AppendStats {
    let remaining = Arc::new(AtomicI64::new(budget.map_or(i64::MAX, |b| b as i64)));
    let written = Arc::new(AtomicI64::new(0));
    let started = Instant::now();
    let stop_at = deadline.map(|d| started + d);
    let reporter = progress.then(|| {
        let written = written.clone();
        tokio::spawn(async move {
            let mut last = 0;
            loop {
                tokio::time::sleep(Duration::from_secs(10)).await;
                let now = written.load(Ordering::Relaxed);
                log(format!(
                    "  {} events written ({}/s over the last 10 s)",
                    thousands(now as u64),
                    (now - last) / 10
                ));
                last = now;
            }
        })
    });
    let mut tasks = Vec::new();
    for t in 0..callers {
        let audit = audit.clone();
        let remaining = remaining.clone();
        let written = written.clone();
        tasks.push(tokio::spawn(async move {
            let mut r = Rng(seed ^ ((t as u64 + 1) * 0x1234_5678_9abc));
            let mut latency = Samples::default();
            let (mut events, mut calls) = (0u64, 0u64);
            loop {
                if stop_at.is_some_and(|s| Instant::now() >= s) {
                    break;
                }
                let mut evs = call_events(&mut r);
                let before = remaining.fetch_sub(evs.len() as i64, Ordering::Relaxed);
                if before <= 0 {
                    break;
                }
                if before < evs.len() as i64 {
                    // One event left in the budget: write just the intent.
                    evs.truncate(before as usize);
                }
                calls += 1;
                for e in evs {
                    let t0 = Instant::now();
                    audit.append(e).await.expect("append failed");
                    latency.push(t0.elapsed());
                    events += 1;
                    written.fetch_add(1, Ordering::Relaxed);
                }
            }
            (events, calls, latency)
        }));
    }
    let mut stats = AppendStats {
        events: 0,
        calls: 0,
        wall: Duration::ZERO,
        latency: Samples::default(),
    };
    for t in tasks {
        let (e, c, l) = t.await.expect("caller task panicked");
        stats.events += e;
        stats.calls += c;
        stats.latency.0.extend(l.0);
    }
    stats.wall = started.elapsed();
    if let Some(r) = reporter {
        r.abort();
    }
    stats
}

/// Row count and on-disk size of the audit table.
async fn table_facts(db: &Db) -> (i64, Option<i64>) {
    match db.pool() {
        Pool::Pg(p) => sqlx::query_as::<_, (i64, i64)>(
            "SELECT count(*), pg_total_relation_size('audit_events') FROM audit_events",
        )
        .fetch_one(p)
        .await
        .map(|(n, s)| (n, Some(s)))
        .expect("count"),
        Pool::Sqlite(p) => {
            let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM audit_events")
                .fetch_one(p)
                .await
                .expect("count");
            (n, None)
        }
    }
}

async fn last_seq(db: &Db) -> i64 {
    let q = "SELECT COALESCE(MAX(seq), 0) FROM audit_events";
    let (n,): (i64,) =
        emisar::with_pool!(db, p => sqlx::query_as(q).fetch_one(p).await).expect("max seq");
    n
}

/// The event at `seq`, through the public query API.
async fn event_at(db: &Db, seq: i64) -> audit::Event {
    let f = AuditFilter {
        after_seq: Some(seq - 1),
        limit: 1,
        ..Default::default()
    };
    audit::query(db, &f)
        .await
        .expect("query")
        .pop()
        .expect("event exists")
}

/// Up to `n` events from the start of the log, read in pages.
async fn hash_sample(db: &Db, n: usize) -> Vec<audit::Event> {
    let mut out = Vec::with_capacity(n);
    let mut f = AuditFilter {
        limit: 1000,
        ..Default::default()
    };
    while out.len() < n {
        let page = audit::query(db, &f).await.expect("query");
        let Some(last) = page.last() else { break };
        f.after_seq = Some(last.seq);
        out.extend(page);
    }
    out.truncate(n);
    out
}

struct Shape {
    name: &'static str,
    what: &'static str,
    filters: Vec<AuditFilter>,
}

async fn shapes(db: &Db, last: i64, n: usize) -> Vec<Shape> {
    let mut r = Rng(0xBEEF);
    let half = last / 2;
    // Real call ids and timestamps, sampled from the log.
    let mut call_ids = Vec::with_capacity(n);
    let mut recent_times = Vec::with_capacity(n);
    let mut windows = Vec::with_capacity(n);
    let span = (last / 100).max(1); // ≈1 % of the log
    for _ in 0..n {
        let e = event_at(db, r.range(1, last + 1)).await;
        call_ids.push(e.call_id.expect("seeded events carry a call id"));
        let at = |e: &audit::Event| {
            chrono::DateTime::parse_from_rfc3339(&e.at)
                .expect("at")
                .with_timezone(&chrono::Utc)
        };
        recent_times.push(at(&event_at(db, r.range(half.max(1), last + 1)).await));
        let start = r.range(1, (last - span).max(2));
        let a = at(&event_at(db, start).await);
        let b = at(&event_at(db, (start + span).min(last)).await);
        windows.push((a, b));
    }
    let page = |f: AuditFilter| AuditFilter { limit: PAGE, ..f };
    let mut out = Vec::new();
    let mut add = |name, what, f: &mut dyn FnMut(usize) -> AuditFilter| {
        out.push(Shape {
            name,
            what,
            filters: (0..n).map(|i| page(f(i))).collect(),
        })
    };
    let mut r1 = r.clone();
    add(
        "tool+runner",
        "tool = T AND runner = R, first page",
        &mut |_| AuditFilter {
            tool: Some(TOOLS[r1.below(TOOLS.len())].into()),
            runner: Some(runner_name(r1.below(RUNNERS))),
            ..Default::default()
        },
    );
    let mut r2 = r.clone();
    r2.next();
    add(
        "tool+runner deep cursor",
        "tool = T AND runner = R, after_seq = random seq in the newer half",
        &mut |_| AuditFilter {
            tool: Some(TOOLS[r2.below(TOOLS.len())].into()),
            runner: Some(runner_name(r2.below(RUNNERS))),
            after_seq: Some(r2.range(half, last)),
            ..Default::default()
        },
    );
    let mut r3 = r.clone();
    r3.next();
    r3.next();
    add("actor", "actor = A, first page", &mut |_| AuditFilter {
        actor: Some(actor_name(r3.below(ACTORS))),
        ..Default::default()
    });
    add(
        "actor deep cursor",
        "actor = A, after_seq = random seq in the newer half",
        &mut |_| AuditFilter {
            actor: Some(actor_name(r3.below(ACTORS))),
            after_seq: Some(r3.range(half, last)),
            ..Default::default()
        },
    );
    add(
        "actor+tool",
        "actor = A AND tool = T, first page",
        &mut |_| AuditFilter {
            actor: Some(actor_name(r3.below(ACTORS))),
            tool: Some(TOOLS[r3.below(TOOLS.len())].into()),
            ..Default::default()
        },
    );
    add(
        "kind+since",
        "kind = call.failed AND at >= (time of a random event in the newer half)",
        &mut |i| AuditFilter {
            kind: Some(kind::CALL_FAILED.into()),
            since: Some(recent_times[i]),
            ..Default::default()
        },
    );
    add(
        "runner+kind",
        "runner = R AND kind = call.failed, first page",
        &mut |_| AuditFilter {
            runner: Some(runner_name(r3.below(RUNNERS))),
            kind: Some(kind::CALL_FAILED.into()),
            ..Default::default()
        },
    );
    add(
        "time window",
        "at >= A AND at < B, a random window of ≈1 % of the log",
        &mut |i| AuditFilter {
            since: Some(windows[i].0),
            until: Some(windows[i].1),
            ..Default::default()
        },
    );
    add("call_id", "call_id = C (a real call)", &mut |i| {
        AuditFilter {
            call_id: Some(call_ids[i].clone()),
            ..Default::default()
        }
    });
    add(
        "cursor deep",
        "no filter, after_seq = random seq (any depth)",
        &mut |_| AuditFilter {
            after_seq: Some(r3.range(0, (last - PAGE).max(1))),
            ..Default::default()
        },
    );
    add(
        "latest page",
        "no filter, after_seq = last seq − 100",
        &mut |_| AuditFilter {
            after_seq: Some((last - PAGE).max(0)),
            ..Default::default()
        },
    );
    out
}

struct ShapeResult {
    name: &'static str,
    what: &'static str,
    lat: Samples,
    rows: f64,
}

async fn measure_queries(db: &Db, last: i64, n: usize) -> Vec<ShapeResult> {
    let mut results = Vec::new();
    for shape in shapes(db, last, n).await {
        // Warm-up with the first filters (same plans, caches hot), then time every filter.
        for f in shape.filters.iter().take(20) {
            audit::query(db, f).await.expect("query");
        }
        let mut lat = Samples::default();
        let mut rows = 0usize;
        for f in &shape.filters {
            let t0 = Instant::now();
            let events = audit::query(db, f).await.expect("query");
            lat.push(t0.elapsed());
            rows += events.len();
        }
        let mut res = ShapeResult {
            name: shape.name,
            what: shape.what,
            lat,
            rows: rows as f64 / shape.filters.len() as f64,
        };
        log(format!(
            "  {:<24} p50 {} ms  p95 {} ms  p99 {} ms",
            res.name,
            ms(res.lat.pct(50.0)),
            ms(res.lat.pct(95.0)),
            ms(res.lat.pct(99.0))
        ));
        results.push(res);
    }
    results
}

async fn run_backend(label: &str, prefix: &str, url: &str, events: u64, seed: bool, out: &mut Out) {
    use std::fmt::Write;
    let mut report = std::mem::take(&mut out.report);
    let report = &mut report;
    let callers = env_num("BENCH_CONCURRENCY", 256) as usize;
    let queries = env_num("BENCH_QUERIES", 300) as usize;
    let sweep_secs = env_num("BENCH_SWEEP_SECS", 4);

    log(format!("{label}: connecting"));
    let db = Db::connect(url).await.expect("connect and migrate");
    let audit = AuditLog::start(db.clone());
    let (existing, _) = table_facts(&db).await;
    let _ = writeln!(report, "\n### {label}\n");

    if seed {
        assert!(
            existing == 0,
            "{label}: audit_events already holds {existing} events; use an empty database or BENCH_SEED=0"
        );
        log(format!(
            "{label}: seeding {} events with {callers} concurrent callers",
            thousands(events)
        ));
        let mut s = drive(&audit, callers, Some(events), None, 42, true).await;
        let eps = s.events as f64 / s.wall.as_secs_f64();
        log(format!(
            "{label}: seeded {} events in {:.1} s ({eps:.0} events/s)",
            thousands(s.events),
            s.wall.as_secs_f64()
        ));
        out.kv(prefix, "seed_events", s.events);
        out.kv(prefix, "seed_calls", s.calls);
        out.kv(
            prefix,
            "seed_wall_s",
            format!("{:.1}", s.wall.as_secs_f64()),
        );
        out.kv(prefix, "seed_appends_per_s", format!("{eps:.0}"));
        out.kv(prefix, "seed_callers", callers);
        let _ = writeln!(
            report,
            "**Seeding through `AuditLog::append`** ({callers} concurrent callers, each call = \
             `tool.called` awaited, then `call.executed`/`call.failed`; 5 % are a single \
             `tool.rejected`):\n"
        );
        let _ = writeln!(
            report,
            "| events | calls | wall | appends/s | calls/s | append p50 | append p95 | append p99 |"
        );
        let _ = writeln!(report, "|---:|---:|---:|---:|---:|---:|---:|---:|");
        let _ = writeln!(
            report,
            "| {} | {} | {:.1} s | {} | {} | {} ms | {} ms | {} ms |\n",
            thousands(s.events),
            thousands(s.calls),
            s.wall.as_secs_f64(),
            thousands(eps as u64),
            thousands((s.calls as f64 / s.wall.as_secs_f64()) as u64),
            ms(s.latency.pct(50.0)),
            ms(s.latency.pct(95.0)),
            ms(s.latency.pct(99.0)),
        );
    } else {
        log(format!(
            "{label}: BENCH_SEED=0, measuring the {existing} events already there"
        ));
    }

    let (count, size) = table_facts(&db).await;
    let last = last_seq(&db).await;
    out.kv(prefix, "events", count);
    let _ = writeln!(
        report,
        "Log: {} events{}.\n",
        thousands(count as u64),
        size.map_or(String::new(), |s| format!(
            ", `audit_events` with indexes = {} MiB",
            s / (1024 * 1024)
        ))
    );
    if let Pool::Pg(p) = db.pool() {
        let _ = sqlx::query("ANALYZE audit_events").execute(p).await;
    }

    log(format!(
        "{label}: search latency, {queries} queries per shape, limit {PAGE}"
    ));
    let results = measure_queries(&db, last, queries).await;
    let _ = writeln!(
        report,
        "**Search** (`emisar::server::audit::query`, limit {PAGE}, oldest first; {queries} timed \
         queries per shape after 20 warm-up, one client, sequential):\n"
    );
    let _ = writeln!(
        report,
        "| shape | filter | p50 | p95 | p99 | max | rows/query |"
    );
    let _ = writeln!(report, "|---|---|---:|---:|---:|---:|---:|");
    let mut worst_filtered = 0f64;
    for mut r in results {
        let p95 = r.lat.pct(95.0);
        out.kv(
            prefix,
            &format!("search_p95_ms.{}", r.name.replace(' ', "_")),
            ms(p95),
        );
        if !matches!(r.name, "cursor deep" | "latest page") {
            worst_filtered = worst_filtered.max(p95);
        }
        let _ = writeln!(
            report,
            "| {} | {} | {} ms | {} ms | {} ms | {} ms | {:.0} |",
            r.name,
            r.what,
            ms(r.lat.pct(50.0)),
            ms(r.lat.pct(95.0)),
            ms(r.lat.pct(99.0)),
            ms(r.lat.max()),
            r.rows
        );
    }

    out.kv(prefix, "search_p95_worst_filtered_ms", ms(worst_filtered));
    log(format!("{label}: verify"));
    let _ = writeln!(
        report,
        "\n**Verify** (`emisar::server::audit::verify(&db, None)`, whole chain):\n"
    );
    let _ = writeln!(report, "| run | events checked | wall | events/s |");
    let _ = writeln!(report, "|---:|---:|---:|---:|");
    let mut best = f64::INFINITY;
    for run in 1..=2 {
        let t0 = Instant::now();
        let v = audit::verify(&db, None).await.expect("verify");
        let wall = t0.elapsed();
        assert!(v.is_intact(), "chain broken: {v:?}");
        assert_eq!(v.checked as i64, count, "verify checked every event");
        best = best.min(wall.as_secs_f64());
        log(format!(
            "  run {run}: {} events in {:.2} s",
            thousands(v.checked),
            wall.as_secs_f64()
        ));
        let _ = writeln!(
            report,
            "| {run} | {} | {:.2} s | {} |",
            thousands(v.checked),
            wall.as_secs_f64(),
            thousands((v.checked as f64 / wall.as_secs_f64()) as u64)
        );
    }

    out.kv(prefix, "verify_best_s", format!("{best:.2}"));

    // Verifying only what is new since a checkpoint the auditor kept (`audit verify
    // --checkpoint`): the newest 10,000 events of the log, whatever its size.
    let fresh = 10_000i64.min(count - 1).max(1);
    let (kept_size, size) = ((count - fresh) as u64, count as u64);
    let key = emisar::tlog::keys::NoteKey::generate("bench.emisar.test/audit").expect("log key");
    let keys = emisar::tlog::keys::Verifiers::parse([key.verifier_key().as_str()]).expect("vkey");
    let sign = |n: u64, root| {
        emisar::tlog::checkpoint::sign("bench.emisar.test/audit", n, root, "", &key).expect("sign")
    };
    let kept = sign(
        kept_size,
        audit::tree::root(&db, kept_size).await.expect("root"),
    );
    let latest = sign(size, audit::tree::root(&db, size).await.expect("root"));
    emisar::with_pool!(&db, pool => sqlx::query(
        "INSERT INTO audit_checkpoints (size, note) VALUES ($1, $2) ON CONFLICT (size) DO NOTHING")
        .bind(size as i64).bind(String::from_utf8(latest.clone()).expect("utf-8")).execute(pool).await.map(|_| ()))
    .expect("store the newest checkpoint");
    let mut runs = Vec::new();
    for _ in 0..5 {
        let t0 = Instant::now();
        let r = audit::proofs::verify_from(&db, &kept, &keys, None, &[])
            .await
            .expect("verify --checkpoint");
        runs.push(t0.elapsed());
        assert!(r.problem.is_none(), "{r:?}");
        assert_eq!(r.verified, fresh as u64);
    }
    runs.sort();
    let msf = |d: Duration| d.as_secs_f64() * 1e3;
    let median = msf(runs[runs.len() / 2]);
    out.kv(prefix, "verify_checkpoint_ms", ms(median));
    out.kv(prefix, "verify_checkpoint_events", fresh);
    let _ = writeln!(
        report,
        "\n**Verify from a kept checkpoint** (`proofs::verify_from`, as `audit verify \
         --checkpoint`: the consistency proof from size {} to {}, the anchor's inclusion, then the \
         newest {} events rehashed onto the kept tree): median of 5 runs {} ms (best {} ms, worst \
         {} ms).",
        thousands(kept_size),
        thousands(size),
        thousands(fresh as u64),
        ms(median),
        ms(msf(runs[0])),
        ms(msf(runs[runs.len() - 1]))
    );

    // Where verify's time goes: the hashing alone, on events already in memory.
    let sample = hash_sample(&db, 100_000).await;
    let t0 = Instant::now();
    let mut ok = 0usize;
    for e in &sample {
        ok += usize::from(e.compute_hash() == e.hash);
    }
    let per_event_us = t0.elapsed().as_secs_f64() * 1e6 / sample.len().max(1) as f64;
    assert_eq!(
        ok,
        sample.len(),
        "every sampled event hashes to its stored hash"
    );
    // The SHA-256 part of it: digest canonical texts of the same size, prepared beforehand.
    let texts: Vec<String> = sample
        .iter()
        .map(|e| emisar::digest::canonical_json(&serde_json::to_value(e).expect("event")))
        .collect();
    let t0 = Instant::now();
    let mut sink = 0usize;
    for t in &texts {
        sink += emisar::digest::sha256_hex(t.as_bytes()).len();
    }
    let sha_us = t0.elapsed().as_secs_f64() * 1e6 / texts.len().max(1) as f64;
    assert!(sink > 0);
    let avg_len = texts.iter().map(String::len).sum::<usize>() / texts.len().max(1);
    let hash_share = per_event_us * count as f64 / 1e6;
    out.kv(
        prefix,
        "verify_hash_us_per_event",
        format!("{per_event_us:.2}"),
    );
    out.kv(prefix, "verify_sha256_us_per_event", format!("{sha_us:.2}"));
    let _ = writeln!(
        report,
        "\nOf that, `Event::compute_hash` alone (canonical JSON + SHA-256, one core, {} events \
         already in memory) costs {per_event_us:.2} µs/event, i.e. ≈ {hash_share:.1} s of the \
         best run, of which SHA-256 itself is {sha_us:.2} µs/event (≈ {avg_len} bytes of \
         canonical JSON per event); the rest of the run is the database producing the rows, \
         the transfer and decoding them.",
        thousands(sample.len() as u64)
    );
    if sweep_secs > 0 {
        log(format!(
            "{label}: append throughput by concurrency, {sweep_secs} s each"
        ));
        let _ = writeln!(
            report,
            "\n**Group commit by concurrency** (appends on top of the log above, {sweep_secs} s \
             per level):\n"
        );
        let _ = writeln!(
            report,
            "| concurrent callers | appends/s | calls/s | append p50 | append p99 |"
        );
        let _ = writeln!(report, "|---:|---:|---:|---:|---:|");
        for (i, c) in [1usize, 8, 64, 256].into_iter().enumerate() {
            let mut s = drive(
                &audit,
                c,
                None,
                Some(Duration::from_secs(sweep_secs)),
                100 + i as u64,
                false,
            )
            .await;
            let secs = s.wall.as_secs_f64();
            out.kv(
                prefix,
                &format!("sweep_appends_per_s.{c}"),
                format!("{:.0}", s.events as f64 / secs),
            );
            log(format!(
                "  {c:>3} callers: {:.0} appends/s, p50 {} ms",
                s.events as f64 / secs,
                ms(s.latency.pct(50.0))
            ));
            let _ = writeln!(
                report,
                "| {c} | {} | {} | {} ms | {} ms |",
                thousands((s.events as f64 / secs) as u64),
                thousands((s.calls as f64 / secs) as u64),
                ms(s.latency.pct(50.0)),
                ms(s.latency.pct(99.0))
            );
        }
    }
    drop(audit);
    db.close().await;
    out.report = std::mem::take(report);
}

#[tokio::main]
async fn main() {
    let mut out = Out::default();
    // `cargo bench` passes `--bench`; nothing else is accepted.
    if std::env::args().skip(1).any(|a| a != "--bench") {
        eprintln!(
            "usage: DATABASE_URL=postgres://… cargo bench --bench audit (settings by env, see the file header)"
        );
        std::process::exit(2);
    }
    let seed = env_num("BENCH_SEED", 1) != 0;
    match std::env::var("DATABASE_URL") {
        Ok(url) if url.starts_with("postgres") => {
            let n = env_num("BENCH_EVENTS", 1_000_000);
            run_backend(
                &format!("PostgreSQL, {} events", thousands(n)),
                "pg",
                &url,
                n,
                seed,
                &mut out,
            )
            .await;
        }
        _ => log("DATABASE_URL is not a postgres:// URL: skipping PostgreSQL"),
    }
    let n = env_num("BENCH_SQLITE_EVENTS", 100_000);
    if n > 0 {
        let dir = std::env::temp_dir().join(format!("emisar-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let url = format!("sqlite://{}", dir.join("audit.db").display());
        run_backend(
            &format!("SQLite (WAL), {} events", thousands(n)),
            "sqlite",
            &url,
            n,
            true,
            &mut out,
        )
        .await;
        let _ = std::fs::remove_dir_all(&dir);
    }
    if let Ok(path) = std::env::var("BENCH_SUMMARY") {
        std::fs::write(&path, &out.summary).expect("write BENCH_SUMMARY");
    }
    print!("{}", out.report);
}
