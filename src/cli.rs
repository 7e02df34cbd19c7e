//! The `emisar` command line: one binary, one subcommand per job.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};

use crate::node::config::RunnerConfig;
use crate::pack::{Action, PackSet};
use crate::server::audit::{self, AuditFilter, AuditLog};
use crate::server::config::ServerConfig;
use crate::server::db::Db;
use crate::util::process::stop_on_signal;

#[derive(Parser)]
#[command(
    name = "emisar",
    version,
    about = "A governed operations server for AI agents"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Serve MCP at /mcp, dispatching calls to runners (emisar.toml).
    Serve {
        #[arg(long)]
        config: PathBuf,
        #[command(flatten)]
        db: DbArg,
    },
    /// Run a node's runner: execute signed calls against local services (runner.toml).
    Runner {
        #[arg(long)]
        config: PathBuf,
        /// Join this server (its base URL) instead of being listed in its config.
        #[arg(long, requires = "join_token")]
        server: Option<String>,
        /// A join token from `emisar join-token issue` (or EMISAR_JOIN_TOKEN).
        #[arg(long, env = "EMISAR_JOIN_TOKEN", hide_env_values = true)]
        join_token: Option<String>,
    },
    /// Quickstart: server + local runner + SQLite in one process; prints URL and token.
    Dev {
        #[arg(long, default_value = ".emisar-dev")]
        state_dir: PathBuf,
        #[arg(long, default_value = "127.0.0.1:7700")]
        listen: String,
        /// A runner.toml for the local runner (services, listen address, packs).
        #[arg(long)]
        runner_config: Option<PathBuf>,
        #[arg(long)]
        packs_dir: Option<PathBuf>,
    },
    /// Inspect and check tool packs.
    Packs {
        #[command(subcommand)]
        command: PacksCommand,
    },
    /// Read and verify the audit log.
    Audit {
        #[command(subcommand)]
        command: AuditCommand,
    },
    /// Agent bearer tokens.
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
    /// People: local users who log in to the portal, and their API tokens.
    User {
        #[command(subcommand)]
        command: UserCommand,
    },
    /// Check a policy file against the packs (what a SIGHUP reload would load).
    Policy {
        #[command(subcommand)]
        command: PolicyCommand,
    },
    /// Approval requests, for approvers who live in a terminal (talks to a running server).
    Approvals {
        #[command(flatten)]
        server: ServerArg,
        #[command(subcommand)]
        command: ApprovalsCommand,
    },
    /// Join tokens, with which runners register themselves.
    JoinToken {
        #[command(subcommand)]
        command: JoinTokenCommand,
    },
    /// Generate the server's Ed25519 signing key pair (and, optionally, the audit HMAC key).
    Keygen {
        #[arg(long)]
        private: PathBuf,
        #[arg(long)]
        public: PathBuf,
        /// Also write a fresh key for sealing secret params in the audit log.
        #[arg(long)]
        audit_key: Option<PathBuf>,
    },
    /// Bridge a stdio-only MCP client (Claude Desktop style) to an emisar server.
    McpStdio {
        /// The server's MCP endpoint, e.g. http://127.0.0.1:7700/mcp.
        #[arg(long)]
        url: String,
        /// The agent bearer token (or EMISAR_TOKEN).
        #[arg(long, env = "EMISAR_TOKEN", hide_env_values = true)]
        token: String,
    },
    /// Create or update the database schema.
    Migrate {
        #[command(flatten)]
        db: DbArg,
    },
}

#[derive(Args, Clone)]
pub struct DbArg {
    /// `postgres://…` or `sqlite://…`.
    #[arg(long = "database", env = "DATABASE_URL")]
    pub database: Option<String>,
}

impl DbArg {
    fn url(&self) -> anyhow::Result<&str> {
        self.database
            .as_deref()
            .context("no database given: pass --database URL or set DATABASE_URL")
    }

    async fn connect(&self) -> anyhow::Result<Db> {
        Db::connect(self.url()?).await
    }
}

