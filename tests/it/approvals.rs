//! Governed writes, end to end over real HTTP: an agent's risk:high call waits in the
//! approval queue, people decide in the portal's API (session cookie + CSRF) or with their
//! API token, and the runner executes exactly once under the approval id.

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use emisar::protocol::signing::{CallClaims, CallSigner, ISSUER, Purpose, now};
use emisar::protocol::{CallRequest, Mode};
use emisar::server::audit::AuditFilter;
use emisar::server::principal::Role;
use rmcp::model::{CallToolRequestParams, CallToolResult};
use serde_json::{Value, json};

use crate::harness::app::{Options, TestApp};
use crate::harness::{Backend, Build, RunnerSpec, spawn_app};
use crate::{both_backends, both_backends_every_build};
use emisar::lab::clock::LabClock;
use emisar::lab::http::serve;
use emisar::lab::scenario;

/// A fake `systemctl` that records its argv, one call per line, and answers as systemd does for
/// a node whose units are all loaded and running: `show -p A,B -- UNIT` prints the properties
/// asked for (`ActiveState,SubState,MainPID` without `-p`), `list-dependencies --reverse
/// --plain` prints the unit, then each dependent two spaces in, as systemd 252 does (every unit
/// is wanted by multi-user.target, which graphical.target requires), `restart` succeeds, and
/// `reload` succeeds unless the unit cannot reload (see [`systemctl_cannot_reload`]), when it
/// fails with systemctl's own message and `show` says `CanReload=no`.
pub(crate) fn systemctl_standin(dir: &std::path::Path) -> std::path::PathBuf {
    let record = dir.join("systemctl.argv");
    let no_reload = dir.join("systemctl.no-reload");
    let script = format!(
        r#"#!/bin/sh
printf '%s\n' "$*" >> '{record}'
verb=$1
props=ActiveState,SubState,MainPID
for unit; do :; done
while [ $# -gt 0 ]; do
  case "$1" in
    -p) props=$2; shift ;;
  esac
  shift
done
case "$unit" in *.*) ;; *) unit="$unit.service" ;; esac
can_reload=yes
if [ -f '{no_reload}' ] && grep -qxF "$unit" '{no_reload}'; then can_reload=no; fi
case "$verb" in
  show)
    for p in $(printf '%s' "$props" | tr ',' ' '); do
      case "$p" in
        Id) v=$unit ;;
        LoadState) v=loaded ;;
        ActiveState) v=active ;;
        SubState) v=running ;;
        Result) v=success ;;
        MainPID) v=4242 ;;
        NRestarts) v=0 ;;
        CanReload) v=$can_reload ;;
        ActiveEnterTimestamp) v='Sun 2026-12-06 09:00:00 UTC' ;;
        *) continue ;;
      esac
      printf '%s=%s\n' "$p" "$v"
    done ;;
  list-dependencies)
    printf '%s\n  multi-user.target\n  graphical.target\n' "$unit" ;;
  reload)
    if [ "$can_reload" = no ]; then
      echo "Failed to reload $unit: Job type reload is not applicable for unit $unit." >&2
      exit 1
    fi ;;
esac
exit 0
"#,
        record = record.display(),
        no_reload = no_reload.display(),
    );
    let path = dir.join("systemctl");
    std::fs::write(&path, script).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    record
}

/// Makes the [`systemctl_standin`] in `dir` treat `unit` (a full name, e.g. `cron.service`) as a
/// unit without `ExecReload=`: `CanReload=no`, and `reload` refused.
pub(crate) fn systemctl_cannot_reload(dir: &std::path::Path, unit: &str) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("systemctl.no-reload"))
        .unwrap();
    writeln!(f, "{unit}").unwrap();
}

pub(crate) fn restarts(record: &std::path::Path) -> usize {
    std::fs::read_to_string(record)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("restart "))
        .count()
}

/// A person logged in to the portal: their cookie and CSRF token.
pub struct Portal {
    pub base: String,
    pub cookie: String,
    pub csrf: String,
    http: reqwest::Client,
}

pub async fn add_user(app: &TestApp, name: &str, role: Role) -> String {
    let password = format!("{name}-correct-horse-battery");
    emisar::server::users::add(&app.db, &app.audit, name, role, &password, "test")
        .await
        .unwrap();
    password
}

/// A new person with `role`, logged in to the portal.
pub(crate) async fn signed_in(app: &TestApp, name: &str, role: Role) -> Portal {
    let password = add_user(app, name, role).await;
    Portal::login(app, name, &password).await
}

impl Portal {
    /// A portal session opened some other way (e.g. a sign-in through an OpenID provider).
    pub fn with_session(base: String, cookie: String, csrf: String) -> Portal {
        Portal {
            base,
            cookie,
            csrf,
            http: reqwest::Client::new(),
        }
    }

    pub async fn login(app: &TestApp, name: &str, password: &str) -> Portal {
        Portal::login_at(&app.base_url(), name, password).await
    }

    /// Logs in to the portal at `base` (its URL without the trailing slash).
    pub async fn login_at(base: &str, name: &str, password: &str) -> Portal {
        let http = reqwest::Client::new();
        let base = base.to_owned();
        let res = http
            .post(format!("{base}/api/login"))
            .json(&json!({"name": name, "password": password}))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
        let set_cookie = res.headers()["set-cookie"].to_str().unwrap().to_owned();
        for attr in ["HttpOnly", "SameSite=Strict", "Path=/"] {
            assert!(set_cookie.contains(attr), "{set_cookie}");
        }
        let cookie = set_cookie.split(';').next().unwrap().to_owned();
        let body: Value = res.json().await.unwrap();
        Portal {
            base,
            cookie,
            csrf: body["csrf"].as_str().unwrap().to_owned(),
            http,
        }
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        let res = self
            .http
            .get(format!("{}{path}", self.base))
            .header("cookie", &self.cookie)
            .send()
            .await
            .unwrap();
        (res.status().as_u16(), res.json().await.unwrap())
    }

