//! Process-level plumbing both binaries share: logging set-up, the stop signals, and
//! stopping a child process.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

/// Sends `child` SIGTERM and reaps it; if it has not exited within `grace`, kills it.
/// Returns whether it stopped on SIGTERM. Bounded because a process can ignore or never
/// finish its SIGTERM shutdown: once, the lab's VictoriaMetrics did (its data directory
/// already removed), and an unbounded wait hung the test that dropped it for half an hour. A
/// plain poll, so that it can run in `Drop`, outside any runtime.
pub fn stop_child(child: &mut std::process::Child, grace: Duration) -> bool {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let deadline = Instant::now() + grace;
    loop {
        match child.try_wait() {
            Ok(Some(_)) | Err(_) => return true,
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return false;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Logs to stderr at `EMISAR_LOG` (default `info`); `EMISAR_LOG_FORMAT=json` gives one JSON
/// object per line for log shippers. Colours only when stderr is a terminal, so files and
/// journals get plain text.
///
/// rmcp stays at `info` whatever is asked: at `debug` it logs whole requests, tool arguments
/// included, and secret params must never reach the process log.
pub fn init_logging() {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = EnvFilter::try_from_env("EMISAR_LOG")
        .unwrap_or_else(|_| EnvFilter::new("info"))
        .add_directive("rmcp=info".parse().expect("a valid directive"));
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let registry = tracing_subscriber::registry().with(filter).with(NotAnError);
    if std::env::var("EMISAR_LOG_FORMAT").is_ok_and(|f| f == "json") {
        registry.with(layer.json()).init();
    } else {
        registry.with(layer).init();
    }
}

/// What rmcp logs as an ERROR but is an agent that went away: when a client disconnects
/// while a call waits (for an approval, say), rmcp's service loop cannot deliver the answer
/// and logs "failed to send pending response during drain". The call's outcome is in the
/// audit log whatever the client does, so this is not an error of the server. A level
/// directive cannot lower one event of a target (rmcp::service logs its real errors at the
/// same level), so this filter drops that one message by its text, and nothing else.
pub struct NotAnError;

/// The messages [`NotAnError`] drops, with the target that logs them.
const CLIENT_GONE: &[(&str, &str)] = &[(
    "rmcp::service",
    "failed to send pending response during drain",
)];

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for NotAnError {
    fn event_enabled(
        &self,
        event: &tracing::Event<'_>,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) -> bool {
        let target = event.metadata().target();
        if !CLIENT_GONE.iter().any(|(t, _)| *t == target) {
            return true;
        }
        struct Message(String);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.0 = format!("{value:?}");
                }
            }
        }
        let mut message = Message(String::new());
        event.record(&mut message);
        !CLIENT_GONE
            .iter()
            .any(|(t, m)| *t == target && message.0 == *m)
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

/// Whether `e` is stdout's reader having gone away.
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// Ends the process quietly, with status 0, when `println!` finds stdout's reader gone
/// (`emisar approvals list | head -1`): Rust ignores SIGPIPE, so the write fails, and
/// `println!` panics on a failed write. Every other panic is reported as before. A hook
/// rather than a `writeln!` at every print, because one missed print would still panic.
pub fn quiet_on_broken_pipe() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if message.starts_with("failed printing to stdout") && message.contains("Broken pipe") {
            std::process::exit(0);
        }
        previous(info);
    }));
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::layer::SubscriberExt;

    use super::NotAnError;

    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_client_that_went_away_is_not_logged_as_an_error() {
        let lines = Lines::default();
        let writer = lines.clone();
        let subscriber = tracing_subscriber::registry().with(NotAnError).with(
            tracing_subscriber::fmt::layer()
                .with_ansi(false)
                .with_writer(move || writer.clone()),
        );
        tracing::subscriber::with_default(subscriber, || {
            let error = "connection closed";
            tracing::error!(target: "rmcp::service", %error, "failed to send pending response during drain");
            tracing::error!(target: "rmcp::service", %error, "fail to close sink");
            tracing::error!(target: "emisar", "failed to send pending response during drain");
        });
        let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text.lines().count(), 2, "{text}");
        assert!(text.contains("fail to close sink"), "{text}");
        assert!(text.contains(" emisar: failed to send pending"), "{text}");
    }
}
