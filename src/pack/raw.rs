//! The serde shape of a pack file, exactly as written. Nothing here is checked beyond syntax;
//! `resolve` turns it into a `Pack` or says what is wrong.

use std::collections::BTreeMap;

use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPack {
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
pub(super) struct RawTool {
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
    /// The health gate of a rollout: read-only steps (checks among them) run on each runner of
    /// a wave after the write, until they all pass or `within_s` runs out; or, written
    /// `verify: {none: <reason>}`, the pack's word on why nothing can be checked.
    #[serde(default)]
    pub verify: Option<RawVerify>,
    /// A jq program that shapes the result into what the agent sees.
    #[serde(default)]
    pub output: Option<String>,
    /// An example call, shown by `emisar packs show`.
    #[serde(default)]
    pub example: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawParam {
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
    /// The name of a list only the policy holds (`runners.RUNNER.NAME` in the policy file)
    /// that the value must be in; no runner checks it. For a cluster-scoped write, where the
    /// server may send the call to any runner serving the pack, so the values it may touch
    /// are one decision for the cluster, not a list to repeat in every runner.toml.
    #[serde(default)]
    pub policy_allowlist: Option<String>,
}

fn default_true() -> bool {
    true
}

/// One action: what a step does on the node. Serde reads it from [`ActionKeys`], a map with
/// one key per kind (YAML would want `!http` tags for a serde enum), and refuses a map with
/// none or several, so the rest of the pack module only ever matches on the kind.
///
/// A new kind of action is a variant here, its key in [`ActionKeys`] and [`StepKeys`], its
/// checked form in `action.rs`, its run in the node's engine, and its recording in
/// `emisar packs test` (a `Kind` in `cli/packs_test.rs`).
#[derive(Debug, Deserialize)]
#[serde(try_from = "ActionKeys")]
pub(super) enum RawAction {
    Http(RawHttp),
    Exec(RawExec),
}

/// How an action is written: `{http: …}` or `{exec: …}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ActionKeys {
    #[serde(default)]
    http: Option<RawHttp>,
    #[serde(default)]
    exec: Option<RawExec>,
}

impl ActionKeys {
    /// The keys of the kinds, in the order of [`ActionKeys::into_actions`].
    const KINDS: [&str; 2] = ["http", "exec"];

    /// Every action written, in the order of the kinds.
    fn into_actions(self) -> Vec<RawAction> {
        let ActionKeys { http, exec } = self;
        [http.map(RawAction::Http), exec.map(RawAction::Exec)]
            .into_iter()
            .flatten()
            .collect()
    }
}

impl TryFrom<ActionKeys> for RawAction {
    type Error = String;

    fn try_from(keys: ActionKeys) -> Result<Self, String> {
        let mut actions = keys.into_actions();
        match actions.pop() {
            Some(action) if actions.is_empty() => Ok(action),
            _ => Err(format!(
                "`action` has exactly one of {}",
                one_of(&ActionKeys::KINDS)
            )),
        }
    }
}

/// `keys` as a sentence names alternatives: "`a`, `b` or `c`".
fn one_of(keys: &[&str]) -> String {
    let quoted: Vec<String> = keys.iter().map(|k| format!("`{k}`")).collect();
    match quoted.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        _ => quoted.concat(),
    }
}

/// One step: an action or a `check` (a precondition), plus captures. Serde reads it from
/// [`StepKeys`] and refuses a step with no kind or several.
#[derive(Debug, Deserialize)]
#[serde(try_from = "StepKeys")]
pub(super) struct RawStep {
    pub name: String,
    pub kind: RawStepKind,
    /// var name → jq program over the context (this step's result included).
    pub capture: BTreeMap<String, String>,
    /// A failed optional step records its error and the steps go on.
    pub optional: bool,
    /// The pack's word that this step changes nothing: required of a preview step that runs a
    /// command, or that POSTs to an endpoint which only reads (such as Nomad's job plan).
    pub read_only: bool,
}

#[derive(Debug)]
pub(super) enum RawStepKind {
    Run(RawAction),
    /// A jq program over the context that must yield `true`, or the call stops here with
    /// `message` (a template over params and vars) and nothing after it runs.
    Check {
        check: String,
        message: String,
    },
}

/// How a step is written: its name, the keys of one action ([`ActionKeys`]) or a `check`
/// with its `message`, and the rest.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StepKeys {
    name: String,
    #[serde(default)]
    http: Option<RawHttp>,
    #[serde(default)]
    exec: Option<RawExec>,
    #[serde(default)]
    check: Option<String>,
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    capture: BTreeMap<String, String>,
    #[serde(default)]
    optional: bool,
    #[serde(default)]
    read_only: bool,
}

