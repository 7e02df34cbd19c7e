//! The MCP adapter (rmcp): serves tools from a [`ToolSource`] over streamable HTTP. In
//! production the source is the [`Gateway`]; no policy lives here, everything it decides it
//! asks the gateway.
//!
//! Tool failures the agent should read (bad arguments, refusals, a runner that is down) come
//! back as a tool result with `isError`; a refusal's `structuredContent` is
//! `{"error": {"kind", "message", ...}}` with a stable kind. An unknown tool is a JSON-RPC
//! invalid-params error whose data is `{"kind": "unknown_tool"}`.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::middleware::Next;
use axum::response::Response;
use futures::{FutureExt, StreamExt};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, ProgressNotificationParam, ServerCapabilities,
    ServerConfig, Tool, ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::pack::Risk;
use crate::server::gateway::{CallContext, CallError, Gateway, OfferedTool, Progress, ToolCall};
use crate::server::principal::Principal;

/// Where the adapter's tools come from. `caller` is the principal the auth layer attached,
/// if the wiring has auth.
pub trait ToolSource: Send + Sync + 'static {
    fn list(&self, caller: Option<&Principal>) -> Vec<Tool>;
    fn get(&self, name: &str) -> Option<Tool>;
    fn call(
        &self,
        caller: Option<Principal>,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<CallToolResponse, McpError>> + Send;
}

pub struct EmisarMcp<S> {
    source: Arc<S>,
}

impl<S> Clone for EmisarMcp<S> {
    fn clone(&self) -> Self {
        EmisarMcp {
            source: self.source.clone(),
        }
    }
}

/// The streamable HTTP service for `source`, accepting the given Host headers.
pub fn service<S: ToolSource>(
    source: Arc<S>,
    allowed_hosts: Vec<String>,
    shutdown: CancellationToken,
) -> StreamableHttpService<EmisarMcp<S>, LocalSessionManager> {
    service_with_sessions(source, allowed_hosts, shutdown, sessions())
}

/// The session manager [`service_with_sessions`] expects: the router keeps a handle to close
/// the sessions it stops vouching for.
pub(crate) fn sessions() -> Arc<LocalSessionManager> {
    let mut sessions = LocalSessionManager::default();
    // Long enough for a slow fan-out; sessions idle longer than this are reaped.
    sessions.session_config.keep_alive = Some(Duration::from_secs(3600));
    Arc::new(sessions)
}

/// [`service`], with its sessions kept by `sessions`.
pub(crate) fn service_with_sessions<S: ToolSource>(
    source: Arc<S>,
    allowed_hosts: Vec<String>,
    shutdown: CancellationToken,
    sessions: Arc<LocalSessionManager>,
) -> StreamableHttpService<EmisarMcp<S>, LocalSessionManager> {
    let config = StreamableHttpServerConfig::default()
        .with_allowed_hosts(allowed_hosts)
        .with_cancellation_token(shutdown.child_token());
    let handler = EmisarMcp { source };
    StreamableHttpService::new(move || Ok(handler.clone()), sessions, config)
}

/// How long the SSE answer to a POST may hold back its priming event, waiting for the answer
/// to go with it.
const PRIMING_HOLD: Duration = Duration::from_millis(50);

/// In front of the MCP service: a POST's SSE answer goes out as one write when the call
/// answers within [`PRIMING_HOLD`].
///
/// rmcp opens each answer with a priming event (the event id a client resumes from if the
/// connection drops) before the call has run, so hyper sent the headers and that event, then
/// the answer: two writes per call, two wake-ups of the client. Here the response waits until
/// the answer follows the priming event (and the stream's end, if that is ready too) or the
/// hold is over, whichever is first; what arrived goes out together, and the rest streams as
/// before. A call that waits for people gets its priming event 50 ms late, which changes
/// nothing it resumes from. Everything else (a JSON answer, a 202, an error) passes
/// untouched.
pub(crate) async fn coalesce_sse(request: axum::extract::Request, next: Next) -> Response {
    let response = next.run(request).await;
    let sse = response
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    if !sse {
        return response;
    }
    let (parts, body) = response.into_parts();
    let mut body = body.into_data_stream();
    let mut held = Vec::new();
    let mut events = 0;
    let hold = tokio::time::sleep(PRIMING_HOLD);
    tokio::pin!(hold);
    let (failed, ended) = loop {
        let event = if events < 2 {
            tokio::select! {
                biased;
                event = body.next() => event,
                _ = &mut hold => break (None, false),
            }
        } else {
            // The answer is here; its stream's end goes with it if it is ready now.
            match body.next().now_or_never() {
                Some(event) => event,
                None => break (None, false),
            }
        };
        match event {
            None => break (None, true),
            Some(Err(e)) => break (Some(e), true),
            Some(Ok(data)) => {
                held.extend_from_slice(&data);
                events += 1;
            }
        }
    };
    let head = futures::stream::iter(
        (!held.is_empty())
            .then(|| Ok(axum::body::Bytes::from(held)))
            .into_iter()
            .chain(failed.map(Err)),
    );
    let body = if ended {
        axum::body::Body::from_stream(head)
    } else {
        axum::body::Body::from_stream(head.chain(body))
    };
    Response::from_parts(parts, body)
}

