//! The server and its runners, in-process on free ports, with a fresh database and token.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use emisar::node::agent::{self, RunnerState};
use emisar::node::config::{RunnerConfig, ServiceConfig};
use emisar::server::audit::{self, AuditFilter, AuditLog, Event};
use emisar::server::config::{RunnerEntry, ServerConfig};
use emisar::server::db::Db;
use rmcp::RoleClient;
use rmcp::ServiceExt;
use rmcp::service::RunningService;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::Backend;
use super::certs::CertFiles;
use super::pg::PgTestDb;
use super::shipped::{self, Build};
use super::tools::Proc;

pub const TEST_AGENT: &str = "test-agent";

/// One runner to start in-process.
pub struct RunnerSpec {
    pub name: String,
    /// service name → (base URL, headers)
    pub services: BTreeMap<String, (String, BTreeMap<String, String>)>,
    pub exec_path: String,
    pub max_output_bytes: usize,
    pub programs: BTreeMap<String, Vec<String>>,
    pub allowlists: BTreeMap<String, Vec<String>>,
    /// The labels the server config gives this runner.
    pub labels: BTreeMap<String, String>,
    /// Serve HTTPS with this certificate; the server pins `pin` when given (else it verifies
    /// the runner against `Options::runner_ca_file`).
    pub tls: Option<(CertFiles, Option<String>)>,
    /// The URL the server config gives for this runner instead of its own (something in the
    /// path between them, such as a proxy that rewrites answers).
    pub reached_at: Option<String>,
    /// `require_signed_approvals`, `approvers_file` and `approvers_root_keys`.
    pub require_signed: Vec<String>,
    pub approvers_file: Option<PathBuf>,
    pub approvers_root_keys: Vec<String>,
    /// Where the runner keeps its state (default: a folder of the test's).
    pub state_dir: Option<PathBuf>,
    /// `require_witnessed`: the log key, the witness keys and the quorum.
    pub witnessed: Option<(String, Vec<String>, Option<usize>)>,
    /// `min_approvers_serial`.
    pub min_approvers_serial: u64,
}

impl RunnerSpec {
    pub fn new(name: &str) -> Self {
        RunnerSpec {
            name: name.into(),
            services: BTreeMap::new(),
            exec_path: "/usr/bin:/bin".into(),
            max_output_bytes: 1024 * 1024,
            programs: BTreeMap::new(),
            allowlists: BTreeMap::new(),
            labels: BTreeMap::new(),
            tls: None,
            reached_at: None,
            require_signed: Vec::new(),
            approvers_file: None,
            approvers_root_keys: Vec::new(),
            state_dir: None,
            witnessed: None,
            min_approvers_serial: 0,
        }
    }

    /// Takes no carried approvers file below `serial`.
    pub fn min_approvers_serial(mut self, serial: u64) -> Self {
        self.min_approvers_serial = serial;
        self
    }

    /// Runs risk:high writes only with a witnessed approval: a checkpoint signed by
    /// `log_key` and cosigned by `quorum` (default all) of `witness_keys`.
    pub fn require_witnessed(
        mut self,
        log_key: &str,
        witness_keys: &[String],
        quorum: Option<usize>,
    ) -> Self {
        self.witnessed = Some((log_key.to_owned(), witness_keys.to_vec(), quorum));
        self
    }

    /// Executes writes of tools matching `tools` only with people's signatures, checked
    /// against `approvers` (a file) or, without one, a carried file signed by `root_keys`.
    pub fn signed_approvals(
        mut self,
        tools: &[&str],
        approvers: Option<PathBuf>,
        root_keys: &[String],
    ) -> Self {
        self.require_signed = tools.iter().map(|t| (*t).to_owned()).collect();
        self.approvers_file = approvers;
        self.approvers_root_keys = root_keys.to_vec();
        self
    }

    /// Runs `tools` only with people's signatures from `approvers_file`, keeping what it
    /// executed in `state_dir`.
    pub fn require_signed(
        mut self,
        tools: &[&str],
        approvers_file: PathBuf,
        state_dir: PathBuf,
    ) -> Self {
        self = self.signed_approvals(tools, Some(approvers_file), &[]);
        self.state_dir = Some(state_dir);
        self
    }

