//! A grant: people's signed, time-boxed mandate for an agent's writes, so that in an incident
//! the writes it bounds run without a new round of people each (issue 47). It is signed like an
//! approval, by the same people and keys, and checked by the runner itself.
//!
//! ```text
//! emisar-grant/v1
//! grant 0193f4d0-…
//! agent agent:deploy-bot
//! tool linux.systemctl_restart
//! tool nomad.job_*
//! runners labels role=edge
//! arg memory range 0..8192
//! arg unit in ["consul","traefik"]
//! calls 3
//! calls_per_runner 2
//! required 2
//! reason "INC-42: restart the edge's consul and traefik"
//! expires 2026-12-07T06:00:00Z
//! ```
//!
//! One line per field, in this order, each ending in a newline. `grant` is the grant's own
//! UUIDv7 (its time is when it was asked for, so its lifetime is bounded from then); `agent`
//! the audit actor it is for; `break_glass true`, only in a break-glass window's grant (see
//! below), right after `agent`; one `tool` line per tool name or glob (`*` matches any run of
//! characters, as in the approvers file), sorted; `runners` either `names a,b` (sorted) or
//! `labels k=v,…` (a selector the runner matches against its own labels); one `arg` line per
//! constrained argument, sorted by name: `in` a sorted JSON array of strings, whole numbers or
//! booleans, or `range MIN..MAX` over whole numbers, both ends included; an argument without a
//! line is not constrained. `calls` is the most calls in all (a call that runs on two runners
//! is two), `calls_per_runner` the most on one runner; `reason` a JSON string. The first line is neither a statement's nor a decision's,
//! so no signature over one is ever read as another.
//!
//! A break-glass window is a grant with the `break_glass true` line: it names its runners by
//! name (never a selector), needs two people at least, and a runner runs a call in it only
//! where its approvers file's rule for the tool says `break_glass = true` (a plain grant
//! needs `grants = true`; neither flag stands in for the other).
//!
//! *Invariant:* a runner runs a call under a grant only when the grant admits it ([`admits`]:
//! the tool, this runner, every constrained argument, the agent), it lives within the
//! runner's bound and has not expired, and distinct people of the runner's approvers file
//! signed its text, as many as the file's rule for the called tool and the grant's `required`
//! ([`check`]). Counting calls is the caller's: a runner can count only its own, so it holds
//! each grant to `calls_per_runner` (and `calls`) in its state directory; `calls` across
//! runners is the server's to hold.

use std::collections::BTreeMap;

use serde_json::Value;

use super::statement::{StatementError, parse_utc};
use super::{MAX_SIGNATURES, Signature, Signed, check_lifetime, verify_quorum};
use crate::selector::Selector;

/// The first line: the format and its version.
pub const VERSION_LINE: &str = "emisar-grant/v1";
/// The longest a grant lives by default, from its request to its expiry, in seconds (1 h).
pub const DEFAULT_MAX_LIFETIME_SECS: u64 = 3600;
/// The most calls one grant may allow.
pub const MAX_CALLS: u32 = 1000;
/// The most `tool` lines, `arg` lines and values of one `in` list.
pub const MAX_TOOLS: usize = 64;
pub const MAX_ARGS: usize = 32;
pub const MAX_VALUES: usize = 64;
/// The longest reason, in bytes of its JSON form.
pub const MAX_REASON: usize = 1024;

/// Which runners a grant covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Runners {
    /// These runners, by name, sorted, each once.
    Names(Vec<String>),
    /// The runners whose own labels have every pair.
    Labels(Selector),
}

/// What one argument of a call under the grant must be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Constraint {
    /// One of these values (strings, whole numbers or booleans), sorted by their JSON text.
    In(Vec<Value>),
    /// A whole number from `min` to `max`, both included.
    Range { min: i64, max: i64 },
}

/// A grant: every field is one line of [`Grant::text`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The grant's own id, a UUIDv7.
    pub id: String,
    /// The audit actor it is for, e.g. `agent:deploy-bot`.
    pub agent: String,
    /// A break-glass window: runners by name, two people at least, and only where the
    /// approvers file's rule says `break_glass = true`.
    pub break_glass: bool,
    /// Tool names or globs, sorted, each once.
    pub tools: Vec<String>,
    pub runners: Runners,
    /// Argument name → what it must be.
    pub args: BTreeMap<String, Constraint>,
    /// The most calls in all.
    pub max_calls: u32,
    /// The most calls on one runner.
    pub max_calls_per_runner: u32,
    /// How many people must sign it.
    pub required: u32,
    /// Why the agent asked, as people read it when they sign.
    pub reason: String,
    /// RFC 3339 UTC: no call runs under this grant after it.
    pub expires_at: String,
}

