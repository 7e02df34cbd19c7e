//! The `emisar` binary: parse the command line, set up logging, run.

use clap::Parser;
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    // EMISAR_LOG_FORMAT=json gives one JSON object per line, for log shippers.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(log_filter())
        .with_writer(std::io::stderr);
    if std::env::var("EMISAR_LOG_FORMAT").is_ok_and(|f| f == "json") {
        builder.json().init();
    } else {
        builder.init();
    }
    let cli = emisar::cli::Cli::parse();
    match emisar::cli::run(cli).await {
        Ok(code) => std::process::ExitCode::from(code as u8),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}

/// `EMISAR_LOG` (default `info`), except that rmcp stays at `info` whatever is asked: at
/// `debug` it logs whole requests, tool arguments included, and secret params must never
/// reach the process log.
fn log_filter() -> EnvFilter {
    let filter = EnvFilter::try_from_env("EMISAR_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    filter.add_directive("rmcp=info".parse().expect("a valid directive"))
}
