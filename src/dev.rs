//! `emisar dev`: the quickstart. One process with an embedded SQLite store, a local runner,
//! a fresh agent token and an approver who can log in to the portal; prints the URLs and
//! credentials and writes them to `dev.json` (readable by its owner only).
//!
//! `start` is the reusable part (a server on SQLite plus in-process runners from their
//! configs, the agent token and the approver); `emisar lab` starts its five runners with it.
//!
//! By default the audit log is a transparency log with a witness of its own: a log key and a
//! witness key kept in the state directory, the witness serving plain HTTP on loopback in
//! this same process, so the portal's checkpoint panel shows a cosigned checkpoint from the
//! first event on (`--no-witness` leaves the log a hash chain only). A witness in the same
//! process as the log proves nothing to an auditor; it shows how the real one works.
//!
//! The in-process runners speak plain HTTP (`insecure_http = true`), so each must listen on
//! loopback: a runner config whose `listen` is not a loopback address is refused.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::node::agent::{self, RunnerState};
use crate::node::config::RunnerConfig;
use crate::server::app::Application;
use crate::server::audit::AuditLog;
use crate::server::audit::checkpoints::{TransparencyConfig, WitnessEntry};
use crate::server::config::{RunnerEntry, ServerConfig};
use crate::witness::config::{LogConfig, WitnessConfig};
use crate::witness::serve::WitnessServer;

pub struct DevOptions {
    pub state_dir: PathBuf,
    pub listen: String,
    /// A runner.toml to use instead of the defaults (its `listen` is honoured).
    pub runner_config: Option<PathBuf>,
    pub packs_dir: Option<PathBuf>,
    /// A policy file for the server (the built-in policy when none).
    pub policy_file: Option<PathBuf>,
    /// Approvals signed by people: a generated approver SSH key, an approvers file the server
    /// and the local runner use, and the runner requiring signatures for every write.
    pub signed_approvals: bool,
    /// The transparency log and its local witness (on unless `--no-witness`).
    pub witness: bool,
}

/// What a [`Stack`] is made of, besides its state directory.
pub struct StackOptions {
    /// The server's address (`127.0.0.1:0` picks a free port).
    pub listen: String,
    pub packs_dir: Option<PathBuf>,
    /// Each runs in-process, listening on its `listen` address (loopback only).
    pub runners: Vec<RunnerConfig>,
    pub approvers_file: Option<PathBuf>,
    pub policy_file: Option<PathBuf>,
    /// Sign checkpoints of the audit log and have a local witness cosign them.
    pub witness: bool,
}

pub const DEV_RUNNER: &str = "local";
/// The one systemd unit the default dev runner may restart: the quickstart's write.
pub const DEV_UNIT: &str = "cron";
pub const DEV_AGENT: &str = "dev-agent";
pub const DEV_APPROVER: &str = "dev-approver";
/// The origin of the dev log's checkpoints (the log key's name).
pub const DEV_LOG_ORIGIN: &str = "localhost/emisar-dev";
/// The name of the dev witness's cosignatures.
pub const DEV_WITNESS: &str = "localhost/emisar-dev-witness";

/// A server, its in-process runners and witness, built and listening, not yet serving
/// requests.
pub struct Stack {
    app: Application,
    /// The runners' and the witness's.
    tasks: Vec<tokio::task::JoinHandle<std::io::Result<()>>>,
    shutdown: CancellationToken,
    pub state_dir: PathBuf,
    pub mcp_url: String,
    pub portal_url: String,
    pub agent_token: String,
    pub approver_password: String,
    pub database_url: String,
    /// Runner name → base URL.
    pub runner_urls: BTreeMap<String, String>,
    /// The local witness, when the stack has one.
    pub witness: Option<LocalWitness>,
}

/// Where the local witness listens and the keys that check what it and the log sign.
pub struct LocalWitness {
    pub url: String,
    /// The witness's cosignature verifier key.
    pub key: String,
    /// The log's verifier key: what `emisar audit verify --log-key` takes.
    pub log_key: String,
}

