//! The `emisar` command line: one binary, one subcommand per job. This file holds the
//! command tree and the dispatch; each family of subcommands lives in its own file under
//! `cli/` (`audit`, `people` for users and tokens, `fleet` for join tokens and joined
//! runners, `approvals`, `packs`).

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Args, CommandFactory, Parser, Subcommand};

use crate::node::config::RunnerConfig;
use crate::pack::PackSet;
use crate::server::config::ServerConfig;
use crate::server::db::Db;
use crate::util::process::stop_on_signal;

mod approvals;
/// The terminal signer's check of a statement against the request it shows (tests drive it).
pub use approvals::check_before_signing;
mod approvers;
mod audit;
mod break_glass;
mod config_check;
pub mod config_reference;
mod fleet;
mod grants;
mod packs;
mod packs_test;
mod people;
mod ssh_sign;
mod table;

pub use approvals::ApprovalsCommand;
pub use approvers::ApproversCommand;
pub use audit::{AuditCommand, FilterArgs};
pub use break_glass::BreakGlassCommand;
pub use fleet::{JoinTokenCommand, RunnerCommand};
pub use grants::GrantsCommand;
pub use packs::PacksCommand;
pub use people::{TokenCommand, UserCommand};

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
    #[command(after_help = "Example: emisar serve --config /etc/emisar/emisar.toml")]
    Serve {
        /// The server's settings (emisar.toml).
        #[arg(long)]
        config: PathBuf,
        #[command(flatten)]
        db: DbArg,
    },
    /// Run a node's runner: execute signed calls against local services (runner.toml).
    /// `emisar runner list|remove` administer the runners that joined; `emisar runner
    /// fingerprint` prints the certificate fingerprint a runner serves.
    #[command(
        args_conflicts_with_subcommands = true,
        after_help = "Example: emisar runner --config /etc/emisar/runner.toml --join-token emj_…"
    )]
    Runner {
        #[command(subcommand)]
        command: Option<RunnerCommand>,
        /// The runner's settings (runner.toml).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Join this server (its base URL), replacing runner.toml's [join] server. Better
        /// kept in runner.toml: a restart from the file alone (systemd's) passes no --server.
        /// A runner that joined before re-registers with its kept credential, no join token.
        #[arg(long)]
        server: Option<String>,
        /// A join token from `emisar join-token issue` (or EMISAR_JOIN_TOKEN).
        #[arg(long, env = "EMISAR_JOIN_TOKEN", hide_env_values = true)]
        join_token: Option<String>,
    },
    /// Quickstart: server + local runner + SQLite in one process; prints URL and token.
    #[command(after_help = "Example: emisar dev --listen 127.0.0.1:7700")]
    Dev {
        /// Where the SQLite database, keys and dev.json (URL and token) are kept.
        #[arg(long, default_value = ".emisar-dev")]
        state_dir: PathBuf,
        /// The server's address (`:0` picks a free port).
        #[arg(long, default_value = "127.0.0.1:7700")]
        listen: String,
        /// A runner.toml for the local runner (services, listen address, packs, allowlists).
        /// Without it the runner reaches services at their standard local addresses and
        /// may restart one systemd unit, `cron` (the quickstart's write).
        #[arg(long)]
        runner_config: Option<PathBuf>,
        /// A directory of pack files that add to or replace the stock packs.
        #[arg(long)]
        packs_dir: Option<PathBuf>,
        /// A policy file (see examples/policy.yaml; the dev agent is `dev-agent`), checked
        /// and loaded at start. Without one, every agent may call every tool and one
        /// approval decides a write.
        #[arg(long)]
        policy: Option<PathBuf>,
        /// Approvals signed by people: makes an approver SSH key and an approvers file in
        /// the state dir, and the local runner runs a write only with that key's signature
        /// (`emisar approvals approve ID --ssh-key …`, printed at start).
        #[arg(long)]
        signed_approvals: bool,
        /// Leave the audit log a hash chain only: no log key, no checkpoints and no local
        /// witness (by default a witness in this process cosigns every checkpoint).
        #[arg(long)]
        no_witness: bool,
    },
    /// A fleet-wide 502 incident, replayable: the server, five edge runners
    /// (nomad-hvn01..05) and the lab's Consul, Nomad, Traefik, FRR and metrics behind them.
    #[command(after_help = "Example: emisar lab --speed 10")]
    // A build without the `lab` feature keeps the command, so that `emisar lab` says why it
    // cannot run (`no_lab`) instead of clap's "unrecognized subcommand", but does not list it.
    #[cfg_attr(not(feature = "lab"), command(hide = true))]
    Lab {
        /// Where the lab keeps its database, keys and the services' state.
        #[arg(long, default_value = ".emisar-lab")]
        state_dir: PathBuf,
        /// The server's address (`:0` picks a free port).
        #[arg(long, default_value = "127.0.0.1:7700")]
        listen: String,
        /// How fast lab time runs (1 = real time; 10 makes the OOM restarts ten times as
        /// frequent; 0 freezes it).
        #[arg(long, default_value_t = 1.0)]
        speed: f64,
        /// The VictoriaMetrics binary (default: `victoria-metrics` on PATH).
        #[arg(long)]
        victoria_metrics: Option<PathBuf>,
    },
    /// A lab node's stand-in for a command (run by the scripts `emisar lab` writes).
    #[command(hide = true)]
    LabExec {
        #[arg(long)]
        control: String,
        #[arg(long)]
        node: String,
        #[arg(last = true, required = true)]
        argv: Vec<String>,
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
    /// Check a server or runner config file without starting anything.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
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
    /// Break-glass windows, for people who review them (talks to a running server; `emisar
    /// audit break-glass` lists them from the database).
    BreakGlass {
        #[command(flatten)]
        server: ServerArg,
        #[command(subcommand)]
        command: BreakGlassCommand,
    },
    /// Grants: people's signed, time-boxed mandates for an agent's writes (talks to a
    /// running server).
    Grants {
        #[command(flatten)]
        server: ServerArg,
        #[command(subcommand)]
        command: GrantsCommand,
    },
    /// The approvers file runners trust: people, their keys, how many must sign per tool.
    Approvers {
        #[command(subcommand)]
        command: ApproversCommand,
    },
    /// Join tokens, with which runners join: issue, list, revoke.
    JoinToken {
        #[command(subcommand)]
        command: JoinTokenCommand,
    },
    /// Generate the server's Ed25519 signing key pair (and, optionally, the audit HMAC key).
    #[command(
        after_help = "Example: emisar keygen --private /etc/emisar/server.key --public /etc/emisar/server.pub --audit-key /etc/emisar/audit.key"
    )]
    Keygen {
        /// Where to write the private key (PKCS#8 PEM, mode 0600): emisar.toml's
        /// signing_key_file.
        #[arg(long)]
        private: PathBuf,
        /// Where to write the public key (SPKI PEM): runner.toml's server_public_key_file.
        #[arg(long)]
        public: PathBuf,
        /// Also write a fresh key for sealing secret params in the audit log.
        #[arg(long)]
        audit_key: Option<PathBuf>,
    },
    /// Run a transparency-log witness (C2SP tlog-witness): cosign the checkpoints of the logs
    /// in witness.toml, each only if it extends the one cosigned before. `emisar witness
    /// keygen` makes its key.
    #[command(
        args_conflicts_with_subcommands = true,
        after_help = "Example: emisar witness --config /etc/emisar-witness/witness.toml"
    )]
    Witness {
        #[command(subcommand)]
        command: Option<WitnessCommand>,
        /// The witness's settings (witness.toml).
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Bridge a stdio-only MCP client (Claude Desktop style) to an emisar server.
    #[command(
        after_help = "Example: EMISAR_TOKEN=emt_… emisar mcp-stdio --url https://emisar.example:7700/mcp"
    )]
    McpStdio {
        /// The server's MCP endpoint, e.g. http://127.0.0.1:7700/mcp.
        #[arg(long)]
        url: String,
        /// An emisar bearer token, usually an agent's (or EMISAR_TOKEN).
        #[arg(long, env = "EMISAR_TOKEN", hide_env_values = true)]
        token: String,
    },
    /// Create or update the database schema.
    #[command(after_help = "Example: emisar migrate --database postgres://emisar@db/emisar")]
    Migrate {
        #[command(flatten)]
        db: DbArg,
    },
    /// Print the shell completion script for SHELL (the package installs bash, zsh and fish's).
    #[command(after_help = "Example: emisar completions bash > /etc/bash_completion.d/emisar")]
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
    /// Write a man page per command (emisar.1, emisar-audit-query.1, …) into DIR: what the
    /// Debian package installs, for a build from source.
    #[command(after_help = "Example: emisar man ~/.local/share/man/man1")]
    Man {
        /// Where to write the pages.
        dir: PathBuf,
    },
}