    /// Serves HTTPS with `cert`; the server pins `pin` (a fingerprint) when given.
    pub fn https(mut self, cert: CertFiles, pin: Option<String>) -> Self {
        self.tls = Some((cert, pin));
        self
    }

    /// The server reaches this runner at `url` (which forwards to the runner's own URL).
    pub fn reached_at(mut self, url: &str) -> Self {
        self.reached_at = Some(url.into());
        self
    }

    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    pub fn program(mut self, name: &str, argv: &[&str]) -> Self {
        self.programs
            .insert(name.into(), argv.iter().map(|s| s.to_string()).collect());
        self
    }

    pub fn allow(mut self, list: &str, values: &[&str]) -> Self {
        self.allowlists
            .insert(list.into(), values.iter().map(|s| s.to_string()).collect());
        self
    }

    pub fn service(mut self, name: &str, url: &str) -> Self {
        self.services
            .insert(name.into(), (url.into(), BTreeMap::new()));
        self
    }

    /// A service whose requests carry `header: value` (a credential that stays on the runner).
    pub fn service_with_header(mut self, name: &str, url: &str, header: &str, value: &str) -> Self {
        self.services.insert(
            name.into(),
            (
                url.into(),
                BTreeMap::from([(header.to_owned(), value.to_owned())]),
            ),
        );
        self
    }

    pub fn max_output(mut self, bytes: usize) -> Self {
        self.max_output_bytes = bytes;
        self
    }

    /// Puts `dir` first on the PATH of exec actions (for recording stand-ins).
    pub fn path_first(mut self, dir: &std::path::Path) -> Self {
        self.exec_path = format!("{}:{}", dir.display(), self.exec_path);
        self
    }
}

pub struct TestApp {
    pub mcp_url: String,
    pub database_url: String,
    pub db: Db,
    pub audit: AuditLog,
    pub token: String,
    /// Runner name → base URL.
    pub runner_urls: BTreeMap<String, String>,
    pub dir: tempfile::TempDir,
    pub private_key: PathBuf,
    pub public_key: PathBuf,
    pub packs_dir: Option<PathBuf>,
    /// The CA clients must trust to reach this server (when it serves HTTPS).
    pub ca_file: Option<PathBuf>,
    shutdown: CancellationToken,
    /// The server, until [`TestApp::stop`] waits for it.
    server: Option<Server>,
    /// The runners' processes under [`Build::Shipped`] (killed when dropped).
    runner_processes: Vec<Proc>,
    /// Which build serves: the CLI a test runs is the same build.
    build: Build,
    /// Kept for its Drop (drops the PostgreSQL database).
    pub pg: Option<PgTestDb>,
    /// Each runner started: its config, certificate and stop token (for a restart).
    started: BTreeMap<String, (RunnerConfig, Option<CertFiles>, CancellationToken)>,
}

