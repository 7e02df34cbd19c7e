//! Nomad's HTTP API for the routes the nomad pack uses: jobs (read, register with
//! EnforceIndex check-and-set, plan with diff, scale with its JobModifyIndex check),
//! allocations (by ID, by prefix, per job, per node; restart), allocation stats and nodes
//! (list, read, drain, eligibility); ACL tokens via `X-Nomad-Token` or Bearer; text/plain
//! errors with Nomad's status codes and texts.
//!
//! Allocations are a model rendered at the lab clock's time, not canned JSON: each one was
//! placed on a node at some time and either failed its Consul pre-run hook (the node's
//! Consul agent could not issue a token) or runs its task, which the cgroup OOM-kills every
//! `oom_period` while the task's memory limit is below what it needs under the current load.
//! So restart counts, events and memory use move as lab time passes; registering a new job
//! version rolls new allocations onto every node one `Stagger` apart, and a node whose Consul
//! becomes ready gets its failed allocation replaced by a running one.
//!
//! The writes change the model as Nomad would. A drain completes at once (no lab time
//! passes): the node becomes ineligible, its service allocations stop and are replaced on
//! the other eligible nodes (fewest allocations of the job first), its system allocations
//! stop and are not replaced (unless `IgnoreSystemJobs`), and `LastDrain` says `complete`.
//! A node made eligible again gets the system jobs' allocations back. A restart adds a
//! "Restart Signaled" cycle to the task's events and one to its restart count. A scale
//! changes the group's count (a new job version) and places or stops allocations at once.

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
use super::http::{Guarded, guarded, presented_token, text_error};

