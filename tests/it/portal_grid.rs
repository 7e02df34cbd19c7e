//! The Runners grid and the audit activity chart in a real browser: headless Chromium, driven
//! by tests/browser/portal_grid_e2e.mjs, against a server with three dozen runners, some up,
//! some down, some with their breaker open. The driver reports what the page drew and the
//! very API answers it drew it from; this test classifies each runner itself from that answer
//! and checks every tile, the counts, the groups, the filter, the table, the detail a tile
//! opens, and each series' bars against the activity answer, which it checks against the
//! audit events. Screenshots are kept under target/portal-grid/.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use emisar::server::config::RunnerEntry;
use emisar::server::principal::Role;
use serde_json::{Value, json};

use crate::approvals::add_user;
use crate::audit_activity::scan;
use crate::harness::app::Options;
use crate::harness::tools::require;
use crate::harness::{Backend, RunnerSpec, spawn_app};
use crate::mcp_calls::{call, fixtures_dir};
use crate::portal_browser::{BROWSER_BUDGET, CHROMIUM, Driver, assert_png, require_path};

const UP: usize = 24;
const DOWN: usize = 8;
const TRIPPED: usize = 4;
const SCREENSHOTS: [&str; 7] = [
    "01-runners-grid.png",
    "02-runners-grouped.png",
    "03-runners-filtered.png",
    "04-runners-table.png",
    "05-runner-detail.png",
    "06-audit-activity.png",
    "07-audit-activity-day.png",
];

/// A runner's state as the portal must show it, by the rule docs/operator-guide.md gives
/// (worst first): breaker open, down, degraded (half-open), never seen, up.
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

/// Runners as `/api/runners` gives them, in states the live fleet of this test is not in:
/// half-open, never probed nor called, called but not yet probed, and both down and
/// half-open.
fn rule_cases() -> Value {
    json!([
        {"name": "a", "breaker": "half-open", "heartbeat_ok": true, "last_call": "2026-12-06T17:00:00Z"},
        {"name": "b", "breaker": "closed", "heartbeat_ok": null, "last_call": null},
        {"name": "c", "breaker": "closed", "heartbeat_ok": null, "last_call": "2026-12-06T17:00:00Z"},
        {"name": "d", "breaker": "half-open", "heartbeat_ok": false, "last_call": null},
    ])
}

/// A runner listed in the config that nothing listens for.
fn dead(name: &str, dc: &str, tripped: bool) -> RunnerEntry {
    let mut labels = BTreeMap::from([("dc".to_owned(), dc.to_owned())]);
    if tripped {
        labels.insert("trip".into(), "yes".into());
    }
    RunnerEntry {
        name: name.into(),
        url: "http://127.0.0.1:9".into(),
        tls_fingerprint: None,
        packs: None,
        labels,
    }
}

