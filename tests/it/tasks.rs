//! MCP Tasks (SEP-2663) for calls that wait for people, driven by a client built on the
//! official `@modelcontextprotocol/ext-tasks` package and TypeScript SDK
//! (tests/mcp_tasks_client.mjs): a task made on one replica settles, after people approve,
//! through another with the executed result; `tasks/cancel` withdraws the request, which
//! then never runs; another agent's token learns nothing of a task and cannot cancel it.

use std::process::Stdio;
use std::time::Duration;

use emisar::server::principal::Role;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout};

use crate::approvals::{
    kinds_and_actors, kinds_of, pending_ids, restart_app, restart_args, restart_lab, restarts,
    signed_in, systemctl_standin, wait_for_pending,
};
use crate::both_backends;
use crate::harness::Backend;
use crate::harness::app::{Options, TestApp};
use crate::harness::tools::require;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mcp_tasks_client.mjs");

/// The Node client, running with `opts`: its process and the lines it prints.
struct TasksClient {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl TasksClient {
    fn start(opts: Value) -> TasksClient {
        let mut opts = opts;
        opts["nodeModules"] = json!(require("node/node_modules"));
        let mut child = tokio::process::Command::new(require("node/bin/node"))
            .arg(SCRIPT)
            .arg(opts.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("node starts");
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        TasksClient { child, lines }
    }

    /// The next line the client prints, within 60 s; with its stderr if it ended instead.
    async fn next(&mut self) -> Value {
        let line = tokio::time::timeout(Duration::from_secs(60), self.lines.next_line())
            .await
            .expect("the tasks client printed nothing for 60 s")
            .unwrap();
        match line {
            Some(line) => serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}")),
            None => {
                let out = self.child.wait_with_output_now().await;
                panic!("the tasks client ended early: {out}")
            }
        }
    }

    /// Waits for the client to end, successfully.
    async fn finished(mut self) {
        let status = tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("the tasks client did not end")
            .unwrap();
        if !status.success() {
            panic!(
                "the tasks client failed: {}",
                self.child.wait_with_output_now().await
            );
        }
    }
}

trait StderrNow {
    async fn wait_with_output_now(&mut self) -> String;
}

impl StderrNow for Child {
    async fn wait_with_output_now(&mut self) -> String {
        use tokio::io::AsyncReadExt;
        let status = self.wait().await.unwrap();
        let mut err = String::new();
        if let Some(mut stderr) = self.stderr.take() {
            stderr.read_to_string(&mut err).await.ok();
        }
        format!("{status}\n{err}")
    }
}

/// Calls `linux.systemctl_restart` as `token` through `app` for a task and returns what the
/// client printed of it, once it is stored (the client exits after).
async fn create_task(app: &TestApp, token: &str, reason: &str) -> Value {
    let mut client = TasksClient::start(json!({
        "mode": "create", "url": app.mcp_url, "token": token,
        "tool": "linux.systemctl_restart", "args": restart_args(reason),
    }));
    let task = client.next().await;
    client.finished().await;
    task
}

/// tasks/get, tasks/update and tasks/cancel of `task_id` as `token`.
async fn probe(app: &TestApp, token: &str, task_id: &str) -> Value {
    let mut client = TasksClient::start(json!({
        "mode": "probe", "url": app.mcp_url, "token": token, "taskId": task_id,
    }));
    let probe = client.next().await;
    client.finished().await;
    probe
}

/// A risk:high call through replica A answers with a task at once (nothing runs); the
/// client drops it, a new client resumes it through replica B and, once a person approves,
/// receives the executed result, as the waiting call would have returned it. After that,
/// the owner's tasks/cancel is refused: the request is no longer pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_from_one_replica_settles_through_another_after_approval() {
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
    let alice = signed_in(&a, "alice", Role::Approver).await;
    let mut client = TasksClient::start(json!({
        "mode": "settle", "url": a.mcp_url, "pollUrl": b.mcp_url, "token": a.token,
        "tool": "linux.systemctl_restart", "args": restart_args("settle through B"),
    }));
    let task = client.next().await;
    assert_eq!(task["step"], "task", "{task}");
    assert_eq!(task["status"], "working", "{task}");
    let task_id = task["taskId"].as_str().unwrap().to_owned();
    assert!(
        task_id.starts_with("emtask_") && task_id.len() > 40,
        "{task}"
    );
    let message = task["statusMessage"].as_str().unwrap();
    assert!(
        message.contains("waits for people: 0 of 1 approvals"),
        "{message}"
    );
    assert_eq!(restarts(&record), 0, "nothing runs before people approve");

    let id = wait_for_pending(&alice).await;
    assert!(
        message.contains(&id),
        "the task names its request: {message}"
    );
    let (status, body) = alice.approve(&id).await;
    assert_eq!(status, 200, "{body}");

