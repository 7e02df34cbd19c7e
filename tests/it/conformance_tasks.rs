//! The fixture tools of the conformance suite's tasks-* scenarios (MCP Tasks, SEP-2663),
//! served through emisar's MCP adapter by `conformance.rs`.
//!
//! The scenarios test the wire: the adapter's capability, `tools/call` answering
//! `resultType: "task"` only to a client that declared the extension, `tasks/get`,
//! `tasks/update`, `tasks/cancel` routed to the source. The fixtures keep their tasks in this
//! process, as the suite's own reference servers do; emisar's tasks (kept in the store, bound
//! to an approval request and its owner) are tested with the official client in
//! `tasks.rs`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ClientCapabilities, ContentBlock,
    CreateTaskResult, DetailedTask, GetTaskResult, InputRequest, InputRequests,
    InputRequiredResult, InputResponses, JsonObject, Task, TaskPayload, TaskStatus,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer};
use serde_json::{Value, json};

/// The fixture tools that answer with tasks, and the tasks they made.
#[derive(Default, Clone)]
pub(crate) struct FixtureTasks {
    tasks: Arc<Mutex<HashMap<String, DetailedTask>>>,
}

/// The names of the tasks scenarios' fixture tools, with their input schemas.
pub(crate) fn tools() -> Vec<(&'static str, &'static str, Value)> {
    let object = |properties: Value| json!({"type": "object", "properties": properties});
    vec![
        (
            "greet",
            "Says hello (never a task)",
            object(json!({"name": {"type": "string"}})),
        ),
        (
            "slow_compute",
            "Sleeps `seconds`, then answers; a task for a client that declared Tasks",
            object(json!({"seconds": {"type": "number"}, "label": {"type": "string"}})),
        ),
        (
            "failing_job",
            "A task whose tool result is an error (needs Tasks)",
            object(json!({})),
        ),
        (
            "protocol_error_job",
            "A task that fails with a JSON-RPC error",
            object(json!({})),
        ),
        (
            "confirm_delete",
            "A task that asks the client to confirm, then completes",
            object(json!({"filename": {"type": "string"}})),
        ),
        (
            "multi_input",
            "A task that asks the client two questions at once",
            object(json!({})),
        ),
        (
            "test_tool_with_task",
            "Asks for a name (input required), then answers with a task greeting it",
            object(json!({})),
        ),
    ]
}

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

fn text_result(text: &str, is_error: bool) -> CallToolResult {
    let content = vec![ContentBlock::text(text)];
    if is_error {
        CallToolResult::error(content)
    } else {
        CallToolResult::success(content)
    }
}

fn as_object(value: Value) -> JsonObject {
    match value {
        Value::Object(map) => map,
        other => panic!("expected an object, got {other}"),
    }
}

/// An `elicitation/create` input request asking for one string field.
fn ask(message: &str, field: &str) -> InputRequest {
    serde_json::from_value(json!({
        "method": "elicitation/create",
        "params": {
            "mode": "form",
            "message": message,
            "requestedSchema": {
                "type": "object",
                "properties": {field: {"type": "string"}},
                "required": [field]
            }
        }
    }))
    .expect("an elicitation request")
}

/// The first text an elicitation answer carries (`{action, content: {field: text}}`).
fn answered_text(response: &Value) -> String {
    response["content"]
        .as_object()
        .and_then(|c| c.values().find_map(Value::as_str))
        .unwrap_or_default()
        .to_owned()
}

fn declared_tasks(context: &RequestContext<RoleServer>) -> bool {
    context
        .client_capabilities()
        .is_some_and(|caps| caps.supports_tasks())
}

