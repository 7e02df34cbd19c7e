//! The audit log on both backends: append-only in the database itself, hash-chained,
//! tampering found at the right event, and one chain under concurrent writers.

use emisar::server::audit::{self, AuditLog, NewEvent};
use emisar::server::db::Db;
use serde_json::json;

use crate::both_backends;
use crate::harness::Backend;
use crate::harness::app::fresh_db;

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

async fn tampering_is_found_at_the_right_event(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let (url, pg) = fresh_db(backend, dir.path()).await;
    let db = Db::connect(&url).await.unwrap();
    let log = AuditLog::start(db.clone());
    for i in 0..5 {
        log.append(event(i)).await.unwrap();
    }
    let report = audit::verify(&db, None).await.unwrap();
    assert_eq!((report.checked, report.broken.clone()), (5, None));
    assert_eq!(audit::verify(&db, Some(3)).await.unwrap().checked, 3);

    // An attacker with superuser rights switches the guard off and edits event 3.
    match &pg {
        Some(pg) => {
            pg.superuser_sql(
                "ALTER TABLE audit_events DISABLE TRIGGER USER; \
                 UPDATE audit_events SET reason = 'nothing to see' WHERE seq = 3; \
                 ALTER TABLE audit_events ENABLE TRIGGER USER;",
            )
            .unwrap();
        }
        None => {
            emisar::with_pool!(&db, pool => {
                sqlx::query("DROP TRIGGER audit_events_no_update").execute(pool).await.unwrap();
                sqlx::query("UPDATE audit_events SET reason = 'nothing to see' WHERE seq = 3").execute(pool).await.unwrap();
            });
        }
    }
    let report = audit::verify(&db, None).await.unwrap();
    let broken = report.broken.expect("tampering is found");
    assert_eq!(broken.seq, 3);
    assert!(broken.problem.contains("was altered"), "{}", broken.problem);
    assert_eq!(report.checked, 2);

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_emisar"))
        .args(["audit", "verify", "--database", &url])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("BROKEN at seq 3"), "{stdout}");
    db.close().await;
}
both_backends!(tampering_is_found_at_the_right_event);

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
    assert_eq!(report.broken, None);
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

async fn an_unwritable_log_refuses_the_call(backend: Backend) {
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
    let marker = app.dir.path().join("ran");
    let args =
        json!({"runners": ["node-1"], "reason": "does it run?", "path": marker.to_str().unwrap()});
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
    let res = call(&client, "testkit.mark", args.clone()).await;
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
    let res = call(&client, "testkit.mark", args).await;
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
        .issue_token("alice", emisar::server::tokens::Role::Auditor)
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
