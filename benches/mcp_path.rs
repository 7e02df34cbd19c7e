//! MCP path load generator: a governed read through a running `emisar serve` → `emisar runner`
//! → a real Traefik, side by side with the same generator calling Traefik's `/ping` directly.
//!
//!   cargo bench --bench mcp_path          # with the environment below; scripts/bench runs it
//!
//! It talks to processes over HTTP only and links nothing of emisar, so it measures whatever
//! binary scripts/bench started and keeps working while the code inside moves.
//!
//! Each simulated client behaves as an MCP SDK does: it owns ONE HTTP/1.1 connection (its own
//! hyper connection, not a shared pool, so "one connection per client" holds by construction
//! and every reconnect is counted), sends `initialize`, then `notifications/initialized` with
//! the `Mcp-Session-Id` and `Mcp-Protocol-Version` the server handed back, then calls the tool
//! in a loop, reading each SSE (or JSON) answer to its end and checking it is a success in
//! which every named runner answered `ok`. At the end it ends its session with `DELETE`. The
//! direct client keeps one connection to Traefik the same way. Client sockets set
//! TCP_NODELAY, as reqwest, undici and most SDK transports do by default, so what is measured
//! is the server side. With `keep-alive` off (the "fresh connection" rows) each call opens its
//! own connection, and the connect is part of the call's time.
//!
//! Environment (scripts/bench sets the addresses and the token):
//! - `BENCH_MCP_URL`: the server's MCP endpoint, e.g. `http://127.0.0.1:7700/mcp` (required).
//!   `https://` when `BENCH_MCP_CA_FILE` names the CA (PEM) that signed the server's
//!   certificate: each client's one connection is then TLS (rustls, as the runners' and the
//!   server's own), and its handshake is part of the connect.
//! - `BENCH_MCP_TOKEN`: agent bearer tokens, comma-separated (required). Client *i* uses token
//!   *i* mod their number: the server keeps at most 64 MCP sessions per token (its oldest
//!   closed past that), so 200 clients need at least 4 tokens (scripts/bench issues 4).
//! - `BENCH_MCP_RUNNERS`: comma-separated runner names the call names (required).
//! - `BENCH_MCP_TOOL` (`traefik.ping`): the tool; its arguments are
//!   `{"runners": [...], "reason": "bench"}`.
//! - `BENCH_MCP_PROTOCOL` (`2025-11-25`): the protocol version asked for in `initialize`.
//! - `BENCH_DIRECT_URL`: Traefik's ping URL, e.g. `http://127.0.0.1:8080/ping` (required
//!   unless fan-out).
//! - `BENCH_MCP_CLIENTS` (`1,50,200`): concurrent clients per level.
//! - `BENCH_MCP_SECS` (10) measured seconds per configuration, after `BENCH_MCP_WARMUP_SECS`
//!   (2) of the same load that is not recorded.
//! - `BENCH_MCP_FRESH_SECS` (5): measured seconds of the one-client, fresh-connection-per-call
//!   rows (0 skips them).
//! - `BENCH_MCP_FANOUT` (0): 1 measures a fan-out instead: one client, one call naming every
//!   runner in `BENCH_MCP_RUNNERS`, `BENCH_MCP_FANOUT_CALLS` (50) times after 3 warm-up
//!   calls; then each runner alone `BENCH_MCP_FANOUT_SOLO_CALLS` (5) times after one warm-up
//!   call (0 skips that).
//! - `BENCH_MCP_LABEL` (`PostgreSQL`): the heading of this run's section; `BENCH_MCP_PREFIX`
//!   (`pg`): the prefix of its summary keys.
//! - `BENCH_SUMMARY`: a file to append `key=value` lines to (for scripts/bench's budget table).
//! - `BENCH_MCP_PIDS` (optional): `name=PID,…` of the processes on the path (a name ending in
//!   `+` also counts the PID's children: PostgreSQL's backends). For each configuration the
//!   generator reads their CPU time (`/proc/PID/stat`, and its own) at the start and the end
//!   of the measured window and reports CPU per completed call: what each call costs the
//!   machine, and so the most calls/s its cores allow, whatever the latency.
//! - `BENCH_MCP_LIST` (1): also measure `tools/list` with one kept-alive client: the MCP layer
//!   alone (HTTP, token, session, SSE) without the audit log or a runner. 0 skips it.
//! - `BENCH_REFERENCE_URL` (optional): the MCP endpoint of the official TypeScript reference
//!   server (`@modelcontextprotocol/server-everything` in Streamable HTTP mode), e.g.
//!   `http://127.0.0.1:3001/mcp`. At each kept-alive level that is also in
//!   `BENCH_REFERENCE_CLIENTS` (`1,50`), right after emisar's row of that level, the same
//!   clients (the same `McpClient`: one connection, `initialize`, `notifications/initialized`,
//!   the session and protocol headers, the SSE answer read to its end) call its `echo` tool
//!   with `{"message": "bench"}` and check the answer is `Echo: bench`. The report sets the
//!   governed read's p50 against that bare echo's (`cN.read_vs_reference_p50`). The reference
//!   answers every POST with an SSE stream (a priming event with empty data, then the answer),
//!   the same shape as emisar's. `BENCH_REFERENCE_PIDS` (optional, `name=PID,…` as
//!   `BENCH_MCP_PIDS`): its process(es), for the CPU per echo.
//!
//! - `BENCH_MCP_LIMIT` (0): 1 measures an agent's rate limit across replicas instead: the
//!   server's endpoints in `BENCH_MCP_URL` are comma-separated (one per replica), every client
//!   uses the same agent's token and calls `BENCH_MCP_TOOL` (here `emisar.runners`, which the
//!   server answers itself: no runner on the path) with `{"reason": "bench"}`.
//!   `BENCH_LIMIT_CLIENTS_PER_URL` (2) clients per endpoint together offer
//!   `BENCH_LIMIT_OFFER_PER_S` (60) calls/s, evenly paced and spread, for `BENCH_MCP_SECS`;
//!   each answer is served, refused (`rate limited`) or an error. `BENCH_LIMIT_RATE` (20) and
//!   `BENCH_LIMIT_BURST` (40), the agent's limit as the servers were configured, give the
//!   limit over the run, `burst + rate × t` (t from the first call to the last answer), and
//!   `shared_limit.rs`'s bound, that plus `replicas × max(1, rate × 50 ms)`.
//!
//! Progress goes to stderr; the results go to stdout as Markdown. Calls that fail are counted
//! per configuration; a run with any error says so in bold and in the summary (`.errors`).

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{Out, env_num, log, ms};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::{Method, Request, StatusCode, header};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

/// A required setting.
fn env_str(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} must be set (see benches/mcp_path.rs)"))
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

/// A comma-separated list of client counts.
fn env_levels(name: &str, default: &str) -> Vec<usize> {
    env_or(name, default)
        .split(',')
        .map(|s| {
            s.trim()
                .parse()
                .unwrap_or_else(|_| panic!("{name}: `{s}` is not a number"))
        })
        .collect()
}

