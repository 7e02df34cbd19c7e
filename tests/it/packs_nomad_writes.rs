//! The nomad pack's on-call writes (node drain, node eligibility, allocation restart, job
//! scale) against the lab's Nomad emulator, through MCP: each one previewed, approved in the
//! portal, executed and checked in the emulator's state; and each one refused when its object
//! moved between the preview and the execution. Then the emulator's own errors, as Nomad
//! answers them.

use std::sync::Arc;

use emisar::lab::clock::LabClock;
use emisar::lab::http::serve;
use emisar::lab::nomad::Nomad;
use emisar::lab::scenario::{self, OOM_ALLOC};
use emisar::protocol::Mode;
use emisar::server::principal::Role;
use rmcp::RoleClient;
use rmcp::model::CallToolResult;
use rmcp::service::RunningService;
use serde_json::{Value, json};

use crate::approvals::{Portal, call_in_background, finished, signed_in, wait_for_pending};
use crate::harness::app::{DirectAnswer, Options, TestApp};
use crate::harness::tools::only_output as output;
use crate::harness::{Backend, RunnerSpec, spawn_app};

/// The lab's Nomad in the incident's state, plus a two-instance service job `web`; a server
/// with one runner that reaches it; an approver in the portal; an agent over MCP.
struct Night {
    nomad: Arc<Nomad>,
    url: String,
    app: TestApp,
    approver: Portal,
    agent: RunningService<RoleClient, ()>,
}

/// A service job: group `web` of `count` instances of task `web`.
fn web_job(count: u64) -> Value {
    json!({
        "Region": "global", "Namespace": "default", "ID": "web", "Name": "web", "Type": "service",
        "Priority": 50, "Datacenters": ["dc1"], "NodePool": "default",
        "TaskGroups": [{
            "Name": "web", "Count": count,
            "RestartPolicy": {"Attempts": 2, "Interval": 1_800_000_000_000u64, "Delay": 15_000_000_000u64, "Mode": "fail"},
            "Tasks": [{"Name": "web", "Driver": "docker", "Config": {"image": "nginx:1.27"},
                       "Resources": {"CPU": 500, "Cores": 0, "MemoryMB": 256, "MemoryMaxMB": 0}}]
        }],
        "Status": "running", "Stop": false, "Stable": true, "Version": 1,
        "CreateIndex": 150, "ModifyIndex": 150, "JobModifyIndex": 150
    })
}

async fn night() -> Night {
    let nomad = scenario::nomad("nomad-secret", Arc::new(LabClock::frozen()));
    nomad.add_job(web_job(2));
    nomad.schedule("web");
    let url = serve(nomad.clone().router()).await;
    let app = spawn_app(
        Backend::Sqlite,
        vec![RunnerSpec::new("nomad-hvn01").service_with_header(
            "nomad",
            &url,
            "X-Nomad-Token",
            "nomad-secret",
        )],
        Options::default(),
    )
    .await;
    let approver = signed_in(&app, "alice", Role::Approver).await;
    let agent = app.mcp_client().await;
    Night {
        nomad,
        url,
        app,
        approver,
        agent,
    }
}

impl Night {
    /// Calls `tool`, reads the preview the approver sees, runs `meanwhile` (someone else's
    /// change, or nothing), approves, and returns the preview, the call's result and the
    /// request as it ended.
    async fn approve(
        &self,
        tool: &str,
        args: Value,
        meanwhile: impl AsyncFnOnce(),
    ) -> (Value, CallToolResult, Value) {
        let call = call_in_background(&self.agent, tool, args);
        let id = wait_for_pending(&self.approver).await;
        let (_, request) = self.approver.get(&format!("/api/approvals/{id}")).await;
        let preview = request["preview"]["nomad-hvn01"]["output"].clone();
        assert!(
            preview.is_object(),
            "the approver sees a preview: {request}"
        );
        meanwhile().await;
        let (status, body) = self.approver.approve(&id).await;
        assert_eq!(status, 200, "{body}");
        let result = finished(call).await;
        let (_, ended) = self.approver.get(&format!("/api/approvals/{id}")).await;
        (preview, result, ended)
    }