impl TryFrom<StepKeys> for RawStep {
    type Error = String;

    fn try_from(keys: StepKeys) -> Result<Self, String> {
        let StepKeys {
            name,
            http,
            exec,
            check,
            message,
            capture,
            optional,
            read_only,
        } = keys;
        let at = |m: &str| format!("step `{name}`: {m}");
        let mut actions = ActionKeys { http, exec }.into_actions();
        let kind = match (actions.pop(), actions.is_empty(), check, message) {
            (Some(action), true, None, None) => RawStepKind::Run(action),
            (Some(_), true, None, Some(_)) => {
                return Err(at("only a check step takes a `message`"));
            }
            (None, _, Some(check), Some(message)) => RawStepKind::Check { check, message },
            (None, _, Some(_), None) => return Err(at("a check needs a `message`")),
            _ => {
                let keys: Vec<&str> = ActionKeys::KINDS.into_iter().chain(["check"]).collect();
                return Err(at(&format!("a step has exactly one of {}", one_of(&keys))));
            }
        };
        Ok(RawStep {
            name,
            kind,
            capture,
            optional,
            read_only,
        })
    }
}

/// What a write shows its approver before anyone says yes: read-only steps and their shaping,
/// or, written `preview: {none: <reason>}`, the pack's word on why there is nothing to show.
/// Serde reads it from [`PreviewKeys`] and refuses a preview with both or neither.
#[derive(Debug, Deserialize)]
#[serde(try_from = "PreviewKeys")]
pub(super) enum RawPreview {
    Steps {
        steps: Vec<RawStep>,
        /// Shapes the preview for the approver (the input is the preview's context).
        output: Option<String>,
    },
    /// Why this write has nothing to show; the portal shows it where a preview would be.
    None(String),
}

/// How a preview is written: `{steps: […], output: …}` or `{none: <reason>}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PreviewKeys {
    #[serde(default)]
    steps: Option<Vec<RawStep>>,
    #[serde(default)]
    output: Option<String>,
    #[serde(default)]
    none: Option<String>,
}

impl TryFrom<PreviewKeys> for RawPreview {
    type Error = String;

    fn try_from(keys: PreviewKeys) -> Result<Self, String> {
        match keys {
            PreviewKeys {
                steps: Some(steps),
                output,
                none: None,
            } => Ok(RawPreview::Steps { steps, output }),
            PreviewKeys {
                steps: None,
                output: None,
                none: Some(reason),
            } => Ok(RawPreview::None(reason)),
            _ => Err(
                "`preview` has either `steps` (and an optional `output`) or `none: <reason>`"
                    .into(),
            ),
        }
    }
}

/// A write's health gate: read-only steps and how long they may take to pass, or the pack's
/// word on why there is nothing to check. Serde reads it from [`VerifyKeys`].
#[derive(Debug, Deserialize)]
#[serde(try_from = "VerifyKeys")]
pub(super) enum RawVerify {
    Steps {
        steps: Vec<RawStep>,
        /// Seconds the steps may take to pass on a runner after its write (default 60).
        within_s: Option<u64>,
    },
    None(String),
}

/// How a verify is written: `{steps: […], within_s: N}` or `{none: <reason>}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct VerifyKeys {
    #[serde(default)]
    steps: Option<Vec<RawStep>>,
    #[serde(default)]
    within_s: Option<u64>,
    #[serde(default)]
    none: Option<String>,
}

impl TryFrom<VerifyKeys> for RawVerify {
    type Error = String;

    fn try_from(keys: VerifyKeys) -> Result<Self, String> {
        match keys {
            VerifyKeys {
                steps: Some(steps),
                within_s,
                none: None,
            } => Ok(RawVerify::Steps { steps, within_s }),
            VerifyKeys {
                steps: None,
                within_s: None,
                none: Some(reason),
            } => Ok(RawVerify::None(reason)),
            _ => Err(
                "`verify` has either `steps` (and an optional `within_s`) or `none: <reason>`"
                    .into(),
            ),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHttp {
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
pub(super) struct RawExec {
    /// Each element is one argv element; `{param}` placeholders fill within it.
    pub argv: Vec<String>,
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Exit codes that count as success. Default: `[0]`.
    #[serde(default)]
    pub ok_exit_codes: Option<Vec<i32>>,
}