/// `http(s)://HOST:PORT/PATH` → the socket address, the Host header, the path, and the TLS
/// client for `https://` (which needs `BENCH_MCP_CA_FILE`). Only an IP literal: the
/// generator measures loopback and resolves nothing.
fn split_url(url: &str) -> (SocketAddr, String, String, Option<Arc<Tls>>) {
    let (rest, https) = match (url.strip_prefix("http://"), url.strip_prefix("https://")) {
        (Some(rest), _) => (rest, false),
        (_, Some(rest)) => (rest, true),
        _ => panic!("`{url}` must start with http:// or https://"),
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let addr: SocketAddr = authority
        .parse()
        .unwrap_or_else(|e| panic!("`{authority}` in `{url}` must be IP:PORT: {e}"));
    let tls = https.then(|| Arc::new(Tls::from_env(addr.ip())));
    (addr, authority.to_owned(), path.to_owned(), tls)
}

/// The TLS client of an `https://` target: it trusts only `BENCH_MCP_CA_FILE`'s CA and checks
/// the certificate names the target's IP address.
struct Tls {
    connector: tokio_rustls::TlsConnector,
    name: rustls::pki_types::ServerName<'static>,
}

impl Tls {
    fn from_env(ip: std::net::IpAddr) -> Tls {
        use rustls::pki_types::{CertificateDer, pem::PemObject};
        let file = env_str("BENCH_MCP_CA_FILE");
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(&file)
            .unwrap_or_else(|e| panic!("BENCH_MCP_CA_FILE `{file}`: {e}"))
        {
            roots
                .add(cert.unwrap_or_else(|e| panic!("BENCH_MCP_CA_FILE `{file}`: {e}")))
                .unwrap_or_else(|e| panic!("BENCH_MCP_CA_FILE `{file}`: {e}"));
        }
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("the provider supports TLS 1.2 and 1.3")
            .with_root_certificates(roots)
            .with_no_client_auth();
        Tls {
            connector: tokio_rustls::TlsConnector::from(Arc::new(config)),
            name: rustls::pki_types::ServerName::IpAddress(ip.into()),
        }
    }
}

/// One HTTP/1.1 connection that a client keeps (or, with `keep_alive` off, opens anew for
/// each request). Written on hyper's connection API rather than a pooled client so that the
/// number of connections is exactly what the client does, and visible.
struct Conn {
    addr: SocketAddr,
    tls: Option<Arc<Tls>>,
    keep_alive: bool,
    sender: Option<SendRequest<Full<Bytes>>>,
    /// Connections opened so far (1 for a client that kept its connection throughout).
    connects: u64,
}

/// An HTTP/1.1 client connection over `io`; its task ends when the sender is dropped or the
/// peer closes.
async fn http1<IO>(io: IO) -> Result<SendRequest<Full<Bytes>>, String>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| format!("HTTP handshake: {e}"))?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(sender)
}

struct Answer {
    status: StatusCode,
    headers: header::HeaderMap,
    body: Bytes,
}

impl Conn {
    fn new(target: &Target, keep_alive: bool) -> Conn {
        Conn {
            addr: target.addr,
            tls: target.tls.clone(),
            keep_alive,
            sender: None,
            connects: 0,
        }
    }

    async fn open(&mut self) -> Result<SendRequest<Full<Bytes>>, String> {
        let tcp = tokio::net::TcpStream::connect(self.addr)
            .await
            .map_err(|e| format!("connect {}: {e}", self.addr))?;
        tcp.set_nodelay(true)
            .map_err(|e| format!("TCP_NODELAY: {e}"))?;
        let sender = match &self.tls {
            None => http1(tcp).await?,
            Some(tls) => {
                http1(
                    tls.connector
                        .connect(tls.name.clone(), tcp)
                        .await
                        .map_err(|e| format!("TLS handshake with {}: {e}", self.addr))?,
                )
                .await?
            }
        };
        self.connects += 1;
        Ok(sender)
    }

