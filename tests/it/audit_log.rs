//! The audit log on both backends: append-only in the database itself, hash-chained,
//! tampering found at the right event, and one chain under concurrent writers.

use emisar::server::audit::{self, AuditFilter, AuditLog, NewEvent};
use emisar::server::db::Db;
use serde_json::{Value, json};

use crate::both_backends;
use crate::harness::Backend;
use crate::harness::app::fresh_db;

/// The advisory lock the PostgreSQL writer appends under ("emisar").
const AUDIT_LOCK: i64 = 0x656d_6973_6172;

fn event(i: usize) -> NewEvent {
    NewEvent {
        actor: format!("agent:a{}", i % 7),
        kind: "tool.called".into(),
        tool: Some("traefik.ping".into()),
        args: Some(json!({"i": i, "nested": {"b": [1, 2.5, "x"], "a": null}})),
        reason: Some(format!("reason {i} with \"quotes\" and ünïcode")),
        call_id: Some(uuid::Uuid::new_v4().to_string()),
        ..Default::default()
    }
}

async fn the_database_refuses_update_and_delete(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let (url, _pg) = fresh_db(backend, dir.path()).await;
    let db = Db::connect(&url).await.unwrap();
    let log = AuditLog::start(db.clone());
    for i in 0..3 {
        log.append(event(i)).await.unwrap();
    }
    for sql in [
        "UPDATE audit_events SET reason = 'rewritten' WHERE seq = 2",
        "DELETE FROM audit_events WHERE seq = 3",
    ] {
        let err = emisar::with_pool!(&db, pool => sqlx::query(sql).execute(pool).await.map(|_| ()))
            .expect_err(sql);
        assert!(err.to_string().contains("append-only"), "{sql}: {err}");
    }
    if backend == Backend::Postgres {
        let err = emisar::with_pool!(&db, pool => sqlx::query("TRUNCATE audit_events").execute(pool).await.map(|_| ()))
            .unwrap_err();
        assert!(err.to_string().contains("append-only"), "{err}");
    }
    assert_eq!(audit::verify(&db, None).await.unwrap().checked, 3);
}
both_backends!(the_database_refuses_update_and_delete);

async fn tampering_is_found_at_every_altered_event(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let (url, pg) = fresh_db(backend, dir.path()).await;
    let db = Db::connect(&url).await.unwrap();
    let log = AuditLog::start(db.clone());
    for i in 0..6 {
        log.append(event(i)).await.unwrap();
    }
    let report = audit::verify(&db, None).await.unwrap();
    assert!(report.is_intact(), "{report:?}");
    assert_eq!(report.checked, 6);
    assert_eq!(audit::verify(&db, Some(3)).await.unwrap().checked, 4);

    // An attacker with superuser rights switches the guard off and edits events 3 and 5.
    let edit = "UPDATE audit_events SET reason = 'nothing to see' WHERE seq IN (3, 5)";
    match &pg {
        Some(pg) => {
            pg.superuser_sql(&format!(
                "ALTER TABLE audit_events DISABLE TRIGGER USER; {edit}; \
                 ALTER TABLE audit_events ENABLE TRIGGER USER;"
            ))
            .unwrap();
        }
        None => {
            emisar::with_pool!(&db, pool => {
                sqlx::query("DROP TRIGGER audit_events_no_update").execute(pool).await.unwrap();
                sqlx::query(edit).execute(pool).await.unwrap();
            });
        }
    }
    let report = audit::verify(&db, None).await.unwrap();
    let seqs: Vec<i64> = report.broken.iter().map(|b| b.seq).collect();
    assert_eq!(
        seqs,
        [3, 5],
        "both altered events, and only those: {report:?}"
    );
    assert_eq!(report.broken_count, 2);
    assert!(
        report
            .broken
            .iter()
            .all(|b| b.problem.contains("was altered")),
        "{report:?}"
    );
    assert_eq!(report.checked, 6, "verification went on to the end");

    let cli = |json: bool| {
        let mut args = vec!["audit", "verify", "--database", &url];
        if json {
            args.push("--json");
        }
        std::process::Command::new(env!("CARGO_BIN_EXE_emisar"))
            .args(args)
            .output()
            .unwrap()
    };
    let out = cli(false);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.starts_with("BROKEN: 2 of 6 events checked (seq 1..6) are broken"),
        "{stdout}"
    );
    assert!(stdout.contains("BROKEN at seq 3: "), "{stdout}");
    assert!(stdout.contains("BROKEN at seq 5: "), "{stdout}");
    let out = cli(true);
    assert_eq!(out.status.code(), Some(1));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["checked"], 6);
    assert_eq!(report["broken_count"], 2);
    assert_eq!(report["broken"][1]["seq"], 5);
    db.close().await;
}
both_backends!(tampering_is_found_at_every_altered_event);