    /// A POST as the page makes it: cookie, and the CSRF token unless `csrf` is false.
    pub async fn post(&self, path: &str, body: Value, csrf: bool) -> (u16, Value) {
        let mut req = self
            .http
            .post(format!("{}{path}", self.base))
            .header("cookie", &self.cookie)
            .json(&body);
        if csrf {
            req = req.header("x-csrf-token", &self.csrf);
        }
        let res = req.send().await.unwrap();
        (res.status().as_u16(), res.json().await.unwrap())
    }

    /// Approves request `id` as the page does (with the CSRF token).
    pub async fn approve(&self, id: &str) -> (u16, Value) {
        self.post(&format!("/api/approvals/{id}/approve"), json!({}), true)
            .await
    }

    /// Denies request `id` with `note`, as the page does (with the CSRF token).
    pub async fn deny(&self, id: &str, note: &str) -> (u16, Value) {
        self.post(
            &format!("/api/approvals/{id}/deny"),
            json!({"note": note}),
            true,
        )
        .await
    }

    /// Opens the server-sent event stream of approval changes.
    pub async fn events(&self) -> reqwest::Response {
        let res = self
            .http
            .get(format!("{}/api/events", self.base))
            .header("cookie", &self.cookie)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
        res
    }
}

/// Reads server-sent events until one of kind `approval` arrives, within 20 s in all (the
/// stream's keep-alives do not extend it).
async fn next_approval_event(stream: &mut reqwest::Response, buf: &mut String) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(end) = buf.find("\n\n") {
            let frame: String = buf.drain(..end + 2).collect();
            if frame.lines().any(|l| l == "event: approval") {
                let data = frame
                    .lines()
                    .find_map(|l| l.strip_prefix("data: "))
                    .unwrap();
                return serde_json::from_str(data).unwrap();
            }
            continue;
        }
        let chunk = tokio::time::timeout_at(deadline, stream.chunk())
            .await
            .expect("an approval event within 20 s")
            .unwrap()
            .expect("the stream stays open");
        buf.push_str(&String::from_utf8_lossy(&chunk));
    }
}

/// The result of a call started with [`call_in_background`], within 20 s.
pub(crate) async fn finished(call: tokio::task::JoinHandle<CallToolResult>) -> CallToolResult {
    tokio::time::timeout(Duration::from_secs(20), call)
        .await
        .expect("the call returns within 20 s")
        .unwrap()
}

/// Starts an MCP call in the background; the handle yields its result.
pub(crate) fn call_in_background(
    client: &rmcp::service::RunningService<rmcp::RoleClient, ()>,
    tool: &str,
    args: Value,
) -> tokio::task::JoinHandle<CallToolResult> {
    let peer = client.peer().clone();
    let params = CallToolRequestParams::new(tool.to_owned())
        .with_arguments(args.as_object().unwrap().clone());
    tokio::spawn(async move { peer.call_tool(params).await.expect("the call completes") })
}

