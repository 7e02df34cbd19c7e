//! A runner's allowlists hold for every value, numbers included: the runner and the policy
//! compare with one function, so a value the one refuses the other refuses too.

use std::time::{Duration, Instant};

use emisar::server::audit::AuditFilter;
use emisar::server::principal::Role;
use serde_json::json;

use crate::approvals::{
    call_in_background, finished, pending_ids, restarts, signed_in, systemctl_standin,
    wait_for_pending,
};

use crate::both_backends;
use crate::governance_rules::gateway_packs;
use crate::harness::app::Options;
use crate::harness::{Backend, RunnerSpec, spawn_app};
use crate::mcp_calls::call;

async fn the_runner_refuses_a_number_outside_its_allowlist(backend: Backend) {
    let packs = gateway_packs();
    let app = spawn_app(
        backend,
        vec![
            RunnerSpec::new("node-1")
                .allow("ports", &["8080", "8443"])
                .service("vault", "http://127.0.0.1:9"),
        ],
        Options {
            packs_dir: Some(packs.path().to_owned()),
            ..Default::default()
        },
    )
    .await;
    let client = app.mcp_client().await;
    let port = |n: u16| json!({"port": n, "runners": ["node-1"], "reason": "which port?"});

    let res = call(&client, "gk.port", port(8443)).await;
    assert_eq!(res.is_error, Some(false), "{res:?}");
    assert_eq!(
        res.structured_content.unwrap()["results"][0]["output"]["said"],
        "8443"
    );

    // No policy stands in the way here: what refuses 9090 is the runner itself.
    let res = call(&client, "gk.port", port(9090)).await;
    assert_eq!(res.is_error, Some(true), "{res:?}");
    let s = res.structured_content.unwrap();
    let error = s["results"][0]["error"].as_str().unwrap();
    assert!(
        error.contains("`port` = `9090` is not in this runner's allowlist `ports`"),
        "{error}"
    );

    // The same, signed as the server signs it, straight to the runner.
    let direct = app
        .signed_call(
            "node-1",
            "gk.port",
            json!({"port": 9090}),
            emisar::protocol::Mode::Execute,
            None,
        )
        .await;
    assert_eq!(direct.status, 403, "{}", direct.body);
    app.assert_chain_intact().await;
    client.cancel().await.unwrap();
}
both_backends!(the_runner_refuses_a_number_outside_its_allowlist);

/// A write whose value a runner's allowlist refuses is refused before anyone is asked to
/// approve it: the server knows the runner's allowlists from its health answer, and checks
/// with the runner's own function. A value inside the list still goes to the queue.
async fn a_write_outside_the_runners_allowlist_never_reaches_the_queue(backend: Backend) {
    let bin = tempfile::tempdir().unwrap();
    let record = systemctl_standin(bin.path());
    let app = spawn_app(
        backend,
        vec![
            RunnerSpec::new("node-1")
                .allow("systemd_units", &["nginx"])
                .path_first(bin.path()),
        ],
        Options {
            probe_interval_ms: Some(200),
            ..Default::default()
        },
    )
    .await;
    // The runner reports its allowlists in its health answer, and the API shows them.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let runners = app.runners_api().await;
        let reported = runners["runners"]
            .as_array()
            .and_then(|r| r.iter().find(|r| r["name"] == "node-1"))
            .map(|r| r["allowlists"].clone());
        if reported == Some(json!({"systemd_units": ["nginx"]})) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the server never read node-1's allowlists: {runners}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let alice = signed_in(&app, "alice", Role::Approver).await;
    let client = app.mcp_client().await;
    let restart = |unit: &str| json!({"unit": unit, "runners": ["node-1"], "reason": "restart after the config change"});

    let res = call(&client, "linux.systemctl_restart", restart("vault")).await;
    assert_eq!(res.is_error, Some(true), "{res:?}");
    let error = res.structured_content.unwrap()["error"].clone();
    assert_eq!(error["kind"], "outside_runner_allowlist", "{error}");
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains("`unit` = `vault` is not in runner `node-1`'s allowlist `systemd_units`"),
        "{message}"
    );
    assert!(pending_ids(&alice).await.is_empty(), "no request is queued");
    let rejected = app
        .events(AuditFilter {
            kind: Some("tool.rejected".into()),
            ..Default::default()
        })
        .await;
    assert_eq!(rejected.len(), 1, "{rejected:?}");
    assert!(
        serde_json::to_string(&rejected[0].detail)
            .unwrap()
            .contains("allowlist `systemd_units`"),
        "{:?}",
        rejected[0]
    );

    // Inside the list the same call waits for a person, who can deny it.
    let waiting = call_in_background(&client, "linux.systemctl_restart", restart("nginx"));
    let id = wait_for_pending(&alice).await;
    let (status, body) = alice.deny(&id, "not now").await;
    assert_eq!(status, 200, "{body}");
    let res = finished(waiting).await;
    assert_eq!(res.is_error, Some(true), "{res:?}");
    assert_eq!(restarts(&record), 0, "nothing ran");
    app.assert_chain_intact().await;
    client.cancel().await.unwrap();
}
both_backends!(a_write_outside_the_runners_allowlist_never_reaches_the_queue);