#[derive(Default)]
pub struct Options {
    /// The build of the server and runners: in this process (default), or the shipped
    /// binaries as processes ([`shipped`]).
    pub build: Build,
    pub packs_dir: Option<PathBuf>,
    /// Runners listed in the server config but not started (to play a dead node).
    pub extra_runners: Vec<RunnerEntry>,
    pub call_timeout_ms: Option<u64>,
    /// (per second, burst); tests default to a limit they never reach.
    pub rate_limit: Option<(u32, u32)>,
    pub probe_interval_ms: Option<u64>,
    /// Use this database instead of a fresh one.
    pub database_url: Option<String>,
    /// How long an MCP call waits for approval (default 30 s).
    pub approval_wait_secs: Option<u64>,
    /// How long a request lives (default 15 minutes).
    pub approval_ttl_secs: Option<u64>,
    /// The most requests one agent may have pending (default 20).
    pub max_pending_per_agent: Option<u32>,
    /// Use this key pair instead of a fresh one (a second replica of the same server).
    pub keys: Option<(PathBuf, PathBuf)>,
    /// A policy file to load at start (the built-in policy when none).
    pub policy_file: Option<PathBuf>,
    /// Hooks told about new approval requests.
    pub webhooks: Vec<emisar::server::notices::webhook::WebhookConfig>,
    /// `[notices]`: email targets, escalation, reminders (the server's defaults when none).
    pub notices: Option<emisar::server::notices::config::NoticesConfig>,
    /// The portal's address, for links in notices (and the OpenID redirect URL).
    pub public_url: Option<String>,
    /// Browser origins besides the server's own that may call `/mcp`.
    pub allowed_origins: Vec<String>,
    /// Login limits (the server's defaults when none).
    pub login: Option<emisar::server::login_limits::LoginLimitsConfig>,
    /// The address to listen on (default `127.0.0.1:0`): a test that registers emisar's URLs
    /// at an OpenID provider before the server starts picks the port.
    pub listen: Option<String>,
    /// `[oidc]`: people sign in through a provider.
    pub oidc: Option<emisar::server::oidc::config::OidcConfig>,
    /// `[oauth]`: `/mcp` takes the authorization server's access tokens.
    pub oauth: Option<emisar::server::oidc::config::OAuthConfig>,
    /// Serve HTTPS with this certificate (clients then trust `client_ca_file`).
    pub server_tls: Option<CertFiles>,
    /// The CA that signed `server_tls`, which the test's clients trust.
    pub client_ca_file: Option<PathBuf>,
    /// The server's `runner_ca_file`.
    pub runner_ca_file: Option<PathBuf>,
    /// The server's `insecure_http`; the harness sets it (its runners listen on loopback and
    /// speak plain HTTP unless given a certificate) unless a test says otherwise.
    pub insecure_http: Option<bool>,
    /// The server's `[join]`; when not given, the harness admits loopback (its runners
    /// listen there), which the server's default refuses.
    pub join: Option<emisar::server::config::JoinConfig>,
    /// The server's `max_connections_per_address` (its default when none).
    pub max_connections_per_address: Option<usize>,
    /// The server's `approvers_file` and `approvers_signature_file`.
    pub approvers_file: Option<PathBuf>,
    pub approvers_signature_file: Option<PathBuf>,
    /// The server's `[webauthn]` (passkeys; derived from `public_url` when none).
    pub webauthn: Option<emisar::server::config::WebauthnConfig>,
    /// The server's `[transparency]` (signed checkpoints and witnesses).
    pub transparency: Option<emisar::server::audit::checkpoints::TransparencyConfig>,
}

pub async fn fresh_db(backend: Backend, dir: &std::path::Path) -> (String, Option<PgTestDb>) {
    match backend {
        Backend::Postgres => {
            let pg = tokio::task::spawn_blocking(PgTestDb::create).await.unwrap();
            (pg.url.clone(), Some(pg))
        }
        Backend::Sqlite => (
            format!("sqlite://{}", dir.join("emisar.db").display()),
            None,
        ),
    }
}

pub async fn spawn_app(backend: Backend, runners: Vec<RunnerSpec>, options: Options) -> TestApp {
    if options.build == Build::Shipped {
        shipped::refuse_unsupported(&options);
    }
    let dir = tempfile::tempdir().unwrap();
    let (private_key, public_key) = match &options.keys {
        Some(keys) => keys.clone(),
        None => {
            let private_key = dir.path().join("server.key");
            let public_key = dir.path().join("server.pub");
            emisar::protocol::signing::write_keypair(&private_key, &public_key).unwrap();
            (private_key, public_key)
        }
    };
    let (database_url, pg) = match &options.database_url {
        Some(url) => (url.clone(), None),
        None => fresh_db(backend, dir.path()).await,
    };
    let shutdown = CancellationToken::new();

    let mut entries = Vec::new();
    let mut runner_urls = BTreeMap::new();
    let mut started = BTreeMap::new();
    let mut runner_processes = Vec::new();
    for spec in runners {
        let config = runner_config(&spec, &public_key, &options, dir.path());
        let tls = spec.tls.as_ref().map(|(c, _)| c);
        let url = match options.build {
            Build::InProcess => {
                let stop = shutdown.child_token();
                let url = serve_runner(&config, tls, &stop).await;
                started.insert(spec.name.clone(), (config, tls.cloned(), stop));
                url
            }
            Build::Shipped => {
                let (url, process) =
                    shipped::start_runner(&with_tls(config, tls), dir.path()).await;
                runner_processes.push(process);
                url
            }
        };
        entries.push(RunnerEntry {
            name: spec.name.clone(),
            url: spec.reached_at.clone().unwrap_or_else(|| url.clone()),
            tls_fingerprint: spec.tls.as_ref().and_then(|(_, pin)| pin.clone()),
            packs: None,
            labels: spec.labels.clone(),
        });
        runner_urls.insert(spec.name, url);
    }
    entries.extend(options.extra_runners.clone());

    let config = server_config(&options, entries, &private_key, dir.path());
    let scheme = if config.serves_tls() { "https" } else { "http" };
    let (server, db, addr) = match options.build {
        Build::InProcess => serve_in_process(config, &database_url, &shutdown).await,
        Build::Shipped => {
            let (addr, process) = shipped::start_server(&config, &database_url, dir.path()).await;
            let db = Db::connect(&database_url).await.expect("the store opens");
            (Server::Process(process), db, addr)
        }
    };
    let audit = AuditLog::start(db.clone());
    let token = emisar::server::tokens::issue(
        &db,
        &audit,
        TEST_AGENT,
        emisar::server::principal::Role::Agent,
        Duration::from_secs(3600),
        "test",
    )
    .await
    .unwrap()
    .token;
    TestApp {
        mcp_url: format!("{scheme}://{addr}/mcp"),
        database_url,
        db,
        audit,
        token,
        runner_urls,
        dir,
        private_key,
        public_key: public_key.clone(),
        packs_dir: options.packs_dir.clone(),
        ca_file: options.client_ca_file.clone(),
        shutdown,
        server: Some(server),
        runner_processes,
        build: options.build,
        pg,
        started,
    }
}