    async fn send(&mut self, request: Request<Full<Bytes>>) -> Result<Answer, String> {
        // A kept connection the peer has closed is replaced (and counted in `connects`).
        let kept = match self.sender.take() {
            Some(mut s) => s.ready().await.ok().map(|()| s),
            None => None,
        };
        let mut sender = match kept {
            Some(s) => s,
            None => self.open().await?,
        };
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| format!("request: {e}"))?;
        let (parts, body) = response.into_parts();
        let body = body
            .collect()
            .await
            .map_err(|e| format!("reading the body: {e}"))?
            .to_bytes();
        if self.keep_alive {
            self.sender = Some(sender);
        }
        Ok(Answer {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    }
}

/// Where the generator sends its requests.
#[derive(Clone)]
struct Target {
    addr: SocketAddr,
    host: String,
    path: String,
    tls: Option<Arc<Tls>>,
}

impl Target {
    fn parse(url: &str) -> Target {
        let (addr, host, path, tls) = split_url(url);
        Target {
            addr,
            host,
            path,
            tls,
        }
    }
}

/// What the MCP clients share.
struct McpSettings {
    target: Target,
    /// The agent's bearer tokens, one per client in turn; empty for the reference server,
    /// which has no auth.
    tokens: Vec<String>,
    protocol: String,
    tool: String,
}

/// What the reference server's `echo` is asked to echo.
const ECHO_MESSAGE: &str = "bench";

/// An MCP client over streamable HTTP: one session on one connection.
struct McpClient {
    settings: Arc<McpSettings>,
    conn: Conn,
    session: Option<String>,
    protocol: String,
    next_id: u64,
    /// This client's bearer token (see `BENCH_MCP_TOKEN`).
    token: Option<String>,
}

/// How many clients were made: client *i* takes token *i* mod their number.
static CLIENTS_MADE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn tokens_of(list: &str) -> Vec<String> {
    list.split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The one JSON-RPC message in an answer: the JSON body, or the SSE event whose data is the
/// response to `id` (the priming event and any notifications are skipped).
fn jsonrpc_answer(a: &Answer, id: u64) -> Result<Value, String> {
    let content_type = a
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let text = std::str::from_utf8(&a.body).map_err(|_| "the answer is not UTF-8".to_owned())?;
    if !a.status.is_success() {
        return Err(format!(
            "HTTP {}: {}",
            a.status,
            text.chars().take(300).collect::<String>()
        ));
    }
    let is_ours = |v: &Value| v.get("id").and_then(Value::as_u64) == Some(id);
    if content_type.starts_with("application/json") {
        let v: Value = serde_json::from_str(text).map_err(|e| format!("JSON answer: {e}"))?;
        return if is_ours(&v) {
            Ok(v)
        } else {
            Err(format!("answer to another request: {v}"))
        };
    }
    if !content_type.starts_with("text/event-stream") {
        return Err(format!("unexpected content-type `{content_type}`"));
    }
    // SSE: events are separated by a blank line; an event's data is its `data:` lines joined.
    let mut data = String::new();
    for line in text.lines().chain(std::iter::once("")) {
        if line.is_empty() {
            if !data.trim().is_empty() {
                let v: Value =
                    serde_json::from_str(&data).map_err(|e| format!("SSE data `{data}`: {e}"))?;
                if is_ours(&v) {
                    return Ok(v);
                }
            }
            data.clear();
        } else if let Some(d) = line.strip_prefix("data:") {
            if !data.is_empty() {
                data.push('\n');
            }
            data.push_str(d.strip_prefix(' ').unwrap_or(d));
        }
    }
    Err(format!(
        "the event stream ended without the answer to request {id}: {}",
        text.chars().take(300).collect::<String>()
    ))
}

impl McpClient {
    fn new(settings: Arc<McpSettings>, keep_alive: bool) -> McpClient {
        let conn = Conn::new(&settings.target, keep_alive);
        let protocol = settings.protocol.clone();
        let n = CLIENTS_MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let token = (!settings.tokens.is_empty())
            .then(|| settings.tokens[n % settings.tokens.len()].clone());
        McpClient {
            settings,
            conn,
            session: None,
            protocol,
            next_id: 1,
            token,
        }
    }

    fn request(&self, method: Method, body: Option<&Value>) -> Request<Full<Bytes>> {
        let s = &self.settings;
        let mut r = Request::builder()
            .method(method)
            .uri(&s.target.path)
            .header(header::HOST, &s.target.host)
            .header(header::ACCEPT, "application/json, text/event-stream")
            .header("mcp-protocol-version", &self.protocol);
        if let Some(token) = &self.token {
            r = r.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        if let Some(session) = &self.session {
            r = r.header("mcp-session-id", session);
        }
        let body = match body {
            Some(v) => {
                r = r.header(header::CONTENT_TYPE, "application/json");
                Bytes::from(serde_json::to_vec(v).expect("JSON"))
            }
            None => Bytes::new(),
        };
        r.body(Full::new(body)).expect("a well-formed request")
    }

    /// `initialize`, then `notifications/initialized`, as an SDK opens a session.
    async fn initialize(&mut self) -> Result<(), String> {
        let id = self.next_id;
        self.next_id += 1;
        let init = json!({
            "jsonrpc": "2.0", "id": id, "method": "initialize",
            "params": {
                "protocolVersion": self.settings.protocol,
                "capabilities": {},
                "clientInfo": {"name": "emisar-bench", "version": "0"},
            },
        });
        // The first request carries no protocol header yet, as SDKs send it.
        let mut request = self.request(Method::POST, Some(&init));
        request.headers_mut().remove("mcp-protocol-version");
        let answer = self.conn.send(request).await?;
        self.session = answer
            .headers
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let v = jsonrpc_answer(&answer, id)?;
        let version = v["result"]["protocolVersion"]
            .as_str()
            .ok_or_else(|| format!("initialize failed: {v}"))?;
        self.protocol = version.to_owned();
        let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        let answer = self
            .conn
            .send(self.request(Method::POST, Some(&note)))
            .await?;
        if answer.status != StatusCode::ACCEPTED {
            return Err(format!(
                "notifications/initialized: HTTP {} {}",
                answer.status,
                String::from_utf8_lossy(&answer.body)
            ));
        }
        Ok(())
    }

    /// One `tools/call` of the settings' tool with `arguments`; on success, its `result`.
    /// The governed read and the reference echo both go through here.
    async fn tools_call(&mut self, arguments: Value) -> Result<Value, String> {
        let id = self.next_id;
        self.next_id += 1;
        let body = json!({
            "jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": self.settings.tool, "arguments": arguments},
        });
        let answer = self
            .conn
            .send(self.request(Method::POST, Some(&body)))
            .await?;
        let mut v = jsonrpc_answer(&answer, id)?;
        let Some(result) = v.get_mut("result").map(Value::take) else {
            return Err(format!("JSON-RPC error: {}", v["error"]));
        };
        if result["isError"].as_bool() == Some(true) {
            return Err(format!("tool error: {}", result["content"]));
        }
        Ok(result)
    }

    /// One governed read; on success, the slowest runner's `duration_ms` in the answer.
    async fn call(&mut self, runners: &[String]) -> Result<u64, String> {
        let result = self
            .tools_call(json!({"runners": runners, "reason": "bench"}))
            .await?;
        let results = result["structuredContent"]["results"]
            .as_array()
            .ok_or_else(|| format!("no structuredContent.results in {result}"))?;
        if results.len() != runners.len() {
            return Err(format!(
                "{} runner results for {} runners",
                results.len(),
                runners.len()
            ));
        }
        let mut slowest = 0;
        for r in results {
            if r["ok"].as_bool() != Some(true) {
                return Err(format!("runner failed: {r}"));
            }
            slowest = slowest.max(r["duration_ms"].as_u64().unwrap_or(0));
        }
        Ok(slowest)
    }

    /// The reference server's `echo` of [`ECHO_MESSAGE`]; the answer must be its echo.
    async fn echo(&mut self) -> Result<u64, String> {
        let result = self.tools_call(json!({"message": ECHO_MESSAGE})).await?;
        let text = result["content"][0]["text"].as_str();
        if text != Some(&format!("Echo: {ECHO_MESSAGE}")) {
            return Err(format!("not the echo of `{ECHO_MESSAGE}`: {result}"));
        }
        Ok(0)
    }

    /// One `tools/list`; the answer must list the tool the calls use.
    async fn list(&mut self) -> Result<u64, String> {
        let id = self.next_id;
        self.next_id += 1;
        let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/list", "params": {}});
        let answer = self
            .conn
            .send(self.request(Method::POST, Some(&body)))
            .await?;
        let v = jsonrpc_answer(&answer, id)?;
        let tools = v["result"]["tools"]
            .as_array()
            .ok_or_else(|| format!("no result.tools in {v}"))?;
        if !tools
            .iter()
            .any(|t| t["name"] == self.settings.tool.as_str())
        {
            return Err(format!("tools/list does not list `{}`", self.settings.tool));
        }
        Ok(0)
    }

    /// Ends the session (`DELETE`), as an SDK does when it closes; not timed.
    async fn close(&mut self) {
        if self.session.is_some() {
            let request = self.request(Method::DELETE, None);
            let _ = self.conn.send(request).await;
        }
    }
}

/// The direct client: `GET /ping` on Traefik over its own connection.
struct DirectClient {
    target: Target,
    conn: Conn,
}

impl DirectClient {
    async fn call(&mut self) -> Result<u64, String> {
        let request = Request::builder()
            .method(Method::GET)
            .uri(&self.target.path)
            .header(header::HOST, &self.target.host)
            .body(Full::new(Bytes::new()))
            .expect("a well-formed request");
        let a = self.conn.send(request).await?;
        if a.status != StatusCode::OK || a.body.as_ref() != b"OK" {
            return Err(format!(
                "HTTP {}: {}",
                a.status,
                String::from_utf8_lossy(&a.body)
            ));
        }
        Ok(0)
    }
}

enum Client {
    Direct(DirectClient),
    Mcp(McpClient, Arc<Vec<String>>),
    /// `tools/list` on a session: the MCP layer without the audit log or a runner.
    List(McpClient),
    /// `echo` on a session with the reference server.
    Echo(McpClient),
}

impl Client {
    async fn call(&mut self) -> Result<u64, String> {
        match self {
            Client::Direct(c) => c.call().await,
            Client::Mcp(c, runners) => c.call(runners).await,
            Client::List(c) => c.list().await,
            Client::Echo(c) => c.echo().await,
        }
    }

    fn connects(&self) -> u64 {
        match self {
            Client::Direct(c) => c.conn.connects,
            Client::Mcp(c, _) | Client::List(c) | Client::Echo(c) => c.conn.connects,
        }
    }
}

/// A process whose CPU time is counted over each measured window.
#[derive(Clone)]
struct Watched {
    name: String,
    pid: u32,
    /// Its children count too (PostgreSQL's postmaster and its backends).
    children: bool,
}

/// The processes `name=PID,…` in the setting `var` (`BENCH_MCP_PIDS`, `BENCH_REFERENCE_PIDS`),
/// plus the generator itself.
fn watched(var: &str) -> Vec<Watched> {
    let mut out: Vec<Watched> = env_or(var, "")
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|item| {
            let (name, pid) = item
                .split_once('=')
                .unwrap_or_else(|| panic!("{var}: `{item}` is not name=PID"));
            let (pid, children) = match pid.strip_suffix('+') {
                Some(p) => (p, true),
                None => (pid, false),
            };
            Watched {
                name: name.trim().to_owned(),
                pid: pid
                    .trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("{var}: `{pid}` is not a PID")),
                children,
            }
        })
        .collect();
    out.push(Watched {
        name: "generator".into(),
        pid: std::process::id(),
        children: false,
    });
    out
}