/// A grant as a call carries it to a runner: its text and people's signatures over it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrantProof {
    pub text: String,
    #[serde(default)]
    pub signatures: Vec<Signature>,
    /// The approvers file, when the server carries one signed by the organisation's root key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approvers: Option<super::SignedApprovers>,
}

fn err(msg: impl Into<String>) -> StatementError {
    StatementError(format!("grant: {}", msg.into()))
}

/// A name, a runner or an id: 1 to 128 bytes without whitespace, a control character or a
/// comma, so that it reads back from its line.
fn word(field: &str, v: &str) -> Result<(), StatementError> {
    if v.is_empty()
        || v.len() > 128
        || v.chars()
            .any(|c| c.is_whitespace() || c.is_control() || c == ',')
    {
        return Err(err(format!(
            "`{field}` must be 1 to 128 bytes without whitespace, a control character or a comma"
        )));
    }
    Ok(())
}

fn sorted_once<T: Ord>(items: &[T]) -> bool {
    items.windows(2).all(|w| w[0] < w[1])
}

impl Constraint {
    fn text(&self) -> String {
        match self {
            Constraint::In(values) => format!("in {}", Value::Array(values.clone())),
            Constraint::Range { min, max } => format!("range {min}..{max}"),
        }
    }

    fn parse(name: &str, text: &str) -> Result<Constraint, StatementError> {
        if let Some(list) = text.strip_prefix("in ") {
            let values: Vec<Value> = serde_json::from_str(list)
                .map_err(|_| err(format!("`arg {name}`: `in` takes a JSON array")))?;
            return Ok(Constraint::In(values));
        }
        if let Some(range) = text.strip_prefix("range ") {
            let (min, max) = range
                .split_once("..")
                .ok_or_else(|| err(format!("`arg {name}`: `range` is MIN..MAX")))?;
            let number = |s: &str| {
                s.parse::<i64>().map_err(|_| {
                    err(format!(
                        "`arg {name}`: a range's ends are whole numbers, not `{}`",
                        s.escape_debug()
                    ))
                })
            };
            return Ok(Constraint::Range {
                min: number(min)?,
                max: number(max)?,
            });
        }
        Err(err(format!("`arg {name}`: `in [...]` or `range MIN..MAX`")))
    }

    fn check(&self, name: &str) -> Result<(), StatementError> {
        match self {
            Constraint::In(values) => {
                if values.is_empty() || values.len() > MAX_VALUES {
                    return Err(err(format!(
                        "`arg {name}`: `in` lists 1 to {MAX_VALUES} values"
                    )));
                }
                if let Some(v) = values.iter().find(|v| !is_scalar(v)) {
                    return Err(err(format!(
                        "`arg {name}`: `in` takes strings, whole numbers and booleans, not {v}"
                    )));
                }
                let texts: Vec<String> = values.iter().map(Value::to_string).collect();
                if !sorted_once(&texts) {
                    return Err(err(format!(
                        "`arg {name}`: `in` values are sorted by their JSON text, each once"
                    )));
                }
                Ok(())
            }
            Constraint::Range { min, max } if min > max => Err(err(format!(
                "`arg {name}`: a range's MIN ({min}) is at most its MAX ({max})"
            ))),
            Constraint::Range { .. } => Ok(()),
        }
    }

    /// Whether `value` is within this constraint: an `In` value equal to one listed (a number
    /// only as a whole number, never `8192.0` for `8192`), a `Range` value a whole number
    /// between the ends.
    pub fn allows(&self, value: &Value) -> bool {
        match self {
            Constraint::In(values) => is_scalar(value) && values.contains(value),
            Constraint::Range { min, max } => {
                value.as_i64().is_some_and(|v| *min <= v && v <= *max)
            }
        }
    }
}

fn is_scalar(v: &Value) -> bool {
    match v {
        Value::String(_) | Value::Bool(_) => true,
        Value::Number(n) => n.is_i64() || n.is_u64(),
        _ => false,
    }
}

