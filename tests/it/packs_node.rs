//! The node-scoped packs: linux and debian on this machine, linux.systemctl_restart and
//! linux.systemctl_reload through a recording stand-in (there is no systemd here),
//! debian.package_upgrade with the real apt and dpkg on a throwaway root, and FRR for real in
//! network namespaces.

use emisar::protocol::Mode;
use serde_json::json;

use emisar::server::principal::Role;

use crate::approvals::{
    Portal, add_user, call_in_background, finished, kinds_of, signed_in, systemctl_cannot_reload,
    systemctl_standin, wait_for_pending,
};
use crate::harness::app::Options;
use crate::harness::apt::AptRoot;
use crate::harness::frr::FrrPair;
use crate::harness::tools::only_output as output;
use crate::harness::{Backend, RunnerSpec, spawn_app};
use crate::mcp_calls::call;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn linux_uptime_and_debian_kernel_info_read_this_machine() {
    let app = spawn_app(
        Backend::Sqlite,
        vec![RunnerSpec::new("node-1")],
        Options::default(),
    )
    .await;
    let client = app.mcp_client().await;
    let up = output(
        &call(
            &client,
            "linux.uptime",
            json!({"runners": ["node-1"], "reason": "when did it boot?"}),
        )
        .await,
    );
    let proc_uptime: f64 = std::fs::read_to_string("/proc/uptime")
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let reported = up["uptime_seconds"].as_i64().unwrap() as f64;
    assert!((reported - proc_uptime).abs() < 30.0, "{up}");
    let booted = chrono::DateTime::parse_from_rfc3339(up["booted_at"].as_str().unwrap()).unwrap();
    let expected = chrono::Utc::now() - chrono::Duration::seconds(proc_uptime as i64);
    assert!(
        (booted.timestamp() - expected.timestamp()).abs() < 30,
        "{up}"
    );
    assert!(
        up["load"]["1m"].as_str().unwrap().parse::<f64>().is_ok(),
        "{up}"
    );

    let k = output(
        &call(
            &client,
            "debian.kernel_info",
            json!({"runners": ["node-1"], "reason": "kernel?"}),
        )
        .await,
    );
    let uname = std::process::Command::new("uname")
        .arg("-r")
        .output()
        .unwrap();
    assert_eq!(
        k["running_kernel"],
        String::from_utf8_lossy(&uname.stdout).trim()
    );
    let flag = std::path::Path::new("/run/reboot-required").exists();
    assert_eq!(k["reboot_required"], if flag { "yes" } else { "no" });
    assert!(
        k["caveat"]
            .as_str()
            .unwrap()
            .contains("absence proves nothing")
    );
    assert!(k["installed_kernel_images"].is_array());
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn systemctl_restart_runs_exact_argv_and_only_allowlisted_units() {
    let bin = tempfile::tempdir().unwrap();
    let record = systemctl_standin(bin.path());
    let app = spawn_app(
        Backend::Sqlite,
        vec![
            RunnerSpec::new("nomad-hvn05")
                .path_first(bin.path())
                .allow("systemd_units", &["consul", "nomad.service"]),
            RunnerSpec::new("locked-down").path_first(bin.path()),
        ],
        Options::default(),
    )
    .await;

    // Outside the allowlist: refused before anything runs.
    let refused = app
        .signed_call(
            "nomad-hvn05",
            "linux.systemctl_restart",
            json!({"unit": "sshd"}),
            Mode::Execute,
            None,
        )
        .await;
    assert_eq!(refused.status, 403, "{}", refused.body);
    assert!(
        refused.body["error"]
            .as_str()
            .unwrap()
            .contains("not in this runner's allowlist `systemd_units`")
    );
    assert!(!record.exists(), "systemctl must not have run");
    // A runner with no allowlist refuses every unit.
    let refused = app
        .signed_call(
            "locked-down",
            "linux.systemctl_restart",
            json!({"unit": "consul"}),
            Mode::Execute,
            None,
        )
        .await;
    assert_eq!(refused.status, 403);
    assert!(!record.exists());
    // Not a unit name by systemd's grammar (an option, a shell metacharacter): refused by the schema.
    for bad in ["--force", "consul;reboot", "$(reboot)"] {
        let r = app
            .signed_call(
                "nomad-hvn05",
                "linux.systemctl_restart",
                json!({"unit": bad}),
                Mode::Execute,
                None,
            )
            .await;
        assert_eq!(r.status, 400, "{bad}: {}", r.body);
        assert!(r.body["error"].as_str().unwrap().contains("`unit`"));
    }
    assert!(!record.exists());

    // Allowed ("consul" matches the list's "consul", "nomad" matches "nomad.service").
    let done = app
        .signed_call(
            "nomad-hvn05",
            "linux.systemctl_restart",
            json!({"unit": "consul"}),
            Mode::Execute,
            None,
        )
        .await;
    assert_eq!(done.body["status"], "ok", "{}", done.body);
    assert_eq!(done.body["output"]["state_after"]["ActiveState"], "active");
    let done = app
        .signed_call(
            "nomad-hvn05",
            "linux.systemctl_restart",
            json!({"unit": "nomad"}),
            Mode::Execute,
            None,
        )
        .await;
    assert_eq!(done.body["status"], "ok", "{}", done.body);
    let argv = std::fs::read_to_string(&record).unwrap();
    assert_eq!(
        argv.lines().collect::<Vec<_>>(),
        vec![
            "restart -- consul",
            "show --no-pager -p ActiveState,SubState,MainPID,ActiveEnterTimestamp -- consul",
            "restart -- nomad",
            "show --no-pager -p ActiveState,SubState,MainPID,ActiveEnterTimestamp -- nomad",
        ]
    );
}

/// The approver of a restart sees what systemctl says at request time: the unit's state,
/// its restarts and last activation, and what depends on it (`list-dependencies
/// --reverse`). Only reads run before the yes; the execution restarts the unit shown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn systemctl_restart_previews_the_unit_and_its_dependents_for_the_approver() {
    let bin = tempfile::tempdir().unwrap();
    let record = systemctl_standin(bin.path());
    let app = spawn_app(
        Backend::Sqlite,
        vec![
            RunnerSpec::new("nomad-hvn05")
                .path_first(bin.path())
                .allow("systemd_units", &["consul"]),
        ],
        Options::default(),
    )
    .await;
    let password = add_user(&app, "alice", Role::Approver).await;
    let alice = Portal::login(&app, "alice", &password).await;
    let client = app.mcp_client().await;
    let asked = call_in_background(
        &client,
        "linux.systemctl_restart",
        json!({"unit": "consul", "runners": ["nomad-hvn05"], "reason": "consul is wedged"}),
    );
    let id = wait_for_pending(&alice).await;
    let (_, row) = alice.get(&format!("/api/approvals/{id}")).await;
    assert_eq!(
        row["preview"]["nomad-hvn05"]["output"],
        json!({
            "unit": "consul.service", "load_state": "loaded", "active_state": "active",
            "sub_state": "running", "result": "success", "main_pid": 4242, "restarts": 0,
            "last_activation": "Sun 2026-12-06 09:00:00 UTC",
            "depended_on_by": ["multi-user.target", "graphical.target"],
            "runs": "systemctl restart -- consul",
        }),
        "{row}"
    );
    assert_eq!(row["no_preview_reason"], json!(null), "{row}");
    let argv = |record: &std::path::Path| -> Vec<String> {
        std::fs::read_to_string(record)
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect()
    };
    let reads = [
        "show --no-pager -p Id,LoadState,ActiveState,SubState,Result,MainPID,NRestarts,ActiveEnterTimestamp -- consul",
        "list-dependencies --reverse --plain --no-pager -- consul",
    ];
    assert_eq!(argv(&record), reads, "only reads before the approval");

    let (status, body) = alice.approve(&id).await;
    assert_eq!(status, 200, "{body}");
    let done = output(&finished(asked).await);
    assert_eq!(done["restarted"], true, "{done}");
    assert_eq!(
        argv(&record),
        [
            reads[0],
            reads[1],
            "restart -- consul",
            "show --no-pager -p ActiveState,SubState,MainPID,ActiveEnterTimestamp -- consul",
        ]
    );
    client.cancel().await.unwrap();
}

