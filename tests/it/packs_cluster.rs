//! The cluster-scoped packs of the lab's incident: Consul and Nomad against the lab's emulators
//! (in the incident's state, on a frozen lab clock), VictoriaMetrics for real. An agent calls
//! these without naming runners; the server picks one. Consul's maintenance writes are about
//! one node's agent, so they name the runner on that node.

use std::sync::Arc;

use emisar::lab::clock::LabClock;
use emisar::lab::consul::Instance;
use emisar::lab::http::serve;
use emisar::lab::scenario::{self, OOM_ALLOC, SETUP_FAILED_ALLOC};
use emisar::protocol::Mode;
use serde_json::{Value, json};

use emisar::server::principal::Role;

use crate::approvals::{
    call_in_background, finished, kinds_of, pending_ids, signed_in, wait_for_pending,
};
use crate::harness::app::{DirectAnswer, Options, TestApp};
use crate::harness::tools::only_output as output;
use crate::harness::vm::VictoriaMetrics;
use crate::harness::{Backend, RunnerSpec, spawn_app};
use crate::mcp_calls::call;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consul_reads_through_a_server_chosen_runner() {
    let consul = scenario::consul("consul-secret", Arc::new(LabClock::frozen()));
    // A second, failing instance, for the `passing` filter.
    consul.register(Instance {
        service: "store-api".into(),
        id: "store-api-2".into(),
        node: "nomad-hvn02".into(),
        port: 23311,
        tags: vec!["http".into()],
        check_status: "critical".into(),
        check_output: "HTTP GET http://10.0.0.102:23311/healthcheck: 503 Service Unavailable"
            .into(),
    });
    let consul = serve(consul.router()).await;
    let app = spawn_app(
        Backend::Sqlite,
        vec![
            RunnerSpec::new("nomad-hvn01").service_with_header(
                "consul",
                &consul,
                "X-Consul-Token",
                "consul-secret",
            ),
            RunnerSpec::new("nomad-hvn02").service_with_header(
                "consul",
                &consul,
                "X-Consul-Token",
                "consul-secret",
            ),
        ],
        Options::default(),
    )
    .await;
    let client = app.mcp_client().await;

    // No runners named: the server picks one and says which.
    let res = call(
        &client,
        "consul.service_health",
        json!({"service": "store-api", "reason": "is the app healthy?"}),
    )
    .await;
    let s = res.structured_content.clone().unwrap();
    assert_eq!(s["runner_chosen_by_server"], true);
    assert_eq!(s["results"].as_array().unwrap().len(), 1);
    let health = output(&res);
    assert_eq!(health[0]["node"], "nomad-hvn01");
    assert_eq!(health[0]["address"], "10.0.0.101:22504");
    assert_eq!(health[0]["status"], "passing");
    assert!(
        health[0]["checks"][1]["output"]
            .as_str()
            .unwrap()
            .contains("200 OK")
    );
    assert_eq!(health[1]["status"], "critical");
    let intent = app.events_of_call(s["call_id"].as_str().unwrap()).await;
    assert_eq!(
        intent[0].detail.as_ref().unwrap()["runner_chosen_by_server"],
        true
    );

    let passing = output(
        &call(
            &client,
            "consul.service_health",
            json!({"service": "store-api", "passing_only": true, "reason": "r"}),
        )
        .await,
    );
    assert_eq!(passing.as_array().unwrap().len(), 1);
    let none = output(
        &call(
            &client,
            "consul.service_health",
            json!({"service": "nope", "reason": "r"}),
        )
        .await,
    );
    assert_eq!(none, json!([]));

    let members = output(
        &call(
            &client,
            "consul.members",
            json!({"reason": "who left the gossip?"}),
        )
        .await,
    );
    let hvn05 = members
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "nomad-hvn05")
        .unwrap();
    assert_eq!(hvn05["status"], "left");
    assert_eq!(hvn05["role"], "server");
    assert_eq!(hvn05["address"], "10.0.0.105:8301");

    let autopilot = output(
        &call(
            &client,
            "consul.autopilot_state",
            json!({"reason": "quorum?"}),
        )
        .await,
    );
    assert_eq!(autopilot["healthy"], true);
    assert_eq!(autopilot["failure_tolerance"], 0);
    assert_eq!(autopilot["leader"], "nomad-hvn01");
    assert_eq!(autopilot["voters"], json!(["nomad-hvn01", "nomad-hvn03"]));

    let services = output(
        &call(
            &client,
            "consul.catalog_services",
            json!({"reason": "what is registered?"}),
        )
        .await,
    );
    let store = services
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["service"] == "store-api")
        .unwrap_or_else(|| panic!("store-api is not in the catalog: {services}"));
    assert!(store["tags"].as_array().unwrap().contains(&json!("http")));

    // Naming a runner for a cluster tool works too; naming two does not.
    let res = call(
        &client,
        "consul.members",
        json!({"runners": ["nomad-hvn02"], "reason": "r"}),
    )
    .await;
    assert_eq!(
        res.structured_content.unwrap()["results"][0]["runner"],
        "nomad-hvn02"
    );
    let res = call(
        &client,
        "consul.members",
        json!({"runners": ["nomad-hvn01", "nomad-hvn02"], "reason": "r"}),
    )
    .await;
    assert_eq!(res.is_error, Some(true));
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consul_errors_come_back_as_consul_said_them() {
    let consul =
        serve(scenario::consul("consul-secret", Arc::new(LabClock::frozen())).router()).await;
    let app = spawn_app(
        Backend::Sqlite,
        vec![RunnerSpec::new("n1").service_with_header(
            "consul",
            &consul,
            "X-Consul-Token",
            "wrong",
        )],
        Options::default(),
    )
    .await;
    let client = app.mcp_client().await;
    let res = call(&client, "consul.members", json!({"reason": "r"})).await;
    assert_eq!(res.is_error, Some(true));
    let err = res.structured_content.unwrap()["results"][0]["error"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        err.contains("consul answered HTTP 403: ACL not found"),
        "{err}"
    );
    assert!(
        !err.contains("wrong"),
        "the credential never leaves the runner: {err}"
    );
    client.cancel().await.unwrap();
}

