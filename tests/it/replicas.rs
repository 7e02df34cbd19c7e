//! Two `emisar serve` processes on one PostgreSQL, writing 10,000 audit events at once
//! through both: one unbroken chain, every seq once.

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
    let d = dir.path();
    let pg = tokio::task::spawn_blocking(PgTestDb::create).await.unwrap();
    emisar::protocol::signing::write_keypair(&d.join("server.key"), &d.join("server.pub")).unwrap();
    let mut replicas = Vec::new();
    let mut urls = Vec::new();
    for i in 0..2 {
        let config = d.join(format!("emisar-{i}.toml"));
        std::fs::write(
            &config,
            format!(
                "listen = \"127.0.0.1:0\"\ndatabase_url = \"{}\"\nsigning_key_file = \"{}\"\nrate_limit_per_second = 100000\nrate_limit_burst = 100000\n",
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
    let db = emisar::server::db::Db::connect(&pg.url).await.unwrap();
    let audit = emisar::server::audit::AuditLog::start(db.clone());
    let token = emisar::server::tokens::issue(
        &db,
        &audit,
        "load",
        emisar::server::tokens::Role::Agent,
        Duration::from_secs(3600),
        "test",
    )
    .await
    .unwrap()
    .token;

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
