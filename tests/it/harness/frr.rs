//! Two real FRR routers (Debian's zebra + bgpd) in two network namespaces joined by a veth
//! pair, peering over eBGP: rA (AS 65001, 10.255.0.1, announces 192.0.2.0/24) and rB
//! (AS 65002, 10.255.0.2, announces 198.51.100.0/24). Stopped by PID and removed on drop.
//!
//! Without root or network namespaces the harness fails loudly: it never skips.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

pub struct Router {
    pub netns: String,
    /// The vty socket directory: `vtysh --vty_socket DIR` reaches this router.
    pub dir: PathBuf,
}

pub struct FrrPair {
    pub a: Router,
    pub b: Router,
    _tmp: tempfile::TempDir,
}

fn sh(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("failed to run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn ip(args: &[&str]) {
    sh(Command::new("ip").args(args));
}

fn bgpd_conf(name: &str, asn: u32, id: &str, peer: &str, peer_as: u32, network: &str) -> String {
    format!(
        "hostname {name}\n\
         router bgp {asn}\n \
         bgp router-id {id}\n \
         no bgp ebgp-requires-policy\n \
         no bgp network import-check\n \
         neighbor {peer} remote-as {peer_as}\n \
         neighbor {peer} description peer-{name}-to-{peer_as}\n \
         neighbor {peer} timers 3 9\n \
         neighbor {peer} timers connect 2\n \
         address-family ipv4 unicast\n  \
         network {network}\n \
         exit-address-family\n"
    )
}

impl Router {
    pub fn vtysh(&self, command: &str) -> String {
        sh(Command::new("vtysh")
            .arg("--vty_socket")
            .arg(&self.dir)
            .args(["-c", command]))
    }

    pub fn vtysh_json(&self, command: &str) -> Value {
        serde_json::from_str(&self.vtysh(command)).unwrap()
    }

    fn start(netns: &str, dir: &Path, conf: &str) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("zebra.conf"), "hostname zebra\n").unwrap();
        std::fs::write(dir.join("bgpd.conf"), conf).unwrap();
        sh(Command::new("chown").args(["-R", "frr:frr"]).arg(dir));
        for daemon in ["zebra", "bgpd"] {
            let d = dir.display();
            sh(Command::new("ip")
                .args(["netns", "exec", netns])
                .arg(format!("/usr/lib/frr/{daemon}"))
                .args([
                    "-d",
                    "-f",
                    &format!("{d}/{daemon}.conf"),
                    "-i",
                    &format!("{d}/{daemon}.pid"),
                    "-z",
                    &format!("{d}/zserv.api"),
                    "--vty_socket",
                    &d.to_string(),
                    "-A",
                    "127.0.0.1",
                    "-P",
                    "0",
                    "-u",
                    "frr",
                    "-g",
                    "frr",
                ]));
        }
    }

    fn stop(&self) {
        for daemon in ["bgpd", "zebra"] {
            if let Ok(pid) = std::fs::read_to_string(self.dir.join(format!("{daemon}.pid")))
                && let Ok(pid) = pid.trim().parse::<i32>()
            {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGTERM,
                );
                let deadline = Instant::now() + Duration::from_secs(5);
                while nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
                    && Instant::now() < deadline
                {
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
        let _ = Command::new("ip")
            .args(["netns", "del", &self.netns])
            .output();
    }

    /// The peer's summary entry, once the session is `want` (polls up to 30 s).
    pub async fn wait_peer_state(&self, peer: &str, want: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let summary = self.vtysh_json("show bgp summary json");
            let p = summary["ipv4Unicast"]["peers"][peer].clone();
            if p["state"] == want {
                return p;
            }
            assert!(
                Instant::now() < deadline,
                "peer {peer} did not reach {want}: {summary}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Whether this router's IPv4 table holds `prefix`.
    pub fn has_route(&self, prefix: &str) -> bool {
        let table = self.vtysh_json("show ip bgp json");
        table["routes"].get(prefix).is_some()
    }
}

impl FrrPair {
    pub fn start() -> FrrPair {
        assert!(
            nix::unistd::Uid::effective().is_root(),
            "the FRR test needs root to create network namespaces; it does not skip"
        );
        for bin in ["/usr/lib/frr/zebra", "/usr/lib/frr/bgpd", "/usr/bin/vtysh"] {
            assert!(
                Path::new(bin).exists(),
                "{bin} is missing: run scripts/install-test-deps"
            );
        }
        let tmp = tempfile::Builder::new()
            .prefix("emisar-frr-")
            .tempdir()
            .unwrap();
        sh(Command::new("chmod").arg("755").arg(tmp.path()));
        // Unique per pair, so two tests of one run can each have their routers.
        static PAIRS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let pair = PAIRS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tag = format!("{}-{pair}", std::process::id());
        let (na, nb) = (format!("emisar-{tag}-a"), format!("emisar-{tag}-b"));
        ip(&["netns", "add", &na]);
        ip(&["netns", "add", &nb]);
        // Created inside the namespaces directly, so the names never collide on the host.
        ip(&[
            "link", "add", "veth-a", "netns", &na, "type", "veth", "peer", "name", "veth-b",
            "netns", &nb,
        ]);
        ip(&["-n", &na, "addr", "add", "10.255.0.1/30", "dev", "veth-a"]);
        ip(&["-n", &nb, "addr", "add", "10.255.0.2/30", "dev", "veth-b"]);
        for (ns, dev) in [(&na, "veth-a"), (&nb, "veth-b")] {
            ip(&["-n", ns, "link", "set", dev, "up"]);
            ip(&["-n", ns, "link", "set", "lo", "up"]);
        }
        let a = Router {
            netns: na.clone(),
            dir: tmp.path().join("a"),
        };
        let b = Router {
            netns: nb.clone(),
            dir: tmp.path().join("b"),
        };
        let pair = FrrPair { a, b, _tmp: tmp };
        Router::start(
            &na,
            &pair.a.dir,
            &bgpd_conf(
                "rA",
                65001,
                "10.255.0.1",
                "10.255.0.2",
                65002,
                "192.0.2.0/24",
            ),
        );
        Router::start(
            &nb,
            &pair.b.dir,
            &bgpd_conf(
                "rB",
                65002,
                "10.255.0.2",
                "10.255.0.1",
                65001,
                "198.51.100.0/24",
            ),
        );
        pair
    }
}

impl Drop for FrrPair {
    fn drop(&mut self) {
        self.a.stop();
        self.b.stop();
    }
}
