//! `emisar packs test`: runs a pack's example calls through the runner's engine with recorded
//! service answers, with no fleet and no network, and compares what the engine returns with
//! what each case expects.
//!
//! A pack's cases live beside it in `tests/<pack>.yaml` (docs/pack-author-guide.md has the
//! format), so the pack file stays the readable thing an operator reviews.
//!
//! Invariants: the engine is the runner's own (`node::engine::run`); only the answers differ.
//! Every request the engine makes must be the next one the case recorded (method, path,
//! query and body for http, argv for exec), so a broken template fails its case; a recorded
//! call the engine never made fails it too.

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{Context, bail};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

use crate::node::config::ServiceConfig;
use crate::node::engine::{self, Answers, Env};
use crate::node::exec::ExecResult;
use crate::node::http_action::{HttpRequest, HttpResult};
use crate::pack::{PackSet, Tool};
use crate::protocol::Mode;

/// The stock packs' cases, embedded like the stock packs themselves, so `emisar packs test`
/// with no directory checks the packs this binary carries.
const STOCK_TESTS: &[(&str, &str)] = &[
    (
        "tests/consul.yaml",
        include_str!("../../packs/tests/consul.yaml"),
    ),
    (
        "tests/debian.yaml",
        include_str!("../../packs/tests/debian.yaml"),
    ),
    ("tests/frr.yaml", include_str!("../../packs/tests/frr.yaml")),
    (
        "tests/linux.yaml",
        include_str!("../../packs/tests/linux.yaml"),
    ),
    (
        "tests/nomad.yaml",
        include_str!("../../packs/tests/nomad.yaml"),
    ),
    (
        "tests/redis.yaml",
        include_str!("../../packs/tests/redis.yaml"),
    ),
    (
        "tests/traefik.yaml",
        include_str!("../../packs/tests/traefik.yaml"),
    ),
    ("tests/vm.yaml", include_str!("../../packs/tests/vm.yaml")),
];

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TestFile {
    pack: String,
    /// Parsed one by one, so an error names the case it is in.
    cases: Vec<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    name: String,
    /// The tool's name within the pack (`service_health`) or in full (`consul.service_health`).
    tool: String,
    #[serde(default)]
    mode: CaseMode,
    #[serde(default)]
    args: Map<String, Value>,
    /// The preview's values an execution receives (a tool with a preview needs them).
    #[serde(default)]
    vars: Option<Map<String, Value>>,
    /// Each read by [`Call::read`], so an error names the call it is in.
    #[serde(default)]
    calls: Vec<Value>,
    expect: Expect,
}

#[derive(Deserialize, Default, Clone, Copy)]
#[serde(rename_all = "lowercase")]
enum CaseMode {
    #[default]
    Execute,
    Preview,
    /// The tool's health gate, as a rollout runs it on a runner after the write.
    Verify,
}

/// One recorded call, checked when its file was read: its kind's key, the request it names in
/// a report, and what the case wrote (read again as its kind when the engine asks).
#[derive(Clone, Debug)]
struct Call {
    kind: &'static str,
    request: String,
    written: Value,
}

/// A kind of recorded call, one per kind of pack action: the request the engine must make,
/// written under [`Kind::KEY`], and the answer it gets. Read with `deny_unknown_fields`, so a
/// field of another kind's answer is refused by name.
///
/// A new action kind is, in this file: its struct with an `impl Kind`, its line in [`KINDS`],
/// and its method of the engine's `Answers` on [`Recorded`] (matched with [`Recorded::next`]).
trait Kind: DeserializeOwned {
    /// The key the call is written under, the action's own key in a pack (`http`, `exec`).
    const KEY: &'static str;

    /// The request, as a report names it (`GET /v1/agent/self`).
    fn request(&self) -> String;

    /// What the schema cannot say about a call of this kind.
    fn check(&self) -> Result<(), String> {
        Ok(())
    }
}

/// How a call written with one kind's key is read and checked ([`read`] of that kind).
type ReadCall = fn(Value) -> Result<Call, String>;

