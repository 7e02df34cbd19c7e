//! A Consul cluster's HTTP API, the routes the consul pack uses (health by service and by
//! state, members, autopilot state, catalog services, the leader, and on each node's own agent
//! its self description, its services and maintenance mode), written from Consul's documented
//! API: same routes, field names, status codes, text/plain errors and ACL token checks
//! (`X-Consul-Token` or `Authorization: Bearer`).
//!
//! [`Consul::router`] answers for the cluster; [`Consul::agent_router`] is one node's local
//! agent (the cluster routes plus the `/v1/agent/*` routes about that node), as a runner on
//! that node reaches it at 127.0.0.1:8500. Maintenance mode is what Consul makes of it: a
//! critical `_node_maintenance` or `_service_maintenance:<id>` check, with the reason as its
//! Notes, in every health answer.
//!
//! The state is a model, not canned JSON: gossip members with a status, service instances on
//! nodes, and the raft configuration derived from the server members the way autopilot
//! reports it (a server that *left* is out of the raft configuration; the failure tolerance
//! is the healthy voters above quorum). So when a node's agent restarts and rejoins, members,
//! health and autopilot all change together.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use serde_json::{Value, json};

use super::clock::{LabClock, rfc3339};
use super::http::{Guarded, guarded, presented_token, text_error};

/// Serf member status, as `/v1/agent/members` encodes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberStatus {
    Alive = 1,
    Leaving = 2,
    Left = 3,
    Failed = 4,
}

impl MemberStatus {
    /// The name autopilot uses for it (`NodeStatus`).
    pub fn name(self) -> &'static str {
        match self {
            MemberStatus::Alive => "alive",
            MemberStatus::Leaving => "leaving",
            MemberStatus::Left => "left",
            MemberStatus::Failed => "failed",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Member {
    pub name: String,
    pub addr: String,
    /// The agent's node ID.
    pub id: String,
    /// A server (raft voter) rather than a client agent.
    pub server: bool,
    pub status: MemberStatus,
    /// When the member last became alive (autopilot's `StableSince`).
    pub since: SystemTime,
}

/// One registered instance of a service, with its own health check.
#[derive(Debug, Clone)]
pub struct Instance {
    pub service: String,
    pub id: String,
    pub node: String,
    pub port: u16,
    pub tags: Vec<String>,
    pub check_status: String,
    pub check_output: String,
}

pub struct Consul {
    /// The ACL token every request must carry.
    token: String,
    clock: Arc<LabClock>,
    state: Mutex<ConsulState>,
}

struct ConsulState {
    index: u64,
    members: Vec<Member>,
    instances: Vec<Instance>,
    /// The member name of the raft leader.
    leader: String,
    /// Nodes in maintenance mode, with the reason Consul keeps as the check's Notes.
    node_maintenance: BTreeMap<String, String>,
    /// Service instances in maintenance mode, by (node, service ID), with their reason.
    service_maintenance: BTreeMap<(String, String), String>,
}

/// The Notes Consul writes when maintenance is enabled without a reason.
const DEFAULT_NODE_MAINT_REASON: &str = "Maintenance mode is enabled for this node, but no reason was provided. This is a default message.";
const DEFAULT_SERVICE_MAINT_REASON: &str = "Maintenance mode is enabled for this service, but no reason was provided. This is a default message.";

/// One health check as Consul's health endpoints render it.
struct Check<'a> {
    node: &'a str,
    id: String,
    name: String,
    status: &'a str,
    notes: &'a str,
    output: &'a str,
    /// The instance a service check belongs to; none for a node check.
    service: Option<&'a Instance>,
    /// The check's type (`http` for the instances' own checks; empty for Consul's own).
    kind: &'a str,
}

impl Consul {
    pub fn new(token: &str, clock: Arc<LabClock>, leader: &str) -> Consul {
        Consul {
            token: token.to_owned(),
            clock,
            state: Mutex::new(ConsulState {
                index: 42,
                members: Vec::new(),
                instances: Vec::new(),
                leader: leader.to_owned(),
                node_maintenance: BTreeMap::new(),
                service_maintenance: BTreeMap::new(),
            }),
        }
    }

    pub fn add_member(&self, member: Member) {
        let mut s = self.state.lock().expect("consul state");
        s.index += 1;
        s.members.push(member);
    }

    pub fn register(&self, instance: Instance) {
        let mut s = self.state.lock().expect("consul state");
        s.index += 1;
        s.instances.push(instance);
    }

