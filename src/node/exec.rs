//! Exec actions: one program, argv only, never a shell.
//!
//! Invariant: the program is a file found in the absolute directories of the runner's exec
//! PATH (or a path given as such); the child gets a cleared environment (PATH and LANG
//! only), no stdin, its own process group (the whole group is killed on timeout), and at
//! most `max_output` bytes of each stream are kept.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::Command;

pub(crate) struct ExecResult {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub truncated: bool,
}

impl ExecResult {
    /// The value an output program sees.
    pub(crate) fn to_json(&self) -> Value {
        json!({"exit_code": self.exit_code, "signal": self.signal, "stdout": self.stdout, "stderr": self.stderr})
    }
}

#[allow(
    clippy::disallowed_methods,
    reason = "the runner's one door to processes (clippy.toml)"
)]
pub(crate) async fn run(
    argv: &[String],
    path_env: &str,
    timeout: Duration,
    max_output: usize,
) -> Result<ExecResult, String> {
    let (program, args) = argv.split_first().ok_or("empty argv")?;
    let file = resolve(program, path_env)?;
    let mut child = Command::new(&file)
        .args(args)
        .env_clear()
        .env("PATH", path_env)
        .env("LANG", "C.UTF-8")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("failed to start `{program}`: {e}"))?;
    let pgid = child.id().map(|id| Pid::from_raw(id as i32));
    let stdout = child.stdout.take().ok_or("no stdout pipe")?;
    let stderr = child.stderr.take().ok_or("no stderr pipe")?;
    let work = async {
        let (out, err, status) = tokio::join!(
            read_capped(stdout, max_output),
            read_capped(stderr, max_output),
            child.wait()
        );
        (out, err, status)
    };
    match tokio::time::timeout(timeout, work).await {
        Ok((out, err, status)) => {
            let status = status.map_err(|e| format!("failed to wait for `{program}`: {e}"))?;
            let (stdout, t1) = out.map_err(|e| format!("failed to read stdout: {e}"))?;
            let (stderr, t2) = err.map_err(|e| format!("failed to read stderr: {e}"))?;
            Ok(ExecResult {
                exit_code: status.code(),
                signal: status.signal(),
                stdout,
                stderr,
                truncated: t1 || t2,
            })
        }
        Err(_) => {
            if let Some(pgid) = pgid {
                // The group, not just the child: whatever it started dies with it.
                let _ = killpg(pgid, Signal::SIGKILL);
            }
            let _ = child.wait().await;
            Err(format!(
                "`{program}` timed out after {} ms and was killed",
                timeout.as_millis()
            ))
        }
    }
}

/// The file `program` names: itself if it contains a `/`, else the first executable file of
/// that name in `path_env`'s directories, as `execvp` would look it up with the child's PATH.
/// Directories that are not absolute (an empty entry means the working directory) are
/// skipped: what runs must not depend on where the runner was started.
///
/// Looked up here rather than by the child because std can then start the child with
/// `posix_spawn` (a vfork) instead of `fork`: with a PATH of its own and a bare name, std
/// must fork and search in the child. `fork` copies the page tables of the whole
/// multi-threaded process: in the approval bench (10 approvals executing at once)
/// `copy_page_range` and `unmap_page_range` were ~20 % of the process's CPU.
fn resolve(program: &str, path_env: &str) -> Result<PathBuf, String> {
    if program.contains('/') {
        return Ok(PathBuf::from(program));
    }
    let executable = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    std::env::split_paths(path_env)
        .filter(|dir| dir.is_absolute())
        .map(|dir| dir.join(program))
        .find(|file| executable(file))
        .ok_or_else(|| {
            format!("failed to start `{program}`: not found in the runner's exec PATH ({path_env})")
        })
}

