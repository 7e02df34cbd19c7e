//! A real VictoriaMetrics (Debian's victoria-metrics) on a loopback port it is checked to
//! hold, with its own data directory, stopped by PID on drop.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::tools::{listens_on, reserved_port};

pub struct VictoriaMetrics {
    child: Child,
    pub url: String,
    _dir: tempfile::TempDir,
}

impl VictoriaMetrics {
    /// VictoriaMetrics cannot be handed a listening socket nor report a port it chose, so it
    /// gets a [`reserved_port`]; one that could not bind it, or whose port answers for another
    /// process, is stopped and started again on another.
    pub async fn start() -> VictoriaMetrics {
        Self::start_with(&[]).await
    }

    /// [`VictoriaMetrics::start`] with more flags (`-promscrape.config=…` to scrape).
    pub async fn start_with(flags: &[String]) -> VictoriaMetrics {
        let bin = std::path::Path::new("/usr/bin/victoria-metrics");
        assert!(
            bin.exists(),
            "victoria-metrics is missing: run scripts/install-test-deps"
        );
        for _ in 0..20 {
            if let Some(vm) = Self::try_start(bin, flags).await {
                return vm;
            }
        }
        panic!("no free loopback port for victoria-metrics in 20 attempts");
    }

    async fn try_start(bin: &std::path::Path, flags: &[String]) -> Option<VictoriaMetrics> {
        let dir = tempfile::tempdir().unwrap();
        let port = reserved_port();
        let log_path = dir.path().join("vm.log");
        let log = std::fs::File::create(&log_path).unwrap();
        let child = Command::new(bin)
            .arg(format!("-httpListenAddr=127.0.0.1:{port}"))
            .arg(format!(
                "-storageDataPath={}",
                dir.path().join("data").display()
            ))
            .args(["-retentionPeriod=1d", "-search.latencyOffset=0s"])
            .args(flags)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("failed to start victoria-metrics");
        let mut vm = VictoriaMetrics {
            child,
            url: format!("http://127.0.0.1:{port}"),
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        let http = reqwest::Client::new();
        loop {
            if vm.child.try_wait().unwrap().is_some() {
                let text = std::fs::read_to_string(&log_path).unwrap_or_default();
                assert!(
                    text.contains("address already in use"),
                    "victoria-metrics exited:\n{text}"
                );
                return None;
            }
            if let Ok(r) = http.get(format!("{}/health", vm.url)).send().await
                && r.status().is_success()
            {
                return listens_on(vm.child.id(), port).then_some(vm);
            }
            assert!(
                Instant::now() < deadline,
                "victoria-metrics did not become healthy within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Imports Prometheus text-format samples and waits until `probe` (a query) finds them.
    pub async fn push(&self, text: &str, probe: &str) {
        let http = reqwest::Client::new();
        let r = http
            .post(format!("{}/api/v1/import/prometheus", self.url))
            .body(text.to_owned())
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "import failed: {}", r.status());
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            http.get(format!("{}/internal/force_flush", self.url))
                .send()
                .await
                .unwrap();
            let found: serde_json::Value = http
                .get(format!("{}/api/v1/query", self.url))
                .query(&[("query", probe)])
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            if found["data"]["result"]
                .as_array()
                .is_some_and(|r| !r.is_empty())
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "pushed samples not searchable within 30 s: {found}"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

impl Drop for VictoriaMetrics {
    fn drop(&mut self) {
        // Bounded: a process that never finishes its SIGTERM shutdown is killed.
        emisar::util::process::stop_child(&mut self.child, std::time::Duration::from_secs(10));
    }
}
