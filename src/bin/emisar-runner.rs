//! `emisar-runner`: the node's agent alone, without the server. It is what every node runs;
//! built with `--no-default-features` it links none of the server (no database driver, no
//! MCP server, no portal), which keeps it small on disk and in memory.

use std::path::PathBuf;

use clap::Parser;

/// Run a node's runner: execute calls the emisar server signed, against local services.
#[derive(Parser)]
#[command(
    name = "emisar-runner",
    version,
    after_help = "Example: emisar-runner --config /etc/emisar/runner.toml"
)]
struct Args {
    /// The runner's settings (runner.toml: name, listen address, services, allowlists).
    #[arg(long)]
    config: PathBuf,
    /// Join this server (its base URL) instead of being listed in its config. A runner that
    /// joined before re-registers with its kept credential and needs no join token.
    #[arg(long)]
    server: Option<String>,
    /// A join token from `emisar join-token issue` (or EMISAR_JOIN_TOKEN).
    #[arg(long, env = "EMISAR_JOIN_TOKEN", hide_env_values = true)]
    join_token: Option<String>,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    emisar::util::process::init_logging();
    let args = Args::parse();
    let result = async {
        let config = emisar::node::config::RunnerConfig::load_with_join(
            &args.config,
            args.server,
            args.join_token,
        )?;
        emisar::node::start::run(config, emisar::util::process::stop_on_signal()).await
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
