//! Rules of the call path that used to live in two places and drift apart: what a policy's
//! lowering means on the runner, which runners a caller may target, and how an agent tells
//! one refusal from another.

use std::path::PathBuf;
use std::sync::Arc;

use emisar::lab::clock::LabClock;
use emisar::lab::http::serve;
use emisar::lab::scenario;
use emisar::protocol::{CallRequest, Mode};
use emisar::server::policy::Policy;
use emisar::server::principal::Role;
use rmcp::model::CallToolRequestParams;
use serde_json::{Value, json};

use crate::approvals::{
    call_in_background, finished, restart_args, restart_lab, restarts, signed_in,
    systemctl_standin, wait_for_pending,
};
use crate::both_backends;
use crate::harness::app::{Options, Signed};
use crate::harness::{Backend, RunnerSpec, spawn_app};
use crate::mcp_calls::call;
use crate::signed_approvals::approvers_text;

/// A policy file holding `text`, in a folder that lives as long as the returned guard.
fn policy_file(text: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.yaml");
    std::fs::write(&path, text).unwrap();
    (dir, path)
}

/// The packs of these tests: the stock ones, the test-only `gk` pack and the secret `vault`.
pub(crate) fn gateway_packs() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/it");
    for (from, name) in [
        ("fixtures_gateway/gk.yaml", "gk.yaml"),
        ("fixtures_secret/login.yaml", "vault.yaml"),
    ] {
        std::fs::copy(root.join(from), dir.path().join(name)).unwrap();
    }
    dir
}

/// The machine-readable kind of a refused call's error.
fn kind_of(res: &rmcp::model::CallToolResult) -> Value {
    assert_eq!(res.is_error, Some(true), "{res:?}");
    res.structured_content.clone().unwrap_or_default()["error"]["kind"].clone()
}

/// A policy that lowers a risk:high tool to `read` makes it run without an approval, over
/// MCP, on a runner that refuses the same call when it does not carry the policy's word.
async fn a_policy_lowered_write_runs_over_mcp(backend: Backend) {
    let (_policy_dir, policy) =
        policy_file("risk:\n  linux.systemctl_restart: {risk: read, lower: true}\n");
    let (_bin, record, app) = restart_lab(
        backend,
        Options {
            policy_file: Some(policy.clone()),
            ..Default::default()
        },
    )
    .await;
    let client = app.mcp_client().await;
    let res = call(
        &client,
        "linux.systemctl_restart",
        restart_args("the policy lets agents restart consul on their own"),
    )
    .await;
    assert_eq!(res.is_error, Some(false), "{res:?}");
    let s = res.structured_content.unwrap();
    assert!(s.get("approval").is_none(), "no approval was asked: {s}");
    assert_eq!(s["results"][0]["ok"], true, "{s}");
    assert_eq!(restarts(&record), 1);
    let digest = Policy::load(&policy).unwrap().digest();
    let events = app.events_of_call(s["call_id"].as_str().unwrap()).await;
    let called = events.iter().find(|e| e.kind == "tool.called").unwrap();
    assert_eq!(
        called.detail.as_ref().unwrap()["lowered_by_policy"],
        digest.as_str(),
        "{called:?}"
    );

    // On the runner: the same execution, signed, with neither an approval nor the policy's
    // word is refused; with the policy's word it runs.
    let request = CallRequest {
        tool: "linux.systemctl_restart".into(),
        args: json!({"unit": "consul"}).as_object().unwrap().clone(),
        mode: Mode::Execute,
        preview: None,
        preview_seal: None,
        raw: false,
        approval: None,
        witnessed: None,
        secret_salt: None,
        wave: None,
        decision: None,
        grant: None,
    };
    let signed = |lowered_by_policy: Option<String>| Signed {
        call_id: uuid::Uuid::new_v4().to_string(),
        approval_id: None,
        lowered_by_policy,
    };
    let forged = app.signed_request("hvn05", &request, &signed(None)).await;
    assert_eq!(forged.status, 403, "{}", forged.body);
    assert!(
        forged.body["error"]
            .as_str()
            .unwrap()
            .contains("under a human's approval or the server policy's lowering"),
        "{}",
        forged.body
    );
    assert_eq!(restarts(&record), 1, "the forged call ran nothing");
    let lowered = app
        .signed_request("hvn05", &request, &signed(Some(digest)))
        .await;
    assert_eq!(lowered.status, 200, "{}", lowered.body);
    assert_eq!(restarts(&record), 2);
    app.assert_chain_intact().await;
    client.cancel().await.unwrap();
}
both_backends!(a_policy_lowered_write_runs_over_mcp);