#[derive(Subcommand)]
pub enum WitnessCommand {
    /// Generate the witness's Ed25519 key (mode 0600, never overwriting one) and print the
    /// verifier key of its cosignatures, for the configs that trust this witness.
    #[command(
        after_help = "Example: emisar witness keygen --name witness-a.example.org/w1 --key /etc/emisar-witness/witness.key"
    )]
    Keygen {
        /// The witness's name in its cosignatures, usually a URL without scheme
        /// (no spaces, no `+`).
        #[arg(long)]
        name: String,
        /// Where to write the private key: witness.toml's key_file.
        #[arg(long)]
        key: PathBuf,
    },
}

#[derive(Args, Clone)]
pub struct DbArg {
    /// `postgres://…` or `sqlite://…`. From the environment its value is never shown (it
    /// may hold a password).
    #[arg(long = "database", env = "DATABASE_URL", hide_env_values = true)]
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
pub enum ConfigCommand {
    /// Run every check `emisar serve` or `emisar runner` runs at start on FILE (keys, files
    /// it names, keys and certificates, packs, policy, listen and advertise addresses),
    /// without binding a port or connecting anywhere. Prints `ok`, or every problem naming
    /// its key and exits 1.
    #[command(after_help = "Example: emisar config check /etc/emisar/runner.toml")]
    Check {
        /// The config file (emisar.toml or runner.toml).
        file: PathBuf,
        /// Which config FILE is; without it, told from its keys (signing_key_file: server,
        /// name: runner).
        #[arg(long, value_enum)]
        kind: Option<config_check::ConfigKind>,
    },
}

#[derive(Subcommand)]
pub enum PolicyCommand {
    /// Parse and check FILE; prints its digest, or every problem with the field it is in.
    #[command(
        after_help = "Example: emisar policy check /etc/emisar/policy.yaml --packs-dir /etc/emisar/packs"
    )]
    Check {
        /// The policy file (TOML or YAML).
        file: PathBuf,
        /// The packs the server loads (stock packs plus this directory).
        #[arg(long)]
        packs_dir: Option<PathBuf>,
    },
}