/// Nomad prints a zero `time.Time` this way.
const ZERO_TIME: &str = "0001-01-01T00:00:00Z";
const MIB: u64 = 1024 * 1024;
/// `DesiredDescription` of a stopped allocation, by why it stopped.
const JOB_UPDATE: &str = "alloc is being updated due to job update";
const RESCHEDULED: &str = "alloc was rescheduled because it failed";
const MIGRATED: &str = "alloc is being migrated";
const NOT_NEEDED: &str = "alloc not needed due to job update";
/// What Nomad's client says when a restart names a task that is not running.
const TASK_NOT_RUNNING: &str = "Task not running";

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
    /// Each node's scheduling state, by node ID (absent: eligible, never drained).
    sched: HashMap<String, Sched>,
    /// Restarts people asked for, by allocation ID: (task, when).
    user_restarts: HashMap<String, Vec<(String, SystemTime)>>,
    /// Why an allocation was stopped and the index of that change, by allocation ID.
    stops: HashMap<String, (&'static str, u64)>,
    /// An allocation's index in its group (`job.group[N]`), by allocation ID (absent: 0).
    slots: HashMap<String, u64>,
    /// The body of every drain, eligibility, restart and scale request received, in order,
    /// with the endpoint's name.
    writes: Vec<(&'static str, Value)>,
}

/// A node's scheduling state: what drains and eligibility changes move.
#[derive(Debug, Clone)]
struct Sched {
    eligible: bool,
    /// `LastDrain` as Nomad shows it, once a drain ran.
    last_drain: Option<Value>,
    modify_index: u64,
}

impl Default for Sched {
    fn default() -> Sched {
        Sched {
            eligible: true,
            last_drain: None,
            modify_index: NODE_CREATE_INDEX,
        }
    }
}

/// The index the lab's nodes registered at.
const NODE_CREATE_INDEX: u64 = 7;

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
                sched: HashMap::new(),
                user_restarts: HashMap::new(),
                stops: HashMap::new(),
                slots: HashMap::new(),
                writes: Vec::new(),
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

    /// The body of every request received at `endpoint` (`drain`, `eligibility`, `restart`,
    /// `scale`), in order, refused ones included.
    pub fn writes_to(&self, endpoint: &str) -> Vec<Value> {
        let s = self.state.lock().expect("nomad state");
        s.writes
            .iter()
            .filter(|(e, _)| *e == endpoint)
            .map(|(_, body)| body.clone())
            .collect()
    }

    /// Someone else changes node `node_name`'s eligibility (its ModifyIndex moves); returns
    /// the new ModifyIndex.
    pub fn set_eligibility(&self, node_name: &str, eligible: bool) -> u64 {
        let now = self.clock.now();
        let mut s = self.state.lock().expect("nomad state");
        let id = s
            .nodes
            .iter()
            .find(|n| n.name == node_name)
            .map(|n| n.id.clone())
            .expect("the node exists");
        s.set_eligible(&id, eligible, now);
        let index = s.index;
        drop(s);
        self.changed.send_replace(index);
        index
    }

    /// Places each group of job `id` up to its `Count` now, as the scheduler does when a
    /// service job is registered (system jobs: one per eligible node).
    pub fn schedule(&self, id: &str) {
        let now = self.clock.now();
        let mut s = self.state.lock().expect("nomad state");
        let job = s.jobs[id].clone();
        for group in job["TaskGroups"].as_array().into_iter().flatten() {
            let name = group["Name"].as_str().unwrap_or_default();
            s.converge(id, name, group["Count"].as_u64().unwrap_or(0), now);
        }
        let index = s.index;
        drop(s);
        self.changed.send_replace(index);
    }

    /// The IDs of the allocations running on node `node_name` now (placed, not stopped).
    pub fn allocs_on(&self, node_name: &str) -> Vec<String> {
        let now = self.clock.now();
        let s = self.state.lock().expect("nomad state");
        let Some(node) = s.nodes.iter().find(|n| n.name == node_name) else {
            return Vec::new();
        };
        s.allocs
            .iter()
            .filter(|a| a.node_id == node.id && a.created <= now && a.stopped.is_none())
            .map(|a| a.id.clone())
            .collect()
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
            s.stop(i, now, RESCHEDULED, Some(new.id.clone()));
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

    /// Every route behind the cluster's ACL token (`http::guarded`).
    pub fn router(self: Arc<Self>) -> Router {
        let routes = Router::new()
            .route("/v1/job/{id}", get(read_job).post(register).put(register))
            .route("/v1/job/{id}/plan", post(plan))
            .route("/v1/job/{id}/allocations", get(job_allocations))
            .route("/v1/allocations", get(allocations))
            .route("/v1/allocation/{id}", get(allocation))
            .route("/v1/client/allocation/{id}/stats", get(stats))
            .route(
                "/v1/client/allocation/{id}/restart",
                post(alloc_restart).put(alloc_restart),
            )
            .route("/v1/job/{id}/scale", post(scale).put(scale))
            .route("/v1/nodes", get(nodes))
            .route("/v1/node/{id}", get(node))
            .route("/v1/node/{id}/allocations", get(node_allocations))
            .route("/v1/node/{id}/drain", post(drain).put(drain))
            .route(
                "/v1/node/{id}/eligibility",
                post(eligibility).put(eligibility),
            );
        guarded(routes, self.clone()).with_state(self)
    }
}

impl Guarded for Nomad {
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
            let (state, client) = self.task_state(a, &task, end, stopped);
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
        let stop = self.stops.get(&a.id);
        let (desired, desired_description) = match (stopped, stop) {
            (None, _) => ("run", ""),
            (Some(_), Some((why, _))) => ("stop", *why),
            (Some(_), None) => ("stop", JOB_UPDATE),
        };
        let alloc_modify_index = stop.map_or(a.create_index, |(_, i)| *i);
        let index = (a.create_index + 1).max(alloc_modify_index);
        let slot = self.slots.get(&a.id).copied().unwrap_or(0);
        json!({
            "ID": a.id, "Namespace": a.job["Namespace"], "EvalID": format!("{:0>8}-5d3e-4b1f-9a7c-{:0>12}", a.create_index, a.create_index),
            "Name": format!("{}.{}[{slot}]", a.job_id, a.group),
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
            "CreateIndex": a.create_index, "ModifyIndex": index, "AllocModifyIndex": alloc_modify_index,
            "CreateTime": unix_nanos(a.created), "ModifyTime": unix_nanos(end),
        })
    }

    /// A task's state at `end` (lab time, or when the allocation was stopped) and what it
    /// makes of the client status: running, pending (restarting), failed or complete.
    fn task_state(
        &self,
        a: &Alloc,
        task: &str,
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
                for at in self.restarts_asked(&a.id, task, end) {
                    events.extend(user_restart_events(at));
                    restarts += 1;
                    last_start = last_start.max(at);
                }
                events.sort_by_key(|e| e["Time"].as_u64().unwrap_or(0));
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

/// The events of one restart a person asked for: signaled, stopped, restarted at once.
fn user_restart_events(at: SystemTime) -> Vec<Value> {
    let reason = "User requested task to restart";
    let mut terminated = event(
        "Terminated",
        at,
        "Exit Code: 0",
        json!({"exit_code": "0", "signal": "0", "oom_killed": "false", "exit_message": ""}),
    );
    terminated["ExitCode"] = json!(0);
    vec![
        event(
            "Restart Signaled",
            at,
            reason,
            json!({"restart_reason": reason}),
        ),
        terminated,
        event(
            "Restarting",
            at,
            "Task restarting in 0s",
            json!({"restart_reason": reason, "start_delay": "0"}),
        ),
        event("Started", at, "Task started by client", json!({})),
    ]
}

impl NomadState {
    /// Stops allocation `i` at `at` for `why`; `next` replaces it.
    fn stop(&mut self, i: usize, at: SystemTime, why: &'static str, next: Option<String>) {
        self.index += 1;
        let a = &mut self.allocs[i];
        a.stopped = Some(at);
        a.next = next;
        self.stops.insert(a.id.clone(), (why, self.index));
    }

    /// When people asked task `task` of allocation `id` to restart, up to `end`.
    fn restarts_asked(&self, id: &str, task: &str, end: SystemTime) -> Vec<SystemTime> {
        self.user_restarts
            .get(id)
            .into_iter()
            .flatten()
            .filter(|(t, at)| t == task && *at <= end)
            .map(|(_, at)| *at)
            .collect()
    }

    fn sched(&self, node_id: &str) -> Sched {
        self.sched.get(node_id).cloned().unwrap_or_default()
    }

    /// The node as `GET /v1/node/:id` shows it (the list adds nothing it lacks).
    fn node_json(&self, node: &Node) -> Value {
        let sched = self.sched(&node.id);
        json!({"ID": node.id, "Name": node.name, "Address": node.address,
               "HTTPAddr": format!("{}:4646", node.address), "Datacenter": "dc1",
               "NodePool": "default", "NodeClass": "", "Status": "ready", "StatusDescription": "",
               "SchedulingEligibility": if sched.eligible { "eligible" } else { "ineligible" },
               "Drain": false, "DrainStrategy": null, "LastDrain": sched.last_drain,
               "Version": "1.11.0", "Drivers": {"docker": {"Detected": true, "Healthy": true}},
               "CreateIndex": NODE_CREATE_INDEX, "ModifyIndex": sched.modify_index})
    }

    /// Sets node `id`'s eligibility; a node made eligible gets the system jobs back.
    fn set_eligible(&mut self, id: &str, eligible: bool, now: SystemTime) {
        self.index += 1;
        let index = self.index;
        let sched = self.sched.entry(id.to_owned()).or_default();
        let was = sched.eligible;
        sched.eligible = eligible;
        sched.modify_index = index;
        if eligible && !was {
            self.place_system_jobs(id, now);
        }
    }

    /// Places every running system job on node `id` where it has no live allocation.
    fn place_system_jobs(&mut self, id: &str, now: SystemTime) {
        let mut system: Vec<Value> = self
            .jobs
            .values()
            .filter(|j| j["Type"] == "system" && j["Stop"] != json!(true))
            .cloned()
            .collect();
        system.sort_by_key(|j| j["ID"].as_str().unwrap_or_default().to_owned());
        for job in system {
            let job_id = job["ID"].as_str().unwrap_or_default();
            for group in job["TaskGroups"].as_array().cloned().unwrap_or_default() {
                let group = group["Name"].as_str().unwrap_or_default();
                let has = self
                    .live(job_id, now)
                    .into_iter()
                    .any(|i| self.allocs[i].node_id == id && self.allocs[i].group == group);
                if !has {
                    let new = self.place(&job, group, id, now, None);
                    self.allocs.push(new);
                }
            }
        }
    }

    /// The eligible node Nomad would pick for one more allocation of `job_id`: the one with
    /// the fewest live allocations of the job, then by name; never `except`.
    fn placement_target(&self, job_id: &str, except: &str, now: SystemTime) -> Option<String> {
        let live = self.live(job_id, now);
        self.nodes
            .iter()
            .filter(|n| n.id != except && self.sched(&n.id).eligible)
            .min_by_key(|n| {
                let here = live
                    .iter()
                    .filter(|&&i| self.allocs[i].node_id == n.id)
                    .count();
                (here, n.name.clone())
            })
            .map(|n| n.id.clone())
    }

    /// How many nodes could take a new allocation now.
    fn eligible_nodes(&self) -> usize {
        self.nodes
            .iter()
            .filter(|n| self.sched(&n.id).eligible)
            .count()
    }

    /// Drains node `id` to completion now: it becomes ineligible; its service allocations
    /// move to other eligible nodes, its system allocations stop (unless `ignore_system`).
    fn drain(&mut self, id: &str, ignore_system: bool, meta: Value, now: SystemTime) {
        self.set_eligible(id, false, now);
        let on_node: Vec<usize> = self
            .allocs
            .iter()
            .enumerate()
            .filter(|(_, a)| a.node_id == id && a.created <= now && a.stopped.is_none())
            .map(|(i, _)| i)
            .collect();
        for i in on_node {
            let job_id = self.allocs[i].job_id.clone();
            let Some(job) = self.jobs.get(&job_id).cloned() else {
                continue;
            };
            let system = job["Type"] == "system";
            if system && ignore_system {
                continue;
            }
            let target = (!system)
                .then(|| self.placement_target(&job_id, id, now))
                .flatten();
            let replacement = target.map(|node| {
                let (group, previous) = (self.allocs[i].group.clone(), self.allocs[i].id.clone());
                let new = self.place(&job, &group, &node, now, Some(previous.clone()));
                let slot = self.slots.get(&previous).copied().unwrap_or(0);
                self.slots.insert(new.id.clone(), slot);
                new
            });
            self.stop(i, now, MIGRATED, replacement.as_ref().map(|a| a.id.clone()));
            self.allocs.extend(replacement);
        }
        self.index += 1;
        let sched = self.sched.entry(id.to_owned()).or_default();
        sched.modify_index = self.index;
        sched.last_drain = Some(json!({"StartedAt": rfc3339(now), "UpdatedAt": rfc3339(now),
                                        "Status": "complete", "AccessorID": "", "Meta": meta}));
    }

    /// Sets `group`'s count in `job_id` to `count` and places or stops allocations to match.
    fn scale(&mut self, job_id: &str, group: &str, count: u64, now: SystemTime) -> u64 {
        self.index += 1;
        let index = self.index;
        let job = self
            .jobs
            .get_mut(job_id)
            .expect("the caller checked the job");
        for g in job["TaskGroups"].as_array_mut().into_iter().flatten() {
            if g["Name"] == group {
                g["Count"] = json!(count);
            }
        }
        job["JobModifyIndex"] = json!(index);
        job["ModifyIndex"] = json!(index);
        job["Version"] = json!(job["Version"].as_u64().unwrap_or(0) + 1);
        job["SubmitTime"] = json!(unix_nanos(now));
        job["Stable"] = json!(false);
        self.converge(job_id, group, count, now);
        index
    }

    /// Places or stops allocations of `group` so that `count` of them live (system jobs:
    /// one per eligible node, or none for 0).
    fn converge(&mut self, job_id: &str, group: &str, count: u64, now: SystemTime) {
        let job = self.jobs[job_id].clone();
        let mut live: Vec<usize> = self
            .live(job_id, now)
            .into_iter()
            .filter(|&i| self.allocs[i].group == group)
            .collect();
        if job["Type"] == "system" {
            if count == 0 {
                for i in live {
                    self.stop(i, now, NOT_NEEDED, None);
                }
            } else {
                let eligible: Vec<String> = self
                    .nodes
                    .iter()
                    .filter(|n| self.sched(&n.id).eligible)
                    .map(|n| n.id.clone())
                    .collect();
                for node in eligible {
                    self.place_system_jobs(&node, now);
                }
            }
            return;
        }
        live.sort_by_key(|&i| self.slots.get(&self.allocs[i].id).copied().unwrap_or(0));
        while live.len() as u64 > count {
            let i = live.pop().expect("more live than the count");
            self.stop(i, now, NOT_NEEDED, None);
        }
        let mut used: Vec<u64> = live
            .iter()
            .map(|&i| self.slots.get(&self.allocs[i].id).copied().unwrap_or(0))
            .collect();
        for _ in live.len() as u64..count {
            let Some(node) = self.placement_target(job_id, "", now) else {
                break;
            };
            let slot = (0..).find(|k| !used.contains(k)).expect("a free slot");
            used.push(slot);
            let new = self.place(&job, group, &node, now, None);
            self.slots.insert(new.id.clone(), slot);
            self.allocs.push(new);
        }
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

async fn read_job(State(n): State<Arc<Nomad>>, Path(id): Path<String>) -> Response {
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
async fn register(State(n): State<Arc<Nomad>>, Path(id): Path<String>, body: String) -> Response {
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
        s.stop(i, at, JOB_UPDATE, Some(new.id.clone()));
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
async fn plan(State(n): State<Arc<Nomad>>, Path(id): Path<String>, body: String) -> Response {
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
    let mut failed = serde_json::Map::new();
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
        let name = group["Name"].as_str().unwrap_or_default().to_owned();
        let changed = !task_diffs.is_empty();
        let count = CountChange::of(&s, old, old_group, group, now);
        let kept = if changed { 0 } else { live.min(count.kept()) };
        updates.insert(
            name.clone(),
            json!({"Ignore": kept, "Place": count.place, "Migrate": 0, "Stop": count.stop, "InPlaceUpdate": 0,
                   "DestructiveUpdate": if changed { live } else { 0 }, "Canary": 0, "Preemptions": 0}),
        );
        if count.unplaceable() > 0 {
            failed.insert(name.clone(), count.failure(s.nodes.len()));
        }
        if changed || count.edited() {
            let mut tg_updates = serde_json::Map::new();
            if changed {
                tg_updates.insert("create/destroy update".into(), json!(live));
            }
            count.annotate(&mut tg_updates);
            tg_diffs.push(
                json!({"Type": "Edited", "Name": group["Name"], "Fields": count.fields(), "Objects": null,
                       "Updates": tg_updates, "Tasks": task_diffs}),
            );
        }
    }
    let failed = if failed.is_empty() {
        Value::Null
    } else {
        Value::Object(failed)
    };
    let diff_type = if tg_diffs.is_empty() {
        "None"
    } else {
        "Edited"
    };
    ok(
        s.index,
        json!({"JobModifyIndex": old["JobModifyIndex"], "Index": 0, "Warnings": "", "NextPeriodicLaunch": ZERO_TIME,
               "CreatedEvals": null, "FailedTGAllocs": failed,
               "Annotations": {"DesiredTGUpdates": updates, "PreemptedAllocs": null},
               "Diff": {"Type": diff_type, "ID": id, "Fields": null, "Objects": null, "TaskGroups": tg_diffs}}),
    )
}

/// What a plan makes of a group's `Count`: the allocations kept, placed and stopped, and
/// how many of the placements find no eligible node.
struct CountChange {
    from: u64,
    to: u64,
    live: u64,
    place: u64,
    stop: u64,
    eligible: usize,
    system: bool,
}

impl CountChange {
    fn of(
        s: &NomadState,
        job: &Value,
        old_group: Option<&Value>,
        group: &Value,
        now: SystemTime,
    ) -> CountChange {
        let from = old_group.and_then(|g| g["Count"].as_u64()).unwrap_or(0);
        let to = group["Count"].as_u64().unwrap_or(from);
        let job_id = job["ID"].as_str().unwrap_or_default();
        let live = s
            .live(job_id, now)
            .into_iter()
            .filter(|&i| s.allocs[i].group == group["Name"])
            .count() as u64;
        let system = job["Type"] == "system";
        let eligible = s.eligible_nodes();
        let (place, stop) = match (system, from == to) {
            (_, true) => (0, 0),
            (true, _) if to == 0 => (0, live),
            (true, _) => ((eligible as u64).saturating_sub(live), 0),
            (false, _) => (to.saturating_sub(live), live.saturating_sub(to)),
        };
        CountChange {
            from,
            to,
            live,
            place,
            stop,
            eligible,
            system,
        }
    }

    fn edited(&self) -> bool {
        self.from != self.to
    }

    fn kept(&self) -> u64 {
        self.live - self.stop
    }

    /// Placements no eligible node can take (a service group can stack on one node).
    fn unplaceable(&self) -> u64 {
        if self.eligible == 0 && !self.system {
            self.place
        } else {
            0
        }
    }

    fn fields(&self) -> Value {
        if !self.edited() {
            return Value::Null;
        }
        json!([{"Type": "Edited", "Name": "Count", "Old": self.from.to_string(), "New": self.to.to_string(), "Annotations": null}])
    }

    fn annotate(&self, updates: &mut serde_json::Map<String, Value>) {
        if self.place > 0 {
            updates.insert("create".into(), json!(self.place));
        }
        if self.stop > 0 {
            updates.insert("destroy".into(), json!(self.stop));
        }
    }

    /// `FailedTGAllocs[group]` (`AllocMetric`) when no node is eligible.
    fn failure(&self, nodes: usize) -> Value {
        json!({"NodesEvaluated": 0, "NodesFiltered": 0, "NodesInPool": nodes, "NodesAvailable": {"dc1": 0},
               "ClassFiltered": null, "ConstraintFiltered": null, "NodesExhausted": 0, "ClassExhausted": null,
               "DimensionExhausted": null, "QuotaExhausted": null, "ResourcesExhausted": null, "Scores": null,
               "AllocationTime": 0, "CoalescedFailures": self.unplaceable() - 1})
    }
}

async fn job_allocations(State(n): State<Arc<Nomad>>, Path(id): Path<String>) -> Response {
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
) -> Response {
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

async fn allocation(State(n): State<Arc<Nomad>>, Path(id): Path<String>) -> Response {
    let now = n.clock.now();
    let s = n.state.lock().expect("nomad state");
    match s.visible(now).find(|a| a.id == id) {
        Some(a) => ok(s.index, s.render(a, now)),
        None => text_error(404, "alloc not found"),
    }
}

/// `GET /v1/client/allocation/:id/stats`: served by the client running the allocation, so
/// an allocation that does not run has none.
async fn stats(State(n): State<Arc<Nomad>>, Path(id): Path<String>) -> Response {
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

async fn nodes(State(n): State<Arc<Nomad>>, Query(q): Query<HashMap<String, String>>) -> Response {
    let prefix = q.get("prefix").cloned().unwrap_or_default();
    let s = n.state.lock().expect("nomad state");
    let list: Vec<Value> = s
        .nodes
        .iter()
        .filter(|node| node.id.starts_with(&prefix))
        .map(|node| node_stub(&s.node_json(node)))
        .collect();
    ok(s.index, Value::Array(list))
}

/// A node as `GET /v1/nodes` lists it (`api.NodeListStub`).
fn node_stub(full: &Value) -> Value {
    let mut stub = serde_json::Map::new();
    for key in [
        "ID",
        "Name",
        "Address",
        "Datacenter",
        "NodePool",
        "NodeClass",
        "Status",
        "StatusDescription",
        "SchedulingEligibility",
        "Drain",
        "LastDrain",
        "Version",
        "Drivers",
        "CreateIndex",
        "ModifyIndex",
    ] {
        stub.insert(key.into(), full[key].clone());
    }
    Value::Object(stub)
}

/// The JSON body of a write, or Nomad's 400 for one it cannot decode.
fn decode(body: &str) -> Result<Value, Box<Response>> {
    serde_json::from_str(body).map_err(|e| {
        Box::new(text_error(
            400,
            format!("failed to decode request body: {e}"),
        ))
    })
}

/// `GET /v1/node/:id`: 404 `node not found` for an unknown ID.
async fn node(State(n): State<Arc<Nomad>>, Path(id): Path<String>) -> Response {
    let s = n.state.lock().expect("nomad state");
    match s.node(&id) {
        Some(node) => {
            let body = s.node_json(node);
            ok(s.sched(&id).modify_index, body)
        }
        None => text_error(404, "node not found"),
    }
}

/// `GET /v1/node/:id/allocations`: every allocation placed on the node, as full
/// allocations; an unknown node has none.
async fn node_allocations(State(n): State<Arc<Nomad>>, Path(id): Path<String>) -> Response {
    let now = n.clock.now();
    let s = n.state.lock().expect("nomad state");
    let list: Vec<Value> = s
        .visible(now)
        .filter(|a| a.node_id == id)
        .map(|a| s.render(a, now))
        .collect();
    ok(s.index, Value::Array(list))
}

/// `POST /v1/node/:id/drain` (`api.NodeUpdateDrainRequest`): a `DrainSpec` drains the node
/// (to completion at once, see the module's doc); none ends a drain, and `MarkEligible`
/// makes the node eligible again. Errors as `Node.UpdateDrain` returns them: not coded, so
/// HTTP 500.
async fn drain(State(n): State<Arc<Nomad>>, Path(id): Path<String>, body: String) -> Response {
    let req = match decode(&body) {
        Ok(v) => v,
        Err(e) => return *e,
    };
    let now = n.clock.now();
    let mut s = n.state.lock().expect("nomad state");
    s.writes.push(("drain", req.clone()));
    if s.node(&id).is_none() {
        return text_error(500, "node not found");
    }
    let was_eligible = s.sched(&id).eligible;
    let spec = req.get("DrainSpec").filter(|d| d.is_object());
    let mut eval_ids = Value::Null;
    match spec {
        Some(spec) => {
            let ignore_system = spec["IgnoreSystemJobs"] == json!(true);
            let meta = req.get("Meta").cloned().unwrap_or(Value::Null);
            s.drain(&id, ignore_system, meta, now);
        }
        None if req["MarkEligible"] == json!(true) => {
            s.set_eligible(&id, true, now);
            if !was_eligible {
                eval_ids = json!([uuid::Uuid::new_v4().to_string()]);
            }
        }
        None => {
            s.index += 1;
            let index = s.index;
            s.sched.entry(id.clone()).or_default().modify_index = index;
        }
    }
    let index = s.index;
    drop(s);
    n.changed.send_replace(index);
    ok(
        index,
        json!({"NodeModifyIndex": index, "EvalIDs": eval_ids, "EvalCreateIndex": if eval_ids.is_null() { 0 } else { index },
               "Index": index, "LastContact": 0, "KnownLeader": false}),
    )
}

/// `POST /v1/node/:id/eligibility` (`{"Eligibility": "eligible"|"ineligible"}`), with
/// `Node.UpdateEligibility`'s errors (not coded: HTTP 500). Setting what the node already
/// has changes nothing and answers index 0, as Nomad does.
async fn eligibility(
    State(n): State<Arc<Nomad>>,
    Path(id): Path<String>,
    body: String,
) -> Response {
    let req = match decode(&body) {
        Ok(v) => v,
        Err(e) => return *e,
    };
    let now = n.clock.now();
    let mut s = n.state.lock().expect("nomad state");
    s.writes.push(("eligibility", req.clone()));
    let asked = req["Eligibility"].as_str().unwrap_or_default().to_owned();
    let eligible = match asked.as_str() {
        "eligible" => true,
        "ineligible" => false,
        _ => return text_error(500, format!("invalid scheduling eligibility {asked:?}")),
    };
    if s.node(&id).is_none() {
        return text_error(500, "node not found");
    }
    let was = s.sched(&id).eligible;
    if was == eligible {
        return ok(
            s.index,
            json!({"NodeModifyIndex": 0, "EvalIDs": null, "EvalCreateIndex": 0, "Index": 0}),
        );
    }
    s.set_eligible(&id, eligible, now);
    let index = s.index;
    drop(s);
    n.changed.send_replace(index);
    let eval_ids = if eligible {
        json!([uuid::Uuid::new_v4().to_string()])
    } else {
        Value::Null
    };
    ok(
        index,
        json!({"NodeModifyIndex": index, "EvalIDs": eval_ids, "EvalCreateIndex": if eligible { index } else { 0 },
               "Index": index, "LastContact": 0, "KnownLeader": false}),
    )
}

/// `POST /v1/client/allocation/:id/restart` (`{"TaskName", "AllTasks"}`), with the client's
/// errors: 404 `Unknown allocation "<id>"`, and 500 for a task the allocation lacks, a
/// task name with `AllTasks`, or a named task that is not running.
async fn alloc_restart(
    State(n): State<Arc<Nomad>>,
    Path(id): Path<String>,
    body: String,
) -> Response {
    let req = if body.trim().is_empty() {
        json!({})
    } else {
        match decode(&body) {
            Ok(v) => v,
            Err(e) => return *e,
        }
    };
    let now = n.clock.now();
    let mut s = n.state.lock().expect("nomad state");
    s.writes.push(("restart", req.clone()));
    let task = req["TaskName"].as_str().unwrap_or_default().to_owned();
    if req["AllTasks"] == json!(true) && !task.is_empty() {
        return text_error(500, "task name cannot be set when restarting all tasks");
    }
    let Some(alloc) = s.visible(now).find(|a| a.id == id).cloned() else {
        return text_error(404, format!("Unknown allocation \"{id}\""));
    };
    let tasks = task_names(&alloc.job, &alloc.group);
    if !task.is_empty() && !tasks.contains(&task) {
        return text_error(500, format!("Could not find task runner for task: {task}"));
    }
    let running = s.memory_use(&alloc, now).is_some();
    if !running {
        if task.is_empty() {
            return ok(s.index, json!({}));
        }
        return text_error(500, TASK_NOT_RUNNING);
    }
    let chosen = if task.is_empty() { tasks } else { vec![task] };
    let asked = s.user_restarts.entry(id).or_default();
    asked.extend(chosen.into_iter().map(|t| (t, now)));
    s.index += 1;
    let index = s.index;
    drop(s);
    n.changed.send_replace(index);
    ok(index, json!({}))
}

/// `POST /v1/job/:id/scale` (`api.ScalingRequest`) with `Job.Scale`'s checks and errors,
/// including its check-and-set: a non-zero `JobModifyIndex` that is not the job's refuses
/// with the register's `Enforcing job modify index` text (HTTP 500).
async fn scale(State(n): State<Arc<Nomad>>, Path(id): Path<String>, body: String) -> Response {
    let req = match decode(&body) {
        Ok(v) => v,
        Err(e) => return *e,
    };
    let now = n.clock.now();
    let mut s = n.state.lock().expect("nomad state");
    s.writes.push(("scale", req.clone()));
    if let Some((status, text)) = scale_refusal(&s, &id, &req) {
        return text_error(status, text);
    }
    let group = req["Target"]["Group"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let Some(count) = req["Count"].as_u64() else {
        let index = s.jobs[&id]["ModifyIndex"].as_u64().unwrap_or(s.index);
        return ok(
            index,
            json!({"EvalID": "", "EvalCreateIndex": 0, "JobModifyIndex": index, "Warnings": "", "Index": index}),
        );
    };
    let index = s.scale(&id, &group, count, now);
    drop(s);
    n.changed.send_replace(index);
    ok(
        index,
        json!({"EvalID": uuid::Uuid::new_v4().to_string(), "EvalCreateIndex": index, "JobModifyIndex": index,
               "Warnings": "", "Index": index, "LastContact": 0, "KnownLeader": false}),
    )
}

/// Why `Job.Scale` refuses `req` on job `id` (status and text), in its order of checks, if
/// it does.
fn scale_refusal(s: &NomadState, id: &str, req: &Value) -> Option<(u16, String)> {
    let refuse = |status: u16, text: &str| Some((status, text.to_owned()));
    let target = &req["Target"];
    if target["Job"]
        .as_str()
        .is_some_and(|j| !j.is_empty() && j != id)
    {
        return refuse(400, "job ID in payload did not match URL");
    }
    let group = target["Group"].as_str().unwrap_or_default();
    if group.is_empty() {
        return refuse(400, "missing task group name for scaling action");
    }
    let count = &req["Count"];
    if count.as_i64().is_some_and(|c| c < 0) {
        return refuse(400, "scaling action count can't be negative");
    }
    if !count.is_null() && req["Error"] == json!(true) {
        return refuse(
            400,
            "scaling action should not contain count if error is true",
        );
    }
    let Some(job) = s.jobs.get(id) else {
        return refuse(404, &format!("job {id:?} not found"));
    };
    if job["Type"] == "system" && count.as_i64().is_some_and(|c| c > 1) {
        return refuse(400, "jobs of type \"system\" can only be scaled to 1 or 0");
    }
    let has_group = job["TaskGroups"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|g| g["Name"] == group);
    if !has_group {
        return refuse(
            400,
            &format!("task group {group:?} specified for scaling does not exist in job"),
        );
    }
    let want = req["JobModifyIndex"].as_u64().unwrap_or(0);
    let have = job["JobModifyIndex"].as_u64().unwrap_or(0);
    if !count.is_null() && want > 0 && want != have {
        return refuse(
            500,
            &format!(
                "Enforcing job modify index {want}: job exists with conflicting job modify index: {have}"
            ),
        );
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lab::scenario;

    async fn resize(n: &Arc<Nomad>, memory: u64) {
        let mut job = n.job("traefik");
        job["TaskGroups"][0]["Tasks"][0]["Resources"]["MemoryMB"] = json!(memory);
        let index = job["JobModifyIndex"].clone();
        let body = json!({"Job": job, "EnforceIndex": true, "JobModifyIndex": index}).to_string();
        let res = register(State(n.clone()), Path("traefik".into()), body).await;
        assert_eq!(res.status(), 200);
    }

    async fn post_drain(n: &Arc<Nomad>, node: &str, body: Value) -> Response {
        let id = n
            .state
            .lock()
            .unwrap()
            .nodes
            .iter()
            .find(|x| x.name == node)
            .unwrap()
            .id
            .clone();
        drain(State(n.clone()), Path(id), body.to_string()).await
    }

    /// A drain that ignores system jobs leaves them running on the (now ineligible) node;
    /// one that does not stops them, and none comes back until the node is eligible again.
    #[tokio::test]
    async fn a_drain_stops_system_allocations_unless_told_to_ignore_them() {
        let n = scenario::nomad("t", Arc::new(LabClock::frozen()));
        let spec = |ignore: bool| json!({"DrainSpec": {"Deadline": 60_000_000_000u64, "IgnoreSystemJobs": ignore}});
        let res = post_drain(&n, "nomad-hvn02", spec(true)).await;
        assert_eq!(res.status(), 200);
        assert!(n.task_running_on("nomad-hvn02", "traefik"));
        let eligible = |name: &str| {
            let s = n.state.lock().unwrap();
            let node = s.nodes.iter().find(|x| x.name == name).unwrap();
            s.node_json(node)["SchedulingEligibility"].clone()
        };
        assert_eq!(eligible("nomad-hvn02"), "ineligible");
        let res = post_drain(&n, "nomad-hvn03", spec(false)).await;
        assert_eq!(res.status(), 200);
        assert!(!n.task_running_on("nomad-hvn03", "traefik"));
        let res = post_drain(
            &n,
            "nomad-hvn03",
            json!({"DrainSpec": null, "MarkEligible": false}),
        )
        .await;
        assert_eq!(res.status(), 200);
        assert!(
            !n.task_running_on("nomad-hvn03", "traefik"),
            "still ineligible"
        );
        n.set_eligibility("nomad-hvn03", true);
        assert!(n.task_running_on("nomad-hvn03", "traefik"));
    }

    /// Every route answers only with the cluster's token (in `X-Nomad-Token` or as a bearer
    /// token), and refuses the way Nomad does otherwise, a write as well as a read.
    #[tokio::test]
    async fn every_route_wants_the_token() {
        let n = scenario::nomad("t", Arc::new(LabClock::frozen()));
        let url = crate::lab::http::serve(n.router()).await;
        let client = reqwest::Client::new();
        for (method, path) in [
            (reqwest::Method::GET, "/v1/nodes"),
            (reqwest::Method::GET, "/v1/job/traefik"),
            (reqwest::Method::POST, "/v1/job/traefik/scale"),
        ] {
            let ask = |token: Option<(&'static str, &'static str)>| {
                let mut req = client.request(method.clone(), format!("{url}{path}"));
                if let Some((header, value)) = token {
                    req = req.header(header, value);
                }
                req.send()
            };
            let res = ask(None).await.unwrap();
            assert_eq!(res.status(), 403, "{path} without a token");
            assert_eq!(res.text().await.unwrap(), "Permission denied");
            let res = ask(Some(("x-nomad-token", "wrong"))).await.unwrap();
            assert_eq!(res.status(), 403, "{path} with a wrong token");
            assert_eq!(res.text().await.unwrap(), "ACL token not found");
            for token in [("x-nomad-token", "t"), ("authorization", "Bearer t")] {
                let res = ask(Some(token)).await.unwrap();
                assert_ne!(res.status(), 403, "{path} with {token:?}");
            }
        }
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
