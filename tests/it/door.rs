//! The door: what comes from outside is checked before it is stored, logged, hashed or used
//! as a metric label. Bad text at login is a 400 that names the field (never the store's
//! 503) while everyone else carries on; login attempts are refused per address and per name
//! and address, and only paced per name and for the server, so wrong passwords from one
//! address never lock the person out from another; a tool name that is not an identifier is
//! refused without being repeated, after the rate limit; a secret param's validation error
//! is audited sealed.

use std::time::{Duration, Instant};

use emisar::server::audit::AuditFilter;
use emisar::server::login_limits::LoginLimitsConfig;
use emisar::server::principal::Role;
use rmcp::model::CallToolRequestParams;
use serde_json::{Value, json};

use crate::approvals::add_user;
use crate::both_backends;
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

/// A login as [`login`], with how long the server says it paced the attempt (its
/// `Server-Timing: pace;dur=MS`), `None` when it did not: the server's own measure, which a
/// busy machine's slow password hashing does not blur.
async fn login_paced(
    app: &TestApp,
    body: &Value,
    forwarded_for: Option<&str>,
) -> (u16, Value, Option<u64>) {
    let mut req = reqwest::Client::new()
        .post(format!("{}/api/login", app.base_url()))
        .json(body);
    if let Some(ip) = forwarded_for {
        req = req.header("x-forwarded-for", ip);
    }
    let res = req.send().await.unwrap();
    let paced = res
        .headers()
        .get("server-timing")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("pace;dur="))
        .and_then(|v| v.split(';').next())
        .map(|ms| ms.parse().expect("a pace in milliseconds"));
    (res.status().as_u16(), res.json().await.unwrap(), paced)
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

/// The server of the login-limit tests: behind a proxy (the test's loopback address), so that
/// `X-Forwarded-For` names each attempt's client address.
async fn behind_a_proxy(backend: Backend, limits: LoginLimitsConfig) -> TestApp {
    spawn_app(
        backend,
        vec![],
        Options {
            login: Some(LoginLimitsConfig {
                trusted_proxies: vec!["127.0.0.1".parse().unwrap()],
                ..limits
            }),
            ..Default::default()
        },
    )
    .await
}

