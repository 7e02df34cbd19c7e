//! The lab's nodes: what each one's commands print, and the shared world they act on.
//!
//! A lab runner's exec actions find the lab's stand-ins first on their PATH; each stand-in
//! asks the lab process (over loopback HTTP, `POST /v1/exec` on the control endpoint, with a
//! bearer token) to run its argv on its node, and prints what comes back. So `systemctl
//! restart consul` on hvn05 can make hvn05's Consul agent rejoin, Nomad start its Traefik
//! allocation there and its Traefik listen, all in the one state every other tool reads.
//!
//! The stand-ins answer the commands the stock packs run, in the real programs' formats:
//! `cat` (/proc/uptime, /proc/loadavg, /run/reboot-required*, /etc/os-release,
//! /etc/hostname, /etc/nomad.d/nomad.hcl), `uname`, `dpkg-query -W`, `systemctl` (restart, start, reload, show,
//! `list-dependencies --reverse --plain`, is-active, status) and `vtysh` (see `frr`). Anything else is refused with a message that says the lab
//! does not emulate it, never answered with made-up output.
//!
//! A node's `/etc/nomad.d/nomad.hcl` is a real file under the lab's state directory
//! (`nodes/<node>/etc/`), which an operator may edit. Restarting `nomad` reads it as the
//! agent would ([`hcl::check`]): the unit of HashiCorp's package is `Type=simple` with
//! `Restart=on-failure` and `RestartSec=2`, so `systemctl restart` succeeds and an agent
//! that cannot load its config exits at once and is restarted for ever, the unit
//! `activating (auto-restart)` and never `active`, until the file is fixed and the unit
//! restarted again.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::clock::LabClock;
use super::consul::Consul;
use super::frr::{self, Bgp};
use super::hcl;
use super::nomad::Nomad;
use super::traefik::Traefik;

/// The programs the lab stands in for, on every node.
pub const STANDINS: &[&str] = &["cat", "dpkg-query", "systemctl", "uname", "vtysh"];

/// What a command printed and how it exited.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Output {
    pub stdout: String,
    pub stderr: String,
    #[serde(rename = "exit_code")]
    pub code: i32,
}

impl Output {
    pub fn ok(stdout: impl Into<String>) -> Output {
        Output {
            stdout: stdout.into(),
            stderr: String::new(),
            code: 0,
        }
    }

    pub fn fail(code: i32, stderr: &str) -> Output {
        Output {
            stdout: String::new(),
            stderr: stderr.to_owned(),
            code,
        }
    }
}

/// A systemd unit on a node.
#[derive(Debug, Clone)]
pub struct Unit {
    pub description: String,
    pub main_pid: u32,
    pub active_since: SystemTime,
    pub n_restarts: u32,
    /// The other services that want or require this one (their `Wants=`/`Requires=`): what
    /// `systemctl list-dependencies --reverse` lists before the targets. Every lab unit is
    /// `WantedBy=multi-user.target`, which `graphical.target` requires.
    pub wanted_by: Vec<String>,
    /// Why the unit's main process exits as soon as it starts (its config does not load),
    /// so systemd keeps restarting it; `None` while it runs.
    pub failed: Option<String>,
}

/// A Debian package as dpkg knows it.
#[derive(Debug, Clone)]
pub struct Package {
    pub name: String,
    pub version: String,
}

/// One node's own facts.
#[derive(Debug, Clone)]
pub struct NodeState {
    pub name: String,
    pub ip: String,
    pub boot: SystemTime,
    /// `uname -r`.
    pub kernel: String,
    /// `uname -v`.
    pub kernel_build: String,
    pub packages: Vec<Package>,
    /// Keyed by full unit name (`consul.service`).
    pub units: BTreeMap<String, Unit>,
    pub bgp: Bgp,
    /// 1, 5 and 15 minute load averages.
    pub load: [f64; 3],
    pub cpus: u32,
    /// The node's `/etc` in the lab's state directory (config files an agent reads when it
    /// restarts); `None` when the node has no files of its own.
    pub etc: Option<PathBuf>,
}

