//! Tool calls through a real MCP client (rmcp over streamable HTTP), to real runners, with
//! the audit log checked afterwards. Every test runs on PostgreSQL and SQLite.

use std::time::{Duration, Instant};

use emisar::server::audit::AuditFilter;
use emisar::server::config::RunnerEntry;
use rmcp::model::{CallToolRequestParams, CallToolResult};
use serde_json::{Value, json};

use crate::harness::app::{Options, TEST_AGENT};
use crate::harness::traefik::Traefik;
use crate::harness::{Backend, Build, RunnerSpec, spawn_app, tools::DeadEndpoint};
use crate::{both_backends, both_backends_every_build};

pub fn fixtures_dir() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/it/fixtures")
}

/// A Traefik dynamic config with one load balancer: one live backend, one dead.
pub fn two_backend_config(live: u16, dead: u16) -> String {
    format!(
        r#"http:
  routers:
    whoami:
      rule: "PathPrefix(`/app`)"
      entryPoints: ["web"]
      service: app
  services:
    app:
      loadBalancer:
        healthCheck:
          path: /
          interval: 500ms
          timeout: 300ms
        servers:
          - url: "http://127.0.0.1:{live}"
          - url: "http://127.0.0.1:{dead}"
"#
    )
}

pub async fn call(
    client: &rmcp::service::RunningService<rmcp::RoleClient, ()>,
    tool: &str,
    args: Value,
) -> CallToolResult {
    client
        .call_tool(
            CallToolRequestParams::new(tool.to_owned())
                .with_arguments(args.as_object().unwrap().clone()),
        )
        .await
        .unwrap_or_else(|e| panic!("{tool} call failed at the protocol level: {e}"))
}

