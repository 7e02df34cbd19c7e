//! `emisar lab`'s rollout scenario, with the official Python MCP SDK as the agent: a
//! fleet-wide `nomad` restart to apply a config staged on every node with a typo halts on the
//! canary at its health gate, the other four nodes never restart, and the probe at the
//! anycast VIP is refused nothing; with the file fixed, the same restart rolls out wave by
//! wave. An approver says yes in the portal's API each time, as in the lab's other tests.
//!
//! What changed where is read from the lab's nodes themselves (`World::restarts`, the unit
//! state), not only from the server's answer; the waves and gates from the audit log.

use std::path::Path;
use std::time::{Duration, Instant};

use emisar::server::audit::AuditFilter;
use serde_json::{Value, json};

use crate::approvals::Portal;
use crate::harness::tools::require;
use crate::lab::{CONSUL_REASON, NODES, RunningLab, wait_for_pending};
use crate::python_client::python_call_at;

const TYPO: &str = "leave_on_terminate = flase\n";
const FIXED: &str = "leave_on_terminate = false\n";
const REASON: &str = "apply the staged Nomad agent config (servers stop, never leave, on a reboot): restart nomad on every edge node, canary first";

/// The Python agent asks for `tool` with `args`; the approver approves the one request it
/// makes; returns the request's id and what the agent got back.
async fn approved_call(
    lab: &RunningLab,
    approver: &Portal,
    tool: &str,
    args: Value,
) -> (String, Value) {
    let url = lab.info["mcp_url"].as_str().unwrap().to_owned();
    let token = lab.info["agent_token"].as_str().unwrap().to_owned();
    let tool_name = tool.to_owned();
    let agent =
        tokio::spawn(async move { python_call_at(&url, &token, None, &tool_name, &args).await });
    let pending = wait_for_pending(approver, 1).await;
    let id = pending[0]["id"].as_str().unwrap().to_owned();
    let (status, body) = approver.approve(&id).await;
    assert_eq!(status, 200, "{body}");
    let answer = agent.await.unwrap();
    (id, answer["structured_content"].clone())
}

/// The node's Nomad agent config, as the operator edits it.
fn nomad_hcl(lab: &RunningLab, node: &str) -> std::path::PathBuf {
    lab.state_dir
        .join("nodes")
        .join(node)
        .join("etc/nomad.d/nomad.hcl")
}

fn edit(path: &Path, f: impl Fn(String) -> String) {
    let text = std::fs::read_to_string(path).unwrap();
    std::fs::write(path, f(text)).unwrap();
}

/// The nodes whose `nomad.service` restarted, in order, and why any did not come back.
fn nomad_restarts(lab: &RunningLab) -> Vec<(String, Option<String>)> {
    lab.world
        .restarts()
        .into_iter()
        .filter(|r| r.unit == "nomad.service")
        .map(|r| (r.node, r.failed))
        .collect()
}

async fn events(lab: &RunningLab, id: &str, kind: &str) -> Vec<emisar::server::audit::Event> {
    let mut events = lab
        .events(AuditFilter {
            approval_id: Some(id.to_owned()),
            kind: Some(kind.into()),
            ..Default::default()
        })
        .await;
    events.sort_by_key(|e| e.seq);
    events
}

