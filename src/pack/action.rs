//! Actions and steps: what a runner does for a tool, resolved and checked.
//!
//! A tool runs a list of steps. Each step is an http action, an exec action or a `check`
//! (a precondition), and may capture values (jq over the context) that later steps fill into
//! their templates. The context a jq program sees is
//! `{"args": {...}, "vars": {...}, "steps": {"NAME": result}}`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::{Value, json};

use super::jq::JqProgram;
use super::params::Param;
use super::raw::{RawAction, RawExec, RawHttp, RawStep, RawStepKind};
use super::template::Template;
use crate::util::input::is_identifier;

const DEFAULT_HTTP_TIMEOUT: Duration = Duration::from_secs(10);
const DEFAULT_EXEC_TIMEOUT: Duration = Duration::from_secs(10);
/// No action may take longer than this, whatever the pack says.
const MAX_ACTION_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Debug, Clone, PartialEq)]
pub enum AcceptStatus {
    /// Any 2xx.
    Success,
    /// Every status is an answer (probes).
    Any,
    List(Vec<u16>),
}

#[derive(Debug)]
pub struct HttpAction {
    pub method: String,
    pub path: Template,
    pub query: Vec<(String, Template)>,
    /// jq over the context; its result is the JSON body.
    pub body: Option<JqProgram>,
    pub accept: AcceptStatus,
    pub timeout: Duration,
}

impl HttpAction {
    pub fn accepts(&self, status: u16) -> bool {
        match &self.accept {
            AcceptStatus::Success => (200..300).contains(&status),
            AcceptStatus::Any => true,
            AcceptStatus::List(list) => list.contains(&status),
        }
    }
}

#[derive(Debug)]
pub struct ExecAction {
    /// `argv[0]` is a literal program name; the rest may hold placeholders.
    pub argv: Vec<Template>,
    pub timeout: Duration,
    pub ok_exit_codes: Vec<i32>,
}

#[derive(Debug)]
pub enum Action {
    Http(HttpAction),
    Exec(ExecAction),
}

#[derive(Debug)]
pub enum StepKind {
    Run(Action),
    /// Stop with `message` unless `check` yields `true`.
    Check {
        check: JqProgram,
        message: Template,
    },
}

#[derive(Debug)]
pub struct Step {
    pub name: String,
    pub kind: StepKind,
    pub capture: Vec<(String, JqProgram)>,
    pub optional: bool,
}

impl Step {
    /// The step as `emisar packs show` prints it: its name, what it does (as the pack wrote
    /// it, under the key of its kind), its captures and whether it is optional.
    pub fn describe(&self) -> Value {
        fn sources<T>(pairs: &[(String, T)], source: fn(&T) -> &str) -> BTreeMap<String, &str> {
            pairs.iter().map(|(k, v)| (k.clone(), source(v))).collect()
        }
        let what = match &self.kind {
            StepKind::Run(Action::Http(h)) => json!({
                "http": {"method": h.method, "path": h.path.source(),
                          "query": sources(&h.query, Template::source),
                          "body": h.body.as_ref().map(JqProgram::source)}
            }),
            StepKind::Run(Action::Exec(e)) => json!({
                "exec": {"argv": e.argv.iter().map(Template::source).collect::<Vec<_>>()}
            }),
            StepKind::Check { check, message } => json!({
                "check": check.source(), "message": message.source()
            }),
        };
        json!({
            "name": self.name,
            "do": what,
            "capture": sources(&self.capture, JqProgram::source),
            "optional": self.optional,
        })
    }
}

/// What templates of a step may refer to: params (with whether they are required) and vars;
/// and how the tool's jq programs are checked.
pub(super) struct Scope<'a> {
    pub params: &'a [Param],
    pub vars: BTreeSet<String>,
    pub programs: Programs,
}

/// How a pack's jq programs are checked when it loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Programs {
    /// Each is compiled now: a pack from a directory with a program that does not compile
    /// does not load.
    Compile,
    /// A stock pack's, compiled into the binary: the unit test that compiles every one of
    /// them stands for the check ([`JqProgram::stock`]).
    Stock,
}

/// Whether a template may use params the caller may leave out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Optional {
    /// Query values and check messages: a missing value is simply left out.
    Allowed,
    /// Paths and argv: a missing value would change what is called.
    Refused,
}

