//! `emisar lab` start-up: the lab's services, the stand-in scripts, then the server with its
//! five runners through `dev::start`; prints where everything is and writes `dev.json`.
//!
//! Each start replays the incident from the top: the lab's database, stand-ins and metrics
//! under the state directory are recreated (the server's keys are kept). A state directory
//! the lab did not create is refused rather than emptied.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::clock::LabClock;
use super::consul::Consul;
use super::http::serve_until;
use super::node::{NodeState, STANDINS, World};
use super::nomad::Nomad;
use super::scenario::{self, NODES};
use super::standin::TOKEN_ENV;
use super::traefik::Traefik;
use super::vip::Vip;
use super::vm::{self, Vm};
use crate::dev::{self, Stack};
use crate::node::config::{RunnerConfig, ServiceConfig};

/// The file that marks a directory as the lab's own.
const MARKER: &str = "lab.json";

pub struct LabOptions {
    pub state_dir: PathBuf,
    pub listen: String,
    /// How fast lab time runs: 1 is real time, 0 freezes it (tests advance it by hand).
    pub speed: f64,
    /// The `emisar` binary the stand-ins run (default: this executable).
    pub standin_exe: Option<PathBuf>,
    /// The VictoriaMetrics binary (default: `victoria-metrics` on PATH or /usr/bin).
    pub victoria_metrics: Option<PathBuf>,
}

/// A running lab: its services and the server with its runners, built and listening.
pub struct Lab {
    pub clock: Arc<LabClock>,
    pub consul: Arc<Consul>,
    pub nomad: Arc<Nomad>,
    pub world: Arc<World>,
    /// The anycast VIP and the probe at it.
    pub vip: Arc<Vip>,
    /// What `dev.json` holds.
    pub info: Value,
    pub dev_json: PathBuf,
    /// Why vm.query_instant cannot answer, when VictoriaMetrics is missing.
    pub metrics_missing: Option<String>,
    /// How long start-up took.
    pub started_in: Duration,
    stack: Stack,
    stop: CancellationToken,
    _vm: Option<Vm>,
    /// Holds the port vm.query_instant is refused on when VictoriaMetrics is missing.
    _no_metrics: Option<tokio::net::TcpSocket>,
}

fn random_token() -> anyhow::Result<String> {
    let mut bytes = [0u8; 24];
    getrandom::fill(&mut bytes).map_err(|e| anyhow::anyhow!("no randomness: {e}"))?;
    Ok(hex::encode(bytes))
}

/// Makes `dir` a fresh lab directory: creates it, or resets the lab's files in it.
fn prepare_state_dir(dir: &Path) -> anyhow::Result<PathBuf> {
    if dir.exists() {
        let empty = std::fs::read_dir(dir)
            .with_context(|| format!("failed to read {}", dir.display()))?
            .next()
            .is_none();
        if !empty && !dir.join(MARKER).exists() {
            bail!(
                "--state-dir {} is not empty and is not a lab directory (it has no {MARKER}); give a new or empty directory",
                dir.display()
            );
        }
    }
    std::fs::create_dir_all(dir).with_context(|| format!("failed to create {}", dir.display()))?;
    let dir = dir.canonicalize()?;
    for file in [
        "emisar.db",
        "emisar.db-wal",
        "emisar.db-shm",
        "approver.password",
        "dev.json",
    ] {
        let path = dir.join(file);
        if path.exists() {
            std::fs::remove_file(&path)
                .with_context(|| format!("failed to remove {}", path.display()))?;
        }
    }
    for sub in ["nodes", "victoria-metrics"] {
        let path = dir.join(sub);
        if path.exists() {
            std::fs::remove_dir_all(&path)
                .with_context(|| format!("failed to remove {}", path.display()))?;
        }
    }
    std::fs::write(
        dir.join(MARKER),
        "{\"created_by\": \"emisar lab\", \"note\": \"each start of the lab resets this directory\"}\n",
    )?;
    Ok(dir)
}

/// Writes the per-node stand-in scripts; returns each node's bin directory.
fn write_standins(
    dir: &Path,
    exe: &Path,
    control: &str,
    token: &str,
) -> anyhow::Result<BTreeMap<String, PathBuf>> {
    let mut out = BTreeMap::new();
    for node in NODES {
        let bin = dir.join("nodes").join(node).join("bin");
        std::fs::create_dir_all(&bin)?;
        std::fs::set_permissions(dir.join("nodes"), std::fs::Permissions::from_mode(0o700))?;
        for program in STANDINS {
            // The runner clears the environment, so the script carries the lab's token; it
            // is readable by its owner only, like dev.json.
            let script = format!(
                "#!/bin/sh\n# emisar lab: `{program}` on {node}, answered by the lab process.\nexport {TOKEN_ENV}='{token}'\nexec '{exe}' lab-exec --control '{control}' --node '{node}' -- '{program}' \"$@\"\n",
                exe = exe.display(),
            );
            let path = bin.join(program);
            std::fs::write(&path, script)?;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700))?;
        }
        out.insert(node.to_owned(), bin);
    }
    Ok(out)
}

