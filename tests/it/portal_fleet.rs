//! The Runners grid with 1,000 runners and the audit charts in a real browser (issue 48):
//! headless Chromium, driven by tests/browser/portal_fleet_e2e.mjs, against two replicas of
//! one server on PostgreSQL. Every runner is registered by the real join path, as the
//! registry keeps it:
//! - 599 join through the replica the page is served from, each with a real (in-process)
//!   runner behind its URL: the join counts as their first heartbeat and every probe answers,
//!   so they are up; one more runner is configured, for the calls the charts show;
//! - 400 join through the other replica with a URL where nothing listens: the page's replica
//!   loads them from the store (its sync) and has never seen them until its prober (one
//!   probe each within its 2-minute interval) finds them down, so while the test runs some
//!   are never seen and some down.
//!
//! The driver reports what the page drew and the very API answers it drew it from; this test
//! classifies each runner itself from that answer (the rule of docs/operator-guide.md) and
//! checks every tile, the counts at the top, a filter, and each chart's bars against
//! `/api/audit/activity`, which it checks against the audit events. Not timed: the page's
//! render time at 1,000 runners is measured by `BENCH_ONLY=portal scripts/bench`.
//! Screenshots are kept under target/portal-fleet/; docs/portal-runners-1000.png and
//! docs/portal-audit-charts.png are copies of 01-runners-1000.png and 03-audit-charts.png.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use emisar::server::config::JoinConfig;
use emisar::server::fleet::JoinTokenSpec;
use emisar::server::principal::Role;
use serde_json::{Value, json};
use tokio::net::TcpListener;

use crate::approvals::add_user;
use crate::harness::app::{Options, TestApp};
use crate::harness::tools::require;
use crate::harness::{Backend, RunnerSpec, spawn_app};
use crate::mcp_calls::{call, fixtures_dir};
use crate::portal_browser::{BROWSER_BUDGET, CHROMIUM, Driver, assert_png, require_path};
use crate::portal_grid::assert_chart_drawn_from;

/// Runners that join the page's replica, each with a real runner behind it (200 per dc).
const JOINED_UP: usize = 599;
/// Runners that join the other replica at a URL where nothing listens.
const JOINED_DEAD: usize = 400;
const ALL: usize = JOINED_UP + 1 + JOINED_DEAD;
/// Where nothing listens (the discard port): every probe of it fails.
const NOWHERE: &str = "http://127.0.0.1:9/";
/// Joins sent at once (the server takes four at a time).
const JOINS_AT_ONCE: usize = 8;
const SCREENSHOTS: [&str; 3] = [
    "01-runners-1000.png",
    "02-runners-filtered.png",
    "03-audit-charts.png",
];

/// A runner's state by the rule docs/operator-guide.md gives (worst first).
fn expected_state(r: &Value) -> &'static str {
    if r["breaker"] == "open" {
        "breaker-open"
    } else if r["heartbeat_ok"] == false {
        "down"
    } else if r["breaker"] == "half-open" {
        "degraded"
    } else if r["heartbeat_ok"].is_null() && r["last_call"].is_null() {
        "never-seen"
    } else {
        "up"
    }
}

fn count_states(runners: &[Value]) -> BTreeMap<&'static str, usize> {
    let mut counts = BTreeMap::new();
    for r in runners {
        *counts.entry(expected_state(r)).or_insert(0usize) += 1;
    }
    counts
}

/// The server's `[join]` for a fleet that joins from loopback, as fast as the test can.
fn loopback_joins() -> JoinConfig {
    JoinConfig {
        allowed_networks: Some(vec!["127.0.0.0/8".into()]),
        attempts_per_address_per_minute: 100_000,
    }
}

/// A join token of `app` for `uses` runners, each given `labels`.
async fn fleet_token(app: &TestApp, uses: u32, labels: &[(&str, &str)]) -> String {
    let spec = JoinTokenSpec {
        max_uses: uses,
        labels: labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        ..JoinTokenSpec::once(Duration::from_secs(600))
    };
    app.join_token(spec).await.1
}

/// Joins runner `name` at `url` through `app`'s `POST /api/runners/join`.
async fn join(app: &TestApp, token: &str, name: &str, url: &str) {
    let body = json!({"name": name, "url": url, "labels": {}, "packs": {}});
    let (status, answer) = app.raw_join(token, &body).await;
    assert_eq!(status, 200, "{name}: {answer}");
}

