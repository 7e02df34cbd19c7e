//! `emisar-runner`: the node's agent alone, without the server. It is what every node runs;
//! built with `--no-default-features` it links none of the server (no database driver, no
//! MCP server, no portal), which keeps it small on disk and in memory.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// Run a node's runner: execute calls the emisar server signed, against local services.
#[derive(Parser)]
#[command(
    name = "emisar-runner",
    version,
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true,
    after_help = "Example: emisar-runner --config /etc/emisar/runner.toml"
)]
struct Args {
    #[command(subcommand)]
    command: Option<Command>,
    /// The runner's settings (runner.toml: name, listen address, services, allowlists).
    #[arg(long, required = true)]
    config: Option<PathBuf>,
    /// Join this server (its base URL), replacing runner.toml's [join] server. Better kept
    /// in runner.toml: a restart from the file alone (systemd's) passes no --server. A runner
    /// that joined before re-registers with its kept credential, no join token.
    #[arg(long)]
    server: Option<String>,
    /// A join token from `emisar join-token issue` (or EMISAR_JOIN_TOKEN).
    #[arg(long, env = "EMISAR_JOIN_TOKEN", hide_env_values = true)]
    join_token: Option<String>,
}

#[derive(Subcommand)]
enum Command {
    /// Print the fingerprint (sha256:…) of the certificate this runner serves, creating its
    /// self-signed certificate if it has none yet: the `tls_fingerprint` of its entry in
    /// emisar.toml.
    Fingerprint {
        #[arg(long)]
        config: PathBuf,
    },
}

// One thread runs everything: a runner's work is waiting on sockets and child processes, not
// CPU, and each worker thread of a multi-threaded runtime costs its own stack, its own malloc
// arena and their pages on every node. Child processes and `spawn_blocking` still get
// threads from tokio's blocking pool when they need them.
#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    emisar::util::process::init_logging();
    let args = Args::parse();
    let result = async {
        match args.command {
            Some(Command::Fingerprint { config }) => {
                let config = emisar::node::config::RunnerConfig::load_for_tls(&config)?;
                println!("{}", emisar::node::tls::fingerprint(&config)?);
                Ok(())
            }
            None => {
                let config = emisar::node::config::RunnerConfig::load_with_join(
                    args.config.as_deref().expect("clap requires --config"),
                    args.server,
                    args.join_token,
                )?;
                emisar::node::start::run(config, emisar::util::process::stop_on_signal()).await
            }
        }
    }
    .await;
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}