/// Waits until every runner shows the state the fleet was built for.
async fn settled(app: &crate::harness::app::TestApp) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let body = app.runners_api().await;
        let mut counts = BTreeMap::new();
        for r in body["runners"].as_array().unwrap() {
            *counts.entry(expected_state(r)).or_insert(0usize) += 1;
        }
        let want = BTreeMap::from([("up", UP), ("down", DOWN), ("breaker-open", TRIPPED)]);
        if counts == want {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "the fleet never settled: {counts:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runners_grid_and_the_activity_chart_in_a_real_browser() {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let node = require("node/bin/node");
    let chromium = require_path(Path::new(CHROMIUM));
    require_path(&repo.join("tests/browser/node_modules/playwright-core/package.json"));

    let runners = (0..UP)
        .map(|i| {
            RunnerSpec::new(&format!("edge-{i:02}"))
                .label("dc", if i % 2 == 0 { "dc1" } else { "dc2" })
                .label("role", "edge")
        })
        .collect();
    let dead_runners = (0..DOWN + TRIPPED)
        .map(|i| dead(&format!("gone-{i:02}"), "dc3", i >= DOWN))
        .collect();
    let app = spawn_app(
        Backend::Sqlite,
        runners,
        Options {
            packs_dir: Some(fixtures_dir()),
            extra_runners: dead_runners,
            probe_interval_ms: Some(200),
            ..Default::default()
        },
    )
    .await;
    let password = add_user(&app, "carol", Role::Auditor).await;

    // Activity for the chart, and the tripped runners' breakers opened by failing calls.
    let client = app.mcp_client().await;
    let ok = call(
        &client,
        "testkit.echo",
        json!({"selector": "role=edge", "reason": "chart me", "word": "hi"}),
    )
    .await;
    assert_ne!(ok.is_error, Some(true), "{ok:?}");
    for _ in 0..3 {
        call(
            &client,
            "testkit.echo",
            json!({"selector": "trip=yes", "reason": "trip the breaker", "word": "hi"}),
        )
        .await;
    }
    let refused = call(
        &client,
        "testkit.echo",
        json!({"runners": ["no-such-runner"], "reason": "refuse me", "word": "hi"}),
    )
    .await;
    assert_eq!(refused.is_error, Some(true), "{refused:?}");
    client.cancel().await.unwrap();
    settled(&app).await;

    let shots = repo.join("target/portal-grid");
    std::fs::create_dir_all(&shots).unwrap();
    for name in SCREENSHOTS.iter().chain(&["99-failure.png"]) {
        let _ = std::fs::remove_file(shots.join(name));
    }
    let tmp = tempfile::tempdir().unwrap();
    let mut driver = Driver::spawn(
        &repo,
        &node,
        "tests/browser/portal_grid_e2e.mjs",
        &[
            ("PORTAL_URL", format!("{}/", app.base_url())),
            ("PORTAL_USER", "carol".into()),
            ("PORTAL_PASSWORD", password),
            ("SCREENSHOT_DIR", shots.display().to_string()),
            ("FILTER", "dc=dc3".into()),
            ("GROUP_BY", "dc".into()),
            ("OPEN_STATE", "breaker-open".into()),
            ("RULE_CASES", rule_cases().to_string()),
            ("CHROMIUM", chromium.display().to_string()),
            ("TMPDIR", tmp.path().display().to_string()),
        ],
    );
    let browser = async {
        let grid = driver.expect_json("{\"runners\": …}").await;
        let groups = driver.expect_json("{\"groups\": …}").await;
        let filtered = driver.expect_json("{\"filtered\": …}").await;
        let detail = driver.expect_json("{\"detail\": …}").await;
        let chart = driver.expect_json("{\"activity\": …}").await;
        let day = driver.expect_json("{\"day\": …}").await;
        let rule = driver.expect_json("{\"rule\": …}").await;
        let done = driver.expect_json("{\"done\": true}").await;
        assert_eq!(done, json!({"done": true}), "{}", driver.transcript());
        let status = driver.wait_exit().await;
        assert!(
            status.success(),
            "the driver exited with {status}\n{}",
            driver.transcript()
        );
        (grid, groups, filtered, detail, chart, day, rule)
    };
    let (grid, groups, filtered, detail, chart, day, rule) =
        match tokio::time::timeout(BROWSER_BUDGET, browser).await {
            Ok(seen) => seen,
            Err(_) => panic!(
                "the browser test did not finish within {BROWSER_BUDGET:?}\n{}",
                driver.transcript()
            ),
        };

    // Every runner of the answer the page drew has one tile, in the state the rule gives.
    let drawn_from = grid["runners"]["runners"].as_array().unwrap();
    assert_eq!(drawn_from.len(), UP + DOWN + TRIPPED);
    let want: BTreeMap<String, Value> = drawn_from
        .iter()
        .map(|r| {
            (
                r["name"].as_str().unwrap().to_owned(),
                json!(expected_state(r)),
            )
        })
        .collect();
    let tiles: BTreeMap<String, Value> = serde_json::from_value(grid["tiles"].clone()).unwrap();
    assert_eq!(tiles, want, "tiles against the answer they were drawn from");
    assert_eq!(
        grid["counts"],
        json!({"all": UP + DOWN + TRIPPED, "up": UP, "down": DOWN, "breaker-open": TRIPPED,
               "degraded": 0, "never-seen": 0}),
        "the counts at the top"
    );
    assert_eq!(
        groups["groups"],
        json!({"dc=dc1": UP / 2, "dc=dc2": UP / 2, "dc=dc3": DOWN + TRIPPED})
    );
    assert_eq!(
        filtered["filtered"],
        json!({"tiles": DOWN + TRIPPED, "all": DOWN + TRIPPED, "rows": DOWN + TRIPPED})
    );
    let opened = detail["detail"]["runner"].as_str().unwrap();
    assert_eq!(want[opened], "breaker-open", "{detail}");
    assert_eq!(detail["detail"]["state"], "breaker open");

    // The chart is drawn from the activity answer, which is what the audit events say.
    let answered = assert_chart_drawn_from(&app, &chart).await;
    let activity = &chart["activity"];
    let total = |i: usize| answered.iter().map(|c| c[i]).sum::<i64>();
    assert_eq!(total(1), 4, "four calls passed the checks");
    assert!(total(2) >= 1, "the refused call is a refusal: {activity}");
    assert_eq!(day["day"], json!({"bucket_seconds": 900, "buckets": 96}));

    // The states no runner here is in, by the page's own rule.
    let states: Vec<&str> = rule["rule"]
        .as_array()
        .unwrap()
        .iter()
        .map(|pair| {
            assert_eq!(pair[1], expected_state(&pair[0]), "{pair}");
            pair[1].as_str().unwrap()
        })
        .collect();
    assert_eq!(states, ["degraded", "never-seen", "up", "down"]);

    for name in SCREENSHOTS {
        assert_png(&shots.join(name));
    }
    assert!(!shots.join("99-failure.png").exists());
}