/// The lines of the stand-in `systemctl`'s record.
fn recorded(record: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(record)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

const RELOAD_PREVIEW_ARGV: &str = "show --no-pager -p Id,LoadState,ActiveState,SubState,CanReload,MainPID,ActiveEnterTimestamp -- consul";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn systemctl_reload_previews_waits_for_a_person_and_runs_exact_argv() {
    let bin = tempfile::tempdir().unwrap();
    let record = systemctl_standin(bin.path());
    systemctl_cannot_reload(bin.path(), "cron.service");
    let app = spawn_app(
        Backend::Sqlite,
        vec![
            RunnerSpec::new("nomad-hvn05")
                .path_first(bin.path())
                .allow("systemd_units", &["consul", "cron"]),
        ],
        Options::default(),
    )
    .await;

    // Outside the allowlist: refused before anything runs, preview included.
    for mode in [Mode::Preview, Mode::Execute] {
        let refused = app
            .signed_call(
                "nomad-hvn05",
                "linux.systemctl_reload",
                json!({"unit": "sshd"}),
                mode,
                None,
            )
            .await;
        assert_eq!(refused.status, 403, "{}", refused.body);
        assert!(
            refused.body["error"]
                .as_str()
                .unwrap()
                .contains("not in this runner's allowlist `systemd_units`"),
            "{}",
            refused.body
        );
    }
    assert!(!record.exists(), "systemctl must not have run");

    // A unit that cannot reload: the preview refuses, so nobody is asked and nothing reloads.
    let client = app.mcp_client().await;
    let alice = signed_in(&app, "alice", Role::Approver).await;
    let res = call(
        &client,
        "linux.systemctl_reload",
        json!({"unit": "cron", "runners": ["nomad-hvn05"], "reason": "pick up the new crontab"}),
    )
    .await;
    assert_eq!(res.is_error, Some(true), "{res:?}");
    let error = res.structured_content.clone().unwrap()["error"].clone();
    assert_eq!(error["kind"], "preview_failed", "{error}");
    assert!(
        error
            .to_string()
            .contains("unit `cron` cannot reload (CanReload=no: it declares no ExecReload=)"),
        "{error}"
    );
    assert_eq!(
        recorded(&record),
        [RELOAD_PREVIEW_ARGV.replace("-- consul", "-- cron")]
    );
    assert!(crate::approvals::pending_ids(&alice).await.is_empty());

    // A unit that can: the approver sees its state before anyone says yes.
    std::fs::remove_file(&record).unwrap();
    let asked = call_in_background(
        &client,
        "linux.systemctl_reload",
        json!({"unit": "consul", "runners": ["nomad-hvn05"], "reason": "consul has a new service definition"}),
    );
    let id = wait_for_pending(&alice).await;
    let (status, request) = alice.get(&format!("/api/approvals/{id}")).await;
    assert_eq!(status, 200, "{request}");
    let preview = &request["preview"]["nomad-hvn05"]["output"];
    assert_eq!(
        *preview,
        json!({"unit": "consul.service", "command": "systemctl reload -- consul",
               "state": {"ActiveState": "active", "SubState": "running"}, "can_reload": true,
               "main_pid": "4242", "active_since": "Sun 2026-12-06 09:00:00 UTC"}),
        "{request}"
    );
    assert_eq!(
        recorded(&record),
        [RELOAD_PREVIEW_ARGV],
        "nothing reloads before the yes"
    );
    let (status, body) = alice.approve(&id).await;
    assert_eq!(status, 200, "{body}");
    let res = finished(asked).await;
    assert_eq!(res.is_error, Some(false), "{res:?}");
    let out = res.structured_content.unwrap();
    let result = &out["results"][0]["output"];
    assert_eq!(result["reloaded"], true, "{out}");
    assert_eq!(result["main_pid_before"], "4242", "{out}");
    assert_eq!(result["state_after"]["ActiveState"], "active", "{out}");
    assert_eq!(
        recorded(&record),
        [
            RELOAD_PREVIEW_ARGV,
            "reload -- consul",
            "show --no-pager -p ActiveState,SubState,MainPID,ActiveEnterTimestamp -- consul",
        ]
    );
    assert_eq!(
        kinds_of(&app, &id).await,
        [
            "tool.called",
            "approval.requested",
            "approval.approved",
            "approval.executing",
            "call.executed"
        ]
    );
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frr_bgp_summary_shutdown_and_enable_on_real_routers() {
    let frr = FrrPair::start();
    frr.a.wait_peer_state("10.255.0.2", "Established").await;
    let vtysh_a = [
        "/usr/bin/vtysh",
        "--vty_socket",
        frr.a.dir.to_str().unwrap(),
    ];
    let app = spawn_app(
        Backend::Sqlite,
        vec![RunnerSpec::new("rA").program("vtysh", &vtysh_a)],
        Options::default(),
    )
    .await;
    let client = app.mcp_client().await;
    // Prefix counters settle a moment after Established.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let summary = loop {
        let s = output(
            &call(
                &client,
                "frr.bgp_summary",
                json!({"runners": ["rA"], "reason": "who advertises?"}),
            )
            .await,
        );
        let p = &s["address_families"][0]["peers"][0];
        if (p["prefixes_received"] == 1 && p["prefixes_sent"].as_u64().unwrap_or(0) >= 1)
            || std::time::Instant::now() > deadline
        {
            break s;
        }
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    };
    assert_eq!(summary["local_as"], 65001);
    assert_eq!(summary["router_id"], "10.255.0.1");
    assert_eq!(summary["address_families"][0]["afi"], "ipv4Unicast");
    let peer = &summary["address_families"][0]["peers"][0];
    assert_eq!(peer["neighbor"], "10.255.0.2");
    assert_eq!(peer["remote_as"], 65002);
    assert_eq!(peer["state"], "Established");
    assert_eq!(peer["prefixes_received"], 1, "{summary}");
    assert!(peer["prefixes_sent"].as_u64().unwrap() >= 1, "{summary}");
    assert!(frr.b.has_route("192.0.2.0/24"));

    // Shut the neighbor down, the whole way: an agent asks over MCP, the write waits for a
    // person, who approves it in the portal over HTTP; the server has the runner run it on
    // the real router. rA goes Idle (Admin), rB loses rA's prefix.
    let password = add_user(&app, "alice", Role::Approver).await;
    let alice = Portal::login(&app, "alice", &password).await;
    let asked = call_in_background(
        &client,
        "frr.bgp_neighbor_shutdown",
        json!({"neighbor": "10.255.0.2", "runners": ["rA"], "reason": "drain rA before maintenance"}),
    );
    let id = wait_for_pending(&alice).await;
    assert_eq!(
        frr.a.vtysh_json("show bgp summary json")["ipv4Unicast"]["peers"]["10.255.0.2"]["state"],
        "Established",
        "nothing is configured before the approval"
    );
    // What the approver saw, read from bgpd at request time: the session, its prefixes, the
    // exact commands under the ASN the preview sealed, and what rB will lose (rA's own
    // prefix, and rB's, which eBGP sends back).
    let (_, row) = alice.get(&format!("/api/approvals/{id}")).await;
    let seen = &row["preview"]["rA"]["output"];
    assert_eq!(seen["state"], "Established", "{row}");
    assert_eq!(seen["admin_shutdown"], false, "{seen}");
    assert_eq!(seen["local_as"], 65001, "{seen}");
    assert_eq!(seen["remote_as"], 65002, "{seen}");
    assert_eq!(seen["description"], "peer-rA-to-65002", "{seen}");
    assert_eq!(seen["prefixes_received"], 1, "{seen}");
    assert_eq!(seen["prefixes_sent"], 2, "{seen}");
    assert_eq!(
        seen["vtysh"],
        json!([
            "configure terminal",
            "router bgp 65001",
            "neighbor 10.255.0.2 shutdown message emisar: approved shutdown",
            "end"
        ]),
        "{seen}"
    );
    assert_eq!(
        seen["peer_loses"],
        json!(["192.0.2.0/24", "198.51.100.0/24"]),
        "{seen}"
    );
    assert_eq!(row["execution_vars"]["rA"], json!({"asn": 65001}), "{row}");
    assert_eq!(row["no_preview_reason"], json!(null), "{row}");
    let (status, body) = alice.approve(&id).await;
    assert_eq!(status, 200, "{body}");
    let res = finished(asked).await;
    let r = output(&res);
    assert_eq!(r["local_as"], 65001, "the ASN was read from bgpd: {r}");
    assert_eq!(r["after"]["admin_shutdown"], true, "{r}");
    assert_eq!(
        kinds_of(&app, &id).await,
        [
            "tool.called",
            "approval.requested",
            "approval.approved",
            "approval.executing",
            "call.executed"
        ]
    );
    frr.a.wait_peer_state("10.255.0.2", "Idle (Admin)").await;
    let s = output(
        &call(
            &client,
            "frr.bgp_summary",
            json!({"runners": ["rA"], "reason": "after shutdown"}),
        )
        .await,
    );
    assert_eq!(
        s["address_families"][0]["peers"][0]["state"],
        "Idle (Admin)"
    );
    assert_eq!(s["address_families"][0]["peers"][0]["peer_state"], "Admin");
    wait_for(
        || !frr.b.has_route("192.0.2.0/24"),
        "rB to lose 192.0.2.0/24",
    )
    .await;
    let n = output(
        &call(
            &client,
            "frr.neighbor",
            json!({"neighbor": "10.255.0.2", "runners": ["rA"], "reason": "detail"}),
        )
        .await,
    );
    assert_eq!(n["admin_shutdown"], true);

    // And back, the same way: the preview shows the session shut down and what rB will
    // learn once it is up (rA's best routes not learned from rB: its own prefix).
    let asked = call_in_background(
        &client,
        "frr.bgp_neighbor_enable",
        json!({"neighbor": "10.255.0.2", "runners": ["rA"], "reason": "rA serves again"}),
    );
    let id = wait_for_pending(&alice).await;
    let (_, row) = alice.get(&format!("/api/approvals/{id}")).await;
    let seen = &row["preview"]["rA"]["output"];
    assert_eq!(seen["state"], "Idle", "{row}");
    assert_eq!(seen["admin_shutdown"], true, "{seen}");
    assert_eq!(seen["prefixes_sent"], 0, "{seen}");
    assert_eq!(
        seen["vtysh"],
        json!([
            "configure terminal",
            "router bgp 65001",
            "no neighbor 10.255.0.2 shutdown",
            "end"
        ]),
        "{seen}"
    );
    assert_eq!(seen["peer_learns"], json!(["192.0.2.0/24"]), "{seen}");
    assert!(
        !frr.b.has_route("192.0.2.0/24"),
        "nothing is configured before the approval"
    );
    let (status, body) = alice.approve(&id).await;
    assert_eq!(status, 200, "{body}");
    let r = output(&finished(asked).await);
    assert_eq!(r["enabled"], true, "{r}");
    assert_eq!(r["local_as"], 65001, "the ASN the preview sealed: {r}");
    frr.a.wait_peer_state("10.255.0.2", "Established").await;
    wait_for(
        || frr.b.has_route("192.0.2.0/24"),
        "rB to learn 192.0.2.0/24 again",
    )
    .await;

    // A neighbor that does not exist: the preview's precondition says so, before any request
    // reaches a person, and nothing is configured.
    let r = app
        .signed_call(
            "rA",
            "frr.bgp_neighbor_shutdown",
            json!({"neighbor": "10.9.9.9"}),
            Mode::Preview,
            None,
        )
        .await;
    assert_eq!(r.body["status"], "failed");
    assert!(
        r.body["error"]
            .as_str()
            .unwrap()
            .contains("10.9.9.9 is not a BGP neighbor of AS 65001"),
        "{}",
        r.body
    );
    assert!(!frr.a.vtysh("show running-config").contains("10.9.9.9"));
    client.cancel().await.unwrap();
}

/// The BGP writes' health gates, run by the runner (`Mode::Verify`) against real bgpd: an
/// enable's passes only once the session is Established, a shutdown's only once the
/// neighbor is administratively down, each fails with what bgpd says otherwise, and a
/// neighbor that does not exist fails both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frr_verify_gates_enable_and_shutdown_on_real_routers() {
    let frr = FrrPair::start();
    frr.a.wait_peer_state("10.255.0.2", "Established").await;
    let vtysh_a = [
        "/usr/bin/vtysh",
        "--vty_socket",
        frr.a.dir.to_str().unwrap(),
    ];
    let app = spawn_app(
        Backend::Sqlite,
        vec![RunnerSpec::new("rA").program("vtysh", &vtysh_a)],
        Options::default(),
    )
    .await;
    let peer = json!({"neighbor": "10.255.0.2"});
    let run = async |tool: &str, mode: Mode, args: &serde_json::Value, preview| {
        app.signed_call("rA", tool, args.clone(), mode, preview)
            .await
    };
    let verify =
        async |tool: &str, args: &serde_json::Value| run(tool, Mode::Verify, args, None).await;
    let failed = |answer: &crate::harness::app::DirectAnswer, why: &str| {
        assert_eq!(answer.body["status"], "failed", "{}", answer.body);
        assert!(
            answer.body["error"].as_str().unwrap().contains(why),
            "want `{why}`: {}",
            answer.body
        );
    };
    // A gate retries until its deadline; so does this test, within the pack's within_s.
    let verify_until_ok = async |tool: &str| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let answer = verify(tool, &peer).await;
            if answer.body["status"] == "ok" || std::time::Instant::now() > deadline {
                return answer;
            }
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        }
    };

    // Established: the enable's gate passes, the shutdown's fails.
    let up = verify("frr.bgp_neighbor_enable", &peer).await;
    assert_eq!(up.body["status"], "ok", "{}", up.body);
    assert_eq!(up.body["vars"]["state"], "Established", "{}", up.body);
    failed(
        &verify("frr.bgp_neighbor_shutdown", &peer).await,
        "precondition failed: neighbor 10.255.0.2 is not administratively shut down (state Established)",
    );

    // The shutdown, as approved (preview, then execution with its values).
    let preview = run("frr.bgp_neighbor_shutdown", Mode::Preview, &peer, None).await;
    assert_eq!(preview.body["status"], "ok", "{}", preview.body);
    let done = run(
        "frr.bgp_neighbor_shutdown",
        Mode::Execute,
        &peer,
        Some(&preview),
    )
    .await;
    assert_eq!(done.body["status"], "ok", "{}", done.body);
    let down = verify_until_ok("frr.bgp_neighbor_shutdown").await;
    assert_eq!(down.body["status"], "ok", "{}", down.body);
    assert_ne!(down.body["vars"]["state"], "Established", "{}", down.body);
    assert_eq!(
        frr.a.vtysh_json("show bgp summary json")["ipv4Unicast"]["peers"]["10.255.0.2"]["state"],
        "Idle (Admin)"
    );
    failed(
        &verify("frr.bgp_neighbor_enable", &peer).await,
        "precondition failed: neighbor 10.255.0.2 is still administratively shut down",
    );

    // The enable: its gate passes once the session is back.
    let preview = run("frr.bgp_neighbor_enable", Mode::Preview, &peer, None).await;
    let done = run(
        "frr.bgp_neighbor_enable",
        Mode::Execute,
        &peer,
        Some(&preview),
    )
    .await;
    assert_eq!(done.body["status"], "ok", "{}", done.body);
    let back = verify_until_ok("frr.bgp_neighbor_enable").await;
    assert_eq!(back.body["status"], "ok", "{}", back.body);
    assert_eq!(back.body["vars"]["state"], "Established", "{}", back.body);

    let stranger = json!({"neighbor": "10.9.9.9"});
    for tool in ["frr.bgp_neighbor_enable", "frr.bgp_neighbor_shutdown"] {
        failed(
            &verify(tool, &stranger).await,
            "precondition failed: 10.9.9.9 is not a BGP neighbor on this node",
        );
    }
}

