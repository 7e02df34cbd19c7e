//! PostgreSQL dies under load and comes back: 50 agents call reads while the store is
//! killed for 30 s. Every call that succeeded is on the record (intent and outcome), calls
//! during the outage get a clear error, the server makes only a bounded number of connection
//! attempts while the store is down, reconnects within 5 s of its return, the chain
//! verifies, and the server's log stays readable: a few ERROR lines, not one per refused
//! read (issue 45: 3,055 of them in a 15 s outage before).
//!
//! The server is a real `emisar serve` process logging to its own file, as in production, so
//! every ERROR line it writes is counted; its runner runs in this process.
//! Connection attempts are counted by a TCP proxy in front of the database's unix socket:
//! every connection emisar opens goes through it.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use emisar::node::agent::{self, RunnerState};
use emisar::node::config::{RunnerConfig, ServiceConfig};
use emisar::server::audit::AuditFilter;
use rmcp::model::CallToolRequestParams;
use serde_json::json;
use tokio::net::{TcpListener, UnixStream};
use tokio_util::sync::CancellationToken;

use crate::harness::pg::DedicatedCluster;
use crate::harness::tools::{Proc, bound_addr};
use emisar::lab::clock::LabClock;
use emisar::lab::http::serve;
use emisar::lab::scenario;

const AGENTS: usize = 50;
const OUTAGE: Duration = Duration::from_secs(30);
/// The most ERROR lines the server may log over the whole drill: the store's outage is one
/// event, told in a few lines (the first failure of each kind, a summary every 10 s).
const MAX_ERROR_LINES: usize = 20;

async fn counting_proxy(
    listener: TcpListener,
    socket: std::path::PathBuf,
    accepted: Arc<AtomicUsize>,
) {
    loop {
        let Ok((mut client, _)) = listener.accept().await else {
            continue;
        };
        accepted.fetch_add(1, Ordering::SeqCst);
        let socket = socket.clone();
        tokio::spawn(async move {
            // With the server down the upstream connect fails and the client sees the
            // connection close, as it would see a refusal.
            if let Ok(mut upstream) = UnixStream::connect(&socket).await {
                let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
            }
        });
    }
}

