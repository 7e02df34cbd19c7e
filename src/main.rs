//! The `emisar` binary: parse the command line, set up logging, run.

use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    emisar::util::process::init_logging();
    emisar::util::process::quiet_on_broken_pipe();
    let cli = emisar::cli::Cli::parse();
    match emisar::cli::run(cli).await {
        Ok(code) => std::process::ExitCode::from(code as u8),
        // The reader of our output went away (`| head -1`): nothing more to say, not a failure.
        Err(e) if emisar::util::process::is_broken_pipe(&e) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}