    /// What the agent is told when a call fails before any request is made.
    async fn refused(&self, tool: &str, args: Value) -> String {
        let res = crate::mcp_calls::call(&self.agent, tool, args).await;
        assert_eq!(res.is_error, Some(true), "{res:?}");
        serde_json::to_string(&res.structured_content).unwrap()
    }

    async fn node(&self, name: &str) -> Value {
        let nodes: Value = self.get("/v1/nodes").await.1;
        let id = nodes
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["Name"] == name)
            .unwrap()["ID"]
            .as_str()
            .unwrap()
            .to_owned();
        self.get(&format!("/v1/node/{id}")).await.1
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        let res = reqwest::Client::new()
            .get(format!("{}{path}", self.url))
            .header("X-Nomad-Token", "nomad-secret")
            .send()
            .await
            .unwrap();
        let status = res.status().as_u16();
        let text = res.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// A write straight to the emulator, as another Nomad client would send it: status and
    /// the text/plain (or JSON) body.
    async fn post(&self, path: &str, body: Value) -> (u16, String) {
        let res = reqwest::Client::new()
            .post(format!("{}{path}", self.url))
            .header("X-Nomad-Token", "nomad-secret")
            .json(&body)
            .send()
            .await
            .unwrap();
        (res.status().as_u16(), res.text().await.unwrap())
    }

    /// The nodes running a live allocation of `job`, by name, sorted.
    async fn nodes_running(&self, job: &str) -> Vec<String> {
        let allocs = self.get(&format!("/v1/job/{job}/allocations")).await.1;
        let mut nodes: Vec<String> = allocs
            .as_array()
            .unwrap()
            .iter()
            .filter(|a| a["DesiredStatus"] == "run")
            .map(|a| a["NodeName"].as_str().unwrap().to_owned())
            .collect();
        nodes.sort();
        nodes
    }
}