/// The server of a [`TestApp`]: a task of this process, or the shipped binary's process.
enum Server {
    Task(tokio::task::JoinHandle<std::io::Result<()>>),
    Process(Proc),
}

/// The config of the runner `spec` describes, trusting `public_key`, keeping its state in
/// `dir` unless the spec says where.
fn runner_config(
    spec: &RunnerSpec,
    public_key: &std::path::Path,
    options: &Options,
    dir: &std::path::Path,
) -> RunnerConfig {
    let mut config = RunnerConfig::with_name(&spec.name);
    config.listen = "127.0.0.1:0".into();
    config.server_public_key_file = Some(public_key.to_owned());
    config.packs_dir = options.packs_dir.clone();
    config.exec_path = spec.exec_path.clone();
    config.max_output_bytes = spec.max_output_bytes;
    config.services = spec
        .services
        .iter()
        .map(|(k, (url, headers))| {
            (
                k.clone(),
                ServiceConfig {
                    base_url: url.clone(),
                    headers: headers.clone(),
                },
            )
        })
        .collect();
    config.programs = spec.programs.clone();
    config.allowlists = spec.allowlists.clone();
    // Its own labels are the server's for it, as runner.toml and the server's list agree in
    // a deployment: a grant's selector is matched against the runner's own.
    config.labels = spec.labels.clone();
    config.require_signed_approvals = spec.require_signed.clone();
    config.approvers_file = spec.approvers_file.clone();
    config.approvers_root_keys = spec.approvers_root_keys.clone();
    config.min_approvers_serial = spec.min_approvers_serial;
    if let Some((log_key, witness_keys, quorum)) = &spec.witnessed {
        config.require_witnessed = true;
        config.log_key = Some(log_key.clone());
        config.witness_keys = witness_keys.clone();
        config.witness_quorum = *quorum;
    }
    // Each runner keeps its state (executed signed approvals) in the test's folder.
    config.state_dir = spec
        .state_dir
        .clone()
        .unwrap_or_else(|| dir.join(format!("state-{}", spec.name)));
    config.fill_standard_services();
    config
}

/// `config` serving HTTPS with `tls` when given (a runner process reads its certificate from
/// runner.toml; an in-process one is handed it).
fn with_tls(mut config: RunnerConfig, tls: Option<&CertFiles>) -> RunnerConfig {
    if let Some(cert) = tls {
        config.tls_cert_file = Some(cert.cert.clone());
        config.tls_key_file = Some(cert.key.clone());
    }
    config
}

