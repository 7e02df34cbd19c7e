//! Governance end to end: the policy file (checked by `emisar policy check`, enforced by the
//! server, reloaded on SIGHUP), people deciding requests from a terminal (`emisar user` and
//! `emisar approvals`), and webhooks telling people about new requests off the call path.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use emisar::server::audit::{AuditFilter, Event};
use emisar::server::notices::webhook::{WebhookConfig, WebhookKind};
use emisar::server::policy::Policy;
use emisar::server::principal::Role;
use rmcp::model::CallToolRequestParams;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

use crate::approvals::{
    Portal, add_user, call_in_background, kinds_and_actors, restart_app, restart_args, restarts,
    systemctl_standin, wait_for_pending,
};
use crate::both_backends;
use crate::harness::app::{Options, TEST_AGENT, TestApp};
use crate::harness::tools::{Proc, bound_addr, mcp_client};
use crate::harness::{Backend, RunnerSpec, spawn_app};
use crate::mcp_calls::call;

const BIN: &str = env!("CARGO_BIN_EXE_emisar");

/// What a run of the binary left: exit code, stdout, stderr.
struct Run {
    code: i32,
    out: String,
    err: String,
}

impl std::fmt::Display for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.out, self.err
        )
    }
}

/// Runs `emisar ARGS`, with `stdin` as its standard input. Async, so a server on this test's
/// runtime keeps answering the commands that talk to it.
async fn emisar(args: &[&str], stdin: Option<&str>) -> Run {
    let mut child = tokio::process::Command::new(BIN)
        .args(args)
        .env_remove("DATABASE_URL")
        .env_remove("EMISAR_SERVER")
        .env_remove("EMISAR_TOKEN")
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    if let Some(text) = stdin {
        let mut pipe = child.stdin.take().unwrap();
        pipe.write_all(text.as_bytes()).await.unwrap();
    }
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("`emisar {}` did not exit within 60 s", args.join(" ")))
        .unwrap();
    Run {
        code: out.status.code().unwrap_or(-1),
        out: String::from_utf8_lossy(&out.stdout).into_owned(),
        err: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn example_policy() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/policy.yaml")
}

async fn policy_events(app_db: &emisar::server::db::Db) -> Vec<Event> {
    emisar::server::audit::query(
        app_db,
        &AuditFilter {
            kind: Some("policy.loaded".into()),
            limit: 100,
            ..Default::default()
        },
    )
    .await
    .unwrap()
}

/// Polls `check` every 50 ms until it gives a value, failing with `what` after `secs`.
async fn eventually<T, F, Fut>(secs: u64, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "{what} within {secs} s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ---- 1. `emisar policy check` ----

const GOOD_YAML: &str = r#"
agents:
  deploy-bot: {tools: ["nomad.*"], runners: "role=edge"}
risk:
  frr.bgp_neighbor_enable: {risk: low, lower: true}
approvers: {default: 1, nomad.task_resources_set: 2}
runners:
  hvn05: {systemd_units: [consul]}
"#;

/// The same policy as [`GOOD_YAML`], in TOML.
const GOOD_TOML: &str = r#"
[agents.deploy-bot]
tools = ["nomad.*"]
runners = "role=edge"

[risk]
"frr.bgp_neighbor_enable" = { risk = "low", lower = true }

[approvers]
default = 1
"nomad.task_resources_set" = 2

[runners.hvn05]
systemd_units = ["consul"]
"#;

/// A good file prints its digest (the same for YAML and TOML of one content) and exits 0; a
/// bad one exits non-zero naming the field and the rule it broke.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_check_accepts_good_files_and_names_the_problem_in_bad_ones() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = write(dir.path(), "policy.yaml", GOOD_YAML);
    let toml = write(dir.path(), "policy.toml", GOOD_TOML);
    let mut digests = Vec::new();
    for file in [&yaml, &toml, &example_policy()] {
        let run = emisar(&["policy", "check", file.to_str().unwrap()], None).await;
        assert_eq!(run.code, 0, "{run}");
        let digest = Policy::load(file).unwrap().digest();
        assert_eq!(
            run.out,
            format!("ok: {} (sha256 {digest})\n", file.display()),
            "{run}"
        );
        digests.push(digest);
    }
    assert_eq!(digests[0], digests[1], "one content, one digest");

    let typo = write(
        dir.path(),
        "typo.yaml",
        &GOOD_YAML.replace("{tools: [\"nomad.*\"]", "{tool: [\"nomad.*\"]"),
    );
    let run = emisar(&["policy", "check", typo.to_str().unwrap()], None).await;
    assert_ne!(run.code, 0, "{run}");
    assert!(
        run.err.contains(&typo.display().to_string())
            && run
                .err
                .contains("`agents.deploy-bot.tool`: unknown field `tool`, expected `tools`"),
        "{run}"
    );
    assert!(run.out.is_empty(), "{run}");

    let lowered = write(
        dir.path(),
        "lowered.toml",
        &format!("{GOOD_TOML}\n[risk.\"linux.systemctl_restart\"]\nrisk = \"low\"\n"),
    );
    let run = emisar(&["policy", "check", lowered.to_str().unwrap()], None).await;
    assert_ne!(run.code, 0, "{run}");
    assert!(
        run.err.contains(&lowered.display().to_string())
            && run.err.contains(
                "`risk.\"linux.systemctl_restart\"`: lowering a risk:high tool needs `lower: true`"
            ),
        "{run}"
    );
}