/// The principal the auth middleware attached to this HTTP request, if any.
fn caller(context: &RequestContext<RoleServer>) -> Option<Principal> {
    context
        .extensions
        .get::<axum::http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<Principal>())
        .cloned()
}

impl<S: ToolSource> ServerHandler for EmisarMcp<S> {
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
        Ok(ListToolsResult::with_all_items(
            self.source.list(caller(&context).as_ref()),
        ))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        // Used by rmcp only to check SEP-2243 headers against the schema; authorization
        // happens per call.
        self.source.get(name)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let who = caller(&context);
        self.source.call(who, request, context).await
    }
}

/// Cancellation and progress for a call that may wait for humans. Progress goes out only
/// when the client asked for it with a progress token.
fn call_context(context: &RequestContext<RoleServer>) -> CallContext {
    let progress: Option<Progress> = context.meta.get_progress_token().map(|token| {
        let peer = context.peer.clone();
        let step = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let send: Progress = Arc::new(move |message: String| {
            let (peer, token) = (peer.clone(), token.clone());
            // Progress must increase with every notification.
            let n = step.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            Box::pin(async move {
                let param = ProgressNotificationParam::new(token, n as f64).with_message(message);
                if let Err(e) = peer.notify_progress(param).await {
                    tracing::debug!(error = %e, "could not send progress");
                }
            })
        });
        send
    });
    CallContext {
        cancel: context.ct.clone(),
        progress,
    }
}

/// The production source: the gateway, behind bearer auth.
pub(crate) struct GatewaySource(pub Arc<Gateway>);

fn to_mcp_tool(
    offered: &OfferedTool,
    schema: Arc<serde_json::Map<String, serde_json::Value>>,
) -> Tool {
    let annotations = ToolAnnotations::new()
        .read_only(offered.risk == Risk::Read)
        .destructive(offered.risk == Risk::High);
    Tool::new(offered.name.clone(), offered.description.clone(), schema)
        .with_annotations(annotations)
}

impl ToolSource for GatewaySource {
    fn list(&self, caller: Option<&Principal>) -> Vec<Tool> {
        match caller {
            Some(c) => self
                .0
                .tools_for(c)
                .map(|t| to_mcp_tool(t, self.0.schema_for(c, t)))
                .collect(),
            None => Vec::new(),
        }
    }

    fn get(&self, name: &str) -> Option<Tool> {
        self.0
            .tool(name)
            .map(|t| to_mcp_tool(t, t.input_schema.clone()))
    }

    async fn call(
        &self,
        caller: Option<Principal>,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let principal = caller.ok_or_else(|| {
            McpError::internal_error(
                "request reached MCP without an authenticated principal",
                None,
            )
        })?;
        let call = ToolCall {
            principal,
            tool: request.name.to_string(),
            args: request.arguments.unwrap_or_default(),
        };
        match self.0.call_with(call, &call_context(&context)).await {
            Ok(outcome) => {
                let failed = outcome.is_error();
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
            Err(e @ CallError::UnknownTool(_)) => Err(McpError::invalid_params(
                e.to_string(),
                Some(json!({"kind": e.kind()})),
            )),
            Err(e) => {
                let mut result = CallToolResult::error(vec![ContentBlock::text(e.to_string())]);
                result.structured_content = Some(json!({"error": e.to_json()}));
                Ok(result.into())
            }
        }
    }
}