/// Gives each node its own `/etc` under `dir` (`nodes/<node>/etc`), with the files the
/// lab's agents read when restarted: `nomad.d/nomad.hcl`.
fn with_etc(nodes: Vec<NodeState>, dir: &Path) -> anyhow::Result<Vec<NodeState>> {
    nodes
        .into_iter()
        .map(|mut node| {
            let etc = dir.join("nodes").join(&node.name).join("etc");
            std::fs::create_dir_all(etc.join("nomad.d"))?;
            std::fs::write(
                etc.join("nomad.d/nomad.hcl"),
                scenario::nomad_config(&node.name),
            )?;
            node.etc = Some(etc);
            Ok(node)
        })
        .collect()
}

/// Starts the lab; `shutdown` stops everything it started.
pub async fn start(opts: LabOptions, shutdown: CancellationToken) -> anyhow::Result<Lab> {
    let began = Instant::now();
    let clock = Arc::new(LabClock::new(opts.speed).map_err(|e| anyhow::anyhow!("--{e}"))?);
    let dir = prepare_state_dir(&opts.state_dir)?;
    let stop = shutdown.child_token();
    let start = clock.started();

    let consul_token = random_token()?;
    let nomad_token = random_token()?;
    let consul = scenario::consul(&consul_token, clock.clone());
    let nomad = scenario::nomad(&nomad_token, clock.clone());
    let consul_url = serve_until(consul.clone().router(), stop.clone()).await?;
    // Each node's runner reaches its own node's agent, as at 127.0.0.1:8500.
    let mut consul_agents = BTreeMap::new();
    for node in NODES {
        let url = serve_until(consul.clone().agent_router(node), stop.clone()).await?;
        consul_agents.insert(node.to_owned(), url);
    }
    let nomad_url = serve_until(nomad.clone().router(), stop.clone()).await?;

    let site = Arc::new(scenario::site(start));
    let mut traefik = BTreeMap::new();
    for node in NODES {
        traefik.insert(
            node.to_owned(),
            Traefik::bind(node, site.clone(), stop.clone())?,
        );
    }
    let world = Arc::new(World::new(
        clock.clone(),
        consul.clone(),
        nomad.clone(),
        traefik.clone(),
        with_etc(scenario::nodes(start), &dir)?,
    ));
    world.sync();
    spawn_sync(world.clone(), stop.clone());
    let vip = Vip::new(world.clone());
    vip.clone().spawn(stop.clone());
    let vip_url = serve_until(vip.clone().router(), stop.clone()).await?;

    let control_token = random_token()?;
    let control_url = serve_until(
        world.clone().control_router(control_token.clone()),
        stop.clone(),
    )
    .await?;
    let exe = match opts.standin_exe {
        Some(p) => p,
        None => std::env::current_exe().context("cannot find this executable for the stand-ins")?,
    };
    let bins = write_standins(&dir, &exe, &control_url, &control_token)?;

    // Metrics: a real VictoriaMetrics when there is one; otherwise vm.query_instant is
    // refused on a bound port nothing listens on, and the start-up says why.
    let traffic = scenario::traffic(start);
    let (vm, vm_url, metrics_missing, no_metrics) = match vm::find(opts.victoria_metrics.as_deref())
    {
        Some(bin) => {
            let vm = Vm::start(&bin, &dir.join("victoria-metrics")).await?;
            vm.backfill(&traffic).await?;
            vm.feed(traffic, stop.clone());
            let url = vm.url.clone();
            (Some(vm), url, None, None)
        }
        None => {
            let socket = tokio::net::TcpSocket::new_v4()?;
            socket.bind("127.0.0.1:0".parse().expect("a socket address"))?;
            let url = format!("http://{}", socket.local_addr()?);
            let why = "victoria-metrics is not installed (apt-get install victoria-metrics, or pass --victoria-metrics PATH): vm.query_instant will be refused".to_owned();
            (None, url, Some(why), Some(socket))
        }
    };

    let mut runners = Vec::new();
    for node in NODES {
        let mut c = RunnerConfig::with_name(node);
        c.listen = "127.0.0.1:0".into();
        c.labels = BTreeMap::from([("role".into(), "edge".into()), ("dc".into(), "dc1".into())]);
        c.exec_path = format!("{}:/usr/bin:/bin", bins[node].display());
        let service = |url: &str, header: Option<(&str, &str)>| ServiceConfig {
            base_url: url.to_owned(),
            headers: header
                .map(|(k, v)| BTreeMap::from([(k.to_owned(), v.to_owned())]))
                .unwrap_or_default(),
        };
        c.services = BTreeMap::from([
            ("traefik".to_owned(), service(&traefik[node].url(), None)),
            (
                "consul".to_owned(),
                service(
                    &consul_agents[node],
                    Some(("X-Consul-Token", &consul_token)),
                ),
            ),
            (
                "nomad".to_owned(),
                service(&nomad_url, Some(("X-Nomad-Token", &nomad_token))),
            ),
            ("victoriametrics".to_owned(), service(&vm_url, None)),
        ]);
        c.allowlists = BTreeMap::from([(
            "systemd_units".to_owned(),
            vec!["consul".to_owned(), "nomad".to_owned()],
        )]);
        runners.push(c);
    }
    let stack = dev::start(
        &dir,
        dev::StackOptions {
            listen: opts.listen.clone(),
            packs_dir: None,
            runners,
            approvers_file: None,
            policy_file: None,
            // The lab replays an incident; its log is a hash chain, as before.
            witness: false,
        },
        stop.clone(),
    )
    .await?;

    let mut info = stack.info();
    info["lab"] = json!({
        "speed": clock.speed(),
        "consul_url": consul_url,
        "consul_agent_urls": consul_agents,
        "consul_token": consul_token,
        "nomad_url": nomad_url,
        "nomad_token": nomad_token,
        "victoriametrics_url": vm_url,
        "traefik_urls": traefik.iter().map(|(n, t)| (n.clone(), t.url())).collect::<BTreeMap<_, _>>(),
        "control_url": control_url,
        "vip_probe_url": vip_url,
        "metrics_missing": metrics_missing,
    });
    let dev_json = stack.write_info(&info)?;
    Ok(Lab {
        clock,
        consul,
        nomad,
        world,
        vip,
        info,
        dev_json,
        metrics_missing,
        started_in: began.elapsed(),
        stack,
        stop,
        _vm: vm,
        _no_metrics: no_metrics,
    })
}