#[derive(Subcommand)]
pub enum PolicyCommand {
    /// Parse and check FILE; prints its digest, or every problem with the field it is in.
    Check {
        file: PathBuf,
        /// The packs the server loads (stock packs plus this directory).
        #[arg(long)]
        packs_dir: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
pub enum UserCommand {
    /// Add a person. The password comes from stdin (one line), or is generated and printed.
    Add {
        name: String,
        /// approver, auditor or admin.
        #[arg(long)]
        role: String,
        /// Read the password from the first line of stdin instead of generating one.
        #[arg(long)]
        password_stdin: bool,
        #[command(flatten)]
        db: DbArg,
    },
    /// Remove a person: their sessions end and their API tokens are revoked.
    Remove {
        name: String,
        #[command(flatten)]
        db: DbArg,
    },
    /// Issue an API token that acts as this person (for `emisar approvals` and scripts).
    Token {
        name: String,
        #[arg(long, default_value = "30d")]
        ttl: String,
        #[command(flatten)]
        db: DbArg,
    },
}

#[derive(Args, Clone)]
pub struct ServerArg {
    /// The server's base URL, e.g. http://127.0.0.1:7700.
    #[arg(long, env = "EMISAR_SERVER", global = true)]
    pub server: Option<String>,
    /// Your API token from `emisar user token` (or EMISAR_TOKEN).
    #[arg(long, env = "EMISAR_TOKEN", hide_env_values = true, global = true)]
    pub token: Option<String>,
}

#[derive(Subcommand)]
pub enum ApprovalsCommand {
    /// Requests in one state (pending by default), newest first.
    List {
        #[arg(long, default_value = "pending")]
        state: String,
    },
    /// One request in full: args, reason, requester, preview, votes, result.
    Show { id: String },
    /// Approve a request.
    Approve {
        id: String,
        #[arg(long)]
        note: Option<String>,
    },
    /// Deny a request; the note reaches the agent.
    Deny {
        id: String,
        #[arg(long)]
        note: String,
    },
}

#[derive(Subcommand)]
pub enum PacksCommand {
    /// Validate every pack; fails on any error, such as a free-form string param.
    Check {
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// One line per tool: name, risk, scope, description.
    List {
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// A tool's input schema, action and example.
    Show {
        tool: String,
        #[arg(long)]
        dir: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
pub enum AuditCommand {
    /// Walk the hash chain; names the first broken link and exits 1 if there is one.
    Verify {
        #[arg(long)]
        since: Option<i64>,
        #[command(flatten)]
        db: DbArg,
    },
    /// The HMAC the audit log stores for a secret value: compare it with a stored event.
    Hash {
        /// The server's audit_key_file.
        #[arg(long)]
        key_file: PathBuf,
        /// The candidate value (read from standard input when left out).
        value: Option<String>,
    },
    /// Print events, oldest first.
    Query {
        #[command(flatten)]
        filter: FilterArgs,
        #[arg(long, default_value_t = 100)]
        limit: i64,
        /// One JSON object per line instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        db: DbArg,
    },
    /// Write every matching event, oldest first, as JSON lines or CSV.
    Export {
        #[command(flatten)]
        filter: FilterArgs,
        #[arg(long, value_parser = ["jsonl", "csv"], default_value = "jsonl")]
        format: String,
        #[command(flatten)]
        db: DbArg,
    },
}

/// The filters `audit query` and `audit export` share with `GET /api/audit`.
#[derive(Args, Clone)]
pub struct FilterArgs {
    #[arg(long)]
    tool: Option<String>,
    #[arg(long)]
    runner: Option<String>,
    #[arg(long)]
    actor: Option<String>,
    #[arg(long)]
    kind: Option<String>,
    #[arg(long)]
    call_id: Option<String>,
    #[arg(long)]
    approval_id: Option<String>,
    #[arg(long)]
    outcome: Option<String>,
    /// RFC 3339 time, e.g. 2026-11-30T00:00:00Z.
    #[arg(long)]
    since: Option<chrono::DateTime<chrono::Utc>>,
    #[arg(long)]
    until: Option<chrono::DateTime<chrono::Utc>>,
}

impl FilterArgs {
    fn into_filter(self, limit: i64) -> AuditFilter {
        AuditFilter {
            tool: self.tool,
            runner: self.runner,
            actor: self.actor,
            kind: self.kind,
            call_id: self.call_id,
            approval_id: self.approval_id,
            outcome: self.outcome,
            since: self.since,
            until: self.until,
            after_seq: None,
            limit,
        }
    }
}

#[derive(Subcommand)]
pub enum JoinTokenCommand {
    /// Issue a join token. It is printed once.
    Issue {
        #[arg(long, default_value = "1h")]
        ttl: String,
        #[command(flatten)]
        db: DbArg,
    },
}

#[derive(Subcommand)]
pub enum TokenCommand {
    /// Issue a bearer token. The token is printed once.
    Issue {
        /// The name the token is issued to (an agent, or an auditor with --role auditor).
        #[arg(long)]
        agent: String,
        /// `agent` (calls tools over MCP) or `auditor` (reads GET /api/audit).
        #[arg(long, default_value = "agent")]
        role: String,
        /// Limit the token to the runners whose labels match, e.g. role=edge,dc=dc1.
        #[arg(long)]
        selector: Option<String>,
        /// Lifetime: 90s, 30m, 12h, 30d.
        #[arg(long, default_value = "30d")]
        ttl: String,
        #[command(flatten)]
        db: DbArg,
    },
    /// Revoke a token by its id.
    Revoke {
        id: String,
        #[command(flatten)]
        db: DbArg,
    },
}

/// Who the CLI acts as in the audit log.
fn cli_actor() -> String {
    format!(
        "cli:{}",
        std::env::var("USER").unwrap_or_else(|_| "unknown".into())
    )
}

/// Runs a command; the exit code is 0 unless it returns an error or says otherwise.
pub async fn run(cli: Cli) -> anyhow::Result<i32> {
    match cli.command {
        Command::Serve { config, db } => {
            let config = ServerConfig::load(&config)?;
            let url = db
                .database
                .clone()
                .or_else(|| config.database_url.clone())
                .context("no database given: set database_url in the config, pass --database or set DATABASE_URL")?;
            let app = crate::server::app::Application::build(config, &url).await?;
            let stop = app.shutdown_token();
            let signalled = stop_on_signal();
            tokio::spawn(async move {
                signalled.cancelled().await;
                stop.cancel();
            });
            app.run_until_stopped().await?;
        }
        Command::Runner {
            config,
            server,
            join_token,
        } => {
            let config = RunnerConfig::load_with_join(&config, server, join_token)?;
            crate::node::start::run(config, stop_on_signal()).await?;
        }
        Command::Dev {
            state_dir,
            listen,
            runner_config,
            packs_dir,
        } => {
            let stop = stop_on_signal();
            let opts = crate::dev::DevOptions {
                state_dir,
                listen,
                runner_config,
                packs_dir,
            };
            crate::dev::run(opts, stop).await?;
        }
        Command::Packs { command } => return packs(command),
        Command::Audit { command } => return audit_command(command).await,
        Command::Token { command } => match command {
            TokenCommand::Issue {
                agent,
                role,
                selector,
                ttl,
                db,
            } => {
                let ttl = crate::server::tokens::parse_ttl(&ttl).map_err(anyhow::Error::msg)?;
                let db = db.connect().await?;
                let audit = AuditLog::start(db.clone());
                let role = crate::server::tokens::Role::parse(&role).map_err(anyhow::Error::msg)?;
                if matches!(
                    role,
                    crate::server::tokens::Role::Approver | crate::server::tokens::Role::Admin
                ) {
                    anyhow::bail!(
                        "--role {}: tokens for people come from `emisar user token NAME`, which checks the person exists",
                        role.as_str()
                    );
                }
                let selector = selector
                    .as_deref()
                    .map(crate::selector::Selector::parse)
                    .transpose()
                    .map_err(anyhow::Error::msg)?;
                let t = crate::server::tokens::issue_scoped(
                    &db,
                    &audit,
                    &agent,
                    role,
                    selector.as_ref(),
                    ttl,
                    &cli_actor(),
                )
                .await?;
                println!("token id:   {}", t.id);
                println!("agent:      {}", t.agent);
                println!("expires at: {}", t.expires_at);
                println!("token:      {}", t.token);
                eprintln!("The token is shown once; store it now.");
            }
            TokenCommand::Revoke { id, db } => {
                let db = db.connect().await?;
                let audit = AuditLog::start(db.clone());
                if !crate::server::tokens::revoke(&db, &audit, &id, &cli_actor()).await? {
                    eprintln!("no live token has id {id}");
                    return Ok(1);
                }
                println!("revoked {id}");
            }
        },
        Command::User { command } => user(command).await?,
        Command::Policy {
            command: PolicyCommand::Check { file, packs_dir },
        } => {
            let packs = PackSet::load(packs_dir.as_deref())?;
            let policy = crate::server::policy::check_file(&file, &packs)?;
            println!("ok: {} (sha256 {})", file.display(), policy.digest());
        }
        Command::Approvals { server, command } => approvals(server, command).await?,
        Command::JoinToken {
            command: JoinTokenCommand::Issue { ttl, db },
        } => {
            let ttl = crate::server::tokens::parse_ttl(&ttl).map_err(anyhow::Error::msg)?;
            let db = db.connect().await?;
            let audit = AuditLog::start(db.clone());
            let (id, token) =
                crate::server::fleet::issue_join_token(&db, &audit, ttl, &cli_actor()).await?;
            println!("join token id: {id}");
            println!("join token:    {token}");
            eprintln!(
                "The token is shown once. Runners join with: emisar runner --config runner.toml --server URL --join-token TOKEN"
            );
        }
        Command::Keygen {
            private,
            public,
            audit_key,
        } => {
            crate::protocol::signing::write_keypair(&private, &public)?;
            println!(
                "wrote {} (keep it secret) and {}",
                private.display(),
                public.display()
            );
            if let Some(path) = audit_key {
                crate::server::secrets::AuditKey::generate(&path)?;
                println!("wrote {} (keep it secret)", path.display());
            }
        }
        Command::McpStdio { url, token } => crate::stdio_bridge::run(&url, &token).await?,
        Command::Migrate { db } => {
            let db = db.connect().await?;
            println!("{} schema is up to date", db.backend());
        }
    }
    Ok(0)
}

fn packs(command: PacksCommand) -> anyhow::Result<i32> {
    match command {
        PacksCommand::Check { dir } => {
            let set = PackSet::load(dir.as_deref())?;
            for p in set.packs() {
                let n = set.tools().filter(|t| t.pack == p.name).count();
                println!(
                    "ok  {:<10} {n:>2} tools  {}  {}",
                    p.name,
                    &p.digest[..12],
                    p.origin
                );
            }
        }
        PacksCommand::List { dir } => {
            let set = PackSet::load(dir.as_deref())?;
            println!("{:<28} {:<5} {:<8} DESCRIPTION", "TOOL", "RISK", "SCOPE");
            for t in set.tools() {
                let first_sentence = t.description.split(". ").next().unwrap_or_default();
                let scope = serde_json::to_value(t.scope)?;
                println!(
                    "{:<28} {:<5} {:<8} {}",
                    t.name,
                    t.risk.as_str(),
                    scope.as_str().unwrap_or_default(),
                    first_sentence
                );
            }
        }
        PacksCommand::Show { tool, dir } => {
            let set = PackSet::load(dir.as_deref())?;
            let Some(t) = set.tool(&tool) else {
                anyhow::bail!("no tool named `{tool}` (see `emisar packs list`)");
            };
            let steps: Vec<serde_json::Value> = t.steps.iter().map(describe_step).collect();
            let preview: Option<Vec<serde_json::Value>> = t
                .preview
                .as_ref()
                .map(|p| p.steps.iter().map(describe_step).collect());
            let shown = serde_json::json!({
                "tool": t.name,
                "description": t.description,
                "risk": t.risk,
                "scope": t.scope,
                "input_schema": crate::pack::input_schema(t),
                "steps": steps,
                "preview": preview,
                "output": t.output.as_ref().map(|o| o.source()),
                "example": t.example,
            });
            println!("{}", serde_json::to_string_pretty(&shown)?);
        }
    }
    Ok(0)
}

fn describe_step(step: &crate::pack::Step) -> serde_json::Value {
    use crate::pack::StepKind;
    let what = match &step.kind {
        StepKind::Run(Action::Http(h)) => serde_json::json!({
            "http": {"method": h.method, "path": h.path.source(),
                      "query": h.query.iter().map(|(k, v)| (k.clone(), v.source().to_owned())).collect::<std::collections::BTreeMap<_, _>>(),
                      "body": h.body.as_ref().map(|b| b.source())}
        }),
        StepKind::Run(Action::Exec(e)) => serde_json::json!({
            "exec": {"argv": e.argv.iter().map(|a| a.source()).collect::<Vec<_>>()}
        }),
        StepKind::Check { check, message } => serde_json::json!({
            "check": check.source(), "message": message.source()
        }),
    };
    serde_json::json!({
        "name": step.name,
        "do": what,
        "capture": step.capture.iter().map(|(k, v)| (k.clone(), v.source().to_owned())).collect::<std::collections::BTreeMap<_, _>>(),
        "optional": step.optional,
    })
}

async fn audit_command(command: AuditCommand) -> anyhow::Result<i32> {
    match command {
        AuditCommand::Verify { since, db } => {
            let db = db.connect().await?;
            let report = audit::verify(&db, since).await?;
            match &report.broken {
                None => {
                    println!(
                        "ok: {} events verified (seq {}..{})",
                        report.checked,
                        report.first_seq.map_or("-".into(), |s| s.to_string()),
                        report.last_seq.map_or("-".into(), |s| s.to_string())
                    );
                    Ok(0)
                }
                Some(b) => {
                    println!(
                        "BROKEN at seq {}: {} ({} events verified before it)",
                        b.seq, b.problem, report.checked
                    );
                    Ok(1)
                }
            }
        }
        AuditCommand::Hash { key_file, value } => {
            let key = crate::server::secrets::AuditKey::from_file(&key_file)?;
            let value = match value {
                Some(v) => v,
                None => {
                    let mut line = String::new();
                    std::io::stdin().read_line(&mut line)?;
                    line.trim_end_matches(['\n', '\r']).to_owned()
                }
            };
            println!("{}", key.seal(&value));
            Ok(0)
        }
        AuditCommand::Query {
            filter,
            limit,
            json,
            db,
        } => {
            let db = db.connect().await?;
            let events = audit::query(&db, &filter.into_filter(limit)).await?;
            for e in &events {
                if json {
                    println!("{}", serde_json::to_string(e)?);
                } else {
                    println!(
                        "{:>6} {} {:<15} {:<20} {:<22} {:<12} {:<8} {}",
                        e.seq,
                        e.at,
                        e.kind,
                        e.actor,
                        e.tool.as_deref().unwrap_or("-"),
                        e.runner.as_deref().unwrap_or("-"),
                        e.outcome.as_deref().unwrap_or("-"),
                        e.reason.as_deref().unwrap_or("")
                    );
                }
            }
            Ok(0)
        }
        AuditCommand::Export { filter, format, db } => {
            use std::io::Write;
            let db = db.connect().await?;
            let mut page = filter.into_filter(1000);
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            if format == "csv" {
                writeln!(out, "{}", CSV_COLUMNS.join(","))?;
            }
            loop {
                let events = audit::query(&db, &page).await?;
                for e in &events {
                    if format == "csv" {
                        writeln!(out, "{}", csv_row(e))?;
                    } else {
                        writeln!(out, "{}", serde_json::to_string(e)?)?;
                    }
                }
                match events.last() {
                    Some(last) if events.len() as i64 == page.limit => {
                        page.after_seq = Some(last.seq)
                    }
                    _ => break,
                }
            }
            out.flush()?;
            Ok(0)
        }
    }
}

const CSV_COLUMNS: [&str; 16] = [
    "seq",
    "id",
    "at",
    "actor",
    "kind",
    "tool",
    "runner",
    "args",
    "reason",
    "call_id",
    "approval_id",
    "outcome",
    "result_digest",
    "detail",
    "prev_hash",
    "hash",
];

/// One event as a CSV row (RFC 4180 quoting; JSON columns as JSON text).
fn csv_row(e: &audit::Event) -> String {
    let text = |o: &Option<String>| o.clone().unwrap_or_default();
    let json =
        |o: &Option<serde_json::Value>| o.as_ref().map(|v| v.to_string()).unwrap_or_default();
    let fields = [
        e.seq.to_string(),
        e.id.clone(),
        e.at.clone(),
        e.actor.clone(),
        e.kind.clone(),
        text(&e.tool),
        text(&e.runner),
        json(&e.args),
        text(&e.reason),
        text(&e.call_id),
        text(&e.approval_id),
        text(&e.outcome),
        text(&e.result_digest),
        json(&e.detail),
        e.prev_hash.clone(),
        e.hash.clone(),
    ];
    fields
        .iter()
        .map(|f| {
            if f.contains([',', '"', '\n', '\r']) {
                format!("\"{}\"", f.replace('"', "\"\""))
            } else {
                f.clone()
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

async fn user(command: UserCommand) -> anyhow::Result<()> {
    use crate::server::tokens::Role;
    match command {
        UserCommand::Add {
            name,
            role,
            password_stdin,
            db,
        } => {
            let role = Role::parse(&role).map_err(|e| anyhow::anyhow!("--role: {e}"))?;
            let (password, generated) = if password_stdin {
                let mut line = String::new();
                std::io::stdin().read_line(&mut line)?;
                (line.trim_end_matches(['\r', '\n']).to_owned(), false)
            } else {
                (crate::server::users::random_token()?, true)
            };
            let db = db.connect().await?;
            let audit = AuditLog::start(db.clone());
            crate::server::users::add(&db, &audit, &name, role, &password, &cli_actor()).await?;
            println!("added {name} ({})", role.as_str());
            if generated {
                println!("password: {password}");
                eprintln!("The password is shown once; it is stored only as an argon2 hash.");
            }
        }
        UserCommand::Remove { name, db } => {
            let db = db.connect().await?;
            let audit = AuditLog::start(db.clone());
            crate::server::users::remove(&db, &audit, &name, &cli_actor()).await?;
            println!("removed {name}: sessions ended, API tokens revoked");
        }
        UserCommand::Token { name, ttl, db } => {
            let ttl = crate::server::tokens::parse_ttl(&ttl).map_err(anyhow::Error::msg)?;
            let db = db.connect().await?;
            let audit = AuditLog::start(db.clone());
            let role = crate::server::users::role_of(&db, &name)
                .await?
                .with_context(|| format!("no user `{name}`: add them with `emisar user add`"))?;
            let t =
                crate::server::tokens::issue(&db, &audit, &name, role, ttl, &cli_actor()).await?;
            println!("token id:   {}", t.id);
            println!("user:       {name} ({})", role.as_str());
            println!("expires at: {}", t.expires_at);
            println!("token:      {}", t.token);
            eprintln!("The token is shown once. Use it as EMISAR_TOKEN for `emisar approvals`.");
        }
    }
    Ok(())
}

/// `emisar approvals …`: the server's `/api/approvals` with a person's token.
async fn approvals(server: ServerArg, command: ApprovalsCommand) -> anyhow::Result<()> {
    let base = server
        .server
        .context("no server given: pass --server URL or set EMISAR_SERVER")?;
    let token = server
        .token
        .context("no token given: pass --token or set EMISAR_TOKEN (from `emisar user token`)")?;
    let base = base.trim_end_matches('/');
    let http = reqwest::Client::new();
    let send = |req: reqwest::RequestBuilder| async {
        let res = req.bearer_auth(&token).send().await?;
        let status = res.status();
        let body: serde_json::Value = res.json().await.unwrap_or_default();
        if !status.is_success() {
            anyhow::bail!(
                "{}",
                body.get("error")
                    .and_then(|e| e.as_str())
                    .map(str::to_owned)
                    .unwrap_or_else(|| format!("HTTP {status}"))
            );
        }
        Ok::<_, anyhow::Error>(body)
    };
    match command {
        ApprovalsCommand::List { state } => {
            let body = send(
                http.get(format!("{base}/api/approvals"))
                    .query(&[("state", state)]),
            )
            .await?;
            let rows = body["approvals"].as_array().cloned().unwrap_or_default();
            if rows.is_empty() {
                println!("no requests");
            }
            for a in rows {
                println!(
                    "{}  {:<9} {:<32} runners={} by={} expires={}\n    reason: {}",
                    a["id"].as_str().unwrap_or(""),
                    a["state"].as_str().unwrap_or(""),
                    a["tool"].as_str().unwrap_or(""),
                    a["runners"],
                    a["requester"].as_str().unwrap_or(""),
                    a["expires_at"].as_str().unwrap_or(""),
                    a["reason"].as_str().unwrap_or("").escape_debug(),
                );
            }
        }
        ApprovalsCommand::Show { id } => {
            let body = send(http.get(format!("{base}/api/approvals/{id}"))).await?;
            println!("{}", serde_json::to_string_pretty(&body)?);
        }
        ApprovalsCommand::Approve { id, note } => {
            let body = send(
                http.post(format!("{base}/api/approvals/{id}/approve"))
                    .json(&serde_json::json!({"note": note})),
            )
            .await?;
            let state = body["state"].as_str().unwrap_or("?");
            let votes = body["approvals"].as_array().map_or(0, Vec::len);
            let required = body["required_approvals"].as_u64().unwrap_or(1);
            if state == "pending" {
                println!("{id}: pending ({votes} of {required} approvals)");
            } else {
                println!("{id}: {state}");
            }
        }
        ApprovalsCommand::Deny { id, note } => {
            let body = send(
                http.post(format!("{base}/api/approvals/{id}/deny"))
                    .json(&serde_json::json!({"note": note})),
            )
            .await?;
            println!("{id}: {}", body["state"].as_str().unwrap_or("?"));
        }
    }
    Ok(())
}