impl FixtureTasks {
    /// Answers a call of one of [`tools`], or `None` for another tool.
    pub(crate) async fn call(
        &self,
        request: &CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> Option<Result<CallToolResponse, McpError>> {
        let args = request.arguments.clone().unwrap_or_default();
        let tasks = declared_tasks(context);
        let answer = match &*request.name {
            "greet" => {
                let name = args.get("name").and_then(Value::as_str).unwrap_or("World");
                Ok(text_result(&format!("Hello, {name}!"), false).into())
            }
            "slow_compute" => {
                let seconds = args.get("seconds").and_then(Value::as_f64).unwrap_or(0.0);
                if tasks {
                    Ok(self.run_later(
                        Duration::from_secs_f64(seconds),
                        |label| TaskPayload::Completed {
                            result: as_object(json!(text_result(
                                &format!("computed {label}"),
                                false
                            ))),
                        },
                        args.get("label")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .to_owned(),
                    ))
                } else {
                    tokio::time::sleep(Duration::from_secs_f64(seconds.min(2.0))).await;
                    Ok(text_result("computed", false).into())
                }
            }
            "failing_job" if !tasks => Err(McpError::missing_required_client_capability(
                ClientCapabilities::builder().enable_tasks().build(),
            )),
            "failing_job" => Ok(self.run_later(
                Duration::from_millis(500),
                |_| TaskPayload::Completed {
                    result: as_object(json!(text_result("the job failed", true))),
                },
                String::new(),
            )),
            "protocol_error_job" => Ok(self.run_later(
                Duration::from_millis(200),
                |_| TaskPayload::Failed {
                    error: as_object(json!({"code": -32603, "message": "the job broke"})),
                },
                String::new(),
            )),
            "confirm_delete" => {
                let file = args.get("filename").and_then(Value::as_str).unwrap_or("");
                let asks = InputRequests::from([(
                    "confirm".to_owned(),
                    ask(&format!("Delete {file}?"), "confirm"),
                )]);
                Ok(self.waiting_for(asks))
            }
            "multi_input" => Ok(self.waiting_for(InputRequests::from([
                ("first".to_owned(), ask("First question?", "answer")),
                ("second".to_owned(), ask("Second question?", "answer")),
            ]))),
            "test_tool_with_task" => Ok(self.gather_then_task(request)),
            _ => return None,
        };
        Some(answer)
    }

    fn store(&self, payload: TaskPayload) -> String {
        let id = uuid::Uuid::new_v4().to_string();
        let at = now();
        let task = Task::new(id.clone(), TaskStatus::Working, at.clone(), at)
            .with_ttl_ms(600_000)
            .with_poll_interval_ms(100);
        self.tasks
            .lock()
            .unwrap()
            .insert(id.clone(), DetailedTask::new(task, payload));
        id
    }

    fn created(&self, id: &str) -> CallToolResponse {
        let task = self.tasks.lock().unwrap()[id].task.clone();
        CallToolResponse::Task(CreateTaskResult::new(task))
    }

    /// A working task that becomes `finish(label)` after `after`, unless cancelled first.
    fn run_later(
        &self,
        after: Duration,
        finish: impl FnOnce(String) -> TaskPayload + Send + 'static,
        label: String,
    ) -> CallToolResponse {
        let id = self.store(TaskPayload::Working);
        let me = self.clone();
        let task_id = id.clone();
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            me.settle(&task_id, finish(label));
        });
        self.created(&id)
    }

    /// A task that waits for the client's answers to `asks`.
    fn waiting_for(&self, asks: InputRequests) -> CallToolResponse {
        let id = self.store(TaskPayload::InputRequired {
            input_requests: asks,
        });
        self.created(&id)
    }

    /// Round 1 asks for a name (input required, no task); round 2, with the answer, makes a
    /// task whose result greets it.
    fn gather_then_task(&self, request: &CallToolRequestParams) -> CallToolResponse {
        let answer = request
            .input_responses
            .as_ref()
            .and_then(|r| r.get("user_name"));
        match answer {
            None => CallToolResponse::InputRequired(InputRequiredResult::from_input_requests(
                InputRequests::from([("user_name".to_owned(), ask("Your name?", "name"))]),
            )),
            Some(response) => {
                let name = answered_text(response);
                self.run_later(
                    Duration::from_millis(100),
                    move |_| TaskPayload::Completed {
                        result: as_object(json!(text_result(&format!("Hello, {name}!"), false))),
                    },
                    String::new(),
                )
            }
        }
    }

    /// Moves a task that is not over yet to `payload`.
    fn settle(&self, id: &str, payload: TaskPayload) {
        let mut tasks = self.tasks.lock().unwrap();
        if let Some(entry) = tasks.get_mut(id)
            && !entry.status().is_terminal()
        {
            let mut task = entry.task.clone();
            task.last_updated_at = now();
            *entry = DetailedTask::new(task, payload);
        }
    }

    pub(crate) fn get(&self, id: &str) -> Result<GetTaskResult, McpError> {
        match self.tasks.lock().unwrap().get(id) {
            Some(task) => Ok(GetTaskResult::new(task.clone())),
            None => Err(McpError::invalid_params("unknown task id", None)),
        }
    }

    /// Cancels a task that is not over; a finished one is acknowledged as it is.
    pub(crate) fn cancel(&self, id: &str) -> Result<(), McpError> {
        self.get(id)?;
        self.settle(id, TaskPayload::Cancelled);
        Ok(())
    }

    /// Takes the answers to a task's outstanding questions (others are ignored); once none
    /// is outstanding the task completes.
    pub(crate) fn update(&self, id: &str, answers: &InputResponses) -> Result<(), McpError> {
        self.get(id)?;
        let mut tasks = self.tasks.lock().unwrap();
        let entry = tasks.get_mut(id).expect("checked above");
        if let TaskPayload::InputRequired { input_requests } = &entry.payload {
            let mut left = input_requests.clone();
            left.retain(|key, _| !answers.contains_key(key));
            let mut task = entry.task.clone();
            task.last_updated_at = now();
            *entry = if left.is_empty() {
                DetailedTask::new(
                    task,
                    TaskPayload::Completed {
                        result: as_object(json!(text_result("confirmed", false))),
                    },
                )
            } else {
                DetailedTask::new(
                    task,
                    TaskPayload::InputRequired {
                        input_requests: left,
                    },
                )
            };
        }
        Ok(())
    }
}
