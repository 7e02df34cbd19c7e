//! What runs is what was approved: the values a preview captured reach the execution only as
//! the runner produced them. Something in the path between server and runner that rewrites
//! the preview's answer (adds a value, renames one after a param, changes one) cannot change
//! what an approved write does: the runner refuses, and nothing runs.

use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use emisar::protocol::{CallRequest, Mode};
use emisar::server::principal::Role;
use rmcp::model::CallToolResult;
use serde_json::{Map, Value, json};

use crate::approvals::{Portal, add_user, call_in_background, finished, wait_for_pending};
use crate::both_backends;
use crate::governance_rules::gateway_packs;
use crate::harness::app::{Options, Signed};
use crate::harness::{Backend, RunnerSpec, spawn_app};
use emisar::lab::http::serve;

/// A stand-in for the network between server and runner: forwards every request to the
/// runner, and rewrites one value in the runner's preview answers when told to.
#[derive(Default)]
struct LyingPath {
    runner: Mutex<String>,
    lie: Mutex<Option<(String, Value)>>,
}

impl LyingPath {
    async fn start() -> (Arc<LyingPath>, String) {
        let path = Arc::new(LyingPath::default());
        let router = axum::Router::new()
            .fallback(forward)
            .with_state(path.clone());
        (path, serve(router).await)
    }

    fn lie(&self, var: &str, value: Value) {
        *self.lie.lock().unwrap() = Some((var.to_owned(), value));
    }
}

async fn forward(State(path): State<Arc<LyingPath>>, request: axum::extract::Request) -> Response {
    let (parts, body) = request.into_parts();
    let body = axum::body::to_bytes(body, 16 << 20).await.unwrap();
    let url = format!("{}{}", path.runner.lock().unwrap(), parts.uri.path());
    let mut out = reqwest::Client::new().request(parts.method.clone(), url);
    for name in ["authorization", "content-type"] {
        if let Some(v) = parts.headers.get(name) {
            out = out.header(name, v.to_str().unwrap());
        }
    }
    let answer = out.body(body.clone()).send().await.unwrap();
    let status = axum::http::StatusCode::from_u16(answer.status().as_u16()).unwrap();
    let mut answer: Value = answer.json().await.unwrap();
    let preview = serde_json::from_slice::<Value>(&body).is_ok_and(|b| b["mode"] == "preview");
    let lie = path.lie.lock().unwrap().clone();
    if let (true, Some((var, value))) = (preview, lie)
        && answer["status"] == "ok"
    {
        answer["vars"][var] = value;
    }
    (status, axum::Json(answer)).into_response()
}

/// Requests `gk.stamp` of `file`, approves it as `alice`, and returns the call's result and
/// the request's final row.
async fn stamp(
    client: &rmcp::service::RunningService<rmcp::RoleClient, ()>,
    alice: &Portal,
    file: &std::path::Path,
) -> (CallToolResult, Value) {
    let call = call_in_background(
        client,
        "gk.stamp",
        json!({"path": file.to_str().unwrap(), "runners": ["node-1"], "reason": "stamp it"}),
    );
    let id = wait_for_pending(alice).await;
    let (status, body) = alice.approve(&id).await;
    assert_eq!(status, 200, "{body}");
    let res = finished(call).await;
    let (_, row) = alice.get(&format!("/api/approvals/{id}")).await;
    (res, row)
}

