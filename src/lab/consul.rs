//! A Consul cluster's HTTP API, the routes the consul pack reads (health, members, autopilot
//! state, catalog services, the leader), written from Consul's documented API: same routes,
//! field names, status codes, text/plain errors and ACL token checks (`X-Consul-Token` or
//! `Authorization: Bearer`).
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
use axum::routing::get;
use serde_json::{Value, json};

use super::clock::{LabClock, rfc3339};
use super::http::{presented_token, text_error};

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

    pub fn router(self: Arc<Self>) -> Router {
        Router::new()
            .route("/v1/health/service/{service}", get(health))
            .route("/v1/agent/members", get(members))
            .route("/v1/operator/autopilot/state", get(autopilot))
            .route("/v1/catalog/services", get(catalog_services))
            .route("/v1/status/leader", get(leader))
            .with_state(self)
    }

    /// The refusal for a request without the right token, if any.
    fn refusal(&self, headers: &HeaderMap) -> Option<Response> {
        match presented_token(headers, "x-consul-token") {
            Some(t) if t == self.token => None,
            Some(_) => Some(text_error(403, "ACL not found")),
            // ACLs default to deny: the anonymous token may read nothing.
            None => Some(text_error(
                403,
                "Permission denied: token with AccessorID '00000000-0000-0000-0000-000000000002' lacks permission 'node:read'",
            )),
        }
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

    fn health_entry(&self, i: &Instance) -> Value {
        let member = self.member(&i.node);
        let addr = member.map_or("", |m| m.addr.as_str());
        let node_id = member.map_or("", |m| m.id.as_str());
        let (serf_status, serf_output) = match member.map(|m| m.status) {
            Some(MemberStatus::Alive) => ("passing", "Agent alive and reachable"),
            Some(MemberStatus::Left) => ("critical", "Agent left the cluster"),
            _ => ("critical", "Agent not live or unreachable"),
        };
        let check = |id: &str, name: &str, status: &str, output: &str, service: bool| {
            json!({"Node": i.node, "CheckID": id, "Name": name, "Status": status, "Notes": "",
                   "Output": output,
                   "ServiceID": if service { i.id.as_str() } else { "" },
                   "ServiceName": if service { i.service.as_str() } else { "" },
                   "ServiceTags": if service { json!(i.tags) } else { json!([]) },
                   "Type": if service { "http" } else { "" },
                   "ExposedPort": 0, "Definition": {}, "CreateIndex": 12, "ModifyIndex": self.index})
        };
        json!({
            "Node": {"ID": node_id, "Node": i.node, "Address": addr, "Datacenter": "dc1",
                     "TaggedAddresses": {"lan": addr, "wan": addr},
                     "Meta": {"consul-network-segment": ""}, "CreateIndex": 5, "ModifyIndex": 6},
            "Service": {"ID": i.id, "Service": i.service, "Tags": i.tags, "Address": addr,
                        "Meta": {}, "Port": i.port, "Weights": {"Passing": 1, "Warning": 1},
                        "EnableTagOverride": false, "Kind": "", "CreateIndex": 12, "ModifyIndex": 12},
            "Checks": [
                check("serfHealth", "Serf Health Status", serf_status, serf_output, false),
                check(&format!("service:{}", i.id), &format!("Service '{}' check", i.service),
                      &i.check_status, &i.check_output, true),
            ],
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
    headers: HeaderMap,
) -> Response {
    if let Some(e) = c.refusal(&headers) {
        return e;
    }
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

async fn members(State(c): State<Arc<Consul>>, headers: HeaderMap) -> Response {
    if let Some(e) = c.refusal(&headers) {
        return e;
    }
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

async fn autopilot(State(c): State<Arc<Consul>>, headers: HeaderMap) -> Response {
    if let Some(e) = c.refusal(&headers) {
        return e;
    }
    let s = c.state.lock().expect("consul state");
    ok(s.index, s.autopilot())
}

async fn catalog_services(State(c): State<Arc<Consul>>, headers: HeaderMap) -> Response {
    if let Some(e) = c.refusal(&headers) {
        return e;
    }
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

async fn leader(State(c): State<Arc<Consul>>, headers: HeaderMap) -> Response {
    if let Some(e) = c.refusal(&headers) {
        return e;
    }
    let s = c.state.lock().expect("consul state");
    let addr = s
        .member(&s.leader)
        .map_or(String::new(), |m| format!("{}:8300", m.addr));
    ok(s.index, json!(addr))
}