/// A unit restarted on a node, in the order the nodes restarted them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Restart {
    pub node: String,
    pub unit: String,
    pub main_pid: u32,
    /// Whether the restarted unit runs (its config loaded), and why not when it does not.
    pub failed: Option<String>,
}

/// Everything a node command can see or change.
pub struct World {
    pub clock: Arc<LabClock>,
    pub consul: Arc<Consul>,
    pub nomad: Arc<Nomad>,
    pub traefik: BTreeMap<String, Arc<Traefik>>,
    nodes: Mutex<BTreeMap<String, NodeState>>,
    next_pid: AtomicU32,
    restarts: Mutex<Vec<Restart>>,
}

impl World {
    pub fn new(
        clock: Arc<LabClock>,
        consul: Arc<Consul>,
        nomad: Arc<Nomad>,
        traefik: BTreeMap<String, Arc<Traefik>>,
        nodes: Vec<NodeState>,
    ) -> World {
        World {
            clock,
            consul,
            nomad,
            traefik,
            nodes: Mutex::new(nodes.into_iter().map(|n| (n.name.clone(), n)).collect()),
            next_pid: AtomicU32::new(48_213),
            restarts: Mutex::new(Vec::new()),
        }
    }

    pub fn node_names(&self) -> Vec<String> {
        self.nodes.lock().expect("nodes").keys().cloned().collect()
    }

    /// A copy of one node's state.
    pub fn node(&self, name: &str) -> Option<NodeState> {
        self.nodes.lock().expect("nodes").get(name).cloned()
    }

    /// Every unit restart on every node so far, in order.
    pub fn restarts(&self) -> Vec<Restart> {
        self.restarts.lock().expect("restarts").clone()
    }

    /// Starts each node's Traefik once Nomad runs its allocation there.
    pub fn sync(&self) {
        for (node, t) in &self.traefik {
            if !t.serving()
                && self.nomad.task_running_on(node, "traefik")
                && let Err(e) = t.start()
            {
                tracing::warn!(node = %node, error = %e, "lab: traefik could not start listening");
            }
        }
    }

    /// Runs `argv` on `node` (argv[0] is the program's name).
    pub fn exec(&self, node: &str, argv: &[String]) -> Output {
        let Some((program, args)) = argv.split_first() else {
            return Output::fail(127, "lab: empty argv\n");
        };
        let now = self.clock.now();
        let mut nodes = self.nodes.lock().expect("nodes");
        let Some(state) = nodes.get_mut(node) else {
            return Output::fail(127, &format!("lab: there is no lab node `{node}`\n"));
        };
        let program = program.rsplit('/').next().unwrap_or(program);
        match program {
            "cat" => cat(state, args, now),
            "uname" => uname(state, args),
            "dpkg-query" => dpkg_query(state, args),
            "vtysh" => {
                let hostname = state.name.clone();
                frr::vtysh(&mut state.bgp, &hostname, args, now)
            }
            "systemctl" => {
                let (out, restarted) = systemctl(state, args, now, &self.next_pid);
                self.restarts
                    .lock()
                    .expect("restarts")
                    .extend(restarted.iter().map(|unit| {
                        let u = &state.units[unit];
                        Restart {
                            node: node.to_owned(),
                            unit: unit.clone(),
                            main_pid: u.main_pid,
                            failed: u.failed.clone(),
                        }
                    }));
                drop(nodes);
                for unit in restarted {
                    self.unit_restarted(node, &unit, now);
                }
                out
            }
            other => Output::fail(
                127,
                &format!("lab: `{other}` has no stand-in on lab nodes (they have {STANDINS:?})\n"),
            ),
        }
    }

    /// What restarting a unit does beyond the unit itself.
    fn unit_restarted(&self, node: &str, unit: &str, now: SystemTime) {
        match unit {
            // A restarted Consul agent rejoins the gossip (and, as a server, the raft); the
            // node's Nomad client can then get tokens, so its Traefik allocation starts.
            "consul.service" => {
                self.consul.agent_restarted(node);
                self.nomad.consul_ready(node);
                self.sync();
            }
            // FRR re-reads frr.conf: a runtime `neighbor shutdown` is gone, the session is new.
            "frr.service" => {
                let mut nodes = self.nodes.lock().expect("nodes");
                if let Some(state) = nodes.get_mut(node) {
                    let peer = &mut state.bgp.peer;
                    if peer.shutdown.take().is_none() {
                        peer.connections_dropped += 1;
                    }
                    peer.connections_established += 1;
                    peer.since = now;
                }
            }
            _ => {}
        }
    }