#[derive(Debug)]
enum Outcome {
    Ok(String),
    Refused(String),
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_dies_under_load_and_nothing_goes_unrecorded() {
    let cluster = tokio::task::spawn_blocking(DedicatedCluster::start)
        .await
        .unwrap();
    let proxy = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy_port = proxy.local_addr().unwrap().port();
    let accepted = Arc::new(AtomicUsize::new(0));
    tokio::spawn(counting_proxy(proxy, cluster.socket(), accepted.clone()));
    let database_url = format!("postgres://postgres@127.0.0.1:{proxy_port}/emisar");

    let consul = serve(scenario::consul("t", Arc::new(LabClock::real())).router()).await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let runner_stop = CancellationToken::new();
    let runner_url = start_runner(d, &consul, &runner_stop).await;
    let log = d.join("serve.log");
    let mut server = serve_on(d, &database_url, &runner_url, &log);
    let mcp_url = format!(
        "http://{}/mcp",
        bound_addr(&mut server, &log, "emisar serving MCP").await
    );
    // Tokens straight through the socket, not the proxy: the test's own connections are not
    // the server's.
    let socket_dir = cluster.socket().parent().unwrap().display().to_string();
    let direct_url = format!("postgres://postgres@localhost/emisar?host={socket_dir}");
    let direct = emisar::server::db::Db::connect(&direct_url).await.unwrap();
    let audit = emisar::server::audit::AuditLog::start(direct.clone());
    let mut clients = Vec::new();
    for i in 0..AGENTS {
        let token = emisar::server::tokens::issue(
            &direct,
            &audit,
            &format!("agent-{i}"),
            emisar::server::principal::Role::Agent,
            Duration::from_secs(3600),
            "test",
        )
        .await
        .unwrap()
        .token;
        clients.push(crate::harness::tools::mcp_client(&mcp_url, &token).await);
    }
    drop(audit);
    drop(direct);
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let last_ok_started_ms = Arc::new(AtomicU64::new(0));
    let mut agents = Vec::new();
    for client in clients {
        let stop = stop.clone();
        let last_ok_started_ms = last_ok_started_ms.clone();
        agents.push(tokio::spawn(async move {
            let mut log = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                let at = started.elapsed();
                let args = json!({"reason": "is the gossip whole?"})
                    .as_object()
                    .unwrap()
                    .clone();
                let res = client
                    .call_tool(CallToolRequestParams::new("consul.members").with_arguments(args))
                    .await;
                let outcome = match res {
                    Ok(r) if r.is_error != Some(true) => {
                        last_ok_started_ms.fetch_max(at.as_millis() as u64, Ordering::SeqCst);
                        Outcome::Ok(
                            r.structured_content.unwrap()["call_id"]
                                .as_str()
                                .unwrap()
                                .to_owned(),
                        )
                    }
                    Ok(r) => Outcome::Refused(serde_json::to_string(&r.content).unwrap()),
                    Err(e) => Outcome::Refused(e.to_string()),
                };
                log.push((at, outcome));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            client.cancel().await.ok();
            log
        }));
    }

    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = accepted.load(Ordering::SeqCst);
    let down_at = started.elapsed();
    tokio::task::block_in_place(|| cluster.down());
    tokio::time::sleep(OUTAGE).await;
    let during = accepted.load(Ordering::SeqCst) - before;
    tokio::task::block_in_place(|| cluster.up());
    let up_at = started.elapsed();
    // Until calls started after the store came back succeed again (its reconnect backoff
    // reaches several seconds, so a generous liveness bound), then a little longer.
    let deadline = Instant::now() + Duration::from_secs(90);
    while last_ok_started_ms.load(Ordering::SeqCst) <= up_at.as_millis() as u64 {
        assert!(
            Instant::now() < deadline,
            "no call succeeded within 90 s of the store coming back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::SeqCst);
    let mut calls = Vec::new();
    for a in agents {
        calls.extend(a.await.unwrap());
    }

    eprintln!(
        "outage test: {} calls, {during} connection attempts during the outage",
        calls.len()
    );
    assert!(
        during <= 20,
        "{during} connection attempts while the store was down"
    );
    let ok_before = calls
        .iter()
        .filter(|(at, o)| *at < down_at && matches!(o, Outcome::Ok(_)))
        .count();
    assert!(ok_before > 0, "calls succeeded before the outage");
    let refused: Vec<&String> = calls
        .iter()
        .filter_map(|(_, o)| match o {
            Outcome::Refused(m) => Some(m),
            Outcome::Ok(_) => None,
        })
        .collect();
    assert!(!refused.is_empty(), "the outage was noticed");
    for message in &refused {
        assert!(
            message.contains("unavailable")
                || message.contains("cannot record this call")
                || message.contains("could not be recorded"),
            "a refusal says why: {message}"
        );
    }
    let first_ok_after = calls
        .iter()
        .filter(|(at, o)| *at > up_at && matches!(o, Outcome::Ok(_)))
        .map(|(at, _)| *at)
        .min()
        .expect("calls succeed again after the store returns");
    eprintln!(
        "outage test: reconnected {:?} after the store came back",
        first_ok_after - up_at
    );
    // Every success is on the record, intent and outcome.
    let db = emisar::server::db::Db::connect(&direct_url).await.unwrap();
    let successes: Vec<&String> = calls
        .iter()
        .filter_map(|(_, o)| match o {
            Outcome::Ok(id) => Some(id),
            Outcome::Refused(_) => None,
        })
        .collect();
    for call_id in &successes {
        let events = emisar::server::audit::query(
            &db,
            &AuditFilter {
                call_id: Some((*call_id).clone()),
                limit: 10,
                ..Default::default()
            },
        )
        .await
        .unwrap();
        let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
        assert_eq!(
            kinds,
            vec!["tool.called", "call.executed"],
            "call {call_id}"
        );
    }
    let report = emisar::server::audit::verify(&db, None).await.unwrap();
    assert!(report.is_intact(), "{report:?}");
    // The server's log: the outage in a few lines, not one per refused read.
    let errors = error_lines(&log);
    let total: usize = errors.values().sum();
    eprintln!(
        "outage test: {} calls, {} succeeded, {} refused, {during} connection attempts during the outage, reconnected after {:?}, {total} ERROR lines: {errors:#?}",
        calls.len(),
        successes.len(),
        refused.len(),
        first_ok_after - up_at
    );
    assert!(
        total <= MAX_ERROR_LINES,
        "{total} ERROR lines in the server's log over a {OUTAGE:?} outage (at most {MAX_ERROR_LINES}), by message: {errors:#?}"
    );
    runner_stop.cancel();
}

/// A runner in this process, serving `consul` (which wants header `X-Consul-Token: t`) with
/// `d/server.pub` as the server's key (written here); its URL.
async fn start_runner(d: &Path, consul: &str, stop: &CancellationToken) -> String {
    emisar::protocol::signing::write_keypair(&d.join("server.key"), &d.join("server.pub")).unwrap();
    let mut config = RunnerConfig::with_name("n1");
    config.listen = "127.0.0.1:0".into();
    config.server_public_key_file = Some(d.join("server.pub"));
    config.state_dir = d.join("state-n1");
    config.services.insert(
        "consul".into(),
        ServiceConfig {
            base_url: consul.to_owned(),
            headers: BTreeMap::from([("X-Consul-Token".to_owned(), "t".to_owned())]),
        },
    );
    config.fill_standard_services();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(agent::run(
        listener,
        RunnerState::new(config).unwrap(),
        stop.clone(),
    ));
    url
}

/// `emisar serve` on `database_url` with runner `n1` at `runner_url`, logging to `log` as an
/// operator would collect it.
fn serve_on(d: &Path, database_url: &str, runner_url: &str, log: &Path) -> Proc {
    let config = d.join("emisar.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:0\"\ninsecure_http = true\ndatabase_url = \"{database_url}\"\nsigning_key_file = \"{}\"\ncall_timeout_ms = 5000\nrate_limit_per_second = 1000\nrate_limit_burst = 1000\n[[runners]]\nname = \"n1\"\nurl = \"{runner_url}\"\n",
            d.join("server.key").display()
        ),
    )
    .unwrap();
    Proc(
        Command::new(env!("CARGO_BIN_EXE_emisar"))
            .args(["serve", "--config", config.to_str().unwrap()])
            .env_remove("DATABASE_URL")
            .env_remove("EMISAR_LOG")
            .env_remove("EMISAR_LOG_FORMAT")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .unwrap(),
    )
}

/// The ERROR lines of a log in emisar's text format (`TIMESTAMP LEVEL target: message
/// fields`), counted by target and message.
fn error_lines(log: &Path) -> BTreeMap<String, usize> {
    let text = std::fs::read_to_string(log).unwrap();
    let mut by_message = BTreeMap::new();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        if words.nth(1) != Some("ERROR") {
            continue;
        }
        let rest = words.collect::<Vec<_>>().join(" ");
        // The fields after the message vary (errors, ids); the message does not.
        let message = rest.split(" error=").next().unwrap_or_default().to_owned();
        *by_message.entry(message).or_default() += 1;
    }
    by_message
}