fn note(ended: &Value) -> &str {
    ended["note"].as_str().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nomad_node_drain_previews_what_moves_and_refuses_a_node_that_changed() {
    let n = night().await;
    assert_eq!(n.nodes_running("web").await, ["nomad-hvn01", "nomad-hvn02"]);

    let args = json!({"node": "nomad-hvn02", "enable": true, "deadline_seconds": 600,
                      "reason": "hvn02's disk is failing"});
    let (preview, res, ended) = n.approve("nomad.node_drain", args, async || ()).await;
    assert_eq!(preview["node"]["name"], "nomad-hvn02", "{preview}");
    assert_eq!(
        preview["change"],
        json!({"drain": true, "deadline_seconds": 600, "ignore_system_jobs": false,
               "eligibility": {"from": "eligible", "to": "ineligible"}})
    );
    let moves: Vec<(&str, &str)> = preview["allocations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| (a["job"].as_str().unwrap(), a["on_drain"].as_str().unwrap()))
        .collect();
    assert_eq!(
        moves,
        [
            ("traefik", "stopped, not replaced (system job)"),
            ("web", "stopped and placed on another node")
        ],
        "{preview}"
    );
    assert_eq!(
        preview["could_move_to"],
        json!(["nomad-hvn01", "nomad-hvn03", "nomad-hvn04", "nomad-hvn05"])
    );
    assert_eq!(res.is_error, Some(false), "{res:?}");
    assert_eq!(ended["state"], "executed", "{ended}");

    // What reached Nomad, and what Nomad made of it.
    let drains = n.nomad.writes_to("drain");
    assert_eq!(drains.len(), 1, "{drains:?}");
    assert_eq!(
        drains[0]["DrainSpec"],
        json!({"Deadline": 600_000_000_000u64, "IgnoreSystemJobs": false})
    );
    let node = n.node("nomad-hvn02").await;
    assert_eq!(node["SchedulingEligibility"], "ineligible");
    assert_eq!(node["LastDrain"]["Status"], "complete");
    assert_eq!(n.nodes_running("web").await, ["nomad-hvn01", "nomad-hvn03"]);
    assert!(!n.nomad.task_running_on("nomad-hvn02", "traefik"));
    let shown = output(&res);
    assert_eq!(shown["now"]["eligibility"], "ineligible", "{shown}");

    // Ending the drain makes the node eligible: the system job comes back to it.
    let args = json!({"node": "nomad-hvn02", "enable": false, "reason": "disk replaced"});
    let (preview, res, _) = n.approve("nomad.node_drain", args, async || ()).await;
    assert_eq!(
        preview["change"]["eligibility"],
        json!({"from": "ineligible", "to": "eligible"})
    );
    assert_eq!(res.is_error, Some(false), "{res:?}");
    assert_eq!(n.nomad.writes_to("drain")[1]["MarkEligible"], true);
    assert_eq!(
        n.node("nomad-hvn02").await["SchedulingEligibility"],
        "eligible"
    );
    assert!(n.nomad.task_running_on("nomad-hvn02", "traefik"));

    // Someone marks hvn04 ineligible while the drain waits for approval: nothing is sent.
    let before = n.node("nomad-hvn04").await["ModifyIndex"].as_u64().unwrap();
    let mut moved = 0;
    let args = json!({"node": "nomad-hvn04", "enable": true, "reason": "r"});
    let (_, res, ended) = n
        .approve("nomad.node_drain", args, async || {
            moved = n.nomad.set_eligibility("nomad-hvn04", false);
        })
        .await;
    assert_eq!(res.is_error, Some(true), "{res:?}");
    assert_eq!(ended["state"], "failed", "{ended}");
    assert!(
        note(&ended).contains(&format!(
            "node `nomad-hvn04` changed since the preview (ModifyIndex {before} → {moved})"
        )),
        "{ended}"
    );
    assert_eq!(n.nomad.writes_to("drain").len(), 2, "no drain was sent");
    assert!(n.nomad.task_running_on("nomad-hvn04", "traefik"));

    // A node that does not exist, or a drain's options on its end: refused before anyone
    // is asked.
    let err = n
        .refused(
            "nomad.node_drain",
            json!({"node": "nomad-hvn09", "enable": true, "reason": "r"}),
        )
        .await;
    assert!(
        err.contains("no Nomad node is named nomad-hvn09 or has an ID starting with it"),
        "{err}"
    );
    let err = n
        .refused(
            "nomad.node_drain",
            json!({"node": "nomad-hvn01", "enable": false, "deadline_seconds": 60, "reason": "r"}),
        )
        .await;
    assert!(
        err.contains("deadline_seconds and ignore_system_jobs apply only to enable: true"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nomad_node_eligibility_changes_placement_and_refuses_a_node_that_changed() {
    let n = night().await;
    let args =
        json!({"node": "nomad-hvn03", "eligible": false, "reason": "keep new work off hvn03"});
    let (preview, res, _) = n.approve("nomad.node_eligibility", args, async || ()).await;
    assert_eq!(
        preview["eligibility"],
        json!({"from": "eligible", "to": "ineligible"}),
        "{preview}"
    );
    let running: Vec<&str> = preview["allocations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["job"].as_str().unwrap())
        .collect();
    assert_eq!(running, ["traefik"], "{preview}");
    assert_eq!(res.is_error, Some(false), "{res:?}");
    assert_eq!(
        n.nomad.writes_to("eligibility"),
        [json!({"Eligibility": "ineligible"})]
    );
    assert_eq!(
        n.node("nomad-hvn03").await["SchedulingEligibility"],
        "ineligible"
    );
    // The allocation stays; new placements skip the node.
    assert!(n.nomad.task_running_on("nomad-hvn03", "traefik"));
    let (status, _) = n
        .post(
            "/v1/job/web/scale",
            json!({"Count": 4, "Target": {"Group": "web"}}),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(
        n.nodes_running("web").await,
        ["nomad-hvn01", "nomad-hvn02", "nomad-hvn04", "nomad-hvn05"],
        "nothing is placed on an ineligible node"
    );

    // Asking for what the node already has is refused before anyone is asked.
    let err = n
        .refused(
            "nomad.node_eligibility",
            json!({"node": "nomad-hvn03", "eligible": false, "reason": "r"}),
        )
        .await;
    assert!(
        err.contains("node `nomad-hvn03` is already as asked (eligible: false)"),
        "{err}"
    );

    // The node changes while the request waits: nothing is sent.
    let before = n.node("nomad-hvn04").await["ModifyIndex"].as_u64().unwrap();
    let mut moved = 0;
    let args = json!({"node": "nomad-hvn04", "eligible": false, "reason": "r"});
    let (_, res, ended) = n
        .approve("nomad.node_eligibility", args, async || {
            moved = n.nomad.set_eligibility("nomad-hvn04", false);
        })
        .await;
    assert_eq!(res.is_error, Some(true), "{res:?}");
    assert!(
        note(&ended).contains(&format!("(ModifyIndex {before} → {moved})")),
        "{ended}"
    );
    assert_eq!(
        n.nomad.writes_to("eligibility").len(),
        1,
        "nothing was sent"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nomad_alloc_restart_previews_the_tasks_and_refuses_a_moved_allocation() {
    let n = night().await;
    let args = json!({"job": "traefik", "alloc_id": "1c11be31", "task": "traefik",
                      "reason": "pick up the renewed certificate"});
    let (preview, res, _) = n.approve("nomad.alloc_restart", args, async || ()).await;
    assert_eq!(preview["alloc"], OOM_ALLOC, "{preview}");
    assert_eq!(preview["node"], "nomad-hvn04");
    assert_eq!(preview["restart"], "task traefik");
    assert_eq!(preview["tasks"][0]["restarts"], 23);
    assert_eq!(res.is_error, Some(false), "{res:?}");
    assert_eq!(
        n.nomad.writes_to("restart"),
        [json!({"TaskName": "traefik", "AllTasks": false})]
    );
    let shown = output(&res);
    assert_eq!(
        shown["tasks"][0]["restarts"],
        json!({"before": 23, "after": 24}),
        "{shown}"
    );
    let alloc = n.get(&format!("/v1/allocation/{OOM_ALLOC}")).await.1;
    let events: Vec<&str> = alloc["TaskStates"]["traefik"]["Events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["Type"].as_str().unwrap())
        .collect();
    assert!(events.contains(&"Restart Signaled"), "{events:?}");

    // The allocation of another job, or a task it lacks: refused before anyone is asked.
    let err = n
        .refused(
            "nomad.alloc_restart",
            json!({"job": "web", "alloc_id": "1c11be31", "reason": "r"}),
        )
        .await;
    assert!(
        err.contains(&format!(
            "allocation {OOM_ALLOC} does not belong to job `web`"
        )),
        "{err}"
    );
    let err = n
        .refused(
            "nomad.alloc_restart",
            json!({"job": "traefik", "alloc_id": "1c11be31", "task": "nope", "reason": "r"}),
        )
        .await;
    assert!(
        err.contains(&format!("allocation {OOM_ALLOC} has no task `nope`")),
        "{err}"
    );

    // Someone drains hvn01 while the restart of its allocation waits: nothing is restarted.
    let on_hvn01 = n.nomad.allocs_on("nomad-hvn01");
    let traefik_hvn01 = on_hvn01
        .iter()
        .find(|id| id.starts_with("3f2b8d10"))
        .unwrap()
        .clone();
    let hvn01 = n.node("nomad-hvn01").await["ID"]
        .as_str()
        .unwrap()
        .to_owned();
    let args = json!({"job": "traefik", "alloc_id": "3f2b8d10", "reason": "r"});
    let (preview, res, ended) = n
        .approve("nomad.alloc_restart", args, async || {
            let drained = n
                .post(
                    &format!("/v1/node/{hvn01}/drain"),
                    json!({"DrainSpec": {"Deadline": 0, "IgnoreSystemJobs": false}}),
                )
                .await;
            assert_eq!(drained.0, 200, "{}", drained.1);
        })
        .await;
    let seen = preview["alloc_modify_index"].as_u64().unwrap();
    assert_eq!(res.is_error, Some(true), "{res:?}");
    let text = note(&ended);
    assert!(
        text.contains(&format!(
            "allocation {traefik_hvn01} changed since the preview (AllocModifyIndex {seen} → "
        )),
        "{ended}"
    );
    assert_eq!(n.nomad.writes_to("restart").len(), 1, "nothing was sent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nomad_job_scale_previews_the_plan_and_scales_with_check_and_set() {
    let n = night().await;
    let args = json!({"job": "web", "group": "web", "count": 3, "reason": "evening peak"});
    let (preview, res, _) = n.approve("nomad.job_scale", args, async || ()).await;
    assert_eq!(preview["count"], json!({"from": 2, "to": 3}), "{preview}");
    assert_eq!(preview["diff"], json!(["Count 2 → 3"]));
    assert_eq!(preview["updates"]["Place"], 1);
    assert_eq!(preview["updates"]["Ignore"], 2);
    assert_eq!(preview["job_modify_index"], 150);
    assert_eq!(res.is_error, Some(false), "{res:?}");
    let scales = n.nomad.writes_to("scale");
    assert_eq!(
        (
            &scales[0]["Count"],
            &scales[0]["Target"],
            &scales[0]["JobModifyIndex"]
        ),
        (&json!(3), &json!({"Group": "web"}), &json!(150)),
        "the scale asks Nomad for check-and-set at the preview's JobModifyIndex"
    );
    assert_eq!(n.nomad.job("web")["TaskGroups"][0]["Count"], 3);
    assert_eq!(
        n.nodes_running("web").await,
        ["nomad-hvn01", "nomad-hvn02", "nomad-hvn03"]
    );

    // The job moves while the request waits: the pack's own check refuses.
    let seen = n.nomad.job("web")["JobModifyIndex"].as_u64().unwrap();
    let mut moved = 0;
    let args = json!({"job": "web", "group": "web", "count": 1, "reason": "r"});
    let (_, res, ended) = n
        .approve("nomad.job_scale", args.clone(), async || {
            moved = n.nomad.bump_job("web");
        })
        .await;
    assert_eq!(res.is_error, Some(true), "{res:?}");
    assert!(
        note(&ended).contains(&format!(
            "job `web` changed since the preview (JobModifyIndex {seen} → {moved})"
        )),
        "{ended}"
    );
    assert_eq!(n.nomad.writes_to("scale").len(), 1, "nothing was sent");

    // The job moves right after the execution's read: only Nomad's check-and-set can
    // refuse now, and it does.
    let (_, res, ended) = n
        .approve("nomad.job_scale", args, async || {
            n.nomad.bump_after_next_read("web");
        })
        .await;
    assert_eq!(res.is_error, Some(true), "{res:?}");
    let now_at = n.nomad.job("web")["JobModifyIndex"].as_u64().unwrap();
    assert!(
        note(&ended).contains(&format!(
            "Enforcing job modify index {moved}: job exists with conflicting job modify index: {now_at}"
        )),
        "the refusal is Nomad's own: {ended}"
    );
    assert_eq!(n.nomad.job("web")["TaskGroups"][0]["Count"], 3);
    assert_eq!(n.nodes_running("web").await.len(), 3, "nothing was stopped");

    let err = n
        .refused(
            "nomad.job_scale",
            json!({"job": "traefik", "group": "traefik", "count": 2, "reason": "r"}),
        )
        .await;
    assert!(err.contains("job `traefik` is a system job"), "{err}");
}

/// The scale's health gate as a rollout runs it: the runner runs the pack's verify
/// (`Mode::Verify`, no approval) against the emulator. Before the scale the group's count is
/// not the one asked; after it every allocation runs. An allocation that cannot start (the
/// fifth lands on hvn05, whose Consul cannot issue its token) fails the gate, until Consul is
/// fixed and Nomad replaces it with one that runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nomad_job_scale_verify_passes_only_when_the_new_count_runs() {
    let n = night().await;
    let verify = async |count: u64| {
        n.app
            .signed_call(
                "nomad-hvn01",
                "nomad.job_scale",
                json!({"job": "web", "group": "web", "count": count}),
                Mode::Verify,
                None,
            )
            .await
    };
    let failed = |answer: &DirectAnswer, why: &str| {
        assert_eq!(answer.body["status"], "failed", "{}", answer.body);
        assert!(
            answer.body["error"].as_str().unwrap().contains(why),
            "want `{why}`: {}",
            answer.body
        );
    };
    failed(
        &verify(3).await,
        "precondition failed: group `web` of job `web` has count 2, not 3",
    );

    let args = json!({"job": "web", "group": "web", "count": 3, "reason": "evening peak"});
    let (_, res, _) = n.approve("nomad.job_scale", args, async || ()).await;
    assert_eq!(res.is_error, Some(false), "{res:?}");
    let passed = verify(3).await;
    assert_eq!(passed.body["status"], "ok", "{}", passed.body);
    assert_eq!(passed.body["vars"]["running"], 3, "{}", passed.body);
    assert_eq!(passed.body["vars"]["placed"], 3, "{}", passed.body);

    let args = json!({"job": "web", "group": "web", "count": 5, "reason": "bigger peak"});
    let (_, res, _) = n.approve("nomad.job_scale", args, async || ()).await;
    assert_eq!(res.is_error, Some(false), "{res:?}");
    let (_, allocs) = n.get("/v1/job/web/allocations").await;
    let not_running: Vec<&Value> = allocs
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["DesiredStatus"] == "run" && a["ClientStatus"] != "running")
        .map(|a| &a["NodeName"])
        .collect();
    assert_eq!(not_running, [&json!("nomad-hvn05")], "{allocs}");
    failed(
        &verify(5).await,
        "precondition failed: 4 allocations of group `web` run (5 placed); the count is 5",
    );

    n.nomad.consul_ready("nomad-hvn05");
    let healed = verify(5).await;
    assert_eq!(healed.body["status"], "ok", "{}", healed.body);
    assert_eq!(healed.body["vars"]["running"], 5, "{}", healed.body);
}

/// The emulator's write errors, as Nomad answers them (text/plain, its status codes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nomad_emulator_write_errors_are_nomads() {
    let n = night().await;
    let hvn01 = n.node("nomad-hvn01").await["ID"]
        .as_str()
        .unwrap()
        .to_owned();
    let unknown = "00000000-0000-0000-0000-000000000000";
    assert_eq!(
        n.get(&format!("/v1/node/{unknown}")).await,
        (404, json!("node not found"))
    );
    let cases = [
        (
            format!("/v1/node/{unknown}/drain"),
            json!({"DrainSpec": {"Deadline": 1}}),
            (500, "node not found".to_owned()),
        ),
        (
            format!("/v1/node/{hvn01}/eligibility"),
            json!({"Eligibility": "maybe"}),
            (500, "invalid scheduling eligibility \"maybe\"".to_owned()),
        ),
        (
            format!("/v1/client/allocation/{OOM_ALLOC}/restart"),
            json!({"TaskName": "nope"}),
            (500, "Could not find task runner for task: nope".to_owned()),
        ),
        (
            format!("/v1/client/allocation/{OOM_ALLOC}/restart"),
            json!({"TaskName": "traefik", "AllTasks": true}),
            (
                500,
                "task name cannot be set when restarting all tasks".to_owned(),
            ),
        ),
        (
            format!("/v1/client/allocation/{unknown}/restart"),
            json!({}),
            (404, format!("Unknown allocation \"{unknown}\"")),
        ),
        (
            "/v1/job/web/scale".to_owned(),
            json!({"Count": 3, "Target": {"Group": "nope"}}),
            (
                400,
                "task group \"nope\" specified for scaling does not exist in job".to_owned(),
            ),
        ),
        (
            "/v1/job/web/scale".to_owned(),
            json!({"Count": -1, "Target": {"Group": "web"}}),
            (400, "scaling action count can't be negative".to_owned()),
        ),
        (
            "/v1/job/web/scale".to_owned(),
            json!({"Count": 3}),
            (400, "missing task group name for scaling action".to_owned()),
        ),
        (
            "/v1/job/nope/scale".to_owned(),
            json!({"Count": 3, "Target": {"Group": "web"}}),
            (404, "job \"nope\" not found".to_owned()),
        ),
        (
            "/v1/job/web/scale".to_owned(),
            json!({"Count": 3, "Target": {"Group": "web"}, "JobModifyIndex": 1}),
            (
                500,
                "Enforcing job modify index 1: job exists with conflicting job modify index: 150"
                    .to_owned(),
            ),
        ),
    ];
    for (path, body, expected) in cases {
        assert_eq!(n.post(&path, body.clone()).await, expected, "{path} {body}");
    }
    // None of them changed anything.
    assert_eq!(n.nomad.job("web")["TaskGroups"][0]["Count"], 2);
    assert_eq!(
        n.node("nomad-hvn01").await["SchedulingEligibility"],
        "eligible"
    );
}

/// The policy's `nomad_jobs` bounds the job writes (scale, and restart through the job it
/// names), not the node writes, which name no job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nomad_jobs_bounds_the_job_writes_and_not_the_node_writes() {
    let nomad = scenario::nomad("nomad-secret", Arc::new(LabClock::frozen()));
    nomad.add_job(web_job(2));
    nomad.schedule("web");
    let url = serve(nomad.clone().router()).await;
    let policy = tempfile::Builder::new().suffix(".yaml").tempfile().unwrap();
    std::fs::write(
        policy.path(),
        "runners:\n  nomad-hvn01:\n    nomad_jobs: [traefik]\n",
    )
    .unwrap();
    let app = spawn_app(
        Backend::Sqlite,
        vec![RunnerSpec::new("nomad-hvn01").service_with_header(
            "nomad",
            &url,
            "X-Nomad-Token",
            "nomad-secret",
        )],
        Options {
            policy_file: Some(policy.path().to_owned()),
            ..Default::default()
        },
    )
    .await;
    let agent = app.mcp_client().await;
    let web_alloc = nomad
        .allocs_on("nomad-hvn01")
        .into_iter()
        .find(|id| !id.starts_with("3f2b8d10"))
        .expect("web runs on hvn01");
    for (tool, args) in [
        (
            "nomad.job_scale",
            json!({"job": "web", "group": "web", "count": 3, "reason": "r"}),
        ),
        (
            "nomad.alloc_restart",
            json!({"job": "web", "alloc_id": &web_alloc[..8], "reason": "r"}),
        ),
    ] {
        let res = crate::mcp_calls::call(&agent, tool, args).await;
        assert_eq!(res.is_error, Some(true), "{tool}: {res:?}");
        let text = serde_json::to_string(&res.structured_content).unwrap();
        assert!(
            text.contains(
                "the policy's allowlist `runners.nomad-hvn01.nomad_jobs` has only [traefik]"
            ),
            "{tool}: {text}"
        );
    }
    assert!(nomad.writes_to("scale").is_empty());
    assert!(nomad.writes_to("restart").is_empty());

    // A node write names no job: it is asked for, not refused.
    let approver = signed_in(&app, "alice", Role::Approver).await;
    let call = call_in_background(
        &agent,
        "nomad.node_eligibility",
        json!({"node": "nomad-hvn03", "eligible": false, "reason": "r"}),
    );
    let id = wait_for_pending(&approver).await;
    let (status, body) = approver.deny(&id, "not tonight").await;
    assert_eq!(status, 200, "{body}");
    let res = finished(call).await;
    assert_eq!(res.is_error, Some(true), "{res:?}");
    assert!(nomad.writes_to("eligibility").is_empty());
}
