//! Policy: may this caller run this tool on these runners with these arguments, and if so, now
//! or after how many approvals? Pure and synchronous.
//!
//! The policy file (TOML or YAML, one shape) says which tools and runners each agent may use,
//! overrides tool risks, sets how many approvers a write needs and which human roles may
//! approve it, and restricts argument values per runner. Without a file, [`Policy::builtin`]
//! applies: reads run, every write needs one approval, everyone may use everything.
//!
//! Invariant: no IO except [`Policy::load`] reading the file; no clock, no randomness; the same
//! inputs always give the same decision. [`decide`] does not rely on [`Policy::check`] having
//! run: a risk override that lowers a tool without `lower: true` is ignored, not obeyed.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;

use serde::Deserialize;
use serde::de::{self, Deserializer, IntoDeserializer, MapAccess, Visitor};
use serde_json::Value;

use crate::digest::{canonical_json, sha256_hex};
use crate::pack::{PackSet, Risk, Tool, allowlist_admits, is_identifier, shown_value};
use crate::selector::Selector;
use crate::server::principal::{Principal, Role};

/// A list only the policy holds, checked against the `job` param of the nomad pack's writes.
/// No pack param declares it, on purpose: `allowlist: NAME` in a pack makes every runner
/// without `[allowlists] NAME` refuse every value, and a Nomad write is cluster-scoped (the
/// server picks any runner serving the pack), so the jobs it may touch are one decision for
/// the whole cluster, made here, not a list to repeat in every runner.toml before the tool
/// works at all. It is the one list keyed on a pack by name; a second such list should
/// become a pack field (a param's policy-only list) instead of another special case.
const NOMAD_JOBS: &str = "nomad_jobs";

/// The most approvers a write may require (more would make a tool effectively unusable).
const MAX_APPROVERS: u32 = 5;

#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("failed to read policy file {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("policy file {path}: unknown format: the name must end in .toml, .yaml or .yml")]
    UnknownFormat { path: String },
    /// Every problem found, each naming the field path and the rule it broke.
    #[error("{}", invalid_message(.file.as_deref(), .problems))]
    Invalid {
        file: Option<String>,
        problems: Vec<String>,
    },
}

fn invalid_message(file: Option<&str>, problems: &[String]) -> String {
    match file {
        Some(file) => format!("policy file {file}: {}", problems.join("; ")),
        None => format!("invalid policy: {}", problems.join("; ")),
    }
}

fn invalid(problems: Vec<String>) -> PolicyError {
    PolicyError::Invalid {
        file: None,
        problems,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Toml,
    Yaml,
}

impl Format {
    /// The format a file name's extension says: `.toml`, `.yaml` or `.yml`.
    pub fn from_path(path: &Path) -> Option<Format> {
        match path.extension()?.to_str()? {
            "toml" => Some(Format::Toml),
            "yaml" | "yml" => Some(Format::Yaml),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    Allow,
    /// Runs once this many distinct humans have approved it.
    NeedsApproval {
        approvers: u32,
    },
    Deny(String),
}

/// One tool call as the policy sees it.
pub struct Request<'a> {
    pub tool: &'a Tool,
    pub caller: &'a Principal,
    /// The runners the call targets, with their labels.
    pub runners: &'a [(&'a str, &'a BTreeMap<String, String>)],
    /// The pack params (no reason/runners/selector/raw).
    pub args: &'a serde_json::Map<String, Value>,
}

/// A parsed and self-consistent policy. Whether its names exist in the loaded packs is
/// [`Policy::check`]'s business.
#[derive(Debug, Clone)]
pub struct Policy {
    /// Per agent name, plus `*` for agents not listed. `None` when the file has no `agents`
    /// section: then every agent may use every tool and runner.
    agents: Option<BTreeMap<String, AgentRule>>,
    /// Risk overrides; the most specific matching pattern applies.
    risk: Vec<(Pattern, RiskRule)>,
    /// Approvers a write needs when no pattern in `approvers` matches it.
    approvers_default: u32,
    approvers: Vec<(Pattern, u32)>,
    /// The tools each approving role may approve.
    approver_may: Vec<Pattern>,
    admin_may: Vec<Pattern>,
    /// Runner name → allowlist name → accepted values.
    runners: BTreeMap<String, BTreeMap<String, Vec<String>>>,
    /// SHA-256 of the canonical JSON of the source document (see [`Policy::digest`]).
    digest: String,
}

#[derive(Debug, Clone)]
struct AgentRule {
    tools: Vec<Pattern>,
    /// Calls targeting runners outside this selector are denied.
    runners: Option<Selector>,
}

#[derive(Debug, Clone, Copy)]
struct RiskRule {
    risk: Risk,
    /// The line may lower the tool's own risk.
    lower: bool,
    /// A risk:low write on this line runs without approval.
    auto_approve: bool,
}

/// A tool name, or a prefix followed by `*` (`nomad.*`, or `*` alone for every tool).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Pattern {
    Exact(String),
    Prefix(String),
}

impl Pattern {
    fn parse(text: &str) -> Result<Pattern, String> {
        let name_char = |c: char| c.is_ascii_alphanumeric() || "_.@-".contains(c);
        let (body, glob) = match text.strip_suffix('*') {
            Some(prefix) => (prefix, true),
            None => (text, false),
        };
        if body.contains('*') {
            return Err(format!(
                "`{text}`: `*` may only end a pattern, as in `nomad.*` or `*`"
            ));
        }
        if glob && body.chars().all(name_char) {
            Ok(Pattern::Prefix(body.into()))
        } else if !glob && is_identifier(body) {
            Ok(Pattern::Exact(body.into()))
        } else {
            Err(format!(
                "`{text}` must be a tool name such as `nomad.job_status` or a pattern such as `nomad.*`"
            ))
        }
    }

    fn matches(&self, tool: &str) -> bool {
        match self {
            Pattern::Exact(name) => name == tool,
            Pattern::Prefix(prefix) => tool.starts_with(prefix.as_str()),
        }
    }

    /// Exact names beat patterns; among patterns the longer prefix wins.
    fn specificity(&self) -> (bool, usize) {
        match self {
            Pattern::Exact(name) => (true, name.len()),
            Pattern::Prefix(prefix) => (false, prefix.len()),
        }
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Pattern::Exact(name) => f.write_str(name),
            Pattern::Prefix(prefix) => write!(f, "{prefix}*"),
        }
    }
}

/// The rule of the most specific pattern matching `tool`.
fn most_specific<'a, T>(rules: &'a [(Pattern, T)], tool: &str) -> Option<&'a T> {
    rules
        .iter()
        .filter(|(p, _)| p.matches(tool))
        .max_by_key(|(p, _)| p.specificity())
        .map(|(_, rule)| rule)
}

fn list(patterns: &[Pattern]) -> String {
    let names: Vec<String> = patterns.iter().map(Pattern::to_string).collect();
    if names.is_empty() {
        "no tools".into()
    } else {
        names.join(", ")
    }
}

/// A key as it appears in a field path: quoted when it holds anything but letters, digits, `_`
/// and `-` (so `risk."frr.bgp_neighbor_shutdown"` is one key, not two).
fn key(k: &str) -> String {
    if !k.is_empty()
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-".contains(c))
    {
        k.to_owned()
    } else {
        format!("\"{}\"", k.replace('\\', "\\\\").replace('"', "\\\""))
    }
}

fn rank(risk: Risk) -> u8 {
    match risk {
        Risk::Read => 0,
        Risk::Low => 1,
        Risk::High => 2,
    }
}

// ---- The file's serde shape ----

