//! Where the test tools installed by scripts/install-test-deps live. A missing tool fails the
//! test with a message that says how to install it; nothing is skipped.

use std::path::PathBuf;

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

/// A port that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
