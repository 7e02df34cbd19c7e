//! The policy file compiled into a [`Policy`]: patterns parsed, approver counts in range,
//! roles and names checked, every problem listed with its field path (what needs no packs);
//! then [`Policy::check`] holds the names and risk lines against the loaded packs.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde_json::Value;

use super::format::{
    Format, RawAgent, RawLevel, RawPolicy, RawRisk, RawRole, RawRollout, to_raw, to_value,
};
use super::{
    AgentRule, Pattern, Policy, PolicyError, RiskRule, Rollout, WaveSize, invalid, key, rank,
};
use crate::digest::{canonical_json, sha256_hex};
use crate::pack::{PackSet, Risk, Tool};
use crate::selector::Selector;
use crate::util::input::is_identifier;

use super::decide::most_specific;

/// `runners` of the file: per runner name, allowlist name → its values.
type RunnerLists = BTreeMap<String, BTreeMap<String, Vec<String>>>;

/// The most approvers a write may require (more would make a tool effectively unusable).
const MAX_APPROVERS: u32 = 5;

/// How many runners one write request may name when the policy does not say: enough for a
/// small fleet's change at once, few enough that one wrong yes cannot reach a large fleet.
pub(super) const DEFAULT_MAX_TARGETS: u32 = 10;

/// The most a `max_targets` line may allow: the largest fleet emisar is measured with.
const MAX_MAX_TARGETS: u32 = 1000;

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

/// The longest pause a rollout line may ask for between waves.
const MAX_PAUSE_S: u32 = 600;

