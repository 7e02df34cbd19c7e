//! Traefik v3's API entrypoint on one lab node (`api.insecure`, no `ping`), as the traefik
//! pack reads it: `/api/overview`, `/api/http/routers|services[/{name}]`, `/api/entrypoints`,
//! `/api/version`; every other path, `/ping` included, gets Go's `404 page not found`, as a
//! Traefik without `--ping` answers.
//!
//! Invariant: the port is bound (at :0) when the node is set up and never released. Until
//! the node's Traefik allocation runs, the socket is bound but not listening, so a
//! connection is refused (RST), exactly as on a node where nothing listens; `start` then
//! listens on that same socket. No other process can take the port in between.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};
use tokio::net::TcpSocket;
use tokio_util::sync::CancellationToken;

/// An application behind the edge: its Consul catalog name, host and backend servers.
#[derive(Debug, Clone)]
pub struct App {
    pub name: String,
    pub host: String,
    pub servers: Vec<String>,
}

/// What every node's Traefik routes (the Consul catalog provider sees the same catalog).
#[derive(Debug, Clone)]
pub struct Site {
    pub apps: Vec<App>,
    pub version: String,
    pub start_date: String,
}

pub struct Traefik {
    node: String,
    addr: SocketAddr,
    /// The bound, not yet listening socket; taken by `start`.
    socket: Mutex<Option<TcpSocket>>,
    serving: AtomicBool,
    site: Arc<Site>,
    stop: CancellationToken,
}

impl Traefik {
    /// Binds the node's API port (refusing connections until `start`).
    pub fn bind(
        node: &str,
        site: Arc<Site>,
        stop: CancellationToken,
    ) -> std::io::Result<Arc<Traefik>> {
        let socket = TcpSocket::new_v4()?;
        socket.bind("127.0.0.1:0".parse().expect("a socket address"))?;
        let addr = socket.local_addr()?;
        Ok(Arc::new(Traefik {
            node: node.to_owned(),
            addr,
            socket: Mutex::new(Some(socket)),
            serving: AtomicBool::new(false),
            site,
            stop,
        }))
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The address this node's Traefik serves (or refuses) on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn node(&self) -> &str {
        &self.node
    }

    pub fn serving(&self) -> bool {
        self.serving.load(Ordering::SeqCst)
    }

    /// Starts answering on the bound port (idempotent).
    pub fn start(self: &Arc<Self>) -> std::io::Result<()> {
        let Some(socket) = self.socket.lock().expect("traefik socket").take() else {
            return Ok(());
        };
        let listener = socket.listen(1024)?;
        self.serving.store(true, Ordering::SeqCst);
        let router = router(self.clone());
        let stop = self.stop.clone();
        tokio::spawn(async move {
            axum::serve(listener, router)
                .with_graceful_shutdown(stop.cancelled_owned())
                .await
        });
        Ok(())
    }
}

fn router(t: Arc<Traefik>) -> Router {
    Router::new()
        .route("/api/version", get(version))
        .route("/api/overview", get(overview))
        .route("/api/entrypoints", get(entrypoints))
        .route("/api/entrypoints/{name}", get(entrypoint))
        .route("/api/http/routers", get(routers))
        .route("/api/http/routers/{name}", get(one_router))
        .route("/api/http/services", get(services))
        .route("/api/http/services/{name}", get(one_service))
        .route(
            "/api/http/middlewares",
            get(|| async { axum::Json(json!([])) }),
        )
        .fallback(not_found)
        .with_state(t)
}