/// Starts a server on SQLite under `state_dir` (keys, audit key and database are created
/// once and kept) with the runners of `opts` running in-process, each listening on its
/// `listen` address and listed in the server's config with its labels (and the local witness
/// when asked); issues the agent's token and creates the approver. Cancelling `shutdown`
/// stops them all.
pub async fn start(
    state_dir: &Path,
    opts: StackOptions,
    shutdown: CancellationToken,
) -> anyhow::Result<Stack> {
    let StackOptions {
        listen,
        packs_dir,
        runners,
        approvers_file,
        policy_file,
        witness,
    } = opts;
    std::fs::create_dir_all(state_dir)
        .with_context(|| format!("failed to create {}", state_dir.display()))?;
    let state_dir = state_dir.canonicalize()?;
    let private = state_dir.join("server.key");
    let public = state_dir.join("server.pub");
    if !private.exists() {
        // A public key left without its private half (this directory is `emisar dev`'s own)
        // belongs to no key any more: keygen would refuse to write over it.
        let _ = std::fs::remove_file(&public);
        crate::protocol::signing::write_keypair(&private, &public)?;
    }
    let database_url = format!("sqlite://{}", state_dir.join("emisar.db").display());

    // Each runner's listener first (the server's config needs their URLs); their states
    // (loading and compiling the packs, the slow part) are built on the blocking pool, side
    // by side and alongside the server.
    let mut entries = Vec::new();
    let mut runner_urls = BTreeMap::new();
    let mut pending = Vec::new();
    for mut runner_config in runners {
        runner_config.server_public_key_file = Some(public.clone());
        // Each runner keeps what it executed under this state, not in the system's
        // /var/lib/emisar-runner (a runner config that names its own state_dir keeps it).
        if runner_config.state_dir == RunnerConfig::with_name("x").state_dir {
            runner_config.state_dir = state_dir.join("runners").join(&runner_config.name);
        }
        let name = runner_config.name.clone();
        let labels = runner_config.labels.clone();
        let listener = TcpListener::bind(&runner_config.listen)
            .await
            .with_context(|| format!("failed to listen on {}", runner_config.listen))?;
        let addr = listener.local_addr()?;
        if !addr.ip().is_loopback() {
            anyhow::bail!(
                "runner `{name}` speaks plain HTTP here (insecure_http), so its listen address must be loopback, not {addr}; use `emisar runner` for a runner on the network"
            );
        }
        let url = format!("http://{addr}");
        let state = tokio::task::spawn_blocking(move || RunnerState::new(runner_config));
        pending.push((listener, state));
        entries.push(RunnerEntry {
            name: name.clone(),
            url: url.clone(),
            tls_fingerprint: None,
            packs: None,
            labels,
        });
        runner_urls.insert(name, url);
    }

    let audit_key = state_dir.join("audit.key");
    if !audit_key.exists() {
        crate::server::secrets::AuditKey::generate(&audit_key)?;
    }
    let mut tasks = Vec::new();
    let (transparency, witness) = if witness {
        let (config, witness, task) = local_witness(&state_dir, shutdown.clone()).await?;
        tasks.push(task);
        (Some(config), Some(witness))
    } else {
        (None, None)
    };
    let config = ServerConfig {
        listen,
        database_url: Some(database_url.clone()),
        packs_dir,
        audit_key_file: Some(audit_key),
        runners: entries,
        // The runners are on loopback in this same process: nothing crosses a network.
        insecure_http: true,
        approvers_file,
        policy_file,
        transparency,
        ..ServerConfig::with_signing_key(private)
    };
    let app = Application::build(config, &database_url).await?;
    for (listener, state) in pending {
        let state = state.await??;
        tasks.push(tokio::spawn(agent::run(listener, state, shutdown.clone())));
    }
    let addr = app.local_addr();
    let audit = AuditLog::start(app.db().clone());
    let token = crate::server::tokens::issue(
        app.db(),
        &audit,
        DEV_AGENT,
        crate::server::principal::Role::Agent,
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
                crate::server::principal::Role::Approver,
                &password,
                "system:dev",
            )
            .await?;
            write_private(&password_file, &password)?;
            password
        }
    };
    Ok(Stack {
        app,
        tasks,
        shutdown,
        state_dir,
        mcp_url: format!("http://{addr}/mcp"),
        portal_url: format!("http://{addr}/"),
        agent_token: token.token,
        approver_password: password,
        database_url,
        runner_urls,
        witness,
    })
}

