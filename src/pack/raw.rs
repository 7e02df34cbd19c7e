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
    pub action: RawAction,
    /// A jq program applied to the action's result (`{status, body}` for http,
    /// `{exit_code, stdout, stderr}` for exec) to shape what the agent sees.
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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHttp {
    pub method: String,
    pub path: String,
    #[serde(default)]
    pub query: BTreeMap<String, String>,
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