#[derive(Args, Clone)]
pub struct ServerArg {
    /// The server's base URL with its scheme, e.g. https://emisar.example:7700 (or
    /// EMISAR_SERVER).
    #[arg(
        long,
        env = "EMISAR_SERVER",
        hide_env_values = true,
        global = true,
        value_parser = server_url
    )]
    pub server: Option<String>,
    /// Your API token from `emisar user token` (or EMISAR_TOKEN).
    #[arg(long, env = "EMISAR_TOKEN", hide_env_values = true, global = true)]
    pub token: Option<String>,
}

/// `--server`: an http(s) URL with a host. `127.0.0.1:7700` would otherwise reach reqwest as
/// a URL whose scheme is `127.0.0.1` and fail with "relative URL without a base".
pub(crate) fn server_url(value: &str) -> Result<String, String> {
    match reqwest::Url::parse(value) {
        Ok(url) if matches!(url.scheme(), "http" | "https") && url.host_str().is_some() => {
            Ok(value.trim_end_matches('/').to_owned())
        }
        _ => Err(
            "must be the server's URL with its scheme, e.g. https://emisar.example:7700 or http://127.0.0.1:7700"
                .into(),
        ),
    }
}

/// Who the CLI acts as in the audit log.
fn cli_actor() -> String {
    format!("cli:{}", local_user(std::env::var("USER").ok()))
}

