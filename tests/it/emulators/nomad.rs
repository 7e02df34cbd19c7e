//! Nomad's HTTP API for the routes emisar's nomad pack uses: jobs (read, register with
//! EnforceIndex check-and-set, plan with diff), allocations (by ID, by prefix, per job),
//! allocation stats and nodes; ACL tokens via `X-Nomad-Token` or Bearer; text/plain errors.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use super::text_error;

pub struct Nomad {
    pub token: String,
    state: Mutex<NomadState>,
}

struct NomadState {
    index: u64,
    jobs: HashMap<String, Value>,
    allocs: Vec<Value>,
    stats: HashMap<String, Value>,
    nodes: Vec<Value>,
}

pub const OOM_ALLOC: &str = "1c11be31-6a2e-4c1b-9d7e-1f2a3b4c5d6e";
pub const SETUP_FAILED_ALLOC: &str = "f746f2a3-0b1c-4d2e-8f3a-4b5c6d7e8f90";

fn event(kind: &str, time: u64, display: &str, details: Value) -> Value {
    json!({"Type": kind, "Time": time, "Message": "", "DisplayMessage": display, "Details": details,
           "FailsTask": details.get("fails_task").is_some()})
}

impl Nomad {
    /// The case study: Traefik as a system job capped at 1 GiB; hvn04's allocation OOM-looping
    /// (23 restarts), hvn05's failing its Consul setup hook.
    pub fn case_study(token: &str) -> Arc<Nomad> {
        let job = json!({
            "Region": "global", "Namespace": "default", "ID": "traefik", "Name": "traefik", "Type": "system",
            "Priority": 50, "Datacenters": ["dc1"], "NodePool": "default",
            "TaskGroups": [{
                "Name": "traefik", "Count": 1,
                "EphemeralDisk": {"Sticky": false, "SizeMB": 300, "Migrate": false},
                "Tasks": [{
                    "Name": "traefik", "Driver": "docker", "Config": {"image": "traefik:v3.7"},
                    "Resources": {"CPU": 1000, "Cores": 0, "MemoryMB": 1024, "MemoryMaxMB": 0, "DiskMB": 0,
                                  "IOPS": 0, "Networks": null, "Devices": null, "NUMA": null, "SecretsMB": 0},
                    "KillTimeout": 5000000000u64
                }]
            }],
            "Status": "running", "Stop": false, "Stable": true, "Version": 3, "SubmitTime": 1796050000000000000u64,
            "CreateIndex": 52, "ModifyIndex": 96, "JobModifyIndex": 93
        });
        let oom = json!({
            "ID": OOM_ALLOC, "Namespace": "default", "EvalID": "e1", "Name": "traefik.traefik[0]",
            "NodeID": "n4", "NodeName": "nomad-hvn04", "JobID": "traefik", "Job": job.clone(), "TaskGroup": "traefik",
            "DesiredStatus": "run", "DesiredDescription": "", "ClientStatus": "running", "ClientDescription": "Tasks are running",
            "TaskStates": {"traefik": {
                "State": "running", "Failed": false, "Restarts": 23,
                "LastRestart": "2026-11-30T10:11:40Z", "StartedAt": "2026-11-30T10:11:40Z", "FinishedAt": null,
                "Events": [
                    event("Started", 1796055100000000000, "Task started by client", json!({})),
                    event("Terminated", 1796055122000000000, "Exit Code: 137, Exit Message: \"OOM Killed\"",
                          json!({"exit_code": "137", "signal": "0", "oom_killed": "true", "exit_message": "OOM Killed"})),
                    event("Restarting", 1796055122100000000, "Task restarting in 15s",
                          json!({"restart_reason": "Restart within policy", "start_delay": "15000000000"})),
                    event("Started", 1796055137100000000, "Task started by client", json!({})),
                ]}},
            "CreateIndex": 100, "ModifyIndex": 180, "AllocModifyIndex": 100,
            "CreateTime": 1796050000000000000u64, "ModifyTime": 1796055137100000000u64
        });
        let setup_failed = json!({
            "ID": SETUP_FAILED_ALLOC, "Namespace": "default", "EvalID": "e1", "Name": "traefik.traefik[0]",
            "NodeID": "n5", "NodeName": "nomad-hvn05", "JobID": "traefik", "Job": job.clone(), "TaskGroup": "traefik",
            "DesiredStatus": "run", "DesiredDescription": "", "ClientStatus": "failed", "ClientDescription": "Failed tasks",
            "TaskStates": {"traefik": {
                "State": "dead", "Failed": true, "Restarts": 0, "LastRestart": null,
                "StartedAt": null, "FinishedAt": "2026-11-30T10:01:00Z",
                "Events": [
                    event("Received", 1796054000000000000, "Task received by client", json!({})),
                    event("Setup Failure", 1796054060000000000,
                          "failed to setup alloc: pre-run hook \"consul\" failed: Post \"http://127.0.0.1:8500/v1/acl/login\": context deadline exceeded",
                          json!({"fails_task": "true", "kill_reason": "Failed Restoring Task"})),
                ]}},
            "CreateIndex": 101, "ModifyIndex": 150, "AllocModifyIndex": 101,
            "CreateTime": 1796050000000000000u64, "ModifyTime": 1796054060000000000u64
        });
        let mut stats = HashMap::new();
        let usage = 956u64 * 1024 * 1024;
        stats.insert(
            OOM_ALLOC.to_owned(),
            json!({"ResourceUsage": {"MemoryStats": {"RSS": usage - 10_000_000, "Cache": 1744896, "Swap": 0, "Usage": usage,
                                                     "MaxUsage": 0, "KernelUsage": 0, "KernelMaxUsage": 0,
                                                     "Measured": ["RSS", "Cache", "Swap", "Usage"]},
                                     "CpuStats": {"Percent": 61.5, "Measured": ["Percent"]}, "DeviceStats": null},
                   "Tasks": {"traefik": {"ResourceUsage": {"MemoryStats": {"RSS": usage - 10_000_000, "Usage": usage,
                                                                           "Measured": ["RSS", "Cache", "Swap", "Usage"]},
                                                           "CpuStats": {"Percent": 61.5}},
                                         "Timestamp": 1796055243970720000u64, "Pids": null}},
                   "Timestamp": 1796055243970720000u64}),
        );
        let node = |id: &str, name: &str, status: &str| {
            json!({"ID": id, "Name": name, "Address": "10.0.0.1", "Datacenter": "dc1", "NodePool": "default",
                   "Status": status, "SchedulingEligibility": "eligible", "Drain": false, "Version": "1.11.0"})
        };
        Arc::new(Nomad {
            token: token.into(),
            state: Mutex::new(NomadState {
                index: 200,
                jobs: HashMap::from([("traefik".to_owned(), job)]),
                allocs: vec![oom, setup_failed],
                stats,
                nodes: vec![
                    node("n4", "nomad-hvn04", "ready"),
                    node("n5", "nomad-hvn05", "ready"),
                ],
            }),
        })
    }

