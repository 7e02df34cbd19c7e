//! The lab's metrics: a real VictoriaMetrics (Debian's `victoria-metrics`) holding the
//! edge's request counters, so `vm.query_instant` evaluates real PromQL/MetricsQL over them.
//!
//! The counters are what each node's Traefik would export (`traefik_service_requests_total`
//! per service, code and instance), generated from the incident's traffic: a steady rate per
//! service with a slow wiggle, so `rate(...[2m])` lands near the rate and never exactly on it.
//! The last half hour is imported at start-up and a new sample follows every 15 s. Metrics
//! follow the real clock (VictoriaMetrics evaluates queries at real time), not the lab clock.
//!
//! Invariant: the process is stopped by its PID when the lab stops, and a watchdog shell
//! stops it if the lab process dies without stopping it.

// The lab is the documented exception to "only node/exec.rs starts processes" (clippy.toml,
// tests/it/tidy.rs PROCESS_STARTERS): it runs a real VictoriaMetrics and its watchdog.
#![allow(clippy::disallowed_methods)]

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, bail};
use tokio_util::sync::CancellationToken;

/// How often the lab "scrapes" (adds a sample to every counter).
const SCRAPE: Duration = Duration::from_secs(15);
/// How much history is there at start-up.
const HISTORY: Duration = Duration::from_secs(30 * 60);

/// Requests per second per service across the edge, and the nodes that serve them.
#[derive(Debug, Clone)]
pub struct Traffic {
    /// (service as Traefik labels it, requests/s, share answered 504 by the backend)
    pub services: Vec<(String, f64, f64)>,
    pub nodes: Vec<String>,
    /// Counters start here (so they are large and positive).
    pub origin: SystemTime,
}

impl Traffic {
    /// Prometheus text-format samples of every counter at `t` (with its timestamp).
    pub fn samples(&self, t: SystemTime) -> String {
        let secs = t
            .duration_since(self.origin)
            .unwrap_or_default()
            .as_secs_f64();
        let ms = t
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis();
        let mut out = String::new();
        let n = self.nodes.len().max(1) as f64;
        for (si, (service, rate, slow)) in self.services.iter().enumerate() {
            for (ni, node) in self.nodes.iter().enumerate() {
                for (code, share) in [("200", 1.0 - slow), ("504", *slow)] {
                    if share <= 0.0 {
                        continue;
                    }
                    let r = rate * share / n;
                    // A counter whose rate wiggles by up to 2 % over ten minutes, each series
                    // out of phase with the others; its derivative stays positive.
                    let period = 600.0;
                    let phase = (si * 7 + ni * 3) as f64;
                    let w = 2.0 * std::f64::consts::PI / period;
                    let value = r * secs + r * 0.02 * ((w * secs + phase).sin() - phase.sin()) / w;
                    out.push_str(&format!(
                        "traefik_service_requests_total{{service=\"{service}\",code=\"{code}\",method=\"GET\",protocol=\"http\",instance=\"{node}:8080\",job=\"traefik\"}} {:.0} {ms}\n",
                        value.floor()
                    ));
                }
            }
        }
        out
    }
}

pub struct Vm {
    child: Child,
    watchdog: Option<Child>,
    pub url: String,
}

/// `explicit`, or `victoria-metrics` on PATH, or Debian's /usr/bin/victoria-metrics.
pub fn find(explicit: Option<&Path>) -> Option<PathBuf> {
    if let Some(p) = explicit {
        return Some(p.to_owned());
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join("victoria-metrics"))
        .chain([PathBuf::from("/usr/bin/victoria-metrics")])
        .find(|p| p.is_file())
}

