//! Policy: may this caller run this tool on these runners with these arguments, and if so, now
//! or after how many approvals? Pure and synchronous.
//!
//! The policy file (TOML or YAML, one shape) says which tools and runners each agent may use,
//! overrides tool risks, sets how many approvers a write needs and which human roles may
//! approve it, and restricts argument values per runner. Without a file, [`Policy::builtin`]
//! applies: reads run, every write needs one approval, everyone may use everything.
//!
//! # Layout
//!
//! - this file: the vocabulary the rooms share: [`Policy`], [`Decision`], [`Request`],
//!   [`PolicyError`], the tool-name `Pattern`, and how a key is spelled in a field path;
//! - `format.rs`: the file's serde shape (`Raw*`), read through a JSON value that refuses a
//!   key given twice, its [`Format`], and [`file_schema`] for the configuration reference;
//! - `checks.rs`: the file's shape compiled into a [`Policy`] ([`Policy::parse`],
//!   [`Policy::load`], [`Policy::builtin`]), every rule broken listed with its field path, and
//!   the names checked against the loaded packs ([`Policy::check`], [`check_file`]);
//! - `decide.rs`: the questions a compiled policy answers: [`decide`], who may approve or use
//!   a tool, the runners an agent is held to, a tool's effective risk.
//!
//! Invariant: no IO except [`Policy::load`] reading the file; no clock, no randomness; the same
//! inputs always give the same decision. [`decide`] does not rely on [`Policy::check`] having
//! run: a risk override that lowers a tool without `lower: true` is ignored, not obeyed.

use std::collections::BTreeMap;
use std::fmt;

use serde_json::Value;

use crate::pack::{Risk, Tool};
use crate::protocol::approval::Plan;
use crate::selector::Selector;
use crate::server::principal::Principal;

mod checks;
mod decide;
mod format;
#[cfg(test)]
mod testing;

pub use checks::check_file;
pub use decide::decide;
pub use format::{Format, file_schema};

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
    /// Runners one write request may name when no pattern in `max_targets` matches it.
    max_targets_default: u32,
    max_targets: Vec<(Pattern, u32)>,
    /// How a write rolls out when no pattern in `rollout` matches it.
    rollout_default: Rollout,
    rollout: Vec<(Pattern, Rollout)>,
    /// The tools each approving role may approve.
    approver_may: Vec<Pattern>,
    admin_may: Vec<Pattern>,
    /// Runner name → allowlist name → accepted values.
    runners: BTreeMap<String, BTreeMap<String, Vec<String>>>,
    /// SHA-256 of the canonical JSON of the source document (see [`Policy::digest`]).
    digest: String,
}

/// How a write on several runners rolls out: the canary's size, the later waves' size, and
/// the pause after each wave's gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rollout {
    pub canary: u32,
    pub wave: WaveSize,
    pub pause_secs: u32,
}

/// The size of a rollout's later waves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaveSize {
    Runners(u32),
    /// A share of the request's runners, rounded up.
    Percent(u32),
}

impl Rollout {
    /// Without a `rollout` line: a canary of one runner, then a quarter of the fleet at a
    /// time, no pause.
    pub const DEFAULT: Rollout = Rollout {
        canary: 1,
        wave: WaveSize::Percent(25),
        pause_secs: 0,
    };

    /// The plan for `runners`, in the order given (the first runners are the canary): each
    /// wave's names sorted, as the statement writes them.
    pub fn plan(&self, runners: &[String]) -> Plan {
        let total = runners.len();
        let canary = (self.canary as usize).clamp(1, total.max(1));
        let later = match self.wave {
            WaveSize::Runners(n) => n as usize,
            WaveSize::Percent(p) => (total * p as usize).div_ceil(100),
        }
        .max(1);
        let (first, rest) = runners.split_at(canary.min(total));
        let waves = std::iter::once(first)
            .chain(rest.chunks(later))
            .filter(|w| !w.is_empty())
            .map(|w| {
                let mut w = w.to_vec();
                w.sort();
                w
            })
            .collect();
        Plan {
            waves,
            pause_secs: self.pause_secs,
        }
    }
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

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Pattern::Exact(name) => f.write_str(name),
            Pattern::Prefix(prefix) => write!(f, "{prefix}*"),
        }
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
