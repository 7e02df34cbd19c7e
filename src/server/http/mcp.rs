//! The MCP adapter (rmcp): serves tools from a [`ToolSource`] over streamable HTTP. In
//! production the source is the [`Gateway`]; no policy lives here, everything it decides it
//! asks the gateway.
//!
//! Tool failures the agent should read (bad arguments, refusals, a runner that is down) come
//! back as a tool result with `isError`; a refusal's `structuredContent` is
//! `{"error": {"kind", "message", ...}}` with a stable kind. An unknown tool is a JSON-RPC
//! invalid-params error whose data is `{"kind": "unknown_tool"}`.
//!
//! MCP Tasks (`io.modelcontextprotocol/tasks`, SEP-2663) are advertised when the source
//! offers them: a call that waits for people, from a client that declared the extension,
//! answers with a task (`resultType: "task"`); `tasks/get`, `tasks/cancel` and
//! `tasks/update` go to the source with the caller (`server/gateway/tasks.rs` holds the
//! tasks). A client that did not declare Tasks is never given one.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::middleware::Next;
use axum::response::Response;
use futures::{FutureExt, StreamExt};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskMethod, CancelTaskParams,
    ContentBlock, CreateTaskResult, DetailedTask, GetTaskMethod, GetTaskParams, GetTaskResult,
    Implementation, JsonObject, ListToolsResult, PaginatedRequestParams, ProgressNotificationParam,
    ServerCapabilities, ServerConfig, Task, TaskPayload, TaskStatus, Tool, ToolAnnotations,
    UpdateTaskMethod, UpdateTaskParams,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::pack::Risk;
use crate::server::gateway::{
    Answer, CallContext, CallError, CallOutcome, Gateway, OfferedTool, POLL_INTERVAL_MS, Progress,
    TaskError, TaskState, TaskView, ToolCall,
};
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

    /// Whether the source answers calls that wait for people with MCP Tasks; if not, the
    /// extension is not advertised and `tasks/*` are unknown methods.
    fn offers_tasks(&self) -> bool {
        false
    }

    /// `tasks/get` for `caller`.
    fn get_task(
        &self,
        _caller: Option<Principal>,
        _request: GetTaskParams,
    ) -> impl Future<Output = Result<GetTaskResult, McpError>> + Send {
        std::future::ready(Err(McpError::method_not_found::<GetTaskMethod>()))
    }

    /// `tasks/cancel` for `caller`.
    fn cancel_task(
        &self,
        _caller: Option<Principal>,
        _request: CancelTaskParams,
    ) -> impl Future<Output = Result<(), McpError>> + Send {
        std::future::ready(Err(McpError::method_not_found::<CancelTaskMethod>()))
    }

    /// `tasks/update` for `caller`.
    fn update_task(
        &self,
        _caller: Option<Principal>,
        _request: UpdateTaskParams,
    ) -> impl Future<Output = Result<(), McpError>> + Send {
        std::future::ready(Err(McpError::method_not_found::<UpdateTaskMethod>()))
    }
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
        let capabilities = ServerCapabilities::builder().enable_tools();
        let capabilities = if self.source.offers_tasks() {
            capabilities.enable_tasks().build()
        } else {
            capabilities.build()
        };
        ServerConfig::new(capabilities)
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

    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, McpError> {
        self.source.get_task(caller(&context), request).await
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.source.cancel_task(caller(&context), request).await
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.source.update_task(caller(&context), request).await
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
        tasks: context
            .client_capabilities()
            .is_some_and(|caps| caps.supports_tasks()),
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
        let principal = authenticated(caller)?;
        let call = ToolCall {
            principal,
            tool: request.name.to_string(),
            args: request.arguments.unwrap_or_default(),
        };
        match self.0.call_with(call, &call_context(&context)).await {
            Ok(Answer::Task(task)) => Ok(CallToolResponse::Task(CreateTaskResult::new(task_of(
                &task,
            )))),
            Ok(Answer::Now(outcome)) => tool_result(Ok(outcome)).map(Into::into),
            Err(e) => tool_result(Err(e)).map(Into::into),
        }
    }

    fn offers_tasks(&self) -> bool {
        true
    }

    async fn get_task(
        &self,
        caller: Option<Principal>,
        request: GetTaskParams,
    ) -> Result<GetTaskResult, McpError> {
        let principal = authenticated(caller)?;
        let task = self
            .0
            .task(&principal, &request.task_id)
            .await
            .map_err(task_error)?;
        Ok(GetTaskResult::new(detailed(task)?))
    }

    async fn cancel_task(
        &self,
        caller: Option<Principal>,
        request: CancelTaskParams,
    ) -> Result<(), McpError> {
        let principal = authenticated(caller)?;
        self.0
            .cancel_task(&principal, &request.task_id)
            .await
            .map_err(task_error)?;
        Ok(())
    }

    /// Emisar never asks the client for input (people decide out of band), so no task has
    /// an outstanding input request: responses answer nothing and are ignored, as SEP-2663
    /// has a server do with keys it did not ask for; the owner's update is acknowledged.
    async fn update_task(
        &self,
        caller: Option<Principal>,
        request: UpdateTaskParams,
    ) -> Result<(), McpError> {
        let principal = authenticated(caller)?;
        self.0
            .task(&principal, &request.task_id)
            .await
            .map_err(task_error)?;
        Ok(())
    }
}

