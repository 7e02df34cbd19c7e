//! The `emisar` binary: parse the command line, set up logging, run.

use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    emisar::util::process::init_logging();
    let cli = emisar::cli::Cli::parse();
    match emisar::cli::run(cli).await {
        Ok(code) => std::process::ExitCode::from(code as u8),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}