// ---- 2. People in a terminal ----

fn token_of(run: &Run) -> String {
    run.out
        .lines()
        .find_map(|l| l.strip_prefix("token:"))
        .unwrap_or_else(|| panic!("no token line: {run}"))
        .trim()
        .to_owned()
}

/// `emisar user add` takes the password from stdin and refuses agents and short passwords;
/// `emisar user token` gives a token with which `emisar approvals list|show|approve|deny`
/// decide a waiting agent's requests; an agent's token cannot.
async fn approvers_decide_from_a_terminal(backend: Backend) {
    let bin = tempfile::tempdir().unwrap();
    let record = systemctl_standin(bin.path());
    let app = restart_app(backend, bin.path(), Options::default()).await;
    let db = app.database_url.as_str();
    let password = "alice-correct-horse-battery";

    let run = emisar(
        &[
            "user",
            "add",
            "alice",
            "--role",
            "approver",
            "--password-stdin",
            "--database",
            db,
        ],
        Some(&format!("{password}\n")),
    )
    .await;
    assert_eq!(run.code, 0, "{run}");
    assert_eq!(run.out, "added alice (approver)\n", "{run}");
    // The password from stdin is the one that logs in (the newline is not part of it).
    Portal::login(&app, "alice", password).await;

    let refused = [
        (
            "robot",
            "agent",
            "a-long-enough-password",
            "`role` must be approver, auditor or admin: agents get tokens",
        ),
        (
            "bob",
            "approver",
            "short-pw",
            "`password` must be at least 12 characters",
        ),
    ];
    for (name, role, pw, want) in refused {
        let run = emisar(
            &[
                "user",
                "add",
                name,
                "--role",
                role,
                "--password-stdin",
                "--database",
                db,
            ],
            Some(&format!("{pw}\n")),
        )
        .await;
        assert_ne!(run.code, 0, "{run}");
        assert!(run.err.contains(want), "{run}");
        let run = emisar(&["user", "token", name, "--database", db], None).await;
        assert_ne!(run.code, 0, "{name} was not added: {run}");
        assert!(run.err.contains(&format!("no user `{name}`")), "{run}");
    }

    let run = emisar(&["user", "token", "alice", "--database", db], None).await;
    assert_eq!(run.code, 0, "{run}");
    assert!(run.out.contains("user:       alice (approver)"), "{run}");
    let token = token_of(&run);
    let base = app.base_url();
    let approvals = |args: &[&str]| {
        let mut all = vec!["approvals", "--server", base.as_str(), "--token", &token];
        all.extend_from_slice(args);
        let all: Vec<String> = all.into_iter().map(str::to_owned).collect();
        async move {
            let all: Vec<&str> = all.iter().map(String::as_str).collect();
            emisar(&all, None).await
        }
    };

    let client = app.mcp_client().await;
    let call = call_in_background(
        &client,
        "linux.systemctl_restart",
        restart_args("consul on hvn05 lost its raft peers"),
    );
    let listed = eventually(20, "the request in `emisar approvals list`", || async {
        let run = approvals(&["list"]).await;
        assert_eq!(run.code, 0, "{run}");
        run.out.contains("linux.systemctl_restart").then_some(run)
    })
    .await;
    let line = listed.out.lines().next().unwrap();
    let id = line.split_whitespace().next().unwrap().to_owned();
    assert_eq!(id.len(), 36, "{listed}");
    for part in ["pending", "runners=[\"hvn05\"]", "by=agent:test-agent"] {
        assert!(line.contains(part), "`{part}` in {listed}");
    }
    assert!(
        listed
            .out
            .contains("reason: consul on hvn05 lost its raft peers"),
        "{listed}"
    );

    let run = approvals(&["show", &id]).await;
    assert_eq!(run.code, 0, "{run}");
    let shown: Value = serde_json::from_str(&run.out).unwrap_or_else(|e| panic!("{e}: {run}"));
    assert_eq!(shown["id"], id.as_str());
    assert_eq!(shown["state"], "pending");
    assert_eq!(shown["tool"], "linux.systemctl_restart");
    assert_eq!(shown["args"], json!({"unit": "consul"}));
    assert_eq!(shown["requester"], "agent:test-agent");
    assert_eq!(restarts(&record), 0, "nothing runs before approval");

    let run = approvals(&["approve", &id]).await;
    assert_eq!(run.code, 0, "{run}");
    assert_eq!(run.out, format!("{id}: approved; executing\n"), "{run}");
    let res = tokio::time::timeout(Duration::from_secs(20), call)
        .await
        .expect("the agent's call returns within 20 s of the approval")
        .unwrap();
    assert_eq!(res.is_error, Some(false), "{res:?}");
    let out = res.structured_content.unwrap();
    assert_eq!(out["approval"]["state"], "executed", "{out}");
    assert_eq!(restarts(&record), 1);

    // A second request, denied with a note the agent reads.
    let call = call_in_background(
        &client,
        "linux.systemctl_restart",
        restart_args("and once more"),
    );
    let second = eventually(20, "a second pending request", || async {
        let run = approvals(&["list"]).await;
        let line = run.out.lines().next()?;
        let found = line.split_whitespace().next()?;
        (found.len() == 36 && found != id).then(|| found.to_owned())
    })
    .await;
    let note = "consul is fine now; page the consul owner before restarting again";
    let run = approvals(&["deny", &second, "--note", note]).await;
    assert_eq!(run.code, 0, "{run}");
    assert_eq!(run.out, format!("{second}: denied\n"), "{run}");
    let res = tokio::time::timeout(Duration::from_secs(20), call)
        .await
        .expect("the agent's call returns within 20 s of the denial")
        .unwrap();
    assert_eq!(res.is_error, Some(true), "{res:?}");
    let text = format!("{:?}", res.content);
    assert!(
        text.contains("denied by approver:alice") && text.contains(note),
        "{text}"
    );
    assert_eq!(restarts(&record), 1, "a denied request never runs");
    let run = approvals(&["list"]).await;
    assert_eq!(run.out, "no requests\n", "{run}");

    // An agent's token does not reach the approvals API.
    let run = emisar(
        &[
            "approvals",
            "list",
            "--server",
            &base,
            "--token",
            &app.token,
        ],
        None,
    )
    .await;
    assert_ne!(run.code, 0, "{run}");
    assert!(
        run.err
            .contains("a token with role `agent` may not use /api/approvals"),
        "{run}"
    );
    let status = reqwest::Client::new()
        .get(format!("{base}/api/approvals"))
        .bearer_auth(&app.token)
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, 403);

    assert_eq!(
        kinds_and_actors(&app, &id).await,
        [
            ("tool.called".into(), "agent:test-agent".into()),
            ("approval.requested".into(), "agent:test-agent".into()),
            ("approval.approved".into(), "approver:alice".into()),
            ("approval.executing".into(), "approver:alice".into()),
            ("call.executed".into(), "agent:test-agent".into()),
        ]
    );
    assert_eq!(
        kinds_and_actors(&app, &second).await,
        [
            ("tool.called".into(), "agent:test-agent".into()),
            ("approval.requested".into(), "agent:test-agent".into()),
            ("approval.denied".into(), "approver:alice".into()),
        ]
    );

    // Removing alice ends her session at once and her API token within the token cache's
    // 10 s; her votes stay in the history.
    let session = Portal::login(&app, "alice", password).await;
    let run = emisar(&["user", "remove", "alice", "--database", db], None).await;
    assert_eq!(run.code, 0, "{run}");
    assert_eq!(session.get("/api/session").await.0, 401);
    eventually(15, "alice's token refused after removal", || async {
        let status = reqwest::Client::new()
            .get(format!("{base}/api/approvals"))
            .bearer_auth(&token)
            .send()
            .await
            .unwrap()
            .status();
        (status == 401).then_some(())
    })
    .await;
    let res = reqwest::Client::new()
        .post(format!("{base}/api/login"))
        .json(&json!({"name": "alice", "password": password}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 401);
    let (_, row) = {
        let p = add_user(&app, "carol", Role::Auditor).await;
        Portal::login(&app, "carol", &p)
            .await
            .get(&format!("/api/approvals/{id}"))
            .await
    };
    assert_eq!(row["approvals"][0]["user"], "alice", "{row}");
    let removed = app
        .events(AuditFilter {
            kind: Some("user.removed".into()),
            ..Default::default()
        })
        .await;
    assert_eq!(removed.len(), 1);
    assert_eq!(removed[0].detail.as_ref().unwrap()["user"], "alice");
    let run = emisar(&["user", "remove", "alice", "--database", db], None).await;
    assert_ne!(run.code, 0);
    assert!(run.err.contains("there is no user `alice`"), "{run}");
    app.verify_with_cli();
    client.cancel().await.unwrap();
}
both_backends!(approvers_decide_from_a_terminal);

