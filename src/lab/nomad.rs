//! Nomad's HTTP API for the routes the nomad pack uses: jobs (read, register with
//! EnforceIndex check-and-set, plan with diff), allocations (by ID, by prefix, per job),
//! allocation stats and nodes; ACL tokens via `X-Nomad-Token` or Bearer; text/plain errors
//! with Nomad's status codes and texts.
//!
//! Allocations are a model rendered at the lab clock's time, not canned JSON: each one was
//! placed on a node at some time and either failed its Consul pre-run hook (the node's
//! Consul agent could not issue a token) or runs its task, which the cgroup OOM-kills every
//! `oom_period` while the task's memory limit is below what it needs under the current load.
//! So restart counts, events and memory use move as lab time passes; registering a new job
//! version rolls new allocations onto every node one `Stagger` apart, and a node whose Consul
//! becomes ready gets its failed allocation replaced by a running one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use tokio::sync::watch;

use super::clock::{LabClock, rfc3339, unix_nanos};
use super::http::{presented_token, text_error};

/// Nomad prints a zero `time.Time` this way.
const ZERO_TIME: &str = "0001-01-01T00:00:00Z";
const MIB: u64 = 1024 * 1024;

/// A Nomad client node.
#[derive(Debug, Clone)]
pub struct Node {
    pub id: String,
    pub name: String,
    pub address: String,
    /// Whether the node's local Consul agent can issue workload tokens (the allocations'
    /// Consul pre-run hook succeeds).
    pub consul_ready: bool,
}

/// How an allocation's task fares once placed.
#[derive(Debug, Clone)]
pub enum Life {
    /// The Consul pre-run hook failed; the task never started.
    SetupFailed { message: String },
    /// The task runs. With `first_kill`, it is OOM-killed then and every `oom_period` after,
    /// and restarted after the job's restart delay.
    Running { first_kill: Option<SystemTime> },
}

/// One allocation as placed.
#[derive(Debug, Clone)]
pub struct Alloc {
    pub id: String,
    pub node_id: String,
    pub job_id: String,
    /// The job as it was when the allocation was placed.
    pub job: Value,
    pub group: String,
    /// When it was placed; it does not exist before.
    pub created: SystemTime,
    /// When a newer allocation replaced it.
    pub stopped: Option<SystemTime>,
    pub life: Life,
    pub previous: Option<String>,
    pub next: Option<String>,
    pub create_index: u64,
}

pub struct Nomad {
    token: String,
    clock: Arc<LabClock>,
    state: Mutex<NomadState>,
    changed: watch::Sender<u64>,
}

struct NomadState {
    index: u64,
    jobs: HashMap<String, Value>,
    allocs: Vec<Alloc>,
    nodes: Vec<Node>,
    /// MiB a task needs under the current load, by task name; a lower limit is OOM-killed.
    demand_mib: HashMap<String, u64>,
    /// How often a task below its demand is OOM-killed.
    oom_period: Duration,
    /// The memory a task starts with after a restart (it grows to its limit by the kill).
    base_mib: u64,
    /// Every register request body received, in order (refused ones included), so a test
    /// can check what a client actually sent.
    registers: Vec<Value>,
    /// Jobs to re-register as someone else right after their next read is answered: the
    /// race between a client's read and its write, on demand.
    bump_after_read: Vec<String>,
}

impl Nomad {
    pub fn new(token: &str, clock: Arc<LabClock>, oom_period: Duration, base_mib: u64) -> Nomad {
        Nomad {
            token: token.to_owned(),
            clock,
            state: Mutex::new(NomadState {
                index: 200,
                jobs: HashMap::new(),
                allocs: Vec::new(),
                nodes: Vec::new(),
                demand_mib: HashMap::new(),
                oom_period,
                base_mib,
                registers: Vec::new(),
                bump_after_read: Vec::new(),
            }),
            changed: watch::channel(0).0,
        }
    }

    pub fn clock(&self) -> &Arc<LabClock> {
        &self.clock
    }

    pub fn add_node(&self, node: Node) {
        self.state.lock().expect("nomad state").nodes.push(node);
    }

