//! TLS everywhere it matters: the server serves HTTPS, runners serve HTTPS and the server
//! verifies each one (its pinned certificate, or the runner CA), real MCP clients (rmcp and
//! the Python SDK) call over https, a runner that joins sends its certificate's fingerprint
//! and is pinned to it; plain HTTP only where the config says `insecure_http = true`.
//! Every certificate is made at test time (harness/certs.rs).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use emisar::server::audit::AuditFilter;
use emisar::server::fleet::JoinTokenSpec;
use emisar::server::principal::Role;
use serde_json::{Value, json};

use crate::both_backends;
use crate::harness::app::{Options, TestApp};
use crate::harness::certs::{TestCa, self_signed};
use crate::harness::tools::{DeadEndpoint, Proc, only_output};
use crate::harness::{Backend, RunnerSpec, spawn_app};
use crate::mcp_calls::{call, fixtures_dir, traefik_with_dead_backends};

const PING: &str = "traefik.ping";

fn traefik_ok() -> Value {
    json!({"http_status": 200, "body": "OK"})
}

/// Runs `command` to its exit. A command that should refuse to start but does not would run
/// forever; it is killed after a generous bound and the test fails saying so.
async fn refused(mut command: tokio::process::Command) -> (Option<i32>, String) {
    command.stdin(Stdio::null()).kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(60), command.output())
        .await
        .expect("the command was expected to refuse and exit, but it kept running")
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The fingerprint column of a joined runner, read straight from the store.
async fn stored_fingerprint(app: &TestApp, runner: &str) -> Option<String> {
    let sql = app
        .db
        .sql("SELECT tls_fingerprint FROM runners WHERE name = $1");
    let row: Option<(Option<String>,)> = emisar::with_pool!(&app.db, pool => {
        sqlx::query_as(sql).bind(runner).fetch_optional(pool).await.unwrap()
    });
    row.and_then(|(f,)| f)
}

