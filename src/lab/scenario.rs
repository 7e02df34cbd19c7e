//! The incident at its start: five edge nodes behind an anycast
//! VIP; hvn02 and hvn05 rebooted around 02:00 in an unattended-upgrades wave; hvn05's Consul
//! agent left the gossip and never rejoined, so its Traefik allocation fails its Consul
//! pre-run hook and nothing listens there, while its BGP session still advertises the VIP;
//! the other four Traefiks are OOM-killed at their 1 GiB cap about every 70 s under the load
//! of one hot backend (match-api, ~1.75k req/s).
//!
//! Every time and count is relative to the lab clock's start, so the story reads the same
//! whenever the lab is started.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde_json::{Value, json};

use super::clock::{LabClock, unix_nanos};
use super::consul::{Consul, Instance, Member, MemberStatus};
use super::frr::{Bgp, Peer};
use super::node::{NodeState, Package, Unit};
use super::nomad::{Alloc, Life, Node, Nomad, consul_hook_failure};
use super::traefik::{App, Site};
use super::vm::Traffic;

pub const NODES: [&str; 5] = [
    "nomad-hvn01",
    "nomad-hvn02",
    "nomad-hvn03",
    "nomad-hvn04",
    "nomad-hvn05",
];
/// hvn04's Traefik allocation, OOM-looping (an investigation reads it by this prefix).
pub const OOM_ALLOC: &str = "1c11be31-6a2e-4c1b-9d7e-1f2a3b4c5d6e";
/// hvn05's Traefik allocation, failed in its Consul pre-run hook.
pub const SETUP_FAILED_ALLOC: &str = "f746f2a3-0b1c-4d2e-8f3a-4b5c6d7e8f90";
/// How often a Traefik capped below its need is OOM-killed.
pub const OOM_PERIOD: Duration = Duration::from_secs(70);
/// What Traefik needs at peak under the VIP's load, in MiB: more than the 1 GiB cap.
pub const TRAEFIK_NEEDS_MIB: u64 = 1310;
/// Traefik's memory right after a restart; it grows to the cap before the kill.
pub const TRAEFIK_BASE_MIB: u64 = 555;
pub const KERNEL: &str = "6.12.48+deb13-amd64";
pub const ANYCAST_VIP: &str = "10.0.0.250/32";
pub const UPSTREAM_PEER: &str = "10.0.0.1";
pub const LOCAL_AS: u32 = 65100;

/// The node's address: nomad-hvn0N is 10.0.0.10N.
pub fn node_ip(node: &str) -> String {
    let n = node.trim_start_matches("nomad-hvn").trim_start_matches('0');
    format!("10.0.0.10{n}")
}

fn node_id(node: &str) -> String {
    let n: u32 = node
        .trim_start_matches("nomad-hvn")
        .parse()
        .unwrap_or_default();
    format!("{n:x}a1f3c2e-5b7d-4e9f-a0c1-d2e3f4a5b6c{n:x}")
}

/// The latest 02:00 UTC at least 40 minutes before `start` (the reboot wave).
fn reboot_wave(start: SystemTime) -> SystemTime {
    let secs = start
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let day = 86_400;
    let mut two = secs / day * day + 2 * 3600;
    while two + 40 * 60 > secs {
        two -= day;
    }
    SystemTime::UNIX_EPOCH + Duration::from_secs(two)
}

/// When each node booted: hvn02 and hvn05 in the wave around 02:00, the others weeks ago.
pub fn boot_time(start: SystemTime, node: &str) -> SystemTime {
    let wave = reboot_wave(start);
    let day = 86_400;
    match node {
        "nomad-hvn01" => start - Duration::from_secs(23 * day + 4 * 3600 + 17 * 60),
        "nomad-hvn02" => wave - Duration::from_secs(2 * 60 + 43),
        "nomad-hvn03" => start - Duration::from_secs(23 * day + 3 * 3600 + 52 * 60),
        "nomad-hvn04" => start - Duration::from_secs(16 * day + 7 * 3600 + 5 * 60),
        _ => wave + Duration::from_secs(2 * 60 + 41),
    }
}

