//! A fleet in the harness: 200 runners registered with one server (each a real runner,
//! in-process, on its own loopback port), and one read fanned out to all of them (issue 28).
//! Not timed: the speed of a fan-out is measured by scripts/bench; this proves every runner
//! answers once, the agent gets one result per runner, and the audit log holds each outcome.

use std::collections::BTreeSet;

use serde_json::json;

use crate::harness::app::Options;
use crate::harness::{Backend, RunnerSpec, spawn_app};
use crate::mcp_calls::{call, fixtures_dir};

const RUNNERS: usize = 200;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_read_fans_out_to_200_runners() {
    let started = std::time::Instant::now();
    let names: Vec<String> = (0..RUNNERS).map(|i| format!("node-{i:03}")).collect();
    let app = spawn_app(
        Backend::Postgres,
        names
            .iter()
            .map(|n| RunnerSpec::new(n).label("fleet", "all"))
            .collect(),
        Options {
            packs_dir: Some(fixtures_dir()),
            ..Default::default()
        },
    )
    .await;
    eprintln!("{RUNNERS} runners up in {:?}", started.elapsed());
    let client = app.mcp_client().await;
    let started = std::time::Instant::now();

    let res = call(
        &client,
        "testkit.echo",
        json!({"selector": "fleet=all", "reason": "one read to the whole fleet", "word": "hello"}),
    )
    .await;
    eprintln!("fan-out answered in {:?}", started.elapsed());
    assert_ne!(res.is_error, Some(true), "{res:?}");
    let body = res.structured_content.expect("structured content");
    let results = body["results"].as_array().expect("results");
    assert_eq!(results.len(), RUNNERS, "one result per runner");
    let mut answered = BTreeSet::new();
    for r in results {
        assert_eq!(r["ok"], true, "{r}");
        assert_eq!(r["output"]["said"], "hello", "{r}");
        assert!(
            answered.insert(r["runner"].as_str().unwrap().to_owned()),
            "{r}: twice"
        );
    }
    assert_eq!(answered, names.iter().cloned().collect::<BTreeSet<_>>());

    // The audit log has the intent once and one outcome per runner, and its chain holds.
    let call_id = body["call_id"].as_str().unwrap();
    let events = app.events_of_call(call_id).await;
    let count = |kind: &str| events.iter().filter(|e| e.kind == kind).count();
    assert_eq!(count("tool.called"), 1, "{events:?}");
    assert_eq!(count("call.executed"), RUNNERS, "{events:?}");
    let outcome_runners: BTreeSet<String> = events
        .iter()
        .filter(|e| e.kind == "call.executed")
        .filter_map(|e| e.runner.clone())
        .collect();
    assert_eq!(outcome_runners, answered);
    app.assert_chain_intact().await;
}

/// A fleet past 500 runners is told to send heartbeats less often, in every heartbeat's
/// answer: at most 50 a second from the whole fleet (here 600 listed runners where nothing
/// listens, and one that joined).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_fleet_is_told_to_heartbeat_less_often() {
    let listed = 600;
    let app = spawn_app(
        Backend::Sqlite,
        vec![],
        Options {
            extra_runners: (0..listed)
                .map(|i| emisar::server::config::RunnerEntry {
                    name: format!("listed-{i:03}"),
                    url: "http://127.0.0.1:9".into(),
                    tls_fingerprint: None,
                    packs: None,
                    labels: Default::default(),
                })
                .collect(),
            ..Default::default()
        },
    )
    .await;
    let (_, token) = app
        .join_token(emisar::server::fleet::JoinTokenSpec::once(
            std::time::Duration::from_secs(600),
        ))
        .await;
    let (status, joined) = app
        .raw_join(
            &token,
            &json!({"name": "joined-1", "url": "http://127.0.0.1:9/", "labels": {}, "packs": {}}),
        )
        .await;
    assert_eq!(status, 200, "{joined}");
    // 601 runners at 50 a second: one each 12.02 s.
    assert_eq!(joined["heartbeat_interval_ms"], 12_020, "{joined}");
    let answer: serde_json::Value = reqwest::Client::new()
        .post(format!("{}/api/runners/heartbeat", app.base_url()))
        .bearer_auth(joined["runner_token"].as_str().unwrap())
        .send()
        .await
        .unwrap()
        .error_for_status()
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        answer,
        json!({"runner": "joined-1", "heartbeat_interval_ms": 12_020})
    );
}