    /// The control endpoint the stand-ins call: `POST /v1/exec {node, argv}` with the token.
    pub fn control_router(self: Arc<Self>, token: String) -> Router {
        Router::new()
            .route("/v1/exec", post(exec_handler))
            .with_state((self, Arc::new(token)))
    }
}

#[derive(Deserialize)]
struct ExecRequest {
    node: String,
    argv: Vec<String>,
}

async fn exec_handler(
    State((world, token)): State<(Arc<World>, Arc<String>)>,
    headers: HeaderMap,
    axum::Json(req): axum::Json<ExecRequest>,
) -> Response {
    let presented = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if presented != Some(token.as_str()) {
        return (
            StatusCode::UNAUTHORIZED,
            axum::Json(json!({"error": "the lab control endpoint needs the lab's token"})),
        )
            .into_response();
    }
    // Node commands lock the world briefly and never wait on IO; Traefik's start only spawns.
    let out = world.exec(&req.node, &req.argv);
    axum::Json(out).into_response()
}

fn cat(node: &NodeState, args: &[String], now: SystemTime) -> Output {
    let mut out = Output::ok("");
    if args.is_empty() {
        return Output::fail(1, "cat: the lab's cat reads files only, not stdin\n");
    }
    for path in args {
        if path.starts_with('-') && path != "-" {
            return Output::fail(
                1,
                &format!("cat: the lab's cat takes file names only, not `{path}`\n"),
            );
        }
        match file(node, path, now) {
            Some(text) => out.stdout.push_str(&text),
            None => {
                out.stderr
                    .push_str(&format!("cat: {path}: No such file or directory\n"));
                out.code = 1;
            }
        }
    }
    out
}

/// The files a lab node has.
fn file(node: &NodeState, path: &str, now: SystemTime) -> Option<String> {
    match path {
        "/proc/uptime" => {
            let up = now.duration_since(node.boot).unwrap_or_default().as_secs_f64();
            // Idle time is summed over CPUs; these nodes are busy, so about half of it.
            let idle = up * f64::from(node.cpus) * 0.55;
            Some(format!("{up:.2} {idle:.2}\n"))
        }
        "/proc/loadavg" => {
            let [a, b, c] = node.load;
            Some(format!("{a:.2} {b:.2} {c:.2} 3/1187 {}\n", 48_000 + node.cpus * 37))
        }
        "/etc/hostname" => Some(format!("{}\n", node.name)),
        "/etc/nomad.d/nomad.hcl" => {
            let etc = node.etc.as_ref()?;
            std::fs::read_to_string(etc.join("nomad.d/nomad.hcl")).ok()
        }
        "/etc/os-release" => Some(
            "PRETTY_NAME=\"Debian GNU/Linux 13 (trixie)\"\nNAME=\"Debian GNU/Linux\"\nVERSION_ID=\"13\"\nVERSION=\"13 (trixie)\"\nVERSION_CODENAME=trixie\nDEBIAN_VERSION_FULL=13.2\nID=debian\nHOME_URL=\"https://www.debian.org/\"\nSUPPORT_URL=\"https://www.debian.org/support\"\nBUG_REPORT_URL=\"https://bugs.debian.org/\"\n"
                .to_owned(),
        ),
        // No package asked for a reboot: the file does not exist.
        _ => None,
    }
}

