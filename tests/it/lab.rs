//! `emisar lab`: the fleet-wide 502 incident, replayed end to end with the stock packs and
//! runners. A real MCP client plays the agent through an operator's reads (in their
//! order, with their arguments) and checks each signal; it then requests the two writes with
//! an operator's reasons, an approver approves them through the portal's HTTP API (and, in the
//! browser test, in headless Chromium), and the reads come back healthy. The audit log holds
//! every read with its reason and each approval's transitions, and `emisar audit verify`
//! passes.
//!
//! The lab runs in-process on a frozen lab clock (advanced by hand, never slept on); its node
//! stand-ins are the real `emisar` binary. The last test starts `emisar lab` itself.
//!
//! The browser test keeps its screenshots under target/lab-e2e/; with EMISAR_UPDATE_DOCS=1
//! it also copies the two request pages to docs/ (how docs/lab-*.png were made).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use emisar::lab::clock::LabClock;
use emisar::lab::consul::{Consul, MemberStatus};
use emisar::lab::node::World;
use emisar::lab::nomad::Nomad;
use emisar::lab::run::{LabOptions, start};
use emisar::lab::vip::Vip;
use emisar::server::audit::{self, AuditFilter};
use emisar::server::db::Db;
use rmcp::RoleClient;
use rmcp::model::CallToolResult;
use rmcp::service::RunningService;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::approvals::{Portal, call_in_background, finished};
use crate::harness::tools::{Proc, mcp_client, require};
use crate::mcp_calls::call;
use crate::portal_browser::{Driver, assert_png, require_path};

pub(crate) const NODES: [&str; 5] = [
    "nomad-hvn01",
    "nomad-hvn02",
    "nomad-hvn03",
    "nomad-hvn04",
    "nomad-hvn05",
];
const VM: &str = "/usr/bin/victoria-metrics";
const TOP5: &str = "topk(5, sum by(service) (rate(traefik_service_requests_total[2m])))";
pub(crate) const CONSUL_REASON: &str = "hvn05 Consul wedged (left the gossip) after a reboot — restart so it rejoins and Traefik's token derivation succeeds";
const NOMAD_REASON: &str = "Traefik OOM-looping at the 1 GiB cap under VIP load; raise to 4 GiB";

/// The lab, running in-process until dropped.
pub(crate) struct RunningLab {
    pub(crate) info: Value,
    clock: Arc<LabClock>,
    consul: Arc<Consul>,
    nomad: Arc<Nomad>,
    pub(crate) world: Arc<World>,
    pub(crate) vip: Arc<Vip>,
    pub(crate) state_dir: PathBuf,
    db: Db,
    database_url: String,
    stop: CancellationToken,
    _dir: tempfile::TempDir,
}

impl RunningLab {
    pub(crate) async fn start() -> RunningLab {
        require_path(Path::new(VM));
        let dir = tempfile::tempdir().unwrap();
        let stop = CancellationToken::new();
        let lab = start(
            LabOptions {
                state_dir: dir.path().join("lab"),
                listen: "127.0.0.1:0".into(),
                speed: 0.0,
                standin_exe: Some(PathBuf::from(env!("CARGO_BIN_EXE_emisar"))),
                victoria_metrics: Some(PathBuf::from(VM)),
            },
            stop.clone(),
        )
        .await
        .expect("the lab starts");
        eprintln!("lab: started in {:?}", lab.started_in);
        let running = RunningLab {
            info: lab.info.clone(),
            clock: lab.clock.clone(),
            consul: lab.consul.clone(),
            nomad: lab.nomad.clone(),
            world: lab.world.clone(),
            vip: lab.vip.clone(),
            state_dir: dir.path().join("lab"),
            db: lab.db().clone(),
            database_url: lab.database_url().to_owned(),
            stop,
            _dir: dir,
        };
        tokio::spawn(lab.run_until_stopped());
        running
    }

    fn base(&self) -> String {
        self.info["portal_url"]
            .as_str()
            .unwrap()
            .trim_end_matches('/')
            .to_owned()
    }

    async fn agent(&self) -> RunningService<RoleClient, ()> {
        mcp_client(
            self.info["mcp_url"].as_str().unwrap(),
            self.info["agent_token"].as_str().unwrap(),
        )
        .await
    }

    pub(crate) async fn approver(&self) -> Portal {
        Portal::login_at(
            &self.base(),
            self.info["approver"].as_str().unwrap(),
            self.info["approver_password"].as_str().unwrap(),
        )
        .await
    }

    pub(crate) async fn events(&self, filter: AuditFilter) -> Vec<audit::Event> {
        audit::query(
            &self.db,
            &AuditFilter {
                limit: 10_000,
                ..filter
            },
        )
        .await
        .unwrap()
    }