/// Go's `http.NotFound`.
async fn not_found() -> Response {
    (
        StatusCode::NOT_FOUND,
        [
            (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        "404 page not found\n",
    )
        .into_response()
}

fn json_not_found(message: String) -> Response {
    (
        StatusCode::NOT_FOUND,
        axum::Json(json!({"message": message})),
    )
        .into_response()
}

async fn version(State(t): State<Arc<Traefik>>) -> Response {
    axum::Json(
        json!({"Version": t.site.version, "Codename": "langres", "startDate": t.site.start_date}),
    )
    .into_response()
}

fn all_entrypoints() -> Vec<Value> {
    let ep = |name: &str, address: &str| {
        json!({"address": address, "transport": {"lifeCycle": {"graceTimeOut": "10s"},
               "respondingTimeouts": {"readTimeout": "1m0s", "idleTimeout": "3m0s"}},
               "forwardedHeaders": {}, "http": {"sanitizePath": true, "maxHeaderBytes": 1048576},
               "http2": {"maxConcurrentStreams": 250, "maxDecoderHeaderTableSize": 4096, "maxEncoderHeaderTableSize": 4096},
               "udp": {"timeout": "3s"}, "name": name})
    };
    vec![ep("traefik", ":8080"), ep("websecure", ":443")]
}

async fn entrypoints() -> Response {
    axum::Json(all_entrypoints()).into_response()
}

async fn entrypoint(Path(name): Path<String>) -> Response {
    match all_entrypoints().into_iter().find(|e| e["name"] == name) {
        Some(e) => axum::Json(e).into_response(),
        None => json_not_found(format!("entry point not found: {name}")),
    }
}

fn all_routers(site: &Site) -> Vec<Value> {
    let mut out: Vec<Value> = site
        .apps
        .iter()
        .map(|a| {
            let rule = format!("Host(`{}`)", a.host);
            let priority = rule.len();
            json!({"entryPoints": ["websecure"], "service": a.name, "rule": rule, "priority": priority,
                   "tls": {}, "observability": {"accessLogs": true, "metrics": true, "tracing": true, "traceVerbosity": "minimal"},
                   "status": "enabled", "using": ["websecure"], "name": format!("{}@consulcatalog", a.name),
                   "provider": "consulcatalog", "priorityStr": priority.to_string()})
        })
        .collect();
    for name in ["api", "dashboard"] {
        let rule = if name == "api" {
            "PathPrefix(`/api`)"
        } else {
            "PathPrefix(`/`)"
        };
        out.push(json!({"entryPoints": ["traefik"], "service": format!("{name}@internal"), "rule": rule,
                        "priority": if name == "api" { 9223372036854775806u64 } else { 9223372036854775805u64 },
                        "status": "enabled", "using": ["traefik"], "name": format!("{name}@internal"),
                        "provider": "internal"}));
    }
    out.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
    out
}

fn all_services(site: &Site) -> Vec<Value> {
    let mut out: Vec<Value> = site
        .apps
        .iter()
        .map(|a| {
            let servers: Vec<Value> = a.servers.iter().map(|u| json!({"url": u})).collect();
            let status: serde_json::Map<String, Value> =
                a.servers.iter().map(|u| (u.clone(), json!("UP"))).collect();
            json!({"loadBalancer": {"servers": servers, "strategy": "wrr", "passHostHeader": true,
                                    "responseForwarding": {"flushInterval": "100ms"}},
                   "status": "enabled", "usedBy": [format!("{}@consulcatalog", a.name)],
                   "name": format!("{}@consulcatalog", a.name), "provider": "consulcatalog",
                   "type": "loadbalancer", "serverStatus": status})
        })
        .collect();
    for name in ["api", "dashboard", "noop"] {
        let used: Vec<String> = if name == "noop" {
            Vec::new()
        } else {
            vec![format!("{name}@internal")]
        };
        out.push(json!({"status": "enabled", "usedBy": used, "name": format!("{name}@internal"), "provider": "internal"}));
    }
    out.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
    out
}

/// Traefik's list filters: `search` (in the name), `status`, `serviceName`, and paging
/// (`page`, `per_page`, default 100; the next page in `X-Next-Page`).
fn listing(items: Vec<Value>, q: &std::collections::HashMap<String, String>) -> Response {
    let search = q.get("search").map(String::as_str).unwrap_or("");
    let status = q.get("status").map(String::as_str).unwrap_or("");
    let service = q.get("serviceName").map(String::as_str).unwrap_or("");
    let kept: Vec<Value> = items
        .into_iter()
        .filter(|i| i["name"].as_str().is_some_and(|n| n.contains(search)))
        .filter(|i| status.is_empty() || i["status"] == status)
        .filter(|i| service.is_empty() || i["service"] == service)
        .collect();
    let per_page: usize = q
        .get("per_page")
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(100);
    let page: usize = q
        .get("page")
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(1);
    let start = (page - 1) * per_page;
    let next = if start + per_page < kept.len() {
        page + 1
    } else {
        1
    };
    let shown: Vec<Value> = kept.into_iter().skip(start).take(per_page).collect();
    ([("x-next-page", next.to_string())], axum::Json(shown)).into_response()
}

async fn routers(
    State(t): State<Arc<Traefik>>,
    Query(q): Query<std::collections::HashMap<String, String>>,
) -> Response {
    listing(all_routers(&t.site), &q)
}

async fn one_router(State(t): State<Arc<Traefik>>, Path(name): Path<String>) -> Response {
    match all_routers(&t.site).into_iter().find(|r| r["name"] == name) {
        Some(r) => axum::Json(r).into_response(),
        None => json_not_found(format!("router not found: {name}")),
    }
}

async fn services(
    State(t): State<Arc<Traefik>>,
    Query(q): Query<std::collections::HashMap<String, String>>,
) -> Response {
    listing(all_services(&t.site), &q)
}

async fn one_service(State(t): State<Arc<Traefik>>, Path(name): Path<String>) -> Response {
    match all_services(&t.site)
        .into_iter()
        .find(|s| s["name"] == name)
    {
        Some(s) => axum::Json(s).into_response(),
        None => json_not_found(format!("service not found: {name}")),
    }
}

async fn overview(State(t): State<Arc<Traefik>>) -> Response {
    let count = |n: usize| json!({"total": n, "warnings": 0, "errors": 0});
    axum::Json(json!({
        "http": {"routers": count(all_routers(&t.site).len()), "services": count(all_services(&t.site).len()),
                 "middlewares": count(0)},
        "tcp": {"routers": count(0), "services": count(0), "middlewares": count(0)},
        "udp": {"routers": count(0), "services": count(0)},
        "certificates": count(1),
        "features": {"tracing": "", "metrics": "Prometheus", "accessLog": false},
        "providers": ["ConsulCatalog"],
    }))
    .into_response()
}