    pub fn member_status(&self, name: &str) -> Option<MemberStatus> {
        let s = self.state.lock().expect("consul state");
        s.members.iter().find(|m| m.name == name).map(|m| m.status)
    }

    /// The agent on `node` was restarted: it joins the gossip again (`alive`) and, if it is
    /// a server, autopilot adds it back to the raft configuration as a voter. Returns false
    /// when no member has that name.
    pub fn agent_restarted(&self, node: &str) -> bool {
        let now = self.clock.now();
        let mut s = self.state.lock().expect("consul state");
        s.index += 1;
        match s.members.iter_mut().find(|m| m.name == node) {
            Some(m) => {
                m.status = MemberStatus::Alive;
                m.since = now;
                true
            }
            None => false,
        }
    }

    pub fn set_member_status(&self, node: &str, status: MemberStatus) {
        let mut s = self.state.lock().expect("consul state");
        s.index += 1;
        if let Some(m) = s.members.iter_mut().find(|m| m.name == node) {
            m.status = status;
        }
    }

    /// The cluster's routes, every one behind the ACL token with `node:read` (`http::guarded`).
    pub fn router(self: Arc<Self>) -> Router {
        let routes = Router::new()
            .route("/v1/health/service/{service}", get(health))
            .route("/v1/agent/members", get(members))
            .route("/v1/operator/autopilot/state", get(autopilot))
            .route("/v1/catalog/services", get(catalog_services))
            .route("/v1/status/leader", get(leader))
            .route("/v1/health/state/{state}", get(health_state));
        guarded(routes, self.clone()).with_state(self)
    }

    /// The local agent of `node`: the cluster's routes plus the agent routes about that node.
    pub fn agent_router(self: Arc<Self>, node: &str) -> Router {
        let agent = Arc::new(Agent {
            consul: self.clone(),
            node: node.to_owned(),
        });
        Router::new()
            .route("/v1/agent/self", get(agent_self))
            .route("/v1/agent/services", get(agent_services))
            .route("/v1/agent/maintenance", put(node_maintenance))
            .route(
                "/v1/agent/service/maintenance/{service_id}",
                put(service_maintenance),
            )
            .with_state(agent)
            .merge(self.router())
    }

    /// The refusal for a request without the right token, if any.
    /// The refusal for a request that needs `permission` and lacks the right token, if any.
    fn refusal_for(&self, headers: &HeaderMap, permission: &str) -> Option<Response> {
        match presented_token(headers, "x-consul-token") {
            Some(t) if t == self.token => None,
            Some(_) => Some(text_error(403, "ACL not found")),
            // ACLs default to deny: the anonymous token may do nothing.
            None => Some(text_error(
                403,
                format!(
                    "Permission denied: token with AccessorID '00000000-0000-0000-0000-000000000002' lacks permission '{permission}'"
                ),
            )),
        }
    }

    /// Whether `node` is in maintenance mode.
    pub fn in_maintenance(&self, node: &str) -> bool {
        let s = self.state.lock().expect("consul state");
        s.node_maintenance.contains_key(node)
    }
}

/// One node's local agent: the cluster it belongs to and its node name.
struct Agent {
    consul: Arc<Consul>,
    node: String,
}

impl Check<'_> {
    fn to_json(&self, index: u64) -> Value {
        let service = self.service;
        json!({"Node": self.node, "CheckID": self.id, "Name": self.name, "Status": self.status,
               "Notes": self.notes, "Output": self.output,
               "ServiceID": service.map_or("", |i| i.id.as_str()),
               "ServiceName": service.map_or("", |i| i.service.as_str()),
               "ServiceTags": service.map_or(json!([]), |i| json!(i.tags)),
               "Type": self.kind, "ExposedPort": 0, "Definition": {},
               "CreateIndex": 12, "ModifyIndex": index})
    }
}

impl ConsulState {
    fn member(&self, name: &str) -> Option<&Member> {
        self.members.iter().find(|m| m.name == name)
    }

    /// The servers in the raft configuration: every server member that has not left.
    fn raft_servers(&self) -> Vec<&Member> {
        self.members
            .iter()
            .filter(|m| m.server && m.status != MemberStatus::Left)
            .collect()
    }

