//! The fleet fails well: dead, black-holed and slow runners do not hold up healthy ones,
//! breakers open and close; health is visible to agents, to the API and in /metrics;
//! readiness, rate limits and session binding.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use emisar::server::config::RunnerEntry;
use emisar::server::principal::Role;
use serde_json::{Value, json};
use tokio::net::TcpListener;

use crate::both_backends;
use crate::harness::app::Options;
use crate::harness::{Backend, RunnerSpec, spawn_app};
use crate::mcp_calls::{call, fixtures_dir};

/// A proxy that waits `delay` before forwarding each request to `upstream`: a slow runner.
async fn slow_proxy(listener: TcpListener, upstream: String, delay: Arc<AtomicU64>) {
    let http = reqwest::Client::new();
    let app = axum::Router::new().fallback(move |req: axum::extract::Request| {
        let (http, upstream, delay) = (http.clone(), upstream.clone(), delay.clone());
        async move {
            tokio::time::sleep(Duration::from_millis(delay.load(Ordering::SeqCst))).await;
            let (parts, body) = req.into_parts();
            let body = axum::body::to_bytes(body, 1 << 20).await.unwrap();
            let mut forward = http
                .request(
                    parts.method.clone(),
                    format!("{upstream}{}", parts.uri.path()),
                )
                .body(body);
            for (k, v) in parts.headers.iter() {
                if k != "host" && k != "content-length" {
                    forward = forward.header(k, v);
                }
            }
            let res = forward.send().await.unwrap();
            let status = res.status();
            (status, res.bytes().await.unwrap()).into_response_parts()
        }
    });
    axum::serve(listener, app).await.unwrap();
}

trait IntoParts {
    fn into_response_parts(self) -> axum::response::Response;
}

impl IntoParts for (reqwest::StatusCode, bytes::Bytes) {
    fn into_response_parts(self) -> axum::response::Response {
        use axum::response::IntoResponse;
        (
            axum::http::StatusCode::from_u16(self.0.as_u16()).unwrap(),
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            self.1,
        )
            .into_response()
    }
}

/// Accepts connections and never answers them, counting in `calls` those that carry a call
/// (`POST /v1/call`; the server's health prober's `GET /healthz` is not one).
pub(crate) async fn black_hole(listener: TcpListener, calls: Arc<AtomicUsize>) {
    loop {
        if let Ok((mut socket, _)) = listener.accept().await {
            let calls = calls.clone();
            tokio::spawn(async move {
                use tokio::io::AsyncReadExt;
                let mut head = [0u8; 13];
                if socket.read_exact(&mut head).await.is_ok() && &head == b"POST /v1/call" {
                    calls.fetch_add(1, Ordering::SeqCst);
                }
                // Held, never answered, until the peer gives up.
                let mut rest = [0u8; 1024];
                while matches!(socket.read(&mut rest).await, Ok(n) if n > 0) {}
            });
        }
    }
}

pub(crate) fn entry(name: &str, addr: std::net::SocketAddr) -> RunnerEntry {
    RunnerEntry {
        name: name.into(),
        url: format!("http://{addr}"),
        tls_fingerprint: None,
        packs: None,
        labels: Default::default(),
    }
}