fn uname(node: &NodeState, args: &[String]) -> Output {
    // uname prints its fields in this order whatever the order of the flags.
    let mut want = [false; 6]; // s n r v m o
    for a in args {
        match a.as_str() {
            "-a" | "--all" => want = [true; 6],
            "--kernel-name" => want[0] = true,
            "--nodename" => want[1] = true,
            "--kernel-release" => want[2] = true,
            "--kernel-version" => want[3] = true,
            "--machine" => want[4] = true,
            "--operating-system" => want[5] = true,
            flags if flags.starts_with('-') && !flags.starts_with("--") => {
                for f in flags.chars().skip(1) {
                    match f {
                        's' => want[0] = true,
                        'n' => want[1] = true,
                        'r' => want[2] = true,
                        'v' => want[3] = true,
                        'm' => want[4] = true,
                        'o' => want[5] = true,
                        'a' => want = [true; 6],
                        other => {
                            return Output::fail(
                                1,
                                &format!(
                                    "uname: invalid option -- '{other}'\nTry 'uname --help' for more information.\n"
                                ),
                            );
                        }
                    }
                }
            }
            other => {
                return Output::fail(
                    1,
                    &format!(
                        "uname: extra operand '{other}'\nTry 'uname --help' for more information.\n"
                    ),
                );
            }
        }
    }
    if want == [false; 6] {
        want[0] = true;
    }
    let fields = [
        "Linux",
        node.name.as_str(),
        node.kernel.as_str(),
        node.kernel_build.as_str(),
        "x86_64",
        "GNU/Linux",
    ];
    let shown: Vec<&str> = fields
        .iter()
        .zip(want)
        .filter(|(_, w)| *w)
        .map(|(f, _)| *f)
        .collect();
    Output::ok(format!("{}\n", shown.join(" ")))
}

/// A dpkg glob: `*` and `?`.
fn glob(pattern: &str, name: &str) -> bool {
    fn go(p: &[char], n: &[char]) -> bool {
        match (p.first(), n.first()) {
            (None, None) => true,
            (Some('*'), _) => go(&p[1..], n) || (!n.is_empty() && go(p, &n[1..])),
            (Some('?'), Some(_)) => go(&p[1..], &n[1..]),
            (Some(a), Some(b)) if a == b => go(&p[1..], &n[1..]),
            _ => false,
        }
    }
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    go(&p, &n)
}

fn dpkg_query(node: &NodeState, args: &[String]) -> Output {
    let mut format = "${binary:Package}\t${Version}\n".to_owned();
    let mut show = false;
    let mut patterns = Vec::new();
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "-W" | "--show" => show = true,
            "-f" | "--showformat" => {
                let Some(f) = args.get(i + 1) else {
                    return Output::fail(2, "dpkg-query: error: --showformat needs a value\n");
                };
                format = f.clone();
                i += 1;
            }
            a if a.starts_with("--showformat=") => format = a["--showformat=".len()..].to_owned(),
            a if a.starts_with('-') => {
                return Output::fail(
                    2,
                    &format!(
                        "dpkg-query: the lab's dpkg-query answers -W [-f FORMAT] [PATTERN...] only, not `{a}`\n"
                    ),
                );
            }
            p => patterns.push(p.to_owned()),
        }
        i += 1;
    }
    if !show {
        return Output::fail(
            2,
            "dpkg-query: the lab's dpkg-query answers -W [-f FORMAT] [PATTERN...] only\n",
        );
    }
    // dpkg-query interprets these escapes in the format itself.
    let format = format
        .replace("\\n", "\n")
        .replace("\\t", "\t")
        .replace("\\\\", "\\");
    let mut out = Output::ok("");
    let mut matched = vec![false; patterns.len()];
    for p in &node.packages {
        let hit: Vec<usize> = patterns
            .iter()
            .enumerate()
            .filter(|(_, pat)| glob(pat, &p.name))
            .map(|(i, _)| i)
            .collect();
        if !patterns.is_empty() && hit.is_empty() {
            continue;
        }
        for i in hit {
            matched[i] = true;
        }
        out.stdout.push_str(
            &format
                .replace("${binary:Package}", &p.name)
                .replace("${Package}", &p.name)
                .replace("${Version}", &p.version)
                .replace("${db:Status-Abbrev}", "ii ")
                .replace("${Status}", "install ok installed"),
        );
    }
    for (i, pat) in patterns.iter().enumerate() {
        if !matched[i] {
            out.stderr
                .push_str(&format!("dpkg-query: no packages found matching {pat}\n"));
            out.code = 1;
        }
    }
    out
}