pub fn consul(token: &str, clock: Arc<LabClock>) -> Arc<Consul> {
    let start = clock.started();
    let consul = Consul::new(token, clock, "nomad-hvn01");
    for node in NODES {
        let server = matches!(node, "nomad-hvn01" | "nomad-hvn03" | "nomad-hvn05");
        let status = if node == "nomad-hvn05" {
            MemberStatus::Left
        } else {
            MemberStatus::Alive
        };
        consul.add_member(Member {
            name: node.to_owned(),
            addr: node_ip(node),
            id: node_id(node),
            server,
            status,
            since: boot_time(start, node) + Duration::from_secs(20),
        });
    }
    let apps = [
        ("store-api", "nomad-hvn01", 22504),
        ("match-api", "nomad-hvn03", 24117),
        ("web", "nomad-hvn02", 21080),
        ("web", "nomad-hvn04", 21080),
        ("auth", "nomad-hvn01", 23301),
        ("auth", "nomad-hvn03", 23301),
        ("feed", "nomad-hvn02", 25502),
        ("chat", "nomad-hvn04", 26611),
        ("checkout", "nomad-hvn01", 27730),
    ];
    for (k, (service, node, port)) in apps.into_iter().enumerate() {
        let ip = node_ip(node);
        let output = if service == "store-api" {
            format!(
                "HTTP GET http://{ip}:{port}/healthcheck: 200 OK Output: {{\"commit\":\"3433150\"}}"
            )
        } else {
            format!("HTTP GET http://{ip}:{port}/healthz: 200 OK Output: ok")
        };
        consul.register(Instance {
            service: service.to_owned(),
            id: format!("_nomad-task-{k:02}-{service}-{port}"),
            node: node.to_owned(),
            port,
            tags: vec!["http".into(), "traefik.enable=true".into()],
            check_status: "passing".into(),
            check_output: output,
        });
    }
    Arc::new(consul)
}

/// The Traefik system job, version 3, capped at 1 GiB.
pub fn traefik_job(start: SystemTime) -> Value {
    let submitted = start - Duration::from_secs(9 * 86_400);
    json!({
        "Region": "global", "Namespace": "default", "ID": "traefik", "Name": "traefik", "Type": "system",
        "Priority": 50, "Datacenters": ["dc1"], "NodePool": "default", "AllAtOnce": false,
        "Update": {"Stagger": 10_000_000_000u64, "MaxParallel": 1, "HealthCheck": "", "MinHealthyTime": 0,
                   "HealthyDeadline": 0, "ProgressDeadline": 0, "AutoRevert": false, "AutoPromote": false, "Canary": 0},
        "TaskGroups": [{
            "Name": "traefik", "Count": 1,
            "EphemeralDisk": {"Sticky": false, "SizeMB": 300, "Migrate": false},
            "RestartPolicy": {"Attempts": 30, "Interval": 1_800_000_000_000u64, "Delay": 1_000_000_000u64, "Mode": "delay"},
            "Networks": [{"Mode": "host", "ReservedPorts": [{"Label": "websecure", "Value": 443}, {"Label": "api", "Value": 8080}]}],
            "Tasks": [{
                "Name": "traefik", "Driver": "docker",
                "Config": {"image": "traefik:v3.7", "network_mode": "host", "args": ["--configFile=local/traefik.yml"]},
                "Consul": {"Cluster": "default"},
                "Resources": {"CPU": 1000, "Cores": 0, "MemoryMB": 1024, "MemoryMaxMB": 0, "DiskMB": 0,
                              "IOPS": 0, "Networks": null, "Devices": null, "NUMA": null, "SecretsMB": 0},
                "KillTimeout": 5_000_000_000u64
            }]
        }],
        "Status": "running", "Stop": false, "Stable": true, "Version": 3, "SubmitTime": unix_nanos(submitted),
        "CreateIndex": 52, "ModifyIndex": 96, "JobModifyIndex": 93
    })
}