/// The dev log's key and its witness, both made once in `state_dir` and kept: the witness
/// remembers the newest checkpoint it cosigned (in `state_dir/witness/`), so a log started
/// again on the same database goes on where it was, and one whose database was deleted
/// alone is refused as a rollback, as a real witness would.
async fn local_witness(
    state_dir: &Path,
    shutdown: CancellationToken,
) -> anyhow::Result<(
    TransparencyConfig,
    LocalWitness,
    tokio::task::JoinHandle<std::io::Result<()>>,
)> {
    let log_key_file = state_dir.join("log.key");
    let log_key = if log_key_file.exists() {
        crate::server::audit::checkpoints::read_log_key(&log_key_file)?.verifier_key()
    } else {
        crate::server::audit::checkpoints::log_keygen(DEV_LOG_ORIGIN, &log_key_file)?
    };
    let key_file = state_dir.join("witness.key");
    if !key_file.exists() {
        crate::witness::serve::keygen(DEV_WITNESS, &key_file)?;
    }
    let witness_dir = state_dir.join("witness");
    crate::util::files::create_private_dir(&witness_dir)
        .with_context(|| format!("failed to create {}", witness_dir.display()))?;
    let server = WitnessServer::build(&WitnessConfig {
        listen: "127.0.0.1:0".into(),
        key_file,
        state_dir: witness_dir,
        tls_cert_file: None,
        tls_key_file: None,
        // On loopback, in this process: every request and answer is signed anyway.
        insecure_http: true,
        max_connections_per_address: 64,
        logs: vec![LogConfig {
            origin: DEV_LOG_ORIGIN.into(),
            keys: vec![log_key.clone()],
        }],
    })
    .await?;
    let witness = LocalWitness {
        url: format!("http://{}", server.local_addr()),
        key: server.verifier_key().to_owned(),
        log_key,
    };
    let config = TransparencyConfig {
        log_key_file,
        checkpoint_interval_ms: 1000,
        checkpoint_every_events: 1000,
        witnesses: vec![WitnessEntry {
            url: witness.url.clone(),
            key: witness.key.clone(),
        }],
        witness_quorum: None,
    };
    let task = tokio::spawn(server.run_until_stopped(shutdown));
    Ok((config, witness, task))
}

impl Stack {
    pub fn db(&self) -> &crate::server::db::Db {
        self.app.db()
    }

    /// What `dev.json` holds.
    pub fn info(&self) -> Value {
        json!({
            "portal_url": self.portal_url,
            "approver": DEV_APPROVER,
            "approver_password": self.approver_password,
            "mcp_url": self.mcp_url,
            "agent_token": self.agent_token,
            "agent": DEV_AGENT,
            "database_url": self.database_url,
            "runners": self.runner_urls.keys().collect::<Vec<_>>(),
            "runner_urls": self.runner_urls,
            "witness_url": self.witness.as_ref().map(|w| &w.url),
            "witness_key": self.witness.as_ref().map(|w| &w.key),
            "log_key": self.witness.as_ref().map(|w| &w.log_key),
        })
    }

    /// Writes `info` to `dev.json` in the state directory (owner-only); returns its path.
    pub fn write_info(&self, info: &Value) -> anyhow::Result<PathBuf> {
        let path = self.state_dir.join("dev.json");
        write_private(&path, &serde_json::to_string_pretty(info)?)?;
        Ok(path)
    }

    /// Serves until the shutdown token is cancelled; then waits for the runners and the
    /// witness to stop.
    pub async fn run_until_stopped(self) -> anyhow::Result<()> {
        let app_shutdown = self.app.shutdown_token();
        let stop = self.shutdown.clone();
        tokio::spawn(async move {
            stop.cancelled().await;
            app_shutdown.cancel();
        });
        self.app.run_until_stopped().await?;
        self.shutdown.cancel();
        for task in self.tasks {
            task.await??;
        }
        Ok(())
    }
}

/// The dev approver's SSH key (made once, kept in `state_dir`) and an approvers file naming
/// them: one signature for any write. Returns the file and the private key's path.
fn dev_approvers(state_dir: &Path) -> anyhow::Result<(PathBuf, PathBuf)> {
    use ssh_key::{LineEnding, PrivateKey};
    std::fs::create_dir_all(state_dir)
        .with_context(|| format!("failed to create {}", state_dir.display()))?;
    let key_path = state_dir.join("approver_ed25519");
    if !key_path.exists() {
        let mut seed = [0u8; 32];
        getrandom::fill(&mut seed).map_err(|e| anyhow::anyhow!("no randomness: {e}"))?;
        let key = PrivateKey::from(ssh_key::private::Ed25519Keypair::from_seed(&seed));
        write_private(&key_path, key.to_openssh(LineEnding::LF)?.as_str())?;
        std::fs::write(
            key_path.with_extension("pub"),
            key.public_key().to_openssh()? + "\n",
        )?;
    }
    let key = PrivateKey::read_openssh_file(&key_path)
        .with_context(|| format!("reading {}", key_path.display()))?;
    let file = state_dir.join("approvers.toml");
    std::fs::write(
        &file,
        format!(
            "# emisar dev: the dev approver's SSH key may approve any write alone, and sign a\n# grant (`emisar grants approve`) that lets the agent's writes run without a new approval.\nserial = 1\n\n[[person]]\nname = \"{DEV_APPROVER}\"\nssh = [\"{}\"]\n\n[[rule]]\ntools = \"*\"\napprovals = 1\ngrants = true\n",
            key.public_key().to_openssh()?
        ),
    )?;
    Ok((file, key_path))
}

