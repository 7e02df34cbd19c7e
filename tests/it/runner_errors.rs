//! What an agent reads of a runner call that failed: a stable `error_kind` and a short
//! reason, never a runner's raw answer body or the transport's errors (they name hosts,
//! addresses and certificates of whatever a runner's URL reaches). Operators read the detail
//! in the server's log, in the audit log's `error_detail` and, admins only, in
//! `/api/runners`'s `last_error`. And a result whose outcome could not be recorded is withheld,
//! and a write whose runner could not be heard from is never sent again.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use emisar::server::config::RunnerEntry;
use emisar::server::principal::Role;
use serde_json::{Value, json};

use crate::both_backends;
use crate::harness::app::{Options, TestApp};
use crate::harness::tools::DeadEndpoint;
use crate::harness::{Backend, RunnerSpec, spawn_app};
use crate::mcp_calls::{call, fixtures_dir};

/// An endpoint that answers every request with `status` and `body`, as a runner's URL may
/// reach something that is not a runner (or a compromised one). Returns its URL.
async fn answering(status: u16, body: &'static str) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let status = axum::http::StatusCode::from_u16(status).unwrap();
    let app = axum::Router::new().fallback(move || async move { (status, body) });
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

fn extra(name: &str, url: &str) -> RunnerEntry {
    RunnerEntry {
        name: name.into(),
        url: url.into(),
        tls_fingerprint: None,
        packs: None,
        labels: Default::default(),
    }
}

/// `GET /api/runners` with `token`, by runner name.
async fn runners_seen_with(app: &TestApp, token: &str) -> serde_json::Map<String, Value> {
    let api: Value = app
        .http()
        .get(format!("{}/api/runners", app.base_url()))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    api["runners"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["name"].as_str().unwrap().to_owned(), r.clone()))
        .collect()
}

/// A hostile runner refusal: a useful start, then a right-to-left override, a bell, an
/// escape sequence and far more text than anyone should read.
const HOSTILE_REFUSAL: &str = concat!(
    r#"{"error": "value not in allowlist \u202e\u0007\u001b[31m "#,
    "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
    "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
    "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
    "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
    r#"tail-never-shown"}"#
);