async fn concurrent_writers_keep_one_chain(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let (url, _pg) = fresh_db(backend, dir.path()).await;
    // Two independent writers with their own pools, like two `emisar serve` replicas.
    let a = AuditLog::start(Db::connect(&url).await.unwrap());
    let b = AuditLog::start(Db::connect(&url).await.unwrap());
    let n = 400;
    let mut tasks = Vec::new();
    for i in 0..n {
        let log = if i % 2 == 0 { a.clone() } else { b.clone() };
        tasks.push(tokio::spawn(
            async move { log.append(event(i)).await.unwrap() },
        ));
    }
    let mut seqs = Vec::new();
    for t in tasks {
        seqs.push(t.await.unwrap().seq);
    }
    seqs.sort();
    assert_eq!(
        seqs,
        (1..=n as i64).collect::<Vec<_>>(),
        "every append got its own seq"
    );
    let db = Db::connect(&url).await.unwrap();
    let report = audit::verify(&db, None).await.unwrap();
    assert!(report.is_intact(), "{report:?}");
    assert_eq!(report.checked, n as u64);
    // What was stored reads back as what was written.
    let first = audit::query(
        &db,
        &audit::AuditFilter {
            limit: 1,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(
        first[0].args.as_ref().unwrap()["nested"]["b"],
        json!([1, 2.5, "x"])
    );
}
both_backends!(concurrent_writers_keep_one_chain);

/// On PostgreSQL the writer keeps the connection of one batch for the next (sqlx tests every
/// connection given back to its pool with a round trip of its own), and gives it back once no
/// batch has followed for a second, so an idle server holds none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_writer_keeps_its_connection_between_batches_and_gives_it_back_when_idle() {
    let dir = tempfile::tempdir().unwrap();
    let (url, _pg) = fresh_db(Backend::Postgres, dir.path()).await;
    let db = Db::connect(&url).await.unwrap();
    let emisar::server::db::Pool::Pg(pool) = db.pool().clone() else {
        unreachable!("a PostgreSQL URL")
    };
    let log = AuditLog::start(db);
    // The first append reads the chain's end in a transaction; the ones after it are chained
    // after what this writer appended, one statement each.
    for i in 0..5 {
        log.append(event(i)).await.unwrap();
        // Long enough for a connection given back to reach the pool (sqlx pings it first).
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        if i > 0 {
            assert_eq!(
                pool.size() - pool.num_idle() as u32,
                1,
                "after append {i} the writer still holds its connection"
            );
        }
    }
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    assert_eq!(
        pool.num_idle() as u32,
        pool.size(),
        "idle for more than a second, the writer gave its connection back"
    );
    // And takes one again for the next append.
    log.append(event(5)).await.unwrap();
    let db = Db::connect(&url).await.unwrap();
    let report = audit::verify(&db, None).await.unwrap();
    assert!(report.is_intact(), "{report:?}");
    assert_eq!(report.checked, 6);
}

/// A write whose intent cannot be recorded does not run. A read runs (it has no side effect)
/// but, its intent and outcome unrecorded, the agent gets nothing of its answer.
async fn an_unwritable_log_refuses_the_call(backend: Backend) {
    use crate::harness::{RunnerSpec, spawn_app};
    use crate::mcp_calls::{call, fixtures_dir};
    // `testkit.touch` is a write the policy lets run without approval.
    let policy = tempfile::Builder::new().suffix(".yaml").tempfile().unwrap();
    std::fs::write(
        policy.path(),
        "risk:\n  testkit.touch: {risk: read, lower: true}\n",
    )
    .unwrap();
    let app = spawn_app(
        backend,
        vec![RunnerSpec::new("node-1")],
        crate::harness::app::Options {
            packs_dir: Some(fixtures_dir()),
            policy_file: Some(policy.path().to_owned()),
            ..Default::default()
        },
    )
    .await;
    let client = app.mcp_client().await;
    let marker = app.dir.path().join("ran");
    let args =
        json!({"runners": ["node-1"], "reason": "does it run?", "path": marker.to_str().unwrap()});
    let read_marker = app.dir.path().join("read");
    let read_args =
        json!({"runners": ["node-1"], "reason": "a read", "path": read_marker.to_str().unwrap()});
    // The store refuses every new audit event (as a full disk or a broken replica would).
    match &app.pg {
        Some(pg) => {
            pg.superuser_sql(
                "CREATE FUNCTION refuse_insert() RETURNS trigger LANGUAGE plpgsql AS $$ \
                 BEGIN RAISE EXCEPTION 'simulated storage failure'; END $$; \
                 CREATE TRIGGER refuse_insert BEFORE INSERT ON audit_events \
                 FOR EACH ROW EXECUTE FUNCTION refuse_insert();",
            )
            .unwrap();
        }
        None => emisar::with_pool!(&app.db, pool => {
            sqlx::query("CREATE TRIGGER refuse_insert BEFORE INSERT ON audit_events BEGIN SELECT RAISE(ABORT, 'simulated storage failure'); END")
                .execute(pool)
                .await
                .unwrap();
        }),
    }
    let res = call(&client, "testkit.touch", args.clone()).await;
    assert_eq!(res.is_error, Some(true));
    let text = serde_json::to_string(&res.content).unwrap();
    assert!(
        text.contains("the audit log cannot record this call"),
        "{text}"
    );
    assert!(text.contains("nothing was run"), "{text}");
    assert!(
        !marker.exists(),
        "the action ran without its intent on record"
    );
    let res = call(&client, "testkit.mark", read_args).await;
    assert_eq!(res.is_error, Some(true), "{res:?}");
    let s = res.structured_content.unwrap();
    assert_eq!(s["results"][0]["error_kind"], "outcome_not_recorded", "{s}");
    assert_eq!(s["results"][0]["output"], Value::Null, "{s}");
    assert!(read_marker.exists(), "the read did not run");
    let events = app.events_of_call(s["call_id"].as_str().unwrap()).await;
    assert!(events.is_empty(), "{events:?}");

    // With the store healthy again, the same call runs.
    match &app.pg {
        Some(pg) => {
            pg.superuser_sql("DROP TRIGGER refuse_insert ON audit_events")
                .unwrap();
        }
        None => emisar::with_pool!(&app.db, pool => {
            sqlx::query("DROP TRIGGER refuse_insert").execute(pool).await.unwrap();
        }),
    }
    let res = call(&client, "testkit.touch", args).await;
    assert_eq!(res.is_error, Some(false));
    assert!(marker.exists());
    app.assert_chain_intact().await;
    client.cancel().await.unwrap();
}
both_backends!(an_unwritable_log_refuses_the_call);

async fn auditors_page_through_the_audit_api(backend: Backend) {
    use crate::harness::{RunnerSpec, spawn_app};
    use crate::mcp_calls::{call, fixtures_dir};
    let app = spawn_app(
        backend,
        vec![RunnerSpec::new("node-1")],
        crate::harness::app::Options {
            packs_dir: Some(fixtures_dir()),
            ..Default::default()
        },
    )
    .await;
    let client = app.mcp_client().await;
    for word in ["a1", "b2", "c3"] {
        call(
            &client,
            "testkit.echo",
            json!({"runners": ["node-1"], "reason": "page me", "word": word}),
        )
        .await;
    }
    client.cancel().await.unwrap();
    let auditor = app
        .issue_token("alice", emisar::server::principal::Role::Auditor)
        .await;
    let http = reqwest::Client::new();
    let get = |token: &str, query: &str| {
        http.get(format!("{}/api/audit?{query}", app.base_url()))
            .bearer_auth(token.to_owned())
            .send()
    };
    // Six events of testkit.echo (intent + outcome per call), two per page.
    let mut seen = Vec::new();
    let mut query = "tool=testkit.echo&limit=2".to_owned();
    loop {
        let page: serde_json::Value = get(&auditor, &query).await.unwrap().json().await.unwrap();
        for e in page["events"].as_array().unwrap() {
            seen.push((
                e["seq"].as_i64().unwrap(),
                e["kind"].as_str().unwrap().to_owned(),
            ));
        }
        match page["next_cursor"].as_str() {
            Some(c) => query = format!("tool=testkit.echo&limit=2&cursor={c}"),
            None => break,
        }
    }
    assert_eq!(seen.len(), 6, "{seen:?}");
    assert!(
        seen.windows(2).all(|w| w[0].0 < w[1].0),
        "in seq order, no repeats"
    );
    let page: serde_json::Value = get(
        &auditor,
        "kind=call.executed&runner=node-1&outcome=ok&actor=agent:test-agent",
    )
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    assert_eq!(page["events"].as_array().unwrap().len(), 3);
    let page: serde_json::Value = get(&auditor, "since=2999-01-01T00:00:00Z")
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(page["events"], json!([]));
    let page: serde_json::Value = get(&auditor, "until=2000-01-01T00:00:00Z")
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(page["events"], json!([]));

    // Bad input names the field; the wrong role is refused.
    let bad = get(&auditor, "since=yesterday").await.unwrap();
    assert_eq!(bad.status(), 400);
    assert!(
        bad.text()
            .await
            .unwrap()
            .contains("`since` must be an RFC 3339 time")
    );
    let bad = get(&auditor, "limit=0").await.unwrap();
    assert!(
        bad.text()
            .await
            .unwrap()
            .contains("`limit` must be between 1 and 1000")
    );
    let bad = get(&auditor, "colour=red").await.unwrap();
    assert_eq!(bad.status(), 400);
    assert!(bad.text().await.unwrap().contains("colour"));
    assert_eq!(
        get(&app.token, "").await.unwrap().status(),
        403,
        "agents do not read the audit log"
    );
    let mcp = http
        .post(&app.mcp_url)
        .bearer_auth(&auditor)
        .header("accept", "application/json, text/event-stream")
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}))
        .send()
        .await
        .unwrap();
    assert_eq!(mcp.status(), 403, "auditors do not call tools");

    // The CLI export holds the same events.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_emisar"))
        .args([
            "audit",
            "export",
            "--format",
            "csv",
            "--tool",
            "testkit.echo",
            "--database",
            &app.database_url,
        ])
        .output()
        .unwrap();
    let csv = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(
        lines[0],
        "seq,id,at,actor,kind,tool,runner,args,reason,call_id,approval_id,outcome,result_digest,detail,prev_hash,hash"
    );
    assert_eq!(lines.len(), 7, "{csv}");
    assert!(
        lines[1].contains(",\"{\"\"word\"\":\"\"a1\"\"}\","),
        "JSON columns are quoted: {}",
        lines[1]
    );
}
both_backends!(auditors_page_through_the_audit_api);