    pub fn add_job(&self, job: Value) {
        let id = job["ID"].as_str().expect("a job has an ID").to_owned();
        self.state.lock().expect("nomad state").jobs.insert(id, job);
    }

    pub fn add_alloc(&self, alloc: Alloc) {
        self.state.lock().expect("nomad state").allocs.push(alloc);
    }

    /// What task `task` needs, in MiB, under the current load.
    pub fn set_demand(&self, task: &str, mib: u64) {
        self.state
            .lock()
            .expect("nomad state")
            .demand_mib
            .insert(task.to_owned(), mib);
    }

    /// Tells about every change to jobs or allocations (its value is Nomad's index).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Someone else re-registers the job (its spec moved): JobModifyIndex changes.
    pub fn bump_job(&self, id: &str) -> u64 {
        self.state.lock().expect("nomad state").bump(id)
    }

    /// Someone else re-registers job `id` right after the next `GET /v1/job/{id}` is
    /// answered, so a client's write that follows its read finds the index moved.
    pub fn bump_after_next_read(&self, id: &str) {
        let mut s = self.state.lock().expect("nomad state");
        s.bump_after_read.push(id.to_owned());
    }

    /// The body of every register request received, in order.
    pub fn registers(&self) -> Vec<Value> {
        self.state.lock().expect("nomad state").registers.clone()
    }

    pub fn job(&self, id: &str) -> Value {
        self.state.lock().expect("nomad state").jobs[id].clone()
    }
}

impl NomadState {
    /// Someone else re-registers job `id`: its indexes and version move, its spec stays.
    fn bump(&mut self, id: &str) -> u64 {
        self.index += 1;
        let index = self.index;
        let job = self.jobs.get_mut(id).expect("the job exists");
        job["JobModifyIndex"] = json!(index);
        job["ModifyIndex"] = json!(index);
        job["Version"] = json!(job["Version"].as_u64().unwrap_or(0) + 1);
        index
    }
}

impl Nomad {
    /// The node's Consul agent can issue tokens again: its failed allocation is replaced now
    /// by one of the current job version (superseding a replacement a rolling update had
    /// scheduled for later), and allocations scheduled for later will start.
    pub fn consul_ready(&self, node_name: &str) {
        let now = self.clock.now();
        let mut s = self.state.lock().expect("nomad state");
        let Some(node) = s.nodes.iter_mut().find(|n| n.name == node_name) else {
            return;
        };
        node.consul_ready = true;
        let node_id = node.id.clone();
        let failed: Vec<usize> = s
            .allocs
            .iter()
            .enumerate()
            .filter(|(_, a)| {
                a.node_id == node_id
                    && a.created <= now
                    && a.stopped.is_none_or(|t| t > now)
                    && matches!(a.life, Life::SetupFailed { .. })
            })
            .map(|(i, _)| i)
            .collect();
        let mut superseded = Vec::new();
        let mut placed = Vec::new();
        for i in failed {
            superseded.extend(s.allocs[i].next.clone());
            let job = s.jobs[&s.allocs[i].job_id].clone();
            let group = s.allocs[i].group.clone();
            let previous = s.allocs[i].id.clone();
            let new = s.place(&job, &group, &node_id, now, Some(previous));
            s.allocs[i].stopped = Some(now);
            s.allocs[i].next = Some(new.id.clone());
            placed.push(new);
        }
        s.allocs
            .retain(|a| !(a.created > now && superseded.contains(&a.id)));
        s.allocs.extend(placed);
        // Placements still to come will find the node's Consul ready.
        let period = s.oom_period;
        let demand = s.demand_mib.clone();
        for a in s
            .allocs
            .iter_mut()
            .filter(|a| a.node_id == node_id && a.created > now)
        {
            if matches!(a.life, Life::SetupFailed { .. }) {
                a.life = running_life(&a.job, &a.group, &demand, period, a.created);
            }
        }
        s.index += 1;
        let index = s.index;
        drop(s);
        self.changed.send_replace(index);
    }