/// `consul` → `consul.service`, as systemctl reads a name without a suffix.
fn unit_name(name: &str) -> String {
    const SUFFIXES: &[&str] = &[
        ".service",
        ".socket",
        ".device",
        ".mount",
        ".automount",
        ".swap",
        ".target",
        ".path",
        ".timer",
        ".slice",
        ".scope",
    ];
    if SUFFIXES.iter().any(|s| name.ends_with(s)) {
        name.to_owned()
    } else {
        format!("{name}.service")
    }
}

/// systemd's timestamp text, e.g. `Mon 2026-11-30 02:03:12 UTC`.
fn timestamp(t: SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(t)
        .format("%a %Y-%m-%d %H:%M:%S UTC")
        .to_string()
}

fn ago(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s}s ago"),
        60..3600 => format!("{}min ago", s / 60),
        3600..86_400 => format!("{}h {}min ago", s / 3600, (s % 3600) / 60),
        _ => format!("{} days ago", s / 86_400),
    }
}

/// `systemctl list-dependencies --reverse --plain UNIT…`, as systemd 252 prints it: each unit,
/// then its dependents two spaces in, services first, then the targets (whose own dependents
/// follow, each unit once); a blank line between units. A unit systemd does not know is
/// listed with nothing under it. Only the reverse, plain form is emulated.
fn list_reverse_dependencies(node: &NodeState, units: &[String], flags: &[String]) -> Output {
    if !(flags.iter().any(|f| f == "--reverse") && flags.iter().any(|f| f == "--plain")) {
        return Output::fail(
            1,
            "systemctl: the lab's systemctl emulates only `list-dependencies --reverse --plain`\n",
        );
    }
    if units.is_empty() {
        return Output::fail(
            1,
            "systemctl: the lab's systemctl lists the dependents of named units only, not of default.target\n",
        );
    }
    let mut text = String::new();
    for (k, u) in units.iter().enumerate() {
        if k > 0 {
            text.push('\n');
        }
        text.push_str(&format!("{u}\n"));
        let Some(unit) = node.units.get(u) else {
            continue;
        };
        let mut services = unit.wanted_by.clone();
        services.sort_by_key(|s| s.to_lowercase());
        for dependent in services
            .iter()
            .map(String::as_str)
            .chain(["multi-user.target", "graphical.target"])
        {
            text.push_str(&format!("  {dependent}\n"));
        }
    }
    Output::ok(text)
}

