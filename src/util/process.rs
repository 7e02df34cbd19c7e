//! Process-level plumbing both binaries share: logging set-up and the stop signals.

use std::io::IsTerminal;

use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

/// Logs to stderr at `EMISAR_LOG` (default `info`); `EMISAR_LOG_FORMAT=json` gives one JSON
/// object per line for log shippers. Colours only when stderr is a terminal, so files and
/// journals get plain text.
///
/// rmcp stays at `info` whatever is asked: at `debug` it logs whole requests, tool arguments
/// included, and secret params must never reach the process log.
pub fn init_logging() {
    let filter = EnvFilter::try_from_env("EMISAR_LOG")
        .unwrap_or_else(|_| EnvFilter::new("info"))
        .add_directive("rmcp=info".parse().expect("a valid directive"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    if std::env::var("EMISAR_LOG_FORMAT").is_ok_and(|f| f == "json") {
        builder.json().init();
    } else {
        builder.init();
    }
}

/// A token cancelled on SIGINT (Ctrl-C) or SIGTERM.
pub fn stop_on_signal() -> CancellationToken {
    let stop = CancellationToken::new();
    let token = stop.clone();
    tokio::spawn(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        token.cancel();
    });
    stop
}