pub(crate) async fn pending_ids(p: &Portal) -> Vec<String> {
    let (status, body) = p.get("/api/approvals?state=pending").await;
    assert_eq!(status, 200, "{body}");
    body["approvals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["id"].as_str().unwrap().to_owned())
        .collect()
}

pub(crate) async fn wait_for_pending(p: &Portal) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(id) = pending_ids(p).await.into_iter().next() {
            return id;
        }
        assert!(Instant::now() < deadline, "no pending request appeared");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub(crate) async fn kinds_and_actors(app: &TestApp, approval_id: &str) -> Vec<(String, String)> {
    app.events(AuditFilter {
        approval_id: Some(approval_id.into()),
        ..Default::default()
    })
    .await
    .into_iter()
    .map(|e| (e.kind, e.actor))
    .collect()
}

/// The kinds of the audit events about one approval, in order.
pub(crate) async fn kinds_of(app: &TestApp, approval_id: &str) -> Vec<String> {
    kinds_and_actors(app, approval_id)
        .await
        .into_iter()
        .map(|(k, _)| k)
        .collect()
}

pub(crate) async fn restart_app(
    backend: Backend,
    bin: &std::path::Path,
    options: Options,
) -> TestApp {
    spawn_app(
        backend,
        vec![
            RunnerSpec::new("hvn05")
                .path_first(bin)
                .allow("systemd_units", &["consul", "nomad"]),
        ],
        options,
    )
    .await
}

/// A [`restart_app`] with its stand-in `systemctl` in a folder of its own: the folder (keep
/// it for as long as the app runs), the stand-in's record of what it was asked, the app.
pub(crate) async fn restart_lab(
    backend: Backend,
    options: Options,
) -> (tempfile::TempDir, std::path::PathBuf, TestApp) {
    let bin = tempfile::tempdir().unwrap();
    let record = systemctl_standin(bin.path());
    let app = restart_app(backend, bin.path(), options).await;
    (bin, record, app)
}

pub(crate) fn restart_args(reason: &str) -> Value {
    json!({"unit": "consul", "runners": ["hvn05"], "reason": reason})
}

/// Request → live in the portal → approved → executed once → result to the
/// agent; the audit log names everyone and verifies.
async fn approved_restart_runs_once_and_returns_its_result(backend: Backend, build: Build) {
    let bin = tempfile::tempdir().unwrap();
    let record = systemctl_standin(bin.path());
    let options = Options {
        build,
        ..Default::default()
    };
    let app = restart_app(backend, bin.path(), options).await;
    let password = add_user(&app, "alice", Role::Approver).await;
    let alice = Portal::login(&app, "alice", &password).await;
    let mut events = alice.events().await;
    let mut buf = String::new();

    let client = app.mcp_client().await;
    let call = call_in_background(
        &client,
        "linux.systemctl_restart",
        restart_args("consul on hvn05 is wedged after the upgrade"),
    );
    // The event arrives on the portal's open stream (no reload); how fast is measured in
    // scripts/bench, and `next_approval_event` bounds only liveness.
    let event = next_approval_event(&mut events, &mut buf).await;
    assert_eq!(event["state"], "pending", "{event}");
    let id = event["id"].as_str().unwrap().to_owned();

    let (status, request) = alice.get(&format!("/api/approvals/{id}")).await;
    assert_eq!(status, 200);
    assert_eq!(request["tool"], "linux.systemctl_restart");
    assert_eq!(request["args"], json!({"unit": "consul"}));
    assert_eq!(request["runners"], json!(["hvn05"]));
    assert_eq!(request["requester"], "agent:test-agent");
    assert_eq!(
        request["reason"],
        "consul on hvn05 is wedged after the upgrade"
    );
    assert!(
        request["tool_description"]
            .as_str()
            .unwrap()
            .contains("systemd")
    );
    assert_eq!(restarts(&record), 0, "nothing runs before approval");

    let (status, body) = alice.approve(&id).await;
    assert_eq!(status, 200, "{body}");
    let res = finished(call).await;
    assert_eq!(res.is_error, Some(false), "{res:?}");
    let out = res.structured_content.unwrap();
    assert_eq!(out["approval"]["state"], "executed", "{out}");
    assert_eq!(out["results"][0]["runner"], "hvn05");
    assert_eq!(
        out["results"][0]["output"]["state_after"]["ActiveState"],
        "active"
    );
    assert_eq!(restarts(&record), 1);

    let trail = kinds_and_actors(&app, &id).await;
    assert_eq!(
        trail,
        [
            ("tool.called".into(), "agent:test-agent".into()),
            ("approval.requested".into(), "agent:test-agent".into()),
            ("approval.approved".into(), "approver:alice".into()),
            ("approval.executing".into(), "approver:alice".into()),
            ("call.executed".into(), "agent:test-agent".into()),
        ]
    );
    // The deciding approval claimed the request in the same transition: its two events are
    // one audit batch (consecutive, one `at`), one commit, not two in sequence between the
    // click and the runner call.
    let trail = app
        .events(AuditFilter {
            approval_id: Some(id.clone()),
            ..Default::default()
        })
        .await;
    let (approved, executing) = (&trail[2], &trail[3]);
    assert_eq!(executing.seq, approved.seq + 1, "{trail:?}");
    assert_eq!(executing.at, approved.at, "one batch: {trail:?}");
    // The same trail as an auditor's export from the portal: NDJSON, one event per line.
    let export = reqwest::Client::new()
        .get(format!("{}/api/audit/export?approval_id={id}", alice.base))
        .header("cookie", &alice.cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(export.status(), 200);
    assert!(
        export.headers()["content-disposition"]
            .to_str()
            .unwrap()
            .starts_with("attachment")
    );
    let lines: Vec<Value> = export
        .text()
        .await
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let kinds: Vec<&str> = lines.iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "tool.called",
            "approval.requested",
            "approval.approved",
            "approval.executing",
            "call.executed"
        ]
    );
    let (_, done) = alice.get(&format!("/api/approvals/{id}")).await;
    assert_eq!(done["state"], "executed");
    assert_eq!(done["approvals"][0]["user"], "alice");
    // A second approval of a used request is refused, and nothing runs again.
    let (status, body) = alice.approve(&id).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(restarts(&record), 1);
    app.verify_with_cli();
    client.cancel().await.unwrap();
}
both_backends_every_build!(approved_restart_runs_once_and_returns_its_result);

