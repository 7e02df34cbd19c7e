//! The serde shape of a pack file, exactly as written. Nothing here is checked beyond syntax;
//! `resolve` turns it into a `Pack` or says what is wrong.

use std::collections::BTreeMap;

use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPack {
    /// The pack name: the prefix of every tool name (`traefik` → `traefik.ping`).
    pub pack: String,
    pub description: String,
    /// The runner-side service whose base URL and credentials http actions use
    /// (`[services.NAME]` in runner.toml). Packs with only exec actions leave it out.
    #[serde(default)]
    pub service: Option<String>,
    pub tools: BTreeMap<String, RawTool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTool {
    pub description: String,
    pub risk: String,
    pub scope: String,
    #[serde(default)]
    pub params: BTreeMap<String, RawParam>,
    /// One action. Its result (`{status, body}` for http, `{exit_code, stdout, stderr}` for
    /// exec) is the input of `output`.
    #[serde(default)]
    pub action: Option<RawAction>,
    /// Several steps instead of one action. Later steps use values captured by earlier ones;
    /// the input of `output` is the context `{args, vars, steps: {NAME: result}}`.
    #[serde(default)]
    pub steps: Option<Vec<RawStep>>,
    /// Read-only steps run when a write is requested, before anyone approves it. Their
    /// captured `vars` are bound into the request and available again at execution.
    #[serde(default)]
    pub preview: Option<RawPreview>,
    /// A jq program that shapes the result into what the agent sees.
    #[serde(default)]
    pub output: Option<String>,
    /// An example call, shown by `emisar packs show`.
    #[serde(default)]
    pub example: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawParam {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default = "default_true")]
    pub required: bool,
    #[serde(default)]
    pub pattern: Option<String>,
    #[serde(rename = "enum", default)]
    pub choices: Option<Vec<String>>,
    #[serde(default)]
    pub min: Option<i64>,
    #[serde(default)]
    pub max: Option<i64>,
    #[serde(default)]
    pub max_length: Option<u64>,
    /// Secret params are never stored or logged in clear.
    #[serde(default)]
    pub secret: bool,
    /// The name of a runner-side allowlist (`[allowlists] NAME = [...]` in runner.toml) that
    /// the value must be in. A runner without that list refuses every value.
    #[serde(default)]
    pub allowlist: Option<String>,
}

fn default_true() -> bool {
    true
}

/// Exactly one of `http` or `exec` (a struct rather than an enum: YAML would otherwise want
/// `!http` tags).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAction {
    #[serde(default)]
    pub http: Option<RawHttp>,
    #[serde(default)]
    pub exec: Option<RawExec>,
}

/// One step: an http or exec action, or a `check` (a precondition), plus captures.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawStep {
    pub name: String,
    #[serde(default)]
    pub http: Option<RawHttp>,
    #[serde(default)]
    pub exec: Option<RawExec>,
    /// A jq program over the context that must yield `true`, or the call stops here with
    /// `message` (a template over params and vars) and nothing after it runs.
    #[serde(default)]
    pub check: Option<String>,
    #[serde(default)]
    pub message: Option<String>,
    /// var name → jq program over the context (this step's result included).
    #[serde(default)]
    pub capture: BTreeMap<String, String>,
    /// A failed optional step records its error and the steps go on.
    #[serde(default)]
    pub optional: bool,
    /// The pack's word that this step changes nothing: required of a preview step that runs a
    /// command, or that POSTs to an endpoint which only reads (such as Nomad's job plan).
    #[serde(default)]
    pub read_only: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPreview {
    pub steps: Vec<RawStep>,
    /// Shapes the preview for the approver (the input is the preview's context).
    #[serde(default)]
    pub output: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHttp {
    pub method: String,
    pub path: String,
    #[serde(default)]
    pub query: BTreeMap<String, String>,
    /// A jq program over the context whose result is sent as the JSON body.
    #[serde(default)]
    pub body: Option<String>,
    /// HTTP statuses that count as an answer. Default: any 2xx. `any` accepts every status
    /// (for probes such as a ping, where a 404 is itself the signal).
    #[serde(default)]
    pub accept_status: Option<serde_json::Value>,
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawExec {
    /// Each element is one argv element; `{param}` placeholders fill within it.
    pub argv: Vec<String>,
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Exit codes that count as success. Default: `[0]`.
    #[serde(default)]
    pub ok_exit_codes: Option<Vec<i32>>,
}