/// The person at this terminal: `$USER` when it is set and a plain name, else the name of
/// the process's uid in the password database (cron and containers often set no `$USER`),
/// else `uid-N`, so the audit log always names the account that ran the command.
fn local_user(env_user: Option<String>) -> String {
    env_user
        .filter(|u| crate::util::input::is_identifier(u))
        .or_else(|| {
            let uid = nix::unistd::getuid();
            let name = nix::unistd::User::from_uid(uid).ok().flatten()?.name;
            Some(name).filter(|n| crate::util::input::is_identifier(n))
        })
        .unwrap_or_else(|| format!("uid-{}", nix::unistd::getuid()))
}

/// What `emisar lab` answers in a build without the `lab` feature (the package's, the
/// container image's): the lab is a demonstration, not part of the product.
#[cfg(not(feature = "lab"))]
fn no_lab(command: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "`emisar {command}` is not in this build: the Debian package and the container image \
         leave the lab (the case study's incident with emulated Consul, Nomad and Traefik) out \
         of the production binary. Run it from a source checkout with `cargo run -- lab`, or \
         build emisar with the `lab` cargo feature (docs/getting-started.md, \"The lab\")"
    )
}

/// Runs a command; the exit code is 0 unless it returns an error or says otherwise.
pub async fn run(cli: Cli) -> anyhow::Result<i32> {
    match cli.command {
        Command::Serve { config, db } => serve(&config, &db).await?,
        Command::Runner {
            command: Some(command),
            ..
        } => return fleet::runner(command).await,
        Command::Runner {
            command: None,
            config,
            server,
            join_token,
        } => runner(config, server, join_token).await?,
        Command::Dev {
            state_dir,
            listen,
            runner_config,
            packs_dir,
            policy,
            signed_approvals,
            no_witness,
        } => {
            let opts = crate::dev::DevOptions {
                state_dir,
                listen,
                runner_config,
                packs_dir,
                policy_file: policy,
                signed_approvals,
                witness: !no_witness,
            };
            crate::dev::run(opts, stop_on_signal()).await?;
        }
        #[cfg(feature = "lab")]
        Command::Lab {
            state_dir,
            listen,
            speed,
            victoria_metrics,
        } => {
            let opts = crate::lab::run::LabOptions {
                state_dir,
                listen,
                speed,
                standin_exe: None,
                victoria_metrics,
            };
            crate::lab::run::run(opts, stop_on_signal()).await?;
        }
        #[cfg(feature = "lab")]
        Command::LabExec {
            control,
            node,
            argv,
        } => return Ok(crate::lab::standin::run(&control, &node, &argv).await),
        #[cfg(not(feature = "lab"))]
        Command::Lab { .. } => return Err(no_lab("lab")),
        #[cfg(not(feature = "lab"))]
        Command::LabExec { .. } => return Err(no_lab("lab-exec")),
        Command::Packs { command } => return packs::run(command).await,
        Command::Audit { command } => return audit::run(command).await,
        Command::Token { command } => return people::token(command).await,
        Command::User { command } => people::user(command).await?,
        Command::Config {
            command: ConfigCommand::Check { file, kind },
        } => return config_check::run(&file, kind),
        Command::Policy {
            command: PolicyCommand::Check { file, packs_dir },
        } => policy_check(&file, packs_dir.as_deref())?,
        Command::Approvals { server, command } => approvals::run(server, command).await?,
        Command::BreakGlass { server, command } => break_glass::run(server, command).await?,
        Command::Grants { server, command } => grants::run(server, command).await?,
        Command::Approvers { command } => approvers::run(command)?,
        Command::JoinToken { command } => return fleet::join_token(command).await,
        Command::Keygen {
            private,
            public,
            audit_key,
        } => keygen(&private, &public, audit_key.as_deref())?,
        Command::Witness {
            command: Some(WitnessCommand::Keygen { name, key }),
            ..
        } => witness_keygen(&name, &key)?,
        Command::Witness {
            command: None,
            config,
        } => witness(config).await?,
        Command::McpStdio { url, token } => crate::stdio_bridge::run(&url, &token).await?,
        Command::Completions { shell } => completions(shell)?,
        Command::Man { dir } => man(&dir)?,
        Command::Migrate { db } => migrate(&db).await?,
    }
    Ok(0)
}