/// A denial's note reaches the agent; nothing executes.
async fn denied_request_tells_the_agent_why(backend: Backend) {
    let bin = tempfile::tempdir().unwrap();
    let record = systemctl_standin(bin.path());
    let app = restart_app(backend, bin.path(), Options::default()).await;
    let password = add_user(&app, "bob", Role::Approver).await;
    let bob = Portal::login(&app, "bob", &password).await;
    let client = app.mcp_client().await;
    let call = call_in_background(
        &client,
        "linux.systemctl_restart",
        restart_args("restart it"),
    );
    let id = wait_for_pending(&bob).await;

    let (status, body) = bob
        .post(
            &format!("/api/approvals/{id}/deny"),
            json!({"note": ""}),
            true,
        )
        .await;
    assert_eq!(status, 403, "a denial needs a note: {body}");
    let (status, body) = bob
        .post(
            &format!("/api/approvals/{id}/deny"),
            json!({"note": "not during the change freeze; page the consul owner"}),
            true,
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let res = finished(call).await;
    assert_eq!(res.is_error, Some(true));
    let text = format!("{:?}", res.content);
    assert!(text.contains("denied by approver:bob"), "{text}");
    assert!(
        text.contains("not during the change freeze; page the consul owner"),
        "{text}"
    );
    assert_eq!(restarts(&record), 0);
    let trail = kinds_and_actors(&app, &id).await;
    assert_eq!(
        trail,
        [
            ("tool.called".into(), "agent:test-agent".into()),
            ("approval.requested".into(), "agent:test-agent".into()),
            ("approval.denied".into(), "approver:bob".into()),
        ]
    );
    app.assert_chain_intact().await;
    client.cancel().await.unwrap();
}
both_backends!(denied_request_tells_the_agent_why);

/// Runs the `emisar` binary with `args` without blocking the runtime the server runs on,
/// with no server or token from the environment; its exit status and stdout.
async fn emisar_cli(args: &[&str]) -> (bool, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_emisar"))
        .args(args)
        .env_remove("EMISAR_SERVER")
        .env_remove("EMISAR_TOKEN")
        .env_remove("DATABASE_URL")
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "emisar {args:?}: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), stdout)
}

/// Why someone said yes is what an auditor asks: a note given on approve (here with
/// `emisar approvals approve --note`) is kept in the stored request, in the
/// `approval.approved` event, in `emisar approvals show`, in the portal's API and in the
/// audit export, from the portal and from the CLI.
async fn an_approvers_note_is_kept_everywhere(backend: Backend) {
    const NOTE: &str = "checked the preview; consul on hvn05 is stuck since 09:12";
    let (_bin, record, app) = restart_lab(backend, Options::default()).await;
    let alice = app.issue_token("alice", Role::Approver).await;
    let auditor = app.issue_token("audrey", Role::Auditor).await;
    let ann = signed_in(&app, "ann", Role::Auditor).await;
    let base = app.base_url();
    let client = app.mcp_client().await;
    let call = call_in_background(
        &client,
        "linux.systemctl_restart",
        restart_args("consul is wedged"),
    );
    let id = wait_for_pending(&ann).await;

    let (_, said) = emisar_cli(&[
        "approvals",
        "approve",
        &id,
        "--note",
        NOTE,
        "--server",
        &base,
        "--token",
        &alice,
    ])
    .await;
    assert!(said.contains("approved"), "{said}");
    let res = finished(call).await;
    assert_eq!(res.is_error, Some(false), "{res:?}");
    assert_eq!(restarts(&record), 1);

    // The stored request, as a new store reads it back from the database.
    let stop = tokio_util::sync::CancellationToken::new();
    let store =
        emisar::server::approvals::Approvals::new(app.db.clone(), app.audit.clone(), stop.clone());
    let stored = store.get(&id).await.unwrap();
    stop.cancel();
    assert_eq!(stored.votes[0].note.as_deref(), Some(NOTE), "{stored:?}");
    // `emisar approvals show`.
    let (_, shown) = emisar_cli(&[
        "approvals",
        "show",
        &id,
        "--server",
        &base,
        "--token",
        &alice,
    ])
    .await;
    let shown: Value = serde_json::from_str(&shown).unwrap();
    assert_eq!(shown["approvals"][0]["user"], "alice", "{shown}");
    assert_eq!(shown["approvals"][0]["note"], NOTE, "{shown}");
    // The portal's API, which the approval page renders (web/app.js, `#approvers`).
    let (status, page) = ann.get(&format!("/api/approvals/{id}")).await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["approvals"][0]["note"], NOTE, "{page}");
    let (_, listed) = ann.get("/api/approvals?state=executed").await;
    assert_eq!(
        listed["approvals"][0]["approvals"][0]["note"], NOTE,
        "{listed}"
    );
    // The `approval.approved` event.
    let approved: Vec<Value> = app
        .events(AuditFilter {
            approval_id: Some(id.clone()),
            kind: Some("approval.approved".into()),
            ..Default::default()
        })
        .await
        .into_iter()
        .map(|e| e.detail.unwrap())
        .collect();
    assert_eq!(approved.len(), 1);
    assert_eq!(approved[0]["note"], NOTE, "{approved:?}");
    // The portal's audit export…
    let export = app
        .http()
        .get(format!("{base}/api/audit/export?approval_id={id}"))
        .header("cookie", &ann.cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(export.status(), 200);
    let text = export.text().await.unwrap();
    let line: Value = text
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|e| e["kind"] == "approval.approved")
        .unwrap_or_else(|| panic!("no approval.approved in the export: {text}"));
    assert_eq!(line["detail"]["note"], NOTE, "{line}");
    // …and the CLI's, from the server with an auditor's token and from the database.
    let (_, jsonl) = emisar_cli(&[
        "audit",
        "export",
        "--approval-id",
        &id,
        "--kind",
        "approval.approved",
        "--server",
        &base,
        "--token",
        &auditor,
    ])
    .await;
    let line: Value = serde_json::from_str(jsonl.trim()).unwrap();
    assert_eq!(line["detail"]["note"], NOTE, "{jsonl}");
    let (_, csv) = emisar_cli(&[
        "audit",
        "export",
        "--approval-id",
        &id,
        "--kind",
        "approval.approved",
        "--format",
        "csv",
        "--database",
        &app.database_url,
    ])
    .await;
    assert!(csv.contains(NOTE), "{csv}");
    app.assert_chain_intact().await;
    client.cancel().await.unwrap();
}
both_backends!(an_approvers_note_is_kept_everywhere);