fn text_of(res: &CallToolResult) -> String {
    res.content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A Traefik whose load balancer has two dead backends (endpoints held closed for as long as
/// the returned guards live).
pub async fn traefik_with_dead_backends() -> (Traefik, [DeadEndpoint; 2]) {
    let dead = [DeadEndpoint::bind(), DeadEndpoint::bind()];
    let traefik = Traefik::start(&two_backend_config(dead[0].port, dead[1].port)).await;
    (traefik, dead)
}

/// A tiny HTTP backend that answers 200 on every path.
async fn live_backend() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let app = axum::Router::new().fallback(|| async { "backend ok" });
    tokio::spawn(async move { axum::serve(listener, app).await });
    port
}

async fn traefik_ping_over_mcp_is_audited(backend: Backend, build: Build) {
    let (traefik, _dead) = traefik_with_dead_backends().await;
    let app = spawn_app(
        backend,
        vec![RunnerSpec::new("node-1").service("traefik", &traefik.api_url)],
        Options {
            build,
            ..Default::default()
        },
    )
    .await;
    let client = app.mcp_client().await;

    let tools = client.list_all_tools().await.unwrap();
    let ping = tools
        .iter()
        .find(|t| t.name == "traefik.ping")
        .expect("traefik.ping is listed");
    let schema = Value::Object((*ping.input_schema).clone());
    assert_eq!(schema["required"], json!(["reason"]));
    assert!(schema["properties"]["selector"]["pattern"].is_string());
    assert_eq!(
        schema["properties"]["runners"]["items"]["enum"],
        json!(["node-1"])
    );
    assert_eq!(schema["properties"]["runners"]["minItems"], json!(1));
    for name in ["traefik.overview", "traefik.services"] {
        assert!(tools.iter().any(|t| t.name == name), "{name} is listed");
    }

    let reason = "is the edge proxy on node-1 answering?";
    let res = call(
        &client,
        "traefik.ping",
        json!({"runners": ["node-1"], "reason": reason}),
    )
    .await;
    assert_eq!(res.is_error, Some(false), "{}", text_of(&res));
    let s = res.structured_content.clone().unwrap();
    assert_eq!(s["tool"], "traefik.ping");
    let r = &s["results"][0];
    assert_eq!(r["runner"], "node-1");
    assert_eq!(r["ok"], true, "{r}");
    // Traefik's real answer to /ping.
    assert_eq!(r["output"], json!({"http_status": 200, "body": "OK"}));

    let call_id = s["call_id"].as_str().unwrap();
    let events = app.events_of_call(call_id).await;
    assert_eq!(events.len(), 2, "{events:#?}");
    let (intent, outcome) = (&events[0], &events[1]);
    assert_eq!(intent.kind, "tool.called");
    assert_eq!(intent.actor, format!("agent:{TEST_AGENT}"));
    assert_eq!(intent.tool.as_deref(), Some("traefik.ping"));
    assert_eq!(intent.reason.as_deref(), Some(reason));
    assert_eq!(intent.args, Some(json!({})));
    assert_eq!(
        intent.detail.as_ref().unwrap()["runners"],
        json!(["node-1"])
    );
    assert!(
        intent.seq < outcome.seq,
        "intent is written before the outcome"
    );
    assert_eq!(outcome.kind, "call.executed");
    assert_eq!(outcome.runner.as_deref(), Some("node-1"));
    assert_eq!(outcome.actor, intent.actor);
    assert_eq!(outcome.reason.as_deref(), Some(reason));
    assert_eq!(outcome.outcome.as_deref(), Some("ok"));
    assert_eq!(
        outcome.result_digest.as_deref(),
        Some(emisar::digest::json_digest(&r["output"]).as_str())
    );
    app.assert_chain_intact().await;

    // The same check through the CLI an auditor would run.
    app.verify_with_cli();
    client.cancel().await.unwrap();
}
both_backends_every_build!(traefik_ping_over_mcp_is_audited);

async fn traefik_services_show_up_and_down(backend: Backend) {
    let live = live_backend().await;
    let dead = DeadEndpoint::bind();
    let traefik = Traefik::start(&two_backend_config(live, dead.port)).await;
    let app = spawn_app(
        backend,
        vec![RunnerSpec::new("edge-1").service("traefik", &traefik.api_url)],
        Options::default(),
    )
    .await;
    let client = app.mcp_client().await;
    let args = json!({"runners": ["edge-1"], "reason": "which backends are down?"});

    let overview = call(&client, "traefik.overview", args.clone()).await;
    assert_eq!(overview.is_error, Some(false), "{}", text_of(&overview));
    let o = &overview.structured_content.unwrap()["results"][0]["output"];
    assert!(o["http"]["services"]["total"].as_u64().unwrap() >= 1, "{o}");
    assert_eq!(o["providers"], json!(["File"]));

    // Traefik starts every server UP; its health check flips the dead one within a second.
    let deadline = Instant::now() + Duration::from_secs(20);
    let app_service = loop {
        let res = call(&client, "traefik.services", args.clone()).await;
        assert_eq!(res.is_error, Some(false), "{}", text_of(&res));
        let out = res.structured_content.unwrap()["results"][0]["output"].clone();
        let svc = out
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == "app@file")
            .cloned()
            .expect("app@file is listed");
        if svc["down"] == 1 || Instant::now() > deadline {
            break svc;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert_eq!(app_service["up"], 1, "{app_service}");
    assert_eq!(app_service["down"], 1, "{app_service}");
    let servers = app_service["servers"].as_array().unwrap();
    assert!(servers.contains(&json!({"url": format!("http://127.0.0.1:{live}"), "status": "UP"})));
    assert!(servers.iter().any(|s| s["status"] == "DOWN"));

    // The raw answer on request: Traefik's own objects, load balancer and all.
    let res = call(
        &client,
        "traefik.services",
        json!({"runners": ["edge-1"], "reason": "raw", "raw": true}),
    )
    .await;
    let raw = res.structured_content.unwrap()["results"][0]["output"].clone();
    assert_eq!(raw["status"], 200);
    let app_raw = raw["body"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "app@file")
        .unwrap()
        .clone();
    assert_eq!(app_raw["loadBalancer"]["healthCheck"]["path"], "/");

    // A search that matches nothing is still an answer: an empty list.
    let res = call(
        &client,
        "traefik.services",
        json!({"runners": ["edge-1"], "reason": "search", "search": "nothing-here"}),
    )
    .await;
    assert_eq!(
        res.structured_content.unwrap()["results"][0]["output"],
        json!([])
    );
    app.assert_chain_intact().await;
    client.cancel().await.unwrap();
}
both_backends!(traefik_services_show_up_and_down);

async fn a_dead_runner_fails_alone(backend: Backend) {
    let (traefik, _dead) = traefik_with_dead_backends().await;
    let dead = DeadEndpoint::bind();
    let dead_url = dead.url();
    let app = spawn_app(
        backend,
        vec![RunnerSpec::new("node-1").service("traefik", &traefik.api_url)],
        Options {
            extra_runners: vec![RunnerEntry {
                name: "node-2".into(),
                url: dead_url,
                tls_fingerprint: None,
                packs: None,
                labels: Default::default(),
            }],
            ..Default::default()
        },
    )
    .await;
    let client = app.mcp_client().await;
    let res = call(
        &client,
        "traefik.ping",
        json!({"runners": ["node-1", "node-2"], "reason": "ping both"}),
    )
    .await;
    assert_eq!(
        res.is_error,
        Some(false),
        "one runner answered, so the call is not an error"
    );
    let s = res.structured_content.unwrap();
    let results = s["results"].as_array().unwrap();
    assert_eq!(results.len(), 2);
    assert_eq!(results[0]["runner"], "node-1");
    assert_eq!(results[0]["ok"], true);
    assert_eq!(results[1]["runner"], "node-2");
    assert_eq!(results[1]["ok"], false);
    let err = results[1]["error"].as_str().unwrap();
    assert!(err.contains("runner unreachable"), "{err}");

    let events = app.events_of_call(s["call_id"].as_str().unwrap()).await;
    let kinds: Vec<(&str, Option<&str>)> = events
        .iter()
        .map(|e| (e.kind.as_str(), e.runner.as_deref()))
        .collect();
    assert!(
        kinds.contains(&("call.executed", Some("node-1"))),
        "{kinds:?}"
    );
    assert!(
        kinds.contains(&("call.failed", Some("node-2"))),
        "{kinds:?}"
    );
    let failed = events.iter().find(|e| e.kind == "call.failed").unwrap();
    assert!(
        failed.detail.as_ref().unwrap()["error"]
            .as_str()
            .unwrap()
            .contains("unreachable")
    );

    // Only the dead runner: every runner failed, so the result is an error.
    let res = call(
        &client,
        "traefik.ping",
        json!({"runners": ["node-2"], "reason": "ping the dead one"}),
    )
    .await;
    assert_eq!(res.is_error, Some(true));
    app.assert_chain_intact().await;
    client.cancel().await.unwrap();
}
both_backends!(a_dead_runner_fails_alone);

async fn a_service_that_is_down_is_a_clear_error(backend: Backend) {
    let closed = DeadEndpoint::bind();
    let app = spawn_app(
        backend,
        vec![RunnerSpec::new("node-1").service("traefik", &closed.url())],
        Options::default(),
    )
    .await;
    let client = app.mcp_client().await;
    let res = call(
        &client,
        "traefik.ping",
        json!({"runners": ["node-1"], "reason": "is it up?"}),
    )
    .await;
    assert_eq!(res.is_error, Some(true));
    let r = &res.structured_content.unwrap()["results"][0];
    let err = r["error"].as_str().unwrap();
    assert!(
        err.contains("traefik at http://127.0.0.1:")
            && err.to_lowercase().contains("connection refused"),
        "{err}"
    );
    client.cancel().await.unwrap();
}
both_backends!(a_service_that_is_down_is_a_clear_error);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_answers_are_cut_with_a_marker() {
    let (traefik, _dead) = traefik_with_dead_backends().await;
    let app = spawn_app(
        Backend::Sqlite,
        vec![
            RunnerSpec::new("node-1")
                .service("traefik", &traefik.api_url)
                .max_output(1024),
        ],
        Options::default(),
    )
    .await;
    let client = app.mcp_client().await;
    let res = call(
        &client,
        "traefik.routers",
        json!({"runners": ["node-1"], "reason": "all routers"}),
    )
    .await;
    assert_eq!(res.is_error, Some(false), "{}", text_of(&res));
    let r = &res.structured_content.unwrap()["results"][0];
    assert_eq!(r["truncated"], true, "{r}");
    let body = r["output"]["body"].as_str().unwrap();
    assert!(body.ends_with("[… answer truncated by emisar]"), "{body}");
    assert!(body.len() < 1100);
    client.cancel().await.unwrap();
}

async fn bad_input_is_refused_named_and_audited(backend: Backend) {
    let app = spawn_app(backend, vec![RunnerSpec::new("node-1")], Options::default()).await;
    let client = app.mcp_client().await;
    let cases = [
        (
            json!({"runners": ["node-1"]}),
            "\"reason\" is a required property",
        ),
        (json!({"runners": ["node-1"], "reason": ""}), "`reason`"),
        (json!({"runners": ["node-1"], "reason": "   "}), "`reason`"),
        (json!({"runners": [], "reason": "x"}), "`runners`"),
        (
            json!({"reason": "x"}),
            "`runners`: name at least one runner, or give a `selector`",
        ),
        (
            json!({"selector": "role=nope", "reason": "x"}),
            "`selector`: no runner serving pack `traefik` matches `role=nope`",
        ),
        (
            json!({"runners": ["node-1"], "selector": "role=edge", "reason": "x"}),
            "give `runners` or `selector`, not both",
        ),
        (
            json!({"runners": ["ghost"], "reason": "x"}),
            "`ghost` is not a runner this agent may use",
        ),
        (
            json!({"runners": ["node-1"], "reason": "x", "bogus": 1}),
            "bogus",
        ),
    ];
    for (args, expected) in &cases {
        let res = call(&client, "traefik.ping", args.clone()).await;
        assert_eq!(res.is_error, Some(true), "{args}");
        let text = text_of(&res);
        assert!(
            text.contains("invalid arguments for `traefik.ping`"),
            "{text}"
        );
        assert!(
            text.contains(expected),
            "{args}: expected {expected:?} in {text}"
        );
    }
    let res = call(
        &client,
        "traefik.services",
        json!({"runners": ["node-1"], "reason": "x", "search": "a/../b"}),
    )
    .await;
    assert!(text_of(&res).contains("`search`"), "{}", text_of(&res));

    let rejected = app
        .events(AuditFilter {
            kind: Some("tool.rejected".into()),
            ..Default::default()
        })
        .await;
    assert_eq!(rejected.len(), cases.len() + 1);
    assert!(
        rejected
            .iter()
            .all(|e| e.actor == format!("agent:{TEST_AGENT}"))
    );
    let called = app
        .events(AuditFilter {
            kind: Some("tool.called".into()),
            ..Default::default()
        })
        .await;
    assert!(called.is_empty(), "nothing was called: {called:#?}");

    let err = client
        .call_tool(CallToolRequestParams::new("nope.nothing").with_arguments(Default::default()))
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("unknown tool: nope.nothing"),
        "{err}"
    );
    app.assert_chain_intact().await;
    client.cancel().await.unwrap();
}
both_backends!(bad_input_is_refused_named_and_audited);

async fn exec_reads_run_and_writes_wait_for_approval(backend: Backend) {
    let app = spawn_app(
        backend,
        vec![RunnerSpec::new("node-1")],
        Options {
            packs_dir: Some(fixtures_dir()),
            approval_wait_secs: Some(1),
            ..Default::default()
        },
    )
    .await;
    let client = app.mcp_client().await;
    let res = call(
        &client,
        "testkit.echo",
        json!({"runners": ["node-1"], "reason": "exec path", "word": "hello"}),
    )
    .await;
    assert_eq!(res.is_error, Some(false), "{}", text_of(&res));
    assert_eq!(
        res.structured_content.unwrap()["results"][0]["output"],
        json!({"said": "hello"})
    );

    let marker = app.dir.path().join("written");
    let marker = marker.to_str().unwrap();
    let res = call(
        &client,
        "testkit.touch",
        json!({"runners": ["node-1"], "reason": "try a write", "path": marker}),
    )
    .await;
    // Nobody approves: after the wait the call returns the pending request, not an error.
    assert_eq!(res.is_error, Some(false), "{}", text_of(&res));
    let approval = res.structured_content.unwrap()["approval"].clone();
    assert_eq!(approval["state"], "pending", "{approval}");
    assert!(
        approval["message"]
            .as_str()
            .unwrap()
            .contains("emisar.approval_wait")
    );
    assert!(
        !std::path::Path::new(marker).exists(),
        "the write must not run"
    );
    let kinds: Vec<String> = app
        .events(AuditFilter {
            tool: Some("testkit.touch".into()),
            ..Default::default()
        })
        .await
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert_eq!(kinds, ["tool.called", "approval.requested"]);
    app.assert_chain_intact().await;
    client.cancel().await.unwrap();
}
both_backends!(exec_reads_run_and_writes_wait_for_approval);

/// The Unix time in milliseconds a UUIDv7 carries in its first 48 bits; fails unless `id`
/// is one. `what` names the id in the failure.
fn v7_millis(id: &str, what: &str) -> u64 {
    let uuid = uuid::Uuid::parse_str(id).unwrap_or_else(|e| panic!("{what} `{id}`: {e}"));
    assert_eq!(
        uuid.get_version_num(),
        7,
        "{what} `{id}` is not a UUIDv7 (version {})",
        uuid.get_version_num()
    );
    let (secs, nanos) = uuid.get_timestamp().unwrap().to_unix();
    secs * 1000 + u64::from(nanos) / 1_000_000
}

/// Call ids and event ids are UUIDv7, minted in the order things happen (the store's
/// unique indexes then grow at their right edge, and an id tells when): event ids ascend
/// along `seq` and each carries its event's `at`, call ids ascend call by call, and a call's
/// id is minted before its first event's.
async fn event_and_call_ids_are_uuidv7_in_time_order(backend: Backend) {
    let app = spawn_app(
        backend,
        vec![RunnerSpec::new("node-1")],
        Options {
            packs_dir: Some(fixtures_dir()),
            ..Default::default()
        },
    )
    .await;
    let client = app.mcp_client().await;
    let mut call_ids = Vec::new();
    for word in ["one", "two", "three"] {
        let res = call(
            &client,
            "testkit.echo",
            json!({"runners": ["node-1"], "reason": "ids in order", "word": word}),
        )
        .await;
        assert_eq!(res.is_error, Some(false), "{}", text_of(&res));
        let call_id = res.structured_content.unwrap()["call_id"]
            .as_str()
            .unwrap()
            .to_owned();
        v7_millis(&call_id, "call id");
        call_ids.push(call_id);
    }
    assert!(
        call_ids.windows(2).all(|w| w[0] < w[1]),
        "call ids out of call order: {call_ids:?}"
    );

    let events = app.events(AuditFilter::default()).await;
    assert!(events.len() >= 6, "{events:?}");
    for e in &events {
        let minted = v7_millis(&e.id, &format!("event {} ({})", e.seq, e.kind));
        let at = chrono::DateTime::parse_from_rfc3339(&e.at)
            .unwrap()
            .timestamp_millis() as u64;
        assert!(
            minted.abs_diff(at) < 1000,
            "event {} `{}` was minted at {minted} ms, its `at` says {} ({at} ms)",
            e.seq,
            e.id,
            e.at
        );
    }
    assert!(
        events.windows(2).all(|w| w[0].id < w[1].id),
        "event ids out of seq order: {:?}",
        events.iter().map(|e| (e.seq, &e.id)).collect::<Vec<_>>()
    );
    for call_id in &call_ids {
        let first = events
            .iter()
            .find(|e| e.call_id.as_deref() == Some(call_id.as_str()))
            .unwrap();
        assert_eq!(first.kind, "tool.called", "{first:?}");
        assert!(
            *call_id < first.id,
            "call `{call_id}` was minted after its `tool.called` event `{}`",
            first.id
        );
    }
    client.cancel().await.unwrap();
}
both_backends!(event_and_call_ids_are_uuidv7_in_time_order);

async fn requests_without_a_valid_token_get_401(backend: Backend) {
    let app = spawn_app(backend, vec![RunnerSpec::new("node-1")], Options::default()).await;
    let http = reqwest::Client::new();
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"});
    for auth in [None, Some("Bearer emt_not-a-real-token"), Some("Basic abc")] {
        let mut req = http
            .post(&app.mcp_url)
            .header("accept", "application/json, text/event-stream")
            .json(&body);
        if let Some(a) = auth {
            req = req.header("authorization", a);
        }
        let res = req.send().await.unwrap();
        assert_eq!(res.status(), 401, "{auth:?}");
    }
    // A revoked token stops working at once.
    let issued = emisar::server::tokens::issue(
        &app.db,
        &app.audit,
        "short-lived",
        emisar::server::principal::Role::Agent,
        Duration::from_secs(60),
        "test",
    )
    .await
    .unwrap();
    assert!(
        emisar::server::tokens::authenticate(&app.db, &issued.token)
            .await
            .unwrap()
            .is_some()
    );
    assert!(
        emisar::server::tokens::revoke(&app.db, &app.audit, &issued.id, "test")
            .await
            .unwrap()
    );
    assert!(
        emisar::server::tokens::authenticate(&app.db, &issued.token)
            .await
            .unwrap()
            .is_none()
    );
}
both_backends!(requests_without_a_valid_token_get_401);

/// A token revoked with `emisar token revoke` is refused on `/mcp` within the server's token
/// cache lifetime (plus generous slack for a loaded machine), and it opened `/mcp` right
/// before the revoke, from that same cache.
async fn a_revoked_token_is_refused_on_mcp_within_the_cache_lifetime(backend: Backend) {
    let app = spawn_app(backend, vec![RunnerSpec::new("node-1")], Options::default()).await;
    let issued = emisar::server::tokens::issue(
        &app.db,
        &app.audit,
        "soon-revoked",
        emisar::server::principal::Role::Agent,
        Duration::from_secs(3600),
        "test",
    )
    .await
    .unwrap();
    let http = reqwest::Client::new();
    let initialize = |token: String| {
        let req = http
            .post(&app.mcp_url)
            .header("accept", "application/json, text/event-stream")
            .bearer_auth(token)
            .json(
                &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "revocation-test", "version": "0"}}}),
            );
        async move { req.send().await.unwrap().status().as_u16() }
    };
    // It works, and is now in the server's cache.
    let client = crate::harness::tools::mcp_client(&app.mcp_url, &issued.token).await;
    let tools = client.list_all_tools().await.unwrap();
    assert!(
        tools.iter().any(|t| t.name == "emisar.runners"),
        "{tools:?}"
    );
    client.cancel().await.unwrap();
    assert_eq!(initialize(issued.token.clone()).await, 200);

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_emisar"))
        .args([
            "token",
            "revoke",
            &issued.id,
            "--database",
            &app.database_url,
        ])
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let revoked = Instant::now();
    // The promised 10 s (not `CACHE_TTL`, which a change would move with it), plus slack.
    let bound = Duration::from_secs(10 + 20);
    loop {
        let status = initialize(issued.token.clone()).await;
        if status == 401 {
            break;
        }
        assert!(
            revoked.elapsed() < bound,
            "the revoked token still opens /mcp ({status}) {:?} after `emisar token revoke` \
             (the token cache keeps a token for {:?})",
            revoked.elapsed(),
            emisar::server::tokens::CACHE_TTL
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    eprintln!(
        "revocation: refused {:?} after the revoke",
        revoked.elapsed()
    );
}
both_backends!(a_revoked_token_is_refused_on_mcp_within_the_cache_lifetime);

/// An expired `emt_` token is refused on `/mcp`: one that expired before it was ever used
/// (the store's check), and one that opened `/mcp` moments before it expired, refused as soon
/// as it has expired even though the server's token cache still holds it (well inside
/// [`CACHE_TTL`](emisar::server::tokens::CACHE_TTL)).
async fn an_expired_token_is_refused_on_mcp_even_from_the_cache(backend: Backend) {
    let app = spawn_app(backend, vec![RunnerSpec::new("node-1")], Options::default()).await;
    let http = reqwest::Client::new();
    let initialize = |token: String| {
        let req = http
            .post(&app.mcp_url)
            .header("accept", "application/json, text/event-stream")
            .bearer_auth(token)
            .json(
                &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "expiry-test", "version": "0"}}}),
            );
        async move { req.send().await.unwrap().status().as_u16() }
    };
    let issue = |name: &'static str, ttl: Duration| {
        emisar::server::tokens::issue(
            &app.db,
            &app.audit,
            name,
            emisar::server::principal::Role::Agent,
            ttl,
            "test",
        )
    };
    let stale = issue("already-expired", Duration::from_millis(1))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(initialize(stale.token.clone()).await, 401);

    let ttl = Duration::from_secs(3);
    let issued_at = Instant::now();
    let short = issue("soon-expired", ttl).await.unwrap();
    // It works, and is now in the server's cache.
    assert_eq!(initialize(short.token.clone()).await, 200);
    let expires = issued_at + ttl + Duration::from_millis(300);
    tokio::time::sleep(expires.saturating_duration_since(Instant::now())).await;
    let used_after = issued_at.elapsed();
    assert_eq!(
        initialize(short.token.clone()).await,
        401,
        "a token that expired {:?} ago still opens /mcp from the token cache",
        used_after.saturating_sub(ttl)
    );
    // The cache lifetime is far longer than the wait: the refusal did not come from the
    // cache entry aging out.
    assert!(
        used_after < emisar::server::tokens::CACHE_TTL,
        "{used_after:?}"
    );
}
both_backends!(an_expired_token_is_refused_on_mcp_even_from_the_cache);