async fn agents_read_a_kind_and_a_short_reason_never_a_runner_body(backend: Backend) {
    // A page from something that is not a runner, as a join URL pointed inside would get.
    let page = answering(
        502,
        "<html><title>metadata.internal.corp</title>secret-banner</html>",
    )
    .await;
    let hostile = answering(403, HOSTILE_REFUSAL).await;
    let dead = DeadEndpoint::bind();
    let app = spawn_app(
        backend,
        vec![],
        Options {
            extra_runners: vec![
                extra("page", &page),
                extra("hostile", &hostile),
                extra("dead", &dead.url()),
            ],
            ..Default::default()
        },
    )
    .await;
    let client = app.mcp_client().await;
    let res = call(
        &client,
        "traefik.ping",
        json!({"runners": ["page", "hostile", "dead"], "reason": "what do you answer?"}),
    )
    .await;
    assert_eq!(res.is_error, Some(true), "{res:?}");
    let s = res.structured_content.unwrap();
    let answer = s.to_string();
    let by_name = |name: &str| {
        s["results"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["runner"] == name)
            .unwrap_or_else(|| panic!("no result from `{name}`: {s}"))
            .clone()
    };
    let dead_addr = format!("127.0.0.1:{}", dead.port);
    for leaked in [
        "secret-banner",
        "metadata.internal.corp",
        "tail-never-shown",
        dead_addr.as_str(),
        "error sending request",
        "\u{202e}",
        "\u{7}",
        "\u{1b}",
    ] {
        assert!(
            !answer.contains(leaked),
            "the agent read {leaked:?}: {answer}"
        );
    }

    let r = by_name("page");
    assert_eq!(r["error_kind"], "runner_refused", "{r}");
    assert_eq!(r["error"], "runner refused the call (HTTP 502)", "{r}");

    // The runner's own refusal reaches the agent, cleaned and cut short.
    let r = by_name("hostile");
    assert_eq!(r["error_kind"], "runner_refused", "{r}");
    let error = r["error"].as_str().unwrap();
    assert!(
        error.starts_with("runner refused the call (HTTP 403): value not in allowlist "),
        "{error}"
    );
    assert!(error.ends_with('…'), "{error}");
    assert!(error.chars().count() < 400, "{error}");

    let r = by_name("dead");
    assert_eq!(r["error_kind"], "runner_unreachable", "{r}");
    assert!(
        r["error"]
            .as_str()
            .unwrap()
            .starts_with("runner unreachable"),
        "{r}"
    );

    // The audit log keeps what the agent read and, for operators, what lay behind it.
    let events = app.events_of_call(s["call_id"].as_str().unwrap()).await;
    let failed = |runner: &str| {
        events
            .iter()
            .find(|e| e.kind == "call.failed" && e.runner.as_deref() == Some(runner))
            .unwrap_or_else(|| panic!("no call.failed for `{runner}`: {events:?}"))
            .detail
            .clone()
            .unwrap()
    };
    let d = failed("page");
    assert_eq!(d["error_kind"], "runner_refused", "{d}");
    assert!(
        d["error_detail"]
            .as_str()
            .unwrap()
            .contains("secret-banner"),
        "{d}"
    );
    let d = failed("dead");
    assert!(
        d["error_detail"].as_str().unwrap().contains(&dead_addr),
        "{d}"
    );
    let d = failed("hostile");
    let kept = d["error_detail"].as_str().unwrap();
    assert!(
        !kept.contains('\u{202e}') && !kept.contains('\u{1b}'),
        "{d}"
    );

    // Agents, and people short of admin, see the runners without their last error; an
    // admin reads it.
    let auditor = app.issue_token("ops-auditor", Role::Auditor).await;
    for token in [app.token.as_str(), auditor.as_str()] {
        for (name, r) in runners_seen_with(&app, token).await {
            assert_eq!(r["last_error"], Value::Null, "{name}: {r}");
        }
    }
    let admin = app.issue_token("ops-admin", Role::Admin).await;
    let seen = runners_seen_with(&app, &admin).await;
    assert!(
        seen["dead"]["last_error"]
            .as_str()
            .unwrap()
            .contains(&dead_addr),
        "{seen:?}"
    );
    // The built-in tool shows agents no more than the API does.
    let res = call(
        &client,
        "emisar.runners",
        json!({"reason": "which runners are up?"}),
    )
    .await;
    let shown = res.structured_content.unwrap();
    for r in shown["results"][0]["output"].as_array().unwrap() {
        assert_eq!(r["last_error"], Value::Null, "{shown}");
    }
    app.assert_chain_intact().await;
    client.cancel().await.unwrap();
}
both_backends!(agents_read_a_kind_and_a_short_reason_never_a_runner_body);

/// A trigger the tests add to PostgreSQL that refuses every `call.executed` row (and so the
/// whole transaction that carries one), until [`allow_outcomes`] drops it.
async fn refuse_outcomes(app: &TestApp) {
    let setup = [
        "CREATE FUNCTION refuse_outcomes() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN IF NEW.kind = 'call.executed' THEN \
         RAISE EXCEPTION 'this test refuses outcome rows'; END IF; RETURN NEW; END $$",
        "CREATE TRIGGER refuse_outcomes BEFORE INSERT ON audit_events \
         FOR EACH ROW EXECUTE FUNCTION refuse_outcomes()",
    ];
    for sql in setup {
        emisar::with_pool!(&app.db, pool => {
            sqlx::query(sql).execute(pool).await.unwrap();
        });
    }
}

async fn allow_outcomes(app: &TestApp) {
    emisar::with_pool!(&app.db, pool => {
        sqlx::query("DROP TRIGGER refuse_outcomes ON audit_events")
            .execute(pool)
            .await
            .unwrap();
    });
}

