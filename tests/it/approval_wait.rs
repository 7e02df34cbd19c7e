//! How an agent waits for humans: progress while the call waits, the request id when the
//! wait runs out, `emisar.approval_status` / `emisar.approval_wait` to check and wait again
//! (only on its own requests), and a cancelled call withdrawing its pending request.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use emisar::server::principal::Role;
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, ClientRequest, ProgressNotificationParam,
};
use rmcp::service::{NotificationContext, PeerRequestOptions, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};

use crate::approvals::{
    Portal, add_user, call_in_background, finished, kinds_and_actors, restart_app, restart_args,
    restarts, systemctl_standin, wait_for_pending,
};
use crate::both_backends;
use crate::harness::Backend;
use crate::harness::app::{Options, TestApp};
use crate::mcp_calls::call;

/// One progress notification: its value and message.
type Seen = (f64, Option<String>);

/// An MCP client that records the progress notifications it receives.
#[derive(Clone, Default)]
struct Watcher {
    progress: Arc<Mutex<Vec<Seen>>>,
}

impl rmcp::ClientHandler for Watcher {
    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.progress
            .lock()
            .unwrap()
            .push((params.progress, params.message));
    }
}

async fn client_with(
    app: &TestApp,
    token: &str,
    w: Watcher,
) -> RunningService<RoleClient, Watcher> {
    let config = StreamableHttpClientTransportConfig::with_uri(app.mcp_url.clone())
        .auth_header(token.to_owned());
    w.serve(StreamableHttpClientTransport::from_config(config))
        .await
        .expect("MCP client connects")
}

async fn state_of(p: &Portal, id: &str) -> Value {
    p.get(&format!("/api/approvals/{id}")).await.1["state"].clone()
}