/// `emisar serve`: the server, until a signal stops it.
async fn serve(config: &Path, db: &DbArg) -> anyhow::Result<()> {
    let config = ServerConfig::load(config)?;
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
    Ok(app.run_until_stopped().await?)
}

/// `emisar runner --config`: the runner, until a signal stops it.
async fn runner(
    config: Option<PathBuf>,
    server: Option<String>,
    join_token: Option<String>,
) -> anyhow::Result<()> {
    let config = config.context(
        "emisar runner needs --config runner.toml (or a subcommand: list, remove, fingerprint)",
    )?;
    let config = RunnerConfig::load_with_join(&config, server, join_token)?;
    crate::node::start::run(config, stop_on_signal()).await
}

/// `emisar policy check`.
fn policy_check(file: &Path, packs_dir: Option<&Path>) -> anyhow::Result<()> {
    let packs = PackSet::load(packs_dir)?;
    let policy = crate::server::policy::check_file(file, &packs)?;
    println!("ok: {} (sha256 {})", file.display(), policy.digest());
    Ok(())
}

/// `emisar keygen`: the server's signing key pair, and the audit key if asked for.
fn keygen(private: &Path, public: &Path, audit_key: Option<&Path>) -> anyhow::Result<()> {
    crate::protocol::signing::write_keypair(private, public)?;
    println!(
        "wrote {} (keep it secret) and {}",
        private.display(),
        public.display()
    );
    if let Some(path) = audit_key {
        crate::server::secrets::AuditKey::generate(path)?;
        println!("wrote {} (keep it secret)", path.display());
    }
    Ok(())
}

/// `emisar witness keygen`.
fn witness_keygen(name: &str, key: &Path) -> anyhow::Result<()> {
    let vkey = crate::witness::serve::keygen(name, key)?;
    println!("wrote {} (keep it secret)", key.display());
    println!("{vkey}");
    Ok(())
}

/// `emisar witness --config`: the witness, until a signal stops it.
async fn witness(config: Option<PathBuf>) -> anyhow::Result<()> {
    let config = config.context("--config: give the witness's witness.toml")?;
    let config = crate::witness::config::WitnessConfig::load(&config)?;
    let server = crate::witness::serve::WitnessServer::build(&config).await?;
    Ok(server.run_until_stopped(stop_on_signal()).await?)
}

/// `emisar completions`. Written whole into memory first: clap_complete panics on a write
/// error, and a reader that goes away (`| head`) must end the command quietly, not panic.
fn completions(shell: clap_complete::Shell) -> anyhow::Result<()> {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "emisar", &mut script);
    std::io::Write::write_all(&mut std::io::stdout(), &script)?;
    Ok(())
}

/// `emisar man`.
fn man(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("failed to create {}", dir.display()))?;
    clap_mangen::generate_to(Cli::command(), dir)
        .with_context(|| format!("failed to write man pages into {}", dir.display()))?;
    Ok(())
}