fn authenticated(caller: Option<Principal>) -> Result<Principal, McpError> {
    caller.ok_or_else(|| {
        McpError::internal_error(
            "request reached MCP without an authenticated principal",
            None,
        )
    })
}

/// A call's answer as a tool result: failures the agent should read are results with
/// `isError` and `{"error": {kind, message}}`; an unknown tool is invalid params.
fn tool_result(answer: Result<CallOutcome, CallError>) -> Result<CallToolResult, McpError> {
    match answer {
        Ok(outcome) => {
            let failed = outcome.is_error();
            let value = serde_json::to_value(&outcome).map_err(|e| {
                McpError::internal_error(format!("failed to encode the result: {e}"), None)
            })?;
            Ok(if failed {
                CallToolResult::structured_error(value)
            } else {
                CallToolResult::structured(value)
            })
        }
        Err(e @ CallError::UnknownTool(_)) => Err(McpError::invalid_params(
            e.to_string(),
            Some(json!({"kind": e.kind()})),
        )),
        Err(e) => {
            let mut result = CallToolResult::error(vec![ContentBlock::text(e.to_string())]);
            result.structured_content = Some(json!({"error": e.to_json()}));
            Ok(result)
        }
    }
}

/// The spec's task fields of `task`, its status and message.
fn task_of(task: &TaskView) -> Task {
    let (status, message) = match &task.state {
        TaskState::Working(message) => (TaskStatus::Working, Some(message.clone())),
        TaskState::Completed(outcome) => (
            TaskStatus::Completed,
            outcome.approval.as_ref().map(|a| a.message.clone()),
        ),
        TaskState::Failed(e) => (TaskStatus::Failed, Some(e.to_string())),
        TaskState::Cancelled => (
            TaskStatus::Cancelled,
            Some("cancelled: the approval request was withdrawn; nothing ran".to_owned()),
        ),
    };
    // No `ttlMs`: a task lives as long as its approval request, which is never deleted.
    let task = Task::new(
        task.id.clone(),
        status,
        task.created_at.clone(),
        task.updated_at.clone(),
    )
    .with_poll_interval_ms(POLL_INTERVAL_MS);
    match message {
        Some(m) => task.with_status_message(m),
        None => task,
    }
}

/// What `tasks/get` answers: the task, and once it is over, the call's result (exactly as
/// the call would have returned it) or the JSON-RPC error of a refused request.
fn detailed(task: TaskView) -> Result<DetailedTask, McpError> {
    let base = task_of(&task);
    let payload = match task.state {
        TaskState::Working(_) => TaskPayload::Working,
        TaskState::Cancelled => TaskPayload::Cancelled,
        TaskState::Completed(outcome) => TaskPayload::Completed {
            result: json_object(&tool_result(Ok(*outcome))?)?,
        },
        TaskState::Failed(e) => TaskPayload::Failed {
            error: json_object(&json!({
                "code": REQUEST_REFUSED,
                "message": e.to_string(),
                "data": {"error": e.to_json()},
            }))?,
        },
    };
    Ok(DetailedTask::new(base, payload))
}

/// The JSON-RPC error code of a task whose request people denied or let expire: in the
/// range JSON-RPC leaves to servers, distinct from rmcp's own.
const REQUEST_REFUSED: i32 = -32000;

fn json_object(value: &impl serde::Serialize) -> Result<JsonObject, McpError> {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::Object(map)) => Ok(map),
        Ok(_) | Err(_) => Err(McpError::internal_error(
            "failed to encode the task's result",
            None,
        )),
    }
}

/// A task error as MCP: an unknown (or another caller's) id and a refused cancel are
/// invalid params; a store failure is internal, its cause logged, not echoed.
fn task_error(e: TaskError) -> McpError {
    match e {
        TaskError::NotFound | TaskError::NotCancellable { .. } => {
            McpError::invalid_params(e.to_string(), None)
        }
        TaskError::Store(_) | TaskError::Approval(_) => {
            tracing::error!(error = %e, "task operation failed");
            McpError::internal_error("the store could not answer; try again", None)
        }
    }
}
