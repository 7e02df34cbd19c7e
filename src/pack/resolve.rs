//! Turns raw pack files into checked [`Tool`]s and holds the loaded set.
//!
//! Invariant: a `Tool` that exists is valid: its name is an identifier, every param is typed
//! and constrained, every template refers only to declared params (path and argv only to
//! required ones), its jq programs compile and its argument validator is built. A write (risk
//! above `read`) has a preview, or the pack's non-empty reason why it has none, and likewise a
//! verify (the health gate of its rollouts) or the reason why it has none. A stock
//! pack's programs were compiled by a unit test, not at each start ([`JqProgram::stock`]).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use serde_json::{Map, Value, json};

use super::action::{
    Phase, Programs, Scope as StepScope, Step, StepKind, resolve_action, resolve_steps,
};
use super::jq::JqProgram;
use super::params::{self, Param};
use super::raw::{RawPack, RawPreview, RawTool, RawVerify};
use crate::digest::sha256_hex;
use crate::util::input::{IDENTIFIER_PATTERN, is_identifier};

/// The packs that ship inside the binary. A pack directory can override any of them by name.
const STOCK_PACKS: &[(&str, &str)] = &[
    ("consul.yaml", include_str!("../../packs/consul.yaml")),
    ("debian.yaml", include_str!("../../packs/debian.yaml")),
    ("frr.yaml", include_str!("../../packs/frr.yaml")),
    ("linux.yaml", include_str!("../../packs/linux.yaml")),
    ("nomad.yaml", include_str!("../../packs/nomad.yaml")),
    ("redis.yaml", include_str!("../../packs/redis.yaml")),
    ("traefik.yaml", include_str!("../../packs/traefik.yaml")),
    ("vm.yaml", include_str!("../../packs/vm.yaml")),
];

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

#[derive(Debug)]
pub struct Tool {
    /// `pack.tool`, the MCP tool name.
    pub name: String,
    pub pack: String,
    pub description: String,
    pub risk: Risk,
    pub scope: Scope,
    pub params: Vec<Param>,
    /// What the runner does, in order. A tool written with a single `action` has one step.
    pub steps: Vec<Step>,
    /// True when the tool was written with `action` (its output sees that action's result,
    /// not the whole context).
    pub single_action: bool,
    /// Read-only steps run at request time; their vars are needed at execution.
    pub preview: Option<Preview>,
    /// A write without a preview says why (`preview: {none: <reason>}`); the portal shows it
    /// where the preview would be. A write has exactly one of `preview` and `no_preview`.
    pub no_preview: Option<String>,
    /// The health gate of a rollout: read-only steps that must pass on a runner after its
    /// write before the next wave starts. A write has exactly one of `verify` and `no_verify`.
    pub verify: Option<Verify>,
    /// Why a write has nothing to verify (`verify: {none: <reason>}`): its gate is the
    /// write's own answer.
    pub no_verify: Option<String>,
    pub output: Option<JqProgram>,
    pub example: Option<Value>,
    /// JSON Schema of the pack params alone (what a runner validates).
    pub params_schema: Value,
    validator: jsonschema::Validator,
}

pub type ToolRef = Arc<Tool>;

#[derive(Debug)]
pub struct Preview {
    pub steps: Vec<Step>,
    pub output: Option<JqProgram>,
    /// The vars the preview captures (and execution receives).
    pub vars: Vec<String>,
}

/// A write's health gate (see [`Tool::verify`]).
#[derive(Debug)]
pub struct Verify {
    pub steps: Vec<Step>,
    /// How long the steps may take to pass on a runner after its write.
    pub within: std::time::Duration,
}

/// The longest a verify may wait for a runner to become healthy: a gate longer than this
/// holds the rollout (and the approval's lifetime) hostage.
pub(super) const VERIFY_MAX_WITHIN_S: u64 = 600;

impl Tool {
    /// Checks `args` (pack params only) and returns every broken rule.
    pub fn validate(&self, args: &Value) -> Result<(), Vec<String>> {
        let secret: Vec<&str> = self.secret_params().collect();
        params::validate(&self.validator, args, &secret)
    }

    /// Whether an execution must bring values its preview captured (and the runner sealed):
    /// a preview that captures none only shows, and its execution brings nothing.
    pub fn needs_preview_values(&self) -> bool {
        self.preview.as_ref().is_some_and(|p| !p.vars.is_empty())
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
        Self::load_from(STOCK_PACKS, Programs::Stock, dir)
    }

