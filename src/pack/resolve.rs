//! Turns raw pack files into checked [`Tool`]s and holds the loaded set.
//!
//! Invariant: a `Tool` that exists is valid: its name is an identifier, every param is typed
//! and constrained, every template refers only to declared params (path and argv only to
//! required ones), its jq program compiles and its argument validator is built.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value, json};

use super::jq::JqProgram;
use super::params::{self, Param, is_identifier};
use super::raw::{RawPack, RawTool};
use super::template::Template;
use crate::digest::sha256_hex;

/// The packs that ship inside the binary. A pack directory can override any of them by name.
const STOCK_PACKS: &[(&str, &str)] = &[("traefik.yaml", include_str!("../../packs/traefik.yaml"))];

const DEFAULT_HTTP_TIMEOUT: Duration = Duration::from_secs(10);
const DEFAULT_EXEC_TIMEOUT: Duration = Duration::from_secs(10);
/// No action may take longer than this, whatever the pack says.
const MAX_ACTION_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Debug, thiserror::Error)]
pub enum PackError {
    #[error("failed to read pack {file}: {source}")]
    Io {
        file: String,
        source: std::io::Error,
    },
    #[error("pack {file}: {message}")]
    Invalid { file: String, message: String },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Risk {
    /// Runs freely (still scoped to runners and audited with a reason).
    Read,
    /// A write the policy may let run without approval.
    Low,
    /// A write that always needs a human's approval.
    High,
}

impl Risk {
    pub fn as_str(self) -> &'static str {
        match self {
            Risk::Read => "read",
            Risk::Low => "low",
            Risk::High => "high",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// The agent names the runners (the answer is about that node).
    Node,
    /// Any runner serving the pack can answer for the whole cluster.
    Cluster,
}

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
pub struct Tool {
    /// `pack.tool`, the MCP tool name.
    pub name: String,
    pub pack: String,
    pub description: String,
    pub risk: Risk,
    pub scope: Scope,
    pub params: Vec<Param>,
    pub action: Action,
    pub output: Option<JqProgram>,
    pub example: Option<Value>,
    /// JSON Schema of the pack params alone (what a runner validates).
    pub params_schema: Value,
    validator: jsonschema::Validator,
}

pub type ToolRef = Arc<Tool>;

impl Tool {
    /// Checks `args` (pack params only) and returns every broken rule.
    pub fn validate(&self, args: &Value) -> Result<(), Vec<String>> {
        params::validate(&self.validator, args)
    }

    /// Names of the params marked secret.
    pub fn secret_params(&self) -> impl Iterator<Item = &str> {
        self.params
            .iter()
            .filter(|p| p.secret)
            .map(|p| p.name.as_str())
    }
}

#[derive(Debug, Clone)]
pub struct PackInfo {
    pub name: String,
    pub description: String,
    pub service: Option<String>,
    /// SHA-256 of the pack file: server and runner must agree on it.
    pub digest: String,
    /// Where it came from: `stock:traefik.yaml` or a file path.
    pub origin: String,
}

#[derive(Debug, Default)]
pub struct PackSet {
    packs: BTreeMap<String, PackInfo>,
    tools: BTreeMap<String, ToolRef>,
}

impl PackSet {
    /// Loads the stock packs, then every `*.yaml` in `dir` (if given); a pack in `dir`
    /// replaces the stock pack of the same name.
    pub fn load(dir: Option<&Path>) -> Result<Self, PackError> {
        let mut sources: BTreeMap<String, (String, String)> = BTreeMap::new();
        for (file, text) in STOCK_PACKS {
            let name = pack_name(file, text)?;
            sources.insert(name, (format!("stock:{file}"), (*text).to_owned()));
        }
        if let Some(dir) = dir {
            let io = |source| PackError::Io {
                file: dir.display().to_string(),
                source,
            };
            let mut files: Vec<_> = std::fs::read_dir(dir)
                .map_err(io)?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
                .collect();
            files.sort();
            for path in files {
                let file = path.display().to_string();
                let text = std::fs::read_to_string(&path).map_err(|source| PackError::Io {
                    file: file.clone(),
                    source,
                })?;
                let name = pack_name(&file, &text)?;
                sources.insert(name, (file, text));
            }
        }
        let mut set = PackSet::default();
        for (origin, text) in sources.into_values() {
            set.add(&origin, &text)?;
        }
        Ok(set)
    }