impl Vm {
    /// Starts VictoriaMetrics on a free loopback port with its data under `dir`.
    pub async fn start(bin: &Path, dir: &Path) -> anyhow::Result<Vm> {
        if !bin.is_file() {
            bail!(
                "victoria-metrics not found at {} (apt-get install victoria-metrics, or pass --victoria-metrics PATH)",
                bin.display()
            );
        }
        std::fs::create_dir_all(dir)
            .with_context(|| format!("failed to create {}", dir.display()))?;
        // VictoriaMetrics cannot be told to bind :0 and report the port, so it gets a port
        // that was free a moment ago; if another process took it meanwhile, VM exits and the
        // next attempt takes another.
        let mut last_error = String::new();
        for _ in 0..5 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")?
                .local_addr()?
                .port();
            let log = std::fs::File::create(dir.join("victoria-metrics.log"))?;
            let child = Command::new(bin)
                .arg(format!("-httpListenAddr=127.0.0.1:{port}"))
                .arg(format!("-storageDataPath={}", dir.join("data").display()))
                .args([
                    "-retentionPeriod=1d",
                    "-search.latencyOffset=0s",
                    "-loggerLevel=WARN",
                ])
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()
                .with_context(|| format!("failed to start {}", bin.display()))?;
            let mut vm = Vm {
                child,
                watchdog: None,
                url: format!("http://127.0.0.1:{port}"),
            };
            vm.watchdog = vm.watchdog().ok();
            match vm.wait_healthy().await {
                Ok(()) => return Ok(vm),
                Err(e) => last_error = e,
            }
        }
        bail!(
            "victoria-metrics did not start: {last_error}; its log is {}",
            dir.join("victoria-metrics.log").display()
        )
    }

    /// Stops VictoriaMetrics by its PID if this process dies without stopping it; ends by
    /// itself within a second of VictoriaMetrics stopping.
    fn watchdog(&self) -> std::io::Result<Child> {
        let script = format!(
            "while kill -0 {me} 2>/dev/null && kill -0 {pid} 2>/dev/null; do sleep 1; done; \
             kill -0 {me} 2>/dev/null || kill -TERM {pid} 2>/dev/null",
            me = std::process::id(),
            pid = self.child.id()
        );
        Command::new("sh")
            .arg("-c")
            .arg(script)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
    }

    async fn wait_healthy(&mut self) -> Result<(), String> {
        let http = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("it exited with {status}"));
            }
            if let Ok(r) = http.get(format!("{}/health", self.url)).send().await
                && r.status().is_success()
                && r.text().await.is_ok_and(|t| t.trim() == "OK")
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err("it did not answer /health within 30 s".into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Imports `text` (Prometheus text format with timestamps) and makes it searchable.
    pub async fn import(&self, text: String) -> anyhow::Result<()> {
        let http = reqwest::Client::new();
        let r = http
            .post(format!("{}/api/v1/import/prometheus", self.url))
            .body(text)
            .send()
            .await?;
        if !r.status().is_success() {
            bail!(
                "victoria-metrics refused the import: HTTP {} {}",
                r.status(),
                r.text().await.unwrap_or_default()
            );
        }
        http.get(format!("{}/internal/force_flush", self.url))
            .send()
            .await?;
        Ok(())
    }

    /// The last half hour of traffic, then waits until a rate query sees it.
    pub async fn backfill(&self, traffic: &Traffic) -> anyhow::Result<()> {
        let now = SystemTime::now();
        let mut text = String::new();
        let mut t = now - HISTORY;
        while t <= now {
            text.push_str(&traffic.samples(t));
            t += SCRAPE;
        }
        self.import(text).await?;
        let http = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let found: serde_json::Value = http
                .get(format!("{}/api/v1/query", self.url))
                .query(&[("query", "sum(rate(traefik_service_requests_total[2m]))")])
                .send()
                .await?
                .json()
                .await?;
            if found["data"]["result"]
                .as_array()
                .is_some_and(|r| !r.is_empty())
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("imported samples not searchable within 30 s: {found}");
            }
            http.get(format!("{}/internal/force_flush", self.url))
                .send()
                .await?;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// A new sample of every counter every 15 s until `stop`.
    pub fn feed(&self, traffic: Traffic, stop: CancellationToken) {
        let url = self.url.clone();
        tokio::spawn(async move {
            let vm = Feeder { url };
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(SCRAPE) => {}
                }
                if let Err(e) = vm.push(traffic.samples(SystemTime::now())).await {
                    tracing::warn!(error = %e, "lab: could not add samples to victoria-metrics");
                }
            }
        });
    }
}

struct Feeder {
    url: String,
}

impl Feeder {
    async fn push(&self, text: String) -> reqwest::Result<()> {
        reqwest::Client::new()
            .post(format!("{}/api/v1/import/prometheus", self.url))
            .body(text)
            .send()
            .await?
            .error_for_status()?;
        Ok(())
    }
}

/// How long VictoriaMetrics gets to stop after SIGTERM before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(10);

impl Drop for Vm {
    fn drop(&mut self) {
        if !crate::util::process::stop_child(&mut self.child, STOP_GRACE) {
            tracing::warn!(
                "VictoriaMetrics did not stop within {STOP_GRACE:?} of SIGTERM: killed it"
            );
        }
        if let Some(mut w) = self.watchdog.take() {
            let _ = w.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A VictoriaMetrics that ignores SIGTERM is killed after the grace period, and dropping
    /// the lab returns instead of waiting for it forever.
    #[test]
    fn a_victoria_metrics_that_ignores_sigterm_is_killed_when_the_lab_drops() {
        let child = Command::new("sh")
            .args(["-c", "trap '' TERM; while :; do sleep 1; done"])
            .spawn()
            .expect("sh");
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        std::thread::sleep(Duration::from_millis(200)); // let the trap be set
        drop(Vm {
            child,
            watchdog: None,
            url: String::new(),
        });
        // Reaped by the drop: the pid no longer exists.
        assert_eq!(
            nix::sys::signal::kill(pid, None),
            Err(nix::errno::Errno::ESRCH),
            "the process that ignored SIGTERM is still there after the drop"
        );
    }
}