impl Grant {
    /// The canonical text, the bytes a signature covers.
    pub fn text(&self) -> Result<String, StatementError> {
        self.check()?;
        let mut out = String::with_capacity(512);
        let mut line = |k: &str, v: &str| {
            out.push_str(k);
            out.push(' ');
            out.push_str(v);
            out.push('\n');
        };
        line("grant", &self.id);
        line("agent", &self.agent);
        if self.break_glass {
            line("break_glass", "true");
        }
        for tool in &self.tools {
            line("tool", tool);
        }
        let runners = match &self.runners {
            Runners::Names(names) => format!("names {}", names.join(",")),
            Runners::Labels(selector) => format!("labels {selector}"),
        };
        line("runners", &runners);
        for (name, constraint) in &self.args {
            line("arg", &format!("{name} {}", constraint.text()));
        }
        line("calls", &self.max_calls.to_string());
        line("calls_per_runner", &self.max_calls_per_runner.to_string());
        line("required", &self.required.to_string());
        line("reason", &Value::String(self.reason.clone()).to_string());
        line("expires", &self.expires_at);
        Ok(format!("{VERSION_LINE}\n{out}"))
    }

    /// `expires_at` as seconds since the Unix epoch.
    pub fn expires_unix(&self) -> Result<u64, StatementError> {
        parse_utc(&self.expires_at).ok_or_else(|| err("`expires` must be YYYY-MM-DDTHH:MM:SSZ"))
    }

    /// The most calls a runner may run under it: the smaller of the two counts.
    pub fn runner_limit(&self) -> u32 {
        self.max_calls.min(self.max_calls_per_runner)
    }

    fn check(&self) -> Result<(), StatementError> {
        word("grant", &self.id)?;
        word("agent", &self.agent)?;
        if self.tools.is_empty() || self.tools.len() > MAX_TOOLS {
            return Err(err(format!("`tool`: name 1 to {MAX_TOOLS} tools")));
        }
        for tool in &self.tools {
            word("tool", tool)?;
            glob::Pattern::new(tool).map_err(|e| err(format!("`tool` `{tool}`: {e}")))?;
        }
        if !sorted_once(&self.tools) {
            return Err(err("`tool` lines are sorted, each once"));
        }
        if let Runners::Names(names) = &self.runners {
            if names.is_empty() {
                return Err(err("`runners names` lists at least one runner"));
            }
            for name in names {
                word("runners", name)?;
            }
            if !sorted_once(names) {
                return Err(err("`runners names` are sorted, each once"));
            }
        }
        if self.break_glass {
            if !matches!(self.runners, Runners::Names(_)) {
                return Err(err(
                    "a break-glass window names its runners (`runners names a,b`), never a selector",
                ));
            }
            if self.required < 2 {
                return Err(err(
                    "a break-glass window needs two people at least (`required` 2 or more)",
                ));
            }
        }
        if self.args.len() > MAX_ARGS {
            return Err(err(format!("at most {MAX_ARGS} `arg` lines")));
        }
        for (name, constraint) in &self.args {
            if !crate::util::input::is_identifier(name) {
                return Err(err(format!(
                    "`arg`: `{}` is not an argument name",
                    name.escape_debug()
                )));
            }
            constraint.check(name)?;
        }
        if !(1..=MAX_CALLS).contains(&self.max_calls) {
            return Err(err(format!("`calls` must be 1 to {MAX_CALLS}")));
        }
        if !(1..=self.max_calls).contains(&self.max_calls_per_runner) {
            return Err(err("`calls_per_runner` must be 1 to `calls`"));
        }
        if !(1..=MAX_SIGNATURES as u32).contains(&self.required) {
            return Err(err(format!("`required` must be 1 to {MAX_SIGNATURES}")));
        }
        let reason = Value::String(self.reason.clone()).to_string();
        if self.reason.trim().is_empty() || reason.len() > MAX_REASON {
            return Err(err(format!(
                "`reason` says why, in at most {MAX_REASON} bytes"
            )));
        }
        self.expires_unix()?;
        Ok(())
    }