    /// Whether task `task` runs on node `node_name` now (placed, not stopped, not failed).
    pub fn task_running_on(&self, node_name: &str, task: &str) -> bool {
        let now = self.clock.now();
        let s = self.state.lock().expect("nomad state");
        let Some(node) = s.nodes.iter().find(|n| n.name == node_name) else {
            return false;
        };
        s.allocs.iter().any(|a| {
            a.node_id == node.id
                && a.created <= now
                && a.stopped.is_none_or(|t| t > now)
                && matches!(a.life, Life::Running { .. })
                && task_names(&a.job, &a.group).iter().any(|t| t == task)
        })
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
        match presented_token(headers, "x-nomad-token") {
            Some(t) if t == self.token => None,
            Some(_) => Some(text_error(403, "ACL token not found")),
            None => Some(text_error(403, "Permission denied")),
        }
    }
}

fn task_names(job: &Value, group: &str) -> Vec<String> {
    job["TaskGroups"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|g| g["Name"] == group)
        .flat_map(|g| g["Tasks"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t["Name"].as_str().map(str::to_owned))
        .collect()
}

fn task_memory(job: &Value, group: &str, task: &str) -> u64 {
    job["TaskGroups"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|g| g["Name"] == group)
        .flat_map(|g| g["Tasks"].as_array().cloned().unwrap_or_default())
        .find(|t| t["Name"] == task)
        .and_then(|t| t["Resources"]["MemoryMB"].as_u64())
        .unwrap_or(0)
}

/// The job's restart delay (`RestartPolicy.Delay` of the group, nanoseconds in JSON).
fn restart_delay(job: &Value, group: &str) -> Duration {
    job["TaskGroups"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|g| g["Name"] == group)
        .and_then(|g| g["RestartPolicy"]["Delay"].as_u64())
        .map_or(Duration::from_secs(15), Duration::from_nanos)
}

/// The rolling update's pause between nodes (`Update.Stagger`, nanoseconds in JSON).
fn stagger(job: &Value) -> Duration {
    job["Update"]["Stagger"]
        .as_u64()
        .map_or(Duration::from_secs(30), Duration::from_nanos)
}

fn event(kind: &str, at: SystemTime, display: &str, details: Value) -> Value {
    let fails = details.get("fails_task").is_some();
    let mut e = json!({"Type": kind, "Time": unix_nanos(at), "Message": "", "DisplayMessage": display,
                       "Details": details, "FailsTask": fails});
    if kind == "Terminated" {
        e["Message"] = e["Details"]["exit_message"].clone();
        e["ExitCode"] = json!(137);
        e["Signal"] = json!(0);
    }
    e
}

/// "1s", "1m10s": Go's time.Duration formatting for whole seconds.
fn go_duration(d: Duration) -> String {
    let s = d.as_secs();
    match (s / 3600, (s % 3600) / 60, s % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, s) => format!("{m}m{s}s"),
        (h, m, s) => format!("{h}h{m}m{s}s"),
    }
}

impl NomadState {
    fn node(&self, id: &str) -> Option<&Node> {
        self.nodes.iter().find(|n| n.id == id)
    }

    /// A new allocation of `job`'s `group` on `node_id` at `at`: failing its Consul hook
    /// when the node's Consul cannot issue tokens, else running (OOM-looping when a task's
    /// limit is below its demand).
    fn place(
        &mut self,
        job: &Value,
        group: &str,
        node_id: &str,
        at: SystemTime,
        previous: Option<String>,
    ) -> Alloc {
        self.index += 1;
        let consul_ready = self.node(node_id).is_some_and(|n| n.consul_ready);
        let life = if consul_ready {
            running_life(job, group, &self.demand_mib, self.oom_period, at)
        } else {
            Life::SetupFailed {
                message: consul_hook_failure(),
            }
        };
        Alloc {
            id: uuid::Uuid::new_v4().to_string(),
            node_id: node_id.to_owned(),
            job_id: job["ID"].as_str().unwrap_or_default().to_owned(),
            job: job.clone(),
            group: group.to_owned(),
            created: at,
            stopped: None,
            life,
            previous,
            next: None,
            create_index: self.index,
        }
    }

