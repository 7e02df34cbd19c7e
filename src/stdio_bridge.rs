//! `emisar mcp-stdio`: a bridge for MCP clients that only speak stdio (Claude Desktop style).
//! It serves MCP on stdin/stdout and forwards `tools/list` and `tools/call` to an emisar
//! server over streamable HTTP with a bearer token. It decides nothing: every check happens
//! in the server, under the token's identity.

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, Implementation, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig,
};
use rmcp::service::{Peer, RequestContext};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ErrorData as McpError, RoleClient, RoleServer, ServerHandler, ServiceExt};

#[derive(Clone)]
struct Bridge {
    upstream: Peer<RoleClient>,
}

fn upstream_error(e: rmcp::ServiceError) -> McpError {
    match e {
        rmcp::ServiceError::McpError(e) => e,
        other => McpError::internal_error(
            format!("the emisar server could not be reached: {other}"),
            None,
        ),
    }
}

impl ServerHandler for Bridge {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new(
                "emisar-stdio-bridge",
                env!("CARGO_PKG_VERSION"),
            ))
            .with_instructions(
                "Operations tools from emisar (via a stdio bridge). Every call needs a `reason`; \
                 node-scoped tools need `runners`.",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let tools = self
            .upstream
            .list_all_tools()
            .await
            .map_err(upstream_error)?;
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let result = self
            .upstream
            .call_tool(request)
            .await
            .map_err(upstream_error)?;
        Ok(result.into())
    }
}

/// Connects to `url` with `token`, then serves stdio until the client closes it.
pub async fn run(url: &str, token: &str) -> anyhow::Result<()> {
    use anyhow::Context;
    let config =
        StreamableHttpClientTransportConfig::with_uri(url.to_owned()).auth_header(token.to_owned());
    let client = ()
        .serve(StreamableHttpClientTransport::from_config(config))
        .await
        .with_context(|| format!("failed to connect to the emisar server at {url}"))?;
    let bridge = Bridge {
        upstream: client.peer().clone(),
    };
    let server = bridge
        .serve(rmcp::transport::stdio())
        .await
        .context("failed to start MCP on stdio")?;
    server.waiting().await.context("the stdio session failed")?;
    client.cancel().await.ok();
    Ok(())
}
