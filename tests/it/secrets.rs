//! A secret param never appears in clear: not in the database, the HTTP API, the CLI output,
//! the MCP answer, or the process logs of the server and the runner (both run as real
//! processes here, logging at debug level). An auditor can still check a known value.

use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::harness::pg::PgTestDb;
use crate::harness::tools::{Proc, bound_addr};
use crate::mcp_calls::call;

const SECRET: &str = "s3cr3t-Pa55w0rd-XYZ";

fn emisar() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_emisar"));
    c.env_remove("DATABASE_URL").env("EMISAR_LOG", "debug");
    c
}

fn run(args: &[&str]) -> String {
    let out = emisar().args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

async fn wait_healthy(url: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !reqwest::get(url)
        .await
        .is_ok_and(|r| r.status().is_success())
    {
        assert!(Instant::now() < deadline, "{url} did not come up");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_param_never_appears_in_clear() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let pg = tokio::task::spawn_blocking(PgTestDb::create).await.unwrap();
    let packs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it/fixtures_secret");

    // The service the password is for: it records what it received.
    let received: Arc<Mutex<Vec<Value>>> = Arc::default();
    let seen = received.clone();
    let service = axum::Router::new().route(
        "/login",
        axum::routing::post(move |axum::Json(body): axum::Json<Value>| {
            let seen = seen.clone();
            async move {
                seen.lock().unwrap().push(body.clone());
                axum::Json(json!({"ok": body["password"] == SECRET, "user": body["user"]}))
            }
        }),
    );
    let service_url = emisar::lab::http::serve(service).await;

    run(&[
        "keygen",
        "--private",
        d.join("server.key").to_str().unwrap(),
        "--public",
        d.join("server.pub").to_str().unwrap(),
        "--audit-key",
        d.join("audit.key").to_str().unwrap(),
    ]);
    // The runner first, on port 0: the server's config names the address it bound.
    std::fs::write(
        d.join("runner.toml"),
        format!(
            "name = \"node-1\"\nlisten = \"127.0.0.1:0\"\ninsecure_http = true\nserver_public_key_file = \"{}\"\npacks_dir = \"{}\"\n[services.vault]\nbase_url = \"{service_url}\"\n",
            d.join("server.pub").display(),
            packs.display()
        ),
    )
    .unwrap();
    let log = |name: &str| std::fs::File::create(d.join(name)).unwrap();
    let mut runner = Proc(
        emisar()
            .args([
                "runner",
                "--config",
                d.join("runner.toml").to_str().unwrap(),
            ])
            .stdout(log("runner.out"))
            .stderr(log("runner.log"))
            .spawn()
            .unwrap(),
    );
    let runner_url = format!(
        "http://{}",
        bound_addr(&mut runner, &d.join("runner.log"), "runner listening").await
    );
    std::fs::write(
        d.join("emisar.toml"),
        format!(
            "listen = \"127.0.0.1:0\"\ninsecure_http = true\ndatabase_url = \"{}\"\nsigning_key_file = \"{}\"\naudit_key_file = \"{}\"\npacks_dir = \"{}\"\n[[runners]]\nname = \"node-1\"\nurl = \"{runner_url}\"\n",
            pg.url,
            d.join("server.key").display(),
            d.join("audit.key").display(),
            packs.display()
        ),
    )
    .unwrap();
    let mut server = Proc(
        emisar()
            .args(["serve", "--config", d.join("emisar.toml").to_str().unwrap()])
            .stdin(Stdio::null())
            .stdout(log("server.out"))
            .stderr(log("server.log"))
            .spawn()
            .unwrap(),
    );
    let server_addr = bound_addr(&mut server, &d.join("server.log"), "emisar serving MCP").await;
    wait_healthy(&format!("{runner_url}/healthz")).await;
    wait_healthy(&format!("http://{server_addr}/healthz")).await;
    let token_of = |out: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix("token:"))
            .unwrap()
            .trim()
            .to_owned()
    };
    let agent = token_of(&run(&[
        "token",
        "issue",
        "--agent",
        "ops-bot",
        "--database",
        &pg.url,
    ]));
    let auditor = token_of(&run(&[
        "token",
        "issue",
        "--agent",
        "alice",
        "--role",
        "auditor",
        "--database",
        &pg.url,
    ]));

    let client =
        crate::harness::tools::mcp_client(&format!("http://{server_addr}/mcp"), &agent).await;
    let res = call(
        &client,
        "vault.login",
        json!({"runners": ["node-1"], "reason": "log in", "user": "ops", "password": SECRET}),
    )
    .await;
    assert_eq!(res.is_error, Some(false), "{:?}", res.content);
    let answer = serde_json::to_string(&res).unwrap();
    assert!(
        answer.contains("\"ok\":true"),
        "the service got the real password: {answer}"
    );
    assert!(!answer.contains(SECRET));
    assert_eq!(received.lock().unwrap()[0]["password"], SECRET);
    // A rejected call with the secret in it is audited too, and sealed too.
    let res = call(
        &client,
        "vault.login",
        json!({"runners": ["node-1"], "reason": "", "user": "ops", "password": SECRET}),
    )
    .await;
    assert_eq!(res.is_error, Some(true));
    // A write with a secret would wait in the approvals table: refused, for now, by name.
    let res = call(
        &client,
        "vault.rotate",
        json!({"runners": ["node-1"], "reason": "rotate", "user": "ops", "password": SECRET}),
    )
    .await;
    assert_eq!(res.is_error, Some(true));
    assert!(
        format!("{:?}", res.content).contains("cannot yet keep a secret in a pending request"),
        "{:?}",
        res.content
    );
    client.cancel().await.unwrap();

    // What an auditor can do: check a known value against the stored MAC.
    let sealed = run(&[
        "audit",
        "hash",
        "--key-file",
        d.join("audit.key").to_str().unwrap(),
        SECRET,
    ]);
    let sealed = sealed.trim();
    assert!(sealed.starts_with("hmac-sha256:"));

    // The database: every table, whatever it is called, as PostgreSQL's own dump prints it.
    let pg_dump = std::path::Path::new("/usr/lib/postgresql/15/bin/pg_dump");
    assert!(
        pg_dump.exists(),
        "{} is missing: run scripts/install-test-deps",
        pg_dump.display()
    );
    let dumped = Command::new(pg_dump)
        .args(["--data-only", "--no-owner", "--dbname", &pg.url])
        .output()
        .unwrap();
    assert!(
        dumped.status.success(),
        "pg_dump failed: {}",
        String::from_utf8_lossy(&dumped.stderr)
    );
    let dump = String::from_utf8_lossy(&dumped.stdout).into_owned();
    assert!(
        dump.contains("COPY public.audit_events") && dump.contains("COPY public.agent_tokens"),
        "the dump holds the tables: {}",
        &dump[..dump.len().min(2000)]
    );
    assert!(
        dump.contains(sealed),
        "the audit log holds the MAC of the value"
    );
    // The rejected call (no reason) is on the record, with the value sealed.
    let db = emisar::server::db::Db::connect(&pg.url).await.unwrap();
    let rejected = emisar::server::audit::query(
        &db,
        &emisar::server::audit::AuditFilter {
            kind: Some("tool.rejected".into()),
            tool: Some("vault.login".into()),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(
        rejected.len(),
        1,
        "the rejected vault.login is audited once: {rejected:#?}"
    );
    let args = rejected[0].args.clone().unwrap_or_default();
    assert_eq!(
        args["password"],
        json!(sealed),
        "the rejected call's event carries the sealed value: {args}"
    );
    // The HTTP API.
    let api = reqwest::Client::new()
        .get(format!("http://{server_addr}/api/audit?tool=vault.login"))
        .bearer_auth(&auditor)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(api.contains(sealed), "{api}");
    // The CLI.
    let query = run(&["audit", "query", "--json", "--database", &pg.url]);
    let export = run(&["audit", "export", "--format", "csv", "--database", &pg.url]);
    assert!(query.contains(sealed));
    // The process logs, at debug level.
    let logs: String = ["server.log", "server.out", "runner.log", "runner.out"]
        .iter()
        .map(|f| std::fs::read_to_string(d.join(f)).unwrap())
        .collect();
    assert!(
        logs.contains("executing"),
        "the runner logged the call: {logs}"
    );
    for (place, text) in [
        ("database", &dump),
        ("API", &api),
        ("CLI query", &query),
        ("CLI export", &export),
        ("process logs", &logs),
    ] {
        let at = text
            .find(SECRET)
            .map(|i| &text[i.saturating_sub(300)..(i + 100).min(text.len())]);
        assert!(
            at.is_none(),
            "the secret appears in clear in the {place}: {at:?}"
        );
    }
}