fn breaker_of(runners: &Value, name: &str) -> String {
    runners["runners"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == name)
        .unwrap()["breaker"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_black_holed_and_slow_runners_do_not_hold_up_the_healthy_one() {
    let killed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let killed_addr = killed.local_addr().unwrap();
    let hole = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hole_addr = hole.local_addr().unwrap();
    let slow = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let slow_addr = slow.local_addr().unwrap();
    let deadline_ms = 1500;
    let app = spawn_app(
        Backend::Sqlite,
        vec![RunnerSpec::new("healthy")],
        Options {
            packs_dir: Some(fixtures_dir()),
            extra_runners: vec![
                entry("killed", killed_addr),
                entry("blackhole", hole_addr),
                entry("slow", slow_addr),
            ],
            call_timeout_ms: Some(deadline_ms),
            probe_interval_ms: Some(300),
            ..Default::default()
        },
    )
    .await;
    // The killed runner ran, then died; the black hole swallows connections; the slow one
    // answers after 5 s, well past the deadline.
    let stop = app.start_runner("killed", killed).await;
    stop.cancel();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let hole_accepted = Arc::new(AtomicUsize::new(0));
    let hole_task = tokio::spawn(black_hole(hole, hole_accepted.clone()));
    let slow_backend = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let slow_backend_url = format!("http://{}", slow_backend.local_addr().unwrap());
    let _slow_runner = app.start_runner("slow", slow_backend).await;
    let delay = Arc::new(AtomicU64::new(5000));
    tokio::spawn(slow_proxy(slow, slow_backend_url, delay.clone()));

    let client = app.mcp_client().await;
    let args = json!({"runners": ["healthy", "killed", "blackhole", "slow"], "reason": "fan-out", "word": "hi"});
    for round in 0..3 {
        let started = Instant::now();
        let res = call(&client, "testkit.echo", args.clone()).await;
        let elapsed = started.elapsed();
        // That the healthy answer did not wait for the others shows in their errors below
        // (each gave up at the deadline); this bound is liveness only.
        assert!(
            elapsed < Duration::from_secs(30),
            "round {round}: the healthy answer came after {elapsed:?}"
        );
        let r = res.structured_content.unwrap()["results"].clone();
        assert_eq!(r[0]["runner"], "healthy");
        assert_eq!(r[0]["output"], json!({"said": "hi"}), "{r}");
        assert!(
            r[1]["error"]
                .as_str()
                .unwrap()
                .contains("runner unreachable"),
            "{r}"
        );
        assert!(
            r[2]["error"]
                .as_str()
                .unwrap()
                .contains("did not answer within 1500 ms"),
            "{r}"
        );
        assert!(
            r[3]["error"]
                .as_str()
                .unwrap()
                .contains("did not answer within 1500 ms"),
            "{r}"
        );
    }

    // Three failures in a row: the breakers are open and fail fast, saying since when and why.
    // Failing fast means not trying: no call reaches the black hole again.
    let hole_before = hole_accepted.load(Ordering::SeqCst);
    let res = call(&client, "testkit.echo", args.clone()).await;
    // A call the server sent would have reached the hole by now; give it a moment to count.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        hole_accepted.load(Ordering::SeqCst),
        hole_before,
        "an open breaker still let a call reach the black-holed runner"
    );
    let r = res.structured_content.unwrap()["results"].clone();
    assert_eq!(r[0]["ok"], true);
    for i in 1..4 {
        let e = r[i]["error"].as_str().unwrap();
        assert!(e.starts_with("circuit open since 20"), "{e}");
    }
    assert!(
        r[1]["error"]
            .as_str()
            .unwrap()
            .contains("runner unreachable")
    );
    let api = app.runners_api().await;
    for name in ["killed", "blackhole", "slow"] {
        assert_eq!(breaker_of(&api, name), "open", "{api}");
    }
    assert_eq!(breaker_of(&api, "healthy"), "closed");

    // Agents see the same through the built-in tool, and Prometheus through /metrics.
    let res = call(
        &client,
        "emisar.runners",
        json!({"reason": "which runners are up?"}),
    )
    .await;
    let status = res.structured_content.unwrap()["results"][0]["output"].clone();
    let killed_status = status
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "killed")
        .unwrap();
    assert_eq!(killed_status["breaker"], "open");
    assert!(killed_status["breaker_open_since"].is_string());
    let metrics = crate::edges::scrape_metrics(&app).await;
    assert!(
        metrics.contains("emisar_runner_breaker_state{runner=\"killed\"} 2"),
        "{metrics}"
    );
    assert!(metrics.contains("emisar_runner_calls_total"), "{metrics}");
    assert!(metrics.contains("emisar_audit_batch_size"), "{metrics}");
    assert!(metrics.contains("emisar_audit_lag_seconds"), "{metrics}");
    assert!(
        metrics.contains("emisar_runner_call_seconds_bucket"),
        "{metrics}"
    );

    // They come back: the same addresses answer again, and the probes close the breakers.
    let killed = TcpListener::bind(killed_addr).await.unwrap();
    let _killed_again = app.start_runner("killed", killed).await;
    hole_task.abort();
    let _ = hole_task.await;
    let hole = TcpListener::bind(hole_addr).await.unwrap();
    let _hole_fixed = app.start_runner("blackhole", hole).await;
    delay.store(0, Ordering::SeqCst);
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let api = app.runners_api().await;
        if ["killed", "blackhole", "slow"]
            .iter()
            .all(|n| breaker_of(&api, n) == "closed")
        {
            break;
        }
        assert!(Instant::now() < until, "breakers did not close: {api}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let res = call(&client, "testkit.echo", args).await;
    let r = res.structured_content.unwrap()["results"].clone();
    assert!(r.as_array().unwrap().iter().all(|x| x["ok"] == true), "{r}");
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_follows_the_audit_writer_and_liveness_does_not() {
    let app = spawn_app(
        Backend::Sqlite,
        vec![RunnerSpec::new("node-1")],
        Options {
            packs_dir: Some(fixtures_dir()),
            ..Default::default()
        },
    )
    .await;
    let get = |path: &str| reqwest::get(format!("{}{path}", app.base_url()));
    let prometheus = app.issue_token("prometheus", Role::Auditor).await;
    assert_eq!(get("/readyz").await.unwrap().status(), 200);
    assert_eq!(ready_series(&app, &prometheus).await, "emisar_ready 1");
    emisar::with_pool!(&app.db, pool => {
        sqlx::query("CREATE TRIGGER refuse_insert BEFORE INSERT ON audit_events BEGIN SELECT RAISE(ABORT, 'disk full'); END")
            .execute(pool)
            .await
            .unwrap();
    });
    let client = app.mcp_client().await;
    let res = call(
        &client,
        "testkit.echo",
        json!({"runners": ["node-1"], "reason": "r", "word": "x"}),
    )
    .await;
    assert_eq!(res.is_error, Some(true));
    let ready = get("/readyz").await.unwrap();
    assert_eq!(ready.status(), 503);
    let body: Value = ready.json().await.unwrap();
    assert_eq!(body["status"], "degraded");
    assert!(
        body["problems"][0]
            .as_str()
            .unwrap()
            .contains("audit: the last audit batch failed"),
        "{body}"
    );
    assert!(
        body["problems"][0].as_str().unwrap().contains("disk full"),
        "{body}"
    );
    assert_eq!(
        ready_series(&app, &prometheus).await,
        "emisar_ready 0",
        "/metrics says what /readyz says"
    );
    assert_eq!(
        get("/healthz").await.unwrap().status(),
        200,
        "liveness is about the process"
    );
    emisar::with_pool!(&app.db, pool => {
        sqlx::query("DROP TRIGGER refuse_insert").execute(pool).await.unwrap();
    });
    let res = call(
        &client,
        "testkit.echo",
        json!({"runners": ["node-1"], "reason": "r", "word": "x"}),
    )
    .await;
    assert_eq!(res.is_error, Some(false));
    assert_eq!(get("/readyz").await.unwrap().status(), 200);
    assert_eq!(ready_series(&app, &prometheus).await, "emisar_ready 1");
    client.cancel().await.unwrap();
}

/// The `emisar_ready` line of this server's `/metrics`, scraped with `token` (an auditor's).
async fn ready_series(app: &crate::harness::app::TestApp, token: &str) -> String {
    let text = app.metrics(token).await;
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("emisar_ready"))
        .collect();
    assert_eq!(lines.len(), 1, "{text}");
    lines[0].to_owned()
}

/// On PostgreSQL the limit is also the replicas' shared bucket; one replica alone behaves as
/// on SQLite.
async fn agents_are_rate_limited_with_a_time_to_retry(backend: Backend) {
    let app = spawn_app(
        backend,
        vec![RunnerSpec::new("node-1")],
        Options {
            packs_dir: Some(fixtures_dir()),
            rate_limit: Some((1, 2)),
            ..Default::default()
        },
    )
    .await;
    let client = app.mcp_client().await;
    let args = json!({"runners": ["node-1"], "reason": "r", "word": "x"});
    // What each call answered and when, printed with any failure: the limit is about time, and
    // a shared CI machine's time is what a failure needs explained.
    let began = Instant::now();
    let mut timeline: Vec<String> = Vec::new();
    // The bucket starts full: the burst of 2 passes. After it, a token comes back every
    // second, so on a slow machine one more call may pass before the refusal; what must hold
    // is that a refusal comes, not how many milliseconds the calls took.
    for i in 0..2 {
        let res = call(&client, "testkit.echo", args.clone()).await;
        note(&mut timeline, began, &format!("burst call {i}"), &res);
        assert_eq!(res.is_error, Some(false), "{timeline:#?}");
    }
    let mut refused = None;
    for i in 0..10 {
        let res = call(&client, "testkit.echo", args.clone()).await;
        let text = note(
            &mut timeline,
            began,
            &format!("call {i} past the burst"),
            &res,
        );
        if res.is_error == Some(true) {
            refused = Some(text);
            break;
        }
    }
    let text = refused.unwrap_or_else(|| {
        panic!("10 calls past a burst of 2 at 1 call/s were never rate limited: {timeline:#?}")
    });
    assert!(
        text.contains(
            "rate limited: agent `test-agent` may make 1 calls per second (bursts of 2); retry in"
        ),
        "{timeline:#?}"
    );
    // Another agent has its own bucket.
    let other = app
        .issue_token("other-agent", emisar::server::principal::Role::Agent)
        .await;
    let other_client = crate::harness::tools::mcp_client(&app.mcp_url, &other).await;
    let res = call(&other_client, "testkit.echo", args.clone()).await;
    note(&mut timeline, began, "the other agent's call", &res);
    assert_eq!(res.is_error, Some(false), "{timeline:#?}");
    // The refusal says when to come back, and coming back then works. On PostgreSQL the
    // replicas' shared bucket counts a call from when it was reported (`shared_limit.rs`), so
    // it may be stricter than this replica's own bucket by one call: a second refusal, with
    // its own wait, is allowed; a third is not.
    let mut wait = retry_in(&text);
    let mut refilled = false;
    for attempt in 0..2 {
        tokio::time::sleep(wait + Duration::from_millis(50)).await;
        let res = call(&client, "testkit.echo", args.clone()).await;
        let text = note(
            &mut timeline,
            began,
            &format!("after the advertised wait, attempt {attempt}"),
            &res,
        );
        if res.is_error == Some(false) {
            refilled = true;
            break;
        }
        wait = retry_in(&text);
    }
    assert!(refilled, "the bucket never refilled: {timeline:#?}");
    client.cancel().await.unwrap();
    other_client.cancel().await.unwrap();
}

/// Adds what a call answered, and when, to `timeline`; returns the answer's text.
fn note(
    timeline: &mut Vec<String>,
    began: Instant,
    what: &str,
    res: &rmcp::model::CallToolResult,
) -> String {
    let text = serde_json::to_string(&res.content).unwrap();
    let answer = if res.is_error == Some(true) {
        text.as_str()
    } else {
        "ok"
    };
    timeline.push(format!(
        "{:>5} ms {what}: {answer}",
        began.elapsed().as_millis()
    ));
    text
}

/// The wait a rate-limit refusal advertises ("retry in N ms").
fn retry_in(refusal: &str) -> Duration {
    let ms = refusal
        .split("retry in ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no `retry in N ms` in {refusal}"));
    assert!(
        ms <= 2_000,
        "a wait longer than the whole bucket: {refusal}"
    );
    Duration::from_millis(ms)
}
both_backends!(agents_are_rate_limited_with_a_time_to_retry);