    /// Reads a grant back from its text; only text [`Grant::text`] would write (the same
    /// bytes) is accepted.
    pub fn parse(text: &str) -> Result<Grant, StatementError> {
        if text.len() > 64 * 1024 {
            return Err(err("longer than 64 KiB"));
        }
        let body = text
            .strip_suffix('\n')
            .ok_or_else(|| err("must end with a newline"))?;
        let mut lines = Lines(body.split('\n').peekable());
        if lines.0.next() != Some(VERSION_LINE) {
            return Err(err(format!("the first line must be `{VERSION_LINE}`")));
        }
        let id = lines.take("grant")?.to_owned();
        let agent = lines.take("agent")?.to_owned();
        let break_glass = match lines.repeated("break_glass").collect::<Vec<_>>()[..] {
            [] => false,
            ["true"] => true,
            _ => return Err(err("`break_glass` is given once, as `break_glass true`")),
        };
        let tools = lines.repeated("tool").map(str::to_owned).collect();
        let runners = match lines.take("runners")?.split_once(' ') {
            Some(("names", names)) => Runners::Names(names.split(',').map(str::to_owned).collect()),
            Some(("labels", selector)) => Runners::Labels(
                Selector::parse(selector).map_err(|e| err(format!("`runners labels`: {e}")))?,
            ),
            _ => return Err(err("`runners` is `names a,b` or `labels key=value,…`")),
        };
        let mut args = BTreeMap::new();
        for arg in lines.repeated("arg").collect::<Vec<_>>() {
            let (name, constraint) = arg
                .split_once(' ')
                .ok_or_else(|| err("`arg` is `NAME in [...]` or `NAME range MIN..MAX`"))?;
            let constraint = Constraint::parse(name, constraint)?;
            if args.insert(name.to_owned(), constraint).is_some() {
                return Err(err(format!("`arg {name}` is given twice")));
            }
        }
        let count = |field: &str, v: &str| {
            v.parse::<u32>()
                .map_err(|_| err(format!("`{field}` must be a whole number")))
        };
        let max_calls = count("calls", lines.take("calls")?)?;
        let max_calls_per_runner = count("calls_per_runner", lines.take("calls_per_runner")?)?;
        let required = count("required", lines.take("required")?)?;
        let reason: String = serde_json::from_str(lines.take("reason")?)
            .map_err(|_| err("`reason` must be a JSON string"))?;
        let expires_at = lines.take("expires")?.to_owned();
        if lines.0.next().is_some() {
            return Err(err("a line follows `expires`"));
        }
        let grant = Grant {
            id,
            agent,
            break_glass,
            tools,
            runners,
            args,
            max_calls,
            max_calls_per_runner,
            required,
            reason,
            expires_at,
        };
        if grant.text()? != text {
            return Err(err("not in canonical form"));
        }
        Ok(grant)
    }
}

/// The lines of a grant's text after the first, read in order.
struct Lines<'a, I: Iterator<Item = &'a str>>(std::iter::Peekable<I>);

impl<'a, I: Iterator<Item = &'a str>> Lines<'a, I> {
    /// The value of the next line, which must be `key value`.
    fn take(&mut self, key: &str) -> Result<&'a str, StatementError> {
        match self.0.next().map(|l| l.split_once(' ')) {
            Some(Some((k, v))) if k == key => Ok(v),
            Some(Some((k, _))) => Err(err(format!("expected `{key}`, found `{k}`"))),
            Some(None) => Err(err("every line after the first is `key value`")),
            None => Err(err(format!("`{key}` is missing"))),
        }
    }

    /// The values of the `key value` lines that come next (none or more).
    fn repeated(&mut self, key: &str) -> impl Iterator<Item = &'a str> {
        std::iter::from_fn(move || {
            let value = self
                .0
                .peek()
                .and_then(|l| l.split_once(' '))
                .filter(|(k, _)| *k == key)
                .map(|(_, v)| v)?;
            self.0.next();
            Some(value)
        })
    }
}

/// What a checker knows of the call a grant must admit.
pub struct Call<'a> {
    pub tool: &'a str,
    /// The runner it runs on, and that runner's own labels.
    pub runner: &'a str,
    pub labels: &'a BTreeMap<String, String>,
    /// The arguments the runner received.
    pub args: &'a serde_json::Map<String, Value>,
    /// The audit actor the call is made for; None where the checker cannot know it (a
    /// runner: the server says who called, and a server holding `server.key` could say
    /// anyone, so the grant's other lines are what binds there).
    pub agent: Option<&'a str>,
}