    /// Someone else re-registers the job (its spec moved): JobModifyIndex changes.
    pub fn bump_job(&self, id: &str) -> u64 {
        let mut s = self.state.lock().unwrap();
        s.index += 1;
        let index = s.index;
        let job = s.jobs.get_mut(id).unwrap();
        job["JobModifyIndex"] = json!(index);
        job["ModifyIndex"] = json!(index);
        job["Version"] = json!(job["Version"].as_u64().unwrap() + 1);
        index
    }

    pub fn job(&self, id: &str) -> Value {
        self.state.lock().unwrap().jobs[id].clone()
    }

    pub fn router(self: Arc<Self>) -> Router {
        Router::new()
            .route("/v1/job/{id}", get(read_job).post(register).put(register))
            .route("/v1/job/{id}/plan", post(plan))
            .route("/v1/job/{id}/allocations", get(job_allocations))
            .route("/v1/allocations", get(allocations))
            .route("/v1/allocation/{id}", get(allocation))
            .route("/v1/client/allocation/{id}/stats", get(stats))
            .route("/v1/nodes", get(nodes))
            .with_state(self)
    }

    /// The refusal for a request without the right token, if any.
    fn refusal(&self, headers: &HeaderMap) -> Option<Response> {
        let token = super::presented_token(headers, "x-nomad-token");
        match token {
            Some(t) if t == self.token => None,
            Some(_) => Some(text_error(403, "ACL token not found")),
            None => Some(text_error(403, "Permission denied")),
        }
    }
}