/// Every way to get a write without a fresh, matching human approval fails.
async fn approvals_refuse_what_they_should(backend: Backend) {
    let bin = tempfile::tempdir().unwrap();
    let record = systemctl_standin(bin.path());
    let app = spawn_app(
        backend,
        vec![
            RunnerSpec::new("hvn05")
                .path_first(bin.path())
                .allow("systemd_units", &["consul", "nomad"]),
            RunnerSpec::new("hvn06")
                .path_first(bin.path())
                .allow("systemd_units", &["consul", "nomad"]),
        ],
        Options {
            approval_wait_secs: Some(1),
            ..Default::default()
        },
    )
    .await;
    let client = app.mcp_client().await;

    // The requester approving their own request: a person with the agent's name.
    let password = add_user(&app, crate::harness::app::TEST_AGENT, Role::Approver).await;
    let me = Portal::login(&app, crate::harness::app::TEST_AGENT, &password).await;
    let password = add_user(&app, "carol", Role::Approver).await;
    let carol = Portal::login(&app, "carol", &password).await;
    let password = add_user(&app, "dave", Role::Auditor).await;
    let dave = Portal::login(&app, "dave", &password).await;
    let res = crate::mcp_calls::call(&client, "linux.systemctl_restart", restart_args("one")).await;
    let id = res.structured_content.unwrap()["approval"]["approval_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (status, body) = me.approve(&id).await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("requested this yourself"),
        "{body}"
    );
    // Each refusal carries its code from docs/api.md's table, to branch on.
    assert_eq!(body["code"], "forbidden", "{body}");
    // An auditor reads but does not decide.
    let (status, body) = dave.approve(&id).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["code"], "forbidden", "{body}");
    // A cookie without the CSRF token changes nothing.
    let (status, body) = carol
        .post(&format!("/api/approvals/{id}/approve"), json!({}), false)
        .await;
    assert_eq!(status, 403, "{body}");
    assert!(body["error"].as_str().unwrap().contains("CSRF"), "{body}");
    assert_eq!(body["code"], "csrf_required", "{body}");
    let (_, still) = carol.get(&format!("/api/approvals/{id}")).await;
    assert_eq!(still["state"], "pending");
    assert_eq!(still["approvals"], json!([]));

    // After expiry: refused, and the sweeper records the expiry.
    let past = emisar::server::audit::format_at(chrono::Utc::now() - chrono::Duration::seconds(1));
    emisar::with_pool!(&app.db, pool => sqlx::query(app.db.sql("UPDATE approvals SET expires_at = $1::timestamptz WHERE id = $2"))
        .bind(&past).bind(&id).execute(pool).await.map(|_| ())).unwrap();
    let (status, body) = carol.approve(&id).await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("expired"),
        "{body}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, row) = carol.get(&format!("/api/approvals/{id}")).await;
        if row["state"] == "expired" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the sweeper did not expire {id}: {row}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The agent asking again learns it expired.
    let res = crate::mcp_calls::call(
        &client,
        "emisar.approval_status",
        json!({"approval_id": id, "reason": "did anyone look?"}),
    )
    .await;
    assert_eq!(res.is_error, Some(true));
    assert!(format!("{:?}", res.content).contains("expired"));
    assert_eq!(restarts(&record), 0);

    // The runner side, with calls signed as the server signs them.
    let signer = CallSigner::from_file(&app.private_key).unwrap();
    let packs = emisar::pack::PackSet::load(None).unwrap();
    let pack_sha256 = packs.pack("linux").unwrap().digest.clone();
    let request = |unit: &str| CallRequest {
        tool: "linux.systemctl_restart".into(),
        args: json!({"unit": unit}).as_object().unwrap().clone(),
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
    let claims = |aud: &str, req: &CallRequest, approval: Option<&str>| {
        let t = now();
        CallClaims {
            iss: ISSUER.into(),
            aud: aud.into(),
            iat: t,
            exp: t + 30,
            purpose: Purpose::Call,
            jti: uuid::Uuid::new_v4().to_string(),
            call_id: "c".into(),
            tool: req.tool.clone(),
            request_sha256: req.digest(),
            pack_sha256: pack_sha256.clone(),
            approval_id: approval.map(str::to_owned),
            lowered_by_policy: None,
        }
    };
    let http = reqwest::Client::new();
    let post = |token: String, body: CallRequest| {
        let http = http.clone();
        let url = format!("{}/v1/call", app.runner_urls["hvn05"]);
        async move {
            let res = http
                .post(url)
                .bearer_auth(token)
                .json(&body)
                .send()
                .await
                .unwrap();
            let status = res.status().as_u16();
            (status, res.json::<Value>().await.unwrap())
        }
    };
    let approval = uuid::Uuid::new_v4().to_string();
    // No approval id: a risk:high execution is refused.
    let (status, body) = post(
        signer
            .sign(&claims("hvn05", &request("consul"), None))
            .unwrap(),
        request("consul"),
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("approval"),
        "{body}"
    );
    // A token for another runner.
    let (status, body) = post(
        signer
            .sign(&claims("hvn06", &request("consul"), Some(&approval)))
            .unwrap(),
        request("consul"),
    )
    .await;
    assert_eq!(status, 401, "{body}");
    // An argument changed after signing (the approval was for consul, the body says nomad).
    let (status, body) = post(
        signer
            .sign(&claims("hvn05", &request("consul"), Some(&approval)))
            .unwrap(),
        request("nomad"),
    )
    .await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(restarts(&record), 0);
    // The approved call runs once ...
    let token = signer
        .sign(&claims("hvn05", &request("consul"), Some(&approval)))
        .unwrap();
    let (status, body) = post(token.clone(), request("consul")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(restarts(&record), 1);
    // ... its token replayed is refused, and so is a fresh token under the same approval.
    let (status, body) = post(token, request("consul")).await;
    assert_eq!(status, 409, "{body}");
    let (status, body) = post(
        signer
            .sign(&claims("hvn05", &request("consul"), Some(&approval)))
            .unwrap(),
        request("consul"),
    )
    .await;
    assert_eq!(status, 409, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("already executed"),
        "{body}"
    );
    assert_eq!(restarts(&record), 1);
    app.assert_chain_intact().await;
    client.cancel().await.unwrap();
}
both_backends!(approvals_refuse_what_they_should);

/// The approver sees Nomad's plan diff; a job that moved between request and
/// approval is not written, and the request ends `failed` saying why.
async fn nomad_resize_shows_the_plan_and_refuses_a_moved_job(backend: Backend) {
    // Lab time at 30× real: the resize's gate waits for Nomad's rolling update (30 s a node
    // in the lab's job), which then takes a few seconds.
    let clock = LabClock::new(30.0).unwrap();
    let nomad = scenario::nomad("nomad-secret", std::sync::Arc::new(clock));
    // The lab's one broken node (its Consul not ready) would hold the new allocation there,
    // and the resize's gate with it: this test is about the preview and the check-and-set.
    nomad.consul_ready("nomad-hvn05");
    let url = serve(nomad.clone().router()).await;
    let app = spawn_app(
        backend,
        vec![RunnerSpec::new("hvn01").service_with_header(
            "nomad",
            &url,
            "X-Nomad-Token",
            "nomad-secret",
        )],
        Options::default(),
    )
    .await;
    let password = add_user(&app, "alice", Role::Approver).await;
    let alice = Portal::login(&app, "alice", &password).await;
    let client = app.mcp_client().await;
    let args = json!({"job": "traefik", "group": "traefik", "task": "traefik", "memory": 4096,
                      "reason": "Traefik OOM-looping at the 1 GiB cap; raise to 4 GiB"});

    let call = call_in_background(&client, "nomad.task_resources_set", args.clone());
    let id = wait_for_pending(&alice).await;
    let (_, request) = alice.get(&format!("/api/approvals/{id}")).await;
    let preview = &request["preview"]["hvn01"]["output"];
    assert_eq!(
        preview["change"]["memory_mib"],
        json!({"from": 1024, "to": 4096}),
        "{request}"
    );
    assert!(
        preview["diff"]
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d == "MemoryMB 1024 → 4096"),
        "{preview}"
    );
    assert_eq!(
        nomad.job("traefik")["JobModifyIndex"],
        93,
        "the preview writes nothing"
    );
    let (status, body) = alice.approve(&id).await;
    assert_eq!(status, 200, "{body}");
    let res = finished(call).await;
    assert_eq!(res.is_error, Some(false), "{res:?}");
    let job = nomad.job("traefik");
    assert_eq!(
        job["TaskGroups"][0]["Tasks"][0]["Resources"]["MemoryMB"],
        4096
    );

    // Again, but the job moves while the request waits.
    let call = call_in_background(
        &client,
        "nomad.task_resources_set",
        json!({"job": "traefik", "group": "traefik", "task": "traefik", "memory": 8192, "reason": "more"}),
    );
    let id = wait_for_pending(&alice).await;
    let (_, request) = alice.get(&format!("/api/approvals/{id}")).await;
    let seen = request["preview"]["hvn01"]["vars"]["job_modify_index"]
        .as_u64()
        .unwrap();
    let moved = nomad.bump_job("traefik");
    let (status, body) = alice.approve(&id).await;
    assert_eq!(status, 200, "{body}");
    let res = finished(call).await;
    assert_eq!(res.is_error, Some(true), "{res:?}");
    let (_, done) = alice.get(&format!("/api/approvals/{id}")).await;
    assert_eq!(done["state"], "failed", "{done}");
    let note = done["outcome_note"].as_str().unwrap();
    assert!(
        note.contains(&format!("JobModifyIndex {seen} → {moved}")),
        "{note}"
    );
    // The same note under its old name, kept for one release.
    assert_eq!(done["note"], done["outcome_note"], "{done}");
    assert_eq!(
        nomad.job("traefik")["TaskGroups"][0]["Tasks"][0]["Resources"]["MemoryMB"],
        4096,
        "nothing was written over the moved job"
    );
    app.assert_chain_intact().await;
    client.cancel().await.unwrap();
}
both_backends!(nomad_resize_shows_the_plan_and_refuses_a_moved_job);