/// Keeps every node's Traefik in step with Nomad: on each change, and every second for
/// changes a rolling update scheduled in lab time.
fn spawn_sync(world: Arc<World>, stop: CancellationToken) {
    let mut changes = world.nomad.subscribe();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                r = changes.changed() => if r.is_err() { return },
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
            world.sync();
        }
    });
}

impl Lab {
    pub fn database_url(&self) -> &str {
        &self.stack.database_url
    }

    pub fn db(&self) -> &crate::server::db::Db {
        self.stack.db()
    }

    /// What `emisar lab` prints once it is up.
    pub fn banner(&self) -> String {
        let s = &self.stack;
        let mut out = String::new();
        out.push_str(&format!(
            "emisar lab is running: the fleet-wide 502 incident, at its start (up in {:.1} s).\n",
            self.started_in.as_secs_f64()
        ));
        out.push_str(&format!("  Portal:       {}\n", s.portal_url));
        out.push_str(&format!(
            "  Approver:     {} / {}\n",
            dev::DEV_APPROVER,
            s.approver_password
        ));
        out.push_str(&format!("  MCP URL:      {}\n", s.mcp_url));
        out.push_str(&format!("  Agent token:  {}\n", s.agent_token));
        for (name, url) in &s.runner_urls {
            let t = &self.world.traefik[name];
            let traefik = if t.serving() {
                format!("traefik {}", t.url())
            } else {
                format!("traefik {} (refusing: nothing listens)", t.url())
            };
            out.push_str(&format!("  Runner:       {name} at {url}  [{traefik}]\n"));
        }
        let lab = &self.info["lab"];
        out.push_str(&format!(
            "  Consul API:   {}\n",
            lab["consul_url"].as_str().unwrap_or("")
        ));
        out.push_str(&format!(
            "  Nomad API:    {}\n",
            lab["nomad_url"].as_str().unwrap_or("")
        ));
        out.push_str(&format!(
            "  VIP probe:    {} (connections at the anycast VIP, refused ones by node; POST …/reset)\n",
            lab["vip_probe_url"].as_str().unwrap_or("")
        ));
        match &self.metrics_missing {
            None => out.push_str(&format!(
                "  Metrics:      {} (VictoriaMetrics)\n",
                lab["victoriametrics_url"].as_str().unwrap_or("")
            )),
            Some(why) => out.push_str(&format!("  Metrics:      missing: {why}\n")),
        }
        out.push_str(&format!(
            "  Lab clock:    {}\n",
            match self.clock.speed() {
                0.0 => "frozen".to_owned(),
                1.0 => "real time".to_owned(),
                s => format!("{s}x real time"),
            }
        ));
        out.push_str(&format!("  Database:     {}\n", s.database_url));
        out.push_str(&format!("  Written to:   {}\n", self.dev_json.display()));
        out.push_str(
            "Start where the page pointed: consul.service_health {\"service\": \"store-api\", \"reason\": \"...\"}\n",
        );
        out.push_str("Stop with Ctrl-C.\n");
        out
    }

    /// Serves until the shutdown token is cancelled, then stops the lab's services.
    pub async fn run_until_stopped(self) -> anyhow::Result<()> {
        let stop = self.stop.clone();
        let result = self.stack.run_until_stopped().await;
        stop.cancel();
        result
    }
}

/// `emisar lab`: start, print, serve until stopped.
pub async fn run(opts: LabOptions, shutdown: CancellationToken) -> anyhow::Result<()> {
    let lab = start(opts, shutdown).await?;
    print!("{}", lab.banner());
    lab.run_until_stopped().await
}