/// The agent was told its call ran on `node-1` and nothing of what it answered.
fn assert_withheld(res: &rmcp::model::CallToolResult, word: &str) -> Value {
    assert_eq!(res.is_error, Some(true), "{res:?}");
    let s = res.structured_content.clone().unwrap();
    assert!(
        !s.to_string().contains(word),
        "the agent read the result: {s}"
    );
    let r = &s["results"][0];
    assert_eq!(r["ok"], false, "{s}");
    assert_eq!(r["output"], Value::Null, "{s}");
    assert_eq!(r["error_kind"], "outcome_not_recorded", "{s}");
    let error = r["error"].as_str().unwrap();
    assert!(error.contains("the result is withheld"), "{error}");
    // The store's own words stay in the server's log.
    assert!(!error.contains("this test refuses"), "{error}");
    s
}

/// ARCHITECTURE.md: a read's intent and outcomes are one durable append after the runners
/// answered; "a result whose outcome could not be recorded is withheld from the agent". The
/// trigger refuses `call.executed`, so the read's one transaction fails: the read ran on its
/// runner (its marker file is there), the agent reads nothing of its answer, the log holds
/// nothing of the call, and the chain verifies. Once outcomes can be written, a read's
/// `tool.called` and `call.executed` are consecutive events of one commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_whose_combined_append_fails_returns_nothing_and_leaves_the_log_verifiable() {
    let app = spawn_app(
        Backend::Postgres,
        vec![RunnerSpec::new("node-1")],
        Options {
            packs_dir: Some(fixtures_dir()),
            ..Default::default()
        },
    )
    .await;
    let client = app.mcp_client().await;
    let echo = |word: &str| json!({"runners": ["node-1"], "reason": "echo", "word": word});
    let res = call(&client, "testkit.echo", echo("before")).await;
    assert_eq!(res.is_error, Some(false), "{res:?}");

    refuse_outcomes(&app).await;
    let res = call(&client, "testkit.echo", echo("withheld-word")).await;
    let s = assert_withheld(&res, "withheld-word");
    let events = app.events_of_call(s["call_id"].as_str().unwrap()).await;
    assert!(events.is_empty(), "the failed append left {events:?}");
    // The read did run: a marker only its action creates is there.
    let marker = tempfile::Builder::new()
        .prefix("emisar-read-ran-")
        .tempdir_in("/tmp")
        .unwrap();
    let path = marker.path().join("ran");
    let res = call(
        &client,
        "testkit.mark",
        json!({"runners": ["node-1"], "reason": "mark", "path": path.to_str().unwrap()}),
    )
    .await;
    assert_withheld(&res, "\"said\"");
    assert!(path.exists(), "the read did not run on its runner");
    app.assert_chain_intact().await;

    allow_outcomes(&app).await;
    let res = call(&client, "testkit.echo", echo("after")).await;
    assert_eq!(res.is_error, Some(false), "{res:?}");
    let s = res.structured_content.unwrap();
    assert_eq!(s["results"][0]["output"]["said"], "after", "{s}");
    let events = app.events_of_call(s["call_id"].as_str().unwrap()).await;
    let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, ["tool.called", "call.executed"], "{events:?}");
    assert_eq!(events[1].seq, events[0].seq + 1, "{events:?}");
    assert_eq!(events[1].at, events[0].at, "one commit: {events:?}");
    app.assert_chain_intact().await;
    client.cancel().await.unwrap();
}