/// Two replicas on one PostgreSQL, two approvers clicking at once on the
/// same request (one through each replica): one execution.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_two_approvers_one_execution() {
    let bin = tempfile::tempdir().unwrap();
    let record = systemctl_standin(bin.path());
    let a = restart_app(Backend::Postgres, bin.path(), Options::default()).await;
    // The second replica: same database, same signing key, its own runner process for the
    // same node name (both record into the same file, so a second execution would show).
    let b = restart_app(
        Backend::Postgres,
        bin.path(),
        Options {
            database_url: Some(a.database_url.clone()),
            keys: Some((a.private_key.clone(), a.public_key.clone())),
            ..Default::default()
        },
    )
    .await;
    let pa = add_user(&a, "alice", Role::Approver).await;
    let pb = add_user(&a, "bob", Role::Approver).await;
    let alice = Portal::login(&a, "alice", &pa).await;
    let bob = Portal::login(&b, "bob", &pb).await;
    // Bob watches replica B; the request is made through replica A.
    let mut events = bob.events().await;
    let mut buf = String::new();
    let client = a.mcp_client().await;
    let call = call_in_background(
        &client,
        "linux.systemctl_restart",
        restart_args("both click"),
    );
    let event = next_approval_event(&mut events, &mut buf).await;
    let id = event["id"].as_str().unwrap().to_owned();

    let path = format!("/api/approvals/{id}/approve");
    let (ra, rb) = tokio::join!(
        alice.post(&path, json!({}), true),
        bob.post(&path, json!({}), true)
    );
    let mut statuses = [ra.0, rb.0];
    statuses.sort();
    assert_eq!(statuses, [200, 409], "{ra:?} {rb:?}");
    let res = finished(call).await;
    assert_eq!(res.is_error, Some(false), "{res:?}");
    // Give a (wrong) second execution time to show up.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(restarts(&record), 1);
    let kinds = kinds_of(&a, &id).await;
    assert_eq!(
        kinds,
        [
            "tool.called",
            "approval.requested",
            "approval.approved",
            "approval.executing",
            "call.executed"
        ]
    );
    a.assert_chain_intact().await;
    client.cancel().await.unwrap();
}

