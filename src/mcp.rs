//! The MCP adapter (rmcp): lists the gateway's tools and turns `tools/call` into a
//! [`ToolCall`]. No policy here: everything it decides, it asks the gateway.
//!
//! Tool failures the agent should read (bad arguments, refusals, a runner that is down) come
//! back as a tool result with `isError`; an unknown tool is a JSON-RPC invalid-params error.

use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
    ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::json;

use crate::gateway::{CallError, Gateway, OfferedTool, ToolCall};
use crate::pack::Risk;
use crate::tokens::Principal;

#[derive(Clone)]
pub struct EmisarMcp {
    gateway: Arc<Gateway>,
}

impl EmisarMcp {
    pub fn new(gateway: Arc<Gateway>) -> Self {
        EmisarMcp { gateway }
    }
}

fn to_mcp_tool(offered: &OfferedTool) -> Tool {
    let annotations = ToolAnnotations::new()
        .read_only(offered.risk == Risk::Read)
        .destructive(offered.risk == Risk::High);
    Tool::new(
        offered.name.clone(),
        offered.description.clone(),
        Arc::new(offered.input_schema.clone()),
    )
    .with_annotations(annotations)
}

/// The principal the auth middleware attached to this HTTP request.
fn principal(context: &RequestContext<RoleServer>) -> Result<Principal, McpError> {
    context
        .extensions
        .get::<axum::http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<Principal>())
        .cloned()
        .ok_or_else(|| {
            McpError::internal_error(
                "request reached MCP without an authenticated principal",
                None,
            )
        })
}

impl ServerHandler for EmisarMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("emisar", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "Operations tools from emisar packs. Every call needs a `reason` (recorded in the audit log); \
                 node-scoped tools need `runners`, the nodes to run on. Reads run at once; writes need a human's approval.",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let caller = principal(&context)?;
        Ok(ListToolsResult::with_all_items(
            self.gateway.tools_for(&caller).map(to_mcp_tool).collect(),
        ))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        // Used by rmcp only to check SEP-2243 headers against the schema; authorization
        // happens per call in the gateway.
        self.gateway
            .tools_for(&Principal {
                agent: String::new(),
                token_id: String::new(),
                role: crate::tokens::Role::Agent,
            })
            .find(|t| t.name == name)
            .map(to_mcp_tool)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let principal = principal(&context)?;
        let call = ToolCall {
            principal,
            tool: request.name.to_string(),
            args: request.arguments.clone().unwrap_or_default(),
        };
        match self.gateway.call(call).await {
            Ok(outcome) => {
                let failed = outcome.all_failed();
                let value = serde_json::to_value(&outcome).map_err(|e| {
                    McpError::internal_error(format!("failed to encode the result: {e}"), None)
                })?;
                Ok(if failed {
                    CallToolResult::structured_error(value)
                } else {
                    CallToolResult::structured(value)
                }
                .into())
            }
            Err(CallError::UnknownTool(name)) => Err(McpError::invalid_params(
                format!("unknown tool: {name}"),
                None,
            )),
            Err(e) => {
                let mut result = CallToolResult::error(vec![ContentBlock::text(e.to_string())]);
                result.structured_content = Some(json!({"error": e.to_string()}));
                Ok(result.into())
            }
        }
    }
}
