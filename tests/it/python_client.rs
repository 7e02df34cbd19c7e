//! A second MCP client, not written here: the official Python SDK (`mcp` on PyPI), driven by
//! tests/mcp_python_client.py against a real server, runner and Traefik.

use emisar::server::audit::AuditFilter;
use serde_json::{Value, json};

use crate::harness::app::{Options, TEST_AGENT, TestApp};
use crate::harness::tools::require;
use crate::harness::{Backend, RunnerSpec, spawn_app};
use crate::mcp_calls::traefik_with_dead_backends;

/// Runs tests/mcp_python_client.py against `app` (over https when it serves TLS: the SDK's
/// HTTP client then trusts the test CA through `SSL_CERT_FILE`) and returns what it printed.
pub async fn python_call(app: &TestApp, tool: &str, args: &Value) -> Value {
    python_call_at(&app.mcp_url, &app.token, app.ca_file.as_deref(), tool, args).await
}

/// Runs tests/mcp_python_client.py against the MCP endpoint `mcp_url` with the agent token
/// `token` (trusting `ca` when given) and returns what it printed.
pub async fn python_call_at(
    mcp_url: &str,
    token: &str,
    ca: Option<&std::path::Path>,
    tool: &str,
    args: &Value,
) -> Value {
    let python = require("venv/bin/python");
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_python_client.py");
    let mut command = tokio::process::Command::new(python);
    command.arg(script).args([
        "--url",
        mcp_url,
        "--token",
        token,
        "--tool",
        tool,
        "--args",
        &args.to_string(),
    ]);
    if let Some(ca) = ca {
        command.env("SSL_CERT_FILE", ca);
    }
    let out = command.output().await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "python client failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.trim()).unwrap()
}

async fn python_sdk_calls_traefik_ping(backend: Backend) {
    let (traefik, _dead) = traefik_with_dead_backends().await;
    let app = spawn_app(
        backend,
        vec![RunnerSpec::new("node-1").service("traefik", &traefik.api_url)],
        Options::default(),
    )
    .await;
    let reason = "python sdk: is node-1's edge up?";
    let v = python_call(
        &app,
        "traefik.ping",
        &json!({"runners": ["node-1"], "reason": reason}),
    )
    .await;
    assert!(
        v["tools"]
            .as_array()
            .unwrap()
            .contains(&json!("traefik.ping"))
    );
    assert_eq!(v["is_error"], false, "{v}");
    let r = &v["structured_content"]["results"][0];
    assert_eq!(r["runner"], "node-1");
    assert_eq!(r["output"], json!({"http_status": 200, "body": "OK"}));

    let events = app
        .events(AuditFilter {
            tool: Some("traefik.ping".into()),
            ..Default::default()
        })
        .await;
    let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, vec!["tool.called", "call.executed"]);
    assert!(
        events.iter().all(
            |e| e.actor == format!("agent:{TEST_AGENT}") && e.reason.as_deref() == Some(reason)
        )
    );
    app.assert_chain_intact().await;
}
crate::both_backends!(python_sdk_calls_traefik_ping);