/// One `rollout` line compiled, or its problems added (each naming `path` and the field).
fn rollout_line(path: &str, line: &RawRollout, problems: &mut Vec<String>) -> Option<Rollout> {
    let before = problems.len();
    let mut in_range = |field: &str, v: Option<u32>, max: u32, min: u32| {
        if let Some(v) = v
            && !(min..=max).contains(&v)
        {
            problems.push(format!(
                "`{path}.{field}`: {v} is out of range: it must be {min} to {max}"
            ));
        }
    };
    in_range("canary", line.canary, MAX_MAX_TARGETS, 1);
    in_range("wave", line.wave, MAX_MAX_TARGETS, 1);
    in_range("wave_percent", line.wave_percent, 100, 1);
    in_range("pause_s", line.pause_s, MAX_PAUSE_S, 0);
    let wave = match (line.wave, line.wave_percent) {
        (Some(_), Some(_)) => {
            problems.push(format!(
                "`{path}`: give `wave` (runners) or `wave_percent`, not both"
            ));
            return None;
        }
        (Some(n), None) => WaveSize::Runners(n),
        (None, Some(p)) => WaveSize::Percent(p),
        (None, None) => Rollout::DEFAULT.wave,
    };
    (problems.len() == before).then_some(Rollout {
        canary: line.canary.unwrap_or(Rollout::DEFAULT.canary),
        wave,
        pause_secs: line.pause_s.unwrap_or(Rollout::DEFAULT.pause_secs),
    })
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
    pub(crate) fn builtin() -> Policy {
        Policy::resolve(RawPolicy::default(), &Value::Object(Default::default()))
            .expect("the empty policy is valid")
    }

    /// Parses and checks everything that needs no packs. Errors name the field path and the
    /// rule broken, and list every problem found.
    pub(crate) fn parse(text: &str, format: Format) -> Result<Policy, PolicyError> {
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

    /// The raw file as a policy: every line compiled, every problem found at once.
    fn resolve(raw: RawPolicy, source: &Value) -> Result<Policy, Vec<String>> {
        let mut problems = Vec::new();
        let agents = raw
            .agents
            .map(|agents| resolve_agents(agents, &mut problems));
        let risk = resolve_risk(raw.risk, &mut problems);
        let (approvers_default, approvers) = per_tool(
            "approvers",
            raw.approvers,
            1,
            &mut problems,
            |path, n, problems| {
                approvers_in_range(path, n, problems);
                Some(n)
            },
        );
        let (max_targets_default, max_targets) = per_tool(
            "max_targets",
            raw.max_targets,
            DEFAULT_MAX_TARGETS,
            &mut problems,
            |path, n, problems| {
                if !(1..=MAX_MAX_TARGETS).contains(&n) {
                    problems.push(format!(
                        "`{path}`: {n} runners is out of range: it must be 1 to {MAX_MAX_TARGETS}"
                    ));
                }
                Some(n)
            },
        );
        let (rollout_default, rollout) = per_tool(
            "rollout",
            raw.rollout,
            Rollout::DEFAULT,
            &mut problems,
            |path, line, problems| rollout_line(path, &line, problems),
        );
        let (approver_may, admin_may) = resolve_roles(raw.roles, &mut problems);
        check_runner_names(&raw.runners, &mut problems);
        if !problems.is_empty() {
            return Err(problems);
        }
        Ok(Policy {
            agents,
            risk,
            approvers_default,
            approvers,
            max_targets_default,
            max_targets,
            rollout_default,
            rollout,
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
    pub(crate) fn check(&self, packs: &PackSet) -> Result<(), PolicyError> {
        let tools: Vec<&Tool> = packs.tools().map(|t| &**t).collect();
        let mut problems = Vec::new();
        let unknown = |named: Vec<(String, &Pattern)>| -> Vec<String> {
            named
                .into_iter()
                .filter_map(|(path, pattern)| unknown(&tools, &path, pattern))
                .collect()
        };
        problems.extend(unknown(self.agent_patterns()));
        for (pattern, rule) in &self.risk {
            let path = format!("risk.{}", key(&pattern.to_string()));
            problems.extend(unknown(vec![(path, pattern)]));
            self.check_risk_line(&tools, pattern, rule, &mut problems);
        }
        problems.extend(unknown(self.table_patterns()));
        check_runner_lists(&tools, &self.runners, &mut problems);
        if problems.is_empty() {
            Ok(())
        } else {
            Err(invalid(problems))
        }
    }

    /// The tool patterns of `agents`, each with its path in the file.
    fn agent_patterns(&self) -> Vec<(String, &Pattern)> {
        let mut named = Vec::new();
        for (name, rule) in self.agents.iter().flatten() {
            for (i, p) in rule.tools.iter().enumerate() {
                named.push((format!("agents.{}.tools[{i}]", key(name)), p));
            }
        }
        named
    }

    /// The tool patterns of `approvers`, `max_targets`, `rollout` and `roles`, each with its
    /// path in the file.
    fn table_patterns(&self) -> Vec<(String, &Pattern)> {
        let keyed = |table: &str, p: &Pattern| format!("{table}.{}", key(&p.to_string()));
        let mut named = Vec::new();
        named.extend(
            self.approvers
                .iter()
                .map(|(p, _)| (keyed("approvers", p), p)),
        );
        named.extend(
            self.max_targets
                .iter()
                .map(|(p, _)| (keyed("max_targets", p), p)),
        );
        named.extend(self.rollout.iter().map(|(p, _)| (keyed("rollout", p), p)));
        for (role, may) in [("approver", &self.approver_may), ("admin", &self.admin_may)] {
            for (i, p) in may.iter().enumerate() {
                named.push((format!("roles.{role}.approve[{i}]"), p));
            }
        }
        named
    }

    /// One `risk` line against the tools it matches: a lowering needs `lower: true`, a tool
    /// whose preview captures values cannot run without a request, and `auto_approve` never
    /// reaches a risk:high tool.
    fn check_risk_line(
        &self,
        tools: &[&Tool],
        pattern: &Pattern,
        rule: &RiskRule,
        problems: &mut Vec<String>,
    ) {
        let path = format!("risk.{}", key(&pattern.to_string()));
        let matched = || tools.iter().filter(|t| pattern.matches(&t.name));
        // A pattern's problem lists the tools it found; an exact name is its tool already.
        let names = |ts: Vec<&&Tool>| match pattern {
            Pattern::Exact(_) => String::new(),
            Pattern::Prefix(_) => {
                let names: Vec<&str> = ts.iter().map(|t| t.name.as_str()).collect();
                format!(" ({})", names.join(", "))
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
        // A tool whose preview captures values executes only with the values captured when
        // the request was made: a line that lets it run without a request can never work.
        let without_request: Vec<_> = matched()
            .filter(|t| {
                t.needs_preview_values()
                    && most_specific(&self.risk, &t.name).is_some_and(|r| std::ptr::eq(r, rule))
                    && (rule.risk == Risk::Read || (rule.risk == Risk::Low && rule.auto_approve))
            })
            .collect();
        if !without_request.is_empty() {
            problems.push(format!(
                "`{path}`: a tool with a preview cannot run without an approval request (its execution needs the values its preview captures when the request is made){}",
                names(without_request)
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
}

/// `agents`: each name a token's agent name or `*`, its tool patterns and runner selector
/// compiled.
fn resolve_agents(
    agents: BTreeMap<String, RawAgent>,
    problems: &mut Vec<String>,
) -> BTreeMap<String, AgentRule> {
    agents
        .into_iter()
        .map(|(name, rule)| {
            let path = format!("agents.{}", key(&name));
            if name != "*" && !is_identifier(&name) {
                problems.push(format!(
                    "`{path}`: an agent name must be a token's agent name (letters, digits, `_ . @ -`) or `*`"
                ));
            }
            let tools = patterns(&format!("{path}.tools"), &rule.tools, problems);
            let runners = rule.runners.and_then(|text| {
                Selector::parse(&text)
                    .map_err(|e| problems.push(format!("`{path}.runners`: `{text}`: {e}")))
                    .ok()
            });
            (name, AgentRule { tools, runners })
        })
        .collect()
}

/// `risk`: each line's pattern compiled, and `auto_approve` only on risk: low.
fn resolve_risk(
    raw: BTreeMap<String, RawRisk>,
    problems: &mut Vec<String>,
) -> Vec<(Pattern, RiskRule)> {
    let mut risk = Vec::new();
    for (name, line) in raw {
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
        let rule = RiskRule {
            risk: line.risk.into(),
            lower: line.lower,
            auto_approve: line.auto_approve,
        };
        risk.push((pattern, rule));
    }
    risk
}

/// A table of lines by tool, `pack.*` or `default` (`approvers`, `max_targets`, `rollout`):
/// each value compiled by `compile` (which says its own problems, and drops a line it
/// cannot use), the `default` line apart from the patterns.
fn per_tool<R, T>(
    table: &str,
    raw: BTreeMap<String, R>,
    mut default: T,
    problems: &mut Vec<String>,
    compile: impl Fn(&str, R, &mut Vec<String>) -> Option<T>,
) -> (T, Vec<(Pattern, T)>) {
    let mut lines = Vec::new();
    for (name, value) in raw {
        let path = format!("{table}.{}", key(&name));
        let Some(compiled) = compile(&path, value, problems) else {
            continue;
        };
        if name == "default" {
            default = compiled;
            continue;
        }
        match Pattern::parse(&name) {
            Ok(p) => lines.push((p, compiled)),
            Err(e) => problems.push(format!("`{path}`: {e} (or `default`)")),
        }
    }
    (default, lines)
}

/// `roles`: which tools an `approver` and an `admin` may approve (every tool when not
/// listed); no other role approves anything.
fn resolve_roles(
    roles: BTreeMap<String, RawRole>,
    problems: &mut Vec<String>,
) -> (Vec<Pattern>, Vec<Pattern>) {
    let everything = || vec![Pattern::Prefix(String::new())];
    let (mut approver_may, mut admin_may) = (everything(), everything());
    for (role, rule) in roles {
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
        *slot = patterns(&format!("{path}.approve"), &rule.approve, problems);
    }
    (approver_may, admin_may)
}

/// `runners`: each runner name and each allowlist name an identifier.
fn check_runner_names(runners: &RunnerLists, problems: &mut Vec<String>) {
    for (runner, lists) in runners {
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
}

/// Why `pattern` at `path` names no loaded tool, if it does not: an exact name must exist,
/// a pattern must match at least one.
fn unknown(tools: &[&Tool], path: &str, pattern: &Pattern) -> Option<String> {
    if tools.iter().any(|t| pattern.matches(&t.name)) {
        return None;
    }
    Some(match pattern {
        Pattern::Exact(name) => format!("`{path}`: no loaded pack has a tool `{name}`"),
        Pattern::Prefix(_) => format!("`{path}`: `{pattern}` matches no loaded tool"),
    })
}

/// `runners.*.LIST`: every list a loaded tool's param names (`allowlist:` or
/// `policy_allowlist:`); a list nothing reads is a mistake, said with the known ones.
fn check_runner_lists(tools: &[&Tool], runners: &RunnerLists, problems: &mut Vec<String>) {
    let lists: BTreeSet<&str> = tools
        .iter()
        .flat_map(|t| t.params.iter().flat_map(|p| p.policy_lists()))
        .collect();
    for (runner, named) in runners {
        for name in named.keys().filter(|n| !lists.contains(n.as_str())) {
            problems.push(format!(
                "`runners.{}.{}`: no loaded tool has a param with `allowlist: {name}` (known lists: {})",
                key(runner),
                key(name),
                lists.iter().copied().collect::<Vec<_>>().join(", ")
            ));
        }
    }
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

#[cfg(test)]
mod tests {
    use super::super::testing::packs;
    use super::*;

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
                "rollout with both wave sizes",
                Yaml,
                "rollout: {default: {wave: 2, wave_percent: 10}}",
                "`rollout.default`: give `wave` (runners) or `wave_percent`, not both",
            ),
            (
                "rollout out of range",
                Toml,
                "[rollout.\"linux.*\"]\ncanary = 0\npause_s = 601\n",
                "`rollout.\"linux.*\".canary`: 0 is out of range: it must be 1 to 1000; `rollout.\"linux.*\".pause_s`: 601 is out of range: it must be 0 to 600",
            ),
            (
                "rollout with an unknown field",
                Yaml,
                "rollout: {default: {waves: 2}}",
                "`rollout.default.waves`: unknown field `waves`",
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
                "max_targets below range",
                Yaml,
                "max_targets: {default: 0}",
                "`max_targets.default`: 0 runners is out of range: it must be 1 to 1000",
            ),
            (
                "max_targets above range",
                Toml,
                "[max_targets]\n\"linux.*\" = 1001\n",
                "`max_targets.\"linux.*\"`: 1001 runners is out of range: it must be 1 to 1000",
            ),
            (
                "max_targets with a bad pattern",
                Yaml,
                "max_targets: {\"li*ux\": 2}",
                "`max_targets.\"li*ux\"`: `li*ux`: `*` may only end a pattern, as in `nomad.*` or `*` (or `default`)",
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
                "max_targets names an unknown tool",
                "max_targets: {nomad.job_scal: 2, \"nope.*\": 3}",
                &[
                    "`max_targets.\"nomad.job_scal\"`: no loaded pack has a tool `nomad.job_scal`",
                    "`max_targets.\"nope.*\"`: `nope.*` matches no loaded tool",
                ],
            ),
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
                    "`risk.\"frr.*\"`: a tool with a preview cannot run without an approval request (its execution needs the values its preview captures when the request is made) (frr.bgp_neighbor_enable, frr.bgp_neighbor_shutdown)",
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
                    "`risk.\"nomad.*\"`: a tool with a preview cannot run without an approval request (its execution needs the values its preview captures when the request is made) (nomad.alloc_restart, nomad.job_scale, nomad.node_drain, nomad.node_eligibility, nomad.task_resources_set)",
                ],
            ),
            (
                "lowering low to read without the flag",
                "risk: {t.low_write: read}",
                &["`risk.\"t.low_write\"`: lowering a risk:low tool needs `lower: true`"],
            ),
            (
                "auto_approve on a high tool",
                "risk: {t.high_write: {risk: low, lower: true, auto_approve: true}}",
                &["`risk.\"t.high_write\"`: `auto_approve` is not allowed on a risk:high tool"],
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
                    "`runners.hvn05.systemd_unit`: no loaded tool has a param with `allowlist: systemd_unit` (known lists: debian_packages, nomad_jobs, ports, systemd_units, zones)",
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
        // Closer lines keep the tools with a preview under approval: the glob is fine.
        let closer = "risk: {\"nomad.*\": {risk: read, lower: true}, nomad.task_resources_set: high, \
            nomad.job_scale: high, nomad.alloc_restart: high, nomad.node_drain: high, nomad.node_eligibility: high}";
        Policy::parse(closer, Format::Yaml)
            .unwrap()
            .check(packs())
            .unwrap();
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

    /// A per-tool table keeps its `default` apart, names a line whose pattern does not parse
    /// with its path, and drops a line its `compile` refuses (which says why itself).
    #[test]
    fn a_per_tool_table_keeps_its_default_apart_and_names_its_bad_lines() {
        let raw: BTreeMap<String, u32> = [("default", 3), ("consul.*", 2), ("a b", 1), ("x", 0)]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
        let mut problems = Vec::new();
        let (default, lines) = per_tool("approvers", raw, 1, &mut problems, |path, n, p| {
            if n == 0 {
                p.push(format!("`{path}`: zero"));
                return None;
            }
            Some(n)
        });
        assert_eq!(default, 3);
        assert_eq!(lines, [(Pattern::parse("consul.*").unwrap(), 2)]);
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(
            problems[0].starts_with("`approvers.\"a b\"`: "),
            "{problems:?}"
        );
        assert!(problems[0].ends_with("(or `default`)"), "{problems:?}");
        assert_eq!(problems[1], "`approvers.x`: zero");
    }
}