fn ok(index: u64, body: Value) -> Response {
    (
        [
            ("x-nomad-index", index.to_string()),
            ("x-nomad-knownleader", "true".into()),
        ],
        axum::Json(body),
    )
        .into_response()
}

fn stub(a: &Value) -> Value {
    let mut s = a.clone();
    let o = s.as_object_mut().unwrap();
    o.remove("Job");
    o.insert("JobVersion".into(), a["Job"]["Version"].clone());
    o.insert("JobType".into(), a["Job"]["Type"].clone());
    s
}

async fn read_job(State(n): State<Arc<Nomad>>, Path(id): Path<String>, h: HeaderMap) -> Response {
    if let Some(e) = n.refusal(&h) {
        return e;
    }
    let s = n.state.lock().unwrap();
    match s.jobs.get(&id) {
        Some(job) => ok(job["ModifyIndex"].as_u64().unwrap(), job.clone()),
        None => text_error(404, "job not found"),
    }
}

/// `POST /v1/job/:id` with `nomad/structs/job.go` EnforceIndex semantics.
async fn register(
    State(n): State<Arc<Nomad>>,
    Path(id): Path<String>,
    h: HeaderMap,
    body: String,
) -> Response {
    if let Some(e) = n.refusal(&h) {
        return e;
    }
    let req: Value = match serde_json::from_str(&body) {
        Ok(v) => v,
        Err(e) => return text_error(400, format!("failed to decode request body: {e}")),
    };
    let Some(job) = req.get("Job").filter(|j| j.is_object()).cloned() else {
        return text_error(400, "Job must be specified");
    };
    if job["ID"].as_str().is_none_or(str::is_empty) {
        return text_error(400, "Job ID hasn't been provided");
    }
    if job["ID"] != json!(id) {
        return text_error(400, "Job ID does not match name");
    }
    let mut s = n.state.lock().unwrap();
    if req["EnforceIndex"] == json!(true) {
        let want = req["JobModifyIndex"].as_u64().unwrap_or(0);
        let prefix = format!("Enforcing job modify index {want}");
        match s.jobs.get(&id) {
            Some(_) if want == 0 => {
                return text_error(500, format!("{prefix}: job already exists"));
            }
            None if want != 0 => return text_error(500, format!("{prefix}: job does not exist")),
            Some(current) if current["JobModifyIndex"].as_u64() != Some(want) => {
                return text_error(
                    500,
                    format!(
                        "{prefix}: job exists with conflicting job modify index: {}",
                        current["JobModifyIndex"]
                    ),
                );
            }
            _ => {}
        }
    }
    s.index += 1;
    let index = s.index;
    let version = s
        .jobs
        .get(&id)
        .map_or(0, |j| j["Version"].as_u64().unwrap() + 1);
    let mut job = job;
    job["JobModifyIndex"] = json!(index);
    job["ModifyIndex"] = json!(index);
    job["Version"] = json!(version);
    s.jobs.insert(id, job);
    ok(
        index,
        json!({"EvalID": uuid::Uuid::new_v4().to_string(), "EvalCreateIndex": index, "JobModifyIndex": index,
               "Warnings": "", "Index": index, "LastContact": 0, "KnownLeader": false, "NextToken": ""}),
    )
}