    /// The node's own checks: its gossip health, and maintenance mode when it is in it.
    fn node_checks<'a>(&'a self, node: &'a str) -> Vec<Check<'a>> {
        let (status, output) = match self.member(node).map(|m| m.status) {
            Some(MemberStatus::Alive) => ("passing", "Agent alive and reachable"),
            Some(MemberStatus::Left) => ("critical", "Agent left the cluster"),
            _ => ("critical", "Agent not live or unreachable"),
        };
        let mut checks = vec![Check {
            node,
            id: "serfHealth".into(),
            name: "Serf Health Status".into(),
            status,
            notes: "",
            output,
            service: None,
            kind: "",
        }];
        if let Some(reason) = self.node_maintenance.get(node) {
            checks.push(Check {
                node,
                id: "_node_maintenance".into(),
                name: "Node Maintenance Mode".into(),
                status: "critical",
                notes: reason,
                output: "",
                service: None,
                kind: "",
            });
        }
        checks
    }

    /// An instance's own checks: its health check, and maintenance mode when it is in it.
    fn instance_checks<'a>(&'a self, i: &'a Instance) -> Vec<Check<'a>> {
        let mut checks = vec![Check {
            node: &i.node,
            id: format!("service:{}", i.id),
            name: format!("Service '{}' check", i.service),
            status: &i.check_status,
            notes: "",
            output: &i.check_output,
            service: Some(i),
            kind: "http",
        }];
        if let Some(reason) = self
            .service_maintenance
            .get(&(i.node.clone(), i.id.clone()))
        {
            checks.push(Check {
                node: &i.node,
                id: format!("_service_maintenance:{}", i.id),
                name: "Service Maintenance Mode".into(),
                status: "critical",
                notes: reason,
                output: "",
                service: Some(i),
                kind: "",
            });
        }
        checks
    }

    /// Every check in the cluster: each member's node checks, then each instance's checks.
    fn all_checks(&self) -> Vec<Check<'_>> {
        let nodes = self.members.iter().flat_map(|m| self.node_checks(&m.name));
        let instances = self.instances.iter().flat_map(|i| self.instance_checks(i));
        nodes.chain(instances).collect()
    }

    fn health_entry(&self, i: &Instance) -> Value {
        let member = self.member(&i.node);
        let addr = member.map_or("", |m| m.addr.as_str());
        let node_id = member.map_or("", |m| m.id.as_str());
        let checks: Vec<Value> = self
            .node_checks(&i.node)
            .into_iter()
            .chain(self.instance_checks(i))
            .map(|c| c.to_json(self.index))
            .collect();
        json!({
            "Node": {"ID": node_id, "Node": i.node, "Address": addr, "Datacenter": "dc1",
                     "TaggedAddresses": {"lan": addr, "wan": addr},
                     "Meta": {"consul-network-segment": ""}, "CreateIndex": 5, "ModifyIndex": 6},
            "Service": service_json(i, addr),
            "Checks": checks,
        })
    }

    fn autopilot(&self) -> Value {
        let servers = self.raft_servers();
        let healthy = |m: &Member| m.status == MemberStatus::Alive;
        let voters = servers.len();
        let quorum = voters / 2 + 1;
        let healthy_voters = servers.iter().filter(|m| healthy(m)).count();
        let tolerance = healthy_voters.saturating_sub(quorum);
        let leader_id = self.member(&self.leader).map_or("", |m| m.id.as_str());
        let mut map = serde_json::Map::new();
        for (n, m) in servers.iter().enumerate() {
            let is_leader = m.name == self.leader;
            let contact = if is_leader {
                "0s".to_owned()
            } else if healthy(m) {
                format!("{}.{}ms", 1 + n, (7 * n + 3) % 10)
            } else {
                "14.2s".to_owned()
            };
            map.insert(
                m.id.clone(),
                json!({"ID": m.id, "Name": m.name, "Address": format!("{}:8300", m.addr),
                       "NodeStatus": m.status.name(), "Version": "1.20.1", "LastContact": contact,
                       "LastTerm": 4, "LastIndex": self.index, "Healthy": healthy(m),
                       "StableSince": rfc3339(m.since), "ReadReplica": false,
                       "Status": if is_leader { "leader" } else { "voter" },
                       "Meta": {"consul-network-segment": ""}, "NodeType": "voter"}),
            );
        }
        json!({
            "Healthy": healthy_voters == voters,
            "FailureTolerance": tolerance,
            "OptimisticFailureTolerance": tolerance,
            "Servers": map,
            "Leader": leader_id,
            "Voters": servers.iter().map(|m| m.id.clone()).collect::<Vec<_>>(),
        })
    }
}