/// Waits until the VIP probe has reached every advertiser at least `n` times since its
/// last reset.
async fn probe_reaches_every_node(lab: &RunningLab, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let tally = lab.vip.tally();
        if NODES
            .iter()
            .all(|node| tally.by_node.get(*node).is_some_and(|c| c.connections >= n))
        {
            return;
        }
        assert!(Instant::now() < deadline, "the probe stalled: {tally:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lab_rollout_python_agent_bad_change_halts_on_the_canary_and_the_fix_rolls_out_in_waves() {
    require("venv/bin/python");
    let lab = RunningLab::start().await;
    let approver = lab.approver().await;

    // The probe sees the incident: hvn05 advertises the VIP and nothing listens there.
    probe_reaches_every_node(&lab, 3).await;
    let tally = lab.vip.tally();
    assert!(tally.by_node["nomad-hvn05"].refused >= 3, "{tally:?}");
    assert_eq!(
        tally.refused, tally.by_node["nomad-hvn05"].refused,
        "{tally:?}"
    );

    // The incident's first approval heals hvn05 (one runner: one wave, no gate).
    let (_, out) = approved_call(
        &lab,
        &approver,
        "linux.systemctl_restart",
        json!({"unit": "consul", "runners": ["nomad-hvn05"], "reason": CONSUL_REASON}),
    )
    .await;
    assert_eq!(out["approval"]["state"], "executed", "{out}");
    assert!(lab.world.traefik["nomad-hvn05"].serving());

    // Config management stages the change on every node, with the night's typo.
    for node in NODES {
        edit(&nomad_hcl(&lab, node), |t| t + TYPO);
    }
    let pids_before: Vec<u32> = NODES
        .iter()
        .map(|n| lab.world.node(n).unwrap().units["nomad.service"].main_pid)
        .collect();
    lab.vip.reset();

    // The bad change: the restart runs on the canary, which never comes back; the rollout
    // halts at its gate.
    let args = json!({"unit": "nomad", "runners": NODES, "reason": REASON});
    let (id, out) = approved_call(&lab, &approver, "linux.systemctl_restart", args.clone()).await;
    assert_eq!(out["approval"]["state"], "halted", "{out}");
    let message = out["approval"]["message"].as_str().unwrap();
    assert!(
        message.contains("wave 1 of 3: runner `nomad-hvn01`")
            && message.contains("health gate")
            && message.contains("ActiveState=activating, SubState=auto-restart"),
        "the agent is told which node and why: {message}"
    );
    let results = out["results"].as_array().unwrap();
    let not_run: Vec<&str> = results
        .iter()
        .filter(|r| r["error_kind"] == "not_run")
        .map(|r| r["runner"].as_str().unwrap())
        .collect();
    assert_eq!(not_run, &NODES[1..], "{out}");
    // On the nodes: hvn01's agent restarted and cannot load its config; no other node's
    // Nomad restarted, and theirs still runs the process it ran before.
    let restarts = nomad_restarts(&lab);
    assert_eq!(restarts.len(), 1, "{restarts:?}");
    assert_eq!(restarts[0].0, "nomad-hvn01");
    let why = restarts[0].1.as_deref().unwrap_or_default();
    assert!(
        why.contains("At 18:22: Unknown token: 18:22 IDENT flase"),
        "{why}"
    );
    for (k, node) in NODES.iter().enumerate().skip(1) {
        let unit = &lab.world.node(node).unwrap().units["nomad.service"];
        assert_eq!(
            (unit.main_pid, unit.failed.as_deref()),
            (pids_before[k], None),
            "{node} was not touched"
        );
    }
    // Users saw none of it: every connection at the VIP went through, the canary's too
    // (its Traefik allocation keeps running while its Nomad agent restarts).
    let tally = lab.vip.tally();
    assert_eq!(tally.refused, 0, "{tally:?}");
    assert!(tally.by_node["nomad-hvn01"].connections > 0, "{tally:?}");
    // The audit log: one wave, the canary's failed gate, the halt with the runners not run.
    let waves = events(&lab, &id, "rollout.wave").await;
    assert_eq!(waves.len(), 1, "{waves:?}");
    let gates = events(&lab, &id, "rollout.gate").await;
    let [gate] = &gates[..] else {
        panic!("one gate ran: {gates:?}");
    };
    assert_eq!(gate.runner.as_deref(), Some("nomad-hvn01"));
    assert_eq!(gate.detail.as_ref().unwrap()["passed"], false, "{gate:?}");
    let halted = events(&lab, &id, "rollout.halted").await;
    assert_eq!(
        halted[0].detail.as_ref().unwrap()["not_run"],
        json!(&NODES[1..])
    );

    // The corrected change: the file fixed on every node, the same restart asked again.
    for node in NODES {
        edit(&nomad_hcl(&lab, node), |t| t.replace(TYPO, FIXED));
    }
    lab.vip.reset();
    let (id, out) = approved_call(&lab, &approver, "linux.systemctl_restart", args).await;
    assert_eq!(out["approval"]["state"], "executed", "{out}");
    // On the nodes, in the order they restarted: the canary, then hvn02 and hvn03, then
    // hvn04 and hvn05; every agent loaded its config and runs.
    let restarts = nomad_restarts(&lab);
    let order: Vec<&str> = restarts[1..].iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(order.len(), 5, "{restarts:?}");
    assert_eq!(order[0], "nomad-hvn01", "{restarts:?}");
    let mut wave2 = order[1..3].to_vec();
    wave2.sort();
    let mut wave3 = order[3..].to_vec();
    wave3.sort();
    assert_eq!(
        (wave2, wave3),
        (
            vec!["nomad-hvn02", "nomad-hvn03"],
            vec!["nomad-hvn04", "nomad-hvn05"]
        ),
        "{restarts:?}"
    );
    assert!(
        restarts[1..].iter().all(|(_, failed)| failed.is_none()),
        "{restarts:?}"
    );
    for node in NODES {
        let unit = &lab.world.node(node).unwrap().units["nomad.service"];
        assert_eq!(unit.failed, None, "{node}");
    }
    // The audit log: the three waves in order, a passed gate before each next wave.
    let started: Vec<Value> = events(&lab, &id, "rollout.wave")
        .await
        .into_iter()
        .map(|e| e.detail.unwrap()["runners"].clone())
        .collect();
    assert_eq!(
        started,
        [
            json!(["nomad-hvn01"]),
            json!(["nomad-hvn02", "nomad-hvn03"]),
            json!(["nomad-hvn04", "nomad-hvn05"])
        ]
    );
    let gates = events(&lab, &id, "rollout.gate").await;
    let mut gated: Vec<&str> = gates.iter().map(|e| e.runner.as_deref().unwrap()).collect();
    gated.sort();
    assert_eq!(gated, ["nomad-hvn01", "nomad-hvn02", "nomad-hvn03"]);
    assert!(
        gates
            .iter()
            .all(|g| g.detail.as_ref().unwrap()["passed"] == true),
        "{gates:?}"
    );
    let tally = lab.vip.tally();
    assert_eq!(tally.refused, 0, "{tally:?}");
    lab.verify_with_cli();
}