/// Runs systemctl; also returns the units it restarted, for the world to react to.
fn systemctl(
    node: &mut NodeState,
    args: &[String],
    now: SystemTime,
    next_pid: &AtomicU32,
) -> (Output, Vec<String>) {
    let mut props: Vec<String> = Vec::new();
    let mut flags: Vec<String> = Vec::new();
    let mut value_only = false;
    let mut words = Vec::new();
    let mut i = 0;
    let mut options_done = false;
    while i < args.len() {
        let a = args[i].as_str();
        if options_done || !a.starts_with('-') {
            words.push(a.to_owned());
        } else {
            match a {
                "--" => options_done = true,
                "--no-pager" | "--no-block" | "-q" | "--quiet" | "--no-legend" | "--full"
                | "-l" => {}
                "--reverse" | "--plain" => flags.push(a.to_owned()),
                "--value" => value_only = true,
                "-p" | "--property" => {
                    let Some(p) = args.get(i + 1) else {
                        return (
                            Output::fail(1, "systemctl: option requires an argument -- 'p'\n"),
                            vec![],
                        );
                    };
                    props.extend(p.split(',').map(str::to_owned));
                    i += 1;
                }
                p if p.starts_with("--property=") => {
                    props.extend(p["--property=".len()..].split(',').map(str::to_owned))
                }
                other => {
                    return (
                        Output::fail(1, &format!("systemctl: unrecognized option '{other}'\n")),
                        vec![],
                    );
                }
            }
        }
        i += 1;
    }
    let Some((verb, units)) = words.split_first() else {
        return (
            Output::fail(
                1,
                "systemctl: the lab's systemctl needs a verb (restart, start, reload, show, list-dependencies, is-active, status)\n",
            ),
            vec![],
        );
    };
    let units: Vec<String> = units.iter().map(|u| unit_name(u)).collect();
    match verb.as_str() {
        "restart" | "start" | "try-restart" | "reload-or-restart" => {
            if units.is_empty() {
                return (Output::fail(1, "Too few arguments.\n"), vec![]);
            }
            for u in &units {
                if !node.units.contains_key(u) {
                    return (
                        Output::fail(5, &format!("Failed to {verb} {u}: Unit {u} not found.\n")),
                        vec![],
                    );
                }
            }
            let mut restarted = Vec::new();
            for u in &units {
                if verb == "start" {
                    continue;
                }
                let failed = config_failure(node, u);
                let unit = node.units.get_mut(u).expect("checked above");
                unit.main_pid = next_pid.fetch_add(311, Ordering::SeqCst);
                unit.active_since = now;
                if failed.is_some() {
                    unit.n_restarts += 1;
                }
                unit.failed = failed;
                restarted.push(u.clone());
            }
            (Output::ok(""), restarted)
        }
        "reload" => (reload(node, &units), vec![]),
        "show" => {
            if units.is_empty() {
                return (
                    Output::fail(
                        1,
                        "systemctl: the lab's systemctl shows units only, not the manager\n",
                    ),
                    vec![],
                );
            }
            let mut text = String::new();
            for (k, u) in units.iter().enumerate() {
                if k > 0 {
                    text.push('\n');
                }
                let unit = node.units.get(u);
                let looping = unit.is_some_and(|x| x.failed.is_some());
                let (active, sub) = match unit {
                    None => ("inactive", "dead"),
                    Some(_) if looping => ("activating", "auto-restart"),
                    Some(_) => ("active", "running"),
                };
                // systemctl prints the service's properties before the unit's.
                let all: Vec<(&str, String)> = vec![
                    (
                        "MainPID",
                        unit.filter(|_| !looping)
                            .map_or(0, |x| x.main_pid)
                            .to_string(),
                    ),
                    (
                        "Result",
                        if looping { "exit-code" } else { "success" }.into(),
                    ),
                    ("NRestarts", unit.map_or(0, |x| x.n_restarts).to_string()),
                    ("Id", u.clone()),
                    (
                        "Description",
                        unit.map_or(u.clone(), |x| x.description.clone()),
                    ),
                    (
                        "LoadState",
                        if unit.is_some() {
                            "loaded"
                        } else {
                            "not-found"
                        }
                        .into(),
                    ),
                    ("ActiveState", active.into()),
                    ("SubState", sub.into()),
                    (
                        "ActiveEnterTimestamp",
                        unit.map_or(String::new(), |x| timestamp(x.active_since)),
                    ),
                    // Every unit the lab's nodes run declares ExecReload= (consul, nomad, frr,
                    // ssh and docker do in Debian); one the node lacks cannot reload.
                    (
                        "CanReload",
                        if unit.is_some() { "yes" } else { "no" }.into(),
                    ),
                ];
                for (name, value) in all {
                    if props.is_empty() || props.iter().any(|p| p == name) {
                        if value_only {
                            text.push_str(&format!("{value}\n"));
                        } else {
                            text.push_str(&format!("{name}={value}\n"));
                        }
                    }
                }
            }
            (Output::ok(text), vec![])
        }
        "list-dependencies" => (list_reverse_dependencies(node, &units, &flags), vec![]),
        "is-active" => {
            let mut text = String::new();
            let mut code = 0;
            for u in &units {
                if node.units.get(u).is_some_and(|x| x.failed.is_some()) {
                    text.push_str("activating\n");
                    code = 3;
                } else if node.units.contains_key(u) {
                    text.push_str("active\n");
                } else {
                    text.push_str("inactive\n");
                    code = 3;
                }
            }
            (
                Output {
                    stdout: text,
                    stderr: String::new(),
                    code,
                },
                vec![],
            )
        }
        "status" => {
            let mut text = String::new();
            for u in &units {
                match node.units.get(u) {
                    Some(x) if x.failed.is_some() => {
                        text.push_str(&looping_status(&node.name, u, x, now))
                    }
                    Some(x) => text.push_str(&format!(
                        "● {u} - {desc}\n     Loaded: loaded (/usr/lib/systemd/system/{u}; enabled; preset: enabled)\n     Active: active (running) since {since}; {ago}\n   Main PID: {pid} ({bin})\n",
                        desc = x.description,
                        since = timestamp(x.active_since),
                        ago = ago(now.duration_since(x.active_since).unwrap_or_default()),
                        pid = x.main_pid,
                        bin = u.trim_end_matches(".service"),
                    )),
                    None => {
                        return (
                            Output::fail(4, &format!("Unit {u} could not be found.\n")),
                            vec![],
                        );
                    }
                }
            }
            (Output::ok(text), vec![])
        }
        other => (
            Output::fail(
                1,
                &format!(
                    "systemctl: the lab's systemctl does not emulate `{other}` (restart, start, reload, show, list-dependencies, is-active, status)\n"
                ),
            ),
            vec![],
        ),
    }
}

