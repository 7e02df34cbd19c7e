//! The portal in a real browser: headless Chromium, driven by
//! tests/browser/portal_e2e.mjs over playwright-core, logs in as an approver, sees the
//! agent's risk:high request appear live (no reload), reads the reason as text (a `<script>`
//! in it stays inert), approves it, sees the result arrive live, and finds the log's newest
//! signed checkpoint in the audit view. The Rust side makes the agent's call, then checks what
//! the browser cannot: the agent's answer, one execution, the audit trail, that the checkpoint
//! shown is the stored tree's, and the CSP and login refusal over plain HTTP.
//!
//! Screenshots (01-login … 06-audit-checkpoint, 99-failure on a failure) are kept under
//! target/portal-e2e/ as test artifacts.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use emisar::server::audit::checkpoints::{self, TransparencyConfig};
use emisar::server::principal::Role;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::approvals::{
    add_user, call_in_background, kinds_and_actors, restart_app, restart_args, restarts,
    systemctl_standin,
};
use crate::harness::Backend;
use crate::harness::app::Options;
use crate::harness::tools::{Proc, require};

const TOOL: &str = "linux.systemctl_restart";
/// The agent's reason: markup that must reach the page as text and never run.
const REASON: &str = "consul on hvn05 wedged <script>window.__xss=1</script> after upgrade";
pub(crate) const CHROMIUM: &str = "/usr/bin/chromium";
/// The whole browser part, from spawning the driver to its exit (the driver caps itself at 60 s).
pub(crate) const BROWSER_BUDGET: Duration = Duration::from_secs(90);
const SCREENSHOTS: [&str; 6] = [
    "01-login.png",
    "02-approvals-empty.png",
    "03-pending.png",
    "04-detail.png",
    "05-executed.png",
    "06-audit-checkpoint.png",
];
/// The origin (and log key name) of the checkpoints the audit view shows.
const LOG_ORIGIN: &str = "emisar.test/portal";

/// Like `require`, for what scripts/install-test-deps puts outside `.tools`.
pub(crate) fn require_path(path: &Path) -> PathBuf {
    assert!(
        path.exists(),
        "{} is missing: run scripts/install-test-deps (or scripts/test) first",
        path.display()
    );
    path.to_owned()
}

/// The driver process, its stdout as lines on a channel and its stderr collected.
pub(crate) struct Driver {
    proc: Proc,
    lines: mpsc::UnboundedReceiver<String>,
    seen: Vec<String>,
    stderr: Arc<Mutex<String>>,
}

impl Driver {
    /// Runs `script` (relative to the repository) with Node.
    pub(crate) fn spawn(repo: &Path, node: &Path, script: &str, env: &[(&str, String)]) -> Driver {
        let mut cmd = Command::new(node);
        cmd.arg(script)
            .current_dir(repo)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("node starts");
        let stdout = child.stdout.take().unwrap();
        let mut stderr = child.stderr.take().unwrap();
        let (tx, lines) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let collected = Arc::new(Mutex::new(String::new()));
        let sink = collected.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stderr.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        Driver {
            proc: Proc(child),
            lines,
            seen: Vec::new(),
            stderr: collected,
        }
    }

    /// Everything the driver said so far, for a failure message.
    pub(crate) fn transcript(&self) -> String {
        // Give the stderr reader a moment to catch up with a driver that just failed.
        std::thread::sleep(Duration::from_millis(200));
        format!(
            "driver stdout so far: {:?}\n--- driver stderr ---\n{}--- end of driver stderr ---",
            self.seen,
            self.stderr.lock().unwrap()
        )
    }

    /// The next stdout line; `None` once the driver closed its stdout (it exited).
    async fn next_line(&mut self) -> Option<String> {
        let line = self.lines.recv().await?;
        self.seen.push(line.clone());
        Some(line)
    }

    /// The next line, or a failure that says what was expected and what the driver said.
    pub(crate) async fn expect_line(&mut self, what: &str) -> String {
        match self.next_line().await {
            Some(line) => line,
            None => {
                let status = self.wait_exit().await;
                panic!(
                    "the browser driver exited ({status}) while the test waited for {what}\n{}",
                    self.transcript()
                )
            }
        }
    }