/// `(ppid, utime + stime in ticks)` from `/proc/PID/stat`; `None` once the process is gone.
fn stat_ticks(pid: u32) -> Option<(u32, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces: fields count from after it.
    let rest = &text[text.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    // After the name: state(0) ppid(1) … utime(11) stime(12).
    let ppid = fields.get(1)?.parse().ok()?;
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((ppid, utime + stime))
}

/// CPU seconds used so far by each watched process (with its children where asked).
/// `/proc` reports ticks of USER_HZ, which Linux fixes at 100 for user space.
fn cpu_now(watched: &[Watched]) -> Vec<f64> {
    const USER_HZ: f64 = 100.0;
    let all: Vec<(u32, u32, u64)> = std::fs::read_dir("/proc")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
                .filter_map(|pid| stat_ticks(pid).map(|(ppid, t)| (pid, ppid, t)))
                .collect()
        })
        .unwrap_or_default();
    watched
        .iter()
        .map(|w| {
            let ticks: u64 = all
                .iter()
                .filter(|(pid, ppid, _)| *pid == w.pid || (w.children && *ppid == w.pid))
                .map(|(_, _, t)| t)
                .sum();
            ticks as f64 / USER_HZ
        })
        .collect()
}

/// Latencies in milliseconds.
#[derive(Default)]
struct Samples(Vec<f64>);

impl Samples {
    fn sorted(mut self) -> Sorted {
        self.0.sort_unstable_by(f64::total_cmp);
        Sorted(self.0)
    }
}

struct Sorted(Vec<f64>);

impl Sorted {
    /// Nearest-rank percentile (`NaN` without samples).
    fn pct(&self, p: f64) -> f64 {
        if self.0.is_empty() {
            return f64::NAN;
        }
        let i = ((p / 100.0) * (self.0.len() - 1) as f64).round() as usize;
        self.0[i]
    }
}

/// One configuration's outcome.
struct Level {
    what: &'static str,
    clients: usize,
    keep_alive: bool,
    /// Successful calls that started in the measured window (their latencies are in
    /// `latency`).
    calls: usize,
    /// Successful calls that completed inside the measured window.
    completed: usize,
    /// The same, per second.
    per_second: f64,
    latency: Sorted,
    /// Failed calls, warm-up included.
    errors: u64,
    first_errors: Vec<String>,
    connections: u64,
    /// CPU seconds each watched process used in the measured window.
    cpu: Vec<(String, f64)>,
}

struct Window {
    warmup: Duration,
    measured: Duration,
}

/// Runs `clients` (already set up) for the warm-up and the measured window, all at once.
async fn drive(
    what: &'static str,
    clients: Vec<Client>,
    keep_alive: bool,
    w: &Window,
    watched: &[Watched],
) -> (Level, Vec<Client>) {
    let n = clients.len();
    let start = Instant::now();
    let from = start + w.warmup;
    let until = from + w.measured;
    let sampler = {
        let watched = watched.to_vec();
        tokio::spawn(async move {
            tokio::time::sleep_until(from.into()).await;
            let before = cpu_now(&watched);
            tokio::time::sleep_until(until.into()).await;
            let after = cpu_now(&watched);
            watched
                .into_iter()
                .zip(before.iter().zip(after))
                .map(|(w, (b, a))| (w.name, a - b))
                .collect::<Vec<_>>()
        })
    };
    let tasks: Vec<_> = clients
        .into_iter()
        .map(|mut client| {
            tokio::spawn(async move {
                let mut samples = Vec::new();
                let mut completed = 0usize;
                let mut errors = 0u64;
                let mut first_errors = Vec::new();
                loop {
                    let t0 = Instant::now();
                    if t0 >= until {
                        break;
                    }
                    let r = client.call().await;
                    let t1 = Instant::now();
                    match r {
                        // Only successful calls count: a failure is not a governed read.
                        Ok(_) => {
                            if t0 >= from {
                                samples.push((t1 - t0).as_secs_f64() * 1e3);
                            }
                            if t1 >= from && t1 <= until {
                                completed += 1;
                            }
                        }
                        Err(e) => {
                            errors += 1;
                            if first_errors.len() < 3 {
                                first_errors.push(e);
                            }
                        }
                    }
                }
                (client, samples, completed, errors, first_errors)
            })
        })
        .collect();
    let mut all = Samples::default();
    let mut completed = 0;
    let mut errors = 0;
    let mut first_errors: Vec<String> = Vec::new();
    let mut back = Vec::with_capacity(n);
    for t in tasks {
        let (client, samples, done, errs, firsts) = t.await.expect("a client task panicked");
        all.0.extend(samples);
        completed += done;
        errors += errs;
        for e in firsts {
            if first_errors.len() < 3 && !first_errors.contains(&e) {
                first_errors.push(e);
            }
        }
        back.push(client);
    }
    let connections = back.iter().map(Client::connects).sum();
    let cpu = sampler.await.expect("the CPU sampler panicked");
    let calls = all.0.len();
    let level = Level {
        what,
        clients: n,
        keep_alive,
        calls,
        completed,
        per_second: completed as f64 / w.measured.as_secs_f64(),
        latency: all.sorted(),
        errors,
        first_errors,
        connections,
        cpu,
    };
    (level, back)
}

async fn direct_clients(url: &Target, n: usize, keep_alive: bool) -> Vec<Client> {
    (0..n)
        .map(|_| {
            Client::Direct(DirectClient {
                target: url.clone(),
                conn: Conn::new(url, keep_alive),
            })
        })
        .collect()
}

/// `n` MCP clients, each with its session open, or the first error met opening one.
async fn open_sessions(
    settings: &Arc<McpSettings>,
    n: usize,
    keep_alive: bool,
) -> Result<Vec<McpClient>, String> {
    futures::future::join_all((0..n).map(|_| async {
        let mut c = McpClient::new(settings.clone(), keep_alive);
        c.initialize().await.map(|()| c)
    }))
    .await
    .into_iter()
    .collect()
}

/// `n` clients of the governed read, each with its session open; a client that cannot open
/// one stops the run.
async fn mcp_clients(
    settings: &Arc<McpSettings>,
    runners: &Arc<Vec<String>>,
    n: usize,
    keep_alive: bool,
) -> Vec<Client> {
    match open_sessions(settings, n, keep_alive).await {
        Ok(clients) => clients
            .into_iter()
            .map(|c| Client::Mcp(c, runners.clone()))
            .collect(),
        Err(e) => {
            eprintln!("[bench] ERROR: an MCP client could not open its session: {e}");
            std::process::exit(1);
        }
    }
}

async fn close_all(clients: Vec<Client>) {
    futures::future::join_all(clients.into_iter().map(|c| async move {
        if let Client::Mcp(mut c, _) | Client::List(mut c) | Client::Echo(mut c) = c {
            c.close().await;
        }
    }))
    .await;
}

