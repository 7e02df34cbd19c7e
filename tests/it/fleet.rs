//! Runners that join with a join token, carry labels, and are targeted by selector; tokens
//! limited to a selector see only those runners.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use emisar::server::fleet::JoinTokenSpec;
use serde_json::json;

use crate::harness::app::Options;
use crate::harness::join::{run_runner_to_end, runner_toml, spawn_runner};
use crate::harness::{Backend, RunnerSpec, spawn_app};
use crate::mcp_calls::{call, fixtures_dir};

/// A one-use join token for runners that get exactly `labels`.
fn labelled(labels: &[(&str, &str)]) -> JoinTokenSpec {
    JoinTokenSpec {
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>(),
        packs: ["testkit".to_owned()].into(),
        ..JoinTokenSpec::once(Duration::from_secs(600))
    }
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
    // Each runner's labels come from its join token; the edge runner's config asks for
    // them too (which the token grants), the db runner's leaves them to the token.
    let (_, edge_token) = app
        .join_token(labelled(&[("role", "edge"), ("dc", "dc1")]))
        .await;
    let (_, db_token) = app
        .join_token(labelled(&[("role", "db"), ("dc", "dc1")]))
        .await;
    let dir = tempfile::tempdir().unwrap();
    let edge_config = runner_toml(
        dir.path(),
        "edge-1",
        "labels = { role = \"edge\", dc = \"dc1\" }",
    );
    let db_config = runner_toml(dir.path(), "db-1", "");
    let _edge = spawn_runner(
        &app.base_url(),
        &edge_config,
        Some(&edge_token),
        &dir.path().join("edge.log"),
    );
    let _db = spawn_runner(
        &app.base_url(),
        &db_config,
        Some(&db_token),
        &dir.path().join("db.log"),
    );
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
        emisar::server::principal::Role::Agent,
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
    assert!(
        text.contains("`edge-1` is not a runner this agent may use"),
        "{text}"
    );
    // The audit log names the token's selector that kept it out.
    let rejected = app
        .events(emisar::server::audit::AuditFilter {
            kind: Some("tool.rejected".into()),
            ..Default::default()
        })
        .await;
    let why = rejected.last().unwrap().detail.clone().unwrap()["error"].clone();
    assert!(
        why.as_str().unwrap().contains(
            "runner `edge-1` (labels `dc=dc1,role=edge`) is outside the runners agent `db-bot` may use: the selector `role=db` of agent `db-bot`'s token"
        ),
        "{why}"
    );
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

    // A well-formed join token this server never issued: the runner says so and stops.
    let forged =
        emisar::protocol::JoinToken::new(format!("emj_{}", "A".repeat(43)), app.server_pins())
            .unwrap()
            .render();
    let bad_config = runner_toml(dir.path(), "rogue", "labels = { role = \"edge\" }");
    let (code, err) = run_runner_to_end(&app.base_url(), &bad_config, Some(&forged)).await;
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("refused to let `rogue` join (HTTP 401") && err.contains("unknown"),
        "{err}"
    );
    assert_eq!(
        app.runners_api().await["runners"].as_array().unwrap().len(),
        2
    );
}

/// `GET /api/runners` shows a token limited to a selector only the runners it matches.
async fn the_runners_api_honours_the_token_selector(backend: Backend) {
    let app = spawn_app(
        backend,
        vec![
            RunnerSpec::new("edge-a").label("role", "edge"),
            RunnerSpec::new("db-a").label("role", "db"),
        ],
        Options::default(),
    )
    .await;
    let names = |v: serde_json::Value| -> Vec<String> {
        v["runners"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(names(app.runners_api().await), ["db-a", "edge-a"]);
    let edge = emisar::selector::Selector::parse("role=edge").unwrap();
    let limited = emisar::server::tokens::issue_scoped(
        &app.db,
        &app.audit,
        "edge-bot",
        emisar::server::principal::Role::Agent,
        Some(&edge),
        Duration::from_secs(600),
        "test",
    )
    .await
    .unwrap()
    .token;
    let seen: serde_json::Value = reqwest::Client::new()
        .get(format!("{}/api/runners", app.base_url()))
        .bearer_auth(&limited)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(names(seen), ["edge-a"]);
}
crate::both_backends!(the_runners_api_honours_the_token_selector);
