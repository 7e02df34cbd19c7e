//! Real redis-servers (Debian's redis-server), each in its own temporary directory and reached
//! through a Unix socket there; stopped by PID on drop.
//!
//! A server that only answers the test has no TCP listener at all (`--port 0`). Replication
//! speaks only TCP, so a primary and its replica also listen on loopback ports; Redis cannot be
//! handed a listening socket, so the server binds the port itself and the harness checks, by
//! the process id the port answers with, that the port belongs to the server it started.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const SERVER: &str = "/usr/bin/redis-server";
const CLI: &str = "/usr/bin/redis-cli";

pub struct Redis {
    child: Child,
    /// The Unix socket the tests and the runner's `redis-cli` talk to.
    pub socket: PathBuf,
    /// The loopback TCP port, for servers that replicate.
    pub port: Option<u16>,
    dir: tempfile::TempDir,
}

/// What happened to one attempt at starting a server.
enum Started {
    Up(Redis),
    /// The TCP port was taken by someone else: try another.
    PortInUse,
}

impl Redis {
    /// A server reached only through its Unix socket.
    pub async fn start() -> Redis {
        match Self::try_start(None, &[]).await {
            Started::Up(r) => r,
            Started::PortInUse => unreachable!("a server without TCP cannot find its port taken"),
        }
    }

    /// A server that also listens on a loopback TCP port (for replication).
    pub async fn start_tcp(extra: &[&str]) -> Redis {
        for _ in 0..20 {
            if let Started::Up(r) =
                Self::try_start(Some(super::tools::reserved_port()), extra).await
            {
                return r;
            }
        }
        panic!("no free loopback port for redis-server in 20 attempts");
    }

    /// A replica of `primary`, returned once its link is up and the primary lists it online.
    pub async fn replica_of(primary: &Redis) -> Redis {
        let port = primary.port.expect("a primary listens on TCP").to_string();
        let replica = Self::start_tcp(&["--replicaof", "127.0.0.1", &port]).await;
        let replica_port = replica.port.unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let linked = replica
                .cli(&["INFO", "replication"])
                .contains("master_link_status:up");
            let listed = primary
                .cli(&["INFO", "replication"])
                .contains(&format!("port={replica_port},state=online"));
            if linked && listed {
                return replica;
            }
            assert!(
                Instant::now() < deadline,
                "the replica did not sync within 30 s: {}",
                replica.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn try_start(port: Option<u16>, extra: &[&str]) -> Started {
        assert!(
            Path::new(SERVER).exists() && Path::new(CLI).exists(),
            "redis-server is missing: run scripts/install-test-deps"
        );
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("redis.sock");
        let log = dir.path().join("redis.log");
        let port_arg = port.map_or("0".to_owned(), |p| p.to_string());
        let child = Command::new(SERVER)
            .args(["--port", &port_arg, "--bind", "127.0.0.1"])
            .arg("--unixsocket")
            .arg(&socket)
            .args(["--unixsocketperm", "700", "--daemonize", "no"])
            .arg("--dir")
            .arg(dir.path())
            .arg("--logfile")
            .arg(&log)
            // No persistence: every test starts empty and leaves nothing behind.
            .args(["--save", "", "--appendonly", "no"])
            // A replica syncs at once instead of after the default 5 s grace period.
            .args(["--repl-diskless-sync-delay", "0"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("failed to start redis-server");
        let mut redis = Redis {
            child,
            socket,
            port,
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = redis.child.try_wait().unwrap() {
                let log = redis.log();
                if log.contains("Address already in use") {
                    return Started::PortInUse;
                }
                panic!("redis-server exited with {status}: {log}");
            }
            if redis.socket.exists() && redis.try_cli(&["PING"]).is_some_and(|o| o == "PONG") {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "redis-server did not answer within 20 s: {}",
                redis.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if let Some(port) = port {
            // The port is ours only if it answers with our server's process id.
            let out = Command::new(CLI)
                .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-e"])
                .args(["INFO", "server"])
                .output()
                .unwrap();
            let info = String::from_utf8_lossy(&out.stdout);
            let pid = format!("process_id:{}\r", redis.child.id());
            assert!(
                info.contains(&pid),
                "port {port} answers for another process than redis-server {}",
                redis.child.id()
            );
        }
        Started::Up(redis)
    }

    /// The runner's `[programs] redis-cli` for this server.
    pub fn cli_argv(&self) -> Vec<String> {
        vec![
            CLI.to_owned(),
            "-s".to_owned(),
            self.socket.display().to_string(),
        ]
    }

    /// Runs one command with `redis-cli -e` and returns its output without the last newline.
    pub fn cli(&self, args: &[&str]) -> String {
        self.try_cli(args)
            .unwrap_or_else(|| panic!("redis-cli {args:?} failed: {}", self.log()))
    }

    fn try_cli(&self, args: &[&str]) -> Option<String> {
        let out = Command::new(CLI)
            .arg("-s")
            .arg(&self.socket)
            .arg("-e")
            .args(args)
            .output()
            .unwrap();
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim_end().to_owned())
    }

    /// `CONFIG GET name`'s value.
    pub fn config(&self, name: &str) -> String {
        let out = self.cli(&["CONFIG", "GET", name]);
        out.lines().nth(1).unwrap_or_default().to_owned()
    }

    /// The first element of `ROLE`: `master` or `slave`.
    pub fn role(&self) -> String {
        self.cli(&["ROLE"])
            .lines()
            .next()
            .unwrap_or_default()
            .to_owned()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default()
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        // Bounded: a process that never finishes its SIGTERM shutdown is killed.
        emisar::util::process::stop_child(&mut self.child, std::time::Duration::from_secs(10));
    }
}