async fn wait_for(mut cond: impl FnMut() -> bool, what: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !cond() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// The host's dpkg database, to show a test left it alone.
fn host_dpkg_status() -> Vec<u8> {
    std::fs::read("/var/lib/dpkg/status").unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debian_package_upgrade_previews_and_upgrades_with_the_real_apt() {
    let host_before = host_dpkg_status();
    let apt = AptRoot::new();
    let old = apt.build("emisar-dummy", "1.0-1");
    let new = apt.build("emisar-dummy", "1.1-1");
    let extra = apt.build("emisar-extra", "2.0-1");
    apt.install(&old);
    apt.publish(&[&new, &extra]);
    let app = spawn_app(
        Backend::Sqlite,
        vec![
            RunnerSpec::new("node-1")
                .path_first(&apt.bin())
                .allow("debian_packages", &["emisar-dummy", "emisar-extra"]),
        ],
        Options::default(),
    )
    .await;

    // Outside the allowlist: refused before anything runs, preview included.
    for mode in [Mode::Preview, Mode::Execute] {
        let refused = app
            .signed_call(
                "node-1",
                "debian.package_upgrade",
                json!({"package": "bash"}),
                mode,
                None,
            )
            .await;
        assert_eq!(refused.status, 403, "{}", refused.body);
        assert!(
            refused.body["error"]
                .as_str()
                .unwrap()
                .contains("`package` = `bash` is not in this runner's allowlist `debian_packages`"),
            "{}",
            refused.body
        );
    }
    // Not a Debian package name (an option, a shell word): refused by the schema.
    for bad in ["-oDir=/", "Emisar", "emisar-dummy;reboot"] {
        let r = app
            .signed_call(
                "node-1",
                "debian.package_upgrade",
                json!({"package": bad}),
                Mode::Preview,
                None,
            )
            .await;
        assert_eq!(r.status, 400, "{bad}: {}", r.body);
        assert!(r.body["error"].as_str().unwrap().contains("`package`"));
    }
    assert!(apt.calls().is_empty(), "apt must not have run");

    // Installed, with an upgrade in the repository: the approver sees old → new.
    let client = app.mcp_client().await;
    let alice = signed_in(&app, "alice", Role::Approver).await;
    let asked = call_in_background(
        &client,
        "debian.package_upgrade",
        json!({"package": "emisar-dummy", "runners": ["node-1"], "reason": "the fixed build is in the archive"}),
    );
    let id = wait_for_pending(&alice).await;
    let (_, request) = alice.get(&format!("/api/approvals/{id}")).await;
    assert_eq!(
        request["preview"]["node-1"]["output"],
        json!({"package": "emisar-dummy", "version": {"from": "1.0-1", "to": "1.1-1"},
               "command": "apt-get install -y --only-upgrade -- emisar-dummy=1.1-1",
               "also_upgraded": [], "newly_installed": [], "removed": []}),
        "{request}"
    );
    assert_eq!(
        apt.installed("emisar-dummy"),
        "1.0-1 ii ",
        "nothing before the yes"
    );
    let (status, body) = alice.approve(&id).await;
    assert_eq!(status, 200, "{body}");
    let res = finished(asked).await;
    assert_eq!(res.is_error, Some(false), "{res:?}");
    let out = res.structured_content.unwrap();
    assert_eq!(
        out["results"][0]["output"]["installed_after"],
        json!({"version": "1.1-1", "status": "ii"}),
        "{out}"
    );
    assert_eq!(apt.installed("emisar-dummy"), "1.1-1 ii ");
    assert_eq!(apt.shipped_version("emisar-dummy"), "1.1-1");
    assert_eq!(
        apt.calls(),
        [
            "apt-get -s install --only-upgrade -- emisar-dummy",
            "apt-get -s install --only-upgrade -- emisar-dummy",
            "apt-get install -y --only-upgrade -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold -- emisar-dummy=1.1-1",
            "dpkg-query -W -f ${Version} ${db:Status-Abbrev} -- emisar-dummy",
        ]
    );

    // Nothing newer now, or not installed at all: the preview says so and nobody is asked.
    for (package, why) in [
        (
            "emisar-dummy",
            "package `emisar-dummy` has no upgrade available on this node",
        ),
        (
            "emisar-extra",
            "package `emisar-extra` is not installed on this node, and this tool only upgrades",
        ),
    ] {
        let res = call(
            &client,
            "debian.package_upgrade",
            json!({"package": package, "runners": ["node-1"], "reason": "upgrade it"}),
        )
        .await;
        let error = res.structured_content.clone().unwrap()["error"].clone();
        assert_eq!(error["kind"], "preview_failed", "{res:?}");
        assert!(error.to_string().contains(why), "{error}");
    }
    assert!(crate::approvals::pending_ids(&alice).await.is_empty());
    assert_eq!(apt.installed("emisar-dummy"), "1.1-1 ii ");
    assert!(
        host_dpkg_status() == host_before,
        "the host's /var/lib/dpkg/status is untouched"
    );
    client.cancel().await.unwrap();
}