pub fn nomad(token: &str, clock: Arc<LabClock>) -> Arc<Nomad> {
    let start = clock.started();
    let nomad = Nomad::new(token, clock, OOM_PERIOD, TRAEFIK_BASE_MIB);
    let job = traefik_job(start);
    nomad.add_job(job.clone());
    nomad.set_demand("traefik", TRAEFIK_NEEDS_MIB);
    for node in NODES {
        nomad.add_node(Node {
            id: node_id(node),
            name: node.to_owned(),
            address: node_ip(node),
            consul_ready: node != "nomad-hvn05",
        });
    }
    let delay = Duration::from_secs(1);
    // (node, allocation, restarts so far, seconds since the last restart)
    let looping = [
        (
            "nomad-hvn01",
            "3f2b8d10-4c5e-4a7b-8e9f-0a1b2c3d4e5f",
            22,
            12,
        ),
        (
            "nomad-hvn02",
            "9a7c5e31-2b4d-4f6a-8c0e-1d3f5a7b9c2e",
            20,
            33,
        ),
        (
            "nomad-hvn03",
            "c4e8a2f6-7d1b-4e3c-9a5f-2b6d8e0f1a3c",
            21,
            47,
        ),
        ("nomad-hvn04", OOM_ALLOC, 23, 59),
    ];
    for (k, (node, id, restarts, since)) in looping.into_iter().enumerate() {
        let last_start = start - Duration::from_secs(since);
        let first_kill = last_start - delay - OOM_PERIOD * (restarts - 1);
        let created = if node == "nomad-hvn02" {
            boot_time(start, node) + Duration::from_secs(75)
        } else {
            start - Duration::from_secs(9 * 86_400) + Duration::from_secs(10 * k as u64)
        };
        nomad.add_alloc(Alloc {
            id: id.to_owned(),
            node_id: node_id(node),
            job_id: "traefik".into(),
            job: job.clone(),
            group: "traefik".into(),
            created,
            stopped: None,
            life: Life::Running {
                first_kill: Some(first_kill),
            },
            previous: None,
            next: None,
            create_index: 100 + k as u64,
        });
    }
    nomad.add_alloc(Alloc {
        id: SETUP_FAILED_ALLOC.to_owned(),
        node_id: node_id("nomad-hvn05"),
        job_id: "traefik".into(),
        job,
        group: "traefik".into(),
        created: boot_time(start, "nomad-hvn05") + Duration::from_secs(80),
        stopped: None,
        life: Life::SetupFailed {
            message: consul_hook_failure(),
        },
        previous: None,
        next: None,
        create_index: 180,
    });
    Arc::new(nomad)
}

/// The node's Nomad agent config, `/etc/nomad.d/nomad.hcl`: a client on every node, a
/// server on the three that are Consul servers too.
pub fn nomad_config(node: &str) -> String {
    let server = matches!(node, "nomad-hvn01" | "nomad-hvn03" | "nomad-hvn05");
    format!(
        "# Nomad agent on {node} (HashiCorp's package runs `nomad agent -config /etc/nomad.d`).\n\
         datacenter = \"dc1\"\n\
         data_dir   = \"/opt/nomad/data\"\n\
         bind_addr  = \"{ip}\"\n\
         \n\
         server {{\n\
         \x20 enabled          = {server}\n\
         \x20 bootstrap_expect = 3\n\
         }}\n\
         \n\
         client {{\n\
         \x20 enabled = true\n\
         }}\n\
         \n\
         consul {{\n\
         \x20 address = \"127.0.0.1:8500\"\n\
         }}\n",
        ip = node_ip(node),
    )
}

/// What the edge routes: every app from the Consul catalog, by host.
pub fn site(start: SystemTime) -> Site {
    let apps = [
        ("match-api", "match.example.com", vec!["10.0.0.103:24117"]),
        (
            "web",
            "www.example.com",
            vec!["10.0.0.102:21080", "10.0.0.104:21080"],
        ),
        (
            "auth",
            "auth.example.com",
            vec!["10.0.0.101:23301", "10.0.0.103:23301"],
        ),
        ("feed", "feed.example.com", vec!["10.0.0.102:25502"]),
        ("chat", "chat.example.com", vec!["10.0.0.104:26611"]),
        ("store-api", "store.example.com", vec!["10.0.0.101:22504"]),
        ("checkout", "checkout.example.com", vec!["10.0.0.101:27730"]),
    ];
    Site {
        apps: apps
            .into_iter()
            .map(|(name, host, servers)| App {
                name: name.into(),
                host: host.into(),
                servers: servers.into_iter().map(|s| format!("http://{s}")).collect(),
            })
            .collect(),
        version: "3.7.15".into(),
        start_date: chrono::DateTime::<chrono::Utc>::from(start)
            .to_rfc3339_opts(chrono::SecondsFormat::Nanos, true),
    }
}

