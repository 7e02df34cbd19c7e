//! A real vmalert (Debian's victoria-metrics package) evaluating a rules file against a
//! VictoriaMetrics, on a loopback port it is checked to hold, stopped by PID on drop.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::tools::{listens_on, reserved_port};

const BIN: &str = "/usr/bin/vmalert";

pub struct VmAlert {
    child: Child,
    pub url: String,
    log: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl VmAlert {
    /// Evaluates `rules` every second against `datasource` (a VictoriaMetrics URL) and sends
    /// what fires to the Alertmanager API at `notifier`.
    pub async fn start(rules: &Path, datasource: &str, notifier: &str) -> VmAlert {
        assert!(
            Path::new(BIN).exists(),
            "vmalert is missing: run scripts/install-test-deps (Debian package victoria-metrics)"
        );
        for _ in 0..20 {
            if let Some(vmalert) = Self::try_start(rules, datasource, notifier).await {
                return vmalert;
            }
        }
        panic!("no free loopback port for vmalert in 20 attempts");
    }

    async fn try_start(rules: &Path, datasource: &str, notifier: &str) -> Option<VmAlert> {
        let dir = tempfile::tempdir().unwrap();
        let port = reserved_port();
        let log = dir.path().join("vmalert.log");
        let file = std::fs::File::create(&log).unwrap();
        let child = Command::new(BIN)
            .arg(format!("-rule={}", rules.display()))
            .arg(format!("-datasource.url={datasource}"))
            .arg(format!("-notifier.url={notifier}"))
            .arg(format!("-httpListenAddr=127.0.0.1:{port}"))
            .arg("-evaluationInterval=1s")
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .expect("failed to start vmalert");
        let mut vmalert = VmAlert {
            child,
            url: format!("http://127.0.0.1:{port}"),
            log,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        let http = reqwest::Client::new();
        loop {
            if vmalert.child.try_wait().unwrap().is_some() {
                let text = vmalert.log_text();
                assert!(
                    text.contains("address already in use"),
                    "vmalert exited:\n{text}"
                );
                return None;
            }
            if let Ok(r) = http.get(format!("{}/health", vmalert.url)).send().await
                && r.status().is_success()
            {
                return listens_on(vmalert.child.id(), port).then_some(vmalert);
            }
            assert!(
                Instant::now() < deadline,
                "vmalert did not become healthy within 30 s:\n{}",
                vmalert.log_text()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// What vmalert logged so far (for a failure's message).
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The alerts vmalert holds now (`GET /api/v1/alerts`), pending and firing.
    pub async fn alerts(&self) -> Vec<serde_json::Value> {
        let answer: serde_json::Value = reqwest::get(format!("{}/api/v1/alerts", self.url))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        answer["data"]["alerts"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }
}

impl Drop for VmAlert {
    fn drop(&mut self) {
        emisar::util::process::stop_child(&mut self.child, Duration::from_secs(10));
    }
}