async fn a_waiting_call_sends_progress_until_the_decision(backend: Backend) {
    let bin = tempfile::tempdir().unwrap();
    let record = systemctl_standin(bin.path());
    // The harness sends progress every 500 ms (production: 10 s, at most 15 s).
    let app = restart_app(backend, bin.path(), Options::default()).await;
    let password = add_user(&app, "alice", Role::Approver).await;
    let alice = Portal::login(&app, "alice", &password).await;
    let watcher = Watcher::default();
    let client = client_with(&app, &app.token, watcher.clone()).await;
    let peer = client.peer().clone();
    let params = CallToolRequestParams::new("linux.systemctl_restart").with_arguments(
        restart_args("progress, please")
            .as_object()
            .unwrap()
            .clone(),
    );
    let call = tokio::spawn(async move { peer.call_tool(params).await.unwrap() });
    let id = wait_for_pending(&alice).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while watcher.progress.lock().unwrap().len() < 3 {
        assert!(
            Instant::now() < deadline,
            "fewer than 3 progress notifications in 20 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, body) = alice.approve(&id).await;
    assert_eq!(status, 200, "{body}");
    let res = finished(call).await;
    assert_eq!(res.is_error, Some(false), "{res:?}");
    assert_eq!(restarts(&record), 1);
    let seen = watcher.progress.lock().unwrap().clone();
    assert!(
        seen.windows(2).all(|w| w[0].0 < w[1].0),
        "progress must increase: {seen:?}"
    );
    let message = seen[0].1.as_deref().unwrap_or_default();
    assert!(
        message.contains(&id) && message.contains("pending"),
        "{message}"
    );
    client.cancel().await.unwrap();
}
both_backends!(a_waiting_call_sends_progress_until_the_decision);

async fn an_agent_checks_and_waits_again_on_its_own_requests_only(backend: Backend) {
    let bin = tempfile::tempdir().unwrap();
    let record = systemctl_standin(bin.path());
    let app = restart_app(
        backend,
        bin.path(),
        Options {
            approval_wait_secs: Some(1),
            ..Default::default()
        },
    )
    .await;
    let password = add_user(&app, "alice", Role::Approver).await;
    let alice = Portal::login(&app, "alice", &password).await;
    let client = app.mcp_client().await;

    // Nobody decides within the wait: the call returns the request id, not an error.
    let res = call(
        &client,
        "linux.systemctl_restart",
        restart_args("later is fine"),
    )
    .await;
    assert_eq!(res.is_error, Some(false));
    let pending = res.structured_content.unwrap()["approval"].clone();
    assert_eq!(pending["state"], "pending");
    let id = pending["approval_id"].as_str().unwrap().to_owned();

    let res = call(
        &client,
        "emisar.approval_status",
        json!({"approval_id": id, "reason": "any news?"}),
    )
    .await;
    assert_eq!(
        res.structured_content.unwrap()["approval"]["state"],
        "pending"
    );

    // Without an id (or with a malformed one) the built-in says what is wrong.
    for args in [
        json!({"reason": "which one?"}),
        json!({"approval_id": "x", "reason": "r"}),
    ] {
        let res = call(&client, "emisar.approval_status", args).await;
        assert_eq!(res.is_error, Some(true));
        assert!(
            format!("{:?}", res.content).contains("approval_id"),
            "{res:?}"
        );
    }

    // Another agent cannot see it.
    let other = app.issue_token("other-agent", Role::Agent).await;
    let other = client_with(&app, &other, Watcher::default()).await;
    let res = other
        .call_tool(
            CallToolRequestParams::new("emisar.approval_status").with_arguments(
                json!({"approval_id": id, "reason": "peek"})
                    .as_object()
                    .unwrap()
                    .clone(),
            ),
        )
        .await
        .unwrap();
    assert_eq!(res.is_error, Some(true));
    assert!(format!("{:?}", res.content).contains("no approval request has id"));

    // Waiting again, the agent gets the result once someone approves.
    let waiting = call_in_background(
        &client,
        "emisar.approval_wait",
        json!({"approval_id": id, "reason": "waiting for the restart"}),
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (status, body) = alice.approve(&id).await;
    assert_eq!(status, 200, "{body}");
    let res = finished(waiting).await;
    // approval_wait itself returns after the configured 1 s wait; ask again if so.
    let mut out = res.structured_content.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while out["approval"]["state"] != "executed" {
        assert!(Instant::now() < deadline, "never executed: {out}");
        let res = call(
            &client,
            "emisar.approval_wait",
            json!({"approval_id": id, "reason": "still waiting"}),
        )
        .await;
        out = res.structured_content.unwrap();
    }
    assert_eq!(out["results"][0]["ok"], true, "{out}");
    assert_eq!(restarts(&record), 1);
    other.cancel().await.unwrap();
    client.cancel().await.unwrap();
}
both_backends!(an_agent_checks_and_waits_again_on_its_own_requests_only);

async fn a_cancelled_call_withdraws_its_pending_request(backend: Backend) {
    let bin = tempfile::tempdir().unwrap();
    let record = systemctl_standin(bin.path());
    let app = restart_app(backend, bin.path(), Options::default()).await;
    let password = add_user(&app, "alice", Role::Approver).await;
    let alice = Portal::login(&app, "alice", &password).await;
    let client = app.mcp_client().await;
    let params = CallToolRequestParams::new("linux.systemctl_restart")
        .with_arguments(restart_args("never mind").as_object().unwrap().clone());
    let handle = client
        .send_cancellable_request(
            ClientRequest::CallToolRequest(CallToolRequest::new(params)),
            PeerRequestOptions::no_options(),
        )
        .await
        .unwrap();
    let id = wait_for_pending(&alice).await;
    handle
        .cancel(Some("the agent changed its mind".into()))
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while state_of(&alice, &id).await != "withdrawn" {
        assert!(Instant::now() < deadline, "the request was not withdrawn");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, body) = alice.approve(&id).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(restarts(&record), 0);
    let trail = kinds_and_actors(&app, &id).await;
    assert_eq!(
        trail,
        [
            ("tool.called".into(), "agent:test-agent".into()),
            ("approval.requested".into(), "agent:test-agent".into()),
            ("approval.withdrawn".into(), "agent:test-agent".into()),
        ]
    );
    client.cancel().await.unwrap();
}
both_backends!(a_cancelled_call_withdraws_its_pending_request);