    /// The allocation as `GET /v1/allocation/:id` shows it at lab time `t`.
    fn render(&self, a: &Alloc, t: SystemTime) -> Value {
        let node = self.node(&a.node_id);
        let stopped = a.stopped.filter(|s| *s <= t);
        let end = stopped.unwrap_or(t);
        let mut task_states = serde_json::Map::new();
        let mut client_status = "running";
        let mut client_description = "Tasks are running";
        for task in task_names(&a.job, &a.group) {
            let (state, client) = self.task_state(a, end, stopped);
            if client == "failed" {
                client_status = "failed";
                client_description = "Failed tasks";
            } else if client == "complete" && client_status != "failed" {
                client_status = "complete";
                client_description = "All tasks have completed";
            } else if client == "pending" && client_status == "running" {
                client_status = "pending";
                client_description = "Tasks are restarting";
            }
            task_states.insert(task, state);
        }
        let (desired, desired_description) = match (stopped, &a.life) {
            (None, _) => ("run", ""),
            (Some(_), Life::SetupFailed { .. }) => {
                ("stop", "alloc was rescheduled because it failed")
            }
            (Some(_), Life::Running { .. }) => ("stop", "alloc is being updated due to job update"),
        };
        let index = a.create_index + 1;
        json!({
            "ID": a.id, "Namespace": a.job["Namespace"], "EvalID": format!("{:0>8}-5d3e-4b1f-9a7c-{:0>12}", a.create_index, a.create_index),
            "Name": format!("{}.{}[0]", a.job_id, a.group),
            "NodeID": a.node_id, "NodeName": node.map(|n| n.name.clone()),
            "JobID": a.job_id, "Job": a.job, "TaskGroup": a.group,
            "DesiredStatus": desired, "DesiredDescription": desired_description,
            "ClientStatus": client_status, "ClientDescription": client_description,
            "TaskStates": task_states,
            "DeploymentStatus": if matches!(a.life, Life::Running { .. }) { json!({"Healthy": true, "Timestamp": rfc3339(a.created), "Canary": false, "ModifyIndex": index}) } else { Value::Null },
            "PreviousAllocation": a.previous.clone().unwrap_or_default(),
            "NextAllocation": a.next.clone().unwrap_or_default(),
            "FollowupEvalID": "",
            "RescheduleTracker": null,
            "CreateIndex": a.create_index, "ModifyIndex": index, "AllocModifyIndex": a.create_index,
            "CreateTime": unix_nanos(a.created), "ModifyTime": unix_nanos(end),
        })
    }