    pub(crate) async fn expect_json(&mut self, what: &str) -> Value {
        let line = self.expect_line(what).await;
        serde_json::from_str(&line).unwrap_or_else(|e| {
            panic!(
                "expected {what} from the driver, got {line:?} ({e})\n{}",
                self.transcript()
            )
        })
    }

    pub(crate) async fn wait_exit(&mut self) -> std::process::ExitStatus {
        loop {
            if let Some(status) = self.proc.0.try_wait().unwrap() {
                return status;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

pub(crate) fn assert_png(path: &Path) {
    let bytes = std::fs::read(path)
        .unwrap_or_else(|e| panic!("screenshot {} is missing: {e}", path.display()));
    assert!(
        bytes.len() > 8 && bytes.starts_with(b"\x89PNG\r\n\x1a\n"),
        "screenshot {} is not a non-empty PNG ({} bytes)",
        path.display(),
        bytes.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approver_approves_in_a_real_browser() {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    // The tools first: a machine without them fails here, saying how to install them.
    let node = require("node/bin/node");
    let chromium = require_path(Path::new(CHROMIUM));
    require_path(&repo.join("tests/browser/node_modules/playwright-core/package.json"));

    let bin = tempfile::tempdir().unwrap();
    let record = systemctl_standin(bin.path());
    // The log signs checkpoints (no witnesses here: tests/it/transparency.rs has them), for
    // the audit view to show.
    let keys = tempfile::tempdir().unwrap();
    let log_key = keys.path().join("log.key");
    checkpoints::log_keygen(LOG_ORIGIN, &log_key).unwrap();
    let options = Options {
        transparency: Some(TransparencyConfig {
            log_key_file: log_key,
            checkpoint_interval_ms: 100,
            checkpoint_every_events: 1,
            witnesses: vec![],
            witness_quorum: None,
        }),
        ..Default::default()
    };
    let app = restart_app(Backend::Sqlite, bin.path(), options).await;
    let password = add_user(&app, "alice", Role::Approver).await;
    let base = app.base_url();

    // Plain HTTP first: the page's strict CSP, and a wrong password is refused.
    let http = reqwest::Client::new();
    let res = http.get(format!("{base}/")).send().await.unwrap();
    assert_eq!(res.status(), 200);
    let csp = res
        .headers()
        .get("content-security-policy")
        .expect("GET / carries a Content-Security-Policy")
        .to_str()
        .unwrap()
        .to_owned();
    assert!(csp.contains("script-src 'self'"), "{csp}");
    assert!(csp.contains("default-src 'none'"), "{csp}");
    assert!(!csp.contains("unsafe-inline"), "{csp}");
    assert!(!csp.contains("unsafe-eval"), "{csp}");
    let res = http
        .post(format!("{base}/api/login"))
        .json(&json!({"name": "alice", "password": "not-alice-s-password"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 401, "a wrong password is refused");
    assert!(
        res.headers().get("set-cookie").is_none(),
        "no session for a wrong password"
    );

    // Screenshots are kept as artifacts; clear the previous run's.
    let shots = repo.join("target/portal-e2e");
    std::fs::create_dir_all(&shots).unwrap();
    for entry in std::fs::read_dir(&shots).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "png") {
            std::fs::remove_file(&path).unwrap();
        }
    }
    // Chromium's profile goes to a temporary directory removed with the test.
    let tmp = tempfile::tempdir().unwrap();
    let mut driver = Driver::spawn(
        &repo,
        &node,
        "tests/browser/portal_e2e.mjs",
        &[
            ("PORTAL_URL", format!("{base}/")),
            ("PORTAL_USER", "alice".into()),
            ("PORTAL_PASSWORD", password),
            ("SCREENSHOT_DIR", shots.display().to_string()),
            ("EXPECT_TOOL", TOOL.into()),
            ("EXPECT_REASON_SUBSTRING", REASON.into()),
            ("EXPECT_CHECKPOINT_ORIGIN", LOG_ORIGIN.into()),
            ("CHROMIUM", chromium.display().to_string()),
            ("TMPDIR", tmp.path().display().to_string()),
        ],
    );

    let client = app.mcp_client().await;
    let browser = async {
        let ready = driver.expect_line("READY").await;
        assert_eq!(ready, "READY", "{}", driver.transcript());
        let asked = Instant::now();
        let call = call_in_background(&client, TOOL, restart_args(REASON));

        // The request appears in the open portal page, without a reload. The driver's clock
        // starts when it prints READY, before this test has even read that line and made the
        // agent's call, and stops when a 50 ms poll of the page finds the row; so the number
        // is an upper bound on request → visible. It is printed, and bounded only for
        // liveness: a page that needs a reload never shows the row at all, and the speed
        // itself is a budget for scripts/bench, not for a functional test.
        let appeared = driver.expect_json("{\"appeared_ms\": N}").await;
        let seen_here = asked.elapsed();
        let appeared_ms = appeared["appeared_ms"]
            .as_u64()
            .unwrap_or_else(|| panic!("no appeared_ms in {appeared}\n{}", driver.transcript()));
        eprintln!(
            "portal_browser: pending row appeared {appeared_ms} ms after READY \
             (the test heard of it {} ms after starting the call)",
            seen_here.as_millis()
        );
        assert!(
            appeared_ms < 30_000,
            "the pending request took {appeared_ms} ms to appear in the portal\n{}",
            driver.transcript()
        );

        let checkpoint = driver.expect_json("{\"checkpoint\": …}").await;
        let done = driver
            .expect_json("{\"done\": true, \"state\": \"executed\"}")
            .await;
        assert_eq!(
            done,
            json!({"done": true, "state": "executed"}),
            "{}",
            driver.transcript()
        );
        let status = driver.wait_exit().await;
        assert!(
            status.success(),
            "the browser driver exited with {status}\n{}",
            driver.transcript()
        );
        // The agent's call, which returns once the approved restart ran.
        (
            call.await.expect("the agent's call completes"),
            checkpoint["checkpoint"].clone(),
        )
    };
    let (res, checkpoint) = match tokio::time::timeout(BROWSER_BUDGET, browser).await {
        Ok(res) => res,
        Err(_) => panic!(
            "the browser test (and the agent's call) did not finish within \
             {BROWSER_BUDGET:?}\n{}",
            driver.transcript()
        ),
    };

    // The agent got the approved call's result.
    assert_eq!(res.is_error, Some(false), "{res:?}");
    let out = res.structured_content.unwrap();
    assert_eq!(out["approval"]["state"], "executed", "{out}");
    assert_eq!(out["results"][0]["runner"], "hvn05", "{out}");
    let id = out["approval"]["approval_id"].as_str().unwrap().to_owned();
    assert_eq!(restarts(&record), 1, "exactly one restart ran");

    let trail = kinds_and_actors(&app, &id).await;
    assert_eq!(
        trail,
        [
            ("tool.called".into(), "agent:test-agent".into()),
            ("approval.requested".into(), "agent:test-agent".into()),
            ("approval.approved".into(), "approver:alice".into()),
            ("approval.executing".into(), "approver:alice".into()),
            ("call.executed".into(), "agent:test-agent".into()),
        ]
    );
    // The note typed into the page is kept with the yes (the driver checked the page shows it).
    let approved = app
        .events(emisar::server::audit::AuditFilter {
            approval_id: Some(id.clone()),
            kind: Some("approval.approved".into()),
            ..Default::default()
        })
        .await;
    assert_eq!(
        approved[0].detail.as_ref().unwrap()["note"],
        "checked the preview <b>not bold</b>"
    );
    app.verify_with_cli();

    // The audit view showed a checkpoint the log key signed, as stored: its size and root are
    // those of the tree, and it offers the signed note to keep.
    let size = checkpoint["size"].as_u64().unwrap_or(0);
    assert!(size >= 1, "{checkpoint}");
    let root = emisar::server::audit::tree::root(&app.db, size)
        .await
        .unwrap();
    {
        use base64::Engine;
        assert_eq!(
            checkpoint["root"],
            base64::engine::general_purpose::STANDARD.encode(root.0),
            "the page shows the root of the tree of {size} events"
        );
    }
    assert_eq!(checkpoint["witnesses"], "no witness yet", "{checkpoint}");
    assert_eq!(checkpoint["download"], "/api/audit/checkpoint");

    for name in SCREENSHOTS {
        assert_png(&shots.join(name));
    }
    assert!(
        !shots.join("99-failure.png").exists(),
        "the driver took a failure screenshot"
    );
    client.cancel().await.unwrap();
}