async fn a_lying_path_cannot_change_what_an_approved_write_does(backend: Backend) {
    let packs = gateway_packs();
    let (path, url) = LyingPath::start().await;
    let app = spawn_app(
        backend,
        vec![
            RunnerSpec::new("node-1")
                .service("vault", "http://127.0.0.1:9")
                .reached_at(&url),
        ],
        Options {
            packs_dir: Some(packs.path().to_owned()),
            ..Default::default()
        },
    )
    .await;
    *path.runner.lock().unwrap() = app.runner_urls["node-1"].clone();
    let password = add_user(&app, "alice", Role::Approver).await;
    let alice = Portal::login(&app, "alice", &password).await;
    let client = app.mcp_client().await;
    let files = tempfile::tempdir().unwrap();
    let file = |name: &str| files.path().join(name);

    // An honest path: the approved write runs.
    let (res, honest) = stamp(&client, &alice, &file("asked")).await;
    assert_eq!(res.is_error, Some(false), "{res:?}");
    assert!(file("asked").exists());

    let lies = [
        // A value named like a param, which would stand in for the approved argument.
        (
            "path",
            file("elsewhere"),
            "is named like a param of `gk.stamp`",
        ),
        // A value the preview never captured.
        (
            "extra",
            file("extra"),
            "is not one the preview of `gk.stamp` captures",
        ),
        // A value the preview captured, changed on the way.
        (
            "seen",
            file("changed"),
            "differ from the ones this runner sealed",
        ),
    ];
    for (var, target, refusal) in lies {
        path.lie(var, json!(target.to_str().unwrap()));
        let asked = file(&format!("asked-{var}"));
        let (res, row) = stamp(&client, &alice, &asked).await;
        assert_eq!(res.is_error, Some(true), "lie about `{var}`: {res:?}");
        assert_eq!(row["state"], "failed", "{row}");
        let note = row["outcome_note"].as_str().unwrap();
        assert!(note.contains(refusal), "lie about `{var}`: {note}");
        assert!(!asked.exists(), "lie about `{var}`: nothing ran");
        assert!(!target.exists(), "lie about `{var}`: nothing ran");
    }

    // What the approver saw: the values the execution will use, per runner, in the API and
    // in `emisar approvals show`.
    let used = json!({"node-1": {"seen": file("asked").to_str().unwrap()}});
    assert_eq!(honest["execution_vars"], used, "{honest}");
    let token = app.issue_token("alice", Role::Approver).await;
    let shown = tokio::process::Command::new(env!("CARGO_BIN_EXE_emisar"))
        .args(["approvals", "show", honest["id"].as_str().unwrap()])
        .args(["--server", &app.base_url(), "--token", &token])
        .env_remove("EMISAR_SERVER")
        .env_remove("EMISAR_TOKEN")
        .output()
        .await
        .unwrap();
    assert!(shown.status.success(), "{shown:?}");
    let shown: Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!(shown["execution_vars"], used, "{shown}");
    app.assert_chain_intact().await;
    client.cancel().await.unwrap();
}
both_backends!(a_lying_path_cannot_change_what_an_approved_write_does);

/// Preview values handed to the runner directly, signed as the server signs: only the exact
/// values the runner sealed, for the same call and the same arguments, run.
async fn preview_values_run_only_under_the_runners_own_seal(backend: Backend) {
    let packs = gateway_packs();
    let app = spawn_app(
        backend,
        vec![RunnerSpec::new("node-1").service("vault", "http://127.0.0.1:9")],
        Options {
            packs_dir: Some(packs.path().to_owned()),
            ..Default::default()
        },
    )
    .await;
    let files = tempfile::tempdir().unwrap();
    let asked = files.path().join("asked");
    let args = json!({"path": asked.to_str().unwrap()})
        .as_object()
        .unwrap()
        .clone();
    let request = |args: &Map<String, Value>, mode, preview, seal| CallRequest {
        tool: "gk.stamp".into(),
        args: args.clone(),
        mode,
        preview,
        preview_seal: seal,
        raw: false,
        approval: None,
        witnessed: None,
        secret_salt: None,
        wave: None,
        decision: None,
        grant: None,
    };
    let signed = |call_id: &str| Signed {
        call_id: call_id.into(),
        approval_id: Some(uuid::Uuid::new_v4().to_string()),
        lowered_by_policy: None,
    };
    let preview = app
        .signed_request(
            "node-1",
            &request(&args, Mode::Preview, None, None),
            &signed("call-1"),
        )
        .await;
    assert_eq!(preview.status, 200, "{}", preview.body);
    let vars = preview.body["vars"].as_object().unwrap().clone();
    let seal = preview.body["seal"].as_str().unwrap().to_owned();
    assert_eq!(vars["seen"], asked.to_str().unwrap());

    let mut other_args = args.clone();
    other_args.insert(
        "path".into(),
        json!(files.path().join("other").to_str().unwrap()),
    );
    let refusals = [
        (
            "no seal",
            request(&args, Mode::Execute, Some(vars.clone()), None),
            "call-1",
            "carry no seal",
        ),
        (
            "another call's seal",
            request(&args, Mode::Execute, Some(vars.clone()), Some(seal.clone())),
            "call-2",
            "differ from the ones this runner sealed",
        ),
        (
            "other arguments",
            request(
                &other_args,
                Mode::Execute,
                Some(vars.clone()),
                Some(seal.clone()),
            ),
            "call-1",
            "differ from the ones this runner sealed",
        ),
        (
            "a forged seal",
            request(
                &args,
                Mode::Execute,
                Some(vars.clone()),
                Some("00".repeat(32)),
            ),
            "call-1",
            "differ from the ones this runner sealed",
        ),
    ];
    for (what, req, call_id, want) in refusals {
        let answer = app.signed_request("node-1", &req, &signed(call_id)).await;
        assert_eq!(answer.status, 403, "{what}: {}", answer.body);
        let error = answer.body["error"].as_str().unwrap();
        assert!(error.contains(want), "{what}: {error}");
    }
    assert!(!asked.exists(), "nothing ran");
    let answer = app
        .signed_request(
            "node-1",
            &request(&args, Mode::Execute, Some(vars), Some(seal)),
            &signed("call-1"),
        )
        .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.body["status"], "ok", "{}", answer.body);
    assert!(asked.exists());
}
both_backends!(preview_values_run_only_under_the_runners_own_seal);