// ---- 3. The policy, enforced by the server ----

const POLICY: &str = r#"
# test-agent may use the linux pack only; the emisar.* built-ins are always offered.
agents:
  test-agent: {tools: ["linux.*"]}
approvers:
  linux.systemctl_restart: 2
runners:
  hvn05: {systemd_units: [consul]}
"#;

async fn kinds_of_tool(app: &TestApp, tool: &str) -> Vec<Event> {
    app.events(AuditFilter {
        tool: Some(tool.into()),
        ..Default::default()
    })
    .await
}

/// Through a running server: the policy hides tools, its runner allowlist denies before any
/// approval is asked for, its approver count holds a write until two different people agree,
/// and loading it is audited with its digest.
async fn the_policy_file_governs_the_server(backend: Backend) {
    let bin = tempfile::tempdir().unwrap();
    let record = systemctl_standin(bin.path());
    let policy_dir = tempfile::tempdir().unwrap();
    let policy = write(policy_dir.path(), "policy.yaml", POLICY);
    // The runner itself would restart nomad too: what refuses it below is the policy.
    let app = restart_app(
        backend,
        bin.path(),
        Options {
            policy_file: Some(policy.clone()),
            ..Default::default()
        },
    )
    .await;

    let loaded = policy_events(&app.db).await;
    assert_eq!(loaded.len(), 1, "{loaded:?}");
    assert_eq!(loaded[0].outcome.as_deref(), Some("ok"));
    let detail = loaded[0].detail.clone().unwrap();
    assert_eq!(detail["sha256"], Policy::load(&policy).unwrap().digest());
    assert_eq!(detail["source"], policy.display().to_string());

    let client = app.mcp_client().await;
    let names: Vec<String> = client
        .list_all_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    for want in [
        "linux.systemctl_restart",
        "linux.unit_status",
        "emisar.runners",
        "emisar.approval_status",
        "emisar.approval_wait",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} in {names:?}");
    }
    assert!(
        names
            .iter()
            .all(|n| n.starts_with("linux.") || n.starts_with("emisar.")),
        "{names:?}"
    );

    // A tool the policy does not give this agent is unknown to it (not "forbidden": the
    // agent learns nothing about tools it may not use); the refusal is audited.
    let err = client
        .call_tool(
            CallToolRequestParams::new("traefik.ping").with_arguments(
                json!({"runners": ["hvn05"], "reason": "is traefik up?"})
                    .as_object()
                    .unwrap()
                    .clone(),
            ),
        )
        .await
        .expect_err("traefik.ping is not offered to test-agent");
    assert!(
        err.to_string().contains("unknown tool: traefik.ping"),
        "{err}"
    );
    let rejected = kinds_of_tool(&app, "traefik.ping").await;
    assert_eq!(rejected.len(), 1, "{rejected:?}");
    assert_eq!(rejected[0].kind, "tool.rejected");
    assert_eq!(rejected[0].actor, "agent:test-agent");
    // The audit log, unlike the agent, says why: the policy hid it (not a typo).
    let why = rejected[0].detail.as_ref().unwrap()["error"]
        .as_str()
        .unwrap();
    assert!(
        why.contains("hidden from agent `test-agent` by the policy"),
        "{why}"
    );

    // nomad on hvn05: the policy's allowlist refuses it before anyone is asked.
    let res = call(
        &client,
        "linux.systemctl_restart",
        json!({"unit": "nomad", "runners": ["hvn05"], "reason": "nomad is stuck"}),
    )
    .await;
    assert_eq!(res.is_error, Some(true), "{res:?}");
    let text = format!("{:?}", res.content);
    assert!(
        text.contains("runner `hvn05` does not accept `unit` = `nomad`")
            && text.contains("`runners.hvn05.systemd_units` has only [consul]"),
        "{text}"
    );
    let events = kinds_of_tool(&app, "linux.systemctl_restart").await;
    let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, ["tool.rejected"], "{events:?}");
    assert_eq!(events[0].args, Some(json!({"unit": "nomad"})));
    assert!(
        events[0].detail.as_ref().unwrap()["error"]
            .as_str()
            .unwrap()
            .contains("runners.hvn05.systemd_units"),
        "{events:?}"
    );

    // consul: two different approvers.
    let alice_pw = add_user(&app, "alice", Role::Approver).await;
    let bob_pw = add_user(&app, "bob", Role::Approver).await;
    let alice = Portal::login(&app, "alice", &alice_pw).await;
    let bob = Portal::login(&app, "bob", &bob_pw).await;
    let (_, listed) = alice.get("/api/approvals").await;
    assert_eq!(
        listed["approvals"],
        json!([]),
        "the nomad restart asked nobody"
    );
    let call = call_in_background(
        &client,
        "linux.systemctl_restart",
        restart_args("consul lost quorum on hvn05"),
    );
    let id = wait_for_pending(&alice).await;
    let path = format!("/api/approvals/{id}/approve");
    let (status, row) = alice.post(&path, json!({}), true).await;
    assert_eq!(status, 200, "{row}");
    assert_eq!(row["state"], "pending", "one of two: {row}");
    assert_eq!(row["required_approvals"], 2, "{row}");
    assert_eq!(row["approvals"].as_array().unwrap().len(), 1, "{row}");
    let (status, body) = alice.post(&path, json!({}), true).await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("you approved this already"),
        "{body}"
    );
    let (_, row) = bob.get(&format!("/api/approvals/{id}")).await;
    assert_eq!(row["state"], "pending", "{row}");
    assert_eq!(restarts(&record), 0, "one approval of two runs nothing");
    let (status, row) = bob.post(&path, json!({}), true).await;
    assert_eq!(status, 200, "{row}");
    // The deciding approval claims the request in the same transition.
    assert_eq!(row["state"], "executing", "{row}");
    let res = tokio::time::timeout(Duration::from_secs(20), call)
        .await
        .expect("the agent's call returns within 20 s of the second approval")
        .unwrap();
    assert_eq!(res.is_error, Some(false), "{res:?}");
    assert_eq!(
        res.structured_content.unwrap()["approval"]["state"],
        "executed"
    );
    assert_eq!(restarts(&record), 1);
    assert_eq!(
        kinds_and_actors(&app, &id).await,
        [
            ("tool.called".into(), "agent:test-agent".into()),
            ("approval.requested".into(), "agent:test-agent".into()),
            ("approval.approved".into(), "approver:alice".into()),
            ("approval.approved".into(), "approver:bob".into()),
            ("approval.executing".into(), "approver:bob".into()),
            ("call.executed".into(), "agent:test-agent".into()),
        ]
    );
    app.assert_chain_intact().await;
    client.cancel().await.unwrap();
}
both_backends!(the_policy_file_governs_the_server);