/// Every change made on one replica reaches the portal stream of another at once, through
/// PostgreSQL's NOTIFY (the stream has no polling): the request created through replica A,
/// and its approval there, the claim and the outcome, all appear on replica B's stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_on_one_replica_reaches_the_other_replicas_stream() {
    let bin = tempfile::tempdir().unwrap();
    let record = systemctl_standin(bin.path());
    let a = restart_app(Backend::Postgres, bin.path(), Options::default()).await;
    let b = restart_app(
        Backend::Postgres,
        bin.path(),
        Options {
            database_url: Some(a.database_url.clone()),
            keys: Some((a.private_key.clone(), a.public_key.clone())),
            ..Default::default()
        },
    )
    .await;
    let pa = add_user(&a, "alice", Role::Approver).await;
    let pb = add_user(&a, "bob", Role::Approver).await;
    let alice = Portal::login(&a, "alice", &pa).await;
    let bob = Portal::login(&b, "bob", &pb).await;
    let mut events = bob.events().await;
    let mut buf = String::new();
    let client = a.mcp_client().await;
    let call = call_in_background(
        &client,
        "linux.systemctl_restart",
        restart_args("seen from the other replica"),
    );
    let event = next_approval_event(&mut events, &mut buf).await;
    assert_eq!(event["state"], "pending", "{event}");
    let id = event["id"].as_str().unwrap().to_owned();
    let (status, body) = alice.approve(&id).await;
    assert_eq!(status, 200, "{body}");
    // The stream's keep-alives reset `next_approval_event`'s own timeout: bound the whole.
    let states = tokio::time::timeout(Duration::from_secs(20), async {
        let mut states = Vec::new();
        while states.last().map(String::as_str) != Some("executed") {
            let event = next_approval_event(&mut events, &mut buf).await;
            assert_eq!(event["id"], id.as_str(), "{event}");
            states.push(event["state"].as_str().unwrap().to_owned());
        }
        states
    })
    .await
    .expect("replica B's stream shows the approval's changes on replica A within 20 s");
    assert_eq!(states, ["executing", "executed"]);
    assert_eq!(finished(call).await.is_error, Some(false));
    assert_eq!(restarts(&record), 1);
    client.cancel().await.unwrap();
}

/// A `systemctl` stand-in whose `restart` records its run and then blocks until the test
/// creates `release` (other verbs answer at once, as `systemctl_standin` does).
fn blocking_systemctl(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let runs = dir.join("runs");
    let release = dir.join("release");
    let script = format!(
        "#!/bin/sh\nif [ \"$1\" = restart ]; then\n  echo run >> '{runs}'\n  while [ ! -e '{release}' ]; do sleep 0.1; done\nfi\nif [ \"$1\" = show ]; then printf 'ActiveState=active\\nSubState=running\\nMainPID=4242\\n'; fi\nexit 0\n",
        runs = runs.display(),
        release = release.display()
    );
    let path = dir.join("systemctl");
    std::fs::write(&path, script).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    (runs, release)
}

fn runs(file: &std::path::Path) -> usize {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .count()
}