/// Well under its limit, an agent's call takes no round trip to the bucket the replicas
/// share: with that table locked by someone else, calls are still answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_well_under_its_limit_does_not_wait_for_the_shared_bucket() {
    use sqlx::Connection;
    let app = spawn_app(
        Backend::Postgres,
        vec![RunnerSpec::new("node-1")],
        Options {
            rate_limit: Some((1000, 1000)),
            ..Default::default()
        },
    )
    .await;
    let client = app.mcp_client().await;
    let mut locker = sqlx::PgConnection::connect(&app.database_url)
        .await
        .unwrap();
    let mut lock = locker.begin().await.unwrap();
    sqlx::query("LOCK TABLE rate_buckets IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .unwrap();
    // 1000 calls/s: each replica admits up to 50 (1000/s × 50 ms) on its own between
    // reports, and the reports wait for the lock.
    for i in 0..10 {
        let res = tokio::time::timeout(
            Duration::from_secs(10),
            call(&client, "emisar.runners", json!({"reason": "r"})),
        )
        .await
        .unwrap_or_else(|_| panic!("call {i} waited for the locked shared bucket"));
        assert_eq!(res.is_error, Some(false));
    }
    lock.rollback().await.unwrap();
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_session_belongs_to_the_token_that_opened_it() {
    let app = spawn_app(
        Backend::Sqlite,
        vec![RunnerSpec::new("node-1")],
        Options::default(),
    )
    .await;
    let mallory = app
        .issue_token("mallory", emisar::server::principal::Role::Agent)
        .await;
    let http = reqwest::Client::new();
    let post = |token: &str, session: Option<&str>, body: Value| {
        let mut req = http
            .post(&app.mcp_url)
            .bearer_auth(token)
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-11-25")
            .json(&body);
        if let Some(s) = session {
            req = req.header("mcp-session-id", s);
        }
        req.send()
    };
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}});
    let res = post(&app.token, None, init).await.unwrap();
    assert_eq!(res.status(), 200);
    let session = res.headers()["mcp-session-id"].to_str().unwrap().to_owned();
    let _ = res.text().await;
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    assert!(
        post(&app.token, Some(&session), initialized)
            .await
            .unwrap()
            .status()
            .is_success()
    );
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
    assert_eq!(
        post(&app.token, Some(&session), list.clone())
            .await
            .unwrap()
            .status(),
        200
    );
    let stolen = post(&mallory, Some(&session), list).await.unwrap();
    assert_eq!(
        stolen.status(),
        404,
        "another token cannot use this session"
    );
}