/// One human may hold a local user (`alice`) and a provider identity
/// (`person:alice@corp`): a request that needs two approvals does not take one of each, so
/// that human cannot count twice. A second local approver completes it.
async fn one_request_takes_its_approvals_from_one_kind_of_sign_in(backend: Backend) {
    let bin = tempfile::tempdir().unwrap();
    let record = systemctl_standin(bin.path());
    let policy_dir = tempfile::tempdir().unwrap();
    let policy = write(policy_dir.path(), "policy.yaml", POLICY);
    // People may sign in through a provider too (never reached here: the session below is
    // opened as a sign-in would open it).
    let oidc: emisar::server::oidc::config::OidcConfig = toml::from_str(
        "issuer = \"http://127.0.0.1:9/realms/ops\"\nclient_id = \"emisar\"\n\
         token_auth_method = \"none\"\n\
         redirect_url = \"http://127.0.0.1:9/login/oidc/callback\"\n",
    )
    .unwrap();
    let app = restart_app(
        backend,
        bin.path(),
        Options {
            policy_file: Some(policy),
            oidc: Some(oidc),
            ..Default::default()
        },
    )
    .await;
    let client = app.mcp_client().await;
    let alice_pw = add_user(&app, "alice", Role::Approver).await;
    let bob_pw = add_user(&app, "bob", Role::Approver).await;
    let alice = Portal::login(&app, "alice", &alice_pw).await;
    let bob = Portal::login(&app, "bob", &bob_pw).await;
    // The same human, signed in through the provider (a session as the sign-in opens it).
    let person = emisar::server::oidc::login::SignedInPerson {
        identity: "person:alice@corp".into(),
        issuer: "https://sso.example.com".into(),
        subject: "alice@corp".into(),
        display_name: "Alice".into(),
        roles: [emisar::server::oidc::config::PersonRole::Approver].into(),
        session_expires_at: chrono::Utc::now().timestamp() + 3600,
        provider_session: None,
        return_to: None,
        id_token: String::new(),
        claims: Default::default(),
    };
    let (session, id) = emisar::server::oidc::sessions::open(&app.db, &app.audit, &person)
        .await
        .unwrap();
    let alice_sso = Portal::with_session(
        app.base_url(),
        format!("emisar_session={id}"),
        session.csrf.clone(),
    );

    let call = call_in_background(
        &client,
        "linux.systemctl_restart",
        restart_args("consul lost quorum on hvn05"),
    );
    let id = wait_for_pending(&alice).await;
    let path = format!("/api/approvals/{id}/approve");
    let (status, row) = alice.post(&path, json!({}), true).await;
    assert_eq!(status, 200, "{row}");
    assert_eq!(row["state"], "pending", "one of two: {row}");
    let (status, body) = alice_sso.post(&path, json!({}), true).await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("one kind of sign-in"),
        "{body}"
    );
    let (_, row) = bob.get(&format!("/api/approvals/{id}")).await;
    assert_eq!(row["state"], "pending", "{row}");
    assert_eq!(row["approvals"].as_array().unwrap().len(), 1, "{row}");
    assert_eq!(
        restarts(&record),
        0,
        "one person's two identities ran a two-approval write"
    );
    let (status, row) = bob.post(&path, json!({}), true).await;
    assert_eq!(status, 200, "{row}");
    let res = tokio::time::timeout(Duration::from_secs(20), call)
        .await
        .expect("the agent's call returns within 20 s of the second approval")
        .unwrap();
    assert_eq!(res.is_error, Some(false), "{res:?}");
    assert_eq!(restarts(&record), 1);
    client.cancel().await.unwrap();
}
both_backends!(one_request_takes_its_approvals_from_one_kind_of_sign_in);