    /// `emisar audit verify`, the command an auditor runs, passes on the lab's database.
    pub(crate) fn verify_with_cli(&self) {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_emisar"))
            .args(["audit", "verify", "--database", &self.database_url])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.starts_with("ok: "),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for RunningLab {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// The reads the agent made: (call id, tool, reason, how many runners answered).
#[derive(Default)]
struct Reads(Vec<(String, String, String, usize)>);

impl Reads {
    /// Calls `tool` with `args` and `reason`; returns each runner's result by runner name
    /// (the call itself must be accepted; a runner may fail).
    async fn call(
        &mut self,
        client: &RunningService<RoleClient, ()>,
        tool: &str,
        mut args: Value,
        reason: &str,
    ) -> BTreeMap<String, Value> {
        args["reason"] = json!(reason);
        let res = call(client, tool, args).await;
        let s = structured(&res);
        self.0.push((
            s["call_id"].as_str().unwrap().to_owned(),
            tool.to_owned(),
            reason.to_owned(),
            s["results"].as_array().map_or(0, Vec::len),
        ));
        s["results"]
            .as_array()
            .unwrap_or_else(|| panic!("{tool}: no results in {s}"))
            .iter()
            .map(|r| (r["runner"].as_str().unwrap().to_owned(), r.clone()))
            .collect()
    }

    /// The output of a call that ran on one runner and succeeded.
    async fn one(
        &mut self,
        client: &RunningService<RoleClient, ()>,
        tool: &str,
        args: Value,
        reason: &str,
    ) -> Value {
        let results = self.call(client, tool, args, reason).await;
        assert_eq!(results.len(), 1, "{tool}: {results:?}");
        let r = results.into_values().next().unwrap();
        assert_eq!(r["ok"], true, "{tool}: {r}");
        r["output"].clone()
    }

    /// The outputs of a call on all five runners, each of which must succeed.
    async fn all(
        &mut self,
        client: &RunningService<RoleClient, ()>,
        tool: &str,
        reason: &str,
    ) -> BTreeMap<String, Value> {
        let results = self
            .call(client, tool, json!({"runners": NODES}), reason)
            .await;
        assert_eq!(results.len(), 5, "{tool}: {results:?}");
        results
            .into_iter()
            .map(|(runner, r)| {
                assert_eq!(r["ok"], true, "{tool} on {runner}: {r}");
                (runner, r["output"].clone())
            })
            .collect()
    }
}

fn structured(res: &CallToolResult) -> Value {
    res.structured_content
        .clone()
        .unwrap_or_else(|| panic!("no structured content: {:?}", res.content))
}

fn hhmm(rfc3339: &str) -> String {
    chrono::DateTime::parse_from_rfc3339(rfc3339)
        .unwrap_or_else(|e| panic!("{rfc3339}: {e}"))
        .with_timezone(&chrono::Utc)
        .format("%H:%M")
        .to_string()
}

/// The current allocations of the traefik job (desired `run`), by node.
async fn current_allocs(
    reads: &mut Reads,
    client: &RunningService<RoleClient, ()>,
    reason: &str,
) -> BTreeMap<String, Value> {
    let allocs = reads
        .one(
            client,
            "nomad.job_allocations",
            json!({"job": "traefik"}),
            reason,
        )
        .await;
    allocs
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["desired"] == "run")
        .map(|a| (a["node"].as_str().unwrap().to_owned(), a.clone()))
        .collect()
}

/// The agent reads down to the faults; two approved writes heal the fleet;
/// the audit log holds it all and verifies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lab_agent_reads_the_incident_then_two_approvals_heal_it() {
    let lab = RunningLab::start().await;
    let client = lab.agent().await;
    let mut reads = Reads::default();

    // 1. The app the page blamed is registered and healthy.
    let health = reads
        .one(
            &client,
            "consul.service_health",
            json!({"service": "store-api"}),
            "the page blames store-api: is it registered and healthy?",
        )
        .await;
    let instances = health.as_array().unwrap();
    assert_eq!(instances.len(), 1, "{health}");
    assert_eq!(instances[0]["node"], "nomad-hvn01");
    assert_eq!(instances[0]["address"], "10.0.0.101:22504");
    assert_eq!(instances[0]["status"], "passing");
    let check = instances[0]["checks"][1]["output"].as_str().unwrap();
    assert!(
        check.contains("/healthcheck: 200 OK") && check.contains("\"commit\":\"3433150\""),
        "{check}"
    );

    // 2. Every node, hvn05 included, advertises the anycast /32 to the edge firewall.
    let bgp = reads
        .all(
            &client,
            "frr.bgp_summary",
            "which nodes advertise the anycast VIP?",
        )
        .await;
    for (node, out) in &bgp {
        let peer = &out["address_families"][0]["peers"][0];
        assert_eq!(peer["state"], "Established", "{node}: {out}");
        assert_eq!(peer["prefixes_sent"], 1, "{node}: {out}");
        assert_eq!(peer["description"], "upstream-edge-fw", "{node}: {out}");
    }

    // 3. Four Traefiks answer (ping is not enabled: Go's 404); hvn05 refuses connections.
    let ping = reads
        .call(
            &client,
            "traefik.ping",
            json!({"runners": NODES}),
            "is each node's Traefik answering?",
        )
        .await;
    for node in &NODES[..4] {
        let r = &ping[*node];
        assert_eq!(r["ok"], true, "{node}: {r}");
        assert_eq!(r["output"]["http_status"], 404, "{node}: {r}");
        assert_eq!(r["output"]["body"], "404 page not found", "{node}: {r}");
    }
    let hvn05 = &ping["nomad-hvn05"];
    assert_eq!(hvn05["ok"], false, "{hvn05}");
    assert!(
        hvn05["error"]
            .as_str()
            .unwrap()
            .contains("Connection refused"),
        "{hvn05}"
    );

    // 4. The cap: 1 GiB.
    let job = reads
        .one(
            &client,
            "nomad.job_resources",
            json!({"job": "traefik"}),
            "what memory cap does the edge proxy run with?",
        )
        .await;
    let task = &job["groups"][0]["tasks"][0];
    assert_eq!(job["groups"][0]["group"], "traefik");
    assert_eq!(task["task"], "traefik");
    assert_eq!(task["cpu_mhz"], 1000);
    assert_eq!(task["memory_mib"], 1024);
    let index_before = job["job_modify_index"].as_u64().unwrap();

    // 5. hvn04's Traefik is OOM-looping on that cap.
    let oom = reads
        .one(
            &client,
            "nomad.alloc_status",
            json!({"alloc_id": "1c11be31"}),
            "why does the proxy on hvn04 keep restarting?",
        )
        .await;
    assert_eq!(oom["node"], "nomad-hvn04");
    let t = &oom["tasks"][0];
    assert_eq!(t["last_exit"]["exit_code"], "137", "{oom}");
    assert_eq!(t["last_exit"]["oom_killed"], true, "{oom}");
    assert!(
        t["last_exit"]["message"]
            .as_str()
            .unwrap()
            .contains("\"OOM Killed\""),
        "{oom}"
    );
    assert!(t["restarts"].as_u64().unwrap() >= 23, "{oom}");
    assert_eq!(t["memory_used_mib"], 956, "{oom}");
    assert_eq!(t["memory_limit_mib"], 1024, "{oom}");

    // 6. hvn05's cannot even start: its Consul pre-run hook times out.
    let failed = reads
        .one(
            &client,
            "nomad.alloc_status",
            json!({"alloc_id": "f746f2a3"}),
            "why is there no proxy on hvn05?",
        )
        .await;
    assert_eq!(failed["node"], "nomad-hvn05");
    assert_eq!(failed["client_status"], "failed");
    let setup = failed["tasks"][0]["setup_failures"][0].as_str().unwrap();
    assert!(
        setup.contains("pre-run hook \"consul\" failed")
            && setup
                .contains("Post \"http://127.0.0.1:8500/v1/acl/login\": context deadline exceeded"),
        "{setup}"
    );

    // 7. Its Consul agent left the gossip.
    let members = reads
        .one(
            &client,
            "consul.members",
            json!({}),
            "did every Consul agent rejoin after the reboots?",
        )
        .await;
    let member = |m: &Value, name: &str| {
        m.as_array()
            .unwrap()
            .iter()
            .find(|x| x["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no member {name} in {m}"))
    };
    let m5 = member(&members, "nomad-hvn05");
    assert_eq!(m5["status"], "left");
    assert_eq!(m5["role"], "server");
    assert_eq!(m5["address"], "10.0.0.105:8301");

    // 8. Autopilot calls the shrunken raft healthy, with no failure tolerance left.
    let autopilot = reads
        .one(
            &client,
            "consul.autopilot_state",
            json!({}),
            "how many Consul servers can we lose before quorum goes?",
        )
        .await;
    assert_eq!(autopilot["healthy"], true);
    assert_eq!(autopilot["failure_tolerance"], 0);
    assert_eq!(autopilot["voters"], json!(["nomad-hvn01", "nomad-hvn03"]));

    // 9. hvn02 and hvn05 booted around 02:00; the others weeks ago.
    let uptime = reads
        .all(&client, "linux.uptime", "did these nodes reboot overnight?")
        .await;
    for (node, out) in &uptime {
        let up = out["uptime_seconds"].as_u64().unwrap();
        if node == "nomad-hvn02" || node == "nomad-hvn05" {
            let at = hhmm(out["booted_at"].as_str().unwrap());
            assert!(
                ("01:45".."02:15").contains(&at.as_str()),
                "{node} booted at {at}: {out}"
            );
            assert!(up < 86_400, "{node}: {out}");
        } else {
            assert!(up > 14 * 86_400, "{node}: {out}");
        }
    }

    // 10. The same kernel everywhere, no reboot pending.
    let kernels = reads
        .all(
            &client,
            "debian.kernel_info",
            "did the reboot wave land a new kernel anywhere?",
        )
        .await;
    for (node, out) in &kernels {
        assert_eq!(
            out["running_kernel"], "6.12.48+deb13-amd64",
            "{node}: {out}"
        );
        assert_eq!(out["reboot_required"], "no", "{node}: {out}");
        assert!(
            out["installed_kernel_images"].as_array().unwrap().contains(
                &json!({"package": "linux-image-6.12.48+deb13-amd64", "version": "6.12.48-1"})
            ),
            "{node}: {out}"
        );
    }

    // 11. One backend drives the load: match-api at ~1.75k req/s.
    let top = reads
        .one(
            &client,
            "vm.query_instant",
            json!({"query": TOP5}),
            "which service drives the load at the edge?",
        )
        .await;
    let mut rows: Vec<(String, f64)> = top
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["metric"]["service"].as_str().unwrap().to_owned(),
                r["value"].as_str().unwrap().parse().unwrap(),
            )
        })
        .collect();
    rows.sort_by(|a, b| b.1.total_cmp(&a.1));
    let expected = [
        ("match-api", 1751.0),
        ("web", 179.0),
        ("auth", 122.0),
        ("feed", 91.0),
        ("chat", 65.0),
    ];
    assert_eq!(rows.len(), 5, "{top}");
    for ((service, value), (want, rate)) in rows.iter().zip(expected) {
        assert_eq!(service, &format!("{want}@consulcatalog"), "{top}");
        assert!(
            (value - rate).abs() / rate < 0.05,
            "{service}: {value} req/s, expected about {rate}: {top}"
        );
    }

    // Lab time passes: the four keep OOM-looping, one restart every 70 s.
    lab.clock.advance(Duration::from_secs(700));
    let later = reads
        .one(
            &client,
            "nomad.alloc_status",
            json!({"alloc_id": "1c11be31"}),
            "is hvn04 still restarting?",
        )
        .await;
    assert_eq!(later["tasks"][0]["restarts"], 33, "{later}");

    // The two writes, with an operator's reasons: both wait for a person.
    let approver = lab.approver().await;
    let restart = call_in_background(
        &client,
        "linux.systemctl_restart",
        json!({"unit": "consul", "runners": ["nomad-hvn05"], "reason": CONSUL_REASON}),
    );
    let resize = call_in_background(
        &client,
        "nomad.task_resources_set",
        json!({"job": "traefik", "group": "traefik", "task": "traefik", "memory": 4096, "reason": NOMAD_REASON}),
    );
    let pending = wait_for_pending(&approver, 2).await;
    let id_of = |tool: &str| {
        pending
            .iter()
            .find(|a| a["tool"] == tool)
            .unwrap_or_else(|| panic!("no pending {tool}: {pending:?}"))["id"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let restart_id = id_of("linux.systemctl_restart");
    let resize_id = id_of("nomad.task_resources_set");
    let (_, request) = approver.get(&format!("/api/approvals/{resize_id}")).await;
    assert_eq!(request["reason"], NOMAD_REASON);
    let preview = request["preview"]
        .as_object()
        .unwrap()
        .values()
        .next()
        .unwrap();
    assert!(
        preview["output"]["diff"]
            .as_array()
            .unwrap()
            .contains(&json!("MemoryMB 1024 → 4096")),
        "{request}"
    );
    let (_, request) = approver.get(&format!("/api/approvals/{restart_id}")).await;
    assert_eq!(request["reason"], CONSUL_REASON);
    assert_eq!(request["runners"], json!(["nomad-hvn05"]));
    // Nothing has changed while they wait.
    assert_eq!(
        lab.consul.member_status("nomad-hvn05"),
        Some(MemberStatus::Left)
    );
    assert_eq!(
        lab.nomad.job("traefik")["TaskGroups"][0]["Tasks"][0]["Resources"]["MemoryMB"],
        1024
    );

    // The approver says yes to both, through the portal's API.
    for id in [&restart_id, &resize_id] {
        let (status, body) = approver.approve(id).await;
        assert_eq!(status, 200, "{body}");
    }
    let restarted = finished(restart).await;
    let out = structured(&restarted);
    assert_eq!(out["approval"]["state"], "executed", "{out}");
    assert_eq!(out["results"][0]["runner"], "nomad-hvn05");
    assert_eq!(
        out["results"][0]["output"]["state_after"]["ActiveState"], "active",
        "{out}"
    );
    let resized = finished(resize).await;
    let out = structured(&resized);
    assert_eq!(out["approval"]["state"], "executed", "{out}");
    let written = &out["results"][0]["output"];
    assert_eq!(written["job_modify_index"]["before"], index_before, "{out}");
    assert!(
        written["job_modify_index"]["after"].as_u64().unwrap() > index_before,
        "{out}"
    );

    // The rolling update places the new allocations one stagger (10 s) apart.
    lab.clock.advance(Duration::from_secs(60));

    // The reads come back healthy: hvn05 rejoined, three voters, hvn05 serving.
    let members = reads
        .one(
            &client,
            "consul.members",
            json!({}),
            "did hvn05 rejoin the gossip?",
        )
        .await;
    assert_eq!(member(&members, "nomad-hvn05")["status"], "alive");
    let autopilot = reads
        .one(
            &client,
            "consul.autopilot_state",
            json!({}),
            "is the quorum whole again?",
        )
        .await;
    assert_eq!(
        autopilot["voters"],
        json!(["nomad-hvn01", "nomad-hvn03", "nomad-hvn05"])
    );
    assert_eq!(autopilot["failure_tolerance"], 1);
    let ping = reads
        .call(
            &client,
            "traefik.ping",
            json!({"runners": NODES}),
            "does every node's Traefik answer now?",
        )
        .await;
    for node in NODES {
        let r = &ping[node];
        assert_eq!(r["ok"], true, "{node}: {r}");
        assert_eq!(r["output"]["http_status"], 404, "{node}: {r}");
    }
    let job = reads
        .one(
            &client,
            "nomad.job_resources",
            json!({"job": "traefik"}),
            "is the new cap in place?",
        )
        .await;
    assert_eq!(job["groups"][0]["tasks"][0]["memory_mib"], 4096);
    let allocs = current_allocs(&mut reads, &client, "did the update roll everywhere?").await;
    assert_eq!(
        allocs.keys().cloned().collect::<Vec<_>>(),
        NODES.map(String::from).to_vec(),
        "{allocs:?}"
    );
    for (node, a) in &allocs {
        assert_eq!(a["client_status"], "running", "{node}: {a}");
        assert_eq!(a["version"], 4, "{node}: {a}");
        assert_eq!(a["tasks"]["traefik"]["restarts"], 0, "{node}: {a}");
    }
    let old = reads
        .one(
            &client,
            "nomad.alloc_status",
            json!({"alloc_id": "1c11be31"}),
            "what happened to hvn04's looping allocation?",
        )
        .await;
    assert_eq!(old["desired"], "stop", "{old}");
    assert_eq!(old["client_status"], "complete", "{old}");
    let old_restarts = old["tasks"][0]["restarts"].clone();

    // Ten more minutes of lab time: no new OOM restarts anywhere.
    lab.clock.advance(Duration::from_secs(600));
    let allocs = current_allocs(&mut reads, &client, "any OOM kills since the resize?").await;
    for (node, a) in &allocs {
        assert_eq!(a["tasks"]["traefik"]["restarts"], 0, "{node}: {a}");
        assert_eq!(a["client_status"], "running", "{node}: {a}");
    }
    let hvn04 = allocs["nomad-hvn04"]["id"].as_str().unwrap().to_owned();
    let now = reads
        .one(
            &client,
            "nomad.alloc_status",
            json!({"alloc_id": &hvn04[..8]}),
            "how is hvn04's new allocation doing?",
        )
        .await;
    let t = &now["tasks"][0];
    assert_eq!(t["oom_kills"], 0, "{now}");
    assert_eq!(t["memory_limit_mib"], 4096, "{now}");
    assert!(t["memory_used_mib"].as_u64().unwrap() < 4096, "{now}");
    let old = reads
        .one(
            &client,
            "nomad.alloc_status",
            json!({"alloc_id": "1c11be31"}),
            "did the old allocation stay stopped?",
        )
        .await;
    assert_eq!(old["tasks"][0]["restarts"], old_restarts, "{old}");

    // Every read is in the audit log with its reason and its outcome per runner.
    for (call_id, tool, reason, runners) in &reads.0 {
        let events = lab
            .events(AuditFilter {
                call_id: Some(call_id.clone()),
                ..Default::default()
            })
            .await;
        let called = &events[0];
        assert_eq!(called.kind, "tool.called", "{tool}: {events:?}");
        assert_eq!(called.tool.as_deref(), Some(tool.as_str()));
        assert_eq!(called.reason.as_deref(), Some(reason.as_str()), "{tool}");
        assert_eq!(called.actor, "agent:dev-agent");
        let outcomes = events
            .iter()
            .filter(|e| e.kind == "call.executed" || e.kind == "call.failed")
            .count();
        assert_eq!(outcomes, *runners, "{tool}: {events:?}");
    }
    // ... and each approval's transitions, in order, with who made them.
    for (id, reason) in [(&restart_id, CONSUL_REASON), (&resize_id, NOMAD_REASON)] {
        let events = lab
            .events(AuditFilter {
                approval_id: Some(id.clone()),
                ..Default::default()
            })
            .await;
        let trail: Vec<(&str, &str)> = events
            .iter()
            .map(|e| (e.kind.as_str(), e.actor.as_str()))
            .collect();
        assert_eq!(
            trail,
            [
                ("tool.called", "agent:dev-agent"),
                ("approval.requested", "agent:dev-agent"),
                ("approval.approved", "approver:dev-approver"),
                ("approval.executing", "approver:dev-approver"),
                ("call.executed", "agent:dev-agent"),
            ],
            "{events:?}"
        );
        assert_eq!(events[0].reason.as_deref(), Some(reason));
    }
    lab.verify_with_cli();
    client.cancel().await.unwrap();
}

/// The lab keeps its promise that the packs are the stock ones, unchanged: every stock read
/// tool of the incident's services (all but Redis), called as its pack's example shows (on all five nodes for node tools), answers on
/// the lab, except Traefik on hvn05, which refuses; and the BGP writes withdraw and restore
/// hvn05's advertisement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lab_every_stock_read_answers_and_bgp_shutdown_withdraws_the_vip() {
    let lab = RunningLab::start().await;
    let client = lab.agent().await;
    let packs = emisar::pack::PackSet::load(None).unwrap();
    let mut tools: Vec<_> = packs
        .tools()
        .filter(|t| t.risk == emisar::pack::Risk::Read)
        // The incident's fleet runs no Redis: the redis pack is tested against real
        // redis-servers in packs_redis.
        .filter(|t| !t.name.starts_with("redis."))
        .collect();
    tools.sort_by(|a, b| a.name.cmp(&b.name));
    let five_minutes_ago = (chrono::Utc::now().timestamp() - 300).to_string();
    let mut called = Vec::new();
    for tool in tools {
        let mut args = tool.example.clone().unwrap_or_else(|| json!({}));
        // The examples' values that name things the lab does not have.
        match tool.name.as_str() {
            "frr.neighbor" => args["neighbor"] = json!("10.0.0.1"),
            "traefik.service" => args["name"] = json!("match-api@consulcatalog"),
            "vm.query_range" => args["start"] = json!(five_minutes_ago),
            _ => {}
        }
        let node = tool.scope == emisar::pack::Scope::Node;
        let obj = args.as_object_mut().unwrap();
        obj.remove("runners");
        if node {
            obj.insert("runners".into(), json!(NODES));
        }
        obj.insert(
            "reason".into(),
            json!("does the stock pack work on the lab?"),
        );
        let res = call(&client, &tool.name, args).await;
        let s = structured(&res);
        let results = s["results"]
            .as_array()
            .unwrap_or_else(|| panic!("{}: {s}", tool.name));
        assert_eq!(
            results.len(),
            if node { 5 } else { 1 },
            "{}: {s}",
            tool.name
        );
        for r in results {
            if tool.name.starts_with("traefik.") && r["runner"] == "nomad-hvn05" {
                assert!(
                    r["error"]
                        .as_str()
                        .unwrap_or("")
                        .contains("Connection refused"),
                    "{}: {r}",
                    tool.name
                );
            } else {
                assert_eq!(r["ok"], true, "{}: {r}", tool.name);
                assert!(!r["output"].is_null(), "{}: {r}", tool.name);
            }
        }
        called.push(tool.name.clone());
    }
    assert!(called.len() >= 20, "{called:?}");

    // frr.bgp_neighbor_shutdown pulls hvn05 out of the anycast; enable puts it back.
    let approver = lab.approver().await;
    let vip_on_hvn05 = |client: &RunningService<RoleClient, ()>| {
        let peer = client.peer().clone();
        async move {
            let args = json!({"runners": ["nomad-hvn05"], "reason": "is hvn05 advertising?"});
            let res = peer
                .call_tool(
                    rmcp::model::CallToolRequestParams::new("frr.bgp_summary")
                        .with_arguments(args.as_object().unwrap().clone()),
                )
                .await
                .unwrap();
            structured(&res)["results"][0]["output"]["address_families"][0]["peers"][0].clone()
        }
    };
    for (tool, state, sent) in [
        ("frr.bgp_neighbor_shutdown", "Idle (Admin)", 0),
        ("frr.bgp_neighbor_enable", "Established", 1),
    ] {
        let write = call_in_background(
            &client,
            tool,
            json!({"neighbor": "10.0.0.1", "runners": ["nomad-hvn05"], "reason": "anycast drill"}),
        );
        let pending = wait_for_pending(&approver, 1).await;
        let (status, body) = approver.approve(pending[0]["id"].as_str().unwrap()).await;
        assert_eq!(status, 200, "{body}");
        let out = structured(&finished(write).await);
        assert_eq!(out["approval"]["state"], "executed", "{out}");
        assert_eq!(out["results"][0]["output"]["local_as"], 65100, "{out}");
        let peer = vip_on_hvn05(&client).await;
        assert_eq!(peer["state"], state, "after {tool}: {peer}");
        assert_eq!(peer["prefixes_sent"], sent, "after {tool}: {peer}");
    }
    lab.verify_with_cli();
    client.cancel().await.unwrap();
}

