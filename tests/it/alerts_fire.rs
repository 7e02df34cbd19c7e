//! The shipped alert rules fire for real: a live emisar's `/metrics`, scraped by a real
//! VictoriaMetrics with an auditor's token (the scrape config of docs/operator-guide.md),
//! evaluated by a real vmalert, which sends what fires to an Alertmanager endpoint. A runner is
//! black-holed; its down and breaker alerts fire, and the healthy runner's never do.
//!
//! The rules are the shipped file with one change: every `for:` is 2 s instead of minutes, so
//! the test takes seconds. The expressions, labels and annotations are the file's own.

use std::path::Path;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use emisar::server::principal::Role;
use serde_json::{Value, json};
use tokio::net::TcpListener;

use crate::alert_rules::rules_file;
use crate::harness::app::Options;
use crate::harness::vm::VictoriaMetrics;
use crate::harness::vmalert::VmAlert;
use crate::harness::{Backend, RunnerSpec, spawn_app};
use crate::mcp_calls::{call, fixtures_dir};
use crate::ops::{black_hole, entry};

const HOLE: &str = "alerts-hole";
const HEALTHY: &str = "alerts-healthy";

/// The shipped rules with every `for:` shortened to `wait`, written to `to`.
fn rules_waiting(wait: &str, to: &Path) {
    let text = std::fs::read_to_string(rules_file()).unwrap();
    let mut rules: yaml_serde::Value = yaml_serde::from_str(&text).unwrap();
    let mut changed = 0;
    for group in rules["groups"].as_sequence_mut().unwrap() {
        for rule in group["rules"].as_sequence_mut().unwrap() {
            if rule.get("for").is_some() {
                rule["for"] = yaml_serde::Value::String(wait.into());
                changed += 1;
            }
        }
    }
    assert!(changed >= 10, "only {changed} rules had a `for:`");
    std::fs::write(to, yaml_serde::to_string(&rules).unwrap()).unwrap();
}

/// What an Alertmanager would receive: every body posted to it, with its path.
#[derive(Clone, Default)]
struct Received(Arc<Mutex<Vec<(String, Value)>>>);

impl Received {
    /// Listens on a free loopback port; returns its URL.
    async fn listen(&self) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let received = self.clone();
        let app = axum::Router::new().fallback(move |req: axum::extract::Request| {
            let received = received.clone();
            async move {
                let path = req.uri().path().to_owned();
                let body = axum::body::to_bytes(req.into_body(), 1 << 20)
                    .await
                    .unwrap();
                let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
                received.0.lock().unwrap().push((path, body));
                "ok"
            }
        });
        tokio::spawn(async move { axum::serve(listener, app).await });
        url
    }

    /// The alerts posted to the Alertmanager API (`/api/v2/alerts`), named `name`, for runner
    /// `runner`.
    fn alerts(&self, name: &str, runner: &str) -> Vec<Value> {
        let received = self.0.lock().unwrap();
        received
            .iter()
            .filter(|(path, _)| path == "/api/v2/alerts")
            .flat_map(|(_, body)| body.as_array().cloned().unwrap_or_default())
            .filter(|a| a["labels"]["alertname"] == name && a["labels"]["runner"] == runner)
            .collect()
    }
}