/// The edge's traffic: requests per second per service (and the share that times out),
/// served by the four nodes whose Traefik runs.
pub fn traffic(start: SystemTime) -> Traffic {
    let services = [
        ("match-api", 1751.0, 0.031),
        ("web", 179.0, 0.0),
        ("auth", 122.0, 0.0),
        ("feed", 91.0, 0.004),
        ("chat", 65.0, 0.0),
        ("store-api", 38.0, 0.0),
        ("checkout", 24.0, 0.0),
    ];
    Traffic {
        services: services
            .into_iter()
            .map(|(s, r, slow)| (format!("{s}@consulcatalog"), r, slow))
            .collect(),
        nodes: NODES[..4].iter().map(|n| n.to_string()).collect(),
        origin: start - Duration::from_secs(3600),
    }
}

pub fn nodes(start: SystemTime) -> Vec<NodeState> {
    NODES
        .iter()
        .enumerate()
        .map(|(k, &name)| {
            let boot = boot_time(start, name);
            let unit = |description: &str, after: u64, pid: u32| Unit {
                description: description.into(),
                main_pid: pid,
                active_since: boot + Duration::from_secs(after),
                n_restarts: 0,
                wanted_by: Vec::new(),
                failed: None,
            };
            let pid = 700 + 13 * k as u32;
            let units = [
                (
                    "consul.service",
                    // Nomad's unit wants Consul (Nomad's docs: `Wants=consul.service`).
                    Unit {
                        wanted_by: vec!["nomad.service".into()],
                        ..unit("Consul agent", 20, pid + 1)
                    },
                ),
                ("nomad.service", unit("Nomad", 24, pid + 5)),
                ("frr.service", unit("FRRouting", 9, pid - 40)),
                (
                    "ssh.service",
                    unit("OpenBSD Secure Shell server", 8, pid - 60),
                ),
                (
                    "docker.service",
                    unit("Docker Application Container Engine", 15, pid - 9),
                ),
            ]
            .into_iter()
            .map(|(n, u)| (n.to_owned(), u))
            .collect();
            let ip = node_ip(name);
            let load = if name == "nomad-hvn05" {
                [0.08, 0.11, 0.09]
            } else {
                [
                    3.12 + k as f64 * 0.21,
                    2.87 + k as f64 * 0.13,
                    2.41 + k as f64 * 0.07,
                ]
            };
            let package = |name: &str, version: &str| Package {
                name: name.into(),
                version: version.into(),
            };
            NodeState {
                name: name.to_owned(),
                ip: ip.clone(),
                boot,
                kernel: KERNEL.into(),
                kernel_build: "#1 SMP PREEMPT_DYNAMIC Debian 6.12.48-1 (2025-09-20)".into(),
                packages: vec![
                    package("consul", "1.20.1-1"),
                    package("docker-ce", "5:28.5.1-1~debian.13~trixie"),
                    package("frr", "10.3.1-1"),
                    package("linux-image-6.12.48+deb13-amd64", "6.12.48-1"),
                    package("linux-image-amd64", "6.12.48-1"),
                    package("nomad", "1.11.0-1"),
                    package("unattended-upgrades", "2.12"),
                ],
                units,
                bgp: Bgp {
                    asn: LOCAL_AS,
                    router_id: ip,
                    network: ANYCAST_VIP.into(),
                    peer: Peer {
                        ip: UPSTREAM_PEER.into(),
                        remote_as: 65000,
                        description: "upstream-edge-fw".into(),
                        hostname: "edge-fw".into(),
                        router_id: "10.0.0.1".into(),
                        shutdown: None,
                        since: boot + Duration::from_secs(41),
                        connections_established: 1,
                        connections_dropped: 0,
                        received: 1,
                    },
                },
                load,
                cpus: 32,
                etc: None,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wave_is_before_the_start_and_around_two() {
        let start = SystemTime::now();
        for node in ["nomad-hvn02", "nomad-hvn05"] {
            let boot = boot_time(start, node);
            assert!(boot < start);
            let t = chrono::DateTime::<chrono::Utc>::from(boot);
            let minutes = t.format("%H:%M").to_string();
            assert!(("01:55".."02:05").contains(&minutes.as_str()), "{minutes}");
        }
        assert!(
            start
                .duration_since(boot_time(start, "nomad-hvn04"))
                .unwrap()
                > Duration::from_secs(14 * 86_400)
        );
    }

    #[test]
    fn addresses_and_ids() {
        assert_eq!(node_ip("nomad-hvn05"), "10.0.0.105");
        assert_ne!(node_id("nomad-hvn01"), node_id("nomad-hvn02"));
    }
}