/// Joins `runners` (name, URL) through `app` with `token`, [`JOINS_AT_ONCE`] at a time.
async fn join_all(app: &TestApp, token: &str, runners: Vec<(String, String)>) {
    use futures::StreamExt;
    futures::stream::iter(runners)
        .for_each_concurrent(JOINS_AT_ONCE, |(name, url)| async move {
            join(app, token, &name, &url).await;
        })
        .await;
}

/// 599 runners, each a real runner on its own port, joined through `app`: 200 per dc.
async fn join_live_runners(app: &TestApp) -> Vec<tokio_util::sync::CancellationToken> {
    let mut stops = Vec::new();
    for dc in ["dc1", "dc2", "dc3"] {
        let token = fleet_token(app, 200, &[("dc", dc), ("role", "edge")]).await;
        let first = if dc == "dc1" { 1 } else { 0 };
        let mut runners = Vec::new();
        for i in first..200 {
            let name = format!("{dc}-edge-{i:03}");
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let url = format!("http://{}", listener.local_addr().unwrap());
            stops.push(app.start_runner(&name, listener).await);
            runners.push((name, url));
        }
        join_all(app, &token, runners).await;
    }
    stops
}

/// 400 runners joined through `other` (another replica) where nothing listens.
async fn join_dead_runners(other: &TestApp) {
    let token = fleet_token(
        other,
        JOINED_DEAD as u32,
        &[("dc", "dc4"), ("role", "cache")],
    )
    .await;
    let runners = (0..JOINED_DEAD)
        .map(|i| (format!("dc4-cache-{i:03}"), NOWHERE.to_owned()))
        .collect();
    join_all(other, &token, runners).await;
}