/// A lowering a target runner would refuse is refused before anything is sent: hvn05 runs
/// the restart only with people's signatures, and its approvers file does not let it run
/// unapproved. The agent reads why; the audit log holds the refusal and no intent.
async fn a_lowering_the_runners_approvers_file_forbids_is_refused_before_it_runs(backend: Backend) {
    let bin = tempfile::tempdir().unwrap();
    let record = systemctl_standin(bin.path());
    let file = bin.path().join("approvers.toml");
    std::fs::write(&file, approvers_text()).unwrap();
    let (_policy_dir, policy) =
        policy_file("risk:\n  linux.systemctl_restart: {risk: read, lower: true}\n");
    let app = spawn_app(
        backend,
        vec![
            RunnerSpec::new("hvn05")
                .path_first(bin.path())
                .allow("systemd_units", &["consul"])
                .signed_approvals(&["*"], Some(file.clone()), &[]),
        ],
        Options {
            approvers_file: Some(file),
            policy_file: Some(policy),
            probe_interval_ms: Some(200),
            ..Default::default()
        },
    )
    .await;
    wait_for_health_answer(&app, "hvn05").await;
    let client = app.mcp_client().await;
    let res = call(
        &client,
        "linux.systemctl_restart",
        restart_args("the policy lets agents restart consul on their own"),
    )
    .await;
    assert_eq!(kind_of(&res), "signatures_unsatisfiable", "{res:?}");
    let error = &res.structured_content.as_ref().unwrap()["error"];
    let why = "the policy lowers `linux.systemctl_restart` below approval, but runner `hvn05` runs it only with people's signatures";
    assert!(error["message"].as_str().unwrap().contains(why), "{error}");
    assert_eq!(restarts(&record), 0);
    let events = app.all_events().await;
    let rejected: Vec<_> = events
        .iter()
        .filter(|e| e.kind == "tool.rejected")
        .collect();
    let [rejected] = rejected[..] else {
        panic!("one refusal: {rejected:?}")
    };
    let detail = rejected.detail.as_ref().unwrap();
    assert!(detail["error"].as_str().unwrap().contains(why), "{detail}");
    assert!(
        !events.iter().any(|e| e.kind == "tool.called"),
        "nothing was meant to run"
    );
    client.cancel().await.unwrap();
}
both_backends!(a_lowering_the_runners_approvers_file_forbids_is_refused_before_it_runs);