/// Only the server opens MCP sessions: an id it never issued is answered 404 at the door
/// (emisar's JSON refusal, not rmcp's), every time it is presented, since presenting it does
/// not bind it; a session another token opened is just as unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_mcp_session_id_is_404_and_never_bound() {
    let app = spawn_app(
        Backend::Sqlite,
        vec![RunnerSpec::new("node-1")],
        Options::default(),
    )
    .await;
    let other = emisar::server::tokens::issue(
        &app.db,
        &app.audit,
        "other-agent",
        emisar::server::principal::Role::Agent,
        Duration::from_secs(3600),
        "test",
    )
    .await
    .unwrap();
    let http = reqwest::Client::new();
    let post = |token: &str, session: Option<&str>, body: Value| {
        let mut req = http
            .post(&app.mcp_url)
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-06-18")
            .bearer_auth(token)
            .json(&body);
        if let Some(s) = session {
            req = req.header("mcp-session-id", s);
        }
        async move {
            let res = req.send().await.unwrap();
            let status = res.status().as_u16();
            let session = res
                .headers()
                .get("mcp-session-id")
                .map(|v| v.to_str().unwrap().to_owned());
            (status, session, res.text().await.unwrap())
        }
    };
    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "session-test", "version": "0"}}});
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
    let (status, opened, _) = post(&app.token, None, initialize.clone()).await;
    assert_eq!(status, 200);
    let opened = opened.expect("initialize names the session it opened");

    let made_up = uuid::Uuid::new_v4().to_string();
    for (label, token, session) in [
        (
            "an id the server never issued",
            app.token.as_str(),
            made_up.as_str(),
        ),
        ("the same id again", app.token.as_str(), made_up.as_str()),
        (
            "another token's session",
            other.token.as_str(),
            opened.as_str(),
        ),
    ] {
        let (status, _, body) = post(token, Some(session), list.clone()).await;
        assert_eq!(status, 404, "{label}: {body}");
        let refusal: Value = serde_json::from_str(&body)
            .unwrap_or_else(|_| panic!("{label}: not refused at emisar's door: {body}"));
        assert_eq!(refusal["error"], "session not found", "{label}");
    }
    // The owner's session still works.
    let (status, _, body) = post(&app.token, Some(&opened), list).await;
    assert_eq!(status, 200, "{body}");
}

