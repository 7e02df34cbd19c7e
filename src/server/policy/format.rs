//! The policy file's serde shape: what TOML and YAML both read into, with every type error and
//! unknown field named by its field path, and the JSON Schema the configuration reference
//! shows. Turning this shape into a [`Policy`](super::Policy) is `checks.rs`'s business.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use serde::Deserialize;
use serde::de::{self, Deserializer, IntoDeserializer, MapAccess, Visitor};
use serde_json::Value;

use super::key;
use crate::pack::Risk;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Toml,
    Yaml,
}

impl Format {
    /// The format a file name's extension says: `.toml`, `.yaml` or `.yml`.
    pub(crate) fn from_path(path: &Path) -> Option<Format> {
        match path.extension()?.to_str()? {
            "toml" => Some(Format::Toml),
            "yaml" | "yml" => Some(Format::Yaml),
            _ => None,
        }
    }
}

#[derive(schemars::JsonSchema, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPolicy {
    /// Agents by the name their token was issued to; an agent not listed gets the `"*"` entry,
    /// and with no `"*"` entry no tools at all. Without the section every agent may use every
    /// tool and runner.
    pub(super) agents: Option<BTreeMap<String, RawAgent>>,
    /// Risk overrides by tool name or `pack.*`, the most specific pattern winning: `high`, or
    /// `{ risk = "low", lower = true, auto_approve = true }`. Lowering needs `lower = true`.
    #[serde(default)]
    pub(super) risk: BTreeMap<String, RawRisk>,
    /// How many different people must approve a write (1 to 5), by tool, `pack.*` or
    /// `default`. The requester never counts. Default: 1.
    #[serde(default)]
    pub(super) approvers: BTreeMap<String, u32>,
    /// The most runners one write request may name (1 to 1000), by tool, `pack.*` or
    /// `default`; a request naming more is refused before anyone is asked. Reads are not
    /// held to it. Default: 10.
    #[serde(default)]
    pub(super) max_targets: BTreeMap<String, u32>,
    /// How a write on several runners rolls out, by tool, `pack.*` or `default`: a canary
    /// wave, then waves of `wave` runners or `wave_percent` % of them, each gated by the
    /// tool's `verify` and followed by `pause_s`. The plan is part of what people sign.
    /// Default: a canary of 1, then waves of 25 %, no pause.
    #[serde(default)]
    pub(super) rollout: BTreeMap<String, RawRollout>,
    /// Which tools each human role (`approver`, `admin`) may approve. Default: every tool.
    #[serde(default)]
    pub(super) roles: BTreeMap<String, RawRole>,
    /// Per runner name, allowlist name → the values a param with `allowlist: NAME` may take,
    /// on top of the runner's own `[allowlists]` (both must accept), or with
    /// `policy_allowlist: NAME`, a list the policy alone holds: the stock nomad pack's writes
    /// name `nomad_jobs`, the jobs they may touch (no runner list applies to them, since the
    /// server may send a cluster-scoped write to any runner).
    #[serde(default)]
    pub(super) runners: BTreeMap<String, BTreeMap<String, Vec<String>>>,
}

#[derive(schemars::JsonSchema, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAgent {
    /// Tool names, or prefixes ending in `*`, the agent may use; others are not listed to it.
    pub(super) tools: Vec<String>,
    /// A label selector (`role=edge,dc=dc1`): only runners it matches. Default: every runner.
    pub(super) runners: Option<String>,
}

/// One rollout line (see [`RawPolicy::rollout`]).
#[derive(schemars::JsonSchema, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRollout {
    /// Runners in the first wave, the canary (1 to 1000). Default: 1.
    pub(super) canary: Option<u32>,
    /// Runners in each later wave (1 to 1000); give this or `wave_percent`.
    pub(super) wave: Option<u32>,
    /// Each later wave as a share of the request's runners (1 to 100 %, rounded up).
    /// Default: 25.
    pub(super) wave_percent: Option<u32>,
    /// Seconds between a wave's gate passing and the next wave (0 to 600). Default: 0.
    pub(super) pause_s: Option<u32>,
}

#[derive(schemars::JsonSchema, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRole {
    /// Tool names, or prefixes ending in `*`, this role may approve.
    pub(super) approve: Vec<String>,
}

#[derive(schemars::JsonSchema, Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum RawLevel {
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
pub(super) struct RawRisk {
    pub(super) risk: RawLevel,
    pub(super) lower: bool,
    pub(super) auto_approve: bool,
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
pub(super) fn to_value(text: &str, format: Format) -> Result<Value, String> {
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
pub(super) fn to_raw(value: Value, format: Format) -> Result<RawPolicy, String> {
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

#[cfg(test)]
mod tests {
    use super::super::testing::tool;
    use super::super::{Policy, Risk};
    use super::*;

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
}