/// One configuration's outcome as a progress line.
fn log_level(what: &str, l: &Level) {
    log(format!(
        "  {what} p50 {} ms, p99 {} ms, {:.0}/s, {} errors",
        ms(l.latency.pct(50.0)),
        ms(l.latency.pct(99.0)),
        l.per_second,
        l.errors
    ));
}

fn level_row(l: &Level) -> String {
    let errors = if l.errors == 0 {
        "0".to_owned()
    } else {
        format!("**{}**", l.errors)
    };
    format!(
        "| {} | {} | {} | {} | {:.0} | {} | {} | {} | {} | {} |",
        l.what,
        l.clients,
        if l.keep_alive {
            "kept alive"
        } else {
            "fresh per call"
        },
        l.calls,
        l.per_second,
        ms(l.latency.pct(50.0)),
        ms(l.latency.pct(99.0)),
        ms(l.latency.pct(100.0)),
        errors,
        l.connections,
    )
}

/// A ratio with two significant digits below 1 (0.0031, 0.21), two decimals above.
fn ratio_text(r: f64) -> String {
    if r.is_nan() || r >= 1.0 || r == 0.0 {
        format!("{r:.2}")
    } else {
        let decimals = (1 - r.log10().floor() as i32).max(2) as usize;
        format!("{r:.decimals$}")
    }
}

fn summarise(out: &mut Out, prefix: &str, key: &str, l: &Level) {
    out.kv(
        prefix,
        &format!("{key}.p50_ms"),
        format!("{:.3}", l.latency.pct(50.0)),
    );
    out.kv(
        prefix,
        &format!("{key}.p95_ms"),
        format!("{:.3}", l.latency.pct(95.0)),
    );
    out.kv(
        prefix,
        &format!("{key}.p99_ms"),
        format!("{:.3}", l.latency.pct(99.0)),
    );
    out.kv(
        prefix,
        &format!("{key}.calls_per_s"),
        format!("{:.0}", l.per_second),
    );
    out.kv(prefix, &format!("{key}.calls"), l.calls);
    out.kv(prefix, &format!("{key}.errors"), l.errors);
    out.kv(prefix, &format!("{key}.connections"), l.connections);
}

async fn path_run(out: &mut Out, prefix: &str, label: &str) {
    let direct = Target::parse(&env_str("BENCH_DIRECT_URL"));
    let settings = Arc::new(McpSettings {
        target: Target::parse(&env_str("BENCH_MCP_URL")),
        tokens: tokens_of(&env_str("BENCH_MCP_TOKEN")),
        protocol: env_or("BENCH_MCP_PROTOCOL", "2025-11-25"),
        tool: env_or("BENCH_MCP_TOOL", "traefik.ping"),
    });
    let runners: Arc<Vec<String>> = Arc::new(
        env_str("BENCH_MCP_RUNNERS")
            .split(',')
            .map(str::to_owned)
            .collect(),
    );
    let levels = env_levels("BENCH_MCP_CLIENTS", "1,50,200");
    // The reference server's echo, called by the same clients as the read (see the header).
    let reference = std::env::var("BENCH_REFERENCE_URL")
        .ok()
        .filter(|url| !url.is_empty())
        .map(|url| {
            Arc::new(McpSettings {
                target: Target::parse(&url),
                tokens: Vec::new(),
                protocol: settings.protocol.clone(),
                tool: "echo".to_owned(),
            })
        });
    let reference_levels = env_levels("BENCH_REFERENCE_CLIENTS", "1,50");
    let reference_watched = watched("BENCH_REFERENCE_PIDS");
    // (index of emisar's row at the same level in `rows`, the reference's row)
    let mut references: Vec<(usize, Level)> = Vec::new();
    // Why the reference could not be measured, when it could not.
    let mut reference_failed: Option<String> = None;
    let window = Window {
        warmup: Duration::from_secs(env_num("BENCH_MCP_WARMUP_SECS", 2)),
        measured: Duration::from_secs(env_num("BENCH_MCP_SECS", 10)),
    };
    let fresh_secs = env_num("BENCH_MCP_FRESH_SECS", 5);
    let watched = watched("BENCH_MCP_PIDS");

    let mut rows: Vec<Level> = Vec::new();
    let mut pairs: Vec<(usize, bool, usize)> = Vec::new(); // (clients, kept alive, index of direct)
    let mut configs: Vec<(usize, bool, Window)> = levels
        .iter()
        .map(|&n| {
            (
                n,
                true,
                Window {
                    warmup: window.warmup,
                    measured: window.measured,
                },
            )
        })
        .collect();
    if fresh_secs > 0 {
        configs.push((
            1,
            false,
            Window {
                warmup: Duration::from_secs(1),
                measured: Duration::from_secs(fresh_secs),
            },
        ));
    }
    for (n, keep_alive, w) in &configs {
        let conn = if *keep_alive { "kept alive" } else { "fresh" };
        log(format!(
            "{label}: {n} client(s), {conn} connection: direct /ping for {:?} + {:?}",
            w.warmup, w.measured
        ));
        let clients = direct_clients(&direct, *n, *keep_alive).await;
        let (d, _) = drive("direct: Traefik `/ping`", clients, *keep_alive, w, &watched).await;
        log_level("direct", &d);
        log(format!(
            "{label}: {n} client(s), {conn} connection: through emisar"
        ));
        let clients = mcp_clients(&settings, &runners, *n, *keep_alive).await;
        let (e, clients) = drive(
            "through emisar: `traefik.ping`",
            clients,
            *keep_alive,
            w,
            &watched,
        )
        .await;
        close_all(clients).await;
        log_level("emisar", &e);
        pairs.push((*n, *keep_alive, rows.len()));
        rows.push(d);
        rows.push(e);
        let Some(reference) = &reference else {
            continue;
        };
        if !*keep_alive || !reference_levels.contains(n) || reference_failed.is_some() {
            continue;
        }
        log(format!(
            "{label}: {n} client(s), kept alive connection: the reference server's echo"
        ));
        match open_sessions(reference, *n, true).await {
            Ok(clients) => {
                let clients = clients.into_iter().map(Client::Echo).collect();
                let (l, clients) = drive(
                    "reference server: `echo`",
                    clients,
                    true,
                    w,
                    &reference_watched,
                )
                .await;
                close_all(clients).await;
                log_level("reference echo", &l);
                references.push((rows.len() - 1, l));
            }
            Err(e) => {
                log(format!(
                    "ERROR: a client could not open its session on the reference server: {e}"
                ));
                reference_failed = Some(e);
            }
        }
    }
    // The MCP layer alone: the same session handling and SSE answer, no audit, no runner.
    let list = if env_num("BENCH_MCP_LIST", 1) == 1 {
        log(format!(
            "{label}: 1 client, kept alive connection: tools/list"
        ));
        let clients: Vec<Client> = mcp_clients(&settings, &runners, 1, true)
            .await
            .into_iter()
            .map(|c| match c {
                Client::Mcp(c, _) => Client::List(c),
                other => other,
            })
            .collect();
        let (l, clients) = drive(
            "through emisar: `tools/list`",
            clients,
            true,
            &window,
            &watched,
        )
        .await;
        close_all(clients).await;
        log_level("tools/list", &l);
        Some(l)
    } else {
        None
    };

    use std::fmt::Write;
    let mut report = String::new();
    let r = &mut report;
    if let Some(l) = list {
        rows.push(l);
    }
    let total_errors: u64 = rows.iter().map(|l| l.errors).sum();
    let reference_errors: u64 = references.iter().map(|(_, l)| l.errors).sum();
    let _ = writeln!(r, "\n#### {label}\n");
    if total_errors + reference_errors > 0 {
        let _ = writeln!(
            r,
            "**{} calls failed in this run; the figures below are not a clean measurement.** First errors:\n",
            total_errors + reference_errors
        );
        let all = rows.iter().chain(references.iter().map(|(_, l)| l));
        for l in all.filter(|l| l.errors > 0) {
            for e in &l.first_errors {
                let _ = writeln!(
                    r,
                    "- {} × {} clients: `{}`",
                    l.what,
                    l.clients,
                    e.replace('`', "'")
                );
            }
        }
        let _ = writeln!(r);
    }
    let _ = writeln!(
        r,
        "| path | clients | connection | calls | calls/s | p50 ms | p99 ms | max ms | errors | connections opened (warm-up included) |"
    );
    let _ = writeln!(r, "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|");
    for l in rows.iter().chain(references.iter().map(|(_, l)| l)) {
        let _ = writeln!(r, "{}", level_row(l));
    }
    let _ = writeln!(
        r,
        "\n| clients | connection | p50 overhead (emisar − direct) | p50 ratio (emisar ÷ direct) | calls/s ratio (emisar ÷ direct) |"
    );
    let _ = writeln!(r, "|---:|---|---:|---:|---:|");
    for &(n, keep_alive, i) in &pairs {
        let (d, e) = (&rows[i], &rows[i + 1]);
        let over = e.latency.pct(50.0) - d.latency.pct(50.0);
        let ratio = e.latency.pct(50.0) / d.latency.pct(50.0);
        let tput = e.per_second / d.per_second;
        let _ = writeln!(
            r,
            "| {n} | {} | {} ms | {ratio:.1}× | {} |",
            if keep_alive {
                "kept alive"
            } else {
                "fresh per call"
            },
            ms(over),
            ratio_text(tput),
        );
        let key = if keep_alive {
            format!("c{n}")
        } else {
            "fresh".to_owned()
        };
        summarise(out, prefix, &format!("{key}.direct"), d);
        summarise(out, prefix, &format!("{key}.emisar"), e);
        out.kv(
            prefix,
            &format!("{key}.overhead_p50_ms"),
            format!("{over:.3}"),
        );
        out.kv(
            prefix,
            &format!("{key}.ratio_calls_per_s"),
            ratio_text(tput),
        );
        out.kv(prefix, &format!("{key}.ratio_p50"), format!("{ratio:.2}"));
    }
    if let (Some(l), Some(&(_, _, i))) = (
        rows.last().filter(|l| l.what.contains("tools/list")),
        pairs
            .iter()
            .find(|(n, keep_alive, _)| *n == 1 && *keep_alive),
    ) {
        let over = l.latency.pct(50.0) - rows[i].latency.pct(50.0);
        let _ = writeln!(
            r,
            "\n`tools/list` on one kept-alive session (HTTP, token, session, SSE answer; no audit, no runner): p50 {} ms, {} ms more than the direct `/ping`.",
            ms(l.latency.pct(50.0)),
            ms(over)
        );
        summarise(out, prefix, "list", l);
    }
    cpu_table(r, out, prefix, &rows);
    if reference.is_some() {
        reference_report(r, out, prefix, &rows, &references, reference_failed);
    }
    out.report.push_str(&report);
    out.kv(prefix, "errors", total_errors);
    if total_errors > 0 {
        log(format!(
            "ERROR: {total_errors} calls failed in the {label} run; see the report"
        ));
    }
}

