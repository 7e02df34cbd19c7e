//! The questions a compiled policy answers, by matching tool names against its patterns (the
//! most specific one wins): [`decide`] for one call, and who may approve or use a tool, the
//! runners an agent is held to, a tool's effective risk.

use super::{AgentRule, Decision, Pattern, Policy, Request, Rollout, key, rank};
use crate::pack::{Risk, Tool, allowlist_admits, shown_value};
use crate::selector::Selector;
use crate::server::principal::{Principal, Role};

impl Pattern {
    pub(super) fn matches(&self, tool: &str) -> bool {
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

/// The rule of the most specific pattern matching `tool`.
pub(super) fn most_specific<'a, T>(rules: &'a [(Pattern, T)], tool: &str) -> Option<&'a T> {
    most_specific_line(rules, tool).map(|(_, rule)| rule)
}

/// The most specific line (pattern and rule) matching `tool`, for a message that names it.
fn most_specific_line<'a, T>(rules: &'a [(Pattern, T)], tool: &str) -> Option<&'a (Pattern, T)> {
    rules
        .iter()
        .filter(|(p, _)| p.matches(tool))
        .max_by_key(|(p, _)| p.specificity())
}

fn list(patterns: &[Pattern]) -> String {
    let names: Vec<String> = patterns.iter().map(Pattern::to_string).collect();
    if names.is_empty() {
        "no tools".into()
    } else {
        names.join(", ")
    }
}

impl Policy {
    /// SHA-256 (hex) of the canonical JSON of the source document, for the audit log. Comments,
    /// layout and the choice of TOML or YAML do not change it; any change of content does.
    pub fn digest(&self) -> String {
        self.digest.clone()
    }

    /// May a human with `role` approve calls of `tool`? Agents and auditors never may.
    pub(crate) fn may_approve(&self, role: Role, tool: &str) -> bool {
        let may = match role {
            Role::Approver => &self.approver_may,
            Role::Admin => &self.admin_may,
            Role::Agent | Role::Auditor | Role::None => return false,
        };
        may.iter().any(|p| p.matches(tool))
    }

    /// May `caller` use `tool` at all (whatever the runners and arguments)? For `tools/list`.
    pub(crate) fn may_use_tool(&self, caller: &Principal, tool: &str) -> bool {
        match self.access(&caller.name) {
            Access::Everything => true,
            Access::Unlisted => false,
            Access::Entry(_, rule) => rule.tools.iter().any(|p| p.matches(tool)),
        }
    }

    /// The runner selector the policy limits `caller` to, if any (for the runner names a
    /// tool's schema lists).
    pub(crate) fn runner_selector(&self, caller: &Principal) -> Option<&Selector> {
        self.runner_rule(caller).map(|(_, selector)| selector)
    }

