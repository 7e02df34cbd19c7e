//! Runners that join with a join token, carry labels, and are targeted by selector; tokens
//! limited to a selector see only those runners.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::harness::app::{Options, TestApp};
use crate::harness::tools::{Proc, free_port};
use crate::harness::{Backend, spawn_app};
use crate::mcp_calls::{call, fixtures_dir};

fn runner_config(dir: &std::path::Path, name: &str, labels: &str) -> (std::path::PathBuf, u16) {
    let port = free_port();
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(
        &path,
        format!(
            "name = \"{name}\"\nlisten = \"127.0.0.1:{port}\"\ninsecure_http = true\npacks_dir = \"{}\"\nexec_path = \"/usr/bin:/bin\"\nlabels = {labels}\n",
            fixtures_dir().display()
        ),
    )
    .unwrap();
    (path, port)
}

fn start_runner(
    app: &TestApp,
    config: &std::path::Path,
    join_token: &str,
    log: &std::path::Path,
) -> Proc {
    Proc(
        Command::new(env!("CARGO_BIN_EXE_emisar"))
            .args([
                "runner",
                "--config",
                config.to_str().unwrap(),
                "--server",
                &app.base_url(),
            ])
            .env("EMISAR_JOIN_TOKEN", join_token)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runners_join_with_a_token_and_are_chosen_by_label() {
    let app = spawn_app(
        Backend::Postgres,
        vec![],
        Options {
            packs_dir: Some(fixtures_dir()),
            ..Default::default()
        },
    )
    .await;
    let (_, join_token) = emisar::server::fleet::issue_join_token(
        &app.db,
        &app.audit,
        Duration::from_secs(600),
        "test",
    )
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (edge_config, _) = runner_config(dir.path(), "edge-1", "{ role = \"edge\", dc = \"dc1\" }");
    let (db_config, _) = runner_config(dir.path(), "db-1", "{ role = \"db\", dc = \"dc1\" }");
    let _edge = start_runner(
        &app,
        &edge_config,
        &join_token,
        &dir.path().join("edge.log"),
    );
    let _db = start_runner(&app, &db_config, &join_token, &dir.path().join("db.log"));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = app.runners_api().await;
        if r["runners"].as_array().unwrap().len() == 2 {
            let edge = r["runners"]
                .as_array()
                .unwrap()
                .iter()
                .find(|x| x["name"] == "edge-1")
                .unwrap()
                .clone();
            assert_eq!(edge["labels"], json!({"role": "edge", "dc": "dc1"}));
            assert_eq!(edge["heartbeat_ok"], true);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "runners did not join: {r}\n{}",
            std::fs::read_to_string(dir.path().join("edge.log")).unwrap()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let joined = app
        .events(emisar::server::audit::AuditFilter {
            kind: Some("runner.joined".into()),
            ..Default::default()
        })
        .await;
    assert_eq!(joined.len(), 2);

    // By selector: the edge runner only, though neither was named.
    let client = app.mcp_client().await;
    let res = call(
        &client,
        "testkit.echo",
        json!({"selector": "role=edge", "reason": "edge only", "word": "hi"}),
    )
    .await;
    let results = res.structured_content.unwrap()["results"].clone();
    assert_eq!(results.as_array().unwrap().len(), 1, "{results}");
    assert_eq!(results[0]["runner"], "edge-1");
    assert_eq!(results[0]["output"], json!({"said": "hi"}));
    let res = call(
        &client,
        "testkit.echo",
        json!({"selector": "dc=dc1", "reason": "all of dc1", "word": "hi"}),
    )
    .await;
    assert_eq!(
        res.structured_content.unwrap()["results"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    client.cancel().await.unwrap();

    // A token limited to role=db does not see the edge runner at all.
    let db = emisar::selector::Selector::parse("role=db").unwrap();
    let limited = emisar::server::tokens::issue_scoped(
        &app.db,
        &app.audit,
        "db-bot",
        emisar::server::tokens::Role::Agent,
        Some(&db),
        Duration::from_secs(600),
        "test",
    )
    .await
    .unwrap()
    .token;
    let scoped = crate::harness::tools::mcp_client(&app.mcp_url, &limited).await;
    let tools = scoped.list_all_tools().await.unwrap();
    let echo = tools.iter().find(|t| t.name == "testkit.echo").unwrap();
    assert_eq!(
        echo.input_schema["properties"]["runners"]["items"]["enum"],
        json!(["db-1"])
    );
    let res = call(
        &scoped,
        "testkit.echo",
        json!({"runners": ["edge-1"], "reason": "r", "word": "x"}),
    )
    .await;
    assert_eq!(res.is_error, Some(true));
    let text = serde_json::to_string(&res.content).unwrap();
    assert!(text.contains("no runner is named `edge-1`"), "{text}");
    let res = call(
        &scoped,
        "testkit.echo",
        json!({"selector": "dc=dc1", "reason": "r", "word": "x"}),
    )
    .await;
    let results = res.structured_content.unwrap()["results"].clone();
    assert_eq!(results.as_array().unwrap().len(), 1);
    assert_eq!(results[0]["runner"], "db-1");
    let res = call(
        &scoped,
        "emisar.runners",
        json!({"reason": "which runners are mine?"}),
    )
    .await;
    let listed = res.structured_content.unwrap()["results"][0]["output"].clone();
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(listed[0]["name"], "db-1");
    scoped.cancel().await.unwrap();

    // A bad join token: the runner says so and stops.
    let (bad_config, _) = runner_config(dir.path(), "rogue", "{ role = \"edge\" }");
    let out = Command::new(env!("CARGO_BIN_EXE_emisar"))
        .args([
            "runner",
            "--config",
            bad_config.to_str().unwrap(),
            "--server",
            &app.base_url(),
            "--join-token",
            "emj_forged",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("refused to let `rogue` join (HTTP 401"),
        "{err}"
    );
    assert_eq!(
        app.runners_api().await["runners"].as_array().unwrap().len(),
        2
    );
}