/// The governed read set against the reference server's bare echo, level by level, with the
/// reference's CPU per echo; `failed` says why it could not be measured, when it could not.
fn reference_report(
    r: &mut String,
    out: &mut Out,
    prefix: &str,
    rows: &[Level],
    references: &[(usize, Level)],
    failed: Option<String>,
) {
    use std::fmt::Write;
    if let Some(e) = failed {
        let _ = writeln!(
            r,
            "\n**The reference server could not be measured:** a client could not open its session: `{}`",
            e.replace('`', "'")
        );
        out.kv(prefix, "reference.failed", 1);
    }
    if references.is_empty() {
        return;
    }
    let _ = writeln!(
        r,
        "\nThe governed read against the reference MCP server's bare `echo` (`@modelcontextprotocol/server-everything`, Streamable HTTP: no auth, no audit, no runner), the same clients in the same run:\n"
    );
    let _ = writeln!(
        r,
        "| clients | governed read p50 / p95 / p99 ms | reference `echo` p50 / p95 / p99 ms | p50 ratio (read ÷ echo) | calls/s read / echo | calls/s ratio (read ÷ echo) |"
    );
    let _ = writeln!(r, "|---:|---:|---:|---:|---:|---:|");
    let pcts = |l: &Level| {
        format!(
            "{} / {} / {}",
            ms(l.latency.pct(50.0)),
            ms(l.latency.pct(95.0)),
            ms(l.latency.pct(99.0))
        )
    };
    for (i, l) in references {
        let e = &rows[*i];
        let ratio = e.latency.pct(50.0) / l.latency.pct(50.0);
        let tput = e.per_second / l.per_second;
        let _ = writeln!(
            r,
            "| {} | {} | {} | **{ratio:.2}×** | {:.0} / {:.0} | {} |",
            l.clients,
            pcts(e),
            pcts(l),
            e.per_second,
            l.per_second,
            ratio_text(tput)
        );
        let key = format!("c{}", l.clients);
        summarise(out, prefix, &format!("{key}.reference"), l);
        out.kv(
            prefix,
            &format!("{key}.read_vs_reference_p50"),
            format!("{ratio:.2}"),
        );
        out.kv(
            prefix,
            &format!("{key}.read_vs_reference_calls_per_s"),
            ratio_text(tput),
        );
    }
    // Its CPU per echo: the reference's process(es) and the generator, as for the read.
    let cpu: Vec<String> = references
        .iter()
        .filter(|(_, l)| l.completed > 0 && l.cpu.len() > 1)
        .map(|(_, l)| {
            let cells: Vec<String> = l
                .cpu
                .iter()
                .map(|(name, s)| format!("{name} {:.0}", s / l.completed as f64 * 1e6))
                .collect();
            format!("{} client(s): {}", l.clients, cells.join(", "))
        })
        .collect();
    if !cpu.is_empty() {
        let _ = writeln!(
            r,
            "\nCPU per completed `echo` in the measured window (µs, user + system from `/proc/PID/stat`): {}.",
            cpu.join("; ")
        );
    }
    let errors: u64 = references.iter().map(|(_, l)| l.errors).sum();
    out.kv(prefix, "reference.errors", errors);
    if errors > 0 {
        log(format!(
            "ERROR: {errors} calls to the reference server failed; see the report"
        ));
    }
}