/// `POST /v1/job/:id/plan`: a diff of task resources and the placement annotations.
async fn plan(
    State(n): State<Arc<Nomad>>,
    Path(id): Path<String>,
    h: HeaderMap,
    body: String,
) -> Response {
    if let Some(e) = n.refusal(&h) {
        return e;
    }
    let req: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    let Some(new) = req.get("Job").filter(|j| j.is_object()) else {
        return text_error(400, "Job must be specified");
    };
    if new["ID"] != json!(id) {
        return text_error(400, "Job ID does not match");
    }
    let s = n.state.lock().unwrap();
    let Some(old) = s.jobs.get(&id) else {
        return text_error(404, "job not found");
    };
    let mut tg_diffs = Vec::new();
    let mut updates = serde_json::Map::new();
    for group in new["TaskGroups"].as_array().unwrap() {
        let old_group = old["TaskGroups"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["Name"] == group["Name"]);
        let mut task_diffs = Vec::new();
        for task in group["Tasks"].as_array().unwrap() {
            let old_task = old_group.and_then(|g| {
                g["Tasks"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|t| t["Name"] == task["Name"])
            });
            let mut fields = Vec::new();
            for field in ["CPU", "MemoryMB", "MemoryMaxMB", "Cores"] {
                let before = old_task
                    .map(|t| t["Resources"][field].to_string())
                    .unwrap_or_default();
                let after = task["Resources"][field].to_string();
                if before != after {
                    fields.push(json!({"Type": "Edited", "Name": field, "Old": before, "New": after, "Annotations": null}));
                }
            }
            if !fields.is_empty() {
                task_diffs.push(json!({"Type": "Edited", "Name": task["Name"], "Annotations": ["forces create/destroy update"],
                                       "Fields": null, "Objects": [{"Type": "Edited", "Name": "Resources", "Objects": null, "Fields": fields}]}));
            }
        }
        let count = group["Count"].as_u64().unwrap_or(1);
        let changed = !task_diffs.is_empty();
        updates.insert(
            group["Name"].as_str().unwrap().to_owned(),
            json!({"Ignore": if changed { 0 } else { count }, "Place": 0, "Migrate": 0, "Stop": 0, "InPlaceUpdate": 0,
                   "DestructiveUpdate": if changed { count } else { 0 }, "Canary": 0, "Preemptions": 0}),
        );
        if changed {
            tg_diffs.push(
                json!({"Type": "Edited", "Name": group["Name"], "Fields": null, "Objects": null,
                                 "Updates": {"create/destroy update": count}, "Tasks": task_diffs}),
            );
        }
    }
    let diff_type = if tg_diffs.is_empty() {
        "None"
    } else {
        "Edited"
    };
    ok(
        s.index,
        json!({"JobModifyIndex": old["JobModifyIndex"], "Index": 0, "Warnings": "", "NextPeriodicLaunch": "0001-01-01T00:00:00Z",
               "CreatedEvals": null, "FailedTGAllocs": null,
               "Annotations": {"DesiredTGUpdates": updates, "PreemptedAllocs": null},
               "Diff": {"Type": diff_type, "ID": id, "Fields": null, "Objects": null, "TaskGroups": tg_diffs}}),
    )
}

async fn job_allocations(
    State(n): State<Arc<Nomad>>,
    Path(id): Path<String>,
    h: HeaderMap,
) -> Response {
    if let Some(e) = n.refusal(&h) {
        return e;
    }
    let s = n.state.lock().unwrap();
    ok(
        s.index,
        Value::Array(
            s.allocs
                .iter()
                .filter(|a| a["JobID"] == json!(id))
                .map(stub)
                .collect(),
        ),
    )
}

async fn allocations(
    State(n): State<Arc<Nomad>>,
    Query(q): Query<HashMap<String, String>>,
    h: HeaderMap,
) -> Response {
    if let Some(e) = n.refusal(&h) {
        return e;
    }
    let prefix = q.get("prefix").cloned().unwrap_or_default();
    let s = n.state.lock().unwrap();
    ok(
        s.index,
        Value::Array(
            s.allocs
                .iter()
                .filter(|a| a["ID"].as_str().unwrap().starts_with(&prefix))
                .map(stub)
                .collect(),
        ),
    )
}

async fn allocation(State(n): State<Arc<Nomad>>, Path(id): Path<String>, h: HeaderMap) -> Response {
    if let Some(e) = n.refusal(&h) {
        return e;
    }
    let s = n.state.lock().unwrap();
    match s.allocs.iter().find(|a| a["ID"] == json!(id)) {
        Some(a) => ok(s.index, a.clone()),
        None => text_error(404, "alloc not found"),
    }
}

async fn stats(State(n): State<Arc<Nomad>>, Path(id): Path<String>, h: HeaderMap) -> Response {
    if let Some(e) = n.refusal(&h) {
        return e;
    }
    let s = n.state.lock().unwrap();
    match s.stats.get(&id) {
        Some(st) => ok(s.index, st.clone()),
        None => text_error(404, format!("Unknown allocation \"{id}\"")),
    }
}

async fn nodes(State(n): State<Arc<Nomad>>, h: HeaderMap) -> Response {
    if let Some(e) = n.refusal(&h) {
        return e;
    }
    let s = n.state.lock().unwrap();
    ok(s.index, Value::Array(s.nodes.clone()))
}