pub async fn run(opts: DevOptions, shutdown: CancellationToken) -> anyhow::Result<()> {
    let signing = opts
        .signed_approvals
        .then(|| dev_approvers(&opts.state_dir))
        .transpose()?;
    let mut runner_config = match &opts.runner_config {
        Some(path) => RunnerConfig::load(path)?,
        None => {
            let mut c = RunnerConfig::with_name(DEV_RUNNER);
            c.listen = "127.0.0.1:0".into();
            c.packs_dir = opts.packs_dir.clone();
            // The quickstart's write (docs/getting-started.md): without one admitted unit,
            // every `linux.systemctl_restart` is refused before anyone is asked.
            c.allowlists
                .insert("systemd_units".into(), vec![DEV_UNIT.into()]);
            c
        }
    };
    if let Some((file, _)) = &signing {
        runner_config.require_signed_approvals = vec!["*".into()];
        runner_config.approvers_file = Some(file.clone());
        runner_config.state_dir = opts.state_dir.join("runner-state");
    }
    let stack = start(
        &opts.state_dir,
        StackOptions {
            listen: opts.listen.clone(),
            packs_dir: opts.packs_dir.clone(),
            runners: vec![runner_config],
            approvers_file: signing.as_ref().map(|(file, _)| file.clone()),
            policy_file: opts.policy_file.clone(),
            witness: opts.witness,
        },
        shutdown,
    )
    .await?;
    // With signed approvals, the approver's token and key sign from the terminal: printed,
    // and in dev.json for scripts.
    let mut info = stack.info();
    let signer = match &signing {
        Some((file, key)) => {
            let token = crate::server::tokens::issue(
                stack.db(),
                &AuditLog::start(stack.db().clone()),
                DEV_APPROVER,
                crate::server::principal::Role::Approver,
                std::time::Duration::from_secs(86_400),
                "system:dev",
            )
            .await?;
            info["approver_token"] = json!(token.token);
            info["approver_ssh_key"] = json!(key);
            info["approvers_file"] = json!(file);
            Some((file, key, token.token))
        }
        None => None,
    };
    let dev_json = stack.write_info(&info)?;
    println!("emisar dev is running.");
    println!("  Portal:       {}", stack.portal_url);
    println!(
        "  Approver:     {DEV_APPROVER} / {}",
        stack.approver_password
    );
    println!("  MCP URL:      {}", stack.mcp_url);
    println!("  Agent token:  {}", stack.agent_token);
    for (name, url) in &stack.runner_urls {
        println!("  Runner:       {name} at {url}");
    }
    println!("  Database:     {}", stack.database_url);
    match &stack.witness {
        Some(w) => {
            println!(
                "  Witness:      {} (cosigns every checkpoint; {DEV_WITNESS})",
                w.url
            );
            println!("  Log key:      {}", w.log_key);
        }
        None => println!("  Witness:      none (--no-witness: the log is a hash chain only)"),
    }
    if let Some((file, key, token)) = &signer {
        let server = stack.portal_url.trim_end_matches('/');
        println!(
            "  Signed approvals: on (the runner checks people's signatures; {})",
            file.display()
        );
        println!(
            "  Approve with: emisar approvals approve ID --ssh-key {} --server {server} --token {token}",
            key.display(),
        );
        println!(
            "  Grant with:   emisar grants approve ID --ssh-key {} --server {server} --token {token}",
            key.display(),
        );
    }
    println!("  Written to:   {}", dev_json.display());
    println!("Stop with Ctrl-C.");
    stack.run_until_stopped().await
}

/// dev.json holds a bearer token: readable by its owner only.
pub fn write_private(path: &std::path::Path, text: &str) -> anyhow::Result<()> {
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
