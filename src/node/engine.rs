//! Runs a tool's steps on the runner: fills templates from args and captured vars, runs each
//! http or exec action, checks preconditions, captures values, and shapes the output.
//!
//! Invariant: a step runs only if every step before it succeeded (or was optional), so a
//! failed precondition stops the write that follows it.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use serde_json::{Map, Value, json};

use super::exec::{self, ExecResult};
use super::http_action::{self, HttpRequest, HttpResult};
use crate::node::config::ServiceConfig;
use crate::pack::{Action, Step, StepKind, Tool};
use crate::protocol::Mode;

/// Where an http step and an exec step get their answer: the service and the process
/// ([`Live`], what the runner uses), or recorded answers (`emisar packs test`). Everything
/// else (templates, checks, captures, status and exit-code rules, output shaping) is the
/// engine's own and the same for both.
///
/// The names stand for what the two sides are: `Answers` is what the world answers a step
/// (live on a runner, replayed by `Recorded` in `packs test`), and [`Live`] the world itself.
///
/// The engine is generic over this trait instead of holding a `dyn Answers`: the runner's
/// path is compiled for [`Live`] alone, so a step costs no boxed future and no virtual call.
pub(crate) trait Answers: Sync {
    /// Sends a filled request to the pack's service; any status is an answer.
    fn http(
        &self,
        service_name: &str,
        service: &ServiceConfig,
        request: &HttpRequest<'_>,
        max_output: usize,
    ) -> impl Future<Output = Result<HttpResult, String>> + Send;

    /// Runs a program (argv[0] already replaced by its `programs` prefix); any exit is an
    /// answer.
    fn exec(
        &self,
        argv: &[String],
        exec_path: &str,
        timeout: Duration,
        max_output: usize,
    ) -> impl Future<Output = Result<ExecResult, String>> + Send;
}

/// The real answers: the service over HTTP, the program as a child process.
pub(crate) struct Live<'a> {
    pub http: &'a reqwest::Client,
}

impl Answers for Live<'_> {
    fn http(
        &self,
        service_name: &str,
        service: &ServiceConfig,
        request: &HttpRequest<'_>,
        max_output: usize,
    ) -> impl Future<Output = Result<HttpResult, String>> + Send {
        http_action::send(self.http, service_name, service, request, max_output)
    }

    fn exec(
        &self,
        argv: &[String],
        exec_path: &str,
        timeout: Duration,
        max_output: usize,
    ) -> impl Future<Output = Result<ExecResult, String>> + Send {
        exec::run(argv, exec_path, timeout, max_output)
    }
}

/// What the engine needs from the runner's configuration.
pub(crate) struct Env<'a> {
    /// The pack's service and its config, for http steps.
    pub service: Option<(&'a str, &'a ServiceConfig)>,
    pub exec_path: &'a str,
    /// program name → the argv prefix that replaces it (e.g. vtysh with its socket dir).
    pub programs: &'a BTreeMap<String, Vec<String>>,
    pub max_output: usize,
}

pub(crate) struct Outcome {
    pub output: Value,
    pub truncated: bool,
    pub vars: Map<String, Value>,
}

pub(crate) async fn run(
    answers: &impl Answers,
    env: &Env<'_>,
    tool: &Tool,
    args: &Map<String, Value>,
    mode: Mode,
    preview_vars: Option<&Map<String, Value>>,
    raw: bool,
) -> Result<Outcome, String> {
    let (steps, vars) = match mode {
        Mode::Preview => {
            let preview = tool
                .preview
                .as_ref()
                .ok_or_else(|| format!("`{}` has no preview", tool.name))?;
            (&preview.steps, Map::new())
        }
        Mode::Verify => {
            let verify = tool
                .verify
                .as_ref()
                .ok_or_else(|| format!("`{}` has no verify", tool.name))?;
            (&verify.steps, Map::new())
        }
        Mode::Execute => {
            let vars = match (&tool.preview, preview_vars) {
                (None, _) => Map::new(),
                (Some(_), None) if !tool.needs_preview_values() => Map::new(),
                (Some(p), Some(given)) => {
                    if let Some(extra) = given.keys().find(|k| !p.vars.contains(k)) {
                        return Err(format!(
                            "the preview value `{extra}` is not one the preview of `{}` captures",
                            tool.name
                        ));
                    }
                    let missing: Vec<&str> = p
                        .vars
                        .iter()
                        .filter(|v| !given.contains_key(*v))
                        .map(String::as_str)
                        .collect();
                    if !missing.is_empty() {
                        return Err(format!(
                            "the preview values {missing:?} are missing: run the preview first"
                        ));
                    }
                    given.clone()
                }
                (Some(_), None) => {
                    return Err(format!(
                        "`{}` executes only with the values its preview captured: run the preview first",
                        tool.name
                    ));
                }
            };
            (&tool.steps, vars)
        }
    };
    let mut context = json!({"args": args, "vars": vars, "steps": {}});
    let mut truncated = false;
    let mut last = Value::Null;
    for step in steps {
        match run_step(answers, env, step, &context).await {
            Ok(StepResult::Done { result, cut }) => {
                truncated |= cut;
                last = result.clone();
                context["steps"][&step.name] = result;
            }
            Ok(StepResult::CheckPassed) => {}
            Err(StepError::Stop(message)) => return Err(format!("precondition failed: {message}")),
            Err(StepError::Failed(e)) if step.optional => {
                context["steps"][&step.name] = json!({"error": e});
            }
            Err(StepError::Failed(e)) => {
                return Err(if steps.len() > 1 {
                    format!("step `{}`: {e}", step.name)
                } else {
                    e
                });
            }
        }
        for (var, program) in &step.capture {
            let value = program
                .run(&context)
                .map_err(|e| format!("step `{}`: capturing `{var}`: {e}", step.name))?;
            context["vars"][var] = value;
        }
    }
    let vars = context["vars"].as_object().cloned().unwrap_or_default();
    let shaped_input = if tool.single_action && mode == Mode::Execute {
        last
    } else {
        context
    };
    let program = match mode {
        Mode::Preview => tool.preview.as_ref().and_then(|p| p.output.as_ref()),
        Mode::Execute => tool.output.as_ref(),
        // A gate's evidence is what its steps saw, unshaped.
        Mode::Verify => None,
    };
    let output = match program {
        Some(p) if !raw => match p.run(&shaped_input) {
            Ok(shaped) => shaped,
            // A cut-off answer is text, not the JSON the program expects: hand over what
            // arrived, marked truncated, rather than an error about the program.
            Err(_) if truncated => shaped_input,
            Err(e) => return Err(format!("the output program of `{}` failed: {e}", tool.name)),
        },
        _ => shaped_input,
    };
    Ok(Outcome {
        output,
        truncated,
        vars,
    })
}

