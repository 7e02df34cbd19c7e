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
