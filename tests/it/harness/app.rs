//! The server and its runners, in-process on free ports, with a fresh database and token.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use emisar::audit::{self, AuditFilter, AuditLog, Event};
use emisar::config::{RunnerConfig, RunnerEntry, ServerConfig, ServiceConfig};
use emisar::db::Db;
use emisar::runner::agent::{self, RunnerState};
use rmcp::RoleClient;
use rmcp::ServiceExt;
use rmcp::service::RunningService;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::Backend;
use super::pg::PgTestDb;

pub const TEST_AGENT: &str = "test-agent";

/// One runner to start in-process.
pub struct RunnerSpec {
    pub name: String,
    /// service name → base URL
    pub services: BTreeMap<String, String>,
}

impl RunnerSpec {
    pub fn new(name: &str) -> Self {
        RunnerSpec {
            name: name.into(),
            services: BTreeMap::new(),
        }
    }

    pub fn service(mut self, name: &str, url: &str) -> Self {
        self.services.insert(name.into(), url.into());
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
    shutdown: CancellationToken,
    /// Kept for its Drop (drops the PostgreSQL database).
    pub pg: Option<PgTestDb>,
}

#[derive(Default)]
pub struct Options {
    pub packs_dir: Option<PathBuf>,
    /// Runners listed in the server config but not started (to play a dead node).
    pub extra_runners: Vec<RunnerEntry>,
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
    let dir = tempfile::tempdir().unwrap();
    let private_key = dir.path().join("server.key");
    let public_key = dir.path().join("server.pub");
    emisar::signing::write_keypair(&private_key, &public_key).unwrap();
    let (database_url, pg) = fresh_db(backend, dir.path()).await;
    let shutdown = CancellationToken::new();

    let mut entries = Vec::new();
    let mut runner_urls = BTreeMap::new();
    for spec in runners {
        let mut config = RunnerConfig {
            name: spec.name.clone(),
            listen: "127.0.0.1:0".into(),
            server_public_key_file: public_key.clone(),
            packs_dir: options.packs_dir.clone(),
            exec_path: "/usr/bin:/bin".into(),
            max_output_bytes: 1024 * 1024,
            services: spec
                .services
                .iter()
                .map(|(k, v)| {
                    (
                        k.clone(),
                        ServiceConfig {
                            base_url: v.clone(),
                            headers: BTreeMap::new(),
                        },
                    )
                })
                .collect(),
        };
        config.fill_standard_services();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let state = RunnerState::new(config).unwrap();
        tokio::spawn(agent::run(listener, state, shutdown.clone()));
        entries.push(RunnerEntry {
            name: spec.name.clone(),
            url: url.clone(),
            packs: None,
        });
        runner_urls.insert(spec.name, url);
    }
    entries.extend(options.extra_runners);

    let config = ServerConfig {
        listen: "127.0.0.1:0".into(),
        database_url: None,
        signing_key_file: private_key.clone(),
        packs_dir: options.packs_dir.clone(),
        call_timeout_ms: 5_000,
        allowed_hosts: vec!["localhost".into(), "127.0.0.1".into()],
        runners: entries,
    };
    let app = emisar::app::Application::build(config, &database_url)
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
    tokio::spawn(app.run_until_stopped());
    let audit = AuditLog::start(db.clone());
    let token = emisar::tokens::issue(&db, &audit, TEST_AGENT, Duration::from_secs(3600), "test")
        .await
        .unwrap()
        .token;
    TestApp {
        mcp_url: format!("http://{addr}/mcp"),
        database_url,
        db,
        audit,
        token,
        runner_urls,
        dir,
        private_key,
        shutdown,
        pg,
    }
}

impl TestApp {
    /// An rmcp client over streamable HTTP with this app's agent token.
    pub async fn mcp_client(&self) -> RunningService<RoleClient, ()> {
        let config = StreamableHttpClientTransportConfig::with_uri(self.mcp_url.clone())
            .auth_header(self.token.clone());
        ().serve(StreamableHttpClientTransport::from_config(config))
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

    pub async fn events_of_call(&self, call_id: &str) -> Vec<Event> {
        self.events(AuditFilter {
            call_id: Some(call_id.into()),
            ..Default::default()
        })
        .await
    }

    pub async fn assert_chain_intact(&self) -> u64 {
        let report = audit::verify(&self.db, None).await.unwrap();
        assert_eq!(report.broken, None, "audit chain broken: {report:?}");
        report.checked
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}