/// The pending requests, once there are `n` of them.
pub(crate) async fn wait_for_pending(p: &Portal, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = p.get("/api/approvals?state=pending").await;
        assert_eq!(status, 200, "{body}");
        let list = body["approvals"].as_array().unwrap().clone();
        if list.len() >= n {
            return list;
        }
        assert!(
            Instant::now() < deadline,
            "{n} pending requests did not appear within 30 s: {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The portal in a real browser on the lab: both requests listed live, each
/// detail with its reason and preview (the restart's unit state and dependents, the Nomad
/// one's plan diff), approved there, executed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lab_portal_in_a_real_browser_shows_and_approves_both_requests() {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let node = require("node/bin/node");
    let chromium = require_path(Path::new("/usr/bin/chromium"));
    require_path(&repo.join("tests/browser/node_modules/playwright-core/package.json"));
    let lab = RunningLab::start().await;
    let shots = repo.join("target/lab-e2e");
    std::fs::create_dir_all(&shots).unwrap();
    for entry in std::fs::read_dir(&shots).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "png") {
            std::fs::remove_file(&path).unwrap();
        }
    }
    let requests = json!([
        // The restart's preview, read from hvn05's systemctl: what depends on consul, and
        // how many times systemd restarted it.
        {"tool": "linux.systemctl_restart", "reason": CONSUL_REASON,
         "shows": ["\"nomad.service\"", "\"multi-user.target\"", "\"restarts\": 0", "\"active_state\": \"active\""],
         "screenshot": "lab-consul-restart.png"},
        {"tool": "nomad.task_resources_set", "reason": NOMAD_REASON, "diff": "MemoryMB 1024 → 4096",
         "screenshot": "lab-nomad-memory.png"},
    ]);
    let tmp = tempfile::tempdir().unwrap();
    let mut driver = Driver::spawn(
        &repo,
        &node,
        "tests/browser/lab_e2e.mjs",
        &[
            ("PORTAL_URL", format!("{}/", lab.base())),
            ("PORTAL_USER", lab.info["approver"].as_str().unwrap().into()),
            (
                "PORTAL_PASSWORD",
                lab.info["approver_password"].as_str().unwrap().into(),
            ),
            ("SCREENSHOT_DIR", shots.display().to_string()),
            ("LAB_REQUESTS", requests.to_string()),
            ("CHROMIUM", chromium.display().to_string()),
            ("TMPDIR", tmp.path().display().to_string()),
        ],
    );
    let client = lab.agent().await;
    let browser = async {
        let ready = driver.expect_line("READY").await;
        assert_eq!(ready, "READY", "{}", driver.transcript());
        let restart = call_in_background(
            &client,
            "linux.systemctl_restart",
            json!({"unit": "consul", "runners": ["nomad-hvn05"], "reason": CONSUL_REASON}),
        );
        let resize = call_in_background(
            &client,
            "nomad.task_resources_set",
            json!({"job": "traefik", "group": "traefik", "task": "traefik", "memory": 4096, "reason": NOMAD_REASON}),
        );
        let pending = driver.expect_json("{\"pending\": 2}").await;
        assert_eq!(pending, json!({"pending": 2}), "{}", driver.transcript());
        for tool in ["linux.systemctl_restart", "nomad.task_resources_set"] {
            let line = driver.expect_json("{\"executed\": TOOL}").await;
            assert_eq!(line, json!({"executed": tool}), "{}", driver.transcript());
        }
        let done = driver.expect_json("{\"done\": true}").await;
        assert_eq!(done, json!({"done": true}), "{}", driver.transcript());
        let status = driver.wait_exit().await;
        assert!(
            status.success(),
            "driver exited with {status}\n{}",
            driver.transcript()
        );
        (finished(restart).await, finished(resize).await)
    };
    let (restarted, resized) = match tokio::time::timeout(Duration::from_secs(120), browser).await {
        Ok(r) => r,
        Err(_) => panic!(
            "the browser test did not finish within 120 s\n{}",
            driver.transcript()
        ),
    };
    for res in [&restarted, &resized] {
        let out = structured(res);
        assert_eq!(out["approval"]["state"], "executed", "{out}");
        let id = out["approval"]["approval_id"].as_str().unwrap();
        let approved = lab
            .events(AuditFilter {
                approval_id: Some(id.to_owned()),
                kind: Some("approval.approved".into()),
                ..Default::default()
            })
            .await;
        assert_eq!(approved.len(), 1);
        assert_eq!(approved[0].actor, "approver:dev-approver");
    }
    assert_eq!(
        lab.consul.member_status("nomad-hvn05"),
        Some(MemberStatus::Alive)
    );
    assert_eq!(
        lab.nomad.job("traefik")["TaskGroups"][0]["Tasks"][0]["Resources"]["MemoryMB"],
        4096
    );
    for name in [
        "lab-approvals.png",
        "lab-consul-restart.png",
        "lab-nomad-memory.png",
    ] {
        assert_png(&shots.join(name));
    }
    assert!(!shots.join("lab-99-failure.png").exists());
    if std::env::var("EMISAR_UPDATE_DOCS").is_ok_and(|v| v == "1") {
        for name in ["lab-consul-restart.png", "lab-nomad-memory.png"] {
            std::fs::copy(shots.join(name), repo.join("docs").join(name)).unwrap();
        }
    }
    lab.verify_with_cli();
    client.cancel().await.unwrap();
}