enum StepResult {
    Done { result: Value, cut: bool },
    CheckPassed,
}

enum StepError {
    /// A precondition did not hold.
    Stop(String),
    Failed(String),
}

/// Template values: the vars captured so far, then the args over them. Names never collide
/// (the pack loader refuses a capture named like a param, the agent a preview value), and
/// should one ever, the argument wins: a var never stands in for an approved argument.
fn fill_values(context: &Value) -> Map<String, Value> {
    let mut values = context["vars"].as_object().cloned().unwrap_or_default();
    if let Some(args) = context["args"].as_object() {
        values.extend(args.clone());
    }
    values
}

async fn run_step(
    answers: &impl Answers,
    env: &Env<'_>,
    step: &Step,
    context: &Value,
) -> Result<StepResult, StepError> {
    let values = fill_values(context);
    match &step.kind {
        StepKind::Check { check, message } => match check.run(context) {
            Ok(Value::Bool(true)) => Ok(StepResult::CheckPassed),
            Ok(_) => Err(StepError::Stop(
                message
                    .fill_raw(&values)
                    .ok()
                    .flatten()
                    .unwrap_or_else(|| message.source().to_owned()),
            )),
            Err(e) => Err(StepError::Failed(format!("check failed to run: {e}"))),
        },
        StepKind::Run(Action::Http(action)) => {
            let (name, service) = env.service.ok_or_else(|| {
                StepError::Failed("no service is configured for this pack".into())
            })?;
            let body = action
                .body
                .as_ref()
                .map(|b| b.run(context))
                .transpose()
                .map_err(|e| StepError::Failed(format!("building the request body: {e}")))?;
            let request = http_action::request(action, &values, body).map_err(StepError::Failed)?;
            let r = answers
                .http(name, service, &request, env.max_output)
                .await
                .and_then(|r| http_action::accepted(name, action, r))
                .map_err(StepError::Failed)?;
            Ok(StepResult::Done {
                result: r.to_json(),
                cut: r.truncated,
            })
        }
        StepKind::Run(Action::Exec(action)) => {
            let mut argv = Vec::with_capacity(action.argv.len() + 2);
            for (i, t) in action.argv.iter().enumerate() {
                let filled = t
                    .fill_raw(&values)
                    .map_err(StepError::Failed)?
                    .ok_or_else(|| {
                        StepError::Failed(format!("argv `{}` needs an absent value", t.source()))
                    })?;
                match env.programs.get(&filled) {
                    Some(prefix) if i == 0 => argv.extend(prefix.iter().cloned()),
                    _ => argv.push(filled),
                }
            }
            let r = answers
                .exec(&argv, env.exec_path, action.timeout, env.max_output)
                .await
                .map_err(StepError::Failed)?;
            match r.exit_code {
                Some(code) if action.ok_exit_codes.contains(&code) => Ok(StepResult::Done {
                    result: r.to_json(),
                    cut: r.truncated,
                }),
                _ => Err(StepError::Failed(format!(
                    "`{}` exited with {}: {}",
                    argv[0],
                    r.exit_code.map_or_else(
                        || format!("signal {}", r.signal.unwrap_or(0)),
                        |c| format!("code {c}")
                    ),
                    excerpt(if r.stderr.trim().is_empty() {
                        &r.stdout
                    } else {
                        &r.stderr
                    })
                ))),
            }
        }
    }
}

fn excerpt(s: &str) -> String {
    let s = s.trim();
    let cut: String = s.chars().take(500).collect();
    if cut.len() < s.len() {
        format!("{cut}…")
    } else {
        cut
    }
}