/// The lockout of issue 24: eleven wrong passwords for `dev-approver` from one address, with
/// the default limits. That address is then refused, even with the right password; from
/// another address the right password signs in at once (not after a wait).
async fn wrong_passwords_from_one_address_do_not_lock_the_person_out(backend: Backend) {
    let app = behind_a_proxy(backend, LoginLimitsConfig::default()).await;
    let password = add_user(&app, "dev-approver", Role::Approver).await;
    let wrong = json!({"name": "dev-approver", "password": "not-the-password"});
    let right = json!({"name": "dev-approver", "password": password});
    let attacker = "203.0.113.66";
    for i in 1..=10 {
        let (status, answer) = login(&app, &wrong, Some(attacker)).await;
        assert_eq!(status, 401, "wrong password {i}: {answer}");
        assert_eq!(answer["code"], "unauthenticated", "{answer}");
    }
    let (status, answer) = login(&app, &wrong, Some(attacker)).await;
    assert_eq!(status, 429, "wrong password 11: {answer}");
    assert_eq!(answer["code"], "rate_limited", "{answer}");
    assert!(
        answer["error"]
            .as_str()
            .unwrap()
            .contains("for this user from this address"),
        "{answer}"
    );
    let (status, answer, paced) = login_paced(&app, &right, Some("198.51.100.7")).await;
    assert_eq!(
        status, 200,
        "the right password from a clean address: {answer}"
    );
    assert_eq!(answer["user"], "dev-approver");
    assert_eq!(
        paced, None,
        "the right password from a clean address waited for a turn"
    );
    // The attacking address itself stays refused, right password or not.
    let (status, answer) = login(&app, &right, Some(attacker)).await;
    assert_eq!(status, 429, "{answer}");
}
both_backends!(wrong_passwords_from_one_address_do_not_lock_the_person_out);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn login_attempts_are_refused_per_address_and_paced_per_name_and_server() {
    // Three attempts a minute per address (refused ones count too), one per name and
    // address: no bucket refills while the test runs.
    let app = behind_a_proxy(
        Backend::Sqlite,
        LoginLimitsConfig {
            per_address_per_minute: 3,
            per_name_and_address_per_minute: 1,
            per_name_per_minute: 1000,
            global_per_minute: 1000,
            trusted_proxies: vec![],
        },
    )
    .await;
    let wrong = |name: &str| json!({"name": name, "password": "not-the-password"});
    // One try for a name from an address, then that pair is refused; another name from the
    // same address is its third and last try (the refused one counted too).
    assert_eq!(login(&app, &wrong("a1"), Some("203.0.113.1")).await.0, 401);
    let (status, answer) = login(&app, &wrong("a1"), Some("203.0.113.1")).await;
    assert_eq!(status, 429, "{answer}");
    assert!(
        answer["error"]
            .as_str()
            .unwrap()
            .contains("for this user from this address")
    );
    assert_eq!(login(&app, &wrong("a2"), Some("203.0.113.1")).await.0, 401);
    let (status, answer) = login(&app, &wrong("a3"), Some("203.0.113.1")).await;
    assert_eq!(status, 429, "{answer}");
    assert!(
        answer["error"]
            .as_str()
            .unwrap()
            .contains("from this address")
    );
    // The same name from another address is not refused.
    assert_eq!(login(&app, &wrong("a1"), Some("203.0.113.2")).await.0, 401);
    // The proxy's own word is believed only for what it forwards: without the header the
    // client is the proxy (127.0.0.1), a fresh address.
    assert_eq!(login(&app, &wrong("a1"), None).await.0, 401);
    // A malformed name is refused before any limit: it neither counts nor is counted.
    let (status, answer) = login(&app, &wrong("bad\u{0}name"), Some("203.0.113.1")).await;
    assert_eq!(status, 400, "{answer}");
    assert!(answer["error"].as_str().unwrap().contains("`name`"));
    assert_eq!(answer["code"], "invalid_request", "{answer}");

    // Per name, attempts are paced, not refused: 12 a minute (a turn every 5 s), the burst
    // drawn by twelve clean addresses. An address that failed for `bob` now waits its turn;
    // a clean one does not.
    let app = behind_a_proxy(
        Backend::Sqlite,
        LoginLimitsConfig {
            per_name_per_minute: 12,
            ..Default::default()
        },
    )
    .await;
    let password = add_user(&app, "bob", Role::Approver).await;
    // The burst's first turn is taken after this instant, so the name's next turn comes at
    // least 5 s after it, however long the twelve took on a slow machine (a bound measured
    // from the thirteenth alone shrinks by their time, and failed on a loaded CI box).
    let burst_started = Instant::now();
    for i in 1..=12 {
        let from = format!("203.0.113.{i}");
        assert_eq!(login(&app, &wrong("bob"), Some(&from)).await.0, 401);
    }
    let (status, _, paced) = login_paced(&app, &wrong("bob"), Some("203.0.113.1")).await;
    assert_eq!(status, 401);
    let since_burst = burst_started.elapsed();
    assert!(
        since_burst >= Duration::from_millis(4_500) && paced.is_some_and(|ms| ms > 0),
        "an address that failed for the name was not paced to the name's next turn ({since_burst:?} after the burst began, the server says it waited {paced:?} ms)"
    );
    let right = json!({"name": "bob", "password": password});
    let (status, answer, paced) = login_paced(&app, &right, Some("198.51.100.8")).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(paced, None, "a clean address waited for the name's turn");
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
    let mut app = spawn_app(
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
    // The first unknown name is its own event; the agent's further unknown names in this
    // window are counted into one `refusal.repeated` (checked after the stop, below), whose
    // samples keep the same safe rendering.
    let rejected = app
        .events(AuditFilter {
            kind: Some("tool.rejected".into()),
            ..Default::default()
        })
        .await;
    assert_eq!(rejected.len(), 1, "{rejected:#?}");
    let rendered_safely = |detail: &Value, name: &str| {
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
    };
    assert_eq!(rejected[0].tool, None);
    rendered_safely(rejected[0].detail.as_ref().unwrap(), hostile[0]);

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
    app.stop().await;
    let repeated = app
        .events(AuditFilter {
            kind: Some("refusal.repeated".into()),
            ..Default::default()
        })
        .await;
    let unknown_names = repeated
        .iter()
        .find(|e| e.detail.as_ref().unwrap()["class"] == "unknown_tool")
        .unwrap_or_else(|| panic!("{repeated:#?}"));
    let detail = unknown_names.detail.as_ref().unwrap();
    assert_eq!(unknown_names.actor, "agent:test-agent");
    assert!(detail["count"].as_u64().unwrap() >= 5, "{detail}");
    assert_eq!(detail["first"]["tool"], Value::Null);
    rendered_safely(&detail["first"]["detail"], hostile[1]);
    assert!(
        detail.to_string().len() < 4096,
        "no sample repeats a name: {} bytes",
        detail.to_string().len()
    );
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