impl Scope<'_> {
    /// The jq program `code`, checked as [`Programs`] says.
    pub(super) fn program(&self, code: &str) -> Result<JqProgram, String> {
        match self.programs {
            Programs::Compile => JqProgram::compile(code),
            Programs::Stock => Ok(JqProgram::stock(code)),
        }
    }

    fn check_refs(&self, t: &Template, optional: Optional) -> Result<(), String> {
        for n in t.params() {
            if self.vars.contains(n) {
                continue;
            }
            match self.params.iter().find(|p| p.name == n) {
                None => {
                    return Err(format!(
                        "template `{}` uses undeclared param or var `{n}`",
                        t.source()
                    ));
                }
                Some(p) if optional == Optional::Refused && !p.required => {
                    return Err(format!(
                        "template `{}` uses optional param `{n}`: only query values may",
                        t.source()
                    ));
                }
                Some(p) if p.secret => {
                    return Err(format!(
                        "template `{}` uses secret param `{n}`, which would land in URLs and process lists",
                        t.source()
                    ));
                }
                Some(_) => {}
            }
        }
        Ok(())
    }
}

fn resolve_http(h: &RawHttp, scope: &Scope<'_>) -> Result<HttpAction, String> {
    let method = h.method.to_ascii_uppercase();
    if !["GET", "HEAD", "POST", "PUT", "DELETE"].contains(&method.as_str()) {
        return Err(format!("http method `{}` is not supported", h.method));
    }
    if !h.path.starts_with('/') {
        return Err(format!("http path `{}` must start with /", h.path));
    }
    let path = Template::parse(&h.path)?;
    scope.check_refs(&path, Optional::Refused)?;
    let mut query = Vec::new();
    for (k, v) in &h.query {
        let t = Template::parse(v)?;
        scope.check_refs(&t, Optional::Allowed)?;
        query.push((k.clone(), t));
    }
    let accept = match &h.accept_status {
        None => AcceptStatus::Success,
        Some(Value::String(s)) if s == "any" => AcceptStatus::Any,
        Some(Value::Array(list)) => AcceptStatus::List(
            list.iter()
                .map(|v| {
                    v.as_u64()
                        .filter(|s| (100..600).contains(s))
                        .map(|s| s as u16)
                        .ok_or_else(|| format!("accept_status entry {v} is not an HTTP status"))
                })
                .collect::<Result<_, _>>()?,
        ),
        Some(other) => {
            return Err(format!(
                "accept_status {other} must be `any` or a list of statuses"
            ));
        }
    };
    Ok(HttpAction {
        method,
        path,
        query,
        body: h.body.as_deref().map(|b| scope.program(b)).transpose()?,
        accept,
        timeout: timeout(h.timeout_ms, DEFAULT_HTTP_TIMEOUT)?,
    })
}

fn resolve_exec(e: &RawExec, scope: &Scope<'_>) -> Result<ExecAction, String> {
    let Some(program) = e.argv.first() else {
        return Err("exec argv must not be empty".into());
    };
    if program.contains('{') || program.is_empty() {
        return Err("exec argv[0] must be a literal program name".into());
    }
    if program.contains('/') && !program.starts_with('/') {
        // A bare name is looked up in the runner's exec_path, an absolute path is taken as
        // it is; a relative path would run whatever the runner's working directory holds.
        return Err(format!(
            "exec argv[0] `{program}` must be a program name or an absolute path, not a relative path"
        ));
    }
    let argv = e
        .argv
        .iter()
        .map(|a| Template::parse(a))
        .collect::<Result<Vec<_>, _>>()?;
    for t in &argv {
        scope.check_refs(t, Optional::Refused)?;
    }
    Ok(ExecAction {
        argv,
        timeout: timeout(e.timeout_ms, DEFAULT_EXEC_TIMEOUT)?,
        ok_exit_codes: e.ok_exit_codes.clone().unwrap_or_else(|| vec![0]),
    })
}

/// Checks an action of a pack whose `service` is `has_service` (http actions need one).
pub(super) fn resolve_action(
    raw: &RawAction,
    scope: &Scope<'_>,
    has_service: bool,
) -> Result<Action, String> {
    Ok(match raw {
        RawAction::Http(h) => {
            if !has_service {
                return Err("an http action needs the pack's `service`".into());
            }
            Action::Http(resolve_http(h, scope)?)
        }
        RawAction::Exec(e) => Action::Exec(resolve_exec(e, scope)?),
    })
}