/// An instance as Consul renders a service: in health answers and in the agent's services.
fn service_json(i: &Instance, addr: &str) -> Value {
    json!({"ID": i.id, "Service": i.service, "Tags": i.tags, "Address": addr,
           "Meta": {}, "Port": i.port, "Weights": {"Passing": 1, "Warning": 1},
           "EnableTagOverride": false, "Kind": "", "CreateIndex": 12, "ModifyIndex": 12})
}

/// The cluster's routes need a token with `node:read`; the agent's routes ask
/// [`Consul::refusal_for`] with their own permission, after checking their parameters as
/// Consul's agent does.
impl Guarded for Consul {
    fn refusal(&self, headers: &HeaderMap) -> Option<Response> {
        self.refusal_for(headers, "node:read")
    }
}

fn ok(index: u64, body: Value) -> Response {
    (
        [
            ("x-consul-index", index.to_string()),
            ("x-consul-knownleader", "true".to_owned()),
            ("x-consul-lastcontact", "0".to_owned()),
            ("x-consul-default-acl-policy", "deny".to_owned()),
        ],
        axum::Json(body),
    )
        .into_response()
}

async fn health(
    State(c): State<Arc<Consul>>,
    Path(service): Path<String>,
    Query(q): Query<BTreeMap<String, String>>,
) -> Response {
    let passing = match q.get("passing").map(String::as_str) {
        None => false,
        Some("" | "1" | "true") => true,
        Some("0" | "false") => false,
        Some(_) => return text_error(400, "Invalid value for ?passing"),
    };
    let s = c.state.lock().expect("consul state");
    let entries: Vec<Value> = s
        .instances
        .iter()
        .filter(|i| i.service == service)
        .map(|i| s.health_entry(i))
        .filter(|e| {
            !passing
                || e["Checks"]
                    .as_array()
                    .is_some_and(|checks| checks.iter().all(|c| c["Status"] == "passing"))
        })
        .collect();
    ok(s.index, Value::Array(entries))
}

async fn members(State(c): State<Arc<Consul>>) -> Response {
    let s = c.state.lock().expect("consul state");
    let members: Vec<Value> = s
        .members
        .iter()
        .map(|m| {
            let mut tags = json!({"role": if m.server { "consul" } else { "node" }, "dc": "dc1",
                                  "id": m.id, "build": "1.20.1:1a2b3c4d", "vsn": "2",
                                  "vsn_min": "2", "vsn_max": "3", "segment": ""});
            if m.server {
                tags["port"] = json!("8300");
                tags["expect"] = json!("3");
                tags["raft_vsn"] = json!("3");
            }
            json!({"Name": m.name, "Addr": m.addr, "Port": 8301, "Tags": tags,
                   "Status": m.status as u8, "ProtocolMin": 1, "ProtocolMax": 5, "ProtocolCur": 2,
                   "DelegateMin": 2, "DelegateMax": 5, "DelegateCur": 4})
        })
        .collect();
    ok(s.index, Value::Array(members))
}

async fn autopilot(State(c): State<Arc<Consul>>) -> Response {
    let s = c.state.lock().expect("consul state");
    ok(s.index, s.autopilot())
}

async fn catalog_services(State(c): State<Arc<Consul>>) -> Response {
    let s = c.state.lock().expect("consul state");
    let mut services: BTreeMap<String, Vec<String>> = BTreeMap::new();
    services.insert("consul".into(), Vec::new());
    for i in &s.instances {
        let tags = services.entry(i.service.clone()).or_default();
        for t in &i.tags {
            if !tags.contains(t) {
                tags.push(t.clone());
            }
        }
    }
    ok(s.index, json!(services))
}

async fn leader(State(c): State<Arc<Consul>>) -> Response {
    let s = c.state.lock().expect("consul state");
    let addr = s
        .member(&s.leader)
        .map_or(String::new(), |m| format!("{}:8300", m.addr));
    ok(s.index, json!(addr))
}

/// `GET /v1/health/state/:state`: every check in that state (`any` for all). A state Consul
/// does not know matches no check.
async fn health_state(State(c): State<Arc<Consul>>, Path(state): Path<String>) -> Response {
    let s = c.state.lock().expect("consul state");
    let checks: Vec<Value> = s
        .all_checks()
        .iter()
        .filter(|check| state == "any" || check.status == state)
        .map(|check| check.to_json(s.index))
        .collect();
    ok(s.index, Value::Array(checks))
}