/// Waits until `app` lists every runner, some of the dead ones already probed (down) and
/// some not yet (never seen).
async fn fleet_in_every_state(app: &TestApp) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let body = app.runners_api().await;
        let counts = count_states(body["runners"].as_array().unwrap());
        let (down, unseen) = (counts.get("down"), counts.get("never-seen"));
        if counts.values().sum::<usize>() == ALL
            && counts.get("up") == Some(&(JOINED_UP + 1))
            && down.is_some_and(|n| *n >= 20)
            && unseen.is_some_and(|n| *n >= 100)
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the fleet never reached every state: {counts:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Activity for the charts: calls that pass the checks, and one refused.
async fn make_activity(app: &TestApp) {
    let client = app.mcp_client().await;
    for word in ["one", "two", "three"] {
        let ok = call(
            &client,
            "testkit.echo",
            json!({"runners": ["dc1-edge-000"], "reason": "chart me", "word": word}),
        )
        .await;
        assert_ne!(ok.is_error, Some(true), "{ok:?}");
    }
    let refused = call(
        &client,
        "testkit.echo",
        json!({"runners": ["no-such-runner"], "reason": "refuse me", "word": "hi"}),
    )
    .await;
    assert_eq!(refused.is_error, Some(true), "{refused:?}");
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runners_grid_with_1000_runners_and_the_audit_charts_in_a_real_browser() {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let node = require("node/bin/node");
    let chromium = require_path(Path::new(CHROMIUM));
    require_path(&repo.join("tests/browser/node_modules/playwright-core/package.json"));

    let started = Instant::now();
    let app = spawn_app(
        Backend::Postgres,
        vec![
            RunnerSpec::new("dc1-edge-000")
                .label("dc", "dc1")
                .label("role", "edge"),
        ],
        Options {
            packs_dir: Some(fixtures_dir()),
            probe_interval_ms: Some(120_000),
            join: Some(loopback_joins()),
            ..Default::default()
        },
    )
    .await;
    let other = spawn_app(
        Backend::Postgres,
        vec![],
        Options {
            database_url: Some(app.database_url.clone()),
            keys: Some((app.private_key.clone(), app.public_key.clone())),
            join: Some(loopback_joins()),
            ..Default::default()
        },
    )
    .await;
    eprintln!("two replicas up in {:?}", started.elapsed());
    let _live = join_live_runners(&app).await;
    eprintln!("{JOINED_UP} live runners joined at {:?}", started.elapsed());
    join_dead_runners(&other).await;
    eprintln!(
        "{JOINED_DEAD} dead runners joined at {:?}",
        started.elapsed()
    );
    fleet_in_every_state(&app).await;
    eprintln!("{ALL} runners registered in {:?}", started.elapsed());
    make_activity(&app).await;
    let password = add_user(&app, "carol", Role::Auditor).await;

    let shots = repo.join("target/portal-fleet");
    std::fs::create_dir_all(&shots).unwrap();
    for name in SCREENSHOTS.iter().chain(&["99-failure.png"]) {
        let _ = std::fs::remove_file(shots.join(name));
    }
    let tmp = tempfile::tempdir().unwrap();
    let mut driver = Driver::spawn(
        &repo,
        &node,
        "tests/browser/portal_fleet_e2e.mjs",
        &[
            ("PORTAL_URL", format!("{}/", app.base_url())),
            ("PORTAL_USER", "carol".into()),
            ("PORTAL_PASSWORD", password),
            ("SCREENSHOT_DIR", shots.display().to_string()),
            ("FILTER", "dc=dc4".into()),
            ("CHROMIUM", chromium.display().to_string()),
            ("TMPDIR", tmp.path().display().to_string()),
        ],
    );
    let browser = async {
        let grid = driver.expect_json("{\"runners\": …}").await;
        let filtered = driver.expect_json("{\"filtered\": …}").await;
        let chart = driver.expect_json("{\"activity\": …}").await;
        let done = driver.expect_json("{\"done\": true}").await;
        assert_eq!(done, json!({"done": true}), "{}", driver.transcript());
        let status = driver.wait_exit().await;
        assert!(
            status.success(),
            "the driver exited with {status}\n{}",
            driver.transcript()
        );
        (grid, filtered, chart)
    };
    let (grid, filtered, chart) = match tokio::time::timeout(BROWSER_BUDGET, browser).await {
        Ok(seen) => seen,
        Err(_) => panic!(
            "the browser test did not finish within {BROWSER_BUDGET:?}\n{}",
            driver.transcript()
        ),
    };

    // Every runner of the answer the page drew has one tile, in the state the rule gives, and
    // the answer has runners up, down and never seen.
    let drawn_from = grid["runners"]["runners"].as_array().unwrap();
    assert_eq!(drawn_from.len(), ALL);
    let want: BTreeMap<String, Value> = drawn_from
        .iter()
        .map(|r| {
            let name = r["name"].as_str().unwrap().to_owned();
            (name, json!(expected_state(r)))
        })
        .collect();
    let tiles: BTreeMap<String, Value> = serde_json::from_value(grid["tiles"].clone()).unwrap();
    assert_eq!(tiles, want, "tiles against the answer they were drawn from");
    let counts = count_states(drawn_from);
    assert_eq!(counts.get("up"), Some(&(JOINED_UP + 1)), "{counts:?}");
    let (down, unseen) = (counts["down"], counts["never-seen"]);
    assert_eq!(down + unseen, JOINED_DEAD, "{counts:?}");
    assert_eq!(
        grid["counts"],
        json!({"all": ALL, "up": JOINED_UP + 1, "down": down, "never-seen": unseen,
               "breaker-open": 0, "degraded": 0}),
        "the counts at the top"
    );

    // The filter leaves the dead dc's runners, each in its state.
    let dc4: BTreeMap<String, Value> = want
        .iter()
        .filter(|(name, _)| name.starts_with("dc4-"))
        .map(|(name, state)| (name.clone(), state.clone()))
        .collect();
    assert_eq!(dc4.len(), JOINED_DEAD);
    let shown: BTreeMap<String, Value> =
        serde_json::from_value(filtered["filtered"]["tiles"].clone()).unwrap();
    assert_eq!(shown, dc4, "the tiles left by the filter");
    assert_eq!(filtered["filtered"]["all"], JOINED_DEAD);

    // The charts are drawn from /api/audit/activity, which holds the calls made above.
    let answered = assert_chart_drawn_from(&app, &chart).await;
    let total = |i: usize| answered.iter().map(|c| c[i]).sum::<i64>();
    assert_eq!(total(1), 3, "three calls passed the checks");
    assert!(total(2) >= 1, "the refused call is a refusal");

    for name in SCREENSHOTS {
        assert_png(&shots.join(name));
    }
    assert!(!shots.join("99-failure.png").exists());
}