    /// The policy line that limits `caller`'s runners, if any: its path
    /// (`agents.NAME.runners`, or `agents."*".runners`) and its selector. For the audit log,
    /// which tells the operator which line kept a runner out of reach.
    pub(crate) fn runner_rule(&self, caller: &Principal) -> Option<(String, &Selector)> {
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
    pub(crate) fn risk(&self, tool: &Tool) -> Risk {
        self.risk_rule(tool).0
    }

    /// The effective risk, and whether a low write runs without approval. A line that lowers
    /// without `lower: true` does not apply (so an unchecked policy cannot lower by mistake),
    /// `auto_approve` never applies to a tool its pack calls high, and no line makes a tool
    /// whose preview captures values run without a request (its execution needs them).
    fn risk_rule(&self, tool: &Tool) -> (Risk, bool) {
        match most_specific(&self.risk, &tool.name) {
            Some(rule) if rule.lower || rank(rule.risk) >= rank(tool.risk) => {
                let auto = rule.auto_approve && rule.risk == Risk::Low && tool.risk != Risk::High;
                let runs_freely = rule.risk == Risk::Read || auto;
                if runs_freely && tool.needs_preview_values() {
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

    /// How a write of `tool` rolls out, and the policy line that says so.
    pub fn rollout_for(&self, tool: &str) -> (Rollout, String) {
        match most_specific_line(&self.rollout, tool) {
            Some((pattern, r)) => (*r, format!("rollout.{}", key(&pattern.to_string()))),
            None => (self.rollout_default, "rollout.default".into()),
        }
    }

    /// The most runners one write of `tool` may name, and the policy line that says so.
    fn max_targets_for(&self, tool: &str) -> (u32, String) {
        match most_specific_line(&self.max_targets, tool) {
            Some((pattern, n)) => (*n, format!("max_targets.{}", key(&pattern.to_string()))),
            None => (self.max_targets_default, "max_targets.default".into()),
        }
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
        // Every (param, list) pair to check: the runner's lists, which the policy may repeat
        // per runner, and the lists only the policy holds (`policy_allowlist` in the pack).
        let checks: Vec<(&crate::pack::Param, &str)> = tool
            .params
            .iter()
            .flat_map(|p| p.policy_lists().map(move |l| (p, l)))
            .collect();
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

/// The decision, in order: the agent's tools, the agent's runners, the runners' allowlists,
/// how many runners a write may name, then the effective risk (read runs; low needs approval
/// unless `auto_approve`; high needs approval).
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
    let risk = policy.risk_rule(req.tool);
    if risk.0 != Risk::Read {
        let (max, line) = policy.max_targets_for(tool);
        let named = req.runners.len();
        if named > max as usize {
            return Decision::Deny(format!(
                "`{tool}` may change at most {max} runners in one request (`{line}` in the policy); this one names {named}: ask for fewer runners at a time"
            ));
        }
    }
    match risk {
        (Risk::Read, _) | (Risk::Low, true) => Decision::Allow,
        (Risk::Low | Risk::High, _) => Decision::NeedsApproval {
            approvers: policy.approvers_for(tool),
        },
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::{Value, json};

    use super::super::testing::{packs, tool};
    use super::super::{Format, Policy};
    use super::*;

    #[test]
    fn a_rollout_is_a_canary_then_waves_in_the_order_the_call_named() {
        let runners: Vec<String> = ["e5", "e1", "e4", "e2", "e3"].map(String::from).into();
        let plan = Rollout::DEFAULT.plan(&runners);
        // 25 % of 5, rounded up: 2 a wave after the canary; each wave's names sorted.
        assert_eq!(
            plan.waves,
            vec![vec!["e5"], vec!["e1", "e4"], vec!["e2", "e3"]]
        );
        let by_two = Rollout {
            canary: 2,
            wave: super::super::WaveSize::Runners(1),
            pause_secs: 30,
        };
        let plan = by_two.plan(&runners);
        assert_eq!(plan.waves.len(), 4);
        assert_eq!(plan.waves[0], vec!["e1", "e5"]);
        assert_eq!(plan.pause_secs, 30);
        // One runner: one wave, whatever the canary.
        let one = by_two.plan(&runners[..1]);
        assert_eq!(one.waves, vec![vec!["e5"]]);
        // The most specific line wins, and names itself.
        let policy = Policy::parse(
            "rollout:\n  default: {canary: 1, wave: 1}\n  \"linux.*\": {canary: 1, wave_percent: 50, pause_s: 5}\n",
            Format::Yaml,
        )
        .unwrap();
        let (r, line) = policy.rollout_for("linux.systemctl_restart");
        assert_eq!((r.pause_secs, line.as_str()), (5, "rollout.\"linux.*\""));
        let (r, line) = policy.rollout_for("consul.node_maintenance");
        assert_eq!(
            (r.wave, line.as_str()),
            (super::super::WaveSize::Runners(1), "rollout.default")
        );
        assert_eq!(Policy::builtin().rollout_for("x.y").0, Rollout::DEFAULT);
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

    const ELEVEN: &[(&str, &str)] = &[
        ("r1", ""),
        ("r2", ""),
        ("r3", ""),
        ("r4", ""),
        ("r5", ""),
        ("r6", ""),
        ("r7", ""),
        ("r8", ""),
        ("r9", ""),
        ("r10", ""),
        ("r11", ""),
    ];

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
                name: "policy_allowlist: any pack's list the policy alone holds admits a listed value",
                format: Yaml,
                policy: "runners: {hvn05: {zones: [eu]}}",
                tool: "t.zone_write",
                agent: "a",
                runners: &[("hvn05", "")],
                args: json!({"zone": "eu"}),
                want: Approval(1),
            },
            Case {
                name: "policy_allowlist: and refuses another",
                format: Yaml,
                policy: "runners: {hvn05: {zones: [eu]}}",
                tool: "t.zone_write",
                agent: "a",
                runners: &[("hvn05", "")],
                args: json!({"zone": "us"}),
                want: Deny(
                    "runner `hvn05` does not accept `zone` = `us`: the policy's allowlist `runners.hvn05.zones` has only [eu]",
                ),
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
                policy: "risk: {t.high_write: {risk: read, lower: true}}",
                tool: "t.high_write",
                agent: "a",
                runners: &[("r1", "")],
                args: json!({}),
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
            Case {
                name: "max_targets: by default a write names at most 10 runners",
                format: Yaml,
                policy: "",
                tool: "linux.systemctl_restart",
                agent: "a",
                runners: ELEVEN,
                args: restart("consul"),
                want: Deny(
                    "`linux.systemctl_restart` may change at most 10 runners in one request (`max_targets.default` in the policy); this one names 11",
                ),
            },
            Case {
                name: "max_targets: ten is within the default",
                format: Yaml,
                policy: "",
                tool: "linux.systemctl_restart",
                agent: "a",
                runners: &ELEVEN[..10],
                args: restart("consul"),
                want: Approval(1),
            },
            Case {
                name: "max_targets: a read is not held to it",
                format: Yaml,
                policy: "max_targets: {default: 1}",
                tool: "consul.members",
                agent: "a",
                runners: ELEVEN,
                args: json!({}),
                want: Allow,
            },
            Case {
                name: "max_targets: the most specific line wins",
                format: Toml,
                policy: "[max_targets]\ndefault = 1\n\"linux.*\" = 3\n",
                tool: "linux.systemctl_restart",
                agent: "a",
                runners: &ELEVEN[..3],
                args: restart("consul"),
                want: Approval(1),
            },
            Case {
                name: "max_targets: over the pack's line, the line is named",
                format: Yaml,
                policy: "max_targets: {default: 20, \"linux.*\": 3}",
                tool: "linux.systemctl_restart",
                agent: "a",
                runners: &ELEVEN[..4],
                args: restart("consul"),
                want: Deny(
                    "at most 3 runners in one request (`max_targets.\"linux.*\"` in the policy); this one names 4",
                ),
            },
            Case {
                name: "max_targets: a low write that runs without approval is held to it too",
                format: Yaml,
                policy: "max_targets: {default: 2}\nrisk: {t.low_write: {risk: low, auto_approve: true}}",
                tool: "t.low_write",
                agent: "a",
                runners: &ELEVEN[..3],
                args: json!({}),
                want: Deny("at most 2 runners"),
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
}