/// vmalert's alerts named `name` for runner `runner`, with their state.
async fn states(vmalert: &VmAlert, name: &str, runner: &str) -> Vec<String> {
    vmalert
        .alerts()
        .await
        .iter()
        .filter(|a| a["name"] == name && a["labels"]["runner"] == runner)
        .map(|a| a["state"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// VictoriaMetrics scraping `target` (host:port) every second with `token`, as the
/// operator guide's scrape config does (`authorization.credentials_file`).
async fn scraping(dir: &Path, target: &str, token: &str) -> VictoriaMetrics {
    let token_file = dir.join("emisar.token");
    std::fs::write(&token_file, token).unwrap();
    let config = dir.join("scrape.yml");
    std::fs::write(
        &config,
        format!(
            "scrape_configs:\n  - job_name: emisar\n    scrape_interval: 1s\n    authorization: {{ credentials_file: {} }}\n    static_configs: [{{ targets: [\"{target}\"] }}]\n",
            token_file.display()
        ),
    )
    .unwrap();
    VictoriaMetrics::start_with(&[format!("-promscrape.config={}", config.display())]).await
}

/// Waits until VictoriaMetrics answers `query` with a series whose value is `want`.
async fn stored(vm: &VictoriaMetrics, query: &str, want: &str) {
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let found: Value = http
            .get(format!("{}/api/v1/query", vm.url))
            .query(&[("query", query)])
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if found["data"]["result"][0]["value"][1] == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "`{query}` never became {want}: {found}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_holed_runner_fires_its_alerts_through_victoria_metrics_and_vmalert() {
    let hole = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hole_addr = hole.local_addr().unwrap();
    let app = spawn_app(
        Backend::Sqlite,
        vec![RunnerSpec::new(HEALTHY)],
        Options {
            packs_dir: Some(fixtures_dir()),
            extra_runners: vec![entry(HOLE, hole_addr)],
            call_timeout_ms: Some(1000),
            probe_interval_ms: Some(300),
            ..Default::default()
        },
    )
    .await;
    let runner = app.start_runner(HOLE, hole).await;
    let dir = tempfile::tempdir().unwrap();
    let token = app.issue_token("prometheus", Role::Auditor).await;
    let target = app.base_url().trim_start_matches("http://").to_owned();
    let vm = scraping(dir.path(), &target, &token).await;
    stored(&vm, &format!("emisar_runner_up{{runner=\"{HOLE}\"}}"), "1").await;
    stored(&vm, "emisar_ready", "1").await;

    let rules = dir.path().join("emisar-rules.yml");
    rules_waiting("2s", &rules);
    let alertmanager = Received::default();
    let notifier = alertmanager.listen().await;
    let vmalert = VmAlert::start(&rules, &vm.url, &notifier).await;

    // Both runners answer: several evaluations later, nothing about them is even pending.
    tokio::time::sleep(Duration::from_secs(4)).await;
    for name in ["EmisarRunnerDown", "EmisarRunnerBreakerOpen"] {
        for r in [HOLE, HEALTHY] {
            assert_eq!(
                states(&vmalert, name, r).await,
                Vec::<String>::new(),
                "{name} {r}"
            );
        }
    }

    // The runner stops and its address swallows every connection: probes and calls time out.
    runner.cancel();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let hole = TcpListener::bind(hole_addr).await.unwrap();
    tokio::spawn(black_hole(hole, Arc::new(AtomicUsize::new(0))));
    let client = app.mcp_client().await;
    let args = json!({"runners": [HOLE], "reason": "is it there?", "word": "hi"});
    for _ in 0..3 {
        let res = call(&client, "testkit.echo", args.clone()).await;
        assert_eq!(res.is_error, Some(true), "{:?}", res.content);
    }

    let deadline = Instant::now() + Duration::from_secs(90);
    for name in ["EmisarRunnerDown", "EmisarRunnerBreakerOpen"] {
        loop {
            if states(&vmalert, name, HOLE).await == ["firing"]
                && !alertmanager.alerts(name, HOLE).is_empty()
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{name} for {HOLE} did not fire within 90 s: vmalert holds {:?}\nvmalert's log:\n{}",
                vmalert.alerts().await,
                vmalert.log_text()
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let sent = &alertmanager.alerts(name, HOLE)[0];
        assert_eq!(sent["labels"]["severity"], "warning", "{sent}");
        assert!(
            sent["annotations"]["summary"]
                .as_str()
                .unwrap()
                .contains(HOLE),
            "{sent}"
        );
        assert_eq!(
            sent["annotations"]["runbook"],
            format!("docs/operator-guide.md#{}", name.to_lowercase()),
            "{sent}"
        );
    }
    for name in ["EmisarRunnerDown", "EmisarRunnerBreakerOpen"] {
        assert_eq!(
            states(&vmalert, name, HEALTHY).await,
            Vec::<String>::new(),
            "{name} for the healthy runner"
        );
    }
    client.cancel().await.unwrap();
}