/// Reads a stream to its end, keeping the first `max` bytes (the rest is drained, so the
/// child never blocks on a full pipe).
async fn read_capped(mut r: impl AsyncRead + Unpin, max: usize) -> std::io::Result<(String, bool)> {
    let mut kept = Vec::new();
    let mut buf = [0u8; 8192];
    let mut truncated = false;
    loop {
        let n = r.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        let room = max.saturating_sub(kept.len());
        if n > room {
            truncated = true;
        }
        kept.extend_from_slice(&buf[..n.min(room)]);
    }
    let mut text = String::from_utf8_lossy(&kept).into_owned();
    if truncated {
        text.push_str("\n[… output truncated by emisar]");
    }
    Ok((text, truncated))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PATH: &str = "/usr/bin:/bin";

    fn argv(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[tokio::test]
    async fn runs_argv_without_a_shell() {
        let r = run(
            &argv(&["echo", "a;b", "$(id)"]),
            PATH,
            Duration::from_secs(5),
            1024,
        )
        .await
        .unwrap();
        assert_eq!(r.exit_code, Some(0));
        assert_eq!(r.stdout, "a;b $(id)\n");
    }

    #[tokio::test]
    async fn environment_is_cleared() {
        let r = run(&argv(&["env"]), PATH, Duration::from_secs(5), 4096)
            .await
            .unwrap();
        let mut vars: Vec<&str> = r.stdout.lines().collect();
        vars.sort();
        assert_eq!(vars, vec!["LANG=C.UTF-8", "PATH=/usr/bin:/bin"]);
    }

    #[tokio::test]
    async fn output_is_capped() {
        let r = run(
            &argv(&["seq", "1", "100000"]),
            PATH,
            Duration::from_secs(5),
            100,
        )
        .await
        .unwrap();
        assert!(r.truncated);
        assert!(r.stdout.starts_with("1\n2\n"));
        assert!(r.stdout.ends_with("[… output truncated by emisar]"));
    }

    #[tokio::test]
    async fn timeout_kills_the_process_group() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("grandchild-survived");
        // A child that starts a grandchild; both must die with the group.
        let script = format!("(sleep 2; touch {}) & sleep 30", marker.display());
        let start = std::time::Instant::now();
        let err = run(
            &argv(&["sh", "-c", &script]),
            PATH,
            Duration::from_millis(300),
            1024,
        )
        .await
        .err()
        .unwrap();
        assert!(err.contains("timed out"), "{err}");
        assert!(start.elapsed() < Duration::from_secs(5));
        tokio::time::sleep(Duration::from_millis(2500)).await;
        assert!(!marker.exists(), "the grandchild outlived the timeout");
    }

    #[tokio::test]
    async fn missing_program_is_a_clear_error() {
        let err = run(
            &argv(&["no-such-program-x"]),
            PATH,
            Duration::from_secs(1),
            10,
        )
        .await
        .err()
        .unwrap();
        assert!(
            err.contains("failed to start `no-such-program-x`: not found in the runner's exec PATH (/usr/bin:/bin)"),
            "{err}"
        );
    }

    /// The program is looked up in the exec PATH the runner is configured with, and only in
    /// its absolute directories: a relative entry (or an empty one, the working directory)
    /// would let whoever controls the runner's working directory choose what runs.
    #[tokio::test]
    async fn the_program_is_found_in_the_absolute_directories_of_the_exec_path_only() {
        // Inside the working directory, so that it can also be named relatively.
        let dir = tempfile::Builder::new()
            .prefix(".exec-test-")
            .tempdir_in(".")
            .unwrap();
        let tool = dir.path().join("emisar-test-tool");
        std::fs::write(&tool, "#!/bin/sh\necho found\n").unwrap();
        std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
        let absolute = std::fs::canonicalize(dir.path()).unwrap();
        let path = format!("/nonexistent:{}:{PATH}", absolute.display());
        let r = run(
            &argv(&["emisar-test-tool"]),
            &path,
            Duration::from_secs(5),
            100,
        )
        .await
        .unwrap();
        assert_eq!(r.stdout, "found\n");

        let relative = dir.path().file_name().unwrap().to_str().unwrap();
        assert!(Path::new(relative).join("emisar-test-tool").exists());
        let err = resolve("emisar-test-tool", &format!("{relative}:{PATH}")).unwrap_err();
        assert!(err.contains("not found in the runner's exec PATH"), "{err}");

        // A file that is not executable is not a program.
        std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(resolve("emisar-test-tool", &path).is_err());
    }
}
