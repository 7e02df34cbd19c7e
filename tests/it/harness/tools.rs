//! Where the test tools installed by scripts/install-test-deps live. A missing tool fails the
//! test with a message that says how to install it; nothing is skipped.

use std::hash::{BuildHasher, RandomState};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub fn tools_dir() -> PathBuf {
    std::env::var_os("EMISAR_TOOLS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".tools"))
}

pub fn require(relative: &str) -> PathBuf {
    let path = tools_dir().join(relative);
    assert!(
        path.exists(),
        "{} is missing: run scripts/install-test-deps (or scripts/test) first",
        path.display()
    );
    path
}

/// A loopback TCP endpoint where nothing listens, for as long as the value lives. The socket
/// is bound (at :0) but never listens, so every connection to it is refused (RST), exactly as
/// on a host where nothing listens; and since the port stays bound, no other process can take
/// it while the test relies on it being dead. A port number that was merely free a moment
/// ago would give no such guarantee.
pub struct DeadEndpoint {
    _socket: tokio::net::TcpSocket,
    pub port: u16,
}

impl DeadEndpoint {
    pub fn bind() -> DeadEndpoint {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let port = socket.local_addr().unwrap().port();
        DeadEndpoint {
            _socket: socket,
            port,
        }
    }

    /// The same, on a [`reserved_port`]: for a port that a process must later bind itself
    /// and that has to be known before it starts (an address registered elsewhere first). The
    /// hold is given up with [`DeadEndpoint::release`] right before that bind; being outside
    /// the ephemeral range, the port cannot be handed to anyone's `bind(0)` or outgoing
    /// connection in between.
    pub fn bind_reserved() -> DeadEndpoint {
        for _ in 0..50 {
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            let port = reserved_port();
            if socket
                .bind(std::net::SocketAddr::from(([127, 0, 0, 1], port)))
                .is_ok()
            {
                return DeadEndpoint {
                    _socket: socket,
                    port,
                };
            }
        }
        panic!("no reserved loopback port could be bound in 50 attempts");
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Gives the port up (for the process about to bind it) and returns it.
    pub fn release(self) -> u16 {
        self.port
    }
}

/// The address a child `emisar` process bound (it was told to listen on port 0), read from
/// the first line of its log `log` that contains `message` (e.g. "emisar serving MCP",
/// "runner listening") and carries `addr=`. A child that exits first, or a generous minute
/// without the line, fails the test with the log.
pub async fn bound_addr(child: &mut Proc, log: &Path, message: &str) -> SocketAddr {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let found = text
            .lines()
            .filter(|l| l.contains(message))
            .find_map(|l| l.split_whitespace().find_map(|w| w.strip_prefix("addr=")))
            .map(|a| a.trim_matches('"').parse::<SocketAddr>().unwrap());
        if let Some(addr) = found {
            return addr;
        }
        if let Some(status) = child.0.try_wait().unwrap() {
            panic!("the process exited ({status}) before logging \"{message}\":\n{text}");
        }
        assert!(
            Instant::now() < deadline,
            "no \"{message}\" line with addr= within 60 s:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A port to hand a child that cannot bind port 0 and report it (Traefik, VictoriaMetrics,
/// the OpenID provider's redirect URLs that must be known before the server starts). It is
/// below Linux's default ephemeral range (32768–60999), so outgoing connections rarely hold
/// it; the caller must check that the port ended up owned by its own process
/// ([`listens_on`]) and retry with another on a clash. `RandomState` is seeded randomly per
/// process and per call, which is all the randomness this needs.
pub fn reserved_port() -> u16 {
    let r = RandomState::new().hash_one(Instant::now());
    20_000 + (r % 12_000) as u16
}

/// Whether process `pid` holds the listening TCP socket on loopback `port`: the socket's
/// inode in /proc/net/tcp (state 0A, LISTEN) is one of the process's open files. A port that
/// answers is not enough: it might be another test's process answering on it.
pub fn listens_on(pid: u32, port: u16) -> bool {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    let wanted = format!(":{port:04X}");
    let inodes: Vec<String> = table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 9 && f[1].ends_with(&wanted) && f[3] == "0A").then(|| f[9].to_owned())
        })
        .collect();
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.filter_map(Result::ok).any(|fd| {
        std::fs::read_link(fd.path()).is_ok_and(|target| {
            let t = target.to_string_lossy();
            inodes.iter().any(|i| t == format!("socket:[{i}]"))
        })
    })
}

/// A child process that is killed and reaped when the test lets go of it.
pub struct Proc(pub std::process::Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// An rmcp client over streamable HTTP to `url` with a bearer `token`.
pub async fn mcp_client(
    url: &str,
    token: &str,
) -> rmcp::service::RunningService<rmcp::RoleClient, ()> {
    let config =
        rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig::with_uri(
            url.to_owned(),
        )
        .auth_header(token.to_owned());
    rmcp::ServiceExt::serve(
        (),
        rmcp::transport::StreamableHttpClientTransport::from_config(config),
    )
    .await
    .expect("MCP client connects")
}

/// The output of the only runner of a successful call.
pub fn only_output(res: &rmcp::model::CallToolResult) -> serde_json::Value {
    assert_eq!(res.is_error, Some(false), "{:?}", res.content);
    let s = res.structured_content.clone().unwrap();
    assert_eq!(s["results"][0]["ok"], true, "{s}");
    s["results"][0]["output"].clone()
}