/// Runs `cmd`, which must exit with an error within 60 s (a lab that starts instead is
/// stopped and fails the test); returns what it printed.
async fn exits_with_error(mut cmd: std::process::Command) -> std::process::Output {
    let child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut proc = Proc(child);
    let deadline = Instant::now() + Duration::from_secs(60);
    while proc.0.try_wait().unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "{cmd:?} was expected to refuse, but it is still running after 60 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut out = std::process::Output {
        status: proc.0.wait().unwrap(),
        stdout: Vec::new(),
        stderr: Vec::new(),
    };
    use std::io::Read;
    proc.0
        .stdout
        .take()
        .unwrap()
        .read_to_end(&mut out.stdout)
        .unwrap();
    proc.0
        .stderr
        .take()
        .unwrap()
        .read_to_end(&mut out.stderr)
        .unwrap();
    assert!(!out.status.success(), "{cmd:?} succeeded");
    out
}

/// `emisar lab` itself: starts in one command, prints where everything is, writes dev.json,
/// answers through its stand-ins, refuses a directory that is not its own, stops on SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lab_command_starts_prints_and_stops() {
    require_path(Path::new(VM));
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("lab");
    let started = Instant::now();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_emisar"))
        .args([
            "lab",
            "--listen",
            "127.0.0.1:0",
            "--speed",
            "0",
            "--state-dir",
        ])
        .arg(&state)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let lab = Proc(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut banner = String::new();
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            banner.push_str(&line);
            banner.push('\n');
            if line == "Stop with Ctrl-C." {
                let _ = tx.send(banner.clone());
            }
        }
    });
    let banner = tokio::task::spawn_blocking(move || rx.recv_timeout(Duration::from_secs(120)))
        .await
        .unwrap()
        .expect("emisar lab prints its banner within 120 s");
    eprintln!(
        "emisar lab printed its banner {} ms after the command started:\n{banner}",
        started.elapsed().as_millis()
    );
    let info: Value =
        serde_json::from_str(&std::fs::read_to_string(state.join("dev.json")).unwrap()).unwrap();
    for key in [
        "portal_url",
        "mcp_url",
        "agent_token",
        "approver",
        "approver_password",
    ] {
        let value = info[key]
            .as_str()
            .unwrap_or_else(|| panic!("dev.json has no {key}"));
        assert!(banner.contains(value), "the banner shows {key}: {banner}");
    }
    assert_eq!(info["runners"], json!(NODES));
    assert!(
        banner.contains("nomad-hvn05") && banner.contains("(refusing: nothing listens)"),
        "{banner}"
    );
    for node in NODES {
        let script = state.join("nodes").join(node).join("bin").join("vtysh");
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&script).unwrap().permissions(),
        );
        assert_eq!(
            mode & 0o077,
            0,
            "{} holds the lab's token",
            script.display()
        );
    }

    // The stand-ins answer through the binary: hvn05 still advertises the VIP.
    let client = mcp_client(
        info["mcp_url"].as_str().unwrap(),
        info["agent_token"].as_str().unwrap(),
    )
    .await;
    let res = call(
        &client,
        "frr.bgp_summary",
        json!({"runners": ["nomad-hvn05"], "reason": "is hvn05 still advertising?"}),
    )
    .await;
    let out = &structured(&res)["results"][0];
    assert_eq!(out["ok"], true, "{out}");
    assert_eq!(
        out["output"]["address_families"][0]["peers"][0]["prefixes_sent"],
        1
    );
    client.cancel().await.unwrap();

    // A second lab on a directory that is not a lab's is refused, and the directory is kept.
    let foreign = dir.path().join("foreign");
    std::fs::create_dir_all(&foreign).unwrap();
    std::fs::write(foreign.join("notes.txt"), "mine").unwrap();
    let mut refused = std::process::Command::new(env!("CARGO_BIN_EXE_emisar"));
    refused
        .args(["lab", "--listen", "127.0.0.1:0", "--state-dir"])
        .arg(&foreign);
    let out = exits_with_error(refused).await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("is not a lab directory (it has no lab.json)"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(foreign.join("notes.txt")).unwrap(),
        "mine"
    );
    let mut bad_speed = std::process::Command::new(env!("CARGO_BIN_EXE_emisar"));
    bad_speed
        .args([
            "lab",
            "--speed=-1",
            "--listen",
            "127.0.0.1:0",
            "--state-dir",
        ])
        .arg(dir.path().join("other"));
    let out = exits_with_error(bad_speed).await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--speed must be a number from 0"), "{err}");

    // SIGTERM stops it (and its VictoriaMetrics) cleanly.
    let mut lab = lab;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(lab.0.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = lab.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "emisar lab did not stop within 30 s of SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "emisar lab exited with {status}");
    let vm_url = info["lab"]["victoriametrics_url"].as_str().unwrap();
    assert!(
        reqwest::get(format!("{vm_url}/health")).await.is_err(),
        "victoria-metrics outlived the lab"
    );
}