/// Waits until the server has read `runner`'s health answer (the probe that reports its
/// allowlists also reports its signed approvals).
async fn wait_for_health_answer(app: &crate::harness::app::TestApp, runner: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let runners = app.runners_api().await;
        let answered = runners["runners"]
            .as_array()
            .and_then(|r| r.iter().find(|r| r["name"] == runner))
            .is_some_and(|r| !r["allowlists"].is_null());
        if answered {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the server never read {runner}'s health answer: {runners}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// The runners a tool's schema lists, the runners a caller may name or select, and the
/// runner the server picks for a cluster-scoped tool are one set: the token's selector and
/// the policy's, both applied.
async fn the_runners_a_caller_may_target_are_one_set(backend: Backend) {
    let consul =
        serve(scenario::consul("consul-secret", Arc::new(LabClock::frozen())).router()).await;
    let (_policy_dir, policy) =
        policy_file("agents:\n  test-agent: {tools: [\"consul.*\"], runners: \"role=edge\"}\n");
    let runner = |name: &str, role: &str| {
        RunnerSpec::new(name)
            .label("role", role)
            .service_with_header("consul", &consul, "X-Consul-Token", "consul-secret")
    };
    // `a-core` sorts first, so a server that ignores the policy picks it.
    let app = spawn_app(
        backend,
        vec![runner("a-core", "core"), runner("b-edge", "edge")],
        Options {
            policy_file: Some(policy),
            ..Default::default()
        },
    )
    .await;
    let client = app.mcp_client().await;
    let tools = client.list_all_tools().await.unwrap();
    let members = tools.iter().find(|t| t.name == "consul.members").unwrap();
    assert_eq!(
        members.input_schema["properties"]["runners"]["items"]["enum"],
        json!(["b-edge"])
    );

    // No runner named: the server picks one this agent may target.
    let res = call(
        &client,
        "consul.members",
        json!({"reason": "did every agent rejoin?"}),
    )
    .await;
    assert_eq!(res.is_error, Some(false), "{res:?}");
    let s = res.structured_content.unwrap();
    assert_eq!(s["runner_chosen_by_server"], true, "{s}");
    assert_eq!(s["results"][0]["runner"], "b-edge", "{s}");

    // A runner outside the policy's selector is as unknown to the agent as one that does
    // not exist, whether named or selected: the same kind (`invalid_arguments`, as
    // docs/agent-guide.md says) and the same words. The audit log tells the operator which
    // it was: the policy line and the runner's labels, or no such runner.
    let mut rejected = Vec::new();
    for name in ["a-core", "a-typo"] {
        let res = call(
            &client,
            "consul.members",
            json!({"runners": [name], "reason": "ask the core"}),
        )
        .await;
        assert_eq!(kind_of(&res), "invalid_arguments", "{res:?}");
        let text = format!("{:?}", res.content);
        assert!(
            text.contains(&format!("`{name}` is not a runner this agent may use")),
            "{text}"
        );
        assert!(
            !text.contains("role=core") && !text.contains("policy"),
            "{text}"
        );
        let events = app
            .events(emisar::server::audit::AuditFilter {
                kind: Some("tool.rejected".into()),
                ..Default::default()
            })
            .await;
        rejected.push(events.last().unwrap().detail.clone().unwrap()["error"].clone());
    }
    let policy_line = rejected[0].as_str().unwrap();
    assert!(
        policy_line.contains(
            "runner `a-core` (labels `role=core`) is outside the runners agent `test-agent` may use: the policy's `agents.test-agent.runners = \"role=edge\"`"
        ),
        "{policy_line}"
    );
    let typo = rejected[1].as_str().unwrap();
    assert!(typo.contains("no runner is named `a-typo`"), "{typo}");
    assert!(!typo.contains("policy"), "{typo}");
    let res = call(
        &client,
        "consul.members",
        json!({"selector": "role=core", "reason": "ask the core"}),
    )
    .await;
    assert_eq!(res.is_error, Some(true), "{res:?}");
    let text = format!("{:?}", res.content);
    assert!(
        text.contains("no runner serving pack `consul` matches `role=core`"),
        "{text}"
    );
    app.assert_chain_intact().await;
    client.cancel().await.unwrap();
}
both_backends!(the_runners_a_caller_may_target_are_one_set);

/// Every refusal says what kind it is, so an agent can decide to wait, rephrase or stop.
async fn refusals_carry_a_kind_an_agent_can_act_on(backend: Backend) {
    let bin = tempfile::tempdir().unwrap();
    let record = systemctl_standin(bin.path());
    let packs = gateway_packs();
    let (_policy_dir, policy) = policy_file("runners:\n  hvn05: {systemd_units: [consul]}\n");
    let app = spawn_app(
        backend,
        vec![
            RunnerSpec::new("hvn05")
                .path_first(bin.path())
                .allow("systemd_units", &["consul", "nomad"])
                .service("vault", "http://127.0.0.1:9"),
        ],
        Options {
            packs_dir: Some(packs.path().to_owned()),
            policy_file: Some(policy),
            ..Default::default()
        },
    )
    .await;
    let client = app.mcp_client().await;

    // Rephrase: the arguments are wrong.
    let res = call(
        &client,
        "linux.systemctl_restart",
        json!({"unit": "consul", "runners": ["hvn05"]}),
    )
    .await;
    assert_eq!(kind_of(&res), "invalid_arguments", "{res:?}");
    let text = format!("{:?}", res.content);
    assert!(text.contains("reason"), "the human text stays: {text}");

    // Stop: the policy says no.
    let res = call(
        &client,
        "linux.systemctl_restart",
        json!({"unit": "nomad", "runners": ["hvn05"], "reason": "nomad is stuck"}),
    )
    .await;
    assert_eq!(kind_of(&res), "denied_by_policy", "{res:?}");

    // Stop: no such tool (a protocol error, with the kind in its data).
    let err = client
        .call_tool(
            CallToolRequestParams::new("no.such_tool")
                .with_arguments(json!({"reason": "x"}).as_object().unwrap().clone()),
        )
        .await
        .expect_err("an unknown tool is a protocol error");
    let rmcp::ServiceError::McpError(data) = err else {
        panic!("not an MCP error: {err}");
    };
    assert_eq!(data.data.unwrap()["kind"], "unknown_tool");

    // Stop: a write with a secret cannot wait for approval.
    let res = call(
        &client,
        "vault.rotate",
        json!({"runners": ["hvn05"], "reason": "rotate", "user": "ops", "password": "pw-123"}),
    )
    .await;
    assert_eq!(kind_of(&res), "needs_approval_secret", "{res:?}");

    // Rephrase or stop: the preview failed, so nobody was asked.
    let res = call(
        &client,
        "gk.doomed",
        json!({"runners": ["hvn05"], "reason": "try it", "path": "/tmp/never"}),
    )
    .await;
    assert_eq!(kind_of(&res), "preview_failed", "{res:?}");

    // Stop: a human said no.
    let bob = signed_in(&app, "bob", Role::Approver).await;
    let waiting = call_in_background(
        &client,
        "linux.systemctl_restart",
        restart_args("restart it"),
    );
    let id = wait_for_pending(&bob).await;
    let (status, body) = bob.deny(&id, "not now").await;
    assert_eq!(status, 200, "{body}");
    let res = finished(waiting).await;
    assert_eq!(kind_of(&res), "denied_by_human", "{res:?}");
    let error = &res.structured_content.as_ref().unwrap()["error"];
    assert_eq!(error["approval_id"], id.as_str(), "{error}");

    // Ask again: the request expired before anyone decided.
    let waiting = call_in_background(
        &client,
        "linux.systemctl_restart",
        restart_args("restart it, please"),
    );
    let id = wait_for_pending(&bob).await;
    let past = emisar::server::audit::format_at(chrono::Utc::now() - chrono::Duration::seconds(1));
    emisar::with_pool!(&app.db, pool => sqlx::query(app.db.sql("UPDATE approvals SET expires_at = $1::timestamptz WHERE id = $2"))
        .bind(&past).bind(&id).execute(pool).await.map(|_| ()))
    .unwrap();
    let res = finished(waiting).await;
    assert_eq!(kind_of(&res), "expired", "{res:?}");

    assert_eq!(restarts(&record), 0);
    app.assert_chain_intact().await;
    client.cancel().await.unwrap();

    let limited = spawn_app(
        backend,
        vec![RunnerSpec::new("hvn05")],
        Options {
            rate_limit: Some((1, 1)),
            ..Default::default()
        },
    )
    .await;
    // Wait and call again: too many calls.
    let client = limited.mcp_client().await;
    let mut kinds = Vec::new();
    for _ in 0..3 {
        let res = call(&client, "emisar.runners", json!({"reason": "health"})).await;
        if res.is_error == Some(true) {
            kinds.push(kind_of(&res));
        }
    }
    assert!(kinds.contains(&json!("rate_limited")), "{kinds:?}");
    client.cancel().await.unwrap();
}
both_backends!(refusals_carry_a_kind_an_agent_can_act_on);