    fn add(&mut self, origin: &str, text: &str) -> Result<(), PackError> {
        let invalid = |message: String| PackError::Invalid {
            file: origin.to_owned(),
            message,
        };
        let raw: RawPack = yaml_serde::from_str(text).map_err(|e| invalid(e.to_string()))?;
        if !is_identifier(&raw.pack) || raw.pack.contains('.') {
            return Err(invalid(format!(
                "pack name `{}` must be an identifier without dots",
                raw.pack
            )));
        }
        if self.packs.contains_key(&raw.pack) {
            return Err(invalid(format!("pack `{}` is defined twice", raw.pack)));
        }
        let mut tools = Vec::new();
        for (tool_name, raw_tool) in &raw.tools {
            let tool = resolve_tool(&raw, tool_name, raw_tool)
                .map_err(|m| invalid(format!("tool `{}.{tool_name}`: {m}", raw.pack)))?;
            tools.push(Arc::new(tool));
        }
        self.packs.insert(
            raw.pack.clone(),
            PackInfo {
                name: raw.pack.clone(),
                description: raw.description.clone(),
                service: raw.service.clone(),
                digest: sha256_hex(text.as_bytes()),
                origin: origin.to_owned(),
            },
        );
        for tool in tools {
            self.tools.insert(tool.name.clone(), tool);
        }
        Ok(())
    }

    pub fn tool(&self, name: &str) -> Option<&ToolRef> {
        self.tools.get(name)
    }

    pub fn tools(&self) -> impl Iterator<Item = &ToolRef> {
        self.tools.values()
    }

    pub fn pack(&self, name: &str) -> Option<&PackInfo> {
        self.packs.get(name)
    }