/// Every kind of recorded call, by key: how a call written with that key is read.
const KINDS: &[(&str, ReadCall)] = &[
    (HttpCall::KEY, read::<HttpCall>),
    (ExecCall::KEY, read::<ExecCall>),
];

/// An http request the engine must send to the pack's service, and the answer.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HttpCall {
    http: RecordedHttp,
    /// The answer's status.
    #[serde(default = "http_ok")]
    status: u16,
    /// The answer's body (JSON, or a string for a text answer).
    #[serde(default)]
    body: Value,
}

fn http_ok() -> u16 {
    200
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RecordedHttp {
    method: String,
    path: String,
    #[serde(default)]
    query: BTreeMap<String, String>,
    /// The request body the engine must send, when the step has one.
    body: Option<Value>,
}

impl Kind for HttpCall {
    const KEY: &'static str = "http";

    fn request(&self) -> String {
        let want = &self.http;
        let mut recorded = format!("{} {}", want.method, want.path);
        if !want.query.is_empty() {
            let q: Vec<String> = want.query.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let _ = write!(recorded, "?{}", q.join("&"));
        }
        if let Some(body) = &want.body {
            let _ = write!(recorded, " with body {body}");
        }
        recorded
    }
}

/// An argv the engine must run, and how the program answered.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ExecCall {
    exec: Vec<String>,
    #[serde(default)]
    exit_code: i32,
    #[serde(default)]
    stdout: String,
    #[serde(default)]
    stderr: String,
}

impl Kind for ExecCall {
    const KEY: &'static str = "exec";

    fn request(&self) -> String {
        format!("exec {:?}", self.exec)
    }

    fn check(&self) -> Result<(), String> {
        if self.exec.is_empty() {
            return Err("`exec`: the argv is empty".into());
        }
        Ok(())
    }
}

impl Call {
    /// Reads a call as written in a case: exactly one kind's key, and that kind's fields.
    fn read(written: Value) -> Result<Call, String> {
        let keys: Vec<&str> = KINDS.iter().map(|(key, _)| *key).collect();
        let given: Vec<_> = KINDS
            .iter()
            .filter(|(key, _)| written.get(key).is_some())
            .collect();
        match given.as_slice() {
            [(_, read)] => read(written),
            [] => Err(format!(
                "needs one of {} (the kind of request the engine makes)",
                quoted(&keys)
            )),
            _ => Err(format!("give one of {}, not several", quoted(&keys))),
        }
    }

    /// The call as `K`, which it was checked to be when read.
    fn answer<K: Kind>(self) -> K {
        serde_json::from_value(self.written).expect("checked when the case was read")
    }
}

/// A call written with `K`'s key, read and checked as `K`.
fn read<K: Kind>(written: Value) -> Result<Call, String> {
    let call: K = serde_json::from_value(written.clone()).map_err(|e| e.to_string())?;
    call.check()?;
    Ok(Call {
        kind: K::KEY,
        request: call.request(),
        written,
    })
}