/// Whether steps run at request time, before anyone approved anything (a preview), after
/// the write as a rollout's health gate (a verify), or as the tool's own action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    Preview,
    Verify,
    Action,
}

/// A preview runs before any human said yes, so each of its steps must be read-only: an http
/// GET or HEAD; a POST only when the pack marks the step `read_only` (some services answer
/// read-only questions with a POST, such as Nomad's job plan); never PUT or DELETE; a command
/// only when marked `read_only`. The mark is the pack author's word, reviewed with the pack;
/// what the loader can check, it checks.
fn check_read_only(step: &RawStep, phase: Phase) -> Result<(), String> {
    let why = match phase {
        Phase::Action => {
            if step.read_only {
                return Err("only a preview or verify step takes `read_only`".into());
            }
            return Ok(());
        }
        Phase::Preview => "a preview step runs before anyone approved",
        Phase::Verify => "a verify step only checks health",
    };
    match &step.kind {
        RawStepKind::Check { .. } => Ok(()),
        RawStepKind::Run(RawAction::Http(h)) => match h.method.to_ascii_uppercase().as_str() {
            "GET" | "HEAD" => Ok(()),
            "POST" if step.read_only => Ok(()),
            "POST" => Err(format!(
                "{why}: a POST must be marked `read_only: true` (only for an endpoint that changes nothing)"
            )),
            other => Err(format!("{why}: it may not {other}")),
        },
        RawStepKind::Run(RawAction::Exec(_)) if step.read_only => Ok(()),
        RawStepKind::Run(RawAction::Exec(_)) => Err(format!(
            "{why}: a command must be marked `read_only: true` (only for one that changes nothing)"
        )),
    }
}

/// Resolves steps in order; each step's captures become vars for the steps after it.
pub(super) fn resolve_steps(
    raw: &[RawStep],
    scope: &mut Scope<'_>,
    service: bool,
    phase: Phase,
) -> Result<Vec<Step>, String> {
    if raw.is_empty() {
        return Err("steps must not be empty".into());
    }
    let mut names = BTreeSet::new();
    let mut steps = Vec::new();
    for s in raw {
        let at = |m: String| format!("step `{}`: {m}", s.name);
        if !is_identifier(&s.name) || s.name.contains(['.', '@', '-']) {
            return Err(at("a step name must be letters, digits and `_`".into()));
        }
        if !names.insert(s.name.clone()) {
            return Err(at("the name is used twice".into()));
        }
        check_read_only(s, phase).map_err(at)?;
        let kind = match &s.kind {
            RawStepKind::Run(action) => {
                StepKind::Run(resolve_action(action, scope, service).map_err(at)?)
            }
            RawStepKind::Check { check, message } => {
                let message = Template::parse(message).map_err(at)?;
                scope.check_refs(&message, Optional::Allowed).map_err(at)?;
                StepKind::Check {
                    check: scope.program(check).map_err(at)?,
                    message,
                }
            }
        };
        let mut capture = Vec::new();
        for (var, program) in &s.capture {
            if !is_identifier(var) || var.contains(['.', '@', '-']) {
                return Err(at(format!(
                    "var name `{var}` must be letters, digits and `_`"
                )));
            }
            if scope.params.iter().any(|p| &p.name == var) || scope.vars.contains(var) {
                return Err(at(format!(
                    "var `{var}` is already a param or an earlier var"
                )));
            }
            capture.push((var.clone(), scope.program(program).map_err(at)?));
        }
        for (var, _) in &capture {
            scope.vars.insert(var.clone());
        }
        steps.push(Step {
            name: s.name.clone(),
            kind,
            capture,
            optional: s.optional,
        });
    }
    Ok(steps)
}

fn timeout(ms: Option<u64>, default: Duration) -> Result<Duration, String> {
    let t = ms.map(Duration::from_millis).unwrap_or(default);
    if t.is_zero() || t > MAX_ACTION_TIMEOUT {
        return Err(format!(
            "timeout_ms must be between 1 and {}",
            MAX_ACTION_TIMEOUT.as_millis()
        ));
    }
    Ok(t)
}