    pub fn packs(&self) -> impl Iterator<Item = &PackInfo> {
        self.packs.values()
    }
}

/// Reads just the `pack:` name, so overrides can be matched before full resolution.
fn pack_name(file: &str, text: &str) -> Result<String, PackError> {
    #[derive(serde::Deserialize)]
    struct Head {
        pack: String,
    }
    let head: Head = yaml_serde::from_str(text).map_err(|e| PackError::Invalid {
        file: file.to_owned(),
        message: e.to_string(),
    })?;
    Ok(head.pack)
}

fn resolve_tool(pack: &RawPack, name: &str, raw: &RawTool) -> Result<Tool, String> {
    if !is_identifier(name) || name.contains('.') {
        return Err("tool name must be an identifier without dots".into());
    }
    if raw.description.trim().is_empty() {
        return Err("description must not be empty".into());
    }
    let risk = match raw.risk.as_str() {
        "read" => Risk::Read,
        "low" => Risk::Low,
        "high" => Risk::High,
        other => return Err(format!("risk `{other}` must be read, low or high")),
    };
    let scope = match raw.scope.as_str() {
        "node" => Scope::Node,
        "cluster" => Scope::Cluster,
        other => return Err(format!("scope `{other}` must be node or cluster")),
    };
    let params = raw
        .params
        .iter()
        .map(|(n, p)| Param::from_raw(n, p))
        .collect::<Result<Vec<_>, _>>()?;
    let declared = |n: &str| params.iter().find(|p| p.name == n);
    let check_refs = |t: &Template, must_be_required: bool| -> Result<(), String> {
        for n in t.params() {
            match declared(n) {
                None => {
                    return Err(format!(
                        "template `{}` uses undeclared param `{n}`",
                        t.source()
                    ));
                }
                Some(p) if must_be_required && !p.required => {
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
    };
    let action = match (&raw.action.http, &raw.action.exec) {
        (Some(_), Some(_)) | (None, None) => {
            return Err("action must have exactly one of `http` or `exec`".into());
        }
        (Some(h), None) => {
            if pack.service.is_none() {
                return Err("an http action needs the pack's `service`".into());
            }
            let method = h.method.to_ascii_uppercase();
            if !["GET", "HEAD", "POST", "PUT", "DELETE"].contains(&method.as_str()) {
                return Err(format!("http method `{}` is not supported", h.method));
            }
            if !h.path.starts_with('/') {
                return Err(format!("http path `{}` must start with /", h.path));
            }
            let path = Template::parse(&h.path)?;
            check_refs(&path, true)?;
            let mut query = Vec::new();
            for (k, v) in &h.query {
                let t = Template::parse(v)?;
                check_refs(&t, false)?;
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
                                .ok_or_else(|| {
                                    format!("accept_status entry {v} is not an HTTP status")
                                })
                        })
                        .collect::<Result<_, _>>()?,
                ),
                Some(other) => {
                    return Err(format!(
                        "accept_status {other} must be `any` or a list of statuses"
                    ));
                }
            };
            Action::Http(HttpAction {
                method,
                path,
                query,
                accept,
                timeout: timeout(h.timeout_ms, DEFAULT_HTTP_TIMEOUT)?,
            })
        }
        (None, Some(e)) => {
            let Some(program) = e.argv.first() else {
                return Err("exec argv must not be empty".into());
            };
            if program.contains('{') || program.is_empty() {
                return Err("exec argv[0] must be a literal program name".into());
            }
            let argv = e
                .argv
                .iter()
                .map(|a| Template::parse(a))
                .collect::<Result<Vec<_>, _>>()?;
            for t in &argv {
                check_refs(t, true)?;
            }
            Action::Exec(ExecAction {
                argv,
                timeout: timeout(e.timeout_ms, DEFAULT_EXEC_TIMEOUT)?,
                ok_exit_codes: e.ok_exit_codes.clone().unwrap_or_else(|| vec![0]),
            })
        }
    };
    let output = raw.output.as_deref().map(JqProgram::compile).transpose()?;
    let params_schema = Value::Object(params::object_schema(&params));
    let validator = params::compile_validator(&params_schema)?;
    Ok(Tool {
        name: format!("{}.{name}", pack.pack),
        pack: pack.pack.clone(),
        description: raw.description.trim().to_owned(),
        risk,
        scope,
        params,
        action,
        output,
        example: raw.example.clone(),
        params_schema,
        validator,
    })
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

/// The MCP input schema: the pack params plus `runners` and `reason`.
pub fn input_schema(tool: &Tool, runner_names: &[String]) -> Map<String, Value> {
    let mut schema = params::object_schema(&tool.params);
    let mut runners = json!({
        "type": "array",
        "items": {"type": "string", "pattern": params::IDENTIFIER_PATTERN},
        "minItems": 1,
        "uniqueItems": true,
        "description": match tool.scope {
            Scope::Node => "The runners (nodes) to run this on. At least one.",
            Scope::Cluster => "Optional: the runner to ask. Left out, the server picks a healthy runner serving this pack.",
        },
    });
    if !runner_names.is_empty() {
        runners["items"]["enum"] = json!(runner_names);
    }
    if tool.scope == Scope::Cluster {
        runners["maxItems"] = json!(1);
    }
    let reason = json!({
        "type": "string",
        "minLength": 1,
        "maxLength": 2000,
        "pattern": "\\S",
        "description": "Why you are making this call. Recorded in the audit log.",
    });
    if let Some(Value::Object(props)) = schema.get_mut("properties") {
        props.insert("runners".into(), runners);
        props.insert("reason".into(), reason);
    }
    if let Some(Value::Array(required)) = schema.get_mut("required") {
        if tool.scope == Scope::Node {
            required.push(json!("runners"));
        }
        required.push(json!("reason"));
    }
    schema
}

/// Compiles a validator for [`input_schema`].
pub fn input_validator(schema: &Map<String, Value>) -> Result<jsonschema::Validator, String> {
    params::compile_validator(&Value::Object(schema.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stock_packs_load() {
        let set = PackSet::load(None).unwrap();
        let ping = set.tool("traefik.ping").expect("traefik.ping");
        assert_eq!(ping.risk, Risk::Read);
        assert_eq!(ping.scope, Scope::Node);
        assert!(set.tool("traefik.services").is_some());
        assert!(set.tool("traefik.overview").is_some());
        assert_eq!(set.pack("traefik").unwrap().digest.len(), 64);
    }

    fn load_one(yaml: &str) -> Result<PackSet, PackError> {
        let mut set = PackSet::default();
        set.add("test.yaml", yaml).map(|_| set)
    }

    #[test]
    fn bad_packs_say_what_is_wrong() {
        let base = |params: &str, path: &str| {
            format!(
                "pack: t\ndescription: d\nservice: s\ntools:\n  x:\n    description: d\n    risk: read\n    scope: node\n    params:\n{params}\n    action:\n      http:\n        method: GET\n        path: {path}\n"
            )
        };
        let err = load_one(&base("      job: {type: string}", "/v1/{job}"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("tool `t.x`") && err.contains("free-form"),
            "{err}"
        );
        let err = load_one(&base("      job: {type: identifier}", "/v1/{other}"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("undeclared param `other`"), "{err}");
        let err = load_one(&base(
            "      job: {type: identifier, required: false}",
            "/v1/{job}",
        ))
        .unwrap_err()
        .to_string();
        assert!(err.contains("optional param"), "{err}");
        assert!(load_one(&base("      job: {type: identifier}", "/v1/{job}")).is_ok());
        let err = load_one("pack: t\ndescription: d\ntools: {}\nextra: 1\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown field `extra`"), "{err}");
    }

    #[test]
    fn input_schema_requires_reason_and_runners() {
        let set = PackSet::load(None).unwrap();
        let tool = set.tool("traefik.ping").unwrap();
        let schema = input_schema(tool, &["a".into(), "b".into()]);
        let v = input_validator(&schema).unwrap();
        let ok = json!({"runners": ["a"], "reason": "checking the edge"});
        assert!(params::validate(&v, &ok).is_ok());
        for bad in [
            json!({"runners": ["a"]}),
            json!({"runners": ["a"], "reason": ""}),
            json!({"runners": ["a"], "reason": "   "}),
            json!({"runners": [], "reason": "x"}),
            json!({"runners": ["zzz"], "reason": "x"}),
            json!({"reason": "x"}),
        ] {
            assert!(params::validate(&v, &bad).is_err(), "{bad}");
        }
    }
}
