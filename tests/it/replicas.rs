//! Two `emisar serve` processes on one PostgreSQL: 10,000 audit events written at once
//! through both make one unbroken chain, every seq once; and an agent driven at three times
//! its rate limit through both is served about what one replica would serve it, and so is
//! one client address trying to log in; and a replica deletes only the shared buckets full
//! for over a minute.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use emisar::server::audit::AuditFilter;
use rmcp::model::CallToolRequestParams;
use serde_json::json;

use crate::harness::pg::PgTestDb;
use crate::harness::tools::{Proc, bound_addr};

const EVENTS: usize = 10_000;
const CLIENTS_PER_REPLICA: usize = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_write_one_unbroken_chain() {
    let dir = tempfile::tempdir().unwrap();
    let pg = tokio::task::spawn_blocking(PgTestDb::create).await.unwrap();
    let (_replicas, urls) = replicas(dir.path(), &pg, (100_000, 100_000), "").await;
    let (db, token) = agent_token(&pg, "load").await;

    // Every call writes one event (emisar.runners is answered by the server itself).
    let per_client = EVENTS / (2 * CLIENTS_PER_REPLICA);
    let mut tasks = Vec::new();
    for url in &urls {
        for _ in 0..CLIENTS_PER_REPLICA {
            let client = crate::harness::tools::mcp_client(&format!("{url}/mcp"), &token).await;
            tasks.push(tokio::spawn(async move {
                let mut call_ids = Vec::new();
                for _ in 0..per_client {
                    let args = json!({"reason": "load"}).as_object().unwrap().clone();
                    let r = client
                        .call_tool(
                            CallToolRequestParams::new("emisar.runners").with_arguments(args),
                        )
                        .await
                        .unwrap();
                    assert_eq!(r.is_error, Some(false));
                    let s = r.structured_content.expect("a structured answer");
                    call_ids.push(s["call_id"].as_str().expect("a call_id").to_owned());
                }
                client.cancel().await.ok();
                call_ids
            }));
        }
    }
    let started = Instant::now();
    // The call ids the agents were given, one per answered call, all distinct.
    let mut answered = std::collections::BTreeSet::new();
    for t in tasks {
        for id in t.await.unwrap() {
            assert!(answered.insert(id.clone()), "call id {id} given twice");
        }
    }
    let elapsed = started.elapsed();
    let written = answered.len();
    assert_eq!(written, EVENTS, "every agent call was answered");

    let calls = emisar::server::audit::query(
        &db,
        &AuditFilter {
            tool: Some("emisar.runners".into()),
            limit: 10_000,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(calls.len(), written);
    // Exactly the calls the agents were answered for are on the record, each once.
    let recorded: std::collections::BTreeSet<String> =
        calls.iter().filter_map(|e| e.call_id.clone()).collect();
    assert_eq!(recorded.len(), calls.len(), "a call id recorded twice");
    assert!(
        recorded == answered,
        "{} answered calls are missing from the log, {} logged calls were never answered",
        answered.difference(&recorded).count(),
        recorded.difference(&answered).count()
    );
    let report = emisar::server::audit::verify(&db, None).await.unwrap();
    assert!(report.is_intact(), "{report:?}");
    // Everything else in the log: two server.started and one token.issued.
    assert_eq!(report.checked as usize, written + 3);
    eprintln!("replicas test: {written} events through two replicas in {elapsed:?}");
}

/// The agent's rate limit in the limit test: 20 calls/s, bursts of 20.
const RATE: u32 = 20;
const BURST: u32 = 20;
/// How long the agent is driven, and by how many clients per replica (each paced to
/// `RATE / 2` calls/s, so both replicas together are offered three times the limit).
const DRIVEN_FOR: Duration = Duration::from_secs(3);
const DRIVERS_PER_REPLICA: u32 = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_rate_limit_holds_across_two_replicas() {
    let dir = tempfile::tempdir().unwrap();
    let pg = tokio::task::spawn_blocking(PgTestDb::create).await.unwrap();
    let (_replicas, urls) = replicas(dir.path(), &pg, (RATE, BURST), "").await;
    let (_db, token) = agent_token(&pg, "eager").await;
    let mut clients = Vec::new();
    for url in &urls {
        for _ in 0..DRIVERS_PER_REPLICA {
            clients.push(crate::harness::tools::mcp_client(&format!("{url}/mcp"), &token).await);
        }
    }

    // Each client calls every 2/RATE seconds (or as fast as it is answered, if slower) until
    // DRIVEN_FOR has passed; `(served, refused)` per client.
    let started = Instant::now();
    let mut tasks = Vec::new();
    for client in clients {
        tasks.push(tokio::spawn(async move {
            let mut pace = tokio::time::interval(Duration::from_secs(2) / RATE);
            pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let (mut served, mut refused) = (0u32, 0u32);
            while started.elapsed() < DRIVEN_FOR {
                pace.tick().await;
                let args = json!({"reason": "eager"}).as_object().unwrap().clone();
                let r = client
                    .call_tool(CallToolRequestParams::new("emisar.runners").with_arguments(args))
                    .await
                    .unwrap();
                if r.is_error == Some(true) {
                    let text = serde_json::to_string(&r.content).unwrap();
                    assert!(text.contains("rate limited"), "{text}");
                    refused += 1;
                } else {
                    served += 1;
                }
            }
            client.cancel().await.ok();
            (served, refused)
        }));
    }
    let (mut served, mut refused) = (0u32, 0u32);
    for t in tasks {
        let (s, r) = t.await.unwrap();
        served += s;
        refused += r;
    }
    // Every admission happened between the first call and the last answer: over that time
    // one bucket of the quota admits BURST + RATE × t, and the replicas together at most
    // 2 × local_budget more (docs/configuration.md; local_budget is RATE × 50 ms = 1 here).
    // The longer the machine took, the looser the bound; it never flakes by slowness.
    let t = started.elapsed().as_secs_f64();
    let bound = f64::from(BURST) + f64::from(RATE) * t + 2.0;
    eprintln!(
        "rate limit across replicas: {served} served, {refused} refused in {t:.2} s (bound {bound:.1})"
    );
    assert!(
        f64::from(served) <= bound,
        "{served} calls served in {t:.2} s, more than one limit allows across two replicas ({bound:.1})"
    );
    // A limiter that refused everything fails too: the first burst always passes.
    assert!(
        served >= BURST,
        "only {served} calls served, fewer than one burst"
    );
    assert!(refused > 0, "the agent was never refused");
}

/// A client address's login limits hold across the replicas: four attempts a minute from one
/// address (any name, then one name), tried six times on each replica, are refused after the
/// fourth (plus at most one more per replica, `shared_limit.rs`'s bound), where each replica
/// alone would check four.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn login_limits_hold_across_two_replicas() {
    let per_address = "per_address_per_minute = 4\nper_name_and_address_per_minute = 100";
    // Names no one has, so no attempt is paced for having failed before.
    let checked = logins_checked_of_twelve(per_address, |i| format!("guess-{i}")).await;
    assert!(
        (4..=6).contains(&checked),
        "{checked} of 12 attempts from one address were checked across two replicas, with 4 a minute allowed"
    );
    let per_name = "per_address_per_minute = 100\nper_name_and_address_per_minute = 4";
    let checked = logins_checked_of_twelve(per_name, |_| "guess".into()).await;
    assert!(
        (4..=6).contains(&checked),
        "{checked} of 12 attempts for one name from one address were checked across two replicas, with 4 a minute allowed"
    );
}

/// Twelve wrong logins from this test's address, alternating between two fresh replicas
/// with `limits` in `[login]`, attempt `i` for `name(i)`: how many were checked (401) rather
/// than refused (429).
async fn logins_checked_of_twelve(limits: &str, name: fn(usize) -> String) -> usize {
    let dir = tempfile::tempdir().unwrap();
    let pg = tokio::task::spawn_blocking(PgTestDb::create).await.unwrap();
    let login =
        format!("[login]\n{limits}\nper_name_per_minute = 1000\nglobal_per_minute = 1000\n");
    let (_replicas, urls) = replicas(dir.path(), &pg, (20, 20), &login).await;
    let http = reqwest::Client::new();
    let (mut checked, mut refused) = (0, 0);
    for i in 0..12 {
        let body = json!({"name": name(i), "password": "not-the-password"});
        let res = http
            .post(format!("{}/api/login", urls[i % 2]))
            .json(&body)
            .send()
            .await
            .unwrap();
        match res.status().as_u16() {
            401 => checked += 1,
            429 => refused += 1,
            other => panic!("attempt {i}: {other} {}", res.text().await.unwrap()),
        }
    }
    eprintln!("logins across replicas ({limits:?}): {checked} checked, {refused} refused");
    checked
}

/// A replica deletes the shared rate buckets full for over a minute (`tat` more than 60 s
/// past, `shared_limit.rs`'s forget round, at start and then every minute) and only those: a
/// bucket in debt is an agent's limit in force, and one full only a moment ago may be in
/// debt again any moment; deleting either would reset a limit. The round at start is the one
/// a test can wait for (the next is a minute later).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_deletes_only_buckets_long_full() {
    let dir = tempfile::tempdir().unwrap();
    let pg = tokio::task::spawn_blocking(PgTestDb::create).await.unwrap();
    let migrated = tokio::process::Command::new(env!("CARGO_BIN_EXE_emisar"))
        .args(["migrate", "--database", &pg.url])
        .env_remove("DATABASE_URL")
        .output()
        .await
        .unwrap();
    assert!(
        migrated.status.success(),
        "{}",
        String::from_utf8_lossy(&migrated.stderr)
    );
    // On the database's clock, in microseconds, as the replicas write them.
    let now_us = "(extract(epoch FROM now()) * 1000000)::bigint";
    pg.superuser_sql(&format!(
        "INSERT INTO rate_buckets (key, tat) VALUES \
         ('agent:long-full', {now_us} - 600000000), \
         ('login-address:long-full', {now_us} - 61000000), \
         ('agent:full-a-moment-ago', {now_us} - 10000000), \
         ('agent:in-debt', {now_us} + 30000000)"
    ))
    .unwrap();
    let keys = || {
        let out = pg
            .superuser_sql("SELECT key FROM rate_buckets ORDER BY key")
            .unwrap();
        out.lines().map(str::to_owned).collect::<Vec<_>>()
    };
    let (_replicas, _urls) = replicas(dir.path(), &pg, (20, 40), "").await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while keys().iter().any(|k| k.ends_with(":long-full")) {
        assert!(
            Instant::now() < deadline,
            "the buckets full for over a minute are still there 30 s after the replicas started: {:?}",
            keys()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        keys(),
        ["agent:full-a-moment-ago", "agent:in-debt"],
        "only the buckets full for over a minute are deleted"
    );
}

/// Two `emisar serve` processes on `pg`, with the rate limit given and `more` config lines
/// after it; their base URLs, once both answer `/healthz`.
async fn replicas(
    d: &Path,
    pg: &PgTestDb,
    (per_second, burst): (u32, u32),
    more: &str,
) -> (Vec<Proc>, Vec<String>) {
    emisar::protocol::signing::write_keypair(&d.join("server.key"), &d.join("server.pub")).unwrap();
    let mut replicas = Vec::new();
    let mut urls = Vec::new();
    for i in 0..2 {
        let config = d.join(format!("emisar-{i}.toml"));
        std::fs::write(
            &config,
            format!(
                "listen = \"127.0.0.1:0\"\ndatabase_url = \"{}\"\nsigning_key_file = \"{}\"\nrate_limit_per_second = {per_second}\nrate_limit_burst = {burst}\n{more}",
                pg.url,
                d.join("server.key").display()
            ),
        )
        .unwrap();
        let log = d.join(format!("replica-{i}.log"));
        let mut replica = Proc(
            Command::new(env!("CARGO_BIN_EXE_emisar"))
                .args(["serve", "--config", config.to_str().unwrap()])
                .env_remove("DATABASE_URL")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .unwrap(),
        );
        let addr = bound_addr(&mut replica, &log, "emisar serving MCP").await;
        replicas.push(replica);
        urls.push(format!("http://{addr}"));
    }
    for url in &urls {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !reqwest::get(format!("{url}/healthz"))
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            assert!(Instant::now() < deadline, "{url} did not come up");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    (replicas, urls)
}

/// The store, and a token for agent `name`.
async fn agent_token(pg: &PgTestDb, name: &str) -> (emisar::server::db::Db, String) {
    let db = emisar::server::db::Db::connect(&pg.url).await.unwrap();
    let audit = emisar::server::audit::AuditLog::start(db.clone());
    let token = emisar::server::tokens::issue(
        &db,
        &audit,
        name,
        emisar::server::principal::Role::Agent,
        Duration::from_secs(3600),
        "test",
    )
    .await
    .unwrap()
    .token;
    (db, token)
}
