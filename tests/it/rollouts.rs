//! Rollouts in waves (issue 46), on PostgreSQL with five TLS runners that require two people's
//! signatures: the waves run in the order people signed, shown by the runners' own records,
//! each but the last followed by its health gate; a
//! change that leaves the canary unhealthy halts at its gate and the other four never run it;
//! the corrected change then rolls out wave by wave; and a runner refuses an execution that a
//! server holding `server.key` sends in a wave the signed plan does not give it.

use std::path::{Path, PathBuf};

use emisar::digest::json_digest;
use emisar::protocol::approval::{Plan, Statement};
use emisar::protocol::{CallRequest, Mode};
use emisar::server::audit::AuditFilter;
use emisar::server::principal::Role;
use serde_json::{Value, json};

use crate::approvals::{Portal, call_in_background, finished, signed_in, wait_for_pending};
use crate::harness::app::{Options, Signed, TestApp};
use crate::harness::certs::self_signed;
use crate::harness::{Backend, RunnerSpec, spawn_app};
use crate::signed_approvals::{in_secs, proof, pub_line, ssh};

pub(crate) const TOOL: &str = "roll.mark";
pub(crate) const FLEET: [&str; 5] = ["edge-1", "edge-2", "edge-3", "edge-4", "edge-5"];

/// A write each runner records in a shared file with its name and the time, and whose gate
/// asks the runner whether the change left it healthy (a node is sick for a change when its
/// folder holds `sick-CHANGE`).
pub(crate) const PACK: &str = r#"pack: roll
description: A write whose health each node reports.
tools:
  mark:
    description: Marks this node with a change; its verify asks whether the node is healthy.
    risk: high
    scope: node
    params:
      change: {type: identifier}
    preview: {none: the test write changes a file and has nothing to show}
    steps:
      - name: mark
        exec: {argv: ["mark", "{change}"]}
    verify:
      within_s: 2
      steps:
        - name: health
          read_only: true
          exec: {argv: ["healthy", "{change}"]}
"#;

pub(crate) struct Fleet {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) app: TestApp,
}

impl Fleet {
    /// The runners that marked `change`, in the order they did (each with its time in ns).
    pub(crate) fn marked(&self, change: &str) -> Vec<(String, u128)> {
        let text = std::fs::read_to_string(self.dir.path().join("marks.log")).unwrap_or_default();
        let mut marks: Vec<(String, u128)> = text
            .lines()
            .filter_map(|l| {
                let mut parts = l.split(' ');
                let (runner, c, at) = (parts.next()?, parts.next()?, parts.next()?);
                (c == change).then(|| (runner.to_owned(), at.parse().unwrap()))
            })
            .collect();
        marks.sort_by_key(|(_, at)| *at);
        marks
    }

    pub(crate) fn make_sick(&self, runner: &str, change: &str) {
        std::fs::write(
            self.dir.path().join(runner).join(format!("sick-{change}")),
            "",
        )
        .unwrap();
    }
}