/// Checks the charts the driver reported (`{"activity": BODY, "bars": …}`): each series' bars
/// are the activity answer's non-empty buckets, the fullest one at full height, and the answer
/// is what the audit events say. Returns the answer's counts per bucket (events, calls,
/// refusals, approvals).
pub(crate) async fn assert_chart_drawn_from(
    app: &crate::harness::app::TestApp,
    chart: &Value,
) -> Vec<[i64; 4]> {
    let activity = &chart["activity"];
    let buckets = activity["buckets"].as_array().unwrap();
    assert_eq!(buckets.len(), 60, "the last hour by the minute");
    for series in ["events", "calls", "refusals", "approvals"] {
        let drawn = &chart["bars"][series];
        let counts: Vec<i64> = buckets
            .iter()
            .map(|b| b[series].as_i64().unwrap())
            .collect();
        let want_bars: Vec<(i64, i64)> = counts
            .iter()
            .enumerate()
            .filter(|(_, c)| **c > 0)
            .map(|(i, c)| (i as i64, *c))
            .collect();
        let bars: Vec<(i64, i64)> = drawn["bars"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| (b[0].as_i64().unwrap(), b[1].as_i64().unwrap()))
            .collect();
        assert_eq!(bars, want_bars, "{series}: {drawn}");
        assert_eq!(drawn["total"], counts.iter().sum::<i64>(), "{series}");
        let max = counts.iter().copied().max().unwrap_or(0);
        for b in drawn["bars"].as_array().unwrap() {
            let (count, height) = (b[1].as_f64().unwrap(), b[2].as_f64().unwrap());
            let full = 54.0 * count / max as f64;
            assert!(
                (height - full.max(1.0)).abs() < 0.02,
                "{series}: bar {b} of max {max}"
            );
        }
    }
    let events = app.all_events().await;
    let scanned = scan(&events, activity);
    let answered: Vec<[i64; 4]> = buckets
        .iter()
        .map(|b| ["events", "calls", "refusals", "approvals"].map(|k| b[k].as_i64().unwrap()))
        .collect();
    assert_eq!(answered, scanned, "the chart's answer against the events");
    answered
}