    /// A task's state at `end` (lab time, or when the allocation was stopped) and what it
    /// makes of the client status: running, pending (restarting), failed or complete.
    fn task_state(
        &self,
        a: &Alloc,
        end: SystemTime,
        stopped: Option<SystemTime>,
    ) -> (Value, &'static str) {
        let mut events = vec![event(
            "Received",
            a.created,
            "Task received by client",
            json!({}),
        )];
        match &a.life {
            Life::SetupFailed { message } => {
                let at = a.created + Duration::from_secs(10);
                events.push(event(
                    "Setup Failure",
                    at,
                    message,
                    json!({"fails_task": "true", "kill_reason": "Failed Restoring Task"}),
                ));
                let mut e = events.pop().expect("just pushed");
                e["SetupError"] = json!(message);
                e["KillReason"] = json!("Failed Restoring Task");
                events.push(e);
                let state = json!({"State": "dead", "Failed": true, "Restarts": 0, "LastRestart": ZERO_TIME,
                                   "StartedAt": ZERO_TIME, "FinishedAt": rfc3339(at), "Events": events, "Paused": false});
                (state, "failed")
            }
            Life::Running { first_kill } => {
                let delay = restart_delay(&a.job, &a.group);
                events.push(event(
                    "Task Setup",
                    a.created,
                    "Building Task Directory",
                    json!({"message": "Building Task Directory"}),
                ));
                events.push(event(
                    "Started",
                    a.created,
                    "Task started by client",
                    json!({}),
                ));
                let mut restarts = 0u64;
                let mut last_start = a.created;
                let mut restarting = false;
                if let Some(first) = first_kill {
                    let kills = if end < *first {
                        0
                    } else {
                        (end.duration_since(*first).unwrap_or_default().as_secs_f64()
                            / self.oom_period.as_secs_f64()) as u64
                            + 1
                    };
                    // Only the last few cycles: Nomad keeps ten events per task.
                    for k in kills.saturating_sub(4)..kills {
                        let kill = *first + self.oom_period.mul_f64(k as f64);
                        events.push(event(
                            "Terminated",
                            kill,
                            "Exit Code: 137, Exit Message: \"OOM Killed\"",
                            json!({"exit_code": "137", "signal": "0", "oom_killed": "true", "exit_message": "OOM Killed"}),
                        ));
                        events.push(event(
                            "Restarting",
                            kill,
                            &format!("Task restarting in {}", go_duration(delay)),
                            json!({"restart_reason": "Restart within policy", "start_delay": delay.as_nanos().to_string()}),
                        ));
                        let start = kill + delay;
                        if start <= end {
                            events.push(event(
                                "Started",
                                start,
                                "Task started by client",
                                json!({}),
                            ));
                            restarts += 1;
                            last_start = start;
                        } else {
                            restarting = true;
                        }
                    }
                    restarts += kills.saturating_sub(4);
                }
                if let Some(at) = stopped {
                    events.push(event(
                        "Killing",
                        at,
                        "Sent interrupt. Waiting 5s before force killing",
                        json!({"kill_timeout": "5s"}),
                    ));
                    events.push(event("Killed", at, "Task successfully killed", json!({})));
                }
                let len = events.len();
                let events: Vec<Value> = events.into_iter().skip(len.saturating_sub(10)).collect();
                let last_restart = if restarts > 0 {
                    rfc3339(last_start)
                } else {
                    ZERO_TIME.to_owned()
                };
                let (state, client, finished) = match stopped {
                    Some(at) => ("dead", "complete", rfc3339(at)),
                    None if restarting => ("pending", "pending", ZERO_TIME.to_owned()),
                    None => ("running", "running", ZERO_TIME.to_owned()),
                };
                let state = json!({"State": state, "Failed": false, "Restarts": restarts, "LastRestart": last_restart,
                                   "StartedAt": rfc3339(last_start), "FinishedAt": finished, "Events": events, "Paused": false});
                (state, client)
            }
        }
    }

    /// Memory use of each running task of `a` at `t`, in bytes; None unless it runs.
    fn memory_use(&self, a: &Alloc, t: SystemTime) -> Option<Vec<(String, u64)>> {
        if a.created > t || a.stopped.is_some_and(|s| s <= t) {
            return None;
        }
        let Life::Running { first_kill } = &a.life else {
            return None;
        };
        let delay = restart_delay(&a.job, &a.group);
        let run = self.oom_period.saturating_sub(delay);
        let mut out = Vec::new();
        for task in task_names(&a.job, &a.group) {
            let limit = task_memory(&a.job, &a.group, &task);
            let demand = self.demand_mib.get(&task).copied().unwrap_or(limit / 2);
            let mib = match first_kill {
                // Grows from its start to the limit, where the cgroup kills it.
                Some(first) => {
                    let since_start = if t < *first {
                        t.duration_since(a.created).unwrap_or_default()
                    } else {
                        let into = t.duration_since(*first).unwrap_or_default().as_secs_f64()
                            % self.oom_period.as_secs_f64();
                        Duration::from_secs_f64(into).saturating_sub(delay)
                    };
                    let frac = (since_start.as_secs_f64() / run.as_secs_f64()).min(1.0);
                    self.base_mib as f64 + (limit.saturating_sub(self.base_mib)) as f64 * frac
                }
                // Settles a little under what it needs at peak.
                None => demand as f64 * 0.94,
            };
            out.push((task, (mib * MIB as f64) as u64));
        }
        Some(out)
    }

    fn visible(&self, t: SystemTime) -> impl Iterator<Item = &Alloc> {
        self.allocs.iter().filter(move |a| a.created <= t)
    }

