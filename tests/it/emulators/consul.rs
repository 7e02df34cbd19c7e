//! A Consul agent's HTTP API, the routes emisar's consul pack reads: health, members,
//! autopilot state, catalog services; with ACL token checks (`X-Consul-Token` or Bearer).

use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};

use super::text_error;

pub struct Consul {
    /// The ACL token every request must carry.
    pub token: String,
    pub health: Value,
    pub members: Value,
    pub autopilot: Value,
}

impl Consul {
    /// The fleet of the case study: hvn05's agent has left the gossip, two voters remain.
    pub fn case_study(token: &str) -> Consul {
        let check = |node: &str, id: &str, status: &str, output: &str| {
            json!({"Node": node, "CheckID": id, "Name": if id == "serfHealth" { "Serf Health Status".to_string() } else { "Service 'store-api' check".to_string() },
                   "Status": status, "Notes": "", "Output": output, "ServiceID": if id == "serfHealth" { "" } else { "store-api-1" },
                   "ServiceName": if id == "serfHealth" { "" } else { "store-api" }, "ServiceTags": [], "Type": if id == "serfHealth" { "" } else { "http" },
                   "ExposedPort": 0, "Definition": {}, "CreateIndex": 5, "ModifyIndex": 6})
        };
        let instance = |node: &str, addr: &str, port: u16, checks: Vec<Value>| {
            json!({"Node": {"ID": "40e4a748-2192-161a-0510-9bf59fe950b5", "Node": node, "Address": addr, "Datacenter": "dc1",
                            "TaggedAddresses": {"lan": addr, "wan": addr}, "Meta": {}, "CreateIndex": 5, "ModifyIndex": 6},
                   "Service": {"ID": format!("store-api-{port}"), "Service": "store-api", "Tags": ["http"], "Address": addr,
                               "Meta": {}, "Port": port, "Weights": {"Passing": 1, "Warning": 1}, "EnableTagOverride": false,
                               "Kind": "", "CreateIndex": 9, "ModifyIndex": 9},
                   "Checks": checks})
        };
        let health = json!({
            "store-api": [
                instance("nomad-hvn01", "10.0.0.101", 22504, vec![
                    check("nomad-hvn01", "serfHealth", "passing", "Agent alive and reachable"),
                    check("nomad-hvn01", "service:store-api-1", "passing", "HTTP GET http://10.0.0.101:22504/healthcheck: 200 OK Output: {\"commit\":\"3433150\"}"),
                ]),
                instance("nomad-hvn02", "10.0.0.102", 23311, vec![
                    check("nomad-hvn02", "serfHealth", "passing", "Agent alive and reachable"),
                    check("nomad-hvn02", "service:store-api-2", "critical", "HTTP GET http://10.0.0.102:23311/healthcheck: 503 Service Unavailable"),
                ]),
            ]
        });
        let member = |name: &str, addr: &str, status: u8, role: &str| {
            json!({"Name": name, "Addr": addr, "Port": 8301,
                   "Tags": {"role": role, "dc": "dc1", "port": "8300", "build": "1.20.1:1a2b3c4d", "vsn": "2", "segment": ""},
                   "Status": status, "ProtocolMin": 1, "ProtocolMax": 5, "ProtocolCur": 2,
                   "DelegateMin": 2, "DelegateMax": 5, "DelegateCur": 4})
        };
        let members = json!([
            member("nomad-hvn01", "10.0.0.101", 1, "consul"),
            member("nomad-hvn02", "10.0.0.102", 1, "node"),
            member("nomad-hvn03", "10.0.0.103", 1, "consul"),
            member("nomad-hvn04", "10.0.0.104", 1, "node"),
            member("nomad-hvn05", "10.0.0.105", 3, "consul"),
        ]);
        let server = |id: &str, name: &str, addr: &str, status: &str, contact: &str| {
            json!({"ID": id, "Name": name, "Address": addr, "NodeStatus": "alive", "Version": "1.20.1",
                   "LastContact": contact, "LastTerm": 4, "LastIndex": 4211, "Healthy": true,
                   "StableSince": "2026-11-30T10:00:00Z", "ReadReplica": false, "Status": status,
                   "Meta": {}, "NodeType": "voter"})
        };
        let autopilot = json!({
            "Healthy": true, "FailureTolerance": 0, "OptimisticFailureTolerance": 0,
            "Servers": {
                "5e26a3af-f4fc-4104-a8bb-4da9f19cb278": server("5e26a3af-f4fc-4104-a8bb-4da9f19cb278", "nomad-hvn01", "10.0.0.101:8300", "leader", "0s"),
                "10b71f14-4b08-4ae5-840c-f86d39e7d330": server("10b71f14-4b08-4ae5-840c-f86d39e7d330", "nomad-hvn03", "10.0.0.103:8300", "voter", "2.1ms"),
            },
            "Leader": "5e26a3af-f4fc-4104-a8bb-4da9f19cb278",
            "Voters": ["5e26a3af-f4fc-4104-a8bb-4da9f19cb278", "10b71f14-4b08-4ae5-840c-f86d39e7d330"],
        });
        Consul {
            token: token.into(),
            health,
            members,
            autopilot,
        }
    }

    pub fn router(self) -> Router {
        Router::new()
            .route("/v1/health/service/{service}", get(health))
            .route(
                "/v1/agent/members",
                get(|State(c): State<Arc<Consul>>, h: HeaderMap| async move {
                    c.refusal(&h).unwrap_or_else(|| ok(c.members.clone()))
                }),
            )
            .route(
                "/v1/operator/autopilot/state",
                get(|State(c): State<Arc<Consul>>, h: HeaderMap| async move {
                    c.refusal(&h).unwrap_or_else(|| ok(c.autopilot.clone()))
                }),
            )
            .route(
                "/v1/catalog/services",
                get(|State(c): State<Arc<Consul>>, h: HeaderMap| async move {
                    c.refusal(&h).unwrap_or_else(|| {
                        let mut services = serde_json::Map::new();
                        services.insert("consul".into(), json!([]));
                        for name in c.health.as_object().unwrap().keys() {
                            services.insert(name.clone(), json!(["http"]));
                        }
                        ok(Value::Object(services))
                    })
                }),
            )
            .with_state(Arc::new(self))
    }

    /// The refusal for a request without the right token, if any. Consul accepts the token
    /// as `X-Consul-Token` or `Authorization: Bearer`.
    fn refusal(&self, headers: &HeaderMap) -> Option<Response> {
        let token = super::presented_token(headers, "x-consul-token");
        match token {
            Some(t) if t == self.token => None,
            Some(_) => Some(text_error(403, "ACL not found")),
            None => Some(text_error(
                403,
                "Permission denied: anonymous token lacks permission 'service:read' on \"store-api\"",
            )),
        }
    }
}

fn ok(body: Value) -> Response {
    (
        [
            ("x-consul-index", "42"),
            ("x-consul-knownleader", "true"),
            ("x-consul-lastcontact", "0"),
        ],
        axum::Json(body),
    )
        .into_response()
}

async fn health(
    State(c): State<Arc<Consul>>,
    Path(service): Path<String>,
    Query(q): Query<std::collections::HashMap<String, String>>,
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
    let mut entries = c.health.get(&service).cloned().unwrap_or_else(|| json!([]));
    if passing {
        let kept: Vec<Value> = entries
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| {
                e["Checks"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .all(|c| c["Status"] == "passing")
            })
            .cloned()
            .collect();
        entries = Value::Array(kept);
    }
    ok(entries)
}