/// Arbitrary JSON, with the values a database is most likely to store differently from how
/// they were hashed: negative zero, integers and floats at the edges of their types, long
/// fractions, NUL and other control characters, unpaired-looking escapes, non-ASCII text.
fn arb_json() -> impl proptest::strategy::Strategy<Value = serde_json::Value> {
    use proptest::prelude::*;
    use serde_json::Value;
    let float = |f: f64| Value::Number(serde_json::Number::from_f64(f).expect("finite"));
    let tricky_numbers = prop::sample::select(vec![
        -0.0,
        0.0,
        0.1 + 0.2,
        1e300,
        -1e-300,
        5e-324,
        f64::MAX,
        f64::MIN_POSITIVE,
        1e29,
        123_456_789_012_345_680_000_000_000_000.0,
        1e21,
        1e-7,
        9_007_199_254_740_993.0,
        std::f64::consts::PI,
    ])
    .prop_map(float);
    let tricky_strings = prop::sample::select(vec![
        "",
        "\u{0}",
        "a\u{0}b",
        "\\u0000",
        "\u{1}\u{1f}\u{7f}",
        "\"quoted\"\\",
        "line\nbreak\ttab\r",
        "\u{2028}\u{2029}",
        "\u{feff}bom",
        "ünïcödé ✓ 𝄞 😀",
        "\u{202e}bidi\u{200b}zero-width",
    ])
    .prop_map(str::to_owned);
    let string = prop_oneof![tricky_strings, any::<String>(), "\\PC{0,40}"];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_filter_map("finite", |f| serde_json::Number::from_f64(f)
            .map(Value::Number)),
        tricky_numbers,
        string.clone().prop_map(Value::String),
    ];
    leaf.prop_recursive(8, 64, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(string.clone(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Whatever JSON a caller hands the log (as args and detail, and whatever text as reason), the
/// append either succeeds or fails with an error, and the stored chain verifies afterwards.
async fn no_input_breaks_the_chain(backend: Backend) {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestCaseError, TestRunner};
    let dir = tempfile::tempdir().unwrap();
    let (url, _pg) = fresh_db(backend, dir.path()).await;
    let db = Db::connect(&url).await.unwrap();
    let log = AuditLog::start(db.clone());
    let handle = tokio::runtime::Handle::current();
    let mut runner = TestRunner::new(Config {
        cases: 200,
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = (arb_json(), arb_json(), any::<String>());
    let result = tokio::task::block_in_place(|| {
        runner.run(&strategy, |(args, detail, reason)| {
            handle.block_on(async {
                let appended = log
                    .append(NewEvent {
                        actor: "agent:prop".into(),
                        kind: "tool.rejected".into(),
                        tool: Some("traefik.ping".into()),
                        args: Some(args.clone()),
                        reason: Some(reason.clone()),
                        detail: Some(detail.clone()),
                        ..Default::default()
                    })
                    .await;
                // Only the new event is checked, so that shrinking is not misled by an
                // earlier case that already broke the chain.
                let Ok(event) = &appended else {
                    return Ok(());
                };
                let report = audit::verify(&db, Some(event.seq))
                    .await
                    .map_err(|e| TestCaseError::fail(format!("verify failed to run: {e}")))?;
                if !report.is_intact() {
                    return Err(TestCaseError::fail(format!(
                        "the chain no longer verifies after appending args {args} detail {detail} \
                         reason {reason:?} ({appended:?}): {report:?}"
                    )));
                }
                Ok(())
            })
        })
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let report = audit::verify(&db, None).await.unwrap();
    assert!(report.checked > 0, "some events were written: {report:?}");
}
both_backends!(no_input_breaks_the_chain);

/// An MCP session opened by hand, so that a request body can carry JSON text no `Value` can
/// hold (1e400, 30-digit integers, long fractions) exactly as an agent would send it.
struct RawMcp {
    http: reqwest::Client,
    url: String,
    token: String,
    session: String,
}

impl RawMcp {
    async fn open(url: &str, token: &str) -> RawMcp {
        let mut mcp = RawMcp {
            http: reqwest::Client::new(),
            url: url.to_owned(),
            token: token.to_owned(),
            session: String::new(),
        };
        let (status, session, _) = mcp
            .post(
                r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#,
            )
            .await;
        assert_eq!(status, 200);
        mcp.session = session.expect("the server opens a session");
        let (status, _, _) = mcp
            .post(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#)
            .await;
        assert!(status < 300, "{status}");
        mcp
    }

    /// POSTs `body` as is; returns the status, the session header and the JSON-RPC messages
    /// of the answer (SSE `data:` lines or a plain JSON body).
    async fn post(&self, body: &str) -> (u16, Option<String>, Vec<serde_json::Value>) {
        let mut req = self
            .http
            .post(&self.url)
            .bearer_auth(&self.token)
            .header("accept", "application/json, text/event-stream")
            .header("content-type", "application/json")
            .header("mcp-protocol-version", "2025-11-25")
            .body(body.to_owned());
        if !self.session.is_empty() {
            req = req.header("mcp-session-id", &self.session);
        }
        let res = req.send().await.unwrap();
        let status = res.status().as_u16();
        let session = res
            .headers()
            .get("mcp-session-id")
            .map(|v| v.to_str().unwrap().to_owned());
        let text = res.text().await.unwrap();
        let messages = text
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .chain(text.trim_start().starts_with('{').then_some(text.as_str()))
            .filter_map(|d| serde_json::from_str(d.trim()).ok())
            .collect();
        (status, session, messages)
    }
}

/// Numbers and text that a database may store differently from how they arrived, sent as an
/// extra argument of a real MCP call: every call is refused (the argument is not in the
/// tool's schema), the refusals are audited with their args, and the chain still verifies,
/// through the library and through `emisar audit verify`.
async fn hostile_arguments_leave_the_chain_verifiable(backend: Backend) {
    use crate::harness::{RunnerSpec, spawn_app};
    let app = spawn_app(
        backend,
        vec![RunnerSpec::new("node-1")],
        crate::harness::app::Options::default(),
    )
    .await;
    let mcp = RawMcp::open(&app.mcp_url, &app.token).await;
    let hostile = [
        "-0.0",
        "-0",
        "1e400",
        "-1e400",
        "1e-400",
        "123456789012345678901234567890",
        "-123456789012345678901234567890",
        "18446744073709551616",
        "0.1000000000000000055511151231257827021181583404541015625",
        "3.14159265358979323846264338327950288419716939937510",
        "1E+2",
        r#""a\u0000b""#,
        r#"{"\u0000": [-0.0, "\u0000"], "k": {"deep": [[[[[[-0.0, 1e-400]]]]]]}}"#,
    ];
    let mut audited = 0;
    for (i, x) in hostile.iter().enumerate() {
        let id = i + 1;
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"traefik.ping","arguments":{{"runners":["node-1"],"reason":"hostile numbers","x":{x}}}}}}}"#
        );
        let (status, _, messages) = mcp.post(&body).await;
        let answer = messages
            .iter()
            .find(|m| m["id"] == json!(id))
            .cloned()
            .unwrap_or(serde_json::Value::Null);
        // Refused: an HTTP error, a JSON-RPC error (text the server could not read), or a
        // tool error naming the argument (which is then audited).
        let refused_as_tool_error = answer["result"]["isError"] == json!(true);
        assert!(
            status >= 400 || answer["error"].is_object() || refused_as_tool_error,
            "x = {x}: not refused: {status} {answer}"
        );
        if refused_as_tool_error {
            audited += 1;
            let text = answer["result"].to_string();
            assert!(
                text.contains('x'),
                "x = {x}: the error names the argument: {text}"
            );
        }
    }
    let rejected = app
        .events(AuditFilter {
            kind: Some("tool.rejected".into()),
            limit: 1000,
            ..Default::default()
        })
        .await;
    assert!(
        audited >= 1,
        "at least -0.0 reaches the gateway and is refused there"
    );
    assert_eq!(
        rejected.len(),
        audited,
        "every refusal is audited: {rejected:#?}"
    );
    assert!(
        rejected
            .iter()
            .all(|e| e.args.as_ref().is_some_and(|a| a.get("x").is_some())),
        "the refusals are audited with their args: {rejected:#?}"
    );
    app.assert_chain_intact().await;
    app.verify_with_cli();
}
both_backends!(hostile_arguments_leave_the_chain_verifiable);

/// A batch holding an event the database refuses: the poison fails its own caller with a
/// clear error, every other caller's event in the same batch is written and acknowledged, and
/// the chain stays intact.
async fn a_poison_event_fails_only_its_own_caller(backend: Backend) {
    use sqlx::Connection;
    let dir = tempfile::tempdir().unwrap();
    let (url, _pg) = fresh_db(backend, dir.path()).await;
    let db = Db::connect(&url).await.unwrap();
    let log = AuditLog::start(db.clone());
    // Events PostgreSQL refuses by nature: a NUL byte in a TEXT column, an actor too long for
    // its index. SQLite stores both, so there a trigger plays the refusing database.
    let poisons: Vec<NewEvent> = match backend {
        Backend::Postgres => vec![
            NewEvent {
                reason: Some("nul \u{0} byte".into()),
                ..event(1000)
            },
            NewEvent {
                // Random hex: incompressible, so the index entry cannot be squeezed under
                // PostgreSQL's limit of about 2.7 kB.
                actor: (0..400)
                    .map(|_| uuid::Uuid::new_v4().simple().to_string())
                    .collect(),
                ..event(1001)
            },
        ],
        Backend::Sqlite => {
            emisar::with_pool!(&db, pool => {
                sqlx::query("CREATE TRIGGER poison BEFORE INSERT ON audit_events WHEN NEW.reason = 'poison' BEGIN SELECT RAISE(ABORT, 'poison refused'); END")
                    .execute(pool).await.unwrap();
            });
            vec![NewEvent {
                reason: Some("poison".into()),
                ..event(1000)
            }]
        }
    };
    log.append(event(0)).await.unwrap();

    // Hold the append lock from outside, so that everything appended meanwhile queues up
    // and goes to the database as one batch once it is released.
    let mut holder: Box<dyn std::any::Any> = match backend {
        Backend::Postgres => {
            let mut c = sqlx::PgConnection::connect(&url).await.unwrap();
            sqlx::query("SELECT pg_advisory_lock($1)")
                .bind(AUDIT_LOCK)
                .execute(&mut c)
                .await
                .unwrap();
            Box::new(c)
        }
        Backend::Sqlite => {
            let mut c = sqlx::SqliteConnection::connect(&url).await.unwrap();
            sqlx::query("BEGIN IMMEDIATE")
                .execute(&mut c)
                .await
                .unwrap();
            Box::new(c)
        }
    };
    // The first append takes the writer into the lock wait; the rest queue behind it.
    let first = tokio::spawn({
        let log = log.clone();
        async move { log.append(event(1)).await }
    });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let mut good = Vec::new();
    let mut bad = Vec::new();
    for i in 0..40 {
        let writer = log.clone();
        good.push(tokio::spawn(
            async move { writer.append(event(100 + i)).await },
        ));
        if i % 15 == 7
            && let Some(p) = poisons.get(bad.len())
        {
            let log = log.clone();
            let p = p.clone();
            bad.push(tokio::spawn(async move { log.append(p).await }));
        }
    }
    // Appends of several events in the same batch: a good pair is written together, in its
    // order; a pair holding a poison is refused whole (its good event is not written).
    let pair = tokio::spawn({
        let log = log.clone();
        async move { log.append_all(vec![event(200), event(201)]).await }
    });
    let poisoned_pair = tokio::spawn({
        let log = log.clone();
        let poison = poisons[0].clone();
        async move {
            log.append_all(vec![
                NewEvent {
                    reason: Some("the good half of a poisoned pair".into()),
                    ..event(300)
                },
                poison,
            ])
            .await
        }
    });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    if let Some(c) = holder.downcast_mut::<sqlx::PgConnection>() {
        sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(AUDIT_LOCK)
            .execute(&mut *c)
            .await
            .unwrap();
    }
    if let Some(c) = holder.downcast_mut::<sqlx::SqliteConnection>() {
        sqlx::query("COMMIT").execute(&mut *c).await.unwrap();
    }
    drop(holder);

    first
        .await
        .unwrap()
        .expect("the event ahead of the batch is written");
    let mut seqs = Vec::new();
    for g in good {
        let e = g
            .await
            .unwrap()
            .expect("a good event in a poisoned batch is written");
        seqs.push(e.seq);
    }
    assert_eq!(bad.len(), poisons.len());
    for b in bad {
        let text = match b.await.unwrap() {
            Ok(e) => panic!("the poison event was written as seq {}", e.seq),
            Err(e) => e.to_string(),
        };
        assert!(
            text.starts_with("the audit store refused the write: ")
                && ["invalid byte sequence", "index row", "poison refused"]
                    .iter()
                    .any(|why| text.contains(why)),
            "a clear error that says why: {text}"
        );
    }
    seqs.sort();
    seqs.dedup();
    assert_eq!(seqs.len(), 40, "every good event got its own seq");
    let pair = pair.await.unwrap().expect("a good pair is written");
    let reasons: Vec<_> = pair.iter().map(|e| e.reason.as_deref().unwrap()).collect();
    assert_eq!(
        reasons,
        [event(200).reason.unwrap(), event(201).reason.unwrap()]
    );
    assert_eq!(pair[1].seq, pair[0].seq + 1, "together, in order: {pair:?}");
    let refused = poisoned_pair
        .await
        .unwrap()
        .expect_err("a pair holding a poison is refused");
    assert!(
        refused
            .to_string()
            .starts_with("the audit store refused the write: "),
        "{refused}"
    );
    let stored = audit::query(
        &db,
        &AuditFilter {
            limit: 1000,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(stored.len(), 44);
    assert!(
        !stored
            .iter()
            .any(|e| e.reason.as_deref() == Some("the good half of a poisoned pair")),
        "the good half of a refused pair is not written"
    );
    let report = audit::verify(&db, None).await.unwrap();
    assert!(report.is_intact(), "{report:?}");
    assert_eq!(
        report.checked, 44,
        "the two first events, the 40 good ones and the good pair"
    );
    assert!(
        log.problem().is_none(),
        "one refused event is not an unhealthy store"
    );
}
both_backends!(a_poison_event_fails_only_its_own_caller);

/// Two writers on one database (two replicas' audit writers) taking turns: each chains its
/// batch after the event it appended last only while that is still the last event, so every
/// append after the other writer's is chained after that one instead, and the chain stays
/// one unbroken line.
async fn writers_taking_turns_keep_one_chain(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let (url, _pg) = fresh_db(backend, dir.path()).await;
    let db = Db::connect(&url).await.unwrap();
    let a = AuditLog::start(db.clone());
    let b = AuditLog::start(Db::connect(&url).await.unwrap());
    for i in 0..10 {
        // Twice in a row on one writer (its own head is still the last event), then once on
        // the other (whose head is stale).
        let first = a.append(event(3 * i)).await.unwrap();
        let second = a.append(event(3 * i + 1)).await.unwrap();
        let third = b.append(event(3 * i + 2)).await.unwrap();
        assert_eq!(second.prev_hash, first.hash);
        assert_eq!(
            third.prev_hash, second.hash,
            "chained after the other writer's event"
        );
        assert_eq!(third.seq, first.seq + 2);
    }
    let report = audit::verify(&db, None).await.unwrap();
    assert!(report.is_intact(), "{report:?}");
    assert_eq!(report.checked, 30);
}
both_backends!(writers_taking_turns_keep_one_chain);

/// Runs the migrations older than the canonical-text one, so that a test can write rows the
/// way emisar wrote them before it.
async fn migrate_before_canonical_text(backend: Backend, url: &str, dir: &std::path::Path) {
    let sub = match backend {
        Backend::Postgres => "postgres",
        Backend::Sqlite => "sqlite",
    };
    let old = dir.join("old-migrations");
    std::fs::create_dir_all(&old).unwrap();
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("migrations")
        .join(sub);
    for entry in std::fs::read_dir(src).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        if name.as_str() < "20261201000003" {
            std::fs::copy(&path, old.join(name)).unwrap();
        }
    }
    let migrator = sqlx::migrate::Migrator::new(old).await.unwrap();
    match backend {
        Backend::Postgres => {
            let pool = sqlx::PgPool::connect(url).await.unwrap();
            migrator.run(&pool).await.unwrap();
            pool.close().await;
        }
        Backend::Sqlite => {
            let options: sqlx::sqlite::SqliteConnectOptions = url.parse().unwrap();
            let pool = sqlx::SqlitePool::connect_with(options.create_if_missing(true))
                .await
                .unwrap();
            migrator.run(&pool).await.unwrap();
            pool.close().await;
        }
    }
}

/// Writes one event after `prev` (seq, hash) the way emisar did before the canonical text
/// was stored: JSON columns through `::jsonb` (as JSON text on SQLite), no `hash_v`.
async fn append_the_old_way(
    backend: Backend,
    url: &str,
    prev: (i64, String),
    args: serde_json::Value,
) -> (i64, String) {
    use sqlx::Connection;
    let e = audit::Event {
        seq: prev.0 + 1,
        id: uuid::Uuid::new_v4().to_string(),
        at: audit::format_at(chrono::Utc::now()),
        actor: "agent:old".into(),
        kind: "tool.called".into(),
        tool: Some("traefik.ping".into()),
        runner: None,
        args: Some(args),
        reason: Some("written by an older emisar".into()),
        call_id: None,
        approval_id: None,
        outcome: None,
        result_digest: None,
        detail: Some(json!({"runners": ["node-1"], "duration_ms": 12})),
        prev_hash: prev.1,
        hash: String::new(),
        hash_v: audit::hash_v::VALUE,
    };
    let hash = e.compute_hash();
    let sql = "INSERT INTO audit_events (seq, id, at, actor, kind, tool, runner, args, reason, \
               call_id, approval_id, outcome, result_digest, detail, prev_hash, hash) VALUES ($1, \
               $2, $3::timestamptz, $4, $5, $6, $7, $8::jsonb, $9, $10, $11, $12, $13, \
               $14::jsonb, $15, $16)";
    macro_rules! insert {
        ($conn:expr, $sql:expr) => {
            sqlx::query($sql)
                .bind(e.seq)
                .bind(&e.id)
                .bind(&e.at)
                .bind(&e.actor)
                .bind(&e.kind)
                .bind(&e.tool)
                .bind(&e.runner)
                .bind(e.args.as_ref().map(|v| v.to_string()))
                .bind(&e.reason)
                .bind(&e.call_id)
                .bind(&e.approval_id)
                .bind(&e.outcome)
                .bind(&e.result_digest)
                .bind(e.detail.as_ref().map(|v| v.to_string()))
                .bind(&e.prev_hash)
                .bind(&hash)
                .execute(&mut $conn)
                .await
                .unwrap()
        };
    }
    match backend {
        Backend::Postgres => {
            let mut c = sqlx::PgConnection::connect(url).await.unwrap();
            insert!(c, sql);
        }
        Backend::Sqlite => {
            let mut c = sqlx::SqliteConnection::connect(url).await.unwrap();
            let sql = sql.replace("::timestamptz", "").replace("::jsonb", "");
            insert!(c, sqlx::AssertSqlSafe(sql));
        }
    }
    (e.seq, hash)
}

/// Events written before the migration to canonical text still verify after it (their JSON
/// is re-canonicalised from what is stored), and so do events an older emisar replica writes
/// during a rolling upgrade; new events chain after them.
async fn events_from_before_the_canonical_text_still_verify(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let (url, _pg) = fresh_db(backend, dir.path()).await;
    migrate_before_canonical_text(backend, &url, dir.path()).await;
    // JSONB reorders keys (shortest first), respaces and rewrites numbers: what it hands
    // back is not the text that was hashed, but re-canonicalises to it.
    let legacy_args = [
        json!({"service": "web", "b": [1, 2.5, "x"], "a": null}),
        json!({"bb": {"z": 1, "y": [true, false]}, "a": 1.5e300, "n": 12345678901234567u64}),
    ];
    let mut prev = (0, audit::GENESIS_HASH.to_owned());
    for args in &legacy_args {
        prev = append_the_old_way(backend, &url, prev, args.clone()).await;
    }

    // This emisar connects and migrates; the old rows verify.
    let db = Db::connect(&url).await.unwrap();
    let report = audit::verify(&db, None).await.unwrap();
    assert!(report.is_intact(), "{report:?}");
    assert_eq!(report.checked, 2);
    // An older replica still running during the upgrade writes the old way into the new
    // schema: the row gets the old format by default and verifies as such.
    prev = append_the_old_way(backend, &url, prev, legacy_args[0].clone()).await;
    let log = AuditLog::start(db.clone());
    let new = log.append(event(1)).await.unwrap();
    assert_eq!(new.seq, prev.0 + 1);
    assert_eq!(new.prev_hash, prev.1, "new events chain after the old ones");
    let report = audit::verify(&db, None).await.unwrap();
    assert!(report.is_intact(), "{report:?}");
    assert_eq!(report.checked, 4);
    let formats: Vec<i16> = audit::query(
        &db,
        &AuditFilter {
            limit: 10,
            ..Default::default()
        },
    )
    .await
    .unwrap()
    .iter()
    .map(|e| e.hash_v)
    .collect();
    assert_eq!(formats, [1, 1, 1, 2]);
}
both_backends!(events_from_before_the_canonical_text_still_verify);

/// A replica whose clock runs an hour ahead writes an event; events written after it on this
/// replica are stamped no earlier, so `at` never decreases along `seq` and time filters stay
/// exact.
async fn time_never_goes_backwards_along_the_chain(backend: Backend) {
    use sqlx::Connection;
    let dir = tempfile::tempdir().unwrap();
    let (url, _pg) = fresh_db(backend, dir.path()).await;
    let db = Db::connect(&url).await.unwrap();
    let log = AuditLog::start(db.clone());
    let first = log.append(event(1)).await.unwrap();

    let ahead = audit::format_at(chrono::Utc::now() + chrono::Duration::hours(1));
    let sealed = audit::Event::seal(
        event(2),
        2,
        uuid::Uuid::new_v4().to_string(),
        ahead.clone(),
        first.hash.clone(),
    );
    let e = &sealed.event;
    let sql = "INSERT INTO audit_events (seq, id, at, actor, kind, tool, runner, args, reason, \
               call_id, approval_id, outcome, result_digest, detail, prev_hash, hash, hash_v) \
               VALUES ($1, $2, $3::timestamptz, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, \
               $15, $16, 2)";
    macro_rules! insert {
        ($conn:expr, $sql:expr) => {
            sqlx::query($sql)
                .bind(e.seq)
                .bind(&e.id)
                .bind(&e.at)
                .bind(&e.actor)
                .bind(&e.kind)
                .bind(&e.tool)
                .bind(&e.runner)
                .bind(&sealed.args_text)
                .bind(&e.reason)
                .bind(&e.call_id)
                .bind(&e.approval_id)
                .bind(&e.outcome)
                .bind(&e.result_digest)
                .bind(&sealed.detail_text)
                .bind(&e.prev_hash)
                .bind(&e.hash)
                .execute(&mut $conn)
                .await
                .unwrap()
        };
    }
    match backend {
        Backend::Postgres => {
            let mut c = sqlx::PgConnection::connect(&url).await.unwrap();
            insert!(c, sql);
        }
        Backend::Sqlite => {
            let mut c = sqlx::SqliteConnection::connect(&url).await.unwrap();
            insert!(c, sqlx::AssertSqlSafe(sql.replace("::timestamptz", "")));
        }
    }

    let after = log.append(event(3)).await.unwrap();
    assert_eq!(after.seq, 3);
    assert!(
        after.at >= ahead,
        "stamped {} after an event at {ahead}",
        after.at
    );
    let report = audit::verify(&db, None).await.unwrap();
    assert!(report.is_intact(), "{report:?}");
    // A time filter at the clock that ran ahead finds both events from then on.
    let since = chrono::DateTime::parse_from_rfc3339(&ahead)
        .unwrap()
        .to_utc();
    let found: Vec<i64> = audit::query(
        &db,
        &AuditFilter {
            since: Some(since),
            limit: 10,
            ..Default::default()
        },
    )
    .await
    .unwrap()
    .iter()
    .map(|e| e.seq)
    .collect();
    assert_eq!(found, [2, 3]);
}
both_backends!(time_never_goes_backwards_along_the_chain);

/// `since` and `until` (turned into seq bounds in SQL) select exactly the events a plain scan
/// of the log selects, alone, together, with other filters and with a small page.
async fn time_filters_select_what_a_scan_selects(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let (url, _pg) = fresh_db(backend, dir.path()).await;
    let db = Db::connect(&url).await.unwrap();
    let log = AuditLog::start(db.clone());
    let kinds = ["tool.called", "call.executed", "call.failed"];
    for round in 0..12 {
        // Some events one at a time (each its own `at`), some concurrently (batches that
        // share one `at`).
        if round % 3 == 0 {
            let mut tasks = Vec::new();
            for i in 0..8 {
                let log = log.clone();
                tasks.push(tokio::spawn(async move {
                    log.append(NewEvent {
                        kind: kinds[i % 3].into(),
                        ..event(i)
                    })
                    .await
                    .unwrap()
                }));
            }
            for t in tasks {
                t.await.unwrap();
            }
        } else {
            log.append(NewEvent {
                kind: kinds[round % 3].into(),
                ..event(round)
            })
            .await
            .unwrap();
        }
    }
    let all = audit::query(
        &db,
        &AuditFilter {
            limit: 1000,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let time = |at: &str| chrono::DateTime::parse_from_rfc3339(at).unwrap().to_utc();
    let micro = chrono::Duration::microseconds(1);
    let mut pivots = vec![
        time(&all[0].at) - chrono::Duration::seconds(1),
        time(&all.last().unwrap().at) + micro,
    ];
    for e in all.iter().step_by(9) {
        pivots.extend([time(&e.at), time(&e.at) + micro, time(&e.at) - micro]);
    }
    let mut windows: Vec<_> = pivots.iter().map(|&p| (Some(p), None)).collect();
    windows.extend(pivots.iter().map(|&p| (None, Some(p))));
    for &since in &pivots {
        windows.extend(pivots.iter().map(|&until| (Some(since), Some(until))));
    }
    let mut checked = 0;
    for (s, u) in windows {
        for kind in [None, Some("call.failed")] {
            for limit in [3, 1000] {
                let filter = AuditFilter {
                    since: s,
                    until: u,
                    kind: kind.map(str::to_owned),
                    limit,
                    ..Default::default()
                };
                let expected: Vec<i64> = all
                    .iter()
                    .filter(|e| s.is_none_or(|s| time(&e.at) >= s))
                    .filter(|e| u.is_none_or(|u| time(&e.at) < u))
                    .filter(|e| kind.is_none_or(|k| e.kind == k))
                    .take(limit as usize)
                    .map(|e| e.seq)
                    .collect();
                let found: Vec<i64> = audit::query(&db, &filter)
                    .await
                    .unwrap()
                    .iter()
                    .map(|e| e.seq)
                    .collect();
                assert_eq!(found, expected, "{filter:?}");
                checked += 1;
            }
        }
    }
    assert!(checked > 1000, "{checked}");
}
both_backends!(time_filters_select_what_a_scan_selects);