/// The names of the tools `token` is offered by the server at `base`.
async fn offered(base: &str, token: &str) -> Vec<String> {
    let client = mcp_client(&format!("{base}/mcp"), token).await;
    let names = client
        .list_all_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    client.cancel().await.unwrap();
    names
}

/// `emisar serve` reloads its policy file on SIGHUP: a good file is put in force and audited
/// with its new digest; a broken one is refused (audited too) and the previous one stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_policy_and_a_broken_file_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    emisar::protocol::signing::write_keypair(&d.join("server.key"), &d.join("server.pub")).unwrap();
    let policy = write(d, "policy.yaml", POLICY);
    let url = format!("sqlite://{}", d.join("emisar.db").display());
    let config = write(
        d,
        "emisar.toml",
        &format!(
            "listen = \"127.0.0.1:0\"\ndatabase_url = \"{url}\"\nsigning_key_file = \"{}\"\npolicy_file = \"{}\"\n",
            d.join("server.key").display(),
            policy.display()
        ),
    );
    let log = d.join("serve.log");
    let mut server = Proc(
        std::process::Command::new(BIN)
            .args(["serve", "--config", config.to_str().unwrap()])
            .env_remove("DATABASE_URL")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let base = format!(
        "http://{}",
        bound_addr(&mut server, &log, "emisar serving MCP").await
    );
    let shown_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !reqwest::get(format!("{base}/healthz"))
        .await
        .is_ok_and(|r| r.status().is_success())
    {
        assert!(
            Instant::now() < deadline,
            "emisar serve did not come up within 30 s:\n{}",
            shown_log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let db = emisar::server::db::Db::connect(&url).await.unwrap();
    let audit = emisar::server::audit::AuditLog::start(db.clone());
    let token = emisar::server::tokens::issue(
        &db,
        &audit,
        TEST_AGENT,
        Role::Agent,
        Duration::from_secs(3600),
        "test",
    )
    .await
    .unwrap()
    .token;
    let first = Policy::load(&policy).unwrap().digest();
    let loaded = policy_events(&db).await;
    assert_eq!(loaded.len(), 1, "{loaded:?}");
    assert_eq!(loaded[0].detail.as_ref().unwrap()["sha256"], first);
    assert!(
        !offered(&base, &token)
            .await
            .iter()
            .any(|n| n == "traefik.ping")
    );

    let hangup = |what: &str| {
        let status = std::process::Command::new("kill")
            .args(["-HUP", &server.0.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill -HUP ({what}) failed: {status}");
    };
    let nth_load = |n: usize| {
        let db = db.clone();
        async move {
            eventually(20, &format!("policy.loaded event #{n}"), || {
                let db = db.clone();
                async move {
                    let events = policy_events(&db).await;
                    events.get(n - 1).cloned()
                }
            })
            .await
        }
    };

    // A changed file: in force after SIGHUP, with its new digest on record.
    let widened = POLICY.replace("[\"linux.*\"]", "[\"linux.*\", \"traefik.*\"]");
    std::fs::write(&policy, &widened).unwrap();
    let second = Policy::load(&policy).unwrap().digest();
    assert_ne!(first, second);
    hangup("a good file");
    let event = nth_load(2).await;
    assert_eq!(event.outcome.as_deref(), Some("ok"), "{event:?}");
    assert_eq!(event.actor, "system:sighup");
    assert_eq!(
        event.detail.as_ref().unwrap()["sha256"],
        second,
        "{event:?}"
    );
    assert!(
        offered(&base, &token)
            .await
            .iter()
            .any(|n| n == "traefik.ping"),
        "the reloaded policy gives test-agent traefik"
    );

    // A broken file: refused, audited, and the policy in force does not change.
    std::fs::write(&policy, widened.replace("{tools:", "{tool:")).unwrap();
    hangup("a broken file");
    let event = nth_load(3).await;
    assert_eq!(event.outcome.as_deref(), Some("refused"), "{event:?}");
    let detail = event.detail.clone().unwrap();
    assert!(detail.get("sha256").is_none(), "{event:?}");
    let error = detail["error"].as_str().unwrap();
    assert!(
        error.contains(&policy.display().to_string())
            && error.contains("`agents.test-agent.tool`: unknown field `tool`"),
        "{error}"
    );
    // A file that parses but names a tool no pack has: refused by the check, and the
    // refusal names the file too.
    std::fs::write(&policy, widened.replace("\"traefik.*\"]", "\"trafik.*\"]")).unwrap();
    hangup("a file naming no loaded tool");
    let event = nth_load(4).await;
    assert_eq!(event.outcome.as_deref(), Some("refused"), "{event:?}");
    let error = event.detail.as_ref().unwrap()["error"].as_str().unwrap();
    assert!(
        error.contains(&format!("policy file {}", policy.display()))
            && error.contains("`agents.test-agent.tools[1]`: `trafik.*` matches no loaded tool"),
        "{error}"
    );
    let mut server = server;
    assert!(
        server.0.try_wait().unwrap().is_none(),
        "a broken policy file does not stop the server:\n{}",
        shown_log()
    );
    let names = offered(&base, &token).await;
    assert!(
        names.iter().any(|n| n == "traefik.ping") && !names.iter().any(|n| n.starts_with("nomad.")),
        "the previous policy stays in force: {names:?}"
    );
    let report = emisar::server::audit::verify(&db, None).await.unwrap();
    assert!(report.is_intact(), "{report:?}");
}

// ---- 4. Webhooks ----

/// A webhook receiver that records each body at once and answers only after `delay`.
#[derive(Clone)]
struct Receiver {
    bodies: Arc<Mutex<Vec<(String, Value)>>>,
    answered: Arc<AtomicUsize>,
    delay: Duration,
}

impl Receiver {
    async fn start(delay: Duration) -> (Receiver, String) {
        let receiver = Receiver {
            bodies: Arc::default(),
            answered: Arc::default(),
            delay,
        };
        let app = axum::Router::new()
            .route("/{hook}", axum::routing::post(receive))
            .with_state(receiver.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (receiver, base)
    }

    fn body(&self, hook: &str) -> Option<Value> {
        let bodies = self.bodies.lock().unwrap();
        bodies
            .iter()
            .find(|(h, _)| h == hook)
            .map(|(_, b)| b.clone())
    }
}

async fn receive(
    axum::extract::State(r): axum::extract::State<Receiver>,
    axum::extract::Path(hook): axum::extract::Path<String>,
    axum::Json(body): axum::Json<Value>,
) -> &'static str {
    r.bodies.lock().unwrap().push((hook, body));
    tokio::time::sleep(r.delay).await;
    r.answered.fetch_add(1, Ordering::SeqCst);
    "ok"
}

/// A new request reaches a generic hook and a Slack hook, with a link to the portal; a hook
/// that takes 3 s to answer does not hold up the agent's call or the request.
async fn webhooks_announce_requests_off_the_call_path(backend: Backend) {
    let bin = tempfile::tempdir().unwrap();
    systemctl_standin(bin.path());
    let (receiver, hooks) = Receiver::start(Duration::from_secs(3)).await;
    let public_url = "http://emisar.example.test:7700";
    let app = restart_app(
        backend,
        bin.path(),
        Options {
            webhooks: vec![
                WebhookConfig {
                    name: None,
                    url: format!("{hooks}/generic"),
                    kind: WebhookKind::Generic,
                },
                WebhookConfig {
                    name: None,
                    url: format!("{hooks}/slack"),
                    kind: WebhookKind::Slack,
                },
            ],
            public_url: Some(public_url.into()),
            // The call returns the request id at once instead of waiting for a decision.
            approval_wait_secs: Some(0),
            ..Default::default()
        },
    )
    .await;
    let auditor = app.issue_token("auditor", Role::Auditor).await;
    let client = app.mcp_client().await;
    let reason = "consul on hvn05 is wedged after the upgrade";

    let asked = Instant::now();
    let res = call(&client, "linux.systemctl_restart", restart_args(reason)).await;
    let took = asked.elapsed();
    assert_eq!(res.is_error, Some(false), "{res:?}");
    let out = res.structured_content.unwrap();
    assert_eq!(out["approval"]["state"], "pending", "{out}");
    let id = out["approval"]["approval_id"].as_str().unwrap().to_owned();
    let (status, row): (u16, Value) = {
        let res = reqwest::Client::new()
            .get(format!("{}/api/approvals/{id}", app.base_url()))
            .bearer_auth(&auditor)
            .send()
            .await
            .unwrap();
        (res.status().as_u16(), res.json().await.unwrap())
    };
    assert_eq!((status, &row["state"]), (200, &json!("pending")), "{row}");
    // Neither hook has answered yet: the call and the request did not wait for them.
    assert_eq!(
        receiver.answered.load(Ordering::SeqCst),
        0,
        "the call returned after {took:?}, but only once a hook had answered"
    );

    let (generic, slack) = eventually(10, "both hooks called", || async {
        Some((receiver.body("generic")?, receiver.body("slack")?))
    })
    .await;
    assert_eq!(generic["event"], "approval.requested", "{generic}");
    assert_eq!(generic["approval_id"], id.as_str(), "{generic}");
    assert_eq!(generic["tool"], "linux.systemctl_restart", "{generic}");
    assert_eq!(generic["runners"], json!(["hvn05"]), "{generic}");
    assert_eq!(generic["requester"], "agent:test-agent", "{generic}");
    assert_eq!(generic["reason"], reason, "{generic}");
    assert_eq!(generic["risk"], "high", "{generic}");
    // The portal's page routes `#/approvals/<id>` to the request.
    assert_eq!(
        generic["portal_url"],
        format!("{public_url}/#/approvals/{id}"),
        "{generic}"
    );
    let text = slack["text"].as_str().unwrap();
    assert!(
        text.contains("`linux.systemctl_restart`") && text.contains(&id) && text.contains(reason),
        "{slack}"
    );

    // Each hook was called once (no retry of a slow but successful answer).
    eventually(10, "both hooks answered", || async {
        (receiver.answered.load(Ordering::SeqCst) == 2).then_some(())
    })
    .await;
    assert_eq!(receiver.bodies.lock().unwrap().len(), 2);
    client.cancel().await.unwrap();
}
both_backends!(webhooks_announce_requests_off_the_call_path);

/// The policy's runner selector narrows what the agent sees (the `runners` enum of a tool's
/// schema) and what it may target.
async fn the_policy_selector_narrows_the_runners_an_agent_sees(backend: Backend) {
    let policy_dir = tempfile::tempdir().unwrap();
    let policy = write(
        policy_dir.path(),
        "policy.yaml",
        "agents:\n  test-agent: {tools: [\"linux.*\"], runners: \"role=edge\"}\n",
    );
    let app = spawn_app(
        backend,
        vec![
            RunnerSpec::new("edge-1").label("role", "edge"),
            RunnerSpec::new("core-1").label("role", "core"),
        ],
        Options {
            policy_file: Some(policy),
            ..Default::default()
        },
    )
    .await;
    let client = app.mcp_client().await;
    let tools = client.list_all_tools().await.unwrap();
    let uptime = tools.iter().find(|t| t.name == "linux.uptime").unwrap();
    assert_eq!(
        uptime.input_schema["properties"]["runners"]["items"]["enum"],
        json!(["edge-1"])
    );
    let res = call(
        &client,
        "linux.uptime",
        json!({"runners": ["core-1"], "reason": "how long up?"}),
    )
    .await;
    assert_eq!(res.is_error, Some(true), "{res:?}");
    let res = call(
        &client,
        "linux.uptime",
        json!({"runners": ["edge-1"], "reason": "how long up?"}),
    )
    .await;
    assert_eq!(res.is_error, Some(false), "{res:?}");
    client.cancel().await.unwrap();
}
both_backends!(the_policy_selector_narrows_the_runners_an_agent_sees);

/// `max_targets` bounds how many runners one yes can change: a write naming more is refused
/// before anyone is asked, with the policy line that says so; within it, people are asked.
/// Reads are not held to it.
async fn a_write_naming_more_runners_than_max_targets_asks_nobody(backend: Backend) {
    let policy_dir = tempfile::tempdir().unwrap();
    let policy = write(
        policy_dir.path(),
        "policy.yaml",
        "max_targets: {default: 1, \"testkit.*\": 2}\n",
    );
    let app = spawn_app(
        backend,
        vec![
            RunnerSpec::new("node-1"),
            RunnerSpec::new("node-2"),
            RunnerSpec::new("node-3"),
        ],
        Options {
            packs_dir: Some(crate::mcp_calls::fixtures_dir()),
            policy_file: Some(policy),
            ..Default::default()
        },
    )
    .await;
    let client = app.mcp_client().await;
    let touch = |runners: &[&str]| json!({"runners": runners, "reason": "mark the fleet", "path": "/tmp/emisar-max-targets"});

    let res = call(
        &client,
        "testkit.touch",
        touch(&["node-1", "node-2", "node-3"]),
    )
    .await;
    assert_eq!(res.is_error, Some(true), "{res:?}");
    let text = format!("{:?}", res.content);
    assert!(
        text.contains(
            "`testkit.touch` may change at most 2 runners in one request (`max_targets.\\\"testkit.*\\\"` in the policy); this one names 3"
        ),
        "{text}"
    );
    let events = kinds_of_tool(&app, "testkit.touch").await;
    let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, ["tool.rejected"], "nobody was asked: {events:?}");

    // Two runners: within the line, so the request waits for people.
    let pending = call_in_background(&client, "testkit.touch", touch(&["node-1", "node-2"]));
    eventually(
        20,
        "the request within max_targets waits for people",
        || async {
            let events = kinds_of_tool(&app, "testkit.touch").await;
            events
                .iter()
                .any(|e| e.kind == "approval.requested")
                .then_some(())
        },
    )
    .await;
    pending.abort();

    // A read on all three is not a change.
    let res = call(
        &client,
        "testkit.echo",
        json!({"runners": ["node-1", "node-2", "node-3"], "reason": "r", "word": "x"}),
    )
    .await;
    assert_eq!(res.is_error, Some(false), "{res:?}");
    client.cancel().await.unwrap();
}
both_backends!(a_write_naming_more_runners_than_max_targets_asks_nobody);