/// The config file a unit's agent reads when it starts, relative to the node's `/etc`.
fn config_file(unit: &str) -> Option<&'static str> {
    match unit {
        "nomad.service" => Some("nomad.d/nomad.hcl"),
        _ => None,
    }
}

/// Why `unit`'s agent on `node` would exit at start: its config file does not load.
fn config_failure(node: &NodeState, unit: &str) -> Option<String> {
    let (etc, file) = (node.etc.as_ref()?, config_file(unit)?);
    let shown = format!("/etc/{file}");
    let text = match std::fs::read_to_string(etc.join(file)) {
        Ok(text) => text,
        Err(e) => return Some(format!("Error loading {shown}: {e}")),
    };
    hcl::check(&text).err().map(|why| {
        format!("Error loading configuration from /etc/nomad.d: Error loading {shown}: {why}")
    })
}

/// `systemctl status` of a unit whose agent exits at start and is restarted every 2 s.
fn looping_status(host: &str, name: &str, unit: &Unit, now: SystemTime) -> String {
    let bin = name.trim_end_matches(".service");
    format!(
        "● {name} - {desc}\n     Loaded: loaded (/usr/lib/systemd/system/{name}; enabled; preset: enabled)\n     Active: activating (auto-restart) (Result: exit-code) since {since}; {ago}\n    Process: {pid} ExecStart=/usr/bin/{bin} agent -config /etc/{bin}.d (code=exited, status=1/FAILURE)\n   Main PID: {pid} (code=exited, status=1/FAILURE)\n\n{host} {bin}[{pid}]: ==> {why}\n",
        desc = unit.description,
        since = timestamp(unit.active_since),
        ago = ago(now.duration_since(unit.active_since).unwrap_or_default()),
        pid = unit.main_pid,
        why = unit.failed.as_deref().unwrap_or_default(),
    )
}