async fn the_whole_stack_runs_over_tls(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // One CA for the server (the clients trust it), another for runners (the server trusts
    // it through runner_ca_file), and a self-signed runner the server pins.
    let server_ca = TestCa::new(d, "server");
    let runner_ca = TestCa::new(d, "runners");
    let server_cert = server_ca.issue(d, "server", &["localhost", "127.0.0.1"]);
    let pinned = self_signed(d, "node-pin");
    let by_ca = runner_ca.issue(d, "node-ca", &["127.0.0.1"]);
    let (traefik, _dead) = traefik_with_dead_backends().await;
    let app = spawn_app(
        backend,
        vec![
            RunnerSpec::new("node-pin")
                .service("traefik", &traefik.api_url)
                .https(pinned.clone(), Some(pinned.fingerprint.to_string())),
            RunnerSpec::new("node-ca")
                .service("traefik", &traefik.api_url)
                .https(by_ca, None),
        ],
        Options {
            server_tls: Some(server_cert),
            client_ca_file: Some(server_ca.file.clone()),
            runner_ca_file: Some(runner_ca.file.clone()),
            insecure_http: Some(false),
            ..Default::default()
        },
    )
    .await;
    assert!(
        app.mcp_url.starts_with("https://127.0.0.1:"),
        "{}",
        app.mcp_url
    );
    assert!(app.runner_urls.values().all(|u| u.starts_with("https://")));

    // rmcp over https, to both runners: one pinned, one verified by the runner CA.
    let client = app.mcp_client().await;
    let res = call(
        &client,
        PING,
        json!({"runners": ["node-pin", "node-ca"], "reason": "edge check over TLS"}),
    )
    .await;
    let s = res.structured_content.clone().unwrap();
    for (i, runner) in ["node-pin", "node-ca"].iter().enumerate() {
        let r = &s["results"][i];
        assert_eq!(r["runner"], *runner, "{s}");
        assert_eq!(r["ok"], true, "{s}");
        assert_eq!(r["output"], traefik_ok(), "{s}");
    }

    // The Python SDK over https, trusting the test CA through SSL_CERT_FILE.
    let v = crate::python_client::python_call(
        &app,
        PING,
        &json!({"runners": ["node-pin"], "reason": "python over TLS"}),
    )
    .await;
    assert_eq!(v["is_error"], false, "{v}");
    assert_eq!(
        v["structured_content"]["results"][0]["output"],
        traefik_ok()
    );

    // A runner that joins over https (the emisar-runner binary, its self-signed certificate
    // made in its state_dir) sends its fingerprint; the server stores it and pins it.
    let (_, join_token) = app
        .join_token(JoinTokenSpec {
            packs: ["traefik".to_owned()].into(),
            ..JoinTokenSpec::once(Duration::from_secs(600))
        })
        .await;
    let runner_toml = d.join("node-join.toml");
    std::fs::write(
        &runner_toml,
        format!(
            "name = \"node-join\"\nlisten = \"127.0.0.1:0\"\nstate_dir = \"{}\"\nserver_ca_file = \"{}\"\n[services.traefik]\nbase_url = \"{}\"\n",
            d.join("node-join-state").display(),
            server_ca.file.display(),
            traefik.api_url,
        ),
    )
    .unwrap();
    let printed = Command::new(env!("CARGO_BIN_EXE_emisar-runner"))
        .args(["fingerprint", "--config", runner_toml.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(printed.status.success(), "{printed:?}");
    let fingerprint = String::from_utf8(printed.stdout).unwrap().trim().to_owned();
    assert!(fingerprint.starts_with("sha256:"), "{fingerprint}");
    let same = Command::new(env!("CARGO_BIN_EXE_emisar"))
        .args([
            "runner",
            "fingerprint",
            "--config",
            runner_toml.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&same.stdout).trim(), fingerprint);
    let log = d.join("node-join.log");
    let _joined = Proc(
        Command::new(env!("CARGO_BIN_EXE_emisar-runner"))
            .args([
                "--config",
                runner_toml.to_str().unwrap(),
                "--server",
                &app.base_url(),
            ])
            .env("EMISAR_JOIN_TOKEN", &join_token)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while stored_fingerprint(&app, "node-join").await.is_none() {
        assert!(
            Instant::now() < deadline,
            "node-join did not join: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        stored_fingerprint(&app, "node-join").await.as_deref(),
        Some(fingerprint.as_str())
    );
    let res = call(
        &client,
        PING,
        json!({"runners": ["node-join"], "reason": "the joined runner, over TLS"}),
    )
    .await;
    assert_eq!(only_output(&res), traefik_ok());
    let joined = app
        .events(AuditFilter {
            kind: Some("runner.joined".into()),
            ..Default::default()
        })
        .await;
    assert_eq!(
        joined[0].detail.as_ref().unwrap()["tls_fingerprint"],
        json!(fingerprint)
    );
    client.cancel().await.unwrap();

    // The portal's cookie is Secure: the server serves TLS (public_url is not even set).
    let password = crate::approvals::add_user(&app, "alice", Role::Approver).await;
    let login = app
        .http()
        .post(format!("{}/api/login", app.base_url()))
        .json(&json!({"name": "alice", "password": password}))
        .send()
        .await
        .unwrap();
    assert_eq!(login.status(), 200);
    let cookie = login.headers()["set-cookie"].to_str().unwrap().to_owned();
    assert!(cookie.split(';').any(|a| a.trim() == "Secure"), "{cookie}");

    app.assert_chain_intact().await;
    app.verify_with_cli();
}
both_backends!(the_whole_stack_runs_over_tls);

async fn a_runner_with_another_certificate_gets_no_call(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let served = self_signed(dir.path(), "served");
    let expected = self_signed(dir.path(), "expected");
    let app = spawn_app(
        backend,
        vec![
            RunnerSpec::new("node-1").https(served.clone(), Some(expected.fingerprint.to_string())),
        ],
        Options {
            packs_dir: Some(fixtures_dir()),
            insecure_http: Some(false),
            ..Default::default()
        },
    )
    .await;
    // testkit.mark creates a file: the trace the action would leave had it run.
    let marker = dir.path().join("ran");
    let client = app.mcp_client().await;
    let res = call(
        &client,
        "testkit.mark",
        json!({"runners": ["node-1"], "reason": "is this node who it says?", "path": marker}),
    )
    .await;
    client.cancel().await.unwrap();
    assert_eq!(res.is_error, Some(true), "{res:?}");
    let s = res.structured_content.unwrap();
    let r = &s["results"][0];
    assert_eq!(r["ok"], false, "{s}");
    // The agent reads that the runner is not trusted; which certificate the far end
    // presented is for operators (the log, the audit's `error_detail`).
    assert_eq!(r["error_kind"], "runner_untrusted", "{s}");
    let error = r["error"].as_str().unwrap();
    assert!(error.starts_with("runner not trusted"), "{error}");
    assert!(
        !error.contains(&served.fingerprint.to_string()),
        "the agent read the served certificate: {error}"
    );
    assert!(
        !marker.exists(),
        "the action ran on a runner that failed its pin"
    );

    let events = app.events_of_call(s["call_id"].as_str().unwrap()).await;
    let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, ["tool.called", "call.failed"]);
    let audited = events[1].detail.as_ref().unwrap()["error_detail"]
        .as_str()
        .unwrap();
    for part in [
        "runner `node-1`".to_owned(),
        served.fingerprint.to_string(),
        expected.fingerprint.to_string(),
        "tls_fingerprint".to_owned(),
    ] {
        assert!(audited.contains(&part), "`{part}` missing from: {audited}");
    }
    assert_eq!(events[1].runner.as_deref(), Some("node-1"));
    app.assert_chain_intact().await;
}
both_backends!(a_runner_with_another_certificate_gets_no_call);

async fn plain_http_is_refused_unless_the_config_says_so(backend: Backend) {
    // 1. An http:// runner in emisar.toml: `emisar serve` refuses to start, naming the setting.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let app = spawn_app(
        backend,
        vec![],
        Options {
            insecure_http: Some(false),
            ..Default::default()
        },
    )
    .await;
    let dead = DeadEndpoint::bind();
    let runner_url = dead.url();
    let config = d.join("emisar.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:0\"\ndatabase_url = \"{}\"\nsigning_key_file = \"{}\"\n[[runners]]\nname = \"node-1\"\nurl = \"{runner_url}\"\n",
            app.database_url,
            app.private_key.display()
        ),
    )
    .unwrap();
    let mut serve = tokio::process::Command::new(env!("CARGO_BIN_EXE_emisar"));
    serve.args(["serve", "--config", config.to_str().unwrap()]);
    let (code, err) = refused(serve).await;
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains(&format!("runners[0].url `{runner_url}` is plain HTTP"))
            && err.contains("insecure_http = true"),
        "{err}"
    );

    // 2. A join request with an http:// URL: 400, naming the setting; nothing registered.
    let (_, join_token) = app
        .join_token(JoinTokenSpec::once(Duration::from_secs(600)))
        .await;
    let (status, body) = app
        .raw_join(
            &join_token,
            &json!({"name": "sneaky", "url": runner_url, "packs": {}}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    let message = body["error"].as_str().unwrap();
    assert!(
        message.contains("is plain HTTP") && message.contains("insecure_http = true"),
        "{message}"
    );

    // 3. A runner asked to join an http:// server refuses before sending its token.
    let runner_toml = d.join("runner.toml");
    std::fs::write(
        &runner_toml,
        format!(
            "name = \"node-2\"\nlisten = \"127.0.0.1:0\"\nstate_dir = \"{}\"\n",
            d.join("state").display()
        ),
    )
    .unwrap();
    let mut runner = tokio::process::Command::new(env!("CARGO_BIN_EXE_emisar-runner"));
    runner
        .args([
            "--config",
            runner_toml.to_str().unwrap(),
            "--server",
            &app.base_url(),
        ])
        .env("EMISAR_JOIN_TOKEN", &join_token);
    let (code, err) = refused(runner).await;
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains(&format!("join.server `{}` is plain HTTP", app.base_url()))
            && err.contains("insecure_http = true"),
        "{err}"
    );
    assert!(
        !d.join("state").exists(),
        "the runner stopped before making anything"
    );
    assert_eq!(
        app.runners_api().await["runners"],
        json!([]),
        "no runner was registered"
    );
    let joins = app
        .events(AuditFilter {
            kind: Some("runner.joined".into()),
            ..Default::default()
        })
        .await;
    assert!(joins.is_empty(), "{joins:?}");
}
both_backends!(plain_http_is_refused_unless_the_config_says_so);