    /// Every node's current allocation of `job_id` at `t` (placed, not stopped).
    fn live(&self, job_id: &str, t: SystemTime) -> Vec<usize> {
        self.allocs
            .iter()
            .enumerate()
            .filter(|(_, a)| a.job_id == job_id && a.created <= t && a.stopped.is_none())
            .map(|(i, _)| i)
            .collect()
    }
}

/// A task placed at `at` runs; it is OOM-killed every `period` from its first run on when a
/// task's memory limit is below what it needs.
fn running_life(
    job: &Value,
    group: &str,
    demand: &HashMap<String, u64>,
    period: Duration,
    at: SystemTime,
) -> Life {
    let short = task_names(job, group)
        .into_iter()
        .any(|t| task_memory(job, group, &t) < demand.get(&t).copied().unwrap_or(0));
    let run = period.saturating_sub(restart_delay(job, group));
    Life::Running {
        first_kill: short.then(|| at + run),
    }
}

/// What the Consul pre-run hook reports when the node's agent cannot issue a token.
pub fn consul_hook_failure() -> String {
    "failed to setup alloc: pre-run hook \"consul\" failed: Post \"http://127.0.0.1:8500/v1/acl/login\": context deadline exceeded".to_owned()
}

fn ok(index: u64, body: Value) -> Response {
    (
        [
            ("x-nomad-index", index.to_string()),
            ("x-nomad-knownleader", "true".into()),
            ("x-nomad-lastcontact", "0".into()),
        ],
        axum::Json(body),
    )
        .into_response()
}

fn stub(full: &Value) -> Value {
    let mut s = full.clone();
    if let Some(o) = s.as_object_mut() {
        o.remove("Job");
        o.insert("JobVersion".into(), full["Job"]["Version"].clone());
        o.insert("JobType".into(), full["Job"]["Type"].clone());
    }
    s
}

async fn read_job(State(n): State<Arc<Nomad>>, Path(id): Path<String>, h: HeaderMap) -> Response {
    if let Some(e) = n.refusal(&h) {
        return e;
    }
    let mut s = n.state.lock().expect("nomad state");
    let answer = match s.jobs.get(&id) {
        Some(job) => ok(job["ModifyIndex"].as_u64().unwrap_or(s.index), job.clone()),
        None => text_error(404, "job not found"),
    };
    if let Some(at) = s.bump_after_read.iter().position(|j| *j == id) {
        s.bump_after_read.remove(at);
        s.bump(&id);
    }
    answer
}

