//! Runners that join: join tokens for a test server, runner.toml files with their own state
//! dir, the `emisar runner` process that joins (or re-registers), and raw join requests.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use emisar::protocol::ServerPins;
use emisar::server::fleet::JoinTokenSpec;
use serde_json::Value;

use super::app::TestApp;
use super::tools::Proc;

impl TestApp {
    /// The fingerprints a join token of this server carries.
    pub fn server_pins(&self) -> ServerPins {
        let pem = std::fs::read_to_string(&self.public_key).unwrap();
        ServerPins {
            key_sha256: emisar::protocol::signing::key_fingerprint(&pem).unwrap(),
        }
    }

    /// Issues a join token as `emisar join-token issue` does; returns (id, whole token).
    pub async fn join_token(&self, spec: JoinTokenSpec) -> (String, String) {
        let issued = emisar::server::fleet::issue_join_token(
            &self.db,
            &self.audit,
            &spec,
            self.server_pins(),
            "test",
        )
        .await
        .unwrap();
        (issued.id, issued.token)
    }

    /// `POST /api/runners/join` with the secret of `token` (or `token` itself when it does
    /// not parse) and `body`; returns the status and the JSON answer.
    pub async fn raw_join(&self, token: &str, body: &Value) -> (u16, Value) {
        let secret = emisar::protocol::JoinToken::parse(token)
            .map(|t| t.secret().to_owned())
            .unwrap_or_else(|_| token.to_owned());
        let res = self
            .http()
            .post(format!("{}/api/runners/join", self.base_url()))
            .bearer_auth(secret)
            .json(body)
            .send()
            .await
            .unwrap();
        let status = res.status().as_u16();
        (status, res.json().await.unwrap_or(Value::Null))
    }

    /// The joined runner `name` as `GET /api/runners` shows it, if it is there.
    pub async fn runner_status(&self, name: &str) -> Option<Value> {
        self.runners_api().await["runners"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == name)
            .cloned()
    }

    /// Waits (generously) until `GET /api/runners` lists `name` with a good heartbeat.
    pub async fn wait_for_runner(&self, name: &str, log: &Path) -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(r) = self.runner_status(name).await
                && r["heartbeat_ok"] == true
            {
                return r;
            }
            assert!(
                Instant::now() < deadline,
                "runner {name} did not join: {}\n{}",
                self.runners_api().await,
                std::fs::read_to_string(log).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// A runner.toml for `name` in `dir` listening on loopback port 0 (the runner reports the
/// bound address when it joins, and logs it: [`super::tools::bound_addr`]), with its own state
/// dir and the test fixture packs, serving plain HTTP on loopback (`insecure_http`, as the
/// test server allows); `extra` is appended (e.g. `labels = { … }`).
pub fn runner_toml(dir: &Path, name: &str, extra: &str) -> PathBuf {
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(
        &path,
        format!(
            "name = \"{name}\"\nlisten = \"127.0.0.1:0\"\ninsecure_http = true\npacks_dir = \"{}\"\nexec_path = \"/usr/bin:/bin\"\nstate_dir = \"{}\"\n{extra}\n",
            crate::mcp_calls::fixtures_dir().display(),
            state_dir(dir, name).display(),
        ),
    )
    .unwrap();
    path
}

/// Where the runner.toml of [`runner_toml`] keeps the runner's credential.
pub fn state_dir(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("state-{name}"))
}

/// `emisar runner --config CONFIG [--server SERVER]`, no join token in its environment, its
/// stderr in `log`.
fn runner_command(server: Option<&str>, config: &Path, log: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_emisar"));
    command
        .args(["runner", "--config", config.to_str().unwrap()])
        .env_remove("EMISAR_JOIN_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap());
    if let Some(server) = server {
        command.args(["--server", server]);
    }
    command
}

/// `emisar runner --config CONFIG --server SERVER` (with the join token in the environment
/// when given), its stderr in `log`.
pub fn spawn_runner(server: &str, config: &Path, join_token: Option<&str>, log: &Path) -> Proc {
    let mut command = runner_command(Some(server), config, log);
    if let Some(token) = join_token {
        command.env("EMISAR_JOIN_TOKEN", token);
    }
    Proc(command.spawn().unwrap())
}

/// `emisar runner --config CONFIG` and nothing else, as systemd starts it; stderr in `log`.
pub fn spawn_runner_from_file(config: &Path, log: &Path) -> Proc {
    Proc(runner_command(None, config, log).spawn().unwrap())
}

/// Runs `emisar runner …` that is expected to fail to start; returns (exit code, stderr).
/// A runner still running after a generous minute is killed and fails the test.
pub async fn run_runner_to_end(
    server: &str,
    config: &Path,
    join_token: Option<&str>,
) -> (i32, String) {
    run_to_end(Some(server), config, join_token).await
}

/// [`run_runner_to_end`] with no --server: runner.toml alone.
pub async fn run_runner_from_file_to_end(config: &Path) -> (i32, String) {
    run_to_end(None, config, None).await
}

async fn run_to_end(
    server: Option<&str>,
    config: &Path,
    join_token: Option<&str>,
) -> (i32, String) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("stderr");
    let mut command = runner_command(server, config, &log);
    if let Some(token) = join_token {
        command.args(["--join-token", token]);
    }
    let mut child = Proc(command.spawn().unwrap());
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the runner was expected to stop, and still runs: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    (
        status.code().unwrap_or(-1),
        std::fs::read_to_string(&log).unwrap_or_default(),
    )
}