/// `systemctl reload`: the units' ExecReload= runs; the main process and its start time stay.
fn reload(node: &NodeState, units: &[String]) -> Output {
    if units.is_empty() {
        return Output::fail(1, "Too few arguments.\n");
    }
    match units.iter().find(|u| !node.units.contains_key(*u)) {
        Some(u) => Output::fail(5, &format!("Failed to reload {u}: Unit {u} not found.\n")),
        None => Output::ok(""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_like_dpkg() {
        assert!(glob("linux-image-*", "linux-image-amd64"));
        assert!(!glob("linux-image-*", "linux-headers-amd64"));
        assert!(glob("c?nsul", "consul"));
    }

    /// `list-dependencies --reverse --plain` as systemd 252 prints it: the unit, then its
    /// dependents two spaces in, services before targets; an unknown unit with nothing under
    /// it; any other form is refused rather than answered wrongly.
    #[test]
    fn reverse_dependencies_are_listed_as_systemd_prints_them() {
        let now = SystemTime::now();
        let mut node = super::super::scenario::nodes(now).remove(0);
        let next_pid = AtomicU32::new(9000);
        let mut run = |argv: &[&str]| {
            let argv: Vec<String> = argv.iter().map(|a| a.to_string()).collect();
            systemctl(&mut node, &argv, now, &next_pid).0
        };
        let reverse = [
            "list-dependencies",
            "--reverse",
            "--plain",
            "--no-pager",
            "--",
        ];
        assert_eq!(
            run(&[&reverse[..], &["consul"]].concat()),
            Output::ok(
                "consul.service\n  nomad.service\n  multi-user.target\n  graphical.target\n"
            )
        );
        assert_eq!(
            run(&[&reverse[..], &["ssh.service"]].concat()),
            Output::ok("ssh.service\n  multi-user.target\n  graphical.target\n")
        );
        assert_eq!(
            run(&[&reverse[..], &["nosuch"]].concat()),
            Output::ok("nosuch.service\n")
        );
        let forward = run(&["list-dependencies", "--plain", "--", "consul"]);
        assert_eq!(forward.code, 1, "{forward:?}");
        assert!(
            forward
                .stderr
                .contains("only `list-dependencies --reverse --plain`")
        );
    }

    #[test]
    fn reload_keeps_the_main_process_and_refuses_a_missing_unit() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let mut node = super::super::scenario::nodes(now).remove(0);
        let pid = AtomicU32::new(9000);
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let show = args(&["show", "-p", "CanReload,MainPID", "--", "consul"]);
        let before = systemctl(&mut node, &show, now, &pid).0;
        assert_eq!(before.stdout, "MainPID=701\nCanReload=yes\n");
        let (out, restarted) = systemctl(&mut node, &args(&["reload", "--", "consul"]), now, &pid);
        assert_eq!((out.code, restarted.len()), (0, 0), "{out:?}");
        assert_eq!(systemctl(&mut node, &show, now, &pid).0, before);
        let (out, _) = systemctl(&mut node, &args(&["reload", "--", "vault"]), now, &pid);
        assert_eq!(out.code, 5);
        assert_eq!(
            out.stderr,
            "Failed to reload vault.service: Unit vault.service not found.\n"
        );
        let missing = args(&["show", "-p", "CanReload", "--", "vault"]);
        assert_eq!(
            systemctl(&mut node, &missing, now, &pid).0.stdout,
            "CanReload=no\n"
        );
    }

    /// A restarted `nomad` reads its config: with a typo the restart succeeds and the unit
    /// loops in auto-restart, with HCL's error in its status; fixed, it runs again.
    #[test]
    fn nomad_restarts_into_a_loop_on_a_config_it_cannot_load() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("nomad.d")).unwrap();
        let file = dir.path().join("nomad.d/nomad.hcl");
        let mut node = super::super::scenario::nodes(now).remove(0);
        node.etc = Some(dir.path().to_owned());
        let pid = AtomicU32::new(9000);
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let show = args(&[
            "show",
            "-p",
            "ActiveState,SubState,Result,MainPID",
            "--",
            "nomad",
        ]);

        std::fs::write(
            &file,
            "client {\n  enabled = true\n}\nleave_on_terminate = flase\n",
        )
        .unwrap();
        let (out, restarted) = systemctl(&mut node, &args(&["restart", "--", "nomad"]), now, &pid);
        assert_eq!((out.code, restarted), (0, vec!["nomad.service".to_owned()]));
        assert_eq!(
            systemctl(&mut node, &show, now, &pid).0.stdout,
            "MainPID=0\nResult=exit-code\nActiveState=activating\nSubState=auto-restart\n"
        );
        let active = systemctl(&mut node, &args(&["is-active", "nomad"]), now, &pid).0;
        assert_eq!((active.stdout.as_str(), active.code), ("activating\n", 3));
        let status = systemctl(&mut node, &args(&["status", "nomad"]), now, &pid).0;
        assert!(
            status
                .stdout
                .contains("Active: activating (auto-restart) (Result: exit-code)")
                && status.stdout.contains(
                    "Error loading /etc/nomad.d/nomad.hcl: At 4:22: Unknown token: 4:22 IDENT flase"
                ),
            "{}",
            status.stdout
        );

        std::fs::write(
            &file,
            "client {\n  enabled = true\n}\nleave_on_terminate = false\n",
        )
        .unwrap();
        systemctl(&mut node, &args(&["restart", "--", "nomad"]), now, &pid);
        assert_eq!(
            systemctl(&mut node, &show, now, &pid).0.stdout,
            "MainPID=9311\nResult=success\nActiveState=active\nSubState=running\n"
        );
    }

    #[test]
    fn unit_names_get_their_suffix() {
        assert_eq!(unit_name("consul"), "consul.service");
        assert_eq!(unit_name("apt-daily.timer"), "apt-daily.timer");
    }
}