/// The server's config: `options` over the harness's defaults, listing `runners`.
fn server_config(
    options: &Options,
    runners: Vec<RunnerEntry>,
    private_key: &std::path::Path,
    dir: &std::path::Path,
) -> ServerConfig {
    let audit_key = dir.join("audit.key");
    emisar::server::secrets::AuditKey::generate(&audit_key).unwrap();
    let config = ServerConfig {
        listen: options
            .listen
            .clone()
            .unwrap_or_else(|| "127.0.0.1:0".into()),
        oidc: options.oidc.clone(),
        oauth: options.oauth.clone(),
        packs_dir: options.packs_dir.clone(),
        call_timeout_ms: options.call_timeout_ms.unwrap_or(5_000),
        allowed_hosts: vec!["localhost".into(), "127.0.0.1".into()],
        runners,
        audit_key_file: Some(audit_key),
        rate_limit_per_second: options.rate_limit.map_or(1000, |r| r.0),
        rate_limit_burst: options.rate_limit.map_or(1000, |r| r.1),
        health_probe_interval_ms: options.probe_interval_ms.unwrap_or(10_000),
        approval_wait_secs: options.approval_wait_secs.unwrap_or(30),
        approval_ttl_secs: options.approval_ttl_secs.unwrap_or(15 * 60),
        max_pending_per_agent: options.max_pending_per_agent.unwrap_or(20),
        approval_progress_ms: 500,
        policy_file: options.policy_file.clone(),
        webhooks: options.webhooks.clone(),
        notices: options.notices.clone().unwrap_or_default(),
        public_url: options.public_url.clone(),
        allowed_origins: options.allowed_origins.clone(),
        login: options.login.clone().unwrap_or_default(),
        tls_cert_file: options.server_tls.as_ref().map(|c| c.cert.clone()),
        tls_key_file: options.server_tls.as_ref().map(|c| c.key.clone()),
        runner_ca_file: options.runner_ca_file.clone(),
        // Every listener here is on loopback.
        insecure_http: options.insecure_http.unwrap_or(true),
        join: options
            .join
            .clone()
            .unwrap_or_else(|| emisar::server::config::JoinConfig {
                allowed_networks: Some(vec!["127.0.0.0/8".into(), "::1".into()]),
                ..Default::default()
            }),
        webauthn: options.webauthn.clone().unwrap_or_default(),
        approvers_file: options.approvers_file.clone(),
        approvers_signature_file: options.approvers_signature_file.clone(),
        transparency: options.transparency.clone(),
        ..ServerConfig::with_signing_key(private_key.to_owned())
    };
    match options.max_connections_per_address {
        Some(cap) => ServerConfig {
            max_connections_per_address: cap,
            ..config
        },
        None => config,
    }
}

/// Builds the server of `config` in this process and runs it until `shutdown`.
async fn serve_in_process(
    config: ServerConfig,
    database_url: &str,
    shutdown: &CancellationToken,
) -> (Server, Db, std::net::SocketAddr) {
    let app = emisar::server::app::Application::build(config, database_url)
        .await
        .expect("server builds");
    let addr = app.local_addr();
    let db = app.db().clone();
    let stop = app.shutdown_token();
    let outer = shutdown.clone();
    tokio::spawn(async move {
        outer.cancelled().await;
        stop.cancel();
    });
    (
        Server::Task(tokio::spawn(app.run_until_stopped())),
        db,
        addr,
    )
}

/// Serves a runner of `config` (HTTPS with `tls`) on a free loopback port until `stop`;
/// returns its URL.
async fn serve_runner(
    config: &RunnerConfig,
    tls: Option<&CertFiles>,
    stop: &CancellationToken,
) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let state = RunnerState::new(config.clone()).unwrap();
    match tls {
        None => {
            tokio::spawn(agent::run(listener, state, stop.clone()));
            format!("http://{addr}")
        }
        Some(cert) => {
            let (tls, _) =
                emisar::util::tls::server_config_from_files(&cert.cert, &cert.key).unwrap();
            tokio::spawn(agent::run_https(listener, state, tls, stop.clone()));
            format!("https://{addr}")
        }
    }
}

impl TestApp {
    /// Stops runner `name` and starts it again from its config and `state_dir` (what a
    /// restart of its process keeps), on a new port: `runner_urls` and [`TestApp::signed_request`]
    /// reach the new one; the server still dials the old address, so only direct calls (a
    /// server holding server.key) reach it. With `lose_state`, its `state_dir` is deleted first.
    pub async fn restart_runner(&mut self, name: &str, lose_state: bool) {
        let (config, tls, stop) = self
            .started
            .remove(name)
            .expect("a runner of the harness, in this process (Build::InProcess)");
        stop.cancel();
        if lose_state {
            std::fs::remove_dir_all(&config.state_dir).unwrap();
        }
        let stop = self.shutdown.child_token();
        let url = serve_runner(&config, tls.as_ref(), &stop).await;
        self.runner_urls.insert(name.to_owned(), url);
        self.started.insert(name.to_owned(), (config, tls, stop));
    }