#[derive(schemars::JsonSchema, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    /// Agents by the name their token was issued to; an agent not listed gets the `"*"` entry,
    /// and with no `"*"` entry no tools at all. Without the section every agent may use every
    /// tool and runner.
    agents: Option<BTreeMap<String, RawAgent>>,
    /// Risk overrides by tool name or `pack.*`, the most specific pattern winning: `high`, or
    /// `{ risk = "low", lower = true, auto_approve = true }`. Lowering needs `lower = true`.
    #[serde(default)]
    risk: BTreeMap<String, RawRisk>,
    /// How many different people must approve a write (1 to 5), by tool, `pack.*` or
    /// `default`. The requester never counts. Default: 1.
    #[serde(default)]
    approvers: BTreeMap<String, u32>,
    /// Which tools each human role (`approver`, `admin`) may approve. Default: every tool.
    #[serde(default)]
    roles: BTreeMap<String, RawRole>,
    /// Per runner name, allowlist name → the values a param with `allowlist: NAME` may take,
    /// on top of the runner's own `[allowlists]` (both must accept). One list is the policy's
    /// alone: `nomad_jobs` limits the jobs the nomad pack's writes may touch (no runner list
    /// applies to them, since the server may send a cluster-scoped write to any runner).
    #[serde(default)]
    runners: BTreeMap<String, BTreeMap<String, Vec<String>>>,
}

#[derive(schemars::JsonSchema, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAgent {
    /// Tool names, or prefixes ending in `*`, the agent may use; others are not listed to it.
    tools: Vec<String>,
    /// A label selector (`role=edge,dc=dc1`): only runners it matches. Default: every runner.
    runners: Option<String>,
}

#[derive(schemars::JsonSchema, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRole {
    /// Tool names, or prefixes ending in `*`, this role may approve.
    approve: Vec<String>,
}

#[derive(schemars::JsonSchema, Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum RawLevel {
    Read,
    Low,
    High,
}

impl From<RawLevel> for Risk {
    fn from(level: RawLevel) -> Risk {
        match level {
            RawLevel::Read => Risk::Read,
            RawLevel::Low => Risk::Low,
            RawLevel::High => Risk::High,
        }
    }
}

/// A risk line: `high` (short form) or `{ risk: low, lower: true, auto_approve: true }`.
#[derive(Debug)]
struct RawRisk {
    risk: RawLevel,
    lower: bool,
    auto_approve: bool,
}

/// Written by hand to match the hand-written deserializer: both forms of a risk line.
impl schemars::JsonSchema for RawRisk {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "RiskLine".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "A risk level, or the long form with the flags.",
            "anyOf": [
                {"type": "string", "enum": ["read", "low", "high"]},
                {"type": "object", "properties": {
                    "risk": {"type": "string", "enum": ["read", "low", "high"]},
                    "lower": {"type": "boolean", "default": false},
                    "auto_approve": {"type": "boolean", "default": false}
                }}
            ]
        })
    }
}

impl<'de> Deserialize<'de> for RawRisk {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        risk_line(d)
    }
}

/// Accepts both forms. Written by hand because an untagged enum would hide the long form's
/// real error (an unknown field, say) behind "did not match any variant".
fn risk_line<'de, D: Deserializer<'de>>(d: D) -> Result<RawRisk, D::Error> {
    struct Line;
    impl<'de> Visitor<'de> for Line {
        type Value = RawRisk;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("read, low, high or { risk, lower, auto_approve }")
        }
        fn visit_str<E: de::Error>(self, s: &str) -> Result<RawRisk, E> {
            Ok(RawRisk {
                risk: RawLevel::deserialize(s.into_deserializer())?,
                lower: false,
                auto_approve: false,
            })
        }
        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RawRisk, A::Error> {
            #[derive(Deserialize)]
            #[serde(deny_unknown_fields)]
            struct Long {
                risk: RawLevel,
                #[serde(default)]
                lower: bool,
                #[serde(default)]
                auto_approve: bool,
            }
            let long = Long::deserialize(de::value::MapAccessDeserializer::new(map))?;
            Ok(RawRisk {
                risk: long.risk,
                lower: long.lower,
                auto_approve: long.auto_approve,
            })
        }
    }
    d.deserialize_any(Line)
}

/// The JSON Schema of the policy file, for the configuration reference.
pub fn file_schema() -> schemars::Schema {
    schemars::schema_for!(RawPolicy)
}

// ---- Parsing and the checks that need no packs ----

/// A JSON value in which a map that has a key twice is an error. YAML parsers keep the last
/// one silently, which in a policy would let a later line quietly undo an earlier one.
struct Strict(Value);