/// Each runner's `mark` and `healthy`, in its own folder on its PATH.
pub(crate) fn node_programs(dir: &Path, runner: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let bin = dir.join(runner);
    std::fs::create_dir_all(&bin).unwrap();
    let log = dir.join("marks.log");
    let write = |name: &str, body: String| {
        let path = bin.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    write(
        "mark",
        format!(
            "printf '%s %s %s\\n' '{runner}' \"$1\" \"$(date +%s%N)\" >> '{}'\n",
            log.display()
        ),
    );
    write(
        "healthy",
        format!(
            "if [ -e '{}/sick-'\"$1\" ]; then echo \"{runner} is failed after $1\" >&2; exit 1; fi\necho active\n",
            bin.display()
        ),
    );
    bin
}

/// Five TLS runners, each trusting an approvers file where a `roll` write needs alice and
/// bob, both signing in the terminal (SSH); the policy rolls out a canary of one, then waves
/// of two.
pub(crate) async fn fleet() -> Fleet {
    fleet_with("").await
}

/// [`fleet`], with `policy` added to its policy file.
pub(crate) async fn fleet_with(policy: &str) -> Fleet {
    let dir = tempfile::tempdir().unwrap();
    let packs = dir.path().join("packs");
    std::fs::create_dir_all(&packs).unwrap();
    std::fs::write(packs.join("roll.yaml"), PACK).unwrap();
    let approvers = dir.path().join("approvers.toml");
    std::fs::write(
        &approvers,
        format!(
            "serial = 1\n[[person]]\nname = \"alice\"\nssh = [\"{}\"]\n[[person]]\nname = \"bob\"\nssh = [\"{}\"]\n[[rule]]\ntools = \"roll.*\"\napprovals = 2\nssh_signatures = 2\n",
            pub_line(1),
            pub_line(2)
        ),
    )
    .unwrap();
    let policy_file = dir.path().join("policy.yaml");
    std::fs::write(
        &policy_file,
        format!("rollout:\n  default: {{canary: 1, wave: 2}}\n{policy}"),
    )
    .unwrap();
    let runners = FLEET
        .iter()
        .map(|name| {
            let bin = node_programs(dir.path(), name);
            let cert = self_signed(dir.path(), name);
            RunnerSpec::new(name)
                .path_first(&bin)
                .https(cert.clone(), Some(cert.fingerprint.to_string()))
                .signed_approvals(&["*"], Some(approvers.clone()), &[])
        })
        .collect();
    let app = spawn_app(
        Backend::Postgres,
        runners,
        Options {
            packs_dir: Some(packs),
            approvers_file: Some(approvers),
            policy_file: Some(policy_file),
            ..Default::default()
        },
    )
    .await;
    Fleet { dir, app }
}

/// Asks for `change` on the whole fleet (canary first), has alice and bob sign the statement
/// they were shown, and returns the agent's answer with the request as people saw it.
pub(crate) async fn roll(
    fleet: &Fleet,
    alice: &Portal,
    bob: &Portal,
    change: &str,
) -> (Value, Value) {
    let client = fleet.app.mcp_client().await;
    let call = call_in_background(
        &client,
        TOOL,
        json!({"change": change, "runners": FLEET, "reason": "roll the change out"}),
    );
    let id = wait_for_pending(alice).await;
    let (_, request) = alice.get(&format!("/api/approvals/{id}")).await;
    let text = request["statement"]["text"].as_str().unwrap().to_owned();
    for (who, seed) in [(alice, 1), (bob, 2)] {
        let (status, body) = who
            .post(
                &format!("/api/approvals/{id}/approve"),
                json!({ "signature": ssh(seed, &text) }),
                true,
            )
            .await;
        assert_eq!(status, 200, "{body}");
    }
    let out = finished(call).await.structured_content.unwrap();
    (out, request)
}

/// The statement people would sign for `change` on the whole fleet, in the policy's waves
/// (canary edge-1, then two by two), expiring in `expires_in` seconds: what a server holding
/// `server.key` sends runners directly.
pub(crate) fn statement_for(fleet: &Fleet, change: &str, expires_in: i64) -> Statement {
    let packs = emisar::pack::PackSet::load(fleet.app.packs_dir.as_deref()).unwrap();
    Statement {
        approval_id: uuid::Uuid::now_v7().to_string(),
        tool: TOOL.into(),
        pack_sha256: packs.pack("roll").unwrap().digest.clone(),
        args_sha256: json_digest(&json!({ "change": change })),
        runners: FLEET.iter().map(|r| ((*r).to_owned(), None)).collect(),
        plan: Plan {
            waves: vec![
                vec!["edge-1".into()],
                vec!["edge-2".into(), "edge-3".into()],
                vec!["edge-4".into(), "edge-5".into()],
            ],
            pause_secs: 0,
        },
        required: 2,
        policy_sha256: "0".repeat(64),
        requester: "agent:test-agent".into(),
        expires_at: in_secs(expires_in),
    }
}

pub(crate) async fn events(
    app: &TestApp,
    id: &str,
    kind: &str,
) -> Vec<emisar::server::audit::Event> {
    let mut events = app
        .events(AuditFilter {
            approval_id: Some(id.to_owned()),
            kind: Some(kind.into()),
            limit: 100,
            ..Default::default()
        })
        .await;
    events.sort_by_key(|e| e.seq);
    events
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_change_halts_on_the_canary_and_the_good_one_rolls_out_wave_by_wave() {
    let fleet = fleet().await;
    let alice = signed_in(&fleet.app, "alice", Role::Approver).await;
    let bob = signed_in(&fleet.app, "bob", Role::Approver).await;

    // The plan is in what people sign, canary first, and the request shows the same plan.
    fleet.make_sick("edge-1", "bad");
    let (out, request) = roll(&fleet, &alice, &bob, "bad").await;
    let text = request["statement"]["text"].as_str().unwrap();
    assert!(
        text.contains("\nwave 1 edge-1\nwave 2 edge-2,edge-3\nwave 3 edge-4,edge-5\npause 0\n"),
        "{text}"
    );
    assert_eq!(
        request["plan"],
        json!({"waves": [["edge-1"], ["edge-2", "edge-3"], ["edge-4", "edge-5"]], "pause_secs": 0})
    );

    // The canary ran the change, failed its gate, and the rollout stopped there.
    assert_eq!(out["approval"]["state"], "halted", "{out}");
    let message = out["approval"]["message"].as_str().unwrap();
    assert!(
        message.contains("wave 1 of 3: runner `edge-1`") && message.contains("health gate"),
        "{message}"
    );
    let marked: Vec<String> = fleet.marked("bad").into_iter().map(|(r, _)| r).collect();
    assert_eq!(marked, ["edge-1"], "only the canary ran the bad change");
    let results = out["results"].as_array().unwrap();
    let not_run: Vec<&str> = results
        .iter()
        .filter(|r| r["error_kind"] == "not_run")
        .map(|r| r["runner"].as_str().unwrap())
        .collect();
    assert_eq!(not_run, ["edge-2", "edge-3", "edge-4", "edge-5"], "{out}");
    // The canary's write ran, and its result says its node is not healthy.
    let canary = &results[0];
    assert_eq!(canary["runner"], "edge-1");
    assert_eq!(canary["ok"], false, "{out}");
    assert_eq!(canary["error_kind"], "gate_failed", "{out}");
    assert!(
        canary["error"]
            .as_str()
            .unwrap()
            .starts_with("the write ran, then its health gate"),
        "{out}"
    );
    let id = request["id"].as_str().unwrap();
    let gates = events(&fleet.app, id, "rollout.gate").await;
    let [gate] = &gates[..] else {
        panic!("one gate ran: {gates:?}");
    };
    let detail = gate.detail.as_ref().unwrap();
    assert_eq!(gate.runner.as_deref(), Some("edge-1"));
    assert_eq!(detail["passed"], false, "{detail}");
    assert!(
        detail["error"]
            .as_str()
            .unwrap()
            .contains("edge-1 is failed after bad"),
        "the gate's evidence is the runner's own answer: {detail}"
    );
    let halted = events(&fleet.app, id, "rollout.halted").await;
    assert_eq!(
        halted[0].detail.as_ref().unwrap()["not_run"],
        json!(["edge-2", "edge-3", "edge-4", "edge-5"])
    );

    // The corrected change: every wave's runners ran after every runner of the wave before
    // passed its gate, by the runners' own clocks.
    let (out, request) = roll(&fleet, &alice, &bob, "good").await;
    assert_eq!(out["approval"]["state"], "executed", "{out}");
    let marks = fleet.marked("good");
    assert_eq!(marks.len(), 5, "{marks:?}");
    let at = |r: &str| marks.iter().find(|(n, _)| n == r).unwrap().1;
    let waves = [
        vec!["edge-1"],
        vec!["edge-2", "edge-3"],
        vec!["edge-4", "edge-5"],
    ];
    for pair in waves.windows(2) {
        let last_before = pair[0].iter().map(|r| at(r)).max().unwrap();
        let first_after = pair[1].iter().map(|r| at(r)).min().unwrap();
        assert!(last_before < first_after, "waves overlapped: {marks:?}");
    }
    let id = request["id"].as_str().unwrap();
    let started: Vec<Value> = events(&fleet.app, id, "rollout.wave")
        .await
        .into_iter()
        .map(|e| e.detail.unwrap()["runners"].clone())
        .collect();
    assert_eq!(started, waves.map(|w| json!(w)));
    // A gate before each next wave: the canary's, then wave 2's two; the last wave has none.
    // (A wave's gates run at once, so their events come in any order.)
    let mut gated: Vec<String> = events(&fleet.app, id, "rollout.gate")
        .await
        .into_iter()
        .map(|e| e.runner.unwrap())
        .collect();
    gated.sort();
    assert_eq!(gated, ["edge-1", "edge-2", "edge-3"]);
}

/// A server holding `server.key` and two honest signatures sends a runner of the last wave
/// its execution as if it were the canary: refused, nothing runs; in its own wave it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_refuses_a_wave_the_signed_plan_does_not_give_it() {
    let fleet = fleet().await;
    let app = &fleet.app;
    let statement = statement_for(&fleet, "forged", 600);
    let send = |wave: Option<u32>| {
        let request = CallRequest {
            tool: TOOL.into(),
            args: json!({"change": "forged"}).as_object().unwrap().clone(),
            mode: Mode::Execute,
            preview: None,
            preview_seal: None,
            raw: false,
            approval: Some(proof(&statement, &[1, 2])),
            witnessed: None,
            secret_salt: None,
            wave,
            decision: None,
            grant: None,
        };
        let signed = Signed {
            call_id: uuid::Uuid::new_v4().to_string(),
            approval_id: Some(statement.approval_id.clone()),
            lowered_by_policy: None,
        };
        async move { app.signed_request("edge-4", &request, &signed).await }
    };
    for (wave, says) in [(Some(1), "in wave 1"), (None, "without a wave")] {
        let answer = send(wave).await;
        assert_eq!(answer.status, 403, "{}", answer.body);
        let error = answer.body["error"].as_str().unwrap();
        assert!(
            error.contains("the signed plan places this runner (`edge-4`) in wave 3")
                && error.contains(says),
            "{error}"
        );
    }
    assert!(fleet.marked("forged").is_empty(), "nothing ran");
    let answer = send(Some(3)).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(fleet.marked("forged").len(), 1);
}

/// A write the policy lets run without people (risk:low, auto-approved) rolls out the same
/// way: the canary's failed gate leaves the rest untouched, and the agent reads why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_without_approval_halts_at_the_canary_too() {
    let dir = tempfile::tempdir().unwrap();
    let packs = dir.path().join("packs");
    std::fs::create_dir_all(&packs).unwrap();
    // The same write at risk:low, which the policy lets run without people.
    std::fs::write(
        packs.join("roll.yaml"),
        PACK.replace("risk: high", "risk: low"),
    )
    .unwrap();
    let policy = dir.path().join("policy.yaml");
    std::fs::write(
        &policy,
        "risk:\n  roll.mark: {risk: low, auto_approve: true}\nrollout:\n  default: {canary: 1, wave: 1}\n",
    )
    .unwrap();
    let runners = FLEET[..3]
        .iter()
        .map(|name| RunnerSpec::new(name).path_first(&node_programs(dir.path(), name)))
        .collect();
    let app = spawn_app(
        Backend::Sqlite,
        runners,
        Options {
            packs_dir: Some(packs),
            policy_file: Some(policy),
            ..Default::default()
        },
    )
    .await;
    let fleet = Fleet { dir, app };
    fleet.make_sick("edge-1", "bad");
    let client = fleet.app.mcp_client().await;
    let out = finished(call_in_background(
        &client,
        TOOL,
        json!({"change": "bad", "runners": ["edge-1", "edge-2", "edge-3"], "reason": "no people needed"}),
    ))
    .await
    .structured_content
    .unwrap();
    let marked: Vec<String> = fleet.marked("bad").into_iter().map(|(r, _)| r).collect();
    assert_eq!(marked, ["edge-1"], "only the canary ran: {out}");
    let results = out["results"].as_array().unwrap();
    for skipped in &results[1..] {
        assert_eq!(skipped["error_kind"], "not_run", "{out}");
        let error = skipped["error"].as_str().unwrap();
        assert!(
            error.contains("wave 1 of 3: runner `edge-1`: its health gate"),
            "the agent reads which runner failed its gate: {error}"
        );
    }
    // The good change goes everywhere, one runner at a time.
    finished(call_in_background(
        &client,
        TOOL,
        json!({"change": "good", "runners": ["edge-1", "edge-2", "edge-3"], "reason": "fixed"}),
    ))
    .await;
    let order: Vec<String> = fleet.marked("good").into_iter().map(|(r, _)| r).collect();
    assert_eq!(order, ["edge-1", "edge-2", "edge-3"]);
}
