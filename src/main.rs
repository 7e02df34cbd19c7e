//! The `emisar` binary: parse the command line, set up logging, run.

use clap::Parser;

/// mimalloc rather than glibc's malloc: a call allocates and frees many small objects across
/// the runtime's threads, and glibc's allocator was ~17 % of the server's CPU per read
/// (docs/BENCHMARKS.md, "Issue 28 (2026-12-05)").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    // Where transparent huge pages are `always` on, the kernel would back mimalloc's arenas
    // with 2 MiB pages whatever it advises: an idle server then holds ~30 MiB more. A kernel
    // without the flag (before 3.15) only costs that memory, so its error is not fatal.
    let _ = nix::sys::prctl::set_thp_disable(true);
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