/// `POST /v1/job/:id` with `nomad/structs/job.go` EnforceIndex semantics; a new version of
/// a running system job rolls onto every node one `Update.Stagger` apart.
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
    let now = n.clock.now();
    let mut s = n.state.lock().expect("nomad state");
    s.registers.push(req.clone());
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
        .map_or(0, |j| j["Version"].as_u64().unwrap_or(0) + 1);
    let mut job = job;
    job["JobModifyIndex"] = json!(index);
    job["ModifyIndex"] = json!(index);
    job["Version"] = json!(version);
    job["SubmitTime"] = json!(unix_nanos(now));
    job["Stable"] = json!(false);
    s.jobs.insert(id.clone(), job.clone());
    // The rolling update: each node's allocation is replaced in turn.
    let step = stagger(&job);
    let mut live = s.live(&id, now);
    live.sort_by_key(|&i| {
        s.node(&s.allocs[i].node_id)
            .map(|n| n.name.clone())
            .unwrap_or_default()
    });
    for (k, i) in live.into_iter().enumerate() {
        let at = now + step.mul_f64(k as f64);
        let (node_id, group, previous) = {
            let a = &s.allocs[i];
            (a.node_id.clone(), a.group.clone(), a.id.clone())
        };
        let new = s.place(&job, &group, &node_id, at, Some(previous));
        s.allocs[i].stopped = Some(at);
        s.allocs[i].next = Some(new.id.clone());
        s.allocs.push(new);
    }
    drop(s);
    n.changed.send_replace(index);
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
    let req: Value = match serde_json::from_str(&body) {
        Ok(v) => v,
        Err(e) => return text_error(400, format!("failed to decode request body: {e}")),
    };
    let Some(new) = req.get("Job").filter(|j| j.is_object()) else {
        return text_error(400, "Job must be specified");
    };
    if new["ID"].as_str().is_none_or(str::is_empty) {
        return text_error(400, "Job must have a valid ID");
    }
    if new["ID"] != json!(id) {
        return text_error(400, "Job ID does not match");
    }
    let now = n.clock.now();
    let s = n.state.lock().expect("nomad state");
    let Some(old) = s.jobs.get(&id) else {
        return text_error(404, "job not found");
    };
    let live = s.live(&id, now).len() as u64;
    let mut tg_diffs = Vec::new();
    let mut updates = serde_json::Map::new();
    for group in new["TaskGroups"].as_array().into_iter().flatten() {
        let old_group = old["TaskGroups"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|g| g["Name"] == group["Name"]);
        let mut task_diffs = Vec::new();
        for task in group["Tasks"].as_array().into_iter().flatten() {
            let old_task = old_group.and_then(|g| {
                g["Tasks"]
                    .as_array()
                    .into_iter()
                    .flatten()
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
        let changed = !task_diffs.is_empty();
        updates.insert(
            group["Name"].as_str().unwrap_or_default().to_owned(),
            json!({"Ignore": if changed { 0 } else { live }, "Place": 0, "Migrate": 0, "Stop": 0, "InPlaceUpdate": 0,
                   "DestructiveUpdate": if changed { live } else { 0 }, "Canary": 0, "Preemptions": 0}),
        );
        if changed {
            tg_diffs.push(
                json!({"Type": "Edited", "Name": group["Name"], "Fields": null, "Objects": null,
                                 "Updates": {"create/destroy update": live}, "Tasks": task_diffs}),
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
        json!({"JobModifyIndex": old["JobModifyIndex"], "Index": 0, "Warnings": "", "NextPeriodicLaunch": ZERO_TIME,
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
    let now = n.clock.now();
    let s = n.state.lock().expect("nomad state");
    if !s.jobs.contains_key(&id) {
        return ok(s.index, json!([]));
    }
    let list: Vec<Value> = s
        .visible(now)
        .filter(|a| a.job_id == id)
        .map(|a| stub(&s.render(a, now)))
        .collect();
    ok(s.index, Value::Array(list))
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
    let now = n.clock.now();
    let s = n.state.lock().expect("nomad state");
    let list: Vec<Value> = s
        .visible(now)
        .filter(|a| a.id.starts_with(&prefix))
        .map(|a| stub(&s.render(a, now)))
        .collect();
    ok(s.index, Value::Array(list))
}

async fn allocation(State(n): State<Arc<Nomad>>, Path(id): Path<String>, h: HeaderMap) -> Response {
    if let Some(e) = n.refusal(&h) {
        return e;
    }
    let now = n.clock.now();
    let s = n.state.lock().expect("nomad state");
    match s.visible(now).find(|a| a.id == id) {
        Some(a) => ok(s.index, s.render(a, now)),
        None => text_error(404, "alloc not found"),
    }
}

/// `GET /v1/client/allocation/:id/stats`: served by the client running the allocation, so
/// an allocation that does not run has none.
async fn stats(State(n): State<Arc<Nomad>>, Path(id): Path<String>, h: HeaderMap) -> Response {
    if let Some(e) = n.refusal(&h) {
        return e;
    }
    let now = n.clock.now();
    let s = n.state.lock().expect("nomad state");
    let usage = s
        .visible(now)
        .find(|a| a.id == id)
        .and_then(|a| s.memory_use(a, now));
    let Some(usage) = usage else {
        return text_error(404, format!("Unknown allocation \"{id}\""));
    };
    let ts = unix_nanos(now);
    let memory = |bytes: u64| {
        json!({"RSS": bytes - bytes / 50, "Cache": bytes / 50, "Swap": 0, "Usage": bytes, "MaxUsage": 0,
               "KernelUsage": 0, "KernelMaxUsage": 0, "Measured": ["RSS", "Cache", "Swap", "Usage"]})
    };
    let cpu = json!({"SystemMode": 4.2, "UserMode": 57.3, "TotalTicks": 1843.0, "ThrottledPeriods": 0,
                     "ThrottledTime": 0, "Percent": 61.5, "Measured": ["Throttled Periods", "Throttled Time", "Percent"]});
    let total: u64 = usage.iter().map(|(_, b)| b).sum();
    let tasks: serde_json::Map<String, Value> = usage
        .iter()
        .map(|(task, bytes)| {
            (
                task.clone(),
                json!({"ResourceUsage": {"MemoryStats": memory(*bytes), "CpuStats": cpu, "DeviceStats": null},
                       "Timestamp": ts, "Pids": null}),
            )
        })
        .collect();
    ok(
        s.index,
        json!({"ResourceUsage": {"MemoryStats": memory(total), "CpuStats": cpu, "DeviceStats": null},
               "Tasks": tasks, "Timestamp": ts}),
    )
}

async fn nodes(
    State(n): State<Arc<Nomad>>,
    Query(q): Query<HashMap<String, String>>,
    h: HeaderMap,
) -> Response {
    if let Some(e) = n.refusal(&h) {
        return e;
    }
    let prefix = q.get("prefix").cloned().unwrap_or_default();
    let s = n.state.lock().expect("nomad state");
    let list: Vec<Value> = s
        .nodes
        .iter()
        .filter(|node| node.id.starts_with(&prefix))
        .map(|node| {
            json!({"ID": node.id, "Name": node.name, "Address": node.address, "Datacenter": "dc1",
                   "NodePool": "default", "NodeClass": "", "Status": "ready", "StatusDescription": "",
                   "SchedulingEligibility": "eligible", "Drain": false, "Version": "1.11.0",
                   "Drivers": {"docker": {"Detected": true, "Healthy": true}},
                   "CreateIndex": 7, "ModifyIndex": s.index})
        })
        .collect();
    ok(s.index, Value::Array(list))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lab::scenario;

    async fn resize(n: &Arc<Nomad>, memory: u64) {
        let mut job = n.job("traefik");
        job["TaskGroups"][0]["Tasks"][0]["Resources"]["MemoryMB"] = json!(memory);
        let index = job["JobModifyIndex"].clone();
        let mut h = HeaderMap::new();
        h.insert("x-nomad-token", "t".parse().unwrap());
        let body = json!({"Job": job, "EnforceIndex": true, "JobModifyIndex": index}).to_string();
        let res = register(State(n.clone()), Path("traefik".into()), h, body).await;
        assert_eq!(res.status(), 200);
    }

    /// hvn05 ends up running the new version whichever write lands first.
    #[tokio::test]
    async fn consul_and_resize_in_either_order() {
        for consul_first in [true, false] {
            let clock = Arc::new(LabClock::frozen());
            let n = scenario::nomad("t", clock.clone());
            assert!(!n.task_running_on("nomad-hvn05", "traefik"));
            if consul_first {
                n.consul_ready("nomad-hvn05");
                assert!(n.task_running_on("nomad-hvn05", "traefik"));
                resize(&n, 4096).await;
            } else {
                resize(&n, 4096).await;
                n.consul_ready("nomad-hvn05");
                assert!(n.task_running_on("nomad-hvn05", "traefik"));
            }
            clock.advance(Duration::from_secs(3600));
            let now = clock.now();
            let s = n.state.lock().unwrap();
            for node in scenario::NODES {
                let id = &s.nodes.iter().find(|x| x.name == node).unwrap().id;
                let live: Vec<&Alloc> = s
                    .allocs
                    .iter()
                    .filter(|a| &a.node_id == id && a.created <= now && a.stopped.is_none())
                    .collect();
                assert_eq!(live.len(), 1, "{node} (consul first: {consul_first})");
                assert_eq!(live[0].job["Version"], 4, "{node}");
                assert!(
                    matches!(live[0].life, Life::Running { first_kill: None }),
                    "{node}: {:?}",
                    live[0].life
                );
            }
        }
    }
}