/// One POST of an MCP session opened by hand, read chunk by chunk as the bytes arrive: the
/// first chunk of the body, and the whole body once it ends.
struct Chunked {
    first: String,
    whole: String,
}

async fn post_chunked(
    http: &reqwest::Client,
    url: &str,
    token: &str,
    session: Option<&str>,
    body: String,
) -> (Option<String>, Chunked) {
    let mut req = http
        .post(url)
        .bearer_auth(token)
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json")
        .header("mcp-protocol-version", "2025-11-25")
        .body(body);
    if let Some(session) = session {
        req = req.header("mcp-session-id", session);
    }
    let mut res = req.send().await.unwrap();
    assert!(res.status().is_success(), "{}", res.status());
    let session = res
        .headers()
        .get("mcp-session-id")
        .map(|v| v.to_str().unwrap().to_owned());
    let first = res.chunk().await.unwrap().unwrap_or_default();
    let mut whole = first.to_vec();
    while let Some(more) = res.chunk().await.unwrap() {
        whole.extend_from_slice(&more);
    }
    let text = |b: &[u8]| String::from_utf8(b.to_vec()).unwrap();
    (
        session,
        Chunked {
            first: text(&first),
            whole: text(&whole),
        },
    )
}

/// An SSE answer that is ready at once goes out in one piece with the priming event before it
/// (`http/mcp.rs`, `coalesce_sse`): the client's first read holds the answer. One that waits
/// for people still gets its priming event at once, alone, and its answer when it comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quick_answer_comes_with_its_priming_event_and_a_slow_one_after_it() {
    let app = spawn_app(
        Backend::Sqlite,
        vec![RunnerSpec::new("node-1")],
        Options {
            packs_dir: Some(fixtures_dir()),
            approval_wait_secs: Some(2),
            ..Default::default()
        },
    )
    .await;
    let http = reqwest::Client::new();
    let (url, token) = (app.mcp_url.as_str(), app.token.as_str());
    let init = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#;
    let (session, _) = post_chunked(&http, url, token, None, init.into()).await;
    let session = session.expect("the server opens a session");
    let initialized = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
    http.post(url)
        .bearer_auth(token)
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json")
        .header("mcp-protocol-version", "2025-11-25")
        .header("mcp-session-id", &session)
        .body(initialized)
        .send()
        .await
        .unwrap();

    // `tools/list` answers at once. A busy machine may hold any answer past the hold, so the
    // share that comes in one piece is a measure, not a rule: one of ten in one piece shows
    // the coalescing works (none would, without it), and the priming event is first in each.
    let mut whole = 0;
    for id in 1..=10 {
        let list = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/list"}}"#);
        let (_, answer) = post_chunked(&http, url, token, Some(&session), list).await;
        assert!(answer.whole.contains(r#""tools":"#), "{}", answer.whole);
        let priming = answer
            .first
            .find("data: \n")
            .or(answer.first.find("data:\n"));
        let result = answer.first.find(r#""result""#);
        if let (Some(p), Some(r)) = (priming, result) {
            assert!(p < r, "the priming event comes first: {}", answer.first);
            whole += 1;
        }
    }
    assert!(
        whole >= 1,
        "none of 10 quick answers came with its priming event in the first read"
    );

    // A write waits for approval (2 s here): the priming event comes at once, alone.
    let touch = json!({"jsonrpc": "2.0", "id": 11, "method": "tools/call", "params": {
        "name": "testkit.touch",
        "arguments": {"runners": ["node-1"], "reason": "wait", "path": app.dir.path().join("w").to_str().unwrap()}}});
    let (_, answer) = post_chunked(&http, url, token, Some(&session), touch.to_string()).await;
    // The stream opened while the call still waited: its first read came before the answer
    // (by order, not by a clock).
    assert!(
        !answer.first.contains(r#""result""#) && answer.whole.contains(r#""result""#),
        "the first read holds no answer yet, the stream ends with it: {} / {}",
        answer.first,
        answer.whole
    );
    assert!(
        answer.whole.contains(r#""pending""#),
        "the answer follows on the same stream: {}",
        answer.whole
    );
}