/// Whether `grant` admits `call`: its agent, a tool line matching the tool, this runner (by
/// name, or by its own labels), and every constrained argument present and within its
/// constraint. The error names the first field that does not hold.
pub fn admits(grant: &Grant, call: &Call<'_>) -> Result<(), String> {
    if let Some(agent) = call.agent
        && grant.agent != agent
    {
        return Err(format!("the grant is for `{}`, not `{agent}`", grant.agent));
    }
    let tool_matches =
        |pattern: &String| glob::Pattern::new(pattern).is_ok_and(|p| p.matches(call.tool));
    if !grant.tools.iter().any(tool_matches) {
        return Err(format!("the grant does not cover the tool `{}`", call.tool));
    }
    match &grant.runners {
        Runners::Names(names) if !names.iter().any(|n| n == call.runner) => {
            return Err(format!(
                "the grant does not name this runner (`{}`)",
                call.runner
            ));
        }
        Runners::Labels(selector) if !selector.matches(call.labels) => {
            return Err(format!(
                "this runner's labels do not match the grant's `{selector}`"
            ));
        }
        _ => {}
    }
    for (name, constraint) in &grant.args {
        match call.args.get(name) {
            None => {
                return Err(format!(
                    "`{name}`: the grant allows only `{}`, and the call does not give it",
                    constraint.text()
                ));
            }
            Some(value) if !constraint.allows(value) => {
                return Err(format!(
                    "`{name}`: {value} is outside the grant's `{}`",
                    constraint.text()
                ));
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// A grant [`check`] found good for a call.
#[derive(Debug)]
pub struct Checked {
    pub grant: Grant,
    pub signed: Vec<Signed>,
    /// When it was asked for (its UUIDv7 id's time), in milliseconds since the epoch.
    pub requested_ms: u64,
    /// Its expiry, in seconds since the epoch.
    pub expires: u64,
}

/// The one check of a grant carried by a call, which the server (when a person signs and
/// before it calls) and the runner (before a write runs under it) use: it parses, admits the
/// call, the approvers file's rule for the called tool lets grants run it, it lives within
/// `max_lifetime` and has not expired at `now`, and it is signed by enough distinct people of
/// `approvers`: the file's rule for the called tool and the grant's own `required`.
pub fn check(
    approvers: &super::Approvers,
    call: &Call<'_>,
    proof: &GrantProof,
    now: u64,
    max_lifetime: u64,
) -> Result<Checked, String> {
    let grant = Grant::parse(&proof.text).map_err(|e| e.to_string())?;
    admits(&grant, call)?;
    let rule = approvers.rule(call.tool);
    if grant.break_glass && !rule.is_some_and(|r| r.break_glass) {
        return Err(format!(
            "the approvers file (sha256:{}) does not honour break-glass for `{}`: its rule for the tool needs `break_glass = true`",
            approvers.sha256, call.tool
        ));
    }
    if !grant.break_glass && !rule.is_some_and(|r| r.grants) {
        return Err(format!(
            "the approvers file (sha256:{}) does not let a grant run `{}`: its rule for the tool needs `grants = true`",
            approvers.sha256, call.tool
        ));
    }
    let expires = grant.expires_unix().map_err(|e| e.to_string())?;
    let requested_ms = check_lifetime(&grant.id, expires, now, max_lifetime).map_err(|e| {
        format!(
            "the grant: {}",
            e.replace("`approval`", "`grant`")
                .replace("the approval", "the grant")
        )
    })?;
    let signed = verify_quorum(
        approvers,
        call.tool,
        &proof.text,
        &proof.signatures,
        grant.required,
    )
    .map_err(|e| format!("the grant: {e}"))?;
    Ok(Checked {
        grant,
        signed,
        requested_ms,
        expires,
    })
}

#[cfg(test)]
mod tests {
    use super::super::approvers::tests::file_with;
    use super::super::sshsig::tests::{sign, test_key};
    use super::super::tests::id_at;
    use super::super::{Approvers, sshsig};
    use super::*;
    use serde_json::json;

    /// 2026-12-06T10:00:00Z.
    const T: u64 = 1_796_551_200;

    fn sample() -> Grant {
        Grant {
            id: id_at(T),
            agent: "agent:deploy-bot".into(),
            break_glass: false,
            tools: vec!["linux.systemctl_restart".into(), "nomad.job_*".into()],
            runners: Runners::Labels(Selector::parse("role=edge").unwrap()),
            args: BTreeMap::from([
                ("memory".into(), Constraint::Range { min: 0, max: 8192 }),
                (
                    "unit".into(),
                    Constraint::In(vec![json!("consul"), json!("traefik")]),
                ),
            ]),
            max_calls: 3,
            max_calls_per_runner: 2,
            required: 2,
            reason: "INC-42: restart the edge's \"consul\"".into(),
            expires_at: "2026-12-06T10:30:00Z".into(),
        }
    }

    fn labels(role: &str) -> BTreeMap<String, String> {
        BTreeMap::from([("role".to_owned(), role.to_owned())])
    }

    fn args(v: Value) -> serde_json::Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    fn signed_by(seeds: &[u8], text: &str) -> GrantProof {
        GrantProof {
            text: text.to_owned(),
            signatures: seeds
                .iter()
                .map(|s| Signature::Ssh {
                    signer: format!("p{s}"),
                    signature: sign(&test_key(*s), sshsig::APPROVAL_NAMESPACE, text.as_bytes()),
                })
                .collect(),
            approvers: None,
        }
    }

    fn two_people() -> Approvers {
        Approvers::parse(&file_with(
            &[("alice", 1), ("bob", 2)],
            "[[rule]]\ntools = \"*\"\napprovals = 2\ngrants = true\n",
        ))
        .unwrap()
    }

    #[test]
    fn the_text_reads_back_the_same_and_nothing_else_does() {
        let g = sample();
        let text = g.text().unwrap();
        assert_eq!(
            text,
            format!(
                "emisar-grant/v1\ngrant {}\nagent agent:deploy-bot\ntool linux.systemctl_restart\ntool nomad.job_*\nrunners labels role=edge\narg memory range 0..8192\narg unit in [\"consul\",\"traefik\"]\ncalls 3\ncalls_per_runner 2\nrequired 2\nreason \"INC-42: restart the edge's \\\"consul\\\"\"\nexpires 2026-12-06T10:30:00Z\n",
                id_at(T)
            )
        );
        assert_eq!(Grant::parse(&text).unwrap(), g);
        let names = Grant {
            runners: Runners::Names(vec!["edge-1".into(), "edge-2".into()]),
            args: BTreeMap::new(),
            ..sample()
        };
        let names_text = names.text().unwrap();
        assert!(names_text.contains("\nrunners names edge-1,edge-2\ncalls 3\n"));
        assert_eq!(Grant::parse(&names_text).unwrap(), names);
        for (from, to, why) in [
            ("tool linux", "tool zinux", "sorted"),
            (
                "\ntool nomad.job_*",
                "\ntool linux.systemctl_restart",
                "each once",
            ),
            ("labels role=edge", "labels role", "selector pair 1"),
            ("labels role=edge", "any role=edge", "`runners` is"),
            ("range 0..8192", "range 8192..0", "at most its MAX"),
            ("range 0..8192", "range 0..8192.5", "whole numbers"),
            (
                "[\"consul\",\"traefik\"]",
                "[\"traefik\",\"consul\"]",
                "sorted",
            ),
            ("[\"consul\",\"traefik\"]", "[\"consul\",1.5]", "not 1.5"),
            ("[\"consul\",\"traefik\"]", "[]", "1 to 64 values"),
            ("calls 3\n", "calls 0\n", "`calls` must be"),
            ("calls_per_runner 2", "calls_per_runner 4", "1 to `calls`"),
            ("required 2", "required 0", "`required`"),
            ("reason \"INC", "reason INC", "JSON string"),
            ("arg memory", "arg unit", "given twice"),
            ("emisar-grant/v1", "emisar-approval/v2", "first line"),
            (
                "expires 2026-12-06T10:30:00Z",
                "expires tomorrow",
                "`expires`",
            ),
        ] {
            let bad = text.replacen(from, to, 1);
            assert_ne!(bad, text, "{from} is in the text");
            let e = Grant::parse(&bad).unwrap_err().to_string();
            assert!(e.contains(why), "{from} → {to}: {e}");
        }
        assert!(Grant::parse(&format!("{text}extra x\n")).is_err());
        assert!(Grant::parse(text.trim_end()).is_err());
        // A JSON string with its own escapes for plain letters is not canonical.
        let e = Grant::parse(&text.replace("INC-42", "\\u0049NC-42"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("canonical"), "{e}");
        // Neither a statement nor a decision is ever read as a grant.
        let statement = super::super::statement::tests::sample().text().unwrap();
        assert!(Grant::parse(&statement).is_err());
    }

    #[test]
    fn a_grant_admits_only_its_agent_tools_runners_and_argument_values() {
        let g = sample();
        let edge = labels("edge");
        fn call<'a>(
            tool: &'a str,
            runner: &'a str,
            labels: &'a BTreeMap<String, String>,
            args: &'a serde_json::Map<String, Value>,
        ) -> Call<'a> {
            Call {
                tool,
                runner,
                labels,
                args,
                agent: Some("agent:deploy-bot"),
            }
        }
        let ok = args(json!({"unit": "consul", "memory": 8192, "reason": "x"}));
        admits(&g, &call("linux.systemctl_restart", "edge-1", &edge, &ok)).unwrap();
        admits(&g, &call("nomad.job_scale", "edge-1", &edge, &ok)).unwrap();
        let refused =
            |tool: &str, labels: &BTreeMap<String, String>, a: &serde_json::Map<String, Value>| {
                admits(&g, &call(tool, "edge-1", labels, a)).unwrap_err()
            };
        let e = refused("nomad.node_drain", &edge, &ok);
        assert!(e.contains("does not cover the tool"), "{e}");
        let core = labels("core");
        let e = refused("linux.systemctl_restart", &core, &ok);
        assert!(e.contains("labels do not match"), "{e}");
        for (a, why) in [
            (
                json!({"unit": "sshd", "memory": 1}),
                "`unit`: \"sshd\" is outside",
            ),
            (json!({"unit": "consul", "memory": 8193}), "`memory`: 8193"),
            (json!({"unit": "consul", "memory": -1}), "`memory`: -1"),
            (
                json!({"unit": "consul", "memory": 100.0}),
                "`memory`: 100.0",
            ),
            (
                json!({"unit": "consul", "memory": "100"}),
                "`memory`: \"100\"",
            ),
            (
                json!({"unit": ["consul"], "memory": 1}),
                "`unit`: [\"consul\"]",
            ),
            (json!({"memory": 1}), "`unit`: the grant allows only"),
        ] {
            let a_map = args(a.clone());
            let e = refused("linux.systemctl_restart", &edge, &a_map);
            assert!(e.contains(why), "{a}: {e}");
        }
        let other = Call {
            agent: Some("agent:other-bot"),
            ..call("linux.systemctl_restart", "edge-1", &edge, &ok)
        };
        let e = admits(&g, &other).unwrap_err();
        assert!(e.contains("not `agent:other-bot`"), "{e}");
        let named = Grant {
            runners: Runners::Names(vec!["edge-1".into()]),
            ..sample()
        };
        let none = BTreeMap::new();
        admits(
            &named,
            &call("linux.systemctl_restart", "edge-1", &none, &ok),
        )
        .unwrap();
        let e = admits(
            &named,
            &call("linux.systemctl_restart", "edge-2", &edge, &ok),
        )
        .unwrap_err();
        assert!(e.contains("does not name this runner (`edge-2`)"), "{e}");
    }

    #[test]
    fn a_grant_runs_only_signed_by_enough_people_and_within_its_time() {
        let text = sample().text().unwrap();
        let a = two_people();
        let edge = labels("edge");
        let ok = args(json!({"unit": "traefik", "memory": 512}));
        let call = Call {
            tool: "linux.systemctl_restart",
            runner: "edge-1",
            labels: &edge,
            args: &ok,
            agent: None,
        };
        let now = T + 10;
        let checked = check(&a, &call, &signed_by(&[1, 2], &text), now, 3600).unwrap();
        assert_eq!(checked.grant.runner_limit(), 2);
        assert_eq!(checked.signed.len(), 2);
        assert_eq!(checked.requested_ms, T * 1000);
        let refused =
            |proof: &GrantProof, now: u64, max: u64| check(&a, &call, proof, now, max).unwrap_err();
        let e = refused(&signed_by(&[1], &text), now, 3600);
        assert!(e.contains("needs 2"), "{e}");
        let e = refused(&signed_by(&[1, 1], &text), now, 3600);
        assert!(e.contains("count once"), "{e}");
        let e = refused(&signed_by(&[1, 2], &text), T + 1800, 3600);
        assert!(e.contains("expired"), "{e}");
        let e = refused(&signed_by(&[1, 2], &text), now, 600);
        assert!(e.contains("more than the 600 s"), "{e}");
        let e = refused(&signed_by(&[1, 2], &text), T - 3600, 3600);
        assert!(e.contains("`grant`") && e.contains("future"), "{e}");
        // The grant's own count holds where the file asks fewer people.
        let one = Approvers::parse(&file_with(
            &[("alice", 1), ("bob", 2)],
            "[[rule]]\ntools = \"*\"\napprovals = 1\ngrants = true\n",
        ))
        .unwrap();
        let e = check(&one, &call, &signed_by(&[1], &text), now, 3600).unwrap_err();
        assert!(e.contains("`required 2`"), "{e}");
        // A file whose rule for the tool does not let grants run it.
        let no_grants = Approvers::parse(&file_with(
            &[("alice", 1), ("bob", 2)],
            "[[rule]]\ntools = \"*\"\napprovals = 2\n",
        ))
        .unwrap();
        let e = check(&no_grants, &call, &signed_by(&[1, 2], &text), now, 3600).unwrap_err();
        assert!(e.contains("needs `grants = true`"), "{e}");
        // Signatures over another grant (one more call) do not count for this one.
        let mut proof = signed_by(&[1, 2], &text);
        proof.signatures = signed_by(&[1, 2], &text.replace("calls 3", "calls 4")).signatures;
        let e = refused(&proof, now, 3600);
        assert!(e.contains("signature"), "{e}");
        // A call outside the grant is refused before any signature is read.
        let core = labels("core");
        let outside = Call {
            labels: &core,
            ..call
        };
        let e = check(&a, &outside, &signed_by(&[1, 2], &text), now, 3600).unwrap_err();
        assert!(e.contains("labels do not match"), "{e}");
    }

    /// A break-glass window names its runners, needs two people, reads back with its flag,
    /// and runs only where the approvers file's rule honours break-glass: `grants = true`
    /// does not stand in for it, nor `break_glass = true` for a plain grant.
    #[test]
    fn a_break_glass_window_runs_only_where_the_file_honours_it() {
        let window = Grant {
            break_glass: true,
            tools: vec!["*".into()],
            runners: Runners::Names(vec!["edge-1".into()]),
            args: BTreeMap::new(),
            ..sample()
        };
        let text = window.text().unwrap();
        assert!(
            text.contains("\nagent agent:deploy-bot\nbreak_glass true\ntool *\n"),
            "{text}"
        );
        assert_eq!(Grant::parse(&text).unwrap(), window);
        for (bad, why) in [
            (
                text.replace("break_glass true", "break_glass yes"),
                "`break_glass true`",
            ),
            (text.replace("required 2", "required 1"), "two people"),
            (
                text.replace("runners names edge-1", "runners labels role=edge"),
                "never a selector",
            ),
        ] {
            let e = Grant::parse(&bad).unwrap_err().to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
        let none = BTreeMap::new();
        let a = args(json!({"unit": "sshd"}));
        let call = Call {
            tool: "linux.systemctl_restart",
            runner: "edge-1",
            labels: &none,
            args: &a,
            agent: None,
        };
        let now = T + 10;
        // Two people and `grants = true` only: no break-glass here.
        let e = check(&two_people(), &call, &signed_by(&[1, 2], &text), now, 3600).unwrap_err();
        assert!(e.contains("needs `break_glass = true`"), "{e}");
        let honours = Approvers::parse(&file_with(
            &[("alice", 1), ("bob", 2)],
            "[[rule]]\ntools = \"*\"\napprovals = 1\nbreak_glass = true\n",
        ))
        .unwrap();
        check(&honours, &call, &signed_by(&[1, 2], &text), now, 3600).unwrap();
        // One person alone opens no window, whatever the file's own count.
        let e = check(&honours, &call, &signed_by(&[1], &text), now, 3600).unwrap_err();
        assert!(e.contains("`required 2`"), "{e}");
        // A plain grant does not run where the file honours break-glass only.
        let plain = Grant {
            break_glass: false,
            ..window
        }
        .text()
        .unwrap();
        let e = check(&honours, &call, &signed_by(&[1, 2], &plain), now, 3600).unwrap_err();
        assert!(e.contains("needs `grants = true`"), "{e}");
    }
}