async fn agent_self(State(a): State<Arc<Agent>>, headers: HeaderMap) -> Response {
    if let Some(e) = a.consul.refusal_for(&headers, "agent:read") {
        return e;
    }
    let s = a.consul.state.lock().expect("consul state");
    let member = s.member(&a.node);
    let addr = member.map_or("", |m| m.addr.as_str());
    let body = json!({
        "Config": {"Datacenter": "dc1", "PrimaryDatacenter": "dc1", "NodeName": a.node,
                   "NodeID": member.map_or("", |m| m.id.as_str()),
                   "Server": member.is_some_and(|m| m.server), "Revision": "1a2b3c4d",
                   "Version": "1.20.1", "BuildDate": "2024-10-29T19:04:05Z"},
        "Member": {"Name": a.node, "Addr": addr, "Port": 8301,
                   "Status": member.map_or(0, |m| m.status as u8)},
        "Meta": {"consul-network-segment": ""},
    });
    ok(s.index, body)
}

/// `GET /v1/agent/services`: the instances registered with this agent, by service ID.
async fn agent_services(State(a): State<Arc<Agent>>, headers: HeaderMap) -> Response {
    if let Some(e) = a.consul.refusal_for(&headers, "service:read") {
        return e;
    }
    let s = a.consul.state.lock().expect("consul state");
    let addr = s.member(&a.node).map_or("", |m| m.addr.as_str());
    let services: serde_json::Map<String, Value> = s
        .instances
        .iter()
        .filter(|i| i.node == a.node)
        .map(|i| {
            let mut service = service_json(i, addr);
            service["Datacenter"] = json!("dc1");
            (i.id.clone(), service)
        })
        .collect();
    ok(s.index, Value::Object(services))
}

/// The `enable` query parameter as Consul reads it (Go's `strconv.ParseBool`), or the text of
/// Consul's 400.
fn enable_param(q: &BTreeMap<String, String>) -> Result<bool, String> {
    match q.get("enable").map(String::as_str) {
        None => Err("Missing value for enable".to_owned()),
        Some("1" | "t" | "T" | "TRUE" | "true" | "True") => Ok(true),
        Some("0" | "f" | "F" | "FALSE" | "false" | "False") => Ok(false),
        Some(other) => Err(format!("Invalid value for enable: {other:?}")),
    }
}

/// The reason to keep as the check's Notes: the one given, or Consul's default text.
fn maintenance_reason(q: &BTreeMap<String, String>, default: &str) -> String {
    match q.get("reason") {
        Some(r) if !r.is_empty() => r.clone(),
        _ => default.to_owned(),
    }
}

/// `PUT /v1/agent/maintenance?enable=…&reason=…`: this node into or out of maintenance.
/// Entering again keeps the first reason, as Consul does.
async fn node_maintenance(
    State(a): State<Arc<Agent>>,
    Query(q): Query<BTreeMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    let enable = match enable_param(&q) {
        Ok(enable) => enable,
        Err(e) => return text_error(400, e),
    };
    if let Some(e) = a.consul.refusal_for(&headers, "node:write") {
        return e;
    }
    let mut s = a.consul.state.lock().expect("consul state");
    s.index += 1;
    if enable {
        let reason = maintenance_reason(&q, DEFAULT_NODE_MAINT_REASON);
        s.node_maintenance.entry(a.node.clone()).or_insert(reason);
    } else {
        s.node_maintenance.remove(&a.node);
    }
    axum::http::StatusCode::OK.into_response()
}

/// `PUT /v1/agent/service/maintenance/:service_id?enable=…&reason=…`: one instance registered
/// with this agent into or out of maintenance.
async fn service_maintenance(
    State(a): State<Arc<Agent>>,
    Path(service_id): Path<String>,
    Query(q): Query<BTreeMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    let enable = match enable_param(&q) {
        Ok(enable) => enable,
        Err(e) => return text_error(400, e),
    };
    if let Some(e) = a.consul.refusal_for(&headers, "service:write") {
        return e;
    }
    let mut s = a.consul.state.lock().expect("consul state");
    let registered = s
        .instances
        .iter()
        .any(|i| i.node == a.node && i.id == service_id);
    if !registered {
        return text_error(
            404,
            format!(
                "Unknown service ID {service_id:?}. Ensure that the service ID is passed, not the service name."
            ),
        );
    }
    s.index += 1;
    let key = (a.node.clone(), service_id);
    if enable {
        let reason = maintenance_reason(&q, DEFAULT_SERVICE_MAINT_REASON);
        s.service_maintenance.entry(key).or_insert(reason);
    } else {
        s.service_maintenance.remove(&key);
    }
    axum::http::StatusCode::OK.into_response()
}