/// CPU per completed call, process by process, and the calls/s the cores allow at that cost
/// (what limits throughput once the cores are busy, whatever the latency).
fn cpu_table(r: &mut String, out: &mut Out, prefix: &str, rows: &[Level]) {
    use std::fmt::Write;
    let Some(names) = rows
        .first()
        .map(|l| l.cpu.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>())
    else {
        return;
    };
    if names.len() < 2 {
        return; // only the generator: BENCH_MCP_PIDS was not given
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let _ = writeln!(
        r,
        "\nCPU per completed call in the measured window (µs; user + system from `/proc/PID/stat`, 10 ms ticks), and the calls/s {cores} cores allow at that cost:\n"
    );
    let _ = writeln!(
        r,
        "| path | clients | connection | {} | total | calls/s the cores allow |",
        names.join(" | ")
    );
    let _ = writeln!(r, "|---|---:|---|{}---:|---:|", "---:|".repeat(names.len()));
    for l in rows.iter().filter(|l| l.completed > 0) {
        let per_call: Vec<f64> = l
            .cpu
            .iter()
            .map(|(_, s)| s / l.completed as f64 * 1e6)
            .collect();
        let total: f64 = per_call.iter().sum();
        let cells: Vec<String> = per_call.iter().map(|v| format!("{v:.0}")).collect();
        let _ = writeln!(
            r,
            "| {} | {} | {} | {} | {total:.0} | {:.0} |",
            l.what,
            l.clients,
            if l.keep_alive {
                "kept alive"
            } else {
                "fresh per call"
            },
            cells.join(" | "),
            cores * 1e6 / total,
        );
        if l.what.contains("traefik.ping") && l.keep_alive {
            let key = format!("c{}.emisar.cpu_us", l.clients);
            for ((name, _), v) in l.cpu.iter().zip(&per_call) {
                out.kv(prefix, &format!("{key}.{name}"), format!("{v:.0}"));
            }
            out.kv(prefix, &format!("{key}.total"), format!("{total:.0}"));
        }
    }
}

async fn fanout_run(out: &mut Out) {
    let settings = Arc::new(McpSettings {
        target: Target::parse(&env_str("BENCH_MCP_URL")),
        tokens: tokens_of(&env_str("BENCH_MCP_TOKEN")),
        protocol: env_or("BENCH_MCP_PROTOCOL", "2025-11-25"),
        tool: env_or("BENCH_MCP_TOOL", "traefik.ping"),
    });
    let runners: Vec<String> = env_str("BENCH_MCP_RUNNERS")
        .split(',')
        .map(str::to_owned)
        .collect();
    let calls = env_num("BENCH_MCP_FANOUT_CALLS", 50) as usize;
    let solo_calls = env_num("BENCH_MCP_FANOUT_SOLO_CALLS", 5) as usize;

    let mut client = McpClient::new(settings.clone(), true);
    if let Err(e) = client.initialize().await {
        eprintln!("[bench] ERROR: the fan-out client could not open its session: {e}");
        std::process::exit(1);
    }
    log(format!(
        "fan-out: {} runners in one call, {calls} calls after 3 warm-up",
        runners.len()
    ));
    let mut errors = 0u64;
    let mut first_errors: Vec<String> = Vec::new();
    let mut note = |e: String, errors: &mut u64| {
        *errors += 1;
        if first_errors.len() < 3 {
            first_errors.push(e);
        }
    };
    for _ in 0..3 {
        if let Err(e) = client.call(&runners).await {
            note(e, &mut errors);
        }
    }
    let (mut e2e, mut slowest, mut over) =
        (Samples::default(), Samples::default(), Samples::default());
    let started = Instant::now();
    for _ in 0..calls {
        let t0 = Instant::now();
        let r = client.call(&runners).await;
        let took = t0.elapsed().as_secs_f64() * 1e3;
        match r {
            Ok(max_ms) => {
                e2e.0.push(took);
                slowest.0.push(max_ms as f64);
                over.0.push(took - max_ms as f64);
            }
            Err(e) => note(e, &mut errors),
        }
    }
    let wall = started.elapsed();

    // Each runner alone, through the same server and session: the slowest runner's own call.
    let mut solo_medians = Vec::new();
    if solo_calls > 0 {
        log(format!(
            "fan-out: each runner alone, {solo_calls} calls after one warm-up"
        ));
        for name in &runners {
            let one = [name.clone()];
            if let Err(e) = client.call(&one).await {
                note(e, &mut errors);
            }
            let mut s = Samples::default();
            for _ in 0..solo_calls {
                let t0 = Instant::now();
                match client.call(&one).await {
                    Ok(_) => s.0.push(t0.elapsed().as_secs_f64() * 1e3),
                    Err(e) => note(e, &mut errors),
                }
            }
            let s = s.sorted();
            if !s.0.is_empty() {
                solo_medians.push((s.pct(50.0), name.clone()));
            }
        }
    }
    client.close().await;

    let (e2e, slowest, over) = (e2e.sorted(), slowest.sorted(), over.sorted());
    use std::fmt::Write;
    let r = &mut out.report;
    let _ = writeln!(r, "\n#### Fan-out to {} runners\n", runners.len());
    if errors > 0 {
        let _ = writeln!(
            r,
            "**{errors} calls failed in this run; the figures below are not a clean measurement.** First errors:\n"
        );
        for e in &first_errors {
            let _ = writeln!(r, "- `{}`", e.replace('`', "'"));
        }
        let _ = writeln!(r);
    }
    let _ = writeln!(
        r,
        "{} calls naming all {} runners, one after another on one kept-alive connection ({:.1} s), after 3 warm-up calls. \"Slowest runner\" is the largest `duration_ms` in the call's own answer (the server's time for that runner: signing, the HTTP call, the runner's work; whole milliseconds, rounded down).\n",
        e2e.0.len(),
        runners.len(),
        wall.as_secs_f64()
    );
    let _ = writeln!(r, "| per call | p50 ms | p99 ms | max ms |");
    let _ = writeln!(r, "|---|---:|---:|---:|");
    for (name, s) in [
        ("fan-out call, end to end at the client", &e2e),
        ("slowest runner in that call (`duration_ms`)", &slowest),
        ("**fan-out time − slowest runner**", &over),
    ] {
        let _ = writeln!(
            r,
            "| {name} | {} | {} | {} |",
            ms(s.pct(50.0)),
            ms(s.pct(99.0)),
            ms(s.pct(100.0))
        );
    }
    out.kv("fanout", "runners", runners.len());
    out.kv("fanout", "calls", e2e.0.len());
    out.kv("fanout", "errors", errors);
    out.kv("fanout", "e2e_p50_ms", format!("{:.3}", e2e.pct(50.0)));
    out.kv("fanout", "e2e_p99_ms", format!("{:.3}", e2e.pct(99.0)));
    out.kv(
        "fanout",
        "slowest_p50_ms",
        format!("{:.3}", slowest.pct(50.0)),
    );
    out.kv(
        "fanout",
        "over_slowest_p50_ms",
        format!("{:.3}", over.pct(50.0)),
    );
    out.kv(
        "fanout",
        "over_slowest_p99_ms",
        format!("{:.3}", over.pct(99.0)),
    );
    if let Some((worst, name)) = solo_medians
        .iter()
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .cloned()
    {
        let mut medians: Vec<f64> = solo_medians.iter().map(|m| m.0).collect();
        medians.sort_unstable_by(f64::total_cmp);
        let typical = medians[medians.len() / 2];
        let r = &mut out.report;
        let _ = writeln!(
            r,
            "\nEach runner alone ({solo_calls} calls each through the same server, end to end at the client): the median runner's p50 is {} ms, the slowest runner's (`{name}`) p50 is {} ms; the fan-out's p50 is {} ms, so fanning out costs {} ms over calling the slowest runner alone.",
            ms(typical),
            ms(worst),
            ms(e2e.pct(50.0)),
            ms(e2e.pct(50.0) - worst)
        );
        out.kv("fanout", "solo_slowest_p50_ms", format!("{worst:.3}"));
        out.kv("fanout", "solo_median_p50_ms", format!("{typical:.3}"));
    }
    if errors > 0 {
        log(format!(
            "ERROR: {errors} fan-out calls failed; see the report"
        ));
    }
}

/// What one paced client of the limit run got: served, refused (rate limited), the other
/// errors (the first few of them), and when its last answer came.
struct Paced {
    replica: usize,
    served: u64,
    refused: u64,
    errors: u64,
    first_errors: Vec<String>,
    last_answer: Instant,
}

/// `BENCH_MCP_LIMIT=1`: one agent offered `BENCH_LIMIT_OFFER_PER_S` across the replicas in
/// `BENCH_MCP_URL` (see the header).
async fn limit_run(out: &mut Out) {
    let urls: Vec<String> = env_str("BENCH_MCP_URL")
        .split(',')
        .map(str::to_owned)
        .collect();
    let tokens = tokens_of(&env_str("BENCH_MCP_TOKEN"));
    let protocol = env_or("BENCH_MCP_PROTOCOL", "2025-11-25");
    let tool = env_or("BENCH_MCP_TOOL", "emisar.runners");
    let per_url = env_num("BENCH_LIMIT_CLIENTS_PER_URL", 2) as usize;
    let offer = env_num("BENCH_LIMIT_OFFER_PER_S", 60) as f64;
    let rate = env_num("BENCH_LIMIT_RATE", 20) as f64;
    let burst = env_num("BENCH_LIMIT_BURST", 40) as f64;
    let secs = Duration::from_secs(env_num("BENCH_MCP_SECS", 10));
    let n = urls.len() * per_url;

    // Every session is open before the first call: opening one is not a tool call.
    let mut clients = Vec::new();
    for (replica, url) in urls.iter().enumerate() {
        let settings = Arc::new(McpSettings {
            target: Target::parse(url),
            tokens: tokens.clone(),
            protocol: protocol.clone(),
            tool: tool.clone(),
        });
        match open_sessions(&settings, per_url, true).await {
            Ok(opened) => clients.extend(opened.into_iter().map(|c| (replica, c))),
            Err(e) => {
                eprintln!("[bench] ERROR: a client of {url} could not open its session: {e}");
                std::process::exit(1);
            }
        }
    }
    log(format!(
        "rate limit: {offer} calls/s offered by {n} clients across {} replicas for {secs:?} (limit {rate}/s, burst {burst})",
        urls.len()
    ));

    // Client k calls every n/offer seconds, its first call k/offer seconds after the start,
    // so the calls are evenly spread in time and over the replicas. Ticks missed while an
    // answer was slow are made up at once (tokio's default): the offer stays what was set.
    let period = Duration::from_secs_f64(n as f64 / offer);
    let start = tokio::time::Instant::now() + Duration::from_millis(100);
    let until = start + secs;
    let tasks: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(k, (replica, mut client))| {
            tokio::spawn(async move {
                let first = start + Duration::from_secs_f64(k as f64 / offer);
                let mut pace = tokio::time::interval_at(first, period);
                let mut p = Paced {
                    replica,
                    served: 0,
                    refused: 0,
                    errors: 0,
                    first_errors: Vec::new(),
                    last_answer: Instant::now(),
                };
                loop {
                    if pace.tick().await >= until {
                        break;
                    }
                    let r = client.tools_call(json!({"reason": "bench"})).await;
                    p.last_answer = Instant::now();
                    match r {
                        Ok(_) => p.served += 1,
                        Err(e) if e.contains("rate limited") => p.refused += 1,
                        Err(e) => {
                            p.errors += 1;
                            if p.first_errors.len() < 3 {
                                p.first_errors.push(e);
                            }
                        }
                    }
                }
                client.close().await;
                p
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.push(t.await.expect("a client task panicked"));
    }

    let served: u64 = all.iter().map(|p| p.served).sum();
    let refused: u64 = all.iter().map(|p| p.refused).sum();
    let errors: u64 = all.iter().map(|p| p.errors).sum();
    let offered = served + refused + errors;
    let last = all.iter().map(|p| p.last_answer).max().expect("clients");
    // Every admission happened between the first call and the last answer.
    let t = last
        .saturating_duration_since(start.into_std())
        .as_secs_f64();
    let limit = burst + rate * t;
    let ratio = served as f64 / limit;
    let local_budget = (rate * 0.05).max(1.0);
    let bound = limit + urls.len() as f64 * local_budget;
    let per_replica: Vec<String> = (0..urls.len())
        .map(|i| {
            let s: u64 = all
                .iter()
                .filter(|p| p.replica == i)
                .map(|p| p.served)
                .sum();
            s.to_string()
        })
        .collect();

    use std::fmt::Write;
    let r = &mut out.report;
    if errors > 0 {
        let _ = writeln!(
            r,
            "**{errors} calls failed (neither served nor refused); the figures below are not a clean measurement.** First errors:\n"
        );
        for e in all.iter().flat_map(|p| &p.first_errors).take(3) {
            let _ = writeln!(r, "- `{}`", e.replace('`', "'"));
        }
        let _ = writeln!(r);
    }
    let _ = writeln!(
        r,
        "| replicas | offered | served (per replica) | refused | t | limit over t = {burst} + {rate} × t | **served ÷ limit** | documented bound |"
    );
    let _ = writeln!(r, "|---:|---:|---:|---:|---:|---:|---:|---:|");
    let _ = writeln!(
        r,
        "| {} | {offered} ({:.1}/s) | {served} ({}) | {refused} | {t:.2} s | {limit:.1} | **{ratio:.3}** | {bound:.1} (served ÷ bound {:.3}) |",
        urls.len(),
        offered as f64 / t,
        per_replica.join(" + "),
        served as f64 / bound
    );
    let p = "replicas";
    out.kv(p, "replicas", urls.len());
    out.kv(p, "clients", n);
    out.kv(p, "rate", rate);
    out.kv(p, "burst", burst);
    out.kv(p, "offered", offered);
    out.kv(p, "offered_per_s", format!("{:.1}", offered as f64 / t));
    out.kv(p, "served", served);
    out.kv(p, "served_per_replica", per_replica.join("+"));
    out.kv(p, "refused", refused);
    out.kv(p, "errors", errors);
    out.kv(p, "t_s", format!("{t:.2}"));
    out.kv(p, "limit", format!("{limit:.1}"));
    out.kv(p, "ratio", format!("{ratio:.3}"));
    out.kv(p, "bound", format!("{bound:.1}"));
    log(format!(
        "rate limit: {served} served, {refused} refused, {errors} errors of {offered} in {t:.2} s; limit {limit:.1}, served ÷ limit {ratio:.3}, bound {bound:.1}"
    ));
}

#[tokio::main]
async fn main() {
    let mut out = Out::default();
    if env_num("BENCH_MCP_FANOUT", 0) == 1 {
        fanout_run(&mut out).await;
    } else if env_num("BENCH_MCP_LIMIT", 0) == 1 {
        limit_run(&mut out).await;
    } else {
        let label = env_or("BENCH_MCP_LABEL", "PostgreSQL");
        let prefix = env_or("BENCH_MCP_PREFIX", "pg");
        path_run(&mut out, &prefix, &label).await;
    }
    print!("{}", out.report);
    if let Ok(path) = std::env::var("BENCH_SUMMARY") {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("open {path}: {e}"));
        f.write_all(out.summary.as_bytes())
            .unwrap_or_else(|e| panic!("write {path}: {e}"));
    }
}