    let outcome = client.next().await;
    client.finished().await;
    assert_eq!(outcome["status"], "completed", "{outcome}");
    let result = &outcome["result"];
    assert_eq!(result["isError"], false, "{outcome}");
    let answer = &result["structuredContent"];
    assert_eq!(answer["results"][0]["runner"], "hvn05", "{outcome}");
    assert_eq!(answer["results"][0]["ok"], true, "{outcome}");
    assert_eq!(answer["approval"]["approval_id"], id.as_str(), "{outcome}");
    assert_eq!(answer["approval"]["state"], "executed", "{outcome}");
    assert_eq!(outcome["lastTask"]["taskId"], task_id.as_str(), "{outcome}");
    assert_eq!(restarts(&record), 1);
    assert_eq!(
        kinds_of(&a, &id).await,
        [
            "tool.called",
            "approval.requested",
            "task.created",
            "approval.approved",
            "approval.executing",
            "call.executed"
        ]
    );

    // Done: still readable through either replica, and no longer cancellable.
    let late = probe(&b, &a.token, &task_id).await;
    assert_eq!(late["get"]["ok"]["status"], "completed", "{late}");
    let refused = late["cancel"]["error"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(
        refused.contains(&format!(
            "its approval request {id} is executed, no longer pending"
        )),
        "{late}"
    );
    a.assert_chain_intact().await;
}

/// tasks/cancel withdraws the pending request through the one withdrawal (audited as
/// `approval.withdrawn` by the agent); the task reads `cancelled`, people can no longer
/// approve it, and the runner never runs it.
async fn tasks_cancel_withdraws_the_request(backend: Backend) {
    let (_bin, record, app) = restart_lab(backend, Options::default()).await;
    let alice = signed_in(&app, "alice", Role::Approver).await;
    let mut client = TasksClient::start(json!({
        "mode": "cancel", "url": app.mcp_url, "token": app.token,
        "tool": "linux.systemctl_restart", "args": restart_args("cancel me"),
    }));
    let task = client.next().await;
    assert_eq!(task["status"], "working", "{task}");
    let cancelled = client.next().await;
    client.finished().await;
    assert_eq!(cancelled["task"]["status"], "cancelled", "{cancelled}");
    assert_eq!(cancelled["task"]["taskId"], task["taskId"], "{cancelled}");

    assert!(
        pending_ids(&alice).await.is_empty(),
        "the request is no longer pending"
    );
    let (_, listed) = alice.get("/api/approvals?state=withdrawn").await;
    let id = listed["approvals"][0]["id"]
        .as_str()
        .expect("a withdrawn request")
        .to_owned();
    let (status, body) = alice.approve(&id).await;
    assert_eq!(
        status, 409,
        "a withdrawn request cannot be approved: {body}"
    );
    let events = kinds_and_actors(&app, &id).await;
    let kinds: Vec<&str> = events.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "tool.called",
            "approval.requested",
            "task.created",
            "approval.withdrawn"
        ]
    );
    assert!(events[3].1.starts_with("agent:"), "{events:?}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        restarts(&record),
        0,
        "the runner never ran the withdrawn request"
    );
    app.assert_chain_intact().await;
}
both_backends!(tasks_cancel_withdraws_the_request);

/// Another agent's token gets, for a task that is not its own, exactly what an unknown id
/// gets, on tasks/get, tasks/update and tasks/cancel alike, and its cancel changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_agents_token_cannot_get_or_cancel_a_task() {
    let (_bin, record, app) = restart_lab(Backend::Sqlite, Options::default()).await;
    let task = create_task(&app, &app.token, "mine").await;
    let task_id = task["taskId"].as_str().unwrap();
    let other = app.issue_token("other-agent", Role::Agent).await;

    let theirs = probe(&app, &other, task_id).await;
    let unknown = probe(&app, &other, &format!("emtask_{}", "A".repeat(43))).await;
    assert!(theirs["get"]["error"].is_object(), "{theirs}");
    assert!(theirs["cancel"]["error"].is_object(), "{theirs}");
    assert_eq!(
        theirs["get"], unknown["get"],
        "another's task reads as unknown"
    );
    assert_eq!(
        theirs["cancel"], unknown["cancel"],
        "another's task reads as unknown"
    );
    assert!(theirs["update"]["error"].is_object(), "{theirs}");
    assert_eq!(
        theirs["update"], unknown["update"],
        "another's task reads as unknown"
    );

    let alice = signed_in(&app, "alice", Role::Approver).await;
    assert_eq!(
        pending_ids(&alice).await.len(),
        1,
        "their cancel withdrew nothing"
    );

    // The owner's token reads it and cancels it.
    let mine = probe(&app, &app.token, task_id).await;
    assert_eq!(mine["get"]["ok"]["status"], "working", "{mine}");
    assert_eq!(mine["update"]["ok"], "acknowledged", "{mine}");
    assert_eq!(mine["cancel"]["ok"], "acknowledged", "{mine}");
    let (_, listed) = alice.get("/api/approvals?state=withdrawn").await;
    let id = listed["approvals"][0]["id"].as_str().unwrap().to_owned();
    let withdrawn_by: Vec<(String, String)> = kinds_and_actors(&app, &id)
        .await
        .into_iter()
        .filter(|(k, _)| k == "approval.withdrawn")
        .collect();
    assert_eq!(
        withdrawn_by,
        [(
            "approval.withdrawn".to_owned(),
            format!("agent:{}", crate::harness::app::TEST_AGENT)
        )],
        "only the owner's cancel withdrew it"
    );
    assert_eq!(restarts(&record), 0);
}