/// A replica stopped (killed) in the middle of an execution: the request is never re-run;
/// another replica's sweeper marks it `unknown`, which the API shows and the audit log
/// records. The replica that executes is a real `emisar serve` process, so stopping it
/// stops everything it was doing, as a crash would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_stopped_mid_execution_leaves_the_request_unknown_and_never_reruns_it() {
    let bin = tempfile::tempdir().unwrap();
    let (run_file, release) = blocking_systemctl(bin.path());
    // Replica A hosts the runner (in-process) and lives on; its call wait is short, so the
    // agent gets the request id back and the approval goes to replica B.
    let a = restart_app(
        Backend::Postgres,
        bin.path(),
        Options {
            approval_wait_secs: Some(1),
            ..Default::default()
        },
    )
    .await;
    let d = a.dir.path();
    let config = d.join("replica-b.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:0\"\ninsecure_http = true\ndatabase_url = \"{}\"\nsigning_key_file = \"{}\"\n[[runners]]\nname = \"hvn05\"\nurl = \"{}\"\n",
            a.database_url,
            a.private_key.display(),
            a.runner_urls["hvn05"]
        ),
    )
    .unwrap();
    let log = d.join("replica-b.log");
    let mut b = crate::harness::tools::Proc(
        std::process::Command::new(env!("CARGO_BIN_EXE_emisar"))
            .args(["serve", "--config", config.to_str().unwrap()])
            .env_remove("DATABASE_URL")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let b_url = format!(
        "http://{}",
        crate::harness::tools::bound_addr(&mut b, &log, "emisar serving MCP").await
    );

    let client = a.mcp_client().await;
    let res = crate::mcp_calls::call(
        &client,
        "linux.systemctl_restart",
        restart_args("consul on hvn05 is wedged"),
    )
    .await;
    let id = res.structured_content.clone().unwrap()["approval"]["approval_id"]
        .as_str()
        .unwrap_or_else(|| panic!("a pending request: {res:?}"))
        .to_owned();
    let approver = a.issue_token("alice", Role::Approver).await;
    let http = reqwest::Client::new();
    let approved = http
        .post(format!("{b_url}/api/approvals/{id}/approve"))
        .bearer_auth(&approver)
        .json(&json!({"note": "go"}))
        .send()
        .await
        .unwrap();
    assert!(
        approved.status().is_success(),
        "{}",
        approved.text().await.unwrap()
    );
    // Replica B is executing: the stand-in has started and blocks.
    let deadline = Instant::now() + Duration::from_secs(60);
    while runs(&run_file) == 0 {
        assert!(
            Instant::now() < deadline,
            "the execution never reached the runner; replica B's log:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let row = |id: String| {
        let (http, base, token) = (http.clone(), a.base_url(), approver.clone());
        async move {
            http.get(format!("{base}/api/approvals/{id}"))
                .bearer_auth(token)
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        }
    };
    assert_eq!(row(id.clone()).await["state"], "executing");
    drop(b);

    // A lost execution is declared after the call deadline twice plus a minute; the row is
    // dated back past that instead of the test waiting it out (the sweeper reads the time
    // of the row's last change).
    let long_ago =
        emisar::server::audit::format_at(chrono::Utc::now() - chrono::Duration::minutes(10));
    emisar::with_pool!(&a.db, pool => sqlx::query(a.db.sql(
        "UPDATE approvals SET updated_at = $1::timestamptz WHERE id = $2 AND state = 'executing'",
    ))
    .bind(&long_ago)
    .bind(&id)
    .execute(pool)
    .await
    .map(|_| ()))
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let unknown = loop {
        let r = row(id.clone()).await;
        if r["state"] != "executing" {
            break r;
        }
        assert!(
            Instant::now() < deadline,
            "replica A's sweeper never settled the interrupted execution: {r}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(unknown["state"], "unknown", "{unknown}");
    assert!(
        unknown["outcome_note"]
            .as_str()
            .unwrap_or_default()
            .contains("it is not re-run"),
        "{unknown}"
    );
    let events = kinds_and_actors(&a, &id).await;
    assert!(
        events.contains(&("call.unknown".to_owned(), "system".to_owned())),
        "{events:?}"
    );

    // Let the stand-in go, and give several sweeps the chance to (wrongly) run it again.
    std::fs::write(&release, "").unwrap();
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(
        runs(&run_file),
        1,
        "the interrupted execution was run again"
    );
    assert_eq!(row(id.clone()).await["state"], "unknown");
    a.assert_chain_intact().await;
    client.cancel().await.unwrap();
}

/// A replica whose pack differs from the one the request was made under refuses to run it:
/// the request ends `failed`, audited, and nothing runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_never_runs_under_a_changed_pack() {
    let changed = tempfile::tempdir().unwrap();
    let original =
        std::fs::read_to_string(crate::mcp_calls::fixtures_dir().join("testkit.yaml")).unwrap();
    std::fs::write(
        changed.path().join("testkit.yaml"),
        format!("{original}\n# edited after the request\n"),
    )
    .unwrap();
    let a = spawn_app(
        Backend::Postgres,
        vec![RunnerSpec::new("node-1")],
        Options {
            packs_dir: Some(crate::mcp_calls::fixtures_dir()),
            approval_wait_secs: Some(1),
            ..Default::default()
        },
    )
    .await;
    let b = spawn_app(
        Backend::Postgres,
        vec![RunnerSpec::new("node-1")],
        Options {
            packs_dir: Some(changed.path().to_owned()),
            database_url: Some(a.database_url.clone()),
            keys: Some((a.private_key.clone(), a.public_key.clone())),
            ..Default::default()
        },
    )
    .await;
    let password = add_user(&a, "bob", Role::Approver).await;
    let bob = Portal::login(&b, "bob", &password).await;
    let client = a.mcp_client().await;
    let marker = a.dir.path().join("touched");
    let res = crate::mcp_calls::call(
        &client,
        "testkit.touch",
        json!({"runners": ["node-1"], "reason": "touch it", "path": marker.to_str().unwrap()}),
    )
    .await;
    let id = res.structured_content.unwrap()["approval"]["approval_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (status, body) = bob.approve(&id).await;
    assert_eq!(status, 200, "{body}");
    let deadline = Instant::now() + Duration::from_secs(20);
    let done = loop {
        let (_, row) = bob.get(&format!("/api/approvals/{id}")).await;
        if row["state"] != "approved" && row["state"] != "executing" {
            break row;
        }
        assert!(Instant::now() < deadline, "{row}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(done["state"], "failed", "{done}");
    assert!(
        done["outcome_note"]
            .as_str()
            .unwrap()
            .contains("pack `testkit` changed since the request"),
        "{done}"
    );
    assert!(!marker.exists(), "nothing ran");
    let kinds = kinds_of(&a, &id).await;
    assert_eq!(
        kinds,
        [
            "tool.called",
            "approval.requested",
            "approval.approved",
            "approval.executing",
            "call.failed"
        ]
    );
    a.assert_chain_intact().await;
    client.cancel().await.unwrap();
}

/// A write whose pack says `preview: {none: <reason>}` shows that reason to the people who
/// decide, where a preview would be, and runs no preview.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_without_a_preview_shows_its_packs_reason() {
    let app = spawn_app(
        Backend::Sqlite,
        vec![RunnerSpec::new("node-1")],
        Options {
            packs_dir: Some(crate::mcp_calls::fixtures_dir()),
            ..Default::default()
        },
    )
    .await;
    let password = add_user(&app, "alice", Role::Approver).await;
    let alice = Portal::login(&app, "alice", &password).await;
    let client = app.mcp_client().await;
    let marker = app.dir.path().join("touched");
    let asked = call_in_background(
        &client,
        "testkit.touch",
        json!({"runners": ["node-1"], "reason": "touch it", "path": marker.to_str().unwrap()}),
    );
    let id = wait_for_pending(&alice).await;
    let (status, row) = alice.get(&format!("/api/approvals/{id}")).await;
    assert_eq!(status, 200, "{row}");
    assert_eq!(
        row["no_preview_reason"],
        "touch only creates an empty file (or updates its times); the path is all there is to see",
        "{row}"
    );
    assert_eq!(row["preview"], json!(null), "{row}");
    let (status, body) = alice.approve(&id).await;
    assert_eq!(status, 200, "{body}");
    let res = finished(asked).await;
    assert_eq!(res.is_error, Some(false), "{res:?}");
    assert!(marker.exists());
    client.cancel().await.unwrap();
}