/// `emisar migrate`: the schema brought up to date, and the audit log folded into its tree.
async fn migrate(db: &DbArg) -> anyhow::Result<()> {
    let (db, applied) = Db::connect_and_migrate(db.url()?).await?;
    if applied.is_empty() {
        println!("{} schema is up to date", db.backend());
    } else {
        println!(
            "applied {} migration(s) to {}:",
            applied.len(),
            db.backend()
        );
        for m in &applied {
            println!("  {m}");
        }
    }
    // Events written before the audit tree existed are folded into it now, rather than by
    // the server's first append (which would hold the append lock for it).
    let leaves = crate::server::audit::tree::fold_all(&db)
        .await
        .context("failed to fold the audit log into its Merkle tree")?;
    println!("audit tree: {leaves} events");
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::{Cli, local_user};

    /// Every option says what it is for, and every command one runs (a leaf) shows a one-line
    /// example in its help.
    #[test]
    fn every_option_has_help_and_every_command_an_example() {
        fn walk(cmd: &clap::Command, path: &str, problems: &mut Vec<String>) {
            if cmd.is_hide_set() {
                return;
            }
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if matches!(id, "help" | "version") || arg.is_hide_set() {
                    continue;
                }
                if arg.get_help().is_none() && arg.get_long_help().is_none() {
                    problems.push(format!("{path}: option `{id}` has no help"));
                }
            }
            let subs: Vec<_> = cmd
                .get_subcommands()
                .filter(|s| s.get_name() != "help")
                .collect();
            let runnable = subs.is_empty() || cmd.is_args_conflicts_with_subcommands_set();
            if runnable && !path.is_empty() {
                let example = cmd
                    .get_after_help()
                    .map(|h| h.to_string())
                    .unwrap_or_default();
                if !example.starts_with("Example: ") {
                    problems.push(format!("{path}: no `Example: ` in after_help"));
                }
            }
            for s in subs {
                let sub = format!("{path} {}", s.get_name()).trim().to_owned();
                walk(s, &sub, problems);
            }
        }
        let mut problems = Vec::new();
        walk(&Cli::command(), "", &mut problems);
        assert!(problems.is_empty(), "{}", problems.join("\n"));
    }

    /// Every command with its `after_help`, by its path (`audit query`).
    fn commands(cmd: &clap::Command, path: &str, out: &mut Vec<(String, clap::Command)>) {
        out.push((path.to_owned(), cmd.clone()));
        for s in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
            commands(s, format!("{path} {}", s.get_name()).trim(), out);
        }
    }

    /// Every `Example:` line of every `--help` is a command line this CLI accepts for that
    /// very command (split as a shell would; the `emisar …` part of a pipe, without `VAR=`
    /// prefixes and redirections), every tool, event kind or pack it names exists, and every
    /// option's "e.g." of a tool names a stock tool. So no help can offer a flag, a tool or a
    /// subcommand that does not exist.
    #[test]
    fn every_example_line_parses_and_names_what_exists() {
        let packs = crate::pack::PackSet::load(None).unwrap();
        let is_tool = |name: &str| packs.tools().any(|t| t.name == name);
        let mut all = Vec::new();
        commands(&Cli::command(), "", &mut all);
        let mut problems = Vec::new();
        let mut examples = 0;
        for (path, cmd) in &all {
            for arg in cmd.get_arguments().filter(|a| a.get_id() == "tool") {
                let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
                if let Some((_, after)) = help.split_once("e.g. ") {
                    let tool = after
                        .trim_end_matches('.')
                        .split_whitespace()
                        .next()
                        .unwrap();
                    if !is_tool(tool) {
                        problems.push(format!("{path} --tool: its help names `{tool}`, no tool"));
                    }
                }
            }
            let Some(help) = cmd.get_after_help().map(|h| h.to_string()) else {
                continue;
            };
            let Some(line) = help.strip_prefix("Example: ") else {
                continue;
            };
            examples += 1;
            let words = shlex::split(line)
                .unwrap_or_else(|| panic!("{path}: `{line}` does not split as shell words"));
            let mut parsed = 0;
            for segment in words.split(|w| w == "|") {
                let mut argv: Vec<String> = Vec::new();
                let mut words = segment.iter().map(String::as_str).peekable();
                // `VAR=value emisar …`: the option that reads VAR, given on the command line
                // instead (the test may not set the process's environment).
                let mut from_env = Vec::new();
                while let Some((var, value)) = words
                    .peek()
                    .filter(|w| !w.starts_with('-'))
                    .and_then(|w| w.split_once('='))
                {
                    match cmd
                        .get_arguments()
                        .find(|a| a.get_env().is_some_and(|e| e == var))
                        .and_then(|a| a.get_long())
                    {
                        Some(long) => from_env.extend([format!("--{long}"), value.to_owned()]),
                        None => problems.push(format!("{path}: no option reads `{var}`")),
                    }
                    words.next();
                }
                while let Some(word) = words.next() {
                    if matches!(word, "<" | ">" | ">>") {
                        words.next();
                    } else {
                        argv.push(word.to_owned());
                    }
                }
                if argv.first().map(String::as_str) != Some("emisar") {
                    continue;
                }
                argv.extend(from_env);
                let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
                parsed += 1;
                let named: Vec<&str> = argv
                    .iter()
                    .skip(1)
                    .take_while(|w| !w.starts_with('-'))
                    .copied()
                    .collect();
                if !path
                    .split(' ')
                    .eq(named.iter().take(path.split(' ').count()).copied())
                {
                    problems.push(format!("{path}: the example is for `{}`", named.join(" ")));
                }
                if let Err(e) = Cli::try_parse_from(&argv) {
                    problems.push(format!("{path}: `{line}` does not parse: {e}"));
                }
                for pair in argv.windows(2) {
                    let known = match pair[0] {
                        "--kind" if path.starts_with("audit") => {
                            crate::server::audit::KINDS.contains(&pair[1])
                        }
                        "--pack" => packs.packs().any(|p| p.name == pair[1]),
                        "show" if path == "packs show" => is_tool(pair[1]),
                        "--tool" => is_tool(pair[1]),
                        _ => true,
                    };
                    if !known {
                        problems.push(format!(
                            "{path}: `{} {}` names nothing that exists",
                            pair[0], pair[1]
                        ));
                    }
                }
            }
            if parsed == 0 {
                problems.push(format!("{path}: `{line}` runs no `emisar` command"));
            }
        }
        assert!(examples > 30, "only {examples} examples found");
        assert!(problems.is_empty(), "{}", problems.join("\n"));
    }

    /// No `--help` shows an environment variable's value, set or empty (`[env: NAME=]`).
    #[test]
    fn no_help_shows_an_environment_value() {
        let mut all = Vec::new();
        commands(&Cli::command(), "", &mut all);
        for (path, mut cmd) in all {
            let help = cmd.render_long_help().to_string();
            assert!(!help.contains("=]"), "{path}: {help}");
        }
    }

    /// Without `$USER` (cron, a container), the audit log names the uid's account, never
    /// `unknown`; a `$USER` that is not a plain name is not taken at its word.
    #[test]
    #[allow(
        clippy::disallowed_methods,
        reason = "asks `id` what the answer should be"
    )]
    fn the_cli_names_its_account_without_user() {
        let id = std::process::Command::new("id")
            .arg("-un")
            .output()
            .unwrap();
        let account = String::from_utf8(id.stdout).unwrap().trim().to_owned();
        assert!(!account.is_empty());
        assert_eq!(local_user(None), account);
        assert_eq!(local_user(Some("alice".into())), "alice");
        assert_eq!(local_user(Some("a b\nc".into())), account);
        assert_eq!(local_user(Some(String::new())), account);
    }
}