    /// [`Self::load`] with `stock` as the stock packs, their jq programs checked as
    /// `programs` says (the unit tests compile them; a start does not). A pack from `dir`
    /// always has its programs compiled.
    fn load_from(
        stock: &[(&str, &str)],
        programs: Programs,
        dir: Option<&Path>,
    ) -> Result<Self, PackError> {
        let mut sources: BTreeMap<String, (String, String, Programs)> = BTreeMap::new();
        for (file, text) in stock {
            let name = pack_name(file, text)?;
            sources.insert(
                name,
                (format!("stock:{file}"), (*text).to_owned(), programs),
            );
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
                sources.insert(name, (file, text, Programs::Compile));
            }
        }
        let mut set = PackSet::default();
        for (origin, text, programs) in sources.into_values() {
            set.add(&origin, &text, programs)?;
        }
        Ok(set)
    }

    fn add(&mut self, origin: &str, text: &str, programs: Programs) -> Result<(), PackError> {
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
            let tool = resolve_tool(&raw, tool_name, raw_tool, programs)
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

fn resolve_tool(
    pack: &RawPack,
    name: &str,
    raw: &RawTool,
    programs: Programs,
) -> Result<Tool, String> {
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
    let scope_kind = match raw.scope.as_str() {
        "node" => Scope::Node,
        "cluster" => Scope::Cluster,
        other => return Err(format!("scope `{other}` must be node or cluster")),
    };
    let params = raw
        .params
        .iter()
        .map(|(n, p)| Param::from_raw(n, p))
        .collect::<Result<Vec<_>, _>>()?;
    let has_service = pack.service.is_some();
    let mut scope = StepScope {
        params: &params,
        vars: Default::default(),
        programs,
    };
    let (preview, no_preview) = match (&raw.preview, risk) {
        (None, Risk::Read) => (None, None),
        (None, Risk::Low | Risk::High) => return Err(NO_PREVIEW.into()),
        (Some(_), Risk::Read) => {
            return Err(
                "a read needs no preview: previews are for writes an approver looks at".into(),
            );
        }
        (Some(RawPreview::None(reason)), _) => (None, Some(no_preview_reason(reason)?)),
        (Some(RawPreview::Steps { steps, output }), _) => {
            let steps = resolve_steps(steps, &mut scope, has_service, Phase::Preview)
                .map_err(|e| format!("preview: {e}"))?;
            let preview = Preview {
                steps,
                output: output.as_deref().map(|o| scope.program(o)).transpose()?,
                vars: scope.vars.iter().cloned().collect(),
            };
            (Some(preview), None)
        }
    };
    let (verify, no_verify) =
        resolve_verify(raw.verify.as_ref(), risk, &params, programs, has_service)?;
    let (steps, single_action) = match (&raw.action, &raw.steps) {
        (Some(action), None) => {
            let step = Step {
                name: "action".into(),
                kind: StepKind::Run(resolve_action(action, &scope, has_service)?),
                capture: Vec::new(),
                optional: false,
            };
            (vec![step], true)
        }
        (None, Some(steps)) => (
            resolve_steps(steps, &mut scope, has_service, Phase::Action)?,
            false,
        ),
        _ => return Err("a tool has exactly one of `action` or `steps`".into()),
    };
    let output = raw
        .output
        .as_deref()
        .map(|o| scope.program(o))
        .transpose()?;
    let params_schema = Value::Object(params::object_schema(&params));
    let validator = params::compile_validator(&params_schema)?;
    Ok(Tool {
        name: format!("{}.{name}", pack.pack),
        pack: pack.pack.clone(),
        description: raw.description.trim().to_owned(),
        risk,
        scope: scope_kind,
        params,
        steps,
        single_action,
        preview,
        no_preview,
        verify,
        no_verify,
        output,
        example: raw.example.clone(),
        params_schema,
        validator,
    })
}

/// The rule a write without a preview breaks: an approver must see what will change, or read
/// the pack's word on why nothing can be shown.
const NO_PREVIEW: &str = "a write needs a `preview`, or `preview: {none: <reason>}`";

/// The reason of `preview: {none: <reason>}`, trimmed: it must say something.
fn no_preview_reason(reason: &str) -> Result<String, String> {
    let reason = reason.trim();
    if reason.is_empty() {
        return Err(format!(
            "`preview: {{none: <reason>}}` needs a reason (it must not be empty): {NO_PREVIEW}"
        ));
    }
    Ok(reason.to_owned())
}

/// The rule every write follows: a rollout checks each wave before the next.
const NO_VERIFY: &str = "a write needs a `verify`, or `verify: {none: <reason>}`";

/// A write's health gate: its steps resolved read-only over the params alone (a verify sees
/// no preview values), and its deadline in range.
fn resolve_verify(
    raw: Option<&RawVerify>,
    risk: Risk,
    params: &[Param],
    programs: Programs,
    has_service: bool,
) -> Result<(Option<Verify>, Option<String>), String> {
    match (raw, risk) {
        (None, Risk::Read) => Ok((None, None)),
        // A rollout checks each wave before the next: a write says what healthy means.
        (None, Risk::Low | Risk::High) => Err(NO_VERIFY.into()),
        (Some(_), Risk::Read) => {
            Err("a read needs no verify: a verify is the health gate of a write's rollout".into())
        }
        (Some(RawVerify::None(reason)), _) => {
            let reason = reason.trim();
            if reason.is_empty() {
                return Err(format!(
                    "`verify: {{none: <reason>}}` needs a reason (it must not be empty): {NO_VERIFY}"
                ));
            }
            Ok((None, Some(reason.to_owned())))
        }
        (Some(RawVerify::Steps { steps, within_s }), _) => {
            let within_s = within_s.unwrap_or(60);
            if !(1..=VERIFY_MAX_WITHIN_S).contains(&within_s) {
                return Err(format!(
                    "verify: `within_s` {within_s} is out of range: it must be 1 to {VERIFY_MAX_WITHIN_S}"
                ));
            }
            let mut scope = StepScope {
                params,
                vars: Default::default(),
                programs,
            };
            let steps = resolve_steps(steps, &mut scope, has_service, Phase::Verify)
                .map_err(|e| format!("verify: {e}"))?;
            Ok((
                Some(Verify {
                    steps,
                    within: std::time::Duration::from_secs(within_s),
                }),
                None,
            ))
        }
    }
}

/// The most characters a call's `reason` may have: the schema says so, and the gateway
/// checks it again on what arrives.
pub const REASON_MAX_CHARS: usize = 2000;

/// The schema of `reason`, which every tool takes: recorded in the audit log, so it must say
/// something (not only whitespace) and stay short.
pub fn reason_schema(description: &str) -> Value {
    json!({
        "type": "string",
        "minLength": 1,
        "maxLength": REASON_MAX_CHARS,
        "pattern": "\\S",
        "description": description,
    })
}

/// The MCP input schema: the pack params plus `runners`, `selector`, `reason` and `raw`.
/// Which runners exist changes at run time; [`with_runner_names`] adds them for a listing.
pub fn input_schema(tool: &Tool) -> Map<String, Value> {
    let mut schema = params::object_schema(&tool.params);
    let mut runners = json!({
        "type": "array",
        "items": {"type": "string", "pattern": IDENTIFIER_PATTERN},
        "minItems": 1,
        "uniqueItems": true,
        "description": match tool.scope {
            Scope::Node => "The runners (nodes) to run this on. Name at least one, or give a `selector`.",
            Scope::Cluster => "Optional: the runner to ask. Left out, the server picks a healthy runner serving this pack and says which.",
        },
    });
    if tool.scope == Scope::Cluster {
        runners["maxItems"] = json!(1);
    }
    let selector = json!({
        "type": "string",
        "pattern": crate::selector::PATTERN,
        "description": "Instead of `runners`: every runner whose labels match, e.g. `role=edge,dc=dc1`.",
    });
    let reason = reason_schema("Why you are making this call. Recorded in the audit log.");
    let raw = json!({
        "type": "boolean",
        "description": "Return the service's unshaped answer instead of the compact summary (still capped in size).",
    });
    if let Some(Value::Object(props)) = schema.get_mut("properties") {
        props.insert("runners".into(), runners);
        props.insert("selector".into(), selector);
        props.insert("reason".into(), reason);
        props.insert("raw".into(), raw);
    }
    if let Some(Value::Array(required)) = schema.get_mut("required") {
        required.push(json!("reason"));
    }
    schema
}

/// `schema` with the runner names a caller may name listed as the only valid `runners`.
pub fn with_runner_names(mut schema: Map<String, Value>, names: &[String]) -> Map<String, Value> {
    if let Some(items) = schema
        .get_mut("properties")
        .and_then(|p| p.get_mut("runners"))
        .and_then(|r| r.get_mut("items"))
    {
        items["enum"] = json!(names);
    }
    schema
}

/// Compiles a validator for [`input_schema`].
///
/// The validator checks `selector` with the parser ([`params::SELECTOR_FORMAT`]) rather
/// than its pattern, which the listed schema keeps for agents: both admit the same texts
/// (`selector`'s tests hold that), and the pattern's sixteen pairs of counted repetitions
/// compile to ~230 KB of automata per tool: three quarters of the idle server's heap.
pub fn input_validator(schema: &Map<String, Value>) -> Result<jsonschema::Validator, String> {
    let mut schema = schema.clone();
    if let Some(selector) = schema
        .get_mut("properties")
        .and_then(|p| p.get_mut("selector"))
        .and_then(Value::as_object_mut)
        && selector.get("pattern").and_then(Value::as_str) == Some(crate::selector::PATTERN)
    {
        selector.remove("pattern");
        selector.insert("format".into(), json!(params::SELECTOR_FORMAT));
    }
    params::compile_validator(&Value::Object(schema))
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

    /// A start does not compile the stock packs' jq programs ([`JqProgram::stock`]); this
    /// test compiles every one of them, as a pack from a directory has its compiled.
    #[test]
    fn every_stock_program_compiles() {
        let checked = PackSet::load_from(STOCK_PACKS, Programs::Compile, None).unwrap();
        let started = PackSet::load(None).unwrap();
        assert_eq!(checked.tools().count(), started.tools().count());
    }

    /// A program that does not compile, in each place a pack has programs: refused when the
    /// pack comes from a directory (or is a stock pack as the tests load it); kept as text
    /// when loaded as a start loads the stock packs.
    #[test]
    fn a_program_that_does_not_compile_is_refused_where_it_is_checked() {
        let places = ["PREVIEW", "CAPTURE", "CHECK", "BODY", "OUTPUT"];
        let template = "pack: t\ndescription: d\nservice: s\ntools:\n  x:\n    description: d\n    risk: low\n    scope: node\n    verify: {none: the programs are what is checked here}\n    preview:\n      steps:\n        - name: p\n          http: {method: GET, path: /v1}\n      output: 'PREVIEW'\n    steps:\n      - name: a\n        http: {method: GET, path: /v1}\n        capture:\n          v: 'CAPTURE'\n      - name: b\n        check: 'CHECK'\n        message: m\n      - name: c\n        http: {method: POST, path: /v1, body: 'BODY'}\n    output: 'OUTPUT'\n";
        let with_bad = |bad: &str| {
            places.iter().fold(template.to_owned(), |pack, place| {
                pack.replace(place, if *place == bad { "nosuchfn(1)" } else { "." })
            })
        };
        assert!(load_one(&with_bad("none")).is_ok());
        for place in places {
            let pack = with_bad(place);
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("t.yaml"), &pack).unwrap();
            let err = PackSet::load(Some(dir.path())).unwrap_err().to_string();
            assert!(err.contains("undefined `nosuchfn`"), "{place}: {err}");
            let stock = [("t.yaml", pack.as_str())];
            let err = PackSet::load_from(&stock, Programs::Compile, None).unwrap_err();
            assert!(
                err.to_string().contains("undefined `nosuchfn`"),
                "{place}: {err}"
            );
            assert!(
                PackSet::load_from(&stock, Programs::Stock, None).is_ok(),
                "{place}: a stock program was compiled at load"
            );
        }
    }

    fn load_one(yaml: &str) -> Result<PackSet, PackError> {
        let mut set = PackSet::default();
        set.add("test.yaml", yaml, Programs::Compile).map(|_| set)
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
        assert!(err.contains("undeclared param or var `other`"), "{err}");
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
    fn an_exec_program_is_a_name_or_an_absolute_path() {
        let pack = |program: &str| {
            format!(
                "pack: t\ndescription: d\nservice: s\ntools:\n  x:\n    description: d\n    risk: read\n    scope: node\n    action:\n      exec:\n        argv: ['{program}', '--version']\n"
            )
        };
        for relative in ["./tool", "bin/tool", "../usr/bin/tool"] {
            let err = load_one(&pack(relative)).unwrap_err().to_string();
            assert!(
                err.contains(&format!(
                    "exec argv[0] `{relative}` must be a program name or an absolute path"
                )),
                "{err}"
            );
        }
        for fine in ["tool", "/usr/bin/tool"] {
            assert!(load_one(&pack(fine)).is_ok(), "{fine}");
        }
    }

    #[test]
    fn steps_are_checked_in_order() {
        let pack = |steps: &str| {
            format!(
                "pack: t\ndescription: d\nservice: s\ntools:\n  x:\n    description: d\n    risk: high\n    scope: node\n    preview: {{none: the steps are what is checked here}}\n    verify: {{none: the steps are what is checked here}}\n    params:\n      job: {{type: identifier}}\n    steps:\n{steps}"
            )
        };
        let ok = pack(
            "      - {name: a, http: {method: GET, path: '/v1/{job}'}, capture: {idx: '.steps.a.body.Index'}}\n      - {name: b, check: '.vars.idx > 0', message: 'index {idx} of {job}'}\n      - {name: c, http: {method: POST, path: '/v1/{job}/{idx}', body: '{Index: .vars.idx}'}}\n",
        );
        let set = load_one(&ok).unwrap();
        let tool = set.tool("t.x").unwrap();
        assert_eq!(tool.steps.len(), 3);
        assert!(!tool.single_action);

        let cases = [
            (
                "      - {name: a, http: {method: GET, path: '/v1/{idx}'}}\n      - {name: b, http: {method: GET, path: '/'}, capture: {idx: '.'}}\n",
                "undeclared param or var `idx`",
            ),
            (
                "      - {name: a, check: 'true'}\n",
                "a check needs a `message`",
            ),
            (
                "      - {name: a, http: {method: GET, path: '/'}}\n      - {name: a, http: {method: GET, path: '/'}}\n",
                "used twice",
            ),
            (
                "      - {name: a, http: {method: GET, path: '/'}, capture: {job: '.'}}\n",
                "already a param",
            ),
            (
                "      - {name: a, http: {method: GET, path: '/'}, exec: {argv: [x]}}\n",
                "exactly one of",
            ),
            (
                "      - {name: a, http: {method: GET, path: '/'}, capture: {v: '.a | map('}}\n",
                "offset",
            ),
        ];
        for (steps, want) in cases {
            let err = load_one(&pack(steps)).unwrap_err().to_string();
            assert!(err.contains(want), "{want}: {err}");
        }
        let preview = |steps: &str| {
            format!(
                "pack: t\ndescription: d\nservice: s\ntools:\n  x:\n    description: d\n    risk: high\n    scope: node\n    params:\n      job: {{type: identifier}}\n    verify: {{none: the preview is what is checked here}}\n    preview:\n      steps:\n{steps}    action: {{http: {{method: POST, path: '/v1/{{job}}'}}}}\n"
            )
        };
        for fine in [
            "        - {name: a, http: {method: GET, path: '/v1/{job}'}}\n",
            "        - {name: a, http: {method: head, path: '/v1/{job}'}}\n",
            "        - {name: a, read_only: true, http: {method: POST, path: '/v1/{job}/plan'}}\n",
            "        - {name: a, read_only: true, exec: {argv: [systemctl, show, '{job}']}}\n",
            "        - {name: a, check: 'true', message: m}\n",
        ] {
            assert!(load_one(&preview(fine)).is_ok(), "{fine}");
        }
        for (bad, want) in [
            (
                "        - {name: a, http: {method: POST, path: '/v1/{job}'}}\n",
                "a POST must be marked `read_only: true`",
            ),
            (
                "        - {name: a, read_only: true, http: {method: PUT, path: '/v1/{job}'}}\n",
                "it may not PUT",
            ),
            (
                "        - {name: a, read_only: true, http: {method: DELETE, path: '/v1/{job}'}}\n",
                "it may not DELETE",
            ),
            (
                "        - {name: a, exec: {argv: [rm, '{job}']}}\n",
                "a command must be marked `read_only: true`",
            ),
        ] {
            let err = load_one(&preview(bad)).unwrap_err().to_string();
            assert!(
                err.contains("preview: step `a`") && err.contains(want),
                "{want}: {err}"
            );
        }
        let err = load_one(&pack(
            "      - {name: a, read_only: true, http: {method: GET, path: '/'}}\n",
        ))
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("only a preview or verify step takes `read_only`"),
            "{err}"
        );
        let read_with_preview = "pack: t\ndescription: d\nservice: s\ntools:\n  x:\n    description: d\n    risk: read\n    scope: node\n    preview: {steps: [{name: p, http: {method: GET, path: '/'}}]}\n    action: {http: {method: GET, path: '/'}}\n";
        assert!(
            load_one(read_with_preview)
                .unwrap_err()
                .to_string()
                .contains("a read needs no preview")
        );
    }

    /// A write must show its approver something: a preview, or the pack's reason why there
    /// is none. The error names the pack, the tool and the rule.
    #[test]
    fn a_write_needs_a_preview_or_a_reason_for_none() {
        let tool = |risk: &str, preview: &str| {
            format!(
                "pack: t\ndescription: d\ntools:\n  x:\n    description: d\n    risk: {risk}\n    scope: node\n{preview}{verify}    action: {{exec: {{argv: [uname]}}}}\n",
                verify = if risk == "read" {
                    ""
                } else {
                    "    verify: {none: uname changes nothing}\n"
                }
            )
        };
        for risk in ["low", "high"] {
            let err = load_one(&tool(risk, "")).unwrap_err().to_string();
            assert_eq!(
                err,
                "pack test.yaml: tool `t.x`: a write needs a `preview`, or `preview: {none: <reason>}`",
                "{risk}"
            );
            for empty in ["''", "'   '"] {
                let err = load_one(&tool(risk, &format!("    preview: {{none: {empty}}}\n")))
                    .unwrap_err()
                    .to_string();
                assert!(
                    err.contains("tool `t.x`: `preview: {none: <reason>}` needs a reason"),
                    "{risk} {empty}: {err}"
                );
            }
            let set = load_one(&tool(
                risk,
                "    preview: {none: '  uname changes nothing to show  '}\n",
            ))
            .unwrap();
            let x = set.tool("t.x").unwrap();
            assert!(x.preview.is_none());
            assert_eq!(
                x.no_preview.as_deref(),
                Some("uname changes nothing to show")
            );
            let set = load_one(&tool(
                risk,
                "    preview: {steps: [{name: p, read_only: true, exec: {argv: [uname]}}]}\n",
            ))
            .unwrap();
            let x = set.tool("t.x").unwrap();
            assert!(x.preview.is_some() && x.no_preview.is_none());
        }
        assert!(load_one(&tool("read", "")).is_ok());
        let err = load_one(&tool("read", "    preview: {none: reads change nothing}\n"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("a read needs no preview"), "{err}");
        let both =
            "    preview: {none: r, steps: [{name: p, read_only: true, exec: {argv: [uname]}}]}\n";
        for bad in [both, "    preview: {output: '.'}\n", "    preview: {}\n"] {
            let err = load_one(&tool("high", bad)).unwrap_err().to_string();
            assert!(
                err.contains(
                    "tools.x: `preview` has either `steps` (and an optional `output`) or `none: <reason>`"
                ),
                "{bad}: {err}"
            );
        }
    }

    /// A write must say what "healthy after this change" means for its rollout's gate: a
    /// verify, or the pack's reason why there is none. A read has no gate.
    #[test]
    fn a_write_needs_a_verify_or_a_reason_for_none() {
        let tool = |risk: &str, verify: &str| {
            format!(
                "pack: t\ndescription: d\ntools:\n  x:\n    description: d\n    risk: {risk}\n    scope: node\n    preview: {{none: nothing to show}}\n{verify}    action: {{exec: {{argv: [uname]}}}}\n"
            )
        };
        for risk in ["low", "high"] {
            let err = load_one(&tool(risk, "")).unwrap_err().to_string();
            assert_eq!(
                err,
                "pack test.yaml: tool `t.x`: a write needs a `verify`, or `verify: {none: <reason>}`",
                "{risk}"
            );
            for empty in ["''", "'   '"] {
                let err = load_one(&tool(risk, &format!("    verify: {{none: {empty}}}\n")))
                    .unwrap_err()
                    .to_string();
                assert!(
                    err.contains("tool `t.x`: `verify: {none: <reason>}` needs a reason"),
                    "{risk} {empty}: {err}"
                );
            }
            let set = load_one(&tool(
                risk,
                "    verify: {none: '  uname leaves nothing to check  '}\n",
            ))
            .unwrap();
            let x = set.tool("t.x").unwrap();
            assert!(x.verify.is_none());
            assert_eq!(
                x.no_verify.as_deref(),
                Some("uname leaves nothing to check")
            );
            let set = load_one(&tool(
                risk,
                "    verify: {steps: [{name: v, read_only: true, exec: {argv: [uname]}}]}\n",
            ))
            .unwrap();
            let x = set.tool("t.x").unwrap();
            let verify = x.verify.as_ref().expect("a verify");
            assert!(x.no_verify.is_none());
            assert_eq!(
                verify.within,
                std::time::Duration::from_secs(60),
                "the default"
            );
        }
        let read = "pack: t\ndescription: d\ntools:\n  x:\n    description: d\n    risk: read\n    scope: node\nVERIFY    action: {exec: {argv: [uname]}}\n";
        assert!(load_one(&read.replace("VERIFY", "")).is_ok());
        for verify in [
            "    verify: {none: reads change nothing}\n",
            "    verify: {steps: [{name: v, read_only: true, exec: {argv: [uname]}}]}\n",
        ] {
            let err = load_one(&read.replace("VERIFY", verify))
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("tool `t.x`: a read needs no verify"),
                "{verify}: {err}"
            );
        }
        let both =
            "    verify: {none: r, steps: [{name: v, read_only: true, exec: {argv: [uname]}}]}\n";
        for bad in [both, "    verify: {within_s: 5}\n", "    verify: {}\n"] {
            let err = load_one(&tool("high", bad)).unwrap_err().to_string();
            assert!(
                err.contains(
                    "tools.x: `verify` has either `steps` (and an optional `within_s`) or `none: <reason>`"
                ),
                "{bad}: {err}"
            );
        }
    }

    /// A verify only looks: its steps follow a preview's read-only rules, see the params
    /// alone, and its deadline is 1 to 600 seconds.
    #[test]
    fn a_verify_only_checks_health_within_its_deadline() {
        let verify = |within: &str, steps: &str| {
            format!(
                "pack: t\ndescription: d\nservice: s\ntools:\n  x:\n    description: d\n    risk: high\n    scope: node\n    params:\n      job: {{type: identifier}}\n    preview:\n      steps:\n        - {{name: p, http: {{method: GET, path: '/v1/{{job}}'}}, capture: {{seen: '.steps.p.body'}}}}\n    verify:\n{within}      steps:\n{steps}    action: {{http: {{method: POST, path: '/v1/{{job}}'}}}}\n"
            )
        };
        let fine_steps = "        - {name: a, http: {method: GET, path: '/v1/{job}'}, capture: {state: '.steps.a.body.State'}}\n        - {name: b, check: '.vars.state == \"running\"', message: 'job {job} is {state}'}\n";
        let set = load_one(&verify("      within_s: 600\n", fine_steps)).unwrap();
        let v = set.tool("t.x").unwrap().verify.as_ref().unwrap();
        assert_eq!(v.steps.len(), 2);
        assert_eq!(v.within, std::time::Duration::from_secs(600));
        for fine in [
            "        - {name: x, http: {method: head, path: '/v1/{job}'}}\n",
            "        - {name: x, read_only: true, http: {method: POST, path: '/v1/{job}/plan'}}\n",
            "        - {name: x, read_only: true, exec: {argv: [systemctl, show, '{job}']}}\n",
        ] {
            assert!(load_one(&verify("", fine)).is_ok(), "{fine}");
        }
        for (bad, want) in [
            (
                "        - {name: x, http: {method: POST, path: '/v1/{job}'}}\n",
                "verify: step `x`: a verify step only checks health: a POST must be marked `read_only: true`",
            ),
            (
                "        - {name: x, read_only: true, http: {method: PUT, path: '/v1/{job}'}}\n",
                "verify: step `x`: a verify step only checks health: it may not PUT",
            ),
            (
                "        - {name: x, read_only: true, http: {method: DELETE, path: '/v1/{job}'}}\n",
                "verify: step `x`: a verify step only checks health: it may not DELETE",
            ),
            (
                "        - {name: x, exec: {argv: [systemctl, restart, '{job}']}}\n",
                "verify: step `x`: a verify step only checks health: a command must be marked `read_only: true`",
            ),
            // The preview's values are not a verify's: it sees the params alone.
            (
                "        - {name: x, http: {method: GET, path: '/v1/{seen}'}}\n",
                "undeclared param or var `seen`",
            ),
        ] {
            let err = load_one(&verify("", bad)).unwrap_err().to_string();
            assert!(
                err.contains("tool `t.x`: ") && err.contains(want),
                "{want}: {err}"
            );
        }
        for within in ["0", "601"] {
            let err = load_one(&verify(&format!("      within_s: {within}\n"), fine_steps))
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(&format!(
                    "tool `t.x`: verify: `within_s` {within} is out of range: it must be 1 to 600"
                )),
                "{within}: {err}"
            );
        }
    }

    /// The kind of an action or step is one key: the pack file is refused, naming the rule
    /// (and the step), when it has none, several, or a `message` without a `check`.
    #[test]
    fn an_action_or_step_has_exactly_one_kind() {
        let action = |action: &str| {
            format!(
                "pack: t\ndescription: d\nservice: s\ntools:\n  x:\n    description: d\n    risk: read\n    scope: node\n    action: {action}\n"
            )
        };
        for bad in [
            "{http: {method: GET, path: /}, exec: {argv: [uname]}}",
            "{}",
        ] {
            let err = load_one(&action(bad)).unwrap_err().to_string();
            assert!(
                err.contains("tools.x: `action` has exactly one of `http` or `exec`"),
                "{bad}: {err}"
            );
        }
        assert!(load_one(&action("{exec: {argv: [uname]}}")).is_ok());
        let err = load_one(&action("{http: {method: GET, path: /}, check: 'true'}"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown field `check`"), "{err}");

        let step = |step: &str| {
            format!(
                "pack: t\ndescription: d\nservice: s\ntools:\n  x:\n    description: d\n    risk: read\n    scope: node\n    steps:\n      - {step}\n"
            )
        };
        for (bad, want) in [
            (
                "{name: a, http: {method: GET, path: /}, exec: {argv: [uname]}}",
                "step `a`: a step has exactly one of `http`, `exec` or `check`",
            ),
            (
                "{name: a, exec: {argv: [uname]}, check: 'true', message: m}",
                "step `a`: a step has exactly one of `http`, `exec` or `check`",
            ),
            (
                "{name: a}",
                "step `a`: a step has exactly one of `http`, `exec` or `check`",
            ),
            (
                "{name: a, message: m}",
                "step `a`: a step has exactly one of `http`, `exec` or `check`",
            ),
            (
                "{name: a, exec: {argv: [uname]}, message: m}",
                "step `a`: only a check step takes a `message`",
            ),
            (
                "{name: a, check: 'true'}",
                "step `a`: a check needs a `message`",
            ),
        ] {
            let err = load_one(&step(bad)).unwrap_err().to_string();
            assert!(
                err.contains(&format!("tools.x.steps: {want}")),
                "{bad}: {err}"
            );
        }
        let set = load_one(&step("{name: a, check: 'true', message: m}")).unwrap();
        assert!(matches!(
            set.tool("t.x").unwrap().steps[0].kind,
            StepKind::Check { .. }
        ));
    }

    #[test]
    fn input_schema_requires_reason_and_runners() {
        let set = PackSet::load(None).unwrap();
        let tool = set.tool("traefik.ping").unwrap();
        let schema = with_runner_names(input_schema(tool), &["a".into(), "b".into()]);
        let v = input_validator(&schema).unwrap();
        let ok = json!({"runners": ["a"], "reason": "checking the edge"});
        assert!(params::validate(&v, &ok, &[]).is_ok());
        for bad in [
            json!({"runners": ["a"]}),
            json!({"runners": ["a"], "reason": ""}),
            json!({"runners": ["a"], "reason": "   "}),
            json!({"runners": [], "reason": "x"}),
            json!({"runners": ["zzz"], "reason": "x"}),
            json!({"runners": ["a"], "reason": "x", "selector": "role"}),
        ] {
            assert!(params::validate(&v, &bad, &[]).is_err(), "{bad}");
        }
    }
}