/// A write keeps intent before dispatch: with the same trigger, a write the policy lets run
/// without approval has its `tool.called` recorded before it runs, runs, and its result is
/// withheld because its outcome could not be recorded. So does a read the policy raised to a
/// write (`testkit.mark`, low and auto-approved).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_records_its_intent_first_and_is_withheld_without_its_outcome() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.yaml");
    std::fs::write(
        &policy,
        "risk:\n  testkit.touch: {risk: read, lower: true}\n  \
         testkit.mark: {risk: low, auto_approve: true}\n",
    )
    .unwrap();
    let app = spawn_app(
        Backend::Postgres,
        vec![RunnerSpec::new("node-1")],
        Options {
            packs_dir: Some(fixtures_dir()),
            policy_file: Some(policy),
            ..Default::default()
        },
    )
    .await;
    let client = app.mcp_client().await;
    refuse_outcomes(&app).await;
    let marker = tempfile::Builder::new()
        .prefix("emisar-write-ran-")
        .tempdir_in("/tmp")
        .unwrap();
    for tool in ["testkit.touch", "testkit.mark"] {
        let path = marker.path().join(tool);
        let res = call(
            &client,
            tool,
            json!({"runners": ["node-1"], "reason": "write", "path": path.to_str().unwrap()}),
        )
        .await;
        let s = assert_withheld(&res, "\"said\"");
        assert!(path.exists(), "{tool} did not run");
        let events = app.events_of_call(s["call_id"].as_str().unwrap()).await;
        let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
        assert_eq!(kinds, ["tool.called"], "{tool}: {events:?}");
    }
    allow_outcomes(&app).await;
    app.assert_chain_intact().await;
    client.cancel().await.unwrap();
}

/// An endpoint that reads each request's head and closes the connection without a byte of
/// answer, as a runner that dies mid-call, or a network that loses its answer, does: the
/// call may well have run. Returns its URL and how many `POST /v1/call` it has read.
async fn answering_nothing() -> (String, Arc<AtomicUsize>) {
    use tokio::io::AsyncReadExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let counted = counted.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                if head.starts_with(b"POST /v1/call ") {
                    counted.fetch_add(1, Ordering::SeqCst);
                }
            });
        }
    });
    (url, calls)
}

/// A write whose runner took the request and went silent is sent once: it may have run, and
/// running it twice is not the agent's to risk. A read in the same plight is sent again
/// (the retry budget has room), which shows the failure is one the gateway does retry.
async fn a_write_is_never_retried(backend: Backend) {
    let (url, calls) = answering_nothing().await;
    let policy_dir = tempfile::tempdir().unwrap();
    let policy = policy_dir.path().join("policy.yaml");
    // A risk:high write the policy lets run at once: nothing but the rule under test stands
    // between the call and a second send.
    std::fs::write(
        &policy,
        "risk:\n  testkit.touch: {risk: read, lower: true}\n",
    )
    .unwrap();
    let app = spawn_app(
        backend,
        vec![],
        Options {
            packs_dir: Some(fixtures_dir()),
            extra_runners: vec![extra("lossy", &url)],
            policy_file: Some(policy),
            ..Default::default()
        },
    )
    .await;
    let client = app.mcp_client().await;

    let res = call(
        &client,
        "testkit.touch",
        json!({"path": "/tmp/emisar-never-twice", "runners": ["lossy"],
               "reason": "a write whose answer is lost"}),
    )
    .await;
    let s = res.structured_content.unwrap();
    assert_eq!(s["results"][0]["error_kind"], "runner_unreachable", "{s}");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "the write reached its runner more than once: {s}"
    );
    let events = app.events_of_call(s["call_id"].as_str().unwrap()).await;
    let outcomes: Vec<&str> = events
        .iter()
        .filter(|e| e.kind.starts_with("call."))
        .map(|e| e.kind.as_str())
        .collect();
    assert_eq!(outcomes, ["call.failed"], "{events:?}");

    let res = call(
        &client,
        "testkit.echo",
        json!({"word": "again", "runners": ["lossy"], "reason": "a read whose answer is lost"}),
    )
    .await;
    let s = res.structured_content.unwrap();
    assert_eq!(s["results"][0]["error_kind"], "runner_unreachable", "{s}");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        3,
        "a read is sent again once (the retry budget starts with room for one): {s}"
    );
    app.assert_chain_intact().await;
    client.cancel().await.unwrap();
}
both_backends!(a_write_is_never_retried);
