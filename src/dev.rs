//! `emisar dev`: the quickstart. One process with an embedded SQLite store, a local runner,
//! a fresh agent token and an approver who can log in to the portal; prints the URLs and
//! credentials and writes them to `dev.json` (readable by its owner only).
//!
//! The local runner speaks plain HTTP (`insecure_http = true`), so it must listen on
//! loopback: a `runner_config` whose `listen` is not a loopback address is refused.

use std::path::PathBuf;

use anyhow::Context;
use serde_json::json;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::node::agent::{self, RunnerState};
use crate::node::config::RunnerConfig;
use crate::server::app::Application;
use crate::server::audit::AuditLog;
use crate::server::config::{RunnerEntry, ServerConfig};

pub struct DevOptions {
    pub state_dir: PathBuf,
    pub listen: String,
    /// A runner.toml to use instead of the defaults (its `listen` is honoured).
    pub runner_config: Option<PathBuf>,
    pub packs_dir: Option<PathBuf>,
}

pub const DEV_RUNNER: &str = "local";
pub const DEV_AGENT: &str = "dev-agent";
pub const DEV_APPROVER: &str = "dev-approver";

pub async fn run(opts: DevOptions, shutdown: CancellationToken) -> anyhow::Result<()> {
    std::fs::create_dir_all(&opts.state_dir)
        .with_context(|| format!("failed to create {}", opts.state_dir.display()))?;
    let state_dir = opts.state_dir.canonicalize()?;
    let private = state_dir.join("server.key");
    let public = state_dir.join("server.pub");
    if !private.exists() {
        crate::protocol::signing::write_keypair(&private, &public)?;
    }
    let database_url = format!("sqlite://{}", state_dir.join("emisar.db").display());

    let mut runner_config = match &opts.runner_config {
        Some(path) => RunnerConfig::load(path)?,
        None => {
            let mut c = RunnerConfig::with_name(DEV_RUNNER);
            c.listen = "127.0.0.1:0".into();
            c.packs_dir = opts.packs_dir.clone();
            c
        }
    };
    runner_config.server_public_key_file = Some(public.clone());
    let runner_name = runner_config.name.clone();
    let runner_listener = TcpListener::bind(&runner_config.listen)
        .await
        .with_context(|| format!("failed to listen on {}", runner_config.listen))?;
    let runner_addr = runner_listener.local_addr()?;
    if !runner_addr.ip().is_loopback() {
        anyhow::bail!(
            "the dev runner speaks plain HTTP (insecure_http), so its listen address must be loopback, not {runner_addr}; use `emisar runner` for a runner on the network"
        );
    }
    let runner_url = format!("http://{runner_addr}");
    let runner_state = RunnerState::new(runner_config)?;
    let runner_task = tokio::spawn(agent::run(runner_listener, runner_state, shutdown.clone()));

    let audit_key = state_dir.join("audit.key");
    if !audit_key.exists() {
        crate::server::secrets::AuditKey::generate(&audit_key)?;
    }
    let config = ServerConfig {
        listen: opts.listen.clone(),
        database_url: Some(database_url.clone()),
        packs_dir: opts.packs_dir.clone(),
        audit_key_file: Some(audit_key),
        runners: vec![RunnerEntry {
            name: runner_name.clone(),
            url: runner_url.clone(),
            tls_fingerprint: None,
            packs: None,
            labels: Default::default(),
        }],
        // The local runner is on loopback in this same process: nothing crosses a network.
        insecure_http: true,
        ..ServerConfig::with_signing_key(private)
    };
    let app = Application::build(config, &database_url).await?;
    let addr = app.local_addr();
    let mcp_url = format!("http://{addr}/mcp");
    let audit = AuditLog::start(app.db().clone());
    let token = crate::server::tokens::issue(
        app.db(),
        &audit,
        DEV_AGENT,
        crate::server::tokens::Role::Agent,
        std::time::Duration::from_secs(30 * 86_400),
        "system:dev",
    )
    .await?;
    // The approver is created once per state dir; its password is kept next to the database
    // (dev only: `emisar user add` never stores a password in clear).
    let password_file = state_dir.join("approver.password");
    let password = match crate::server::users::role_of(app.db(), DEV_APPROVER).await? {
        Some(_) => std::fs::read_to_string(&password_file)
            .with_context(|| format!("failed to read {}", password_file.display()))?,
        None => {
            let password = crate::server::users::random_token()?;
            crate::server::users::add(
                app.db(),
                &audit,
                DEV_APPROVER,
                crate::server::tokens::Role::Approver,
                &password,
                "system:dev",
            )
            .await?;
            write_private(&password_file, &password)?;
            password
        }
    };
    let portal_url = format!("http://{addr}/");
    let info = json!({
        "portal_url": portal_url,
        "approver": DEV_APPROVER,
        "approver_password": password,
        "mcp_url": mcp_url,
        "agent_token": token.token,
        "agent": DEV_AGENT,
        "database_url": database_url,
        "runners": [runner_name],
        "runner_urls": {runner_name.clone(): runner_url},
    });
    let dev_json = state_dir.join("dev.json");
    write_private(&dev_json, &serde_json::to_string_pretty(&info)?)?;
    println!("emisar dev is running.");
    println!("  Portal:       {portal_url}");
    println!("  Approver:     {DEV_APPROVER} / {password}");
    println!("  MCP URL:      {mcp_url}");
    println!("  Agent token:  {}", token.token);
    println!("  Runner:       {runner_name} at {runner_url}");
    println!("  Database:     {database_url}");
    println!("  Written to:   {}", dev_json.display());
    println!("Stop with Ctrl-C.");

    let app_shutdown = app.shutdown_token();
    let stop = shutdown.clone();
    tokio::spawn(async move {
        stop.cancelled().await;
        app_shutdown.cancel();
    });
    app.run_until_stopped().await?;
    shutdown.cancel();
    runner_task.await??;
    Ok(())
}

/// dev.json holds a bearer token: readable by its owner only.
fn write_private(path: &std::path::Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("failed to write {}", path.display()))?;
    f.write_all(text.as_bytes())?;
    Ok(())
}