    /// Starts a runner named `name` on `listener` (a runner the server lists as an extra
    /// runner); cancelling the returned token kills it.
    pub async fn start_runner(&self, name: &str, listener: TcpListener) -> CancellationToken {
        let mut config = RunnerConfig::with_name(name);
        config.server_public_key_file = Some(self.public_key.clone());
        // In the test's folder: the default, /var/lib/emisar-runner, is the system's.
        config.state_dir = self.dir.path().join(format!("state-{name}"));
        config.packs_dir = self.packs_dir.clone();
        config.exec_path = "/usr/bin:/bin".into();
        config.fill_standard_services();
        let stop = CancellationToken::new();
        tokio::spawn(agent::run(
            listener,
            RunnerState::new(config).unwrap(),
            stop.clone(),
        ));
        stop
    }

    /// Issues another token (an auditor's, say).
    pub async fn issue_token(&self, name: &str, role: emisar::server::principal::Role) -> String {
        emisar::server::tokens::issue(
            &self.db,
            &self.audit,
            name,
            role,
            Duration::from_secs(3600),
            "test",
        )
        .await
        .unwrap()
        .token
    }

    pub fn base_url(&self) -> String {
        self.mcp_url.trim_end_matches("/mcp").to_owned()
    }

    /// An HTTP client for this server: it trusts the test CA when the server serves HTTPS.
    /// This server's `/metrics` text, scraped with `token` (an auditor's or an admin's).
    pub async fn metrics(&self, token: &str) -> String {
        self.http()
            .get(format!("{}/metrics", self.base_url()))
            .bearer_auth(token)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    pub fn http(&self) -> reqwest::Client {
        let mut builder = reqwest::Client::builder();
        if let Some(ca) = &self.ca_file {
            let pem = std::fs::read(ca).unwrap();
            builder = builder.tls_certs_only(reqwest::Certificate::from_pem_bundle(&pem).unwrap());
        }
        builder.build().unwrap()
    }

    /// An rmcp client over streamable HTTP with this app's agent token.
    pub async fn mcp_client(&self) -> RunningService<RoleClient, ()> {
        let config = StreamableHttpClientTransportConfig::with_uri(self.mcp_url.clone())
            .auth_header(self.token.clone());
        ().serve(StreamableHttpClientTransport::with_client(
            self.http(),
            config,
        ))
        .await
        .expect("MCP client connects")
    }

    pub async fn events(&self, filter: AuditFilter) -> Vec<Event> {
        audit::query(
            &self.db,
            &AuditFilter {
                limit: 1000,
                ..filter
            },
        )
        .await
        .unwrap()
    }

    /// Every event of the log, in order, read a thousand at a time.
    pub async fn all_events(&self) -> Vec<Event> {
        let mut all: Vec<Event> = Vec::new();
        loop {
            let page = self
                .events(AuditFilter {
                    after_seq: all.last().map(|e| e.seq),
                    ..Default::default()
                })
                .await;
            if page.is_empty() {
                return all;
            }
            all.extend(page);
        }
    }

    pub async fn events_of_call(&self, call_id: &str) -> Vec<Event> {
        self.events(AuditFilter {
            call_id: Some(call_id.into()),
            ..Default::default()
        })
        .await
    }

    /// `GET /api/runners` with the agent's token.
    pub async fn runners_api(&self) -> serde_json::Value {
        self.http()
            .get(format!("{}/api/runners", self.base_url()))
            .bearer_auth(&self.token)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// `emisar audit verify`, the command an auditor runs, passes on this app's database.
    /// The `emisar` binary of this app's build.
    pub fn emisar_binary(&self) -> PathBuf {
        match self.build {
            Build::InProcess => PathBuf::from(env!("CARGO_BIN_EXE_emisar")),
            Build::Shipped => shipped::binary("emisar"),
        }
    }

    pub fn verify_with_cli(&self) {
        let out = std::process::Command::new(self.emisar_binary())
            .args(["audit", "verify", "--database", &self.database_url])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.starts_with("ok: "),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Stops the server (and its runners) gracefully and waits until it has stopped: every
    /// request finished and what it counted written to the audit log. The store stays
    /// readable through `db`.
    pub async fn stop(&mut self) {
        self.shutdown.cancel();
        match self.server.take() {
            Some(Server::Task(server)) => Self::wait_for(server).await,
            Some(Server::Process(server)) => shipped::stop(server).await,
            None => {}
        }
        self.runner_processes.clear();
    }

    async fn wait_for(server: tokio::task::JoinHandle<std::io::Result<()>>) {
        tokio::time::timeout(Duration::from_secs(30), server)
            .await
            .expect("the server stops within 30 s")
            .expect("the server task did not panic")
            .expect("the server stopped cleanly");
    }

    /// How many events the audit log holds.
    pub async fn audit_rows(&self) -> i64 {
        emisar::with_pool!(&self.db, pool => sqlx::query_scalar::<_, i64>("SELECT count(*) FROM audit_events").fetch_one(pool).await).unwrap()
    }

    pub async fn assert_chain_intact(&self) -> u64 {
        let report = audit::verify(&self.db, None).await.unwrap();
        assert!(report.is_intact(), "audit chain broken: {report:?}");
        report.checked
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// What a direct, signed call to a runner returned: the HTTP status and the JSON body.
pub struct DirectAnswer {
    pub status: u16,
    pub body: serde_json::Value,
}

impl TestApp {
    /// Calls a runner directly with a call token signed by this server's key, standing in
    /// for the server (an approval id included). An execution hands back `preview`'s values
    /// and seal, as the server does with a stored preview.
    pub async fn signed_call(
        &self,
        runner: &str,
        tool: &str,
        args: serde_json::Value,
        mode: emisar::protocol::Mode,
        preview: Option<&DirectAnswer>,
    ) -> DirectAnswer {
        let request = emisar::protocol::CallRequest {
            tool: tool.into(),
            args: args.as_object().unwrap().clone(),
            mode,
            preview: preview.map(|p| p.body["vars"].as_object().unwrap().clone()),
            preview_seal: preview.map(|p| p.body["seal"].as_str().unwrap().to_owned()),
            raw: false,
            approval: None,
            witnessed: None,
            secret_salt: None,
            wave: None,
            decision: None,
            grant: None,
        };
        let signed = Signed {
            call_id: "direct-test-call".into(),
            approval_id: Some(uuid::Uuid::new_v4().to_string()),
            lowered_by_policy: None,
        };
        self.signed_request(runner, &request, &signed).await
    }

    /// Sends `request` to `runner` under a call token signed by this server's key, with the
    /// claims `signed` gives.
    pub async fn signed_request(
        &self,
        runner: &str,
        request: &emisar::protocol::CallRequest,
        signed: &Signed,
    ) -> DirectAnswer {
        use emisar::protocol::signing::{CallClaims, CallSigner, ISSUER, Purpose, now};
        let packs = emisar::pack::PackSet::load(self.packs_dir.as_deref()).unwrap();
        let pack = request.tool.split('.').next().unwrap();
        let t = now();
        let claims = CallClaims {
            iss: ISSUER.into(),
            aud: runner.into(),
            iat: t,
            exp: t + 30,
            purpose: Purpose::Call,
            jti: uuid::Uuid::new_v4().to_string(),
            call_id: signed.call_id.clone(),
            tool: request.tool.clone(),
            request_sha256: request.digest(),
            pack_sha256: packs.pack(pack).unwrap().digest.clone(),
            approval_id: signed.approval_id.clone(),
            lowered_by_policy: signed.lowered_by_policy.clone(),
        };
        let token = CallSigner::from_file(&self.private_key)
            .unwrap()
            .sign(&claims)
            .unwrap();
        // Whoever holds server.key reaches a runner over TLS without knowing its certificate:
        // the runner authenticates the call, not the client.
        let res = reqwest::Client::builder()
            .danger_accept_invalid_certs(true)
            .build()
            .unwrap()
            .post(format!("{}/v1/call", self.runner_urls[runner]))
            .bearer_auth(token)
            .json(request)
            .send()
            .await
            .unwrap();
        DirectAnswer {
            status: res.status().as_u16(),
            body: res.json().await.unwrap(),
        }
    }
}

/// The claims of a hand-made signed call, besides what the request itself determines.
pub struct Signed {
    pub call_id: String,
    pub approval_id: Option<String>,
    pub lowered_by_policy: Option<String>,
}