/// `keys` quoted and listed: "`http`, `exec`".
fn quoted(keys: &[&str]) -> String {
    let quoted: Vec<String> = keys.iter().map(|k| format!("`{k}`")).collect();
    quoted.join(", ")
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Expect {
    /// The shaped output, compared whole.
    output: Option<Value>,
    /// Preview and verify cases: the values the steps capture, compared whole.
    vars: Option<Map<String, Value>>,
    /// The call fails with an error containing this text.
    error: Option<String>,
    /// Verify cases: `true`, the gate passes (its steps all ran and every check held).
    verified: Option<bool>,
    /// Dotted paths into the output (`booted_at`, `state_after.MainPID`) left out of the
    /// comparison, for values that change with the clock; each must be present.
    #[serde(default)]
    ignore: Vec<String>,
}

/// A case checked against its pack: ready to run.
struct Ready {
    name: String,
    tool: String,
    mode: CaseMode,
    args: Map<String, Value>,
    vars: Option<Map<String, Value>>,
    calls: Vec<Call>,
    expect: Expect,
}

/// Reads and checks a test file; every error names the file, the case and the field.
fn parse(file: &str, text: &str, packs: &PackSet) -> anyhow::Result<(String, Vec<Ready>)> {
    let raw: TestFile = yaml_serde::from_str(text).with_context(|| file.to_owned())?;
    if packs.pack(&raw.pack).is_none() {
        bail!("{file}: `pack: {}` names no loaded pack", raw.pack);
    }
    let mut cases = Vec::new();
    for (i, value) in raw.cases.into_iter().enumerate() {
        let label = value
            .get("name")
            .and_then(Value::as_str)
            .map_or_else(|| format!("case #{}", i + 1), |n| format!("case `{n}`"));
        let case: Case = serde_json::from_value(value)
            .with_context(|| format!("{file}: {label} (#{})", i + 1))?;
        let at = |m: String| anyhow::anyhow!("{file}: {label}: {m}");
        let tool_name = if case.tool.contains('.') {
            case.tool.clone()
        } else {
            format!("{}.{}", raw.pack, case.tool)
        };
        let Some(tool) = packs.tool(&tool_name).filter(|t| t.pack == raw.pack) else {
            return Err(at(format!(
                "`tool`: the pack `{}` has no tool `{}`",
                raw.pack, case.tool
            )));
        };
        if let Err(errors) = tool.validate(&Value::Object(case.args.clone())) {
            return Err(at(format!("`args`: {}", errors.join("; "))));
        }
        check_mode(&case, tool).map_err(at)?;
        check_expect(&case.expect, case.mode).map_err(at)?;
        let mut calls = Vec::new();
        for (j, call) in case.calls.into_iter().enumerate() {
            calls.push(Call::read(call).map_err(|m| at(format!("`calls[{j}]`: {m}")))?);
        }
        cases.push(Ready {
            name: case.name,
            tool: tool_name,
            mode: case.mode,
            args: case.args,
            vars: case.vars,
            calls,
            expect: case.expect,
        });
    }
    Ok((raw.pack, cases))
}

/// The tool has what the case's mode runs, and only an execution is given preview values.
fn check_mode(case: &Case, tool: &Tool) -> Result<(), String> {
    let name = &tool.name;
    match case.mode {
        CaseMode::Preview if tool.preview.is_none() => {
            return Err(format!("`mode: preview`: `{name}` has no preview"));
        }
        CaseMode::Verify if tool.verify.is_none() => {
            return Err(format!("`mode: verify`: `{name}` has no verify"));
        }
        _ => {}
    }
    match (case.mode, &case.vars) {
        (CaseMode::Preview, Some(_)) => {
            Err("`vars` are what an execution receives; a preview case has none".into())
        }
        (CaseMode::Verify, Some(_)) => Err(
            "`vars` are what an execution receives; a verify sees the params alone, so a verify case has none"
                .into(),
        ),
        _ => Ok(()),
    }
}

/// A case expects exactly one outcome that its mode can have: an execution or a preview
/// its shaped `output`, a verify that it passes (`verified: true`), any of them an `error`.
fn check_expect(expect: &Expect, mode: CaseMode) -> Result<(), String> {
    let verify = matches!(mode, CaseMode::Verify);
    match (&expect.output, &expect.error, expect.verified) {
        (Some(_), _, _) if verify => {
            return Err(
                "`expect.output`: a verify has no shaped output (its evidence is what its steps saw): expect `verified: true` or an `error`"
                    .into(),
            );
        }
        (_, _, Some(_)) if !verify => {
            return Err("`expect.verified`: only a verify case passes or fails a gate".into());
        }
        (_, _, Some(false)) => {
            return Err(
                "`expect.verified`: write `true`; a gate that fails is `error: <its message>`"
                    .into(),
            );
        }
        (Some(_), Some(_), _) => {
            return Err("`expect`: give `output` or `error`, not both".into());
        }
        (_, Some(_), Some(_)) => {
            return Err("`expect`: give `verified: true` or `error`, not both".into());
        }
        (None, None, None) if verify => {
            return Err("`expect`: needs `verified: true` or `error`".into());
        }
        (None, None, None) => return Err("`expect`: needs `output` or `error`".into()),
        _ => {}
    }
    if !expect.ignore.is_empty() && expect.output.is_none() {
        return Err("`expect.ignore`: there is no `output` to leave paths out of".into());
    }
    if expect.vars.is_some() && matches!(mode, CaseMode::Execute) {
        return Err(
            "`expect.vars`: only a preview or verify case captures values to compare".into(),
        );
    }
    Ok(())
}

/// The recorded answers of one case, handed out in order. A request that is not the next
/// recorded one is refused (the step fails) and noted, so the case fails even when the
/// step was optional.
struct Recorded {
    calls: Mutex<VecDeque<Call>>,
    mismatches: Mutex<Vec<String>>,
}

impl Recorded {
    /// The next recorded call, which must be of kind `K`: the engine made `made`.
    fn next<K: Kind>(&self, made: &str) -> Result<K, String> {
        let next = self.calls.lock().expect("recorded calls").pop_front();
        let call =
            next.ok_or_else(|| self.mismatch(format!("unrecorded call: the engine made {made}")))?;
        if call.kind != K::KEY {
            return Err(self.mismatch(format!(
                "the engine made {made}, but the next recorded call is {}",
                call.request
            )));
        }
        Ok(call.answer())
    }

    fn mismatch(&self, message: String) -> String {
        self.mismatches
            .lock()
            .expect("mismatches")
            .push(message.clone());
        message
    }
}

fn describe_http(r: &HttpRequest<'_>) -> String {
    let query: Vec<String> = r.query.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let mut s = format!("{} {}", r.method, r.path);
    if !query.is_empty() {
        let _ = write!(s, "?{}", query.join("&"));
    }
    if let Some(body) = &r.body {
        let _ = write!(s, " with body {body}");
    }
    s
}

impl Answers for Recorded {
    async fn http(
        &self,
        _service_name: &str,
        _service: &ServiceConfig,
        request: &HttpRequest<'_>,
        _max_output: usize,
    ) -> Result<HttpResult, String> {
        let made = describe_http(request);
        let call: HttpCall = self.next(&format!("the http request {made}"))?;
        let want = &call.http;
        let query: BTreeMap<String, String> = request
            .query
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect();
        if !want.method.eq_ignore_ascii_case(request.method)
            || want.path != request.path
            || want.query != query
            || (want.body.is_some() && want.body != request.body)
        {
            return Err(self.mismatch(format!(
                "request mismatch: the engine made {made}, the case recorded {}",
                call.request()
            )));
        }
        Ok(HttpResult {
            status: call.status,
            body: call.body,
            truncated: false,
        })
    }

    async fn exec(
        &self,
        argv: &[String],
        _exec_path: &str,
        _timeout: Duration,
        _max_output: usize,
    ) -> Result<ExecResult, String> {
        let call: ExecCall = self.next(&format!("the exec {argv:?}"))?;
        if call.exec != argv {
            return Err(self.mismatch(format!(
                "argv mismatch: the engine ran {argv:?}, the case recorded {:?}",
                call.exec
            )));
        }
        Ok(ExecResult {
            exit_code: Some(call.exit_code),
            signal: None,
            stdout: call.stdout,
            stderr: call.stderr,
            truncated: false,
        })
    }
}

/// Runs one case; `Ok` when it passed, else the readable reasons.
async fn run_case(tool: &Tool, service_name: Option<&str>, case: &Ready) -> Result<(), String> {
    let recorded = Recorded {
        calls: Mutex::new(case.calls.iter().cloned().collect()),
        mismatches: Mutex::new(Vec::new()),
    };
    // The service is never reached: its address only names where a runner would send.
    let service = ServiceConfig {
        base_url: "http://recorded.invalid".into(),
        headers: BTreeMap::new(),
    };
    let programs = BTreeMap::new();
    let env = Env {
        service: service_name.map(|name| (name, &service)),
        exec_path: "",
        programs: &programs,
        max_output: usize::MAX,
    };
    let mode = match case.mode {
        CaseMode::Execute => Mode::Execute,
        CaseMode::Preview => Mode::Preview,
        CaseMode::Verify => Mode::Verify,
    };
    let result = engine::run(
        &recorded,
        &env,
        tool,
        &case.args,
        mode,
        case.vars.as_ref(),
        false,
    )
    .await;
    let mut problems: Vec<String> = recorded.mismatches.into_inner().expect("mismatches");
    let left = recorded.calls.into_inner().expect("recorded calls");
    if !left.is_empty() {
        problems.push(format!(
            "{} recorded call(s) the engine never made, the first: {}",
            left.len(),
            left[0].request
        ));
    }
    // A failure that only repeats a request mismatch noted above is said once.
    let repeats = |e: &str| problems.iter().any(|m| e.contains(m.as_str()));
    let result = result.map_err(|e| (repeats(&e), e));
    match (&case.expect.error, result) {
        (Some(want), Ok(o)) => problems.push(format!(
            "expected an error containing {want:?}, but the call succeeded with {}",
            o.output
        )),
        (_, Err((true, _))) => {}
        (Some(want), Err((_, e))) if !e.contains(want.as_str()) => {
            problems.push(format!("expected an error containing {want:?}, got: {e}"))
        }
        (Some(_), Err(_)) => {}
        (None, Err((_, e))) => problems.push(format!("the call failed: {e}")),
        (None, Ok(mut o)) => {
            for path in &case.expect.ignore {
                if !remove_path(&mut o.output, path) {
                    problems.push(format!(
                        "`expect.ignore`: the output has no `{path}` to leave out"
                    ));
                }
            }
            if let Some(want) = &case.expect.output
                && *want != o.output
            {
                problems.push(format!(
                    "output differs (- expected, + actual):\n{}",
                    diff(want, &o.output)
                ));
            }
            if let Some(want) = &case.expect.vars
                && *want != o.vars
            {
                problems.push(format!(
                    "captured vars differ (- expected, + actual):\n{}",
                    diff(&json!(want), &json!(o.vars))
                ));
            }
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("\n"))
    }
}

/// Removes the value at a dotted path of object keys; false when there is none.
fn remove_path(value: &mut Value, path: &str) -> bool {
    let mut at = value;
    let mut keys = path.split('.').peekable();
    while let Some(key) = keys.next() {
        let Some(object) = at.as_object_mut() else {
            return false;
        };
        if keys.peek().is_none() {
            return object.remove(key).is_some();
        }
        match object.get_mut(key) {
            Some(next) => at = next,
            None => return false,
        }
    }
    false
}

/// A line diff of the two values as pretty JSON.
fn diff(want: &Value, got: &Value) -> String {
    let want = serde_json::to_string_pretty(want).unwrap_or_default() + "\n";
    let got = serde_json::to_string_pretty(got).unwrap_or_default() + "\n";
    similar::TextDiff::from_lines(&want, &got)
        .unified_diff()
        .context_radius(3)
        .to_string()
}

/// Runs every case of the packs in `dir` (its `tests/*.yaml`), or of the stock packs; prints
/// one line per case and a summary. Returns the exit code: 1 when any case failed.
pub(super) async fn run(dir: Option<&Path>) -> anyhow::Result<i32> {
    let packs = PackSet::load(dir)?;
    let mut files: Vec<(String, String)> = Vec::new();
    match dir {
        Some(dir) => {
            let tests = dir.join("tests");
            let entries = std::fs::read_dir(&tests).with_context(|| {
                format!(
                    "reading {} (a pack's cases live in tests/<pack>.yaml beside it)",
                    tests.display()
                )
            })?;
            let mut paths: Vec<_> = entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
                .collect();
            paths.sort();
            for path in paths {
                let text = std::fs::read_to_string(&path)
                    .with_context(|| format!("reading {}", path.display()))?;
                files.push((path.display().to_string(), text));
            }
        }
        None => {
            for (file, text) in STOCK_TESTS {
                files.push((format!("stock:{file}"), (*text).to_owned()));
            }
        }
    }
    let mut tested: BTreeMap<String, usize> = BTreeMap::new();
    let mut tested_packs = Vec::new();
    let (mut passed, mut failed) = (0, 0);
    for (file, text) in &files {
        let (pack, cases) = parse(file, text, &packs)?;
        tested_packs.push(pack);
        for case in &cases {
            let tool = packs.tool(&case.tool).expect("checked when parsed");
            *tested.entry(case.tool.clone()).or_default() += 1;
            let service = packs.pack(&tool.pack).and_then(|p| p.service.as_deref());
            match run_case(tool, service, case).await {
                Ok(()) => {
                    passed += 1;
                    println!("ok    {:<32} {}", case.tool, case.name);
                }
                Err(why) => {
                    failed += 1;
                    println!("FAIL  {:<32} {}", case.tool, case.name);
                    for line in why.lines() {
                        println!("      {line}");
                    }
                }
            }
        }
    }
    let untested: Vec<&str> = packs
        .tools()
        .filter(|t| tested_packs.contains(&t.pack) && !tested.contains_key(&t.name))
        .map(|t| t.name.as_str())
        .collect();
    for name in &untested {
        println!("none  {name:<32} (no case)");
    }
    println!(
        "{} tools in {} packs, {} without a case; {} cases: {passed} passed, {failed} failed",
        tested.len() + untested.len(),
        tested_packs.len(),
        untested.len(),
        passed + failed
    );
    Ok(if failed > 0 { 1 } else { 0 })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(yaml: &str) -> Result<Call, String> {
        Call::read(yaml_serde::from_str(yaml).unwrap())
    }

    fn recorded(calls: &[&str]) -> Recorded {
        Recorded {
            calls: Mutex::new(calls.iter().map(|c| read(c).unwrap()).collect()),
            mismatches: Mutex::new(Vec::new()),
        }
    }

    #[test]
    fn a_call_is_read_as_the_kind_its_key_names_with_its_defaults() {
        let call = read("{http: {method: GET, path: /x, query: {a: b}}, status: 404}").unwrap();
        assert_eq!((call.kind, call.request.as_str()), ("http", "GET /x?a=b"));
        let http: HttpCall = call.answer();
        assert_eq!((http.status, http.body), (404, Value::Null));
        let http: HttpCall = read("{http: {method: GET, path: /}}").unwrap().answer();
        assert_eq!(http.status, 200);
        let call = read("{exec: [systemctl, show], stdout: hi}").unwrap();
        assert_eq!(call.request, r#"exec ["systemctl", "show"]"#);
        let exec: ExecCall = call.answer();
        assert_eq!(
            (exec.exit_code, exec.stdout.as_str(), exec.stderr.as_str()),
            (0, "hi", "")
        );
    }

    #[test]
    fn a_call_names_exactly_one_kind() {
        assert_eq!(
            read("{status: 200}").unwrap_err(),
            "needs one of `http`, `exec` (the kind of request the engine makes)"
        );
        assert_eq!(
            read("{http: {method: GET, path: /}, exec: [x]}").unwrap_err(),
            "give one of `http`, `exec`, not several"
        );
    }

    #[test]
    fn an_answer_field_of_another_kind_is_refused_by_name() {
        let err = read("{http: {method: GET, path: /}, exit_code: 1}").unwrap_err();
        assert!(err.contains("unknown field `exit_code`"), "{err}");
        let err = read("{exec: [x], body: {}}").unwrap_err();
        assert!(err.contains("unknown field `body`"), "{err}");
    }

    #[test]
    fn an_empty_argv_is_refused() {
        assert_eq!(read("{exec: []}").unwrap_err(), "`exec`: the argv is empty");
    }

    #[test]
    fn the_engine_gets_the_next_call_only_when_it_is_of_the_kind_it_made() {
        let calls = recorded(&["{exec: [x]}", "{http: {method: GET, path: /y}}"]);
        let err = calls.next::<HttpCall>("the http request GET /y").err();
        let want =
            r#"the engine made the http request GET /y, but the next recorded call is exec ["x"]"#;
        assert_eq!(err.as_deref(), Some(want));
        let http = calls.next::<HttpCall>("the http request GET /y").ok();
        assert_eq!(http.map(|h| h.http.path).as_deref(), Some("/y"));
        let err = calls.next::<ExecCall>("the exec [\"x\"]").err();
        let none_left = r#"unrecorded call: the engine made the exec ["x"]"#;
        assert_eq!(err.as_deref(), Some(none_left));
        assert_eq!(calls.mismatches.into_inner().unwrap(), [want, none_left]);
    }
}