impl<'de> Deserialize<'de> for Strict {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(StrictVisitor)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Strict;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a value")
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Strict, E> {
        Ok(Strict(Value::Bool(v)))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Strict, E> {
        Ok(Strict(v.into()))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Strict, E> {
        Ok(Strict(v.into()))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Strict, E> {
        serde_json::Number::from_f64(v)
            .map(|n| Strict(Value::Number(n)))
            .ok_or_else(|| E::custom(format!("{v} is not a number")))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Strict, E> {
        Ok(Strict(Value::String(v.to_owned())))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Strict, E> {
        Ok(Strict(Value::Null))
    }
    fn visit_none<E: de::Error>(self) -> Result<Strict, E> {
        Ok(Strict(Value::Null))
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Strict, D::Error> {
        Strict::deserialize(d)
    }
    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Strict, A::Error> {
        let mut items = Vec::new();
        while let Some(Strict(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(Strict(Value::Array(items)))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Strict, A::Error> {
        let mut out = serde_json::Map::new();
        while let Some(k) = map.next_key::<String>()? {
            let Strict(v) = map.next_value()?;
            if out.contains_key(&k) {
                return Err(de::Error::custom(format!("key `{k}` is given twice")));
            }
            out.insert(k, v);
        }
        Ok(Strict(Value::Object(out)))
    }
}

/// The file's shape, read through JSON so both formats give one canonical text to hash.
fn to_value(text: &str, format: Format) -> Result<Value, String> {
    let Strict(value) = match format {
        Format::Toml => toml::from_str::<Strict>(text).map_err(|e| {
            let at = e
                .span()
                .map(|s| format!(" at line {}", text[..s.start].matches('\n').count() + 1))
                .unwrap_or_default();
            format!("invalid TOML{at}: {}", e.message().trim())
        })?,
        Format::Yaml => {
            yaml_serde::from_str::<Strict>(text).map_err(|e| format!("invalid YAML: {e}"))?
        }
    };
    // An empty YAML document is null; like an empty TOML file it means "all defaults".
    Ok(match value {
        Value::Null => Value::Object(Default::default()),
        v => v,
    })
}

/// The serde shape, with type errors and unknown fields named by their field path.
fn to_raw(value: Value, format: Format) -> Result<RawPolicy, String> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let mut path = String::new();
        let mut keys = Vec::new();
        for segment in e.path().iter() {
            match segment {
                serde_path_to_error::Segment::Seq { index } => path.push_str(&format!("[{index}]")),
                serde_path_to_error::Segment::Map { key: k } => {
                    if !path.is_empty() {
                        path.push('.');
                    }
                    path.push_str(&key(k));
                    keys.push(k.as_str());
                }
                serde_path_to_error::Segment::Enum { variant } => {
                    path.push_str(&format!("::{variant}"))
                }
                serde_path_to_error::Segment::Unknown => path.push_str(".?"),
            }
        }
        // In TOML, `[risk]` then `consul.members = "high"` makes a table `consul`, not a key:
        // a key without a dot under `risk` or `approvers` is a tool name split in two.
        let split_name = format == Format::Toml
            && matches!(keys.as_slice(), ["risk" | "approvers", k, ..]
                if !k.contains('.') && !k.ends_with('*') && *k != "default");
        let mut message = e.into_inner().to_string();
        if split_name {
            message.push_str(
                " (in TOML a dotted key makes nested tables: quote tool names, as in \"nomad.job_status\" = ...)",
            );
        }
        if path.is_empty() {
            message
        } else {
            format!("`{path}`: {message}")
        }
    })
}

fn patterns(path: &str, texts: &[String], problems: &mut Vec<String>) -> Vec<Pattern> {
    texts
        .iter()
        .enumerate()
        .filter_map(|(i, text)| {
            Pattern::parse(text)
                .map_err(|e| problems.push(format!("`{path}[{i}]`: {e}")))
                .ok()
        })
        .collect()
}

fn approvers_in_range(path: &str, n: u32, problems: &mut Vec<String>) {
    if !(1..=MAX_APPROVERS).contains(&n) {
        problems.push(format!(
            "`{path}`: {n} approvers is out of range: it must be 1 to {MAX_APPROVERS}"
        ));
    }
}

impl Policy {
    /// The policy when no file is configured: reads run; low and high writes need 1 approval;
    /// every agent may use every tool and runner; approver and admin may approve every tool.
    pub fn builtin() -> Policy {
        Policy::resolve(RawPolicy::default(), &Value::Object(Default::default()))
            .expect("the empty policy is valid")
    }

    /// Parses and checks everything that needs no packs. Errors name the field path and the
    /// rule broken, and list every problem found.
    pub fn parse(text: &str, format: Format) -> Result<Policy, PolicyError> {
        let value = to_value(text, format).map_err(|e| invalid(vec![e]))?;
        let raw = to_raw(value.clone(), format).map_err(|e| invalid(vec![e]))?;
        Policy::resolve(raw, &value).map_err(invalid)
    }

    /// Reads and parses a policy file; `.toml`, `.yaml` or `.yml` says the format.
    pub fn load(path: &Path) -> Result<Policy, PolicyError> {
        let shown = path.display().to_string();
        let format = Format::from_path(path).ok_or_else(|| PolicyError::UnknownFormat {
            path: shown.clone(),
        })?;
        let text = std::fs::read_to_string(path).map_err(|source| PolicyError::Io {
            path: shown.clone(),
            source,
        })?;
        Policy::parse(&text, format).map_err(|e| match e {
            PolicyError::Invalid { problems, .. } => PolicyError::Invalid {
                file: Some(shown),
                problems,
            },
            other => other,
        })
    }

    fn resolve(raw: RawPolicy, source: &Value) -> Result<Policy, Vec<String>> {
        let mut problems = Vec::new();

        let agents = raw.agents.map(|agents| {
            agents
                .into_iter()
                .map(|(name, rule)| {
                    let path = format!("agents.{}", key(&name));
                    if name != "*" && !is_identifier(&name) {
                        problems.push(format!(
                            "`{path}`: an agent name must be a token's agent name (letters, digits, `_ . @ -`) or `*`"
                        ));
                    }
                    let tools = patterns(&format!("{path}.tools"), &rule.tools, &mut problems);
                    let runners = rule.runners.and_then(|text| {
                        Selector::parse(&text)
                            .map_err(|e| problems.push(format!("`{path}.runners`: `{text}`: {e}")))
                            .ok()
                    });
                    (name, AgentRule { tools, runners })
                })
                .collect()
        });

        let mut risk = Vec::new();
        for (name, line) in raw.risk {
            let path = format!("risk.{}", key(&name));
            let pattern = match Pattern::parse(&name) {
                Ok(p) => p,
                Err(e) => {
                    problems.push(format!("`{path}`: {e}"));
                    continue;
                }
            };
            if line.auto_approve && line.risk != RawLevel::Low {
                problems.push(format!(
                    "`{path}`: `auto_approve: true` is only for risk: low (a high write always needs approval, a read needs none)"
                ));
            }
            risk.push((
                pattern,
                RiskRule {
                    risk: line.risk.into(),
                    lower: line.lower,
                    auto_approve: line.auto_approve,
                },
            ));
        }

        let mut approvers_default = 1;
        let mut approvers = Vec::new();
        for (name, n) in raw.approvers {
            let path = format!("approvers.{}", key(&name));
            approvers_in_range(&path, n, &mut problems);
            if name == "default" {
                approvers_default = n;
                continue;
            }
            match Pattern::parse(&name) {
                Ok(p) => approvers.push((p, n)),
                Err(e) => problems.push(format!("`{path}`: {e} (or `default`)")),
            }
        }

        let everything = || vec![Pattern::Prefix(String::new())];
        let (mut approver_may, mut admin_may) = (everything(), everything());
        for (role, rule) in raw.roles {
            let path = format!("roles.{}", key(&role));
            let slot = match role.as_str() {
                "approver" => &mut approver_may,
                "admin" => &mut admin_may,
                "auditor" | "agent" => {
                    problems.push(format!(
                        "`{path}`: an {role} never approves; only `approver` and `admin` may be listed"
                    ));
                    continue;
                }
                _ => {
                    problems.push(format!(
                        "`{path}`: unknown role; only `approver` and `admin` may be listed"
                    ));
                    continue;
                }
            };
            *slot = patterns(&format!("{path}.approve"), &rule.approve, &mut problems);
        }

        for (runner, lists) in &raw.runners {
            if !is_identifier(runner) {
                problems.push(format!(
                    "`runners.{}`: a runner name must be an identifier (letters, digits, `_ . @ -`)",
                    key(runner)
                ));
            }
            for name in lists.keys().filter(|n| !is_identifier(n)) {
                problems.push(format!(
                    "`runners.{}.{}`: an allowlist name must be an identifier",
                    key(runner),
                    key(name)
                ));
            }
        }

        if !problems.is_empty() {
            return Err(problems);
        }
        Ok(Policy {
            agents,
            risk,
            approvers_default,
            approvers,
            approver_may,
            admin_may,
            runners: raw.runners,
            digest: sha256_hex(canonical_json(source).as_bytes()),
        })
    }

    /// Checks names against the loaded packs: unknown tools in `agents`, `risk`, `approvers`
    /// and `roles` (an exact name must exist, a pattern must match at least one tool), a risk
    /// lowered without `lower: true`, `auto_approve` on a risk:high tool, and allowlist names
    /// no loaded param declares. Returns every problem at once.
    pub fn check(&self, packs: &PackSet) -> Result<(), PolicyError> {
        let tools: Vec<&Tool> = packs.tools().map(|t| &**t).collect();
        let mut problems = Vec::new();
        let known = |path: String, pattern: &Pattern, problems: &mut Vec<String>| {
            if !tools.iter().any(|t| pattern.matches(&t.name)) {
                problems.push(match pattern {
                    Pattern::Exact(name) => format!("`{path}`: no loaded pack has a tool `{name}`"),
                    Pattern::Prefix(_) => format!("`{path}`: `{pattern}` matches no loaded tool"),
                });
            }
        };

        for (name, rule) in self.agents.iter().flatten() {
            for (i, p) in rule.tools.iter().enumerate() {
                known(format!("agents.{}.tools[{i}]", key(name)), p, &mut problems);
            }
        }
        for (pattern, rule) in &self.risk {
            let path = format!("risk.{}", key(&pattern.to_string()));
            known(path.clone(), pattern, &mut problems);
            let matched = || tools.iter().filter(|t| pattern.matches(&t.name));
            let names = |ts: Vec<&&Tool>| {
                let names: Vec<&str> = ts.iter().map(|t| t.name.as_str()).collect();
                match pattern {
                    Pattern::Exact(_) => String::new(),
                    Pattern::Prefix(_) => format!(" ({})", names.join(", ")),
                }
            };
            if !rule.lower {
                for own in [Risk::High, Risk::Low] {
                    let lowered: Vec<_> = matched()
                        .filter(|t| t.risk == own && rank(rule.risk) < rank(own))
                        .collect();
                    if !lowered.is_empty() {
                        problems.push(format!(
                            "`{path}`: lowering a risk:{} tool needs `lower: true`{}",
                            own.as_str(),
                            names(lowered)
                        ));
                    }
                }
            }
            // A tool with a preview executes only with the values its preview captured when
            // the request was made: a line that lets it run without a request can never work.
            let without_request: Vec<_> = matched()
                .filter(|t| {
                    t.preview.is_some()
                        && most_specific(&self.risk, &t.name).is_some_and(|r| std::ptr::eq(r, rule))
                        && (rule.risk == Risk::Read
                            || (rule.risk == Risk::Low && rule.auto_approve))
                })
                .collect();
            if !without_request.is_empty() {
                problems.push(format!(
                    "`{path}`: a tool with a preview cannot run without an approval request (its execution needs the values its preview captures when the request is made){}",
                    match pattern {
                        Pattern::Exact(_) => String::new(),
                        Pattern::Prefix(_) => format!(
                            " ({})",
                            without_request
                                .iter()
                                .map(|t| t.name.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    }
                ));
            }
            if rule.auto_approve {
                let high: Vec<_> = matched().filter(|t| t.risk == Risk::High).collect();
                if !high.is_empty() {
                    problems.push(format!(
                        "`{path}`: `auto_approve` is not allowed on a risk:high tool{}",
                        names(high)
                    ));
                }
            }
        }
        for (pattern, _) in &self.approvers {
            known(
                format!("approvers.{}", key(&pattern.to_string())),
                pattern,
                &mut problems,
            );
        }
        for (role, may) in [("approver", &self.approver_may), ("admin", &self.admin_may)] {
            for (i, p) in may.iter().enumerate() {
                known(format!("roles.{role}.approve[{i}]"), p, &mut problems);
            }
        }

        let lists: BTreeSet<&str> = tools
            .iter()
            .flat_map(|t| t.params.iter().filter_map(|p| p.allowlist.as_deref()))
            .chain([NOMAD_JOBS])
            .collect();
        for (runner, named) in &self.runners {
            for name in named.keys().filter(|n| !lists.contains(n.as_str())) {
                problems.push(format!(
                    "`runners.{}.{}`: no loaded tool has a param with `allowlist: {name}` (known lists: {})",
                    key(runner),
                    key(name),
                    lists.iter().copied().collect::<Vec<_>>().join(", ")
                ));
            }
        }

        if problems.is_empty() {
            Ok(())
        } else {
            Err(invalid(problems))
        }
    }

    /// SHA-256 (hex) of the canonical JSON of the source document, for the audit log. Comments,
    /// layout and the choice of TOML or YAML do not change it; any change of content does.
    pub fn digest(&self) -> String {
        self.digest.clone()
    }

    /// May a human with `role` approve calls of `tool`? Agents and auditors never may.
    pub fn may_approve(&self, role: Role, tool: &str) -> bool {
        let may = match role {
            Role::Approver => &self.approver_may,
            Role::Admin => &self.admin_may,
            Role::Agent | Role::Auditor | Role::None => return false,
        };
        may.iter().any(|p| p.matches(tool))
    }

    /// May `caller` use `tool` at all (whatever the runners and arguments)? For `tools/list`.
    pub fn may_use_tool(&self, caller: &Principal, tool: &str) -> bool {
        match self.access(&caller.name) {
            Access::Everything => true,
            Access::Unlisted => false,
            Access::Entry(_, rule) => rule.tools.iter().any(|p| p.matches(tool)),
        }
    }

    /// The runner selector the policy limits `caller` to, if any (for the runner names a
    /// tool's schema lists).
    pub fn runner_selector(&self, caller: &Principal) -> Option<&Selector> {
        self.runner_rule(caller).map(|(_, selector)| selector)
    }

    /// The policy line that limits `caller`'s runners, if any: its path
    /// (`agents.NAME.runners`, or `agents."*".runners`) and its selector. For the audit log,
    /// which tells the operator which line kept a runner out of reach.
    pub fn runner_rule(&self, caller: &Principal) -> Option<(String, &Selector)> {
        match self.access(&caller.name) {
            Access::Entry(entry, rule) => rule
                .runners
                .as_ref()
                .map(|s| (format!("agents.{}.runners", key(entry)), s)),
            _ => None,
        }
    }

    /// The risk a tool runs at under this policy: its override when the line applies, else
    /// its own.
    pub fn risk(&self, tool: &Tool) -> Risk {
        self.risk_rule(tool).0
    }

    /// The effective risk, and whether a low write runs without approval. A line that lowers
    /// without `lower: true` does not apply (so an unchecked policy cannot lower by mistake),
    /// `auto_approve` never applies to a tool its pack calls high, and no line makes a tool
    /// with a preview run without a request (its execution needs the preview's values).
    fn risk_rule(&self, tool: &Tool) -> (Risk, bool) {
        match most_specific(&self.risk, &tool.name) {
            Some(rule) if rule.lower || rank(rule.risk) >= rank(tool.risk) => {
                let auto = rule.auto_approve && rule.risk == Risk::Low && tool.risk != Risk::High;
                let runs_freely = rule.risk == Risk::Read || auto;
                if runs_freely && tool.preview.is_some() {
                    (tool.risk, false)
                } else {
                    (rule.risk, auto)
                }
            }
            _ => (tool.risk, false),
        }
    }

    fn approvers_for(&self, tool: &str) -> u32 {
        most_specific(&self.approvers, tool)
            .copied()
            .unwrap_or(self.approvers_default)
    }

    fn access(&self, agent: &str) -> Access<'_> {
        let Some(agents) = &self.agents else {
            return Access::Everything;
        };
        agents
            .get_key_value(agent)
            .or_else(|| agents.get_key_value("*"))
            .map_or(Access::Unlisted, |(k, rule)| Access::Entry(k, rule))
    }

    /// Why a runner's policy allowlist refuses the call, if it does.
    fn allowlist_violation(&self, req: &Request) -> Option<String> {
        let tool = req.tool;
        // Every (param, list) pair to check: params that declare a list, plus the nomad pack's
        // `job` on writes against the policy-only `nomad_jobs` (see [`NOMAD_JOBS`]).
        let mut checks: Vec<(&crate::pack::Param, &str)> = tool
            .params
            .iter()
            .filter_map(|p| p.allowlist.as_deref().map(|l| (p, l)))
            .collect();
        if tool.pack == "nomad" && tool.risk != Risk::Read {
            checks.extend(
                tool.params
                    .iter()
                    .filter(|p| p.name == "job")
                    .map(|p| (p, NOMAD_JOBS)),
            );
        }
        for (runner, _) in req.runners {
            let Some(lists) = self.runners.get(*runner) else {
                continue;
            };
            for (param, list_name) in &checks {
                let (Some(list), Some(value)) = (lists.get(*list_name), req.args.get(&param.name))
                else {
                    continue;
                };
                if !allowlist_admits(&param.kind, value, list) {
                    let shown = shown_value(param, value);
                    return Some(format!(
                        "runner `{runner}` does not accept `{}` = {shown}: the policy's allowlist `runners.{}.{}` has only [{}]",
                        param.name,
                        key(runner),
                        key(list_name),
                        list.join(", ")
                    ));
                }
            }
        }
        None
    }
}

enum Access<'a> {
    /// No `agents` section.
    Everything,
    /// The agent's own entry, or `*`.
    Entry(&'a str, &'a AgentRule),
    /// Not listed, and no `*` entry.
    Unlisted,
}

/// Reads and checks a policy file against the loaded packs (`emisar policy check FILE`).
pub fn check_file(path: &Path, packs: &PackSet) -> Result<Policy, PolicyError> {
    let policy = Policy::load(path)?;
    policy.check(packs).map_err(|e| match e {
        PolicyError::Invalid { problems, .. } => PolicyError::Invalid {
            file: Some(path.display().to_string()),
            problems,
        },
        other => other,
    })?;
    Ok(policy)
}

/// The decision, in order: the agent's tools, the agent's runners, the runners' allowlists,
/// then the effective risk (read runs; low needs approval unless `auto_approve`; high needs
/// approval).
pub fn decide(policy: &Policy, req: &Request) -> Decision {
    let tool = &req.tool.name;
    let agent = &req.caller.name;
    match policy.access(agent) {
        Access::Everything => {}
        Access::Unlisted => {
            return Decision::Deny(format!(
                "agent `{agent}` may not use `{tool}`: the policy allows it no tools (it is not under `agents`, and there is no `\"*\"` entry)"
            ));
        }
        Access::Entry(entry, rule) => {
            if !rule.tools.iter().any(|p| p.matches(tool)) {
                return Decision::Deny(format!(
                    "agent `{agent}` may not use `{tool}`: the policy allows it only {} (`agents.{}.tools`)",
                    list(&rule.tools),
                    key(entry)
                ));
            }
            if let Some(selector) = &rule.runners
                && let Some((runner, _)) = req.runners.iter().find(|(_, l)| !selector.matches(l))
            {
                return Decision::Deny(format!(
                    "agent `{agent}` may not target runner `{runner}`: the policy allows it only runners matching `{selector}` (`agents.{}.runners`)",
                    key(entry)
                ));
            }
        }
    }
    if let Some(why) = policy.allowlist_violation(req) {
        return Decision::Deny(why);
    }
    match policy.risk_rule(req.tool) {
        (Risk::Read, _) | (Risk::Low, true) => Decision::Allow,
        (Risk::Low | Risk::High, _) => Decision::NeedsApproval {
            approvers: policy.approvers_for(tool),
        },
    }
}

#[cfg(test)]
mod tests {
    use std::sync::OnceLock;

    use serde_json::json;

    use super::*;

    /// The stock packs, plus a pack with a risk:low write (no stock tool is low).
    fn packs() -> &'static PackSet {
        static PACKS: OnceLock<PackSet> = OnceLock::new();
        PACKS.get_or_init(|| {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(
                dir.path().join("t.yaml"),
                "pack: t\ndescription: d\ntools:\n  low_write:\n    description: d\n    risk: low\n    scope: node\n    action: {exec: {argv: [\"true\"]}}\n  port:\n    description: d\n    risk: read\n    scope: node\n    params: {port: {type: integer, allowlist: ports}}\n    action: {exec: {argv: [echo, \"{port}\"]}}\n",
            )
            .unwrap();
            PackSet::load(Some(dir.path())).unwrap()
        })
    }

    fn tool(name: &str) -> &'static Tool {
        packs()
            .tool(name)
            .unwrap_or_else(|| panic!("no tool {name}"))
    }

    fn principal(agent: &str, role: Role) -> Principal {
        Principal::new(agent.into(), "t".into(), role, None)
    }

    fn labels(text: &str) -> BTreeMap<String, String> {
        text.split(',')
            .filter(|p| !p.is_empty())
            .map(|p| {
                let (k, v) = p.split_once('=').unwrap();
                (k.to_owned(), v.to_owned())
            })
            .collect()
    }

    #[derive(Debug)]
    enum Want {
        Allow,
        Approval(u32),
        /// The deny message contains this.
        Deny(&'static str),
    }

    struct Case {
        name: &'static str,
        format: Format,
        /// Empty: the built-in policy.
        policy: &'static str,
        tool: &'static str,
        agent: &'static str,
        /// Runner name and its labels (`k=v,k=v`).
        runners: &'static [(&'static str, &'static str)],
        args: Value,
        want: Want,
    }

    const AGENTS: &str = r#"
agents:
  deploy-bot:
    tools: ["nomad.*", "consul.*", "linux.systemctl_restart"]
    runners: "role=edge"
  "*":
    tools: ["consul.*"]
"#;

    const ALLOWLISTS: &str = r#"
approvers:
  nomad.task_resources_set: 2
runners:
  hvn05:
    systemd_units: [consul, nomad.service]
    nomad_jobs: [traefik]
"#;

    #[test]
    fn decisions() {
        use Format::{Toml, Yaml};
        use Want::*;
        let restart = |unit: &str| json!({"unit": unit});
        let resources = |job: &str| json!({"job": job, "group": "g", "task": "t", "cpu": 100});
        let cases = [
            Case {
                name: "builtin: a read runs",
                format: Yaml,
                policy: "",
                tool: "consul.members",
                agent: "anyone",
                runners: &[("hvn05", "")],
                args: json!({}),
                want: Allow,
            },
            Case {
                name: "builtin: a high write needs one approval",
                format: Yaml,
                policy: "",
                tool: "linux.systemctl_restart",
                agent: "anyone",
                runners: &[("hvn05", "")],
                args: restart("vault"),
                want: Approval(1),
            },
            Case {
                name: "builtin: a low write needs one approval",
                format: Yaml,
                policy: "",
                tool: "t.low_write",
                agent: "anyone",
                runners: &[("hvn05", "")],
                args: json!({}),
                want: Approval(1),
            },
            Case {
                name: "no agents section: everyone may use everything",
                format: Yaml,
                policy: "approvers: {default: 1}",
                tool: "frr.bgp_summary",
                agent: "anyone",
                runners: &[("r1", "role=core")],
                args: json!({}),
                want: Allow,
            },
            Case {
                name: "agent: a tool matched by its glob",
                format: Yaml,
                policy: AGENTS,
                tool: "nomad.job_status",
                agent: "deploy-bot",
                runners: &[("hvn05", "role=edge")],
                args: json!({"job": "x"}),
                want: Allow,
            },
            Case {
                name: "agent: a tool matched by its exact name",
                format: Yaml,
                policy: AGENTS,
                tool: "linux.systemctl_restart",
                agent: "deploy-bot",
                runners: &[("hvn05", "role=edge")],
                args: restart("consul"),
                want: Approval(1),
            },
            Case {
                name: "agent: a tool outside its list",
                format: Yaml,
                policy: AGENTS,
                tool: "frr.bgp_summary",
                agent: "deploy-bot",
                runners: &[("hvn05", "role=edge")],
                args: json!({}),
                want: Deny(
                    "agent `deploy-bot` may not use `frr.bgp_summary`: the policy allows it only nomad.*, consul.*, linux.systemctl_restart (`agents.deploy-bot.tools`)",
                ),
            },
            Case {
                name: "agent: an unlisted agent falls to `*`",
                format: Yaml,
                policy: AGENTS,
                tool: "consul.members",
                agent: "other",
                runners: &[("anything", "role=core")],
                args: json!({}),
                want: Allow,
            },
            Case {
                name: "agent: `*` limits an unlisted agent",
                format: Yaml,
                policy: AGENTS,
                tool: "nomad.job_status",
                agent: "other",
                runners: &[("hvn05", "")],
                args: json!({"job": "x"}),
                want: Deny(
                    "agent `other` may not use `nomad.job_status`: the policy allows it only consul.* (`agents.\"*\".tools`)",
                ),
            },
            Case {
                name: "agent: unlisted with no `*` entry may use nothing",
                format: Yaml,
                policy: "agents: {deploy-bot: {tools: [\"*\"]}}",
                tool: "consul.members",
                agent: "other",
                runners: &[("hvn05", "")],
                args: json!({}),
                want: Deny(
                    "agent `other` may not use `consul.members`: the policy allows it no tools",
                ),
            },
            Case {
                name: "agent: an empty agents section allows nobody",
                format: Toml,
                policy: "[agents]",
                tool: "consul.members",
                agent: "other",
                runners: &[("hvn05", "")],
                args: json!({}),
                want: Deny("allows it no tools"),
            },
            Case {
                name: "runners: every target inside the agent's selector",
                format: Yaml,
                policy: AGENTS,
                tool: "consul.members",
                agent: "deploy-bot",
                runners: &[("hvn05", "role=edge,dc=dc1"), ("hvn06", "role=edge")],
                args: json!({}),
                want: Allow,
            },
            Case {
                name: "runners: one target outside the agent's selector",
                format: Yaml,
                policy: AGENTS,
                tool: "consul.members",
                agent: "deploy-bot",
                runners: &[("hvn05", "role=edge"), ("hvn07", "role=core")],
                args: json!({}),
                want: Deny(
                    "agent `deploy-bot` may not target runner `hvn07`: the policy allows it only runners matching `role=edge`",
                ),
            },
            Case {
                name: "allowlist: a listed unit (the suffix-less form)",
                format: Yaml,
                policy: ALLOWLISTS,
                tool: "linux.systemctl_restart",
                agent: "a",
                runners: &[("hvn05", "")],
                args: restart("consul.service"),
                want: Approval(1),
            },
            Case {
                name: "allowlist: a listed unit (the .service form)",
                format: Yaml,
                policy: ALLOWLISTS,
                tool: "linux.systemctl_restart",
                agent: "a",
                runners: &[("hvn05", "")],
                args: restart("nomad"),
                want: Approval(1),
            },
            Case {
                name: "allowlist: an unlisted unit on a listed runner",
                format: Yaml,
                policy: ALLOWLISTS,
                tool: "linux.systemctl_restart",
                agent: "a",
                runners: &[("hvn06", ""), ("hvn05", "")],
                args: restart("vault"),
                want: Deny(
                    "runner `hvn05` does not accept `unit` = `vault`: the policy's allowlist `runners.hvn05.systemd_units` has only [consul, nomad.service]",
                ),
            },
            Case {
                name: "allowlist: a number in the list",
                format: Yaml,
                policy: "runners: {hvn05: {ports: [\"8080\"]}}",
                tool: "t.port",
                agent: "a",
                runners: &[("hvn05", "")],
                args: json!({"port": 8080}),
                want: Allow,
            },
            Case {
                name: "allowlist: a number not in the list",
                format: Yaml,
                policy: "runners: {hvn05: {ports: [\"8080\"]}}",
                tool: "t.port",
                agent: "a",
                runners: &[("hvn05", "")],
                args: json!({"port": 9090}),
                want: Deny(
                    "runner `hvn05` does not accept `port` = `9090`: the policy's allowlist `runners.hvn05.ports` has only [8080]",
                ),
            },
            Case {
                name: "allowlist: a runner not listed is unrestricted",
                format: Yaml,
                policy: ALLOWLISTS,
                tool: "linux.systemctl_restart",
                agent: "a",
                runners: &[("hvn06", "")],
                args: restart("vault"),
                want: Approval(1),
            },
            Case {
                name: "allowlist: nomad_jobs admits a listed job",
                format: Yaml,
                policy: ALLOWLISTS,
                tool: "nomad.task_resources_set",
                agent: "a",
                runners: &[("hvn05", "")],
                args: resources("traefik"),
                want: Approval(2),
            },
            Case {
                name: "allowlist: nomad_jobs refuses another job",
                format: Yaml,
                policy: ALLOWLISTS,
                tool: "nomad.task_resources_set",
                agent: "a",
                runners: &[("hvn05", "")],
                args: resources("vault"),
                want: Deny(
                    "runner `hvn05` does not accept `job` = `vault`: the policy's allowlist `runners.hvn05.nomad_jobs` has only [traefik]",
                ),
            },
            Case {
                name: "allowlist: nomad_jobs does not apply to nomad reads",
                format: Yaml,
                policy: ALLOWLISTS,
                tool: "nomad.job_status",
                agent: "a",
                runners: &[("hvn05", "")],
                args: json!({"job": "vault"}),
                want: Allow,
            },
            Case {
                name: "risk: raising a read (short form) needs approval",
                format: Yaml,
                policy: "risk: {consul.members: high}",
                tool: "consul.members",
                agent: "a",
                runners: &[("hvn05", "")],
                args: json!({}),
                want: Approval(1),
            },
            Case {
                name: "risk: raising a read to low needs approval",
                format: Toml,
                policy: "[risk]\n\"consul.members\" = \"low\"\n",
                tool: "consul.members",
                agent: "a",
                runners: &[("hvn05", "")],
                args: json!({}),
                want: Approval(1),
            },
            Case {
                name: "risk: lowering high to read with `lower: true` runs it",
                format: Yaml,
                policy: "risk: {frr.bgp_neighbor_shutdown: {risk: read, lower: true}}",
                tool: "frr.bgp_neighbor_shutdown",
                agent: "a",
                runners: &[("r1", "")],
                args: json!({"neighbor": "10.0.0.1"}),
                want: Allow,
            },
            Case {
                name: "unchecked: a tool with a preview lowered to read still needs a request",
                format: Yaml,
                policy: "risk: {nomad.task_resources_set: {risk: read, lower: true}}",
                tool: "nomad.task_resources_set",
                agent: "a",
                runners: &[("hvn05", "")],
                args: resources("traefik"),
                want: Approval(1),
            },
            Case {
                name: "unchecked: a lowering without `lower: true` is ignored",
                format: Yaml,
                policy: "risk: {frr.bgp_neighbor_shutdown: read}",
                tool: "frr.bgp_neighbor_shutdown",
                agent: "a",
                runners: &[("r1", "")],
                args: json!({"neighbor": "10.0.0.1"}),
                want: Approval(1),
            },
            Case {
                name: "risk: the exact line beats a glob",
                format: Yaml,
                policy: "risk:\n  \"consul.*\": high\n  consul.members: read\n",
                tool: "consul.members",
                agent: "a",
                runners: &[("r1", "")],
                args: json!({}),
                want: Allow,
            },
            Case {
                name: "risk: a glob raises every tool it matches",
                format: Yaml,
                policy: "risk:\n  \"consul.*\": high\n  consul.members: read\n",
                tool: "consul.catalog_services",
                agent: "a",
                runners: &[("r1", "")],
                args: json!({}),
                want: Approval(1),
            },
            Case {
                name: "risk: a low write with `auto_approve` runs",
                format: Yaml,
                policy: "risk: {t.low_write: {risk: low, auto_approve: true}}",
                tool: "t.low_write",
                agent: "a",
                runners: &[("r1", "")],
                args: json!({}),
                want: Allow,
            },
            Case {
                name: "risk: `auto_approve` in TOML",
                format: Toml,
                policy: "[risk]\n\"t.low_write\" = { risk = \"low\", auto_approve = true }\n",
                tool: "t.low_write",
                agent: "a",
                runners: &[("r1", "")],
                args: json!({}),
                want: Allow,
            },
            Case {
                name: "unchecked: `auto_approve` never applies to a tool its pack calls high",
                format: Yaml,
                policy: "risk: {frr.bgp_neighbor_shutdown: {risk: low, lower: true, auto_approve: true}}",
                tool: "frr.bgp_neighbor_shutdown",
                agent: "a",
                runners: &[("r1", "")],
                args: json!({"neighbor": "10.0.0.1"}),
                want: Approval(1),
            },
            Case {
                name: "approvers: the default",
                format: Yaml,
                policy: "approvers: {default: 3}",
                tool: "linux.systemctl_restart",
                agent: "a",
                runners: &[("r1", "")],
                args: restart("consul"),
                want: Approval(3),
            },
            Case {
                name: "approvers: the exact line beats globs and the default",
                format: Toml,
                policy: "[approvers]\ndefault = 1\n\"*\" = 4\n\"nomad.*\" = 3\n\"nomad.task_resources_set\" = 2\n",
                tool: "nomad.task_resources_set",
                agent: "a",
                runners: &[("r1", "")],
                args: resources("x"),
                want: Approval(2),
            },
            Case {
                name: "approvers: the longest glob beats `*`",
                format: Yaml,
                policy: "approvers: {default: 1, \"*\": 4, \"frr.*\": 3}",
                tool: "frr.bgp_neighbor_enable",
                agent: "a",
                runners: &[("r1", "")],
                args: json!({"neighbor": "10.0.0.1"}),
                want: Approval(3),
            },
            Case {
                name: "order: the agent's tools are checked before its runners",
                format: Yaml,
                policy: AGENTS,
                tool: "frr.bgp_summary",
                agent: "deploy-bot",
                runners: &[("hvn07", "role=core")],
                args: json!({}),
                want: Deny("may not use `frr.bgp_summary`"),
            },
        ];
        for case in cases {
            let policy = if case.policy.is_empty() {
                Policy::builtin()
            } else {
                Policy::parse(case.policy, case.format)
                    .unwrap_or_else(|e| panic!("{}: {e}", case.name))
            };
            // `decide` must not rely on `check`: the unchecked cases hold what check refuses.
            assert_eq!(
                policy.check(packs()).is_ok(),
                !case.name.starts_with("unchecked:"),
                "{}: check",
                case.name
            );
            let owned: Vec<(&str, BTreeMap<String, String>)> =
                case.runners.iter().map(|(n, l)| (*n, labels(l))).collect();
            let runners: Vec<(&str, &BTreeMap<String, String>)> =
                owned.iter().map(|(n, l)| (*n, l)).collect();
            let tool = tool(case.tool);
            let args = case.args.as_object().unwrap();
            assert!(
                tool.validate(&case.args).is_ok(),
                "{}: the case's args are invalid: {:?}",
                case.name,
                tool.validate(&case.args)
            );
            let caller = principal(case.agent, Role::Agent);
            let got = decide(
                &policy,
                &Request {
                    tool,
                    caller: &caller,
                    runners: &runners,
                    args,
                },
            );
            let ok = match (&case.want, &got) {
                (Want::Allow, Decision::Allow) => true,
                (Want::Approval(n), Decision::NeedsApproval { approvers }) => n == approvers,
                (Want::Deny(part), Decision::Deny(why)) => why.contains(part),
                _ => false,
            };
            assert!(ok, "{}: want {:?}, got {got:?}", case.name, case.want);
        }
    }

    #[test]
    fn parse_errors_name_the_field_and_the_rule() {
        use Format::{Toml, Yaml};
        let cases: &[(&str, Format, &str, &str)] = &[
            (
                "unknown top-level field",
                Yaml,
                "approver: {default: 1}",
                "unknown field `approver`",
            ),
            (
                "unknown agent field",
                Yaml,
                "agents: {bot: {tool: [\"*\"]}}",
                "`agents.bot.tool`: unknown field `tool`, expected `tools` or `runners`",
            ),
            (
                "unknown field in a long risk line",
                Yaml,
                "risk: {consul.members: {risk: high, lowr: true}}",
                "`risk.\"consul.members\".lowr`: unknown field `lowr`",
            ),
            (
                "unknown field in TOML",
                Toml,
                "[roles.approver]\napprov = [\"*\"]\n",
                "`roles.approver.approv`: unknown field `approv`",
            ),
            (
                "unknown risk",
                Yaml,
                "risk: {consul.members: medium}",
                "`risk.\"consul.members\"`: unknown variant `medium`, expected one of `read`, `low`, `high`",
            ),
            (
                "approvers below range",
                Yaml,
                "approvers: {default: 0}",
                "`approvers.default`: 0 approvers is out of range: it must be 1 to 5",
            ),
            (
                "approvers above range",
                Toml,
                "[approvers]\n\"nomad.task_resources_set\" = 6\n",
                "`approvers.\"nomad.task_resources_set\"`: 6 approvers is out of range",
            ),
            (
                "approvers negative",
                Yaml,
                "approvers: {default: -1}",
                "`approvers.default`: invalid value: integer `-1`",
            ),
            (
                "bad selector",
                Yaml,
                "agents: {bot: {tools: [\"*\"], runners: \"role\"}}",
                "`agents.bot.runners`: `role`: selector pair 1 must be key=value",
            ),
            (
                "auditor in roles",
                Yaml,
                "roles: {auditor: {approve: [\"*\"]}}",
                "`roles.auditor`: an auditor never approves; only `approver` and `admin` may be listed",
            ),
            (
                "agent in roles",
                Toml,
                "[roles.agent]\napprove = [\"*\"]\n",
                "`roles.agent`: an agent never approves",
            ),
            (
                "unknown role",
                Yaml,
                "roles: {root: {approve: [\"*\"]}}",
                "`roles.root`: unknown role",
            ),
            (
                "auto_approve on a high line",
                Yaml,
                "risk: {t.low_write: {risk: high, auto_approve: true}}",
                "`risk.\"t.low_write\"`: `auto_approve: true` is only for risk: low",
            ),
            (
                "a star inside a pattern",
                Yaml,
                "agents: {bot: {tools: [\"consul.*\", \"no*mad\"]}}",
                "`agents.bot.tools[1]`: `no*mad`: `*` may only end a pattern",
            ),
            (
                "a bad agent name",
                Yaml,
                "agents: {\"bad name\": {tools: [\"*\"]}}",
                "`agents.\"bad name\"`: an agent name must be",
            ),
            (
                "an unquoted dotted key in TOML",
                Toml,
                "[risk]\nconsul.members = \"high\"\n",
                "`risk.consul.members`: unknown field `members`, expected one of `risk`, `lower`, `auto_approve` (in TOML a dotted key makes nested tables: quote tool names",
            ),
            (
                "an unquoted dotted key in TOML approvers",
                Toml,
                "[approvers]\nnomad.task_resources_set = 2\n",
                "`approvers.nomad`: invalid type: map, expected u32 (in TOML",
            ),
            ("TOML syntax", Toml, "[risk\n", "invalid TOML at line 1"),
            (
                "a key given twice",
                Yaml,
                "risk:\n  consul.members: high\n  consul.members: read\n",
                "invalid YAML: risk: key `consul.members` is given twice",
            ),
            (
                "a section given twice",
                Yaml,
                "risk: {consul.members: high}\nrisk: {consul.members: read}\n",
                "key `risk` is given twice",
            ),
            ("YAML syntax", Yaml, "risk: [\n", "invalid YAML"),
            (
                "a list where a map belongs",
                Yaml,
                "runners: [hvn05]",
                "`runners`: invalid type: sequence, expected a map",
            ),
        ];
        for (name, format, text, want) in cases {
            let err = Policy::parse(text, *format)
                .err()
                .unwrap_or_else(|| panic!("{name}: parsed"))
                .to_string();
            assert!(err.contains(want), "{name}: want `{want}` in `{err}`");
        }
    }

    #[test]
    fn every_problem_is_listed() {
        let err = Policy::parse(
            "approvers: {default: 0}\nroles: {auditor: {approve: [\"*\"]}}\nagents: {bot: {tools: [\"*\"], runners: x}}",
            Format::Yaml,
        )
        .unwrap_err();
        let PolicyError::Invalid { problems, .. } = err else {
            panic!("{err}")
        };
        assert_eq!(problems.len(), 3, "{problems:?}");
    }

    #[test]
    fn check_names_against_the_packs() {
        let cases: &[(&str, &str, &[&str])] = &[
            (
                "lowering high without the flag",
                "risk: {frr.bgp_neighbor_shutdown: {risk: low}}",
                &[
                    "`risk.\"frr.bgp_neighbor_shutdown\"`: lowering a risk:high tool needs `lower: true`",
                ],
            ),
            (
                "lowering by glob names the tools",
                "risk: {\"frr.*\": read}",
                &[
                    "`risk.\"frr.*\"`: lowering a risk:high tool needs `lower: true` (frr.bgp_neighbor_enable, frr.bgp_neighbor_shutdown)",
                ],
            ),
            (
                "lowering a tool with a preview to read",
                "risk: {nomad.task_resources_set: {risk: read, lower: true}}",
                &[
                    "`risk.\"nomad.task_resources_set\"`: a tool with a preview cannot run without an approval request (its execution needs the values its preview captures when the request is made)",
                ],
            ),
            (
                "a glob that lowers a tool with a preview names it",
                "risk: {\"nomad.*\": {risk: read, lower: true}}",
                &[
                    "`risk.\"nomad.*\"`: a tool with a preview cannot run without an approval request (its execution needs the values its preview captures when the request is made) (nomad.task_resources_set)",
                ],
            ),
            (
                "lowering low to read without the flag",
                "risk: {t.low_write: read}",
                &["`risk.\"t.low_write\"`: lowering a risk:low tool needs `lower: true`"],
            ),
            (
                "auto_approve on a high tool",
                "risk: {linux.systemctl_restart: {risk: low, lower: true, auto_approve: true}}",
                &[
                    "`risk.\"linux.systemctl_restart\"`: `auto_approve` is not allowed on a risk:high tool",
                ],
            ),
            (
                "unknown tools everywhere",
                "agents: {bot: {tools: [nomad.nope, \"zzz.*\"]}}\nrisk: {nope.x: high}\napprovers: {\"nope.*\": 2}\nroles: {admin: {approve: [nope.y]}}",
                &[
                    "`agents.bot.tools[0]`: no loaded pack has a tool `nomad.nope`",
                    "`agents.bot.tools[1]`: `zzz.*` matches no loaded tool",
                    "`risk.\"nope.x\"`: no loaded pack has a tool `nope.x`",
                    "`approvers.\"nope.*\"`: `nope.*` matches no loaded tool",
                    "`roles.admin.approve[0]`: no loaded pack has a tool `nope.y`",
                ],
            ),
            (
                "unknown allowlist name",
                "runners: {hvn05: {systemd_unit: [consul], nomad_jobs: [x]}}",
                &[
                    "`runners.hvn05.systemd_unit`: no loaded tool has a param with `allowlist: systemd_unit` (known lists: nomad_jobs, ports, systemd_units)",
                ],
            ),
        ];
        for (name, text, wants) in cases {
            let policy =
                Policy::parse(text, Format::Yaml).unwrap_or_else(|e| panic!("{name}: {e}"));
            let err = policy.check(packs()).unwrap_err();
            let PolicyError::Invalid { problems, .. } = &err else {
                panic!("{name}: {err}")
            };
            assert_eq!(problems.len(), wants.len(), "{name}: {problems:?}");
            for want in *wants {
                assert!(
                    problems.iter().any(|p| p == want),
                    "{name}: want `{want}` in {problems:?}"
                );
            }
        }
        let fine = "risk: {frr.bgp_neighbor_shutdown: {risk: low, lower: true}, \"consul.*\": high}\nrunners: {hvn05: {systemd_units: [consul], nomad_jobs: [traefik]}}";
        Policy::parse(fine, Format::Yaml)
            .unwrap()
            .check(packs())
            .unwrap();
        Policy::builtin().check(packs()).unwrap();
        // A closer line keeps the tool with a preview under approval: the glob is fine.
        let closer =
            "risk: {\"nomad.*\": {risk: read, lower: true}, nomad.task_resources_set: high}";
        Policy::parse(closer, Format::Yaml)
            .unwrap()
            .check(packs())
            .unwrap();
    }

    #[test]
    fn who_may_approve_and_use() {
        let builtin = Policy::builtin();
        for (role, may) in [
            (Role::Approver, true),
            (Role::Admin, true),
            (Role::Agent, false),
            (Role::Auditor, false),
        ] {
            assert_eq!(builtin.may_approve(role, "nomad.task_resources_set"), may);
        }
        let p = Policy::parse("roles: {approver: {approve: [\"nomad.*\"]}}", Format::Yaml).unwrap();
        assert!(p.may_approve(Role::Approver, "nomad.task_resources_set"));
        assert!(!p.may_approve(Role::Approver, "linux.systemctl_restart"));
        assert!(
            p.may_approve(Role::Admin, "linux.systemctl_restart"),
            "admin keeps its default"
        );

        assert!(builtin.may_use_tool(&principal("x", Role::Agent), "frr.bgp_summary"));
        let p = Policy::parse(AGENTS, Format::Yaml).unwrap();
        let bot = principal("deploy-bot", Role::Agent);
        let other = principal("other", Role::Agent);
        assert!(p.may_use_tool(&bot, "nomad.job_status"));
        assert!(!p.may_use_tool(&bot, "frr.bgp_summary"));
        assert!(p.may_use_tool(&other, "consul.members"));
        assert!(!p.may_use_tool(&other, "nomad.job_status"));
    }

    #[test]
    fn toml_and_yaml_are_one_shape_with_one_digest() {
        let yaml = r#"
# a comment
agents:
  deploy-bot: {tools: ["nomad.*"], runners: "role=edge"}
risk:
  consul.members: high
  frr.bgp_neighbor_shutdown: {risk: low, lower: true}
approvers: {default: 2}
runners:
  hvn05: {systemd_units: [consul]}
"#;
        let toml = r#"
[agents.deploy-bot]
tools = ["nomad.*"]
runners = "role=edge"

[risk]
"consul.members" = "high"
"frr.bgp_neighbor_shutdown" = { risk = "low", lower = true }

[approvers]
default = 2

[runners.hvn05]
systemd_units = ["consul"]
"#;
        let a = Policy::parse(yaml, Format::Yaml).unwrap();
        let b = Policy::parse(toml, Format::Toml).unwrap();
        assert_eq!(a.digest(), b.digest());
        assert_eq!(a.digest().len(), 64);
        assert_ne!(a.digest(), Policy::builtin().digest());
        let changed =
            Policy::parse(&yaml.replace("default: 2", "default: 3"), Format::Yaml).unwrap();
        assert_ne!(a.digest(), changed.digest());
        assert_eq!(
            Policy::builtin().digest(),
            Policy::parse("", Format::Yaml).unwrap().digest(),
            "an empty file is the built-in policy"
        );
        let tool = tool("consul.members");
        assert_eq!(a.risk(tool), Risk::High);
        assert_eq!(b.risk(tool), Risk::High);
    }

    #[test]
    fn load_picks_the_format_by_extension() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path
        };
        let yaml = write("p.yml", "approvers: {default: 2}");
        let toml = write("p.toml", "[approvers]\ndefault = 2\n");
        assert_eq!(
            Policy::load(&yaml).unwrap().digest(),
            Policy::load(&toml).unwrap().digest()
        );
        let json = write("p.json", "{}");
        let err = Policy::load(&json).unwrap_err().to_string();
        assert!(
            err.contains("unknown format: the name must end in .toml, .yaml or .yml"),
            "{err}"
        );
        let bad = write("bad.yaml", "approvers: {default: 9}");
        let err = Policy::load(&bad).unwrap_err().to_string();
        assert!(
            err.contains("bad.yaml") && err.contains("`approvers.default`"),
            "{err}"
        );
        let unknown = write("unknown.yaml", "risk: {nope.x: high}");
        let err = check_file(&unknown, packs()).unwrap_err().to_string();
        assert!(
            err.contains("unknown.yaml") && err.contains("`risk.\"nope.x\"`"),
            "{err}"
        );
        assert!(check_file(&yaml, packs()).is_ok());
        let err = Policy::load(&dir.path().join("missing.yaml"))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("failed to read policy file"), "{err}");
    }
}
