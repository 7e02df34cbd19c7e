//! The door: what comes from outside is checked before it is stored, logged, hashed or used
//! as a metric label. Bad text at login is a 400 that names the field (never the store's
//! 503) while everyone else carries on; login attempts are limited per address, per server
//! and per name; a tool name that is not an identifier is refused without being repeated,
//! after the rate limit; a secret param's validation error is audited sealed.

use std::time::{Duration, Instant};

use emisar::server::audit::AuditFilter;
use emisar::server::login_limits::LoginLimitsConfig;
use emisar::server::tokens::Role;
use rmcp::model::CallToolRequestParams;
use serde_json::{Value, json};

use crate::approvals::add_user;
use crate::harness::app::{Options, TestApp};
use crate::harness::{Backend, RunnerSpec, spawn_app};
use crate::mcp_calls::call;

/// `POST /api/login` with `body`; the status and the JSON answer.
async fn login(app: &TestApp, body: &Value, forwarded_for: Option<&str>) -> (u16, Value) {
    let mut req = reqwest::Client::new()
        .post(format!("{}/api/login", app.base_url()))
        .json(body);
    if let Some(ip) = forwarded_for {
        req = req.header("x-forwarded-for", ip);
    }
    let res = req.send().await.unwrap();
    (res.status().as_u16(), res.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_text_at_login_is_a_400_naming_the_field_while_others_carry_on() {
    let app = spawn_app(
        Backend::Postgres,
        vec![RunnerSpec::new("node-1")],
        Options::default(),
    )
    .await;
    let password = add_user(&app, "alice", Role::Approver).await;
    let two_mb = "n".repeat(2_000_000);
    let bad: Vec<(Value, &str)> = vec![
        (
            json!({"name": "ali\u{0}ce", "password": "whatever-it-is"}),
            "`name`",
        ),
        (
            json!({"name": two_mb, "password": "whatever-it-is"}),
            "`name`",
        ),
        (
            json!({"name": "alice\r\nSet-Cookie: x", "password": "x"}),
            "`name`",
        ),
        (json!({"name": "\u{202e}ecila", "password": "x"}), "`name`"),
        (
            json!({"name": "alice", "password": "p".repeat(2_000_000)}),
            "`password`",
        ),
        (
            json!({"name": "alice", "password": "pass\u{0}word"}),
            "`password`",
        ),
        (json!({"name": 5, "password": "x"}), "invalid login"),
        (json!({"name": "alice"}), "invalid login"),
        (
            json!({"name": "alice", "password": "x", "admin": true}),
            "invalid login",
        ),
    ];

    // Every bad login, the good login and MCP calls, all at the same moment.
    let client = app.mcp_client().await;
    let bad_logins = futures::future::join_all(bad.iter().map(|(body, _)| login(&app, body, None)));
    let good_body = json!({"name": "alice", "password": password});
    let good_login = login(&app, &good_body, None);
    let calls = futures::future::join_all((0..8).map(|i| {
        call(
            &client,
            "linux.uptime",
            json!({"runners": ["node-1"], "reason": format!("uptime {i} during a login flood")}),
        )
    }));
    let (bad_answers, good, calls) = tokio::join!(bad_logins, good_login, calls);

    for ((status, answer), (body, field)) in bad_answers.iter().zip(&bad) {
        let text = answer["error"].as_str().unwrap_or_default();
        assert!(
            (400..500).contains(status) && text.contains(field),
            "{status} {answer} for {:.80}",
            body.to_string()
        );
        assert!(!text.contains("nnnnnnnnnn") && !text.contains('\0') && text.len() < 600);
    }
    assert_eq!(good.0, 200, "{}", good.1);
    assert_eq!(good.1["user"], "alice");
    for res in &calls {
        assert_eq!(res.is_error, Some(false), "{:?}", res.content);
    }
    // Nothing malformed reached the store: the only login event is alice's.
    let logins = app
        .events(AuditFilter {
            kind: Some("login.failed".into()),
            ..Default::default()
        })
        .await;
    assert!(logins.is_empty(), "{logins:#?}");
    client.cancel().await.unwrap();
    app.assert_chain_intact().await;
    app.verify_with_cli();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn login_attempts_are_limited_per_address_per_name_and_per_server() {
    // One attempt a minute per address and per name, three for the server: no bucket refills
    // (one attempt takes a minute, or twenty seconds for the server) while the test runs.
    let app = spawn_app(
        Backend::Sqlite,
        vec![],
        Options {
            login: Some(LoginLimitsConfig {
                per_address_per_minute: 1,
                per_name_per_minute: 1,
                global_per_minute: 3,
                trusted_proxies: vec!["127.0.0.1".parse().unwrap()],
            }),
            ..Default::default()
        },
    )
    .await;
    let wrong = |name: &str| json!({"name": name, "password": "not-the-password"});
    // One try from an address, then that address waits (another name does not help).
    assert_eq!(login(&app, &wrong("a1"), Some("203.0.113.1")).await.0, 401);
    let (status, answer) = login(&app, &wrong("a2"), Some("203.0.113.1")).await;
    assert_eq!(status, 429, "{answer}");
    assert!(
        answer["error"]
            .as_str()
            .unwrap()
            .contains("from this address")
    );
    // One try for a name, then that name waits, whatever address asks.
    assert_eq!(login(&app, &wrong("bob"), Some("203.0.113.2")).await.0, 401);
    let (status, answer) = login(&app, &wrong("bob"), Some("203.0.113.3")).await;
    assert_eq!(status, 429, "{answer}");
    assert!(answer["error"].as_str().unwrap().contains("for this user"));
    // Those three drew on the server's three: now the whole server waits.
    let (status, answer) = login(&app, &wrong("carol"), Some("203.0.113.4")).await;
    assert_eq!(status, 429, "{answer}");
    assert!(answer["error"].as_str().unwrap().contains("on this server"));
    // The proxy's own word is believed only for what it forwards: without the header the
    // client is the proxy (127.0.0.1), a fresh address, refused by the server's limit.
    let (status, _) = login(&app, &wrong("dave"), None).await;
    assert_eq!(status, 429);
    // A malformed name is refused before any limit: it neither counts nor is counted.
    let (status, answer) = login(&app, &wrong("bad\u{0}name"), Some("203.0.113.1")).await;
    assert_eq!(status, 400, "{answer}");
    assert!(answer["error"].as_str().unwrap().contains("`name`"));
}

/// The lines of `/metrics` that mention any of `needles`.
async fn metric_lines(app: &TestApp, needles: &[&str]) -> Vec<String> {
    let text = crate::edges::scrape_metrics(app).await;
    text.lines()
        .filter(|l| needles.iter().any(|n| l.contains(n)))
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_tool_names_are_refused_unrepeated_rate_limited_and_never_labels() {
    let app = spawn_app(
        Backend::Postgres,
        vec![RunnerSpec::new("node-1")],
        Options {
            rate_limit: Some((1, 6)),
            ..Default::default()
        },
    )
    .await;
    let client = app.mcp_client().await;
    let started = Instant::now();
    let megabyte = "m".repeat(1 << 20);
    let hostile = [
        "door-test\u{0}tool",
        "../../door-test",
        "door-test\r\nX-Injected: 1",
        "door-test\u{202e}lmth.exe",
        "",
        megabyte.as_str(),
    ];
    for name in hostile {
        let err = client
            .call_tool(
                CallToolRequestParams::new(name.to_owned()).with_arguments(Default::default()),
            )
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("a name that is not an identifier"),
            "{:.200}",
            err
        );
        assert!(
            err.len() < 500,
            "the name is not repeated: {} bytes",
            err.len()
        );
        if !name.is_empty() {
            assert!(!err.contains(name));
        }
    }
    let rejected = app
        .events(AuditFilter {
            kind: Some("tool.rejected".into()),
            ..Default::default()
        })
        .await;
    assert_eq!(rejected.len(), hostile.len(), "{rejected:#?}");
    for (event, name) in rejected.iter().zip(hostile) {
        assert_eq!(event.tool, None);
        let detail = event.detail.as_ref().unwrap();
        assert_eq!(detail["tool_name"]["bytes"], name.len(), "{detail}");
        assert_eq!(
            detail["tool_name"]["sha256"],
            emisar::digest::sha256_hex(name.as_bytes())
        );
        assert!(detail["tool_name"]["preview"].as_str().unwrap().len() < 200);
        assert!(
            detail["error"]
                .as_str()
                .unwrap()
                .contains("must be an identifier")
        );
    }

    // A flood of unknown names: past the burst the rate limit answers, so the audit log
    // records at most the burst plus one a second of "unknown tool" refusals.
    let flood = futures::future::join_all((0..40).map(|i| {
        client.call_tool(
            CallToolRequestParams::new(format!("door-test.unknown{i}"))
                .with_arguments(Default::default()),
        )
    }))
    .await;
    let elapsed = started.elapsed().as_secs() + 1;
    let limited = flood
        .iter()
        .filter(|r| {
            r.as_ref()
                .is_ok_and(|res| format!("{:?}", res.content).contains("rate limited"))
        })
        .count();
    assert!(limited > 0, "the flood met the rate limit: {flood:?}");
    let unknown = app
        .events(AuditFilter {
            kind: Some("tool.rejected".into()),
            ..Default::default()
        })
        .await
        .into_iter()
        .filter(|e| {
            e.detail.as_ref().unwrap()["error"]
                .as_str()
                .unwrap()
                .contains("unknown tool")
        })
        .count();
    assert!(
        unknown as u64 <= 6 + elapsed,
        "{unknown} unknown-tool refusals audited in {elapsed} s with a burst of 6"
    );

    // Metric labels: a fixed `unknown`, never the names that came in.
    let lines = metric_lines(&app, &["door-test", "X-Injected"]).await;
    assert!(lines.is_empty(), "{lines:#?}");
    let lines = metric_lines(&app, &["tool=\"unknown\""]).await;
    assert!(
        lines
            .iter()
            .any(|l| l.contains("emisar_tool_calls_total") && l.contains("refused")),
        "{lines:#?}"
    );
    // The server is fine afterwards.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let res = call(
        &client,
        "linux.uptime",
        json!({"runners": ["node-1"], "reason": "still serving after the flood"}),
    )
    .await;
    assert_eq!(res.is_error, Some(false), "{:?}", res.content);
    client.cancel().await.unwrap();
    app.assert_chain_intact().await;
    app.verify_with_cli();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_params_validation_error_is_audited_sealed() {
    let packs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it/fixtures_secret");
    let app = spawn_app(
        Backend::Postgres,
        // The service is never reached: every call here is refused.
        vec![RunnerSpec::new("node-1").service("vault", "http://127.0.0.1:9")],
        Options {
            packs_dir: Some(packs),
            ..Default::default()
        },
    )
    .await;
    let key =
        emisar::server::secrets::AuditKey::from_file(&app.dir.path().join("audit.key")).unwrap();
    let client = app.mcp_client().await;
    // Each breaks the param's pattern, so the schema's error would quote it.
    let secrets = [
        "S3cret-with-a-newline\n".to_owned(),
        format!("S3cret-far-too-long-{}", "x".repeat(200)),
        "S3cret-with-a-bell\u{7}".to_owned(),
    ];
    for secret in &secrets {
        let res = call(
            &client,
            "vault.login",
            json!({"runners": ["node-1"], "reason": "log in", "user": "ops", "password": secret}),
        )
        .await;
        assert_eq!(res.is_error, Some(true));
        let answer = serde_json::to_string(&res).unwrap();
        assert!(
            answer.contains("`password`: the value (secret)"),
            "{answer}"
        );
        assert!(!answer.contains("S3cret"), "{answer}");
    }
    let rejected = app
        .events(AuditFilter {
            kind: Some("tool.rejected".into()),
            tool: Some("vault.login".into()),
            ..Default::default()
        })
        .await;
    assert_eq!(rejected.len(), secrets.len());
    for (event, secret) in rejected.iter().zip(&secrets) {
        let args = event.args.as_ref().unwrap();
        assert_eq!(args["password"], key.seal(secret), "{args}");
        let whole = serde_json::to_string(event).unwrap();
        assert!(!whole.contains("S3cret"), "{whole}");
        let error = event.detail.as_ref().unwrap()["error"].as_str().unwrap();
        assert!(
            error.contains("`password`: the value (secret) does not match"),
            "{error}"
        );
    }
    client.cancel().await.unwrap();
    app.verify_with_cli();
}
