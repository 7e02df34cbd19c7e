//! The audit log on both backends: append-only in the database itself, hash-chained,
//! tampering found at the right event, and one chain under concurrent writers.

use emisar::audit::{self, AuditLog, NewEvent};
use emisar::db::Db;
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