async fn nomad_app(nomad: &str) -> crate::harness::app::TestApp {
    spawn_app(
        Backend::Sqlite,
        vec![RunnerSpec::new("nomad-hvn01").service_with_header(
            "nomad",
            nomad,
            "X-Nomad-Token",
            "nomad-secret",
        )],
        Options::default(),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nomad_reads_show_the_case_study_signals() {
    let nomad = scenario::nomad("nomad-secret", Arc::new(LabClock::frozen()));
    let url = serve(nomad.clone().router()).await;
    let app = nomad_app(&url).await;
    let client = app.mcp_client().await;

    let res = output(
        &call(
            &client,
            "nomad.job_resources",
            json!({"job": "traefik", "reason": "what is the cap?"}),
        )
        .await,
    );
    assert_eq!(res["job_modify_index"], 93);
    assert_eq!(
        res["groups"][0],
        json!({"group": "traefik", "count": 1, "tasks": [{"task": "traefik", "driver": "docker", "cpu_mhz": 1000,
               "cores": 0, "memory_mib": 1024, "memory_max_mib": 0}]})
    );

    // A short prefix, as an operator types it.
    let oom = output(
        &call(
            &client,
            "nomad.alloc_status",
            json!({"alloc_id": "1c11be31", "reason": "why restarting?"}),
        )
        .await,
    );
    assert_eq!(oom["id"], OOM_ALLOC);
    assert_eq!(oom["node"], "nomad-hvn04");
    let task = &oom["tasks"][0];
    assert_eq!(task["task"], "traefik");
    assert_eq!(task["restarts"], 23);
    // The OOM kills among the events Nomad keeps (the last ten).
    assert_eq!(task["oom_kills"], 3);
    assert_eq!(task["last_exit"]["exit_code"], "137");
    assert_eq!(task["last_exit"]["oom_killed"], true);
    assert_eq!(
        task["last_exit"]["message"],
        "Exit Code: 137, Exit Message: \"OOM Killed\""
    );
    assert_eq!(task["memory_used_mib"], 956);
    assert_eq!(task["memory_limit_mib"], 1024);
    assert_eq!(oom["stats"], "ok");

    let failed = output(
        &call(
            &client,
            "nomad.alloc_status",
            json!({"alloc_id": "f746f2a3", "reason": "why not starting?"}),
        )
        .await,
    );
    assert_eq!(failed["id"], SETUP_FAILED_ALLOC);
    assert_eq!(failed["client_status"], "failed");
    let setup = failed["tasks"][0]["setup_failures"][0].as_str().unwrap();
    assert!(
        setup.contains("pre-run hook \"consul\" failed")
            && setup.contains("context deadline exceeded"),
        "{setup}"
    );
    // No stats for a dead allocation: said, not hidden.
    assert!(
        failed["stats"]
            .as_str()
            .unwrap()
            .contains("Unknown allocation"),
        "{failed}"
    );

    let res = call(
        &client,
        "nomad.alloc_status",
        json!({"alloc_id": "ffff", "reason": "r"}),
    )
    .await;
    assert_eq!(res.is_error, Some(true));
    let err = res.structured_content.unwrap()["results"][0]["error"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(err.contains("no allocation ID starts with ffff"), "{err}");

    let allocs = output(
        &call(
            &client,
            "nomad.job_allocations",
            json!({"job": "traefik", "reason": "r"}),
        )
        .await,
    );
    assert_eq!(allocs.as_array().unwrap().len(), 5);
    let hvn04 = allocs
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["node"] == "nomad-hvn04")
        .unwrap();
    assert_eq!(hvn04["tasks"]["traefik"]["restarts"], 23);
    let status = output(
        &call(
            &client,
            "nomad.job_status",
            json!({"job": "traefik", "reason": "r"}),
        )
        .await,
    );
    assert_eq!(status["type"], "system");
    let nodes = output(&call(&client, "nomad.node_status", json!({"reason": "r"})).await);
    assert_eq!(nodes[4]["name"], "nomad-hvn05");

    let res = call(
        &client,
        "nomad.job_resources",
        json!({"job": "nope", "reason": "r"}),
    )
    .await;
    let err = res.structured_content.unwrap()["results"][0]["error"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        err.contains("nomad answered HTTP 404: job not found"),
        "{err}"
    );
    client.cancel().await.unwrap();
}

/// `nomad.task_resources_set` signed as the server signs it, straight to `nomad-hvn01`:
/// a preview, or an execution with the preview's vars (`None`: without them).
async fn resources_set(
    app: &TestApp,
    args: Value,
    mode: Mode,
    preview: Option<&DirectAnswer>,
) -> DirectAnswer {
    app.signed_call(
        "nomad-hvn01",
        "nomad.task_resources_set",
        args,
        mode,
        preview,
    )
    .await
}

/// The arguments that set the traefik task's memory to `mib`.
fn traefik_memory(mib: u32) -> Value {
    json!({"job": "traefik", "group": "traefik", "task": "traefik", "memory": mib})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nomad_task_resources_set_previews_the_plan_and_writes_with_check_and_set() {
    let nomad = scenario::nomad("nomad-secret", Arc::new(LabClock::frozen()));
    let url = serve(nomad.clone().router()).await;
    let app = nomad_app(&url).await;
    let args = traefik_memory(4096);

    // The runner alone: preview, then execution with the preview's vars (the approval flow
    // through the server is in approvals.rs).

    // Preview: the plan diff an approver will see.
    let preview = resources_set(&app, args.clone(), Mode::Preview, None).await;
    assert_eq!(preview.status, 200, "{}", preview.body);
    assert_eq!(preview.body["status"], "ok", "{}", preview.body);
    let shown = &preview.body["output"];
    assert_eq!(shown["diff"], json!(["MemoryMB 1024 → 4096"]));
    assert_eq!(
        shown["change"]["memory_mib"],
        json!({"from": 1024, "to": 4096})
    );
    assert_eq!(
        shown["change"]["cpu_mhz"],
        json!({"from": 1000, "to": 1000})
    );
    // Every node's allocation is replaced (a resources change is destructive).
    assert_eq!(shown["updates"]["traefik"]["DestructiveUpdate"], 5);
    assert_eq!(shown["job_modify_index"], 93);
    assert_eq!(preview.body["vars"]["job_modify_index"], 93);
    assert_eq!(
        nomad.job("traefik")["JobModifyIndex"],
        93,
        "a preview writes nothing"
    );

    // Executing needs the preview's values.
    let blind = resources_set(&app, args.clone(), Mode::Execute, None).await;
    assert_eq!(blind.body["status"], "failed");
    assert!(
        blind.body["error"]
            .as_str()
            .unwrap()
            .contains("run the preview first")
    );

    // Execute with them: one task's memory changes, nothing else.
    let before = nomad.job("traefik");
    let done = resources_set(&app, args.clone(), Mode::Execute, Some(&preview)).await;
    assert_eq!(done.body["status"], "ok", "{}", done.body);
    assert_eq!(done.body["output"]["job_modify_index"]["before"], 93);
    // What reached Nomad: one register, with check-and-set at the preview's index.
    let registers = nomad.registers();
    assert_eq!(registers.len(), 1, "{registers:?}");
    assert_eq!(
        (
            &registers[0]["EnforceIndex"],
            &registers[0]["JobModifyIndex"]
        ),
        (&json!(true), &json!(93)),
        "the register must ask Nomad for check-and-set at the preview's JobModifyIndex"
    );
    let after = nomad.job("traefik");
    assert_eq!(
        after["TaskGroups"][0]["Tasks"][0]["Resources"]["MemoryMB"],
        4096
    );
    assert_eq!(after["TaskGroups"][0]["Tasks"][0]["Resources"]["CPU"], 1000);
    let mut expected = before.clone();
    expected["TaskGroups"][0]["Tasks"][0]["Resources"]["MemoryMB"] = json!(4096);
    for moved in [
        "JobModifyIndex",
        "ModifyIndex",
        "Version",
        "SubmitTime",
        "Stable",
    ] {
        expected[moved] = after[moved].clone();
    }
    assert_eq!(
        after, expected,
        "only MemoryMB (and Nomad's own indexes) changed"
    );

    // The job moves between preview and execution: the write refuses and says why.
    let preview = resources_set(&app, traefik_memory(8192), Mode::Preview, None).await;
    let seen = preview.body["vars"]["job_modify_index"].as_u64().unwrap();
    let moved_to = nomad.bump_job("traefik");
    let refused = resources_set(&app, traefik_memory(8192), Mode::Execute, Some(&preview)).await;
    assert_eq!(refused.body["status"], "failed", "{}", refused.body);
    let err = refused.body["error"].as_str().unwrap();
    assert!(
        err.contains(&format!(
            "changed since the preview (JobModifyIndex {seen} → {moved_to})"
        )),
        "{err}"
    );
    assert_eq!(
        nomad.job("traefik")["TaskGroups"][0]["Tasks"][0]["Resources"]["MemoryMB"],
        4096,
        "nothing was written"
    );

    // The job moves after the pack's own check has passed (right after the execution's read,
    // before its write): only Nomad's check-and-set can refuse now, and it does.
    let preview = resources_set(&app, traefik_memory(8192), Mode::Preview, None).await;
    assert_eq!(preview.body["status"], "ok", "{}", preview.body);
    let raced = preview.body["vars"]["job_modify_index"].as_u64().unwrap();
    nomad.bump_after_next_read("traefik");
    let refused = resources_set(&app, traefik_memory(8192), Mode::Execute, Some(&preview)).await;
    let moved_to = nomad.job("traefik")["JobModifyIndex"].as_u64().unwrap();
    assert_eq!(
        refused.body["status"], "failed",
        "a write racing another must be refused by Nomad's check-and-set: {}",
        refused.body
    );
    let err = refused.body["error"].as_str().unwrap();
    assert!(
        err.contains(&format!(
            "Enforcing job modify index {raced}: job exists with conflicting job modify index: {moved_to}"
        )),
        "the refusal is Nomad's own: {err}"
    );
    assert!(
        !err.contains("changed since the preview"),
        "the pack's check passed; the refusal must come from Nomad: {err}"
    );
    assert_eq!(
        nomad.job("traefik")["TaskGroups"][0]["Tasks"][0]["Resources"]["MemoryMB"],
        4096,
        "nothing was written"
    );
    let last = nomad.registers().pop().unwrap();
    assert_eq!(
        (&last["EnforceIndex"], &last["JobModifyIndex"]),
        (&json!(true), &json!(raced))
    );
    let seen = raced;

    // Nomad's own check-and-set, as its API answers it: plain-text HTTP 500.
    let mut stale = nomad.job("traefik");
    stale["TaskGroups"][0]["Tasks"][0]["Resources"]["MemoryMB"] = json!(8192);
    let res = reqwest::Client::new()
        .post(format!("{url}/v1/job/traefik"))
        .header("X-Nomad-Token", "nomad-secret")
        .json(&json!({"Job": stale, "EnforceIndex": true, "JobModifyIndex": seen}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 500);
    assert!(
        res.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain")
    );
    assert_eq!(
        res.text().await.unwrap(),
        format!(
            "Enforcing job modify index {seen}: job exists with conflicting job modify index: {moved_to}"
        )
    );

    // A task that does not exist is named in the refusal.
    let res = resources_set(
        &app,
        json!({"job": "traefik", "group": "traefik", "task": "nope", "cpu": 500}),
        Mode::Preview,
        None,
    )
    .await;
    assert!(
        res.body["error"]
            .as_str()
            .unwrap()
            .contains("job `traefik` has no task `nope` in group `traefik`"),
        "{}",
        res.body
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vm_query_instant_returns_a_pushed_sample() {
    let vm = VictoriaMetrics::start().await;
    vm.push("traefik_service_requests_total{service=\"match-api\",code=\"200\"} 1751\ntraefik_service_requests_total{service=\"web\",code=\"200\"} 179\n", "traefik_service_requests_total").await;
    let app = spawn_app(
        Backend::Sqlite,
        vec![RunnerSpec::new("nomad-hvn01").service("victoriametrics", &vm.url)],
        Options::default(),
    )
    .await;
    let client = app.mcp_client().await;
    let res = output(
        &call(
            &client,
            "vm.query_instant",
            json!({"query": "topk(5, sum by(service) (traefik_service_requests_total))", "reason": "which service drives the load?"}),
        )
        .await,
    );
    let rows = res.as_array().unwrap();
    assert_eq!(rows.len(), 2, "{res}");
    assert_eq!(rows[0]["metric"]["service"], "match-api");
    assert_eq!(rows[0]["value"], "1751");
    // A query VictoriaMetrics cannot parse: its own error, named.
    let res = call(
        &client,
        "vm.query_instant",
        json!({"query": "sum(up", "reason": "r"}),
    )
    .await;
    assert_eq!(res.is_error, Some(true));
    let err = res.structured_content.unwrap()["results"][0]["error"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(err.contains("victoriametrics answered HTTP 422"), "{err}");
    client.cancel().await.unwrap();
}

/// A PUT to one of the emulated agent's endpoints, with the token or without; returns the
/// status and the text Consul answered.
async fn agent_put(agent: &str, path_and_query: &str, token: Option<&str>) -> (u16, String) {
    let mut req = reqwest::Client::new().put(format!("{agent}{path_and_query}"));
    if let Some(t) = token {
        req = req.header("X-Consul-Token", t);
    }
    let res = req.send().await.unwrap();
    (res.status().as_u16(), res.text().await.unwrap())
}

/// The emulated agent refuses what Consul refuses, with Consul's words.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consul_agent_maintenance_errors_are_consuls() {
    let consul = scenario::consul("consul-secret", Arc::new(LabClock::frozen()));
    let agent = serve(consul.clone().agent_router("nomad-hvn02")).await;
    let secret = Some("consul-secret");
    let cases = [
        ("/v1/agent/maintenance", secret, 400, "Missing value for enable".to_owned()),
        ("/v1/agent/maintenance?enable=maybe", secret, 400, r#"Invalid value for enable: "maybe""#.to_owned()),
        ("/v1/agent/service/maintenance/web-1?reason=x", secret, 400, "Missing value for enable".to_owned()),
        ("/v1/agent/maintenance?enable=true", Some("wrong"), 403, "ACL not found".to_owned()),
        (
            "/v1/agent/maintenance?enable=true",
            None,
            403,
            "Permission denied: token with AccessorID '00000000-0000-0000-0000-000000000002' lacks permission 'node:write'".to_owned(),
        ),
        (
            "/v1/agent/service/maintenance/web?enable=true",
            secret,
            404,
            r#"Unknown service ID "web". Ensure that the service ID is passed, not the service name."#.to_owned(),
        ),
        // An instance of another node's agent is not this agent's to change.
        (
            "/v1/agent/service/maintenance/_nomad-task-00-store-api-22504?enable=true",
            secret,
            404,
            r#"Unknown service ID "_nomad-task-00-store-api-22504". Ensure that the service ID is passed, not the service name."#.to_owned(),
        ),
    ];
    for (path, token, status, text) in cases {
        assert_eq!(
            agent_put(&agent, path, token).await,
            (status, text),
            "{path}"
        );
    }
    assert!(!consul.in_maintenance("nomad-hvn02"), "nothing changed");
    let get = reqwest::Client::new()
        .get(format!("{agent}/v1/agent/maintenance?enable=true"))
        .header("X-Consul-Token", "consul-secret")
        .send()
        .await
        .unwrap();
    assert_eq!(get.status(), 405, "maintenance is PUT only");

    // Entering without a reason: Consul's default Notes, in every health answer.
    assert_eq!(
        agent_put(&agent, "/v1/agent/maintenance?enable=1", secret).await,
        (200, String::new())
    );
    let health: Value = reqwest::Client::new()
        .get(format!("{agent}/v1/health/service/feed"))
        .header("X-Consul-Token", "consul-secret")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let maint = &health[0]["Checks"][1];
    assert_eq!(maint["CheckID"], "_node_maintenance", "{health}");
    assert_eq!(maint["Name"], "Node Maintenance Mode");
    assert_eq!(maint["Status"], "critical");
    assert_eq!(maint["ServiceID"], "");
    assert_eq!(
        maint["Notes"],
        "Maintenance mode is enabled for this node, but no reason was provided. This is a default message."
    );
    let critical: Value = reqwest::Client::new()
        .get(format!("{agent}/v1/health/state/critical"))
        .header("X-Consul-Token", "consul-secret")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        critical
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["Node"] == "nomad-hvn02" && c["CheckID"] == "_node_maintenance"),
        "{critical}"
    );
}

/// The maintenance writes through MCP against the emulated agent of nomad-hvn02 (instances of
/// `web` on hvn02 and hvn04, of `feed` on hvn02 only): preview, a person's yes, execution.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consul_maintenance_previews_waits_for_a_person_and_changes_the_agent() {
    let consul = scenario::consul("consul-secret", Arc::new(LabClock::frozen()));
    let agent = serve(consul.clone().agent_router("nomad-hvn02")).await;
    let app = spawn_app(
        Backend::Sqlite,
        vec![RunnerSpec::new("nomad-hvn02").service_with_header(
            "consul",
            &agent,
            "X-Consul-Token",
            "consul-secret",
        )],
        Options::default(),
    )
    .await;
    let client = app.mcp_client().await;
    let alice = signed_in(&app, "alice", Role::Approver).await;
    let on_hvn02 = |extra: Value| {
        let mut args = extra;
        args["runners"] = json!(["nomad-hvn02"]);
        args["reason"] = json!("hvn02 reboots for its kernel");
        args
    };

    // The node: the approver sees the check that goes critical and what each service loses.
    let asked = call_in_background(
        &client,
        "consul.node_maintenance",
        on_hvn02(json!({"enable": true, "note": "kernel upgrade, back by 03:00"})),
    );
    let id = wait_for_pending(&alice).await;
    let (_, request) = alice.get(&format!("/api/approvals/{id}")).await;
    let preview = &request["preview"]["nomad-hvn02"]["output"];
    assert_eq!(
        *preview,
        json!({"node": "nomad-hvn02", "maintenance": {"from": false, "to": true},
               "checks_going_critical": [{"node": "nomad-hvn02", "check_id": "_node_maintenance",
                                          "name": "Node Maintenance Mode", "notes": "kernel upgrade, back by 03:00"}],
               "checks_clearing": [],
               "services": [
                   {"service": "feed", "instances": 1, "on_this_node": 1, "passing_now": 1, "passing_after": 0},
                   {"service": "web", "instances": 2, "on_this_node": 1, "passing_now": 2, "passing_after": 1}]}),
        "{request}"
    );
    assert!(
        !consul.in_maintenance("nomad-hvn02"),
        "nothing before the yes"
    );
    let (status, body) = alice.approve(&id).await;
    assert_eq!(status, 200, "{body}");
    let res = finished(asked).await;
    assert_eq!(res.is_error, Some(false), "{res:?}");
    let out = res.structured_content.unwrap();
    assert_eq!(
        out["results"][0]["output"]["check_after"],
        json!({"check_id": "_node_maintenance", "status": "critical", "notes": "kernel upgrade, back by 03:00"}),
        "{out}"
    );
    assert!(consul.in_maintenance("nomad-hvn02"));
    let web = output(
        &call(
            &client,
            "consul.service_health",
            json!({"service": "web", "passing_only": true, "reason": "who serves web now?"}),
        )
        .await,
    );
    assert_eq!(web.as_array().unwrap().len(), 1, "{web}");
    assert_eq!(web[0]["node"], "nomad-hvn04");

    // Asking again: nothing to change, so nobody is asked.
    let res = call(
        &client,
        "consul.node_maintenance",
        on_hvn02(json!({"enable": true})),
    )
    .await;
    let error = res.structured_content.clone().unwrap()["error"].clone();
    assert_eq!(error["kind"], "preview_failed", "{res:?}");
    assert!(
        error
            .to_string()
            .contains("node `nomad-hvn02` is already in maintenance: there is nothing to change"),
        "{error}"
    );

    // Check-and-set: the node leaves maintenance by other hands while the request waits.
    let asked = call_in_background(
        &client,
        "consul.node_maintenance",
        on_hvn02(json!({"enable": false})),
    );
    let id = wait_for_pending(&alice).await;
    let (_, request) = alice.get(&format!("/api/approvals/{id}")).await;
    assert_eq!(
        request["preview"]["nomad-hvn02"]["output"]["checks_clearing"],
        json!([{"node": "nomad-hvn02", "check_id": "_node_maintenance", "notes": "kernel upgrade, back by 03:00"}]),
        "{request}"
    );
    assert_eq!(
        agent_put(
            &agent,
            "/v1/agent/maintenance?enable=false",
            Some("consul-secret")
        )
        .await,
        (200, String::new())
    );
    let (status, body) = alice.approve(&id).await;
    assert_eq!(status, 200, "{body}");
    let res = finished(asked).await;
    let out = res.structured_content.unwrap();
    assert_eq!(out["approval"]["state"], "failed", "{out}");
    assert!(
        out.to_string().contains(
            "node `nomad-hvn02`'s maintenance mode changed since the preview (in maintenance: true → false): nothing was changed"
        ),
        "{out}"
    );
    assert_eq!(
        kinds_of(&app, &id).await,
        [
            "tool.called",
            "approval.requested",
            "approval.approved",
            "approval.executing",
            "call.failed"
        ]
    );

    // One instance: web on hvn02 goes, web on hvn04 stays.
    let web_on_hvn02 = "_nomad-task-02-web-21080";
    let asked = call_in_background(
        &client,
        "consul.service_maintenance",
        on_hvn02(json!({"service_id": web_on_hvn02, "enable": true})),
    );
    let id = wait_for_pending(&alice).await;
    let (_, request) = alice.get(&format!("/api/approvals/{id}")).await;
    assert_eq!(
        request["preview"]["nomad-hvn02"]["output"],
        json!({"node": "nomad-hvn02", "service": "web", "instance": web_on_hvn02,
               "maintenance": {"from": false, "to": true},
               "checks_going_critical": [{"node": "nomad-hvn02", "check_id": format!("_service_maintenance:{web_on_hvn02}"),
                                          "name": "Service Maintenance Mode",
                                          "notes": "Maintenance mode is enabled for this service, but no reason was provided. This is a default message."}],
               "checks_clearing": [], "instances": 2, "passing_now": 2, "passing_after": 1}),
        "{request}"
    );
    let (status, body) = alice.approve(&id).await;
    assert_eq!(status, 200, "{body}");
    let res = finished(asked).await;
    assert_eq!(res.is_error, Some(false), "{res:?}");
    let out = res.structured_content.unwrap();
    assert_eq!(out["results"][0]["output"]["passing_after"], 1, "{out}");
    let web = output(
        &call(
            &client,
            "consul.service_health",
            json!({"service": "web", "reason": "which web instance is out?"}),
        )
        .await,
    );
    let hvn02 = web
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["node"] == "nomad-hvn02")
        .unwrap();
    assert_eq!(hvn02["status"], "critical", "{web}");
    assert!(!consul.in_maintenance("nomad-hvn02"), "only the instance");

    // An ID this agent does not have (a service name, or another node's instance): refused in
    // the preview.
    for wrong in ["web", "_nomad-task-00-store-api-22504"] {
        let res = call(
            &client,
            "consul.service_maintenance",
            on_hvn02(json!({"service_id": wrong, "enable": true})),
        )
        .await;
        let error = res.structured_content.clone().unwrap()["error"].clone();
        assert_eq!(error["kind"], "preview_failed", "{res:?}");
        assert!(
            error.to_string().contains(&format!(
                "no service instance with ID `{wrong}` is registered with the Consul agent on node `nomad-hvn02`"
            )),
            "{error}"
        );
    }
    assert!(pending_ids(&alice).await.is_empty());
    client.cancel().await.unwrap();
}
