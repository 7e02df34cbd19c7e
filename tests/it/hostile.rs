//! The hostile corpus: input an attacker would send, through every entry point of one server
//! and one runner, on PostgreSQL and on SQLite.
//!
//! - every param of every tool the server lists over MCP (a real MCP client), plus `reason`,
//!   `runners`, `selector` and `raw`, with shell metacharacters, dot segments, CRLF, NUL,
//!   bidirectional and zero-width characters, 1 MiB strings, numbers at the edges and wrong
//!   types; and every required field missing, and extra fields. The corpus is built from the
//!   input schemas the server lists, so a new tool is covered without touching this file;
//! - malformed JSON-RPC over raw HTTP (invalid JSON, wrong versions, huge ids, batches, wrong
//!   content types, a 10 MB body, hostile session ids);
//! - the portal's JSON API (login, approve and deny with hostile ids and notes, queries);
//! - the join endpoint (hostile names, URLs, labels, packs and tokens);
//! - the runner's execute endpoint (unsigned, badly signed, replayed, oversized, hostile JSON).
//!
//! Each case must get a clear answer (a 4xx with a message, or an MCP error or `isError`
//! result with one), be audited when the caller was an authenticated agent, and execute
//! nothing: the runner's programs are recording stand-ins (the only thing on its `exec_path`)
//! and its services one recording HTTP server. A value that a param's schema accepts (a
//! PromQL query may hold `$(reboot)`; `NaN` is a fine job name) is not hostile to that
//! param: such a call may run, and then the value must arrive as data (one path segment that
//! is not a dot segment, one argv element) and never as a write. Afterwards the server is
//! ready, a good call succeeds and `emisar audit verify` passes.
//!
//! All failures are collected and reported together with the counts of cases tried and held.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use emisar::protocol::signing::{CallClaims, CallSigner, ISSUER, Purpose, now};
use emisar::protocol::{CallRequest, Mode};
use emisar::server::principal::Role;
use futures::StreamExt;
use rmcp::model::{CallToolRequestParams, CallToolResult};
use serde_json::{Map, Value, json};

use crate::approvals::{Portal, add_user};
use crate::harness::app::{Options, TestApp};
use crate::harness::{Backend, RunnerSpec, spawn_app};

/// How many cases run at once.
const IN_FLIGHT: usize = 12;
const MIB: usize = 1 << 20;

/// The programs any stock pack runs, each replaced by a stand-in that records its argv
/// (fields separated by 0x1f) before doing the harmless part of the real thing.
const PROGRAMS: [(&str, &str); 7] = [
    ("apt-get", "exit 0"),
    ("env", "exit 0"),
    ("cat", "exec /bin/cat \"$@\""),
    ("uname", "exec /bin/uname \"$@\""),
    ("dpkg-query", "exit 0"),
    ("vtysh", "printf '{}'"),
    (
        "systemctl",
        "printf 'ActiveState=active\\nSubState=running\\nMainPID=4242\\n'",
    ),
];

fn standins(dir: &Path) -> PathBuf {
    let log = dir.join("exec.log");
    for (name, then) in PROGRAMS {
        let script = format!(
            "#!/bin/sh\n{{ printf '%s' '{name}'; for a in \"$@\"; do printf '\\037%s' \"$a\"; done; printf '\\n'; }} >> '{}'\n{then}\n",
            log.display()
        );
        let path = dir.join(name);
        std::fs::write(&path, script).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    log
}

/// Every program run so far, as argv (program first).
fn executions(log: &Path) -> Vec<Vec<String>> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(|l| l.split('\u{1f}').map(str::to_owned).collect())
        .collect()
}

type Seen = Arc<Mutex<Vec<String>>>;

/// One HTTP server standing in for every local service: it records the request line of
/// everything it gets and answers `{}`.
async fn recording_service() -> (String, Seen) {
    let seen: Seen = Arc::default();
    let record = seen.clone();
    let app = axum::Router::new().fallback(move |req: axum::extract::Request| {
        let record = record.clone();
        async move {
            record
                .lock()
                .unwrap()
                .push(format!("{} {}", req.method(), req.uri()));
            axum::Json(json!({}))
        }
    });
    (emisar::lab::http::serve(app).await, seen)
}

/// Strings that an attacker tries in any text field.
fn hostile_strings() -> Vec<(&'static str, Value)> {
    vec![
        ("shell ;", json!("; reboot")),
        ("shell $()", json!("$(reboot)")),
        ("shell backquote", json!("`reboot`")),
        ("shell pipe", json!("| sh -c id")),
        ("shell &&", json!("&& rm -rf /")),
        ("quotes", json!("a'b\"c")),
        ("dot", json!(".")),
        ("dot-dot", json!("..")),
        ("climb", json!("../../etc/passwd")),
        ("inner climb", json!("a/../../b")),
        ("encoded climb", json!("%2e%2e%2f%2e%2e")),
        ("absolute path", json!("/etc/passwd")),
        ("CRLF header", json!("a\r\nX-Injected: 1")),
        ("CRLF request", json!("\r\n\r\nGET / HTTP/1.1")),
        ("NUL inside", json!("a\u{0}b")),
        ("NUL alone", json!("\u{0}")),
        ("bidi override", json!("safe\u{202e}exe.txt")),
        ("bidi isolate", json!("\u{2066}x\u{2069}")),
        ("zero-width space", json!("a\u{200b}b")),
        ("byte-order mark", json!("\u{feff}x")),
        ("option", json!("-rf")),
        ("long option", json!("--help")),
        ("template", json!("{unit}")),
        ("jq path", json!(".args")),
        ("empty", json!("")),
        ("space", json!(" ")),
        ("NaN", json!("NaN")),
        ("Infinity", json!("-Infinity")),
        ("1e308 text", json!("1e308")),
        ("2^63 text", json!("9223372036854775808")),
        ("html", json!("<script>alert(1)</script>")),
        ("257 chars", json!("a".repeat(257))),
        ("1 MiB", json!("A".repeat(MIB))),
    ]
}

/// Numbers at the edges (what a JSON client can send; exact big integers are sent raw below).
fn hostile_numbers() -> Vec<(&'static str, Value)> {
    vec![
        ("-0.0", json!(-0.0)),
        ("0", json!(0)),
        ("-1", json!(-1)),
        ("1.5", json!(1.5)),
        ("1e308", json!(1e308)),
        ("-1e308", json!(-1e308)),
        ("1e-308", json!(1e-308)),
        ("2^53+1", json!(9_007_199_254_740_993u64)),
        ("2^63", json!(9_223_372_036_854_775_808u64)),
        ("u64 max", json!(u64::MAX)),
        ("i64 min", json!(i64::MIN)),
        ("-2^63-1", json!(-9_223_372_036_854_775_809.0f64)),
        ("2^32", json!(4_294_967_296u64)),
    ]
}

fn wrong_types() -> Vec<(&'static str, Value)> {
    let mut deep = json!("x");
    for _ in 0..100 {
        deep = json!([deep]);
    }
    vec![
        ("null", Value::Null),
        ("true", json!(true)),
        ("false", json!(false)),
        ("empty array", json!([])),
        ("empty object", json!({})),
        ("array of a string", json!(["node-1"])),
        ("object", json!({"a": 1})),
        ("deep array", deep),
        ("array of 5000", json!(vec!["a"; 5000])),
    ]
}

/// Values that fit common param schemas, to fill the params a case does not attack.
fn samples() -> Vec<Value> {
    vec![
        json!("a1"),
        json!("web"),
        json!("web@docker"),
        json!("0123abcd"),
        json!("00000000-0000-4000-8000-000000000000"),
        json!("1700000000"),
        json!("1s"),
        json!("192.0.2.1"),
        json!("192.0.2.0/24"),
        json!("consul.service"),
        json!("up"),
        json!(65001),
        json!(100),
        json!(16),
        json!(1),
        json!(true),
        // `emisar.request_grant`'s `tools`, `args` and `runners` (names or labels).
        json!(["a1"]),
        json!({}),
        json!({"names": ["node-1"]}),
    ]
}

fn validator(schema: &Map<String, Value>) -> jsonschema::Validator {
    emisar::pack::input_validator(schema).unwrap()
}

/// Whether the door itself refuses `args` whatever the schema says: NUL anywhere, or a
/// `reason` with control or invisible formatting characters. (Written here from the rule,
/// not taken from the server, so the test checks the server against it.)
fn door_refuses(args: &Map<String, Value>) -> bool {
    fn nul(v: &Value) -> bool {
        match v {
            Value::String(s) => s.contains('\0'),
            Value::Array(a) => a.iter().any(nul),
            Value::Object(m) => m.iter().any(|(k, v)| k.contains('\0') || nul(v)),
            _ => false,
        }
    }
    let bad_reason = args.get("reason").and_then(Value::as_str).is_some_and(|r| {
        r.chars().any(|c| {
            (c.is_control() && !matches!(c, '\t' | '\n' | '\r'))
                || matches!(c, '\u{061c}' | '\u{200b}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2060}' | '\u{2066}'..='\u{2069}' | '\u{feff}')
        })
    });
    args.values().any(nul) || args.keys().any(|k| k.contains('\0')) || bad_reason
}

struct Case {
    tool: String,
    /// What the case does, for the report.
    label: String,
    /// The field the case attacks, which a refusal must name.
    field: Option<String>,
    args: Map<String, Value>,
    /// The tool's schema (and the door) refuse these arguments.
    refused: bool,
}

/// The params every tool takes, checked by the same code for all of them.
const SHARED_PARAMS: [&str; 4] = ["reason", "runners", "selector", "raw"];
/// Each hostile value goes to the shared params of one tool in this many (rotating, so every
/// value reaches every shared param on several tools and every tool gets a share of the
/// values): trying all of them on all tools would be four fifths of the corpus and its time,
/// spent on the same checks.
const SHARED_SPREAD: usize = 4;

/// The corpus for every listed tool, from its input schema: every hostile value in each of
/// the tool's own params, a share of them in the shared params, each required param missing,
/// and extra fields.
fn corpus(tools: &[rmcp::model::Tool]) -> Vec<Case> {
    let mut cases = Vec::new();
    let values: Vec<(&str, Value)> = hostile_strings()
        .into_iter()
        .chain(hostile_numbers())
        .chain(wrong_types())
        .collect();
    for (t, tool) in tools.iter().enumerate() {
        let schema = (*tool.input_schema).clone();
        let check = validator(&schema);
        let properties = schema["properties"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        let required: Vec<String> = schema
            .get("required")
            .and_then(Value::as_array)
            .map(|r| {
                r.iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        // A valid call to start from: every param filled with a sample it accepts.
        let mut base = Map::new();
        for (name, prop) in &properties {
            let value = match name.as_str() {
                "reason" => json!(format!("hostile corpus: {}", tool.name)),
                // A runner list, except for a tool whose `runners` is another shape (a
                // grant's `{"names": [...]}`): a sample fits that.
                "runners" if validator(prop.as_object().unwrap()).is_valid(&json!(["node-1"])) => {
                    json!(["node-1"])
                }
                "selector" | "raw" => continue,
                _ => {
                    let one = validator(prop.as_object().unwrap());
                    samples()
                        .into_iter()
                        .find(|v| one.is_valid(v))
                        .unwrap_or_else(|| {
                            panic!(
                                "no sample fits param `{name}` of `{}` ({prop}): add one to samples()",
                                tool.name
                            )
                        })
                }
            };
            base.insert(name.clone(), value);
        }
        assert!(
            check.is_valid(&Value::Object(base.clone())),
            "the base call of `{}` is not valid: {base:?}",
            tool.name
        );
        let mut push = |label: String, field: Option<&str>, args: Map<String, Value>| {
            let refused = !check.is_valid(&Value::Object(args.clone())) || door_refuses(&args);
            cases.push(Case {
                tool: tool.name.to_string(),
                label,
                field: field.map(str::to_owned),
                args,
                refused,
            });
        };
        for name in properties.keys() {
            let shared = SHARED_PARAMS.contains(&name.as_str());
            for (j, (label, value)) in values.iter().enumerate() {
                if shared && (t + j) % SHARED_SPREAD != 0 {
                    continue;
                }
                let mut args = base.clone();
                args.insert(name.clone(), value.clone());
                push(format!("{name} = {label}"), Some(name), args);
            }
        }
        for name in &required {
            let mut args = base.clone();
            args.remove(name);
            push(format!("{name} missing"), Some(name), args);
        }
        for (label, key) in [
            ("extra field", "extra".to_owned()),
            ("extra NUL field", "x\u{0}y".to_owned()),
            ("extra dot-dot field", "..".to_owned()),
            ("extra 1 MiB field", "k".repeat(MIB)),
        ] {
            let mut args = base.clone();
            args.insert(key, json!(1));
            push(label.to_owned(), None, args);
        }
    }
    cases
}

fn text_of(res: &CallToolResult) -> String {
    let mut text: Vec<String> = res
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect();
    if let Some(s) = &res.structured_content {
        text.push(s.to_string());
    }
    text.join("\n")
}

/// Counts audit events of `kind`.
async fn count(app: &TestApp, kind: &str) -> i64 {
    emisar::with_pool!(&app.db, pool => sqlx::query_scalar::<_, i64>("SELECT count(*) FROM audit_events WHERE kind = $1").bind(kind).fetch_one(pool).await).unwrap()
}

async fn ready(app: &TestApp) -> Result<(), String> {
    let res = reqwest::get(format!("{}/readyz", app.base_url()))
        .await
        .map_err(|e| e.to_string())?;
    let status = res.status().as_u16();
    let body = res.text().await.unwrap_or_default();
    (status == 200)
        .then_some(())
        .ok_or_else(|| format!("/readyz answered {status}: {body}"))
}

/// Tallies and failures, per entry point.
#[derive(Default)]
struct Report {
    tried: BTreeMap<&'static str, usize>,
    failures: Vec<String>,
}

impl Report {
    fn tried(&mut self, section: &'static str) {
        *self.tried.entry(section).or_default() += 1;
    }

    fn fail(&mut self, section: &'static str, what: String) {
        let mut what = what;
        if what.len() > 1000 {
            let cut = (0..=1000)
                .rev()
                .find(|i| what.is_char_boundary(*i))
                .unwrap();
            what.truncate(cut);
            what.push('…');
        }
        self.failures.push(format!("[{section}] {what}"));
    }

    /// A 4xx answer with a JSON `error` message, or a 2xx JSON-RPC error.
    fn expect_clear(&mut self, section: &'static str, case: &str, status: u16, body: &str) {
        self.tried(section);
        // A server that refuses an oversized body by its Content-Length answers 413 and closes
        // the connection without reading it; a client still writing then sees the connection
        // closed before it can read the answer. That is a refusal too (nothing was read).
        if status == 0 && case.contains(" MB body") && body.contains("closed") {
            return;
        }
        let has_message = serde_json::from_str::<Value>(body).is_ok_and(|v| {
            v["error"].as_str().is_some_and(|m| !m.is_empty())
                || v["error"]["message"]
                    .as_str()
                    .is_some_and(|m| !m.is_empty())
        }) || body.contains("\"error\"")
            || body.contains("\"isError\":true");
        if !((400..500).contains(&status) || (status == 200 && has_message)) {
            self.fail(section, format!("{case}: answered {status} {body:.200}"));
        } else if !has_message && !(400..500).contains(&status) {
            self.fail(
                section,
                format!("{case}: no message in {status} {body:.200}"),
            );
        } else if (400..500).contains(&status) && body.trim().is_empty() {
            self.fail(section, format!("{case}: {status} with an empty body"));
        }
    }
}

async fn the_hostile_corpus_is_refused_clearly_audited_and_runs_nothing(backend: Backend) {
    let bin = tempfile::tempdir().unwrap();
    let exec_log = standins(bin.path());
    let (service_url, http_seen) = recording_service().await;
    let mut spec = RunnerSpec::new("node-1").allow("systemd_units", &["consul"]);
    spec.exec_path = bin.path().display().to_string();
    for pack in emisar::pack::PackSet::load(None).unwrap().packs() {
        if let Some(service) = &pack.service {
            spec = spec.service(service, &service_url);
        }
    }
    let app = spawn_app(
        backend,
        vec![spec],
        Options {
            rate_limit: Some((100_000, 100_000)),
            approval_wait_secs: Some(0),
            ..Default::default()
        },
    )
    .await;
    let mut report = Report::default();

    let started = std::time::Instant::now();
    mcp_tools(&app, &mut report, &exec_log, &http_seen).await;
    let mcp_took = started.elapsed();
    if let Err(e) = ready(&app).await {
        report.fail("mcp", format!("after the tool cases: {e}"));
    }
    let before = executions(&exec_log).len() + http_seen.lock().unwrap().len();
    json_rpc(&app, &mut report).await;
    portal(&app, &mut report).await;
    join(&app, &mut report).await;
    let after = executions(&exec_log).len() + http_seen.lock().unwrap().len();
    if after != before {
        report.fail(
            "http",
            format!("{} executions during the raw HTTP cases", after - before),
        );
    }
    runner(&app, &mut report, &exec_log).await;
    let all_took = started.elapsed();

    // Still ready, a good call still runs, and the audit log verifies.
    if let Err(e) = ready(&app).await {
        report.fail("end", e);
    }
    let client = app.mcp_client().await;
    let good = crate::mcp_calls::call(
        &client,
        "linux.uptime",
        json!({"runners": ["node-1"], "reason": "a good call after the hostile corpus"}),
    )
    .await;
    if good.is_error != Some(false) {
        report.fail("end", format!("a good call failed: {}", text_of(&good)));
    }
    client.cancel().await.unwrap();
    let verify = std::process::Command::new(env!("CARGO_BIN_EXE_emisar"))
        .args(["audit", "verify", "--database", &app.database_url])
        .output()
        .unwrap();
    let verdict = String::from_utf8_lossy(&verify.stdout).into_owned();
    if !verify.status.success() {
        let broken = broken_event(&app, &verdict).await;
        report.fail(
            "end",
            format!(
                "emisar audit verify failed {broken}: {}",
                if verdict.trim().is_empty() {
                    String::from_utf8_lossy(&verify.stderr).into_owned()
                } else {
                    verdict.trim().to_owned()
                }
            ),
        );
    }

    let total: usize = report.tried.values().sum();
    let held = total.saturating_sub(report.failures.len());
    eprintln!(
        "hostile corpus: {total} cases tried ({:?}), {held} held, {} failed, in {:.0?} ({:.0?} over MCP)",
        report.tried,
        report.failures.len(),
        all_took,
        mcp_took
    );
    assert!(
        report.failures.is_empty(),
        "{} of {total} hostile cases did not hold:\n{}",
        report.failures.len(),
        report.failures.join("\n")
    );
}

crate::both_backends!(the_hostile_corpus_is_refused_clearly_audited_and_runs_nothing);

/// The event `emisar audit verify` reported broken, as stored, so a failure says which case
/// broke the chain.
async fn broken_event(app: &TestApp, verdict: &str) -> String {
    let Some(seq) = verdict
        .split("at seq ")
        .nth(1)
        .and_then(|rest| rest.split(':').next())
        .and_then(|n| n.trim().parse::<i64>().ok())
    else {
        return String::new();
    };
    let sql = app
        .db
        .sql("SELECT kind, tool, args::text, detail::text FROM audit_events WHERE seq = $1");
    let row = emisar::with_pool!(&app.db, pool => sqlx::query_as::<_, (String, Option<String>, Option<String>, Option<String>)>(
        sql
    ).bind(seq).fetch_one(pool).await);
    let Ok((kind, tool, args, detail)) = row else {
        return format!("(event {seq} could not be read)");
    };
    let cut = |t: Option<String>| {
        let t = t.unwrap_or_default();
        t.chars().take(300).collect::<String>()
    };
    format!(
        "[event {seq}: {kind} {} args {} detail {}]",
        tool.unwrap_or_default(),
        cut(args),
        cut(detail)
    )
}

/// Every param of every tool, over a real MCP client.
async fn mcp_tools(app: &TestApp, report: &mut Report, exec_log: &Path, http_seen: &Seen) {
    let client = app.mcp_client().await;
    let tools = client.list_all_tools().await.unwrap();
    assert!(
        tools.len() > 10,
        "the stock packs are listed: {}",
        tools.len()
    );
    let cases = corpus(&tools);
    let (refused, accepted): (Vec<&Case>, Vec<&Case>) = cases.iter().partition(|c| c.refused);
    let rejected_before = count(app, "tool.rejected").await;

    // The cases the schema or the door refuses: all of them at once, a few in flight.
    let answers: Vec<(&Case, Result<CallToolResult, String>)> =
        futures::stream::iter(refused.iter().map(|case| {
            let client = &client;
            async move {
                let res = client
                    .call_tool(
                        CallToolRequestParams::new(case.tool.clone())
                            .with_arguments(case.args.clone()),
                    )
                    .await
                    .map_err(|e| e.to_string());
                (*case, res)
            }
        }))
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;
    for (case, res) in &answers {
        report.tried("mcp refused");
        let name = format!("{} {}", case.tool, case.label);
        match res {
            Ok(r) if r.is_error == Some(true) => {
                let text = text_of(r);
                let named = match &case.field {
                    Some(f) => text.contains(f.as_str()),
                    None => text.contains("does not take"),
                };
                if !named {
                    report.fail(
                        "mcp refused",
                        format!("{name}: the error does not name the field: {text:.300}"),
                    );
                }
                if text.len() > 64 * 1024 {
                    report.fail(
                        "mcp refused",
                        format!("{name}: a {} byte error", text.len()),
                    );
                }
            }
            Ok(r) => report.fail(
                "mcp refused",
                format!("{name}: not refused: {:.300}", text_of(r)),
            ),
            Err(e) => report.fail("mcp refused", format!("{name}: protocol error: {e:.300}")),
        }
    }
    let rejected = count(app, "tool.rejected").await - rejected_before;
    if rejected != refused.len() as i64 {
        report.fail(
            "mcp refused",
            format!(
                "{} refusals but {rejected} tool.rejected events",
                refused.len()
            ),
        );
    }
    let ran = executions(exec_log);
    let fetched = http_seen.lock().unwrap().clone();
    if !ran.is_empty() || !fetched.is_empty() {
        report.fail(
            "mcp refused",
            format!("refused calls executed: {ran:?} {fetched:?}"),
        );
    }

    // The cases whose values the schema accepts: they may run, as data, and never as a write.
    let called_before = count(app, "tool.called").await
        + count(app, "tool.rejected").await
        + count(app, "approval.requested").await;
    let answers: Vec<(&Case, Result<CallToolResult, String>)> =
        futures::stream::iter(accepted.iter().map(|case| {
            let client = &client;
            async move {
                let res = client
                    .call_tool(
                        CallToolRequestParams::new(case.tool.clone())
                            .with_arguments(case.args.clone()),
                    )
                    .await
                    .map_err(|e| e.to_string());
                (*case, res)
            }
        }))
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;
    for (case, res) in &answers {
        report.tried("mcp accepted as data");
        if let Err(e) = res {
            report.fail(
                "mcp accepted as data",
                format!("{} {}: protocol error: {e:.300}", case.tool, case.label),
            );
        }
    }
    let audited = count(app, "tool.called").await
        + count(app, "tool.rejected").await
        + count(app, "approval.requested").await
        - called_before;
    if audited < accepted.len() as i64 {
        report.fail(
            "mcp accepted as data",
            format!("{} calls but {audited} audited", accepted.len()),
        );
    }
    for request in http_seen.lock().unwrap().iter() {
        if request.starts_with("PUT ") || request.starts_with("DELETE ") {
            report.fail(
                "mcp accepted as data",
                format!("a write ran without approval: {request:.300}"),
            );
        }
        let path = request
            .split(' ')
            .nth(1)
            .unwrap_or_default()
            .split('?')
            .next()
            .unwrap_or_default();
        let climbs = path.split('/').any(|segment| {
            let decoded = percent_decode(segment);
            decoded == "." || decoded == ".." || decoded.contains('/')
        });
        if climbs || request.contains(['\r', '\n', '\0']) {
            report.fail(
                "mcp accepted as data",
                format!("a value left its path segment: {request:.300}"),
            );
        }
    }
    for argv in executions(exec_log) {
        let write = argv.iter().any(|a| {
            a == "restart"
                || a == "reload"
                || a.starts_with("configure")
                || a.contains("neighbor") && a.contains("shutdown")
        }) || argv.contains(&"install".to_owned()) && !argv.contains(&"-s".to_owned());
        if write {
            report.fail(
                "mcp accepted as data",
                format!("a write ran without approval: {argv:?}"),
            );
        }
    }
    eprintln!(
        "hostile corpus over MCP: {} tools, {} refused by schema or door, {} accepted as data",
        tools.len(),
        refused.len(),
        accepted.len()
    );
    client.cancel().await.unwrap();
}

fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

/// An MCP session opened by hand, for raw JSON-RPC.
struct Raw {
    http: reqwest::Client,
    url: String,
    token: String,
    session: String,
}

const ACCEPT: &str = "application/json, text/event-stream";

impl Raw {
    async fn open(app: &TestApp) -> Raw {
        let http = one_connection_per_request();
        let res = http
            .post(&app.mcp_url)
            .bearer_auth(&app.token)
            .header("content-type", "application/json")
            .header("accept", ACCEPT)
            .body(
                json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                    "protocolVersion": "2025-06-18", "capabilities": {},
                    "clientInfo": {"name": "hostile", "version": "0"}}})
                .to_string(),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
        let session = res.headers()["mcp-session-id"].to_str().unwrap().to_owned();
        let _ = res.text().await;
        let raw = Raw {
            http,
            url: app.mcp_url.clone(),
            token: app.token.clone(),
            session,
        };
        let (status, _) = raw
            .send(
                json!({"jsonrpc": "2.0", "method": "notifications/initialized"})
                    .to_string()
                    .into_bytes(),
                Some("application/json"),
                Some(ACCEPT),
                Some(&raw.session.clone()),
            )
            .await;
        assert_eq!(status, 202);
        raw
    }

    async fn send(
        &self,
        body: Vec<u8>,
        content_type: Option<&str>,
        accept: Option<&str>,
        session: Option<&str>,
    ) -> (u16, String) {
        let mut req = self
            .http
            .post(&self.url)
            .bearer_auth(&self.token)
            .header("mcp-protocol-version", "2025-06-18")
            .timeout(Duration::from_secs(60))
            .body(body);
        if let Some(ct) = content_type {
            req = req.header("content-type", ct);
        }
        if let Some(a) = accept {
            req = req.header("accept", a);
        }
        if let Some(s) = session {
            req = req.header("mcp-session-id", s);
        }
        match req.send().await {
            Ok(res) => {
                let status = res.status().as_u16();
                (status, res.text().await.unwrap_or_default())
            }
            Err(e) => {
                let closed = format!("{e:?}").contains("BrokenPipe")
                    || format!("{e:?}").contains("ConnectionReset");
                let what = if closed {
                    "connection closed"
                } else {
                    "no answer"
                };
                (0, format!("{what}: {e}"))
            }
        }
    }

    /// A JSON-RPC request in this session, as a client would send it.
    async fn rpc(&self, body: &str) -> (u16, String) {
        self.send(
            body.as_bytes().to_vec(),
            Some("application/json"),
            Some(ACCEPT),
            Some(&self.session),
        )
        .await
    }
}

/// A raw request: its label, body, and content type, accept and session headers.
type HeaderCase<'a> = (
    &'a str,
    Vec<u8>,
    Option<&'a str>,
    Option<&'a str>,
    Option<&'a str>,
);

/// Malformed JSON-RPC over raw HTTP.
async fn json_rpc(app: &TestApp, report: &mut Report) {
    const S: &str = "json-rpc";
    let raw = Raw::open(app).await;
    let big = "x".repeat(MIB);
    let call = |name: &str, args: &str| {
        format!(
            r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{"name":{name},"arguments":{args}}}}}"#
        )
    };
    let good_args = r#"{"runners":["node-1"],"reason":"raw"}"#;
    let bodies: Vec<(&str, String)> = vec![
        ("invalid JSON", "{".into()),
        ("not an object", "[1, 2, 3]".into()),
        ("a bare string", "\"tools/list\"".into()),
        ("jsonrpc 1.0", r#"{"jsonrpc":"1.0","id":2,"method":"tools/list"}"#.into()),
        ("no jsonrpc", r#"{"id":2,"method":"tools/list"}"#.into()),
        ("jsonrpc a number", r#"{"jsonrpc":2.0,"id":2,"method":"tools/list"}"#.into()),
        ("1e308 id", r#"{"jsonrpc":"2.0","id":1e308,"method":"tools/list"}"#.into()),
        ("2^64 id", r#"{"jsonrpc":"2.0","id":18446744073709551616,"method":"tools/list"}"#.into()),
        ("-2^63-1 id", r#"{"jsonrpc":"2.0","id":-9223372036854775809,"method":"tools/list"}"#.into()),
        ("object id", r#"{"jsonrpc":"2.0","id":{"a":1},"method":"tools/list"}"#.into()),
        ("batch", r#"[{"jsonrpc":"2.0","id":3,"method":"tools/list"},{"jsonrpc":"2.0","id":4,"method":"tools/list"}]"#.into()),
        ("empty batch", "[]".into()),
        ("unknown method", r#"{"jsonrpc":"2.0","id":5,"method":"tools/nope"}"#.into()),
        ("method a number", r#"{"jsonrpc":"2.0","id":5,"method":5}"#.into()),
        ("params a string", r#"{"jsonrpc":"2.0","id":6,"method":"tools/call","params":"x"}"#.into()),
        ("params an array", r#"{"jsonrpc":"2.0","id":6,"method":"tools/call","params":[1]}"#.into()),
        ("params null", r#"{"jsonrpc":"2.0","id":6,"method":"tools/call","params":null}"#.into()),
        ("name a number", call("5", good_args)),
        ("name null", call("null", good_args)),
        ("name with NUL", call(r#""traefik.ping\u0000""#, good_args)),
        ("name with CRLF", call(r#""traefik.ping\r\nX: 1""#, good_args)),
        ("name of 1 MiB", call(&format!("\"{big}\""), good_args)),
        ("no name", r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"arguments":{}}}"#.into()),
        ("arguments a string", call(r#""traefik.ping""#, r#""x""#)),
        ("arguments an array", call(r#""traefik.ping""#, "[1]")),
        ("arguments a number", call(r#""traefik.ping""#, "5")),
        ("exact -2^63-1 argument", call(r#""traefik.ping""#, r#"{"runners":["node-1"],"reason":"raw","n":-9223372036854775809}"#)),
        ("exact 2^64 argument", call(r#""traefik.ping""#, r#"{"runners":["node-1"],"reason":"raw","n":18446744073709551616}"#)),
        ("long fraction argument", call(r#""traefik.ping""#, r#"{"runners":["node-1"],"reason":"raw","n":0.1000000000000000055511151231257827}"#)),
        ("duplicate keys", call(r#""traefik.ping""#, r#"{"runners":["node-1"],"reason":"raw","reason":"\u0000"}"#)),
        ("deep nesting", call(r#""traefik.ping""#, &format!("{}1{}", "[".repeat(10_000), "]".repeat(10_000)))),
        ("lone surrogate", call(r#""traefik.ping""#, r#"{"runners":["node-1"],"reason":"\ud800"}"#)),
    ];
    for (label, body) in &bodies {
        let (status, text) = raw.rpc(body).await;
        report.expect_clear(S, label, status, &text);
    }
    // Well-formed requests with odd ids (JSON-RPC allows any string or number): answered like
    // any other, the id echoed, never a 5xx.
    for (label, body) in [
        (
            "1 MiB string id",
            format!(r#"{{"jsonrpc":"2.0","id":"{big}","method":"tools/list"}}"#),
        ),
        (
            "-0.0 id",
            r#"{"jsonrpc":"2.0","id":-0.0,"method":"tools/list"}"#.into(),
        ),
    ] {
        report.tried(S);
        let (status, text) = raw.rpc(&body).await;
        if !(status == 200 && text.contains("\"result\"") || (400..500).contains(&status)) {
            report.fail(S, format!("{label}: answered {status} {text:.200}"));
        }
    }
    let ping = call(r#""traefik.ping""#, r#"{"runners":["node-1"]}"#);
    let session = raw.session.clone();
    let (s200, s8k) = ("s".repeat(200), "s".repeat(8192));
    let headers: Vec<HeaderCase> = vec![
        (
            "invalid UTF-8",
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\xff}".to_vec(),
            Some("application/json"),
            Some(ACCEPT),
            Some(&session),
        ),
        (
            "text/plain",
            ping.clone().into_bytes(),
            Some("text/plain"),
            Some(ACCEPT),
            Some(&session),
        ),
        (
            "application/xml",
            b"<call/>".to_vec(),
            Some("application/xml"),
            Some(ACCEPT),
            Some(&session),
        ),
        (
            "no content type",
            ping.clone().into_bytes(),
            None,
            Some(ACCEPT),
            Some(&session),
        ),
        (
            "multipart",
            ping.clone().into_bytes(),
            Some("multipart/form-data; boundary=x"),
            Some(ACCEPT),
            Some(&session),
        ),
        (
            "no accept",
            ping.clone().into_bytes(),
            Some("application/json"),
            None,
            Some(&session),
        ),
        (
            "accept html",
            ping.clone().into_bytes(),
            Some("application/json"),
            Some("text/html"),
            Some(&session),
        ),
        (
            "10 MB body",
            format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"tools/list","x":"{}"}}"#,
                "y".repeat(10 * 1000 * 1000)
            )
            .into_bytes(),
            Some("application/json"),
            Some(ACCEPT),
            Some(&session),
        ),
        (
            "no session",
            ping.clone().into_bytes(),
            Some("application/json"),
            Some(ACCEPT),
            None,
        ),
        (
            "unknown session",
            ping.clone().into_bytes(),
            Some("application/json"),
            Some(ACCEPT),
            Some("00000000-0000-4000-8000-000000000000"),
        ),
        (
            "200-character session",
            ping.clone().into_bytes(),
            Some("application/json"),
            Some(ACCEPT),
            Some(&s200),
        ),
        (
            "8 KiB session",
            ping.clone().into_bytes(),
            Some("application/json"),
            Some(ACCEPT),
            Some(&s8k),
        ),
    ];
    for (label, body, ct, accept, session) in headers {
        let (status, text) = raw.send(body, ct, accept, session).await;
        report.expect_clear(S, label, status, &text);
    }
    // Header bytes reqwest will not send as text: non-ASCII in the session id.
    let res = raw
        .http
        .post(&raw.url)
        .bearer_auth(&raw.token)
        .header("content-type", "application/json")
        .header("accept", ACCEPT)
        .header(
            "mcp-session-id",
            reqwest::header::HeaderValue::from_bytes(b"sess\xc3\xa9\xff").unwrap(),
        )
        .body(ping.clone())
        .send()
        .await
        .unwrap();
    let status = res.status().as_u16();
    report.expect_clear(S, "non-ASCII session", status, &res.text().await.unwrap());
    if let Err(e) = ready(app).await {
        report.fail(S, format!("after the raw JSON-RPC cases: {e}"));
    }
}

/// The portal's JSON API, unauthenticated (login) and as a logged-in approver.
async fn portal(app: &TestApp, report: &mut Report) {
    const S: &str = "portal";
    let password = add_user(app, "hostile-approver", Role::Approver).await;
    let person = Portal::login(app, "hostile-approver", &password).await;
    let http = one_connection_per_request();
    let base = app.base_url();
    // Login bodies, from no one in particular.
    let logins: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "NUL name",
            json!({"name": "a\u{0}b", "password": "x"})
                .to_string()
                .into_bytes(),
            "application/json",
        ),
        (
            "2 MB name",
            json!({"name": "n".repeat(2_000_000), "password": "x"})
                .to_string()
                .into_bytes(),
            "application/json",
        ),
        (
            "3 MB body",
            json!({"name": "n".repeat(3_000_000), "password": "x"})
                .to_string()
                .into_bytes(),
            "application/json",
        ),
        (
            "CRLF name",
            json!({"name": "a\r\nb", "password": "x"})
                .to_string()
                .into_bytes(),
            "application/json",
        ),
        (
            "bidi name",
            json!({"name": "\u{202e}nimda", "password": "x"})
                .to_string()
                .into_bytes(),
            "application/json",
        ),
        (
            "dot-dot name",
            json!({"name": "..", "password": "x"})
                .to_string()
                .into_bytes(),
            "application/json",
        ),
        (
            "2 MB password",
            json!({"name": "hostile-approver", "password": "p".repeat(2_000_000)})
                .to_string()
                .into_bytes(),
            "application/json",
        ),
        (
            "NUL password",
            json!({"name": "hostile-approver", "password": "a\u{0}"})
                .to_string()
                .into_bytes(),
            "application/json",
        ),
        (
            "name a number",
            br#"{"name": 5, "password": "x"}"#.to_vec(),
            "application/json",
        ),
        (
            "name null",
            br#"{"name": null, "password": "x"}"#.to_vec(),
            "application/json",
        ),
        (
            "extra field",
            br#"{"name": "a", "password": "x", "role": "admin"}"#.to_vec(),
            "application/json",
        ),
        ("invalid JSON", b"{".to_vec(), "application/json"),
        ("array", b"[]".to_vec(), "application/json"),
        (
            "invalid UTF-8",
            b"{\"name\": \"\xff\", \"password\": \"x\"}".to_vec(),
            "application/json",
        ),
        (
            "text/plain",
            br#"{"name": "a", "password": "x"}"#.to_vec(),
            "text/plain",
        ),
        (
            "form",
            b"name=a&password=x".to_vec(),
            "application/x-www-form-urlencoded",
        ),
    ];
    for (label, body, ct) in logins {
        let (status, text) = answer(
            http.post(format!("{base}/api/login"))
                .header("content-type", ct)
                .body(body),
        )
        .await;
        report.expect_clear(S, &format!("login {label}"), status, &text);
    }
    // Approve and deny with hostile ids (as they appear in a path) and hostile notes.
    let unknown = "00000000-0000-4000-8000-000000000000";
    let ids = [
        "%00",
        "..",
        "..%2F..%2Fetc%2Fpasswd",
        "%2e%2e",
        "x".repeat(2000).leak() as &str,
        "'%20OR%201=1%20--",
        "00000000-0000-4000-8000-00000000000G",
        "00000000-0000-4000-8000-000000000000%00",
        "00000000-0000-4000-8000-00000000000A",
        "%E2%80%AE",
        "%0D%0AX:%201",
    ];
    for id in ids {
        for path in [
            format!("/api/approvals/{id}"),
            format!("/api/approvals/{id}/approve"),
            format!("/api/approvals/{id}/deny"),
        ] {
            let (status, body) = if path.ends_with("/approve") || path.ends_with("/deny") {
                person.post(&path, json!({"note": "no"}), true).await
            } else {
                person.get(&path).await
            };
            report.expect_clear(S, &format!("{path:.80}"), status, &body.to_string());
        }
    }
    let notes: Vec<(&str, Value)> = vec![
        ("NUL note", json!({"note": "no\u{0}"})),
        ("bidi note", json!({"note": "fine\u{202e}"})),
        ("zero-width note", json!({"note": "a\u{200b}"})),
        ("escape note", json!({"note": "\u{1b}[2J"})),
        ("3000-character note", json!({"note": "n".repeat(3000)})),
        ("1 MiB note", json!({"note": "n".repeat(MIB)})),
        ("note a number", json!({"note": 5})),
        ("note an object", json!({"note": {"a": 1}})),
        ("extra field", json!({"note": "x", "approve": true})),
        ("array body", json!(["x"])),
        ("plain note, unknown id", json!({"note": "no"})),
    ];
    for (label, body) in notes {
        for verb in ["approve", "deny"] {
            let (status, answer) = person
                .post(
                    &format!("/api/approvals/{unknown}/{verb}"),
                    body.clone(),
                    true,
                )
                .await;
            report.expect_clear(S, &format!("{verb} {label}"), status, &answer.to_string());
        }
    }
    let (status, answer) = person
        .post(
            &format!("/api/approvals/{unknown}/deny"),
            json!({"note": "no"}),
            false,
        )
        .await;
    report.expect_clear(S, "deny without CSRF", status, &answer.to_string());
    if status != 403 {
        report.fail(S, format!("deny without CSRF: {status}"));
    }
    for query in [
        "/api/approvals?state=%00",
        "/api/approvals?state=pending%0D%0A",
        "/api/approvals?limit=-1",
        "/api/approvals?limit=1e308",
        "/api/approvals?limit=99999999999999999999",
        "/api/approvals?extra=1",
        "/api/audit?actor=%00",
        "/api/audit?tool=%E2%80%AE",
        "/api/audit?kind=x%0Ay",
        "/api/audit?since=yesterday",
        "/api/audit?until=%00",
        "/api/audit?cursor=-1",
        "/api/audit?cursor=1e308",
        "/api/audit?limit=0",
        "/api/audit?limit=99999999999999999999",
        "/api/audit?actor=LONG",
        "/api/audit/export?approval_id=%00",
    ] {
        let query = query.replace("LONG", &"a".repeat(300));
        let (status, answer) = person.get(&query).await;
        report.expect_clear(S, &format!("{query:.80}"), status, &answer.to_string());
    }
    if let Err(e) = ready(app).await {
        report.fail(S, format!("after the portal cases: {e}"));
    }
}

/// The join and heartbeat endpoints, with and without a real join token.
async fn join(app: &TestApp, report: &mut Report) {
    const S: &str = "join";
    // A real token granting the label the good body asks for, so the cases reach the
    // request checks; a refused join spends none of its uses.
    let (_, whole) = app
        .join_token(emisar::server::fleet::JoinTokenSpec {
            labels: BTreeMap::from([("role".to_owned(), "edge".to_owned())]),
            ..emisar::server::fleet::JoinTokenSpec::once(Duration::from_secs(600))
        })
        .await;
    let token = emisar::protocol::JoinToken::parse(&whole)
        .unwrap()
        .secret()
        .to_owned();
    let http = one_connection_per_request();
    let url = format!("{}/api/runners/join", app.base_url());
    let packs: BTreeMap<String, String> = emisar::pack::PackSet::load(None)
        .unwrap()
        .packs()
        .map(|p| (p.name.clone(), p.digest.clone()))
        .collect();
    let body = |name: Value, url: Value, labels: Value, packs: Value| {
        json!({"name": name, "url": url, "labels": labels, "packs": packs}).to_string()
    };
    let (n, u, l, p) = (
        json!("hostile-joiner"),
        json!("http://127.0.0.1:9"),
        json!({"role": "edge"}),
        json!(packs),
    );
    let mut cases: Vec<(String, String)> = Vec::new();
    for (label, name) in hostile_strings().into_iter().chain(wrong_types()) {
        if name
            .as_str()
            .is_some_and(emisar::util::input::is_identifier)
        {
            // A well-formed name would register a runner: not hostile here.
            continue;
        }
        cases.push((
            format!("name {label}"),
            body(name, u.clone(), l.clone(), p.clone()),
        ));
    }
    for (label, bad_url) in [
        ("javascript", json!("javascript:alert(1)")),
        ("file", json!("file:///etc/passwd")),
        ("ftp", json!("ftp://127.0.0.1/")),
        ("space", json!("http://a b/")),
        ("CRLF", json!("http://127.0.0.1:9/\r\nHost: evil")),
        ("NUL", json!("http://127.0.0.1:9/\u{0}")),
        ("bidi", json!("http://127.0.0.1:9/\u{202e}")),
        ("no host", json!("http://")),
        ("1 MiB", json!(format!("http://{}", "a".repeat(MIB)))),
        ("empty", json!("")),
        ("a number", json!(5)),
    ] {
        cases.push((
            format!("url {label}"),
            body(n.clone(), bad_url, l.clone(), p.clone()),
        ));
    }
    for (label, labels) in [
        ("NUL key", json!({"a\u{0}": "b"})),
        ("NUL value", json!({"a": "b\u{0}"})),
        ("CRLF value", json!({"a": "b\r\nc"})),
        ("1 MiB value", json!({"a": "v".repeat(MIB)})),
        ("dot-dot key", json!({"..": "x"})),
        ("value a number", json!({"a": 5})),
        ("an array", json!(["a"])),
    ] {
        cases.push((
            format!("labels {label}"),
            body(n.clone(), u.clone(), labels, p.clone()),
        ));
    }
    for (label, bad) in [
        ("NUL pack name", json!({"traefik\u{0}": "x"})),
        ("bidi pack name", json!({"\u{202e}traefik": "x"})),
        ("1 MiB digest", json!({"traefik": "d".repeat(MIB)})),
        ("NUL digest", json!({"traefik": "\u{0}"})),
        ("digest a number", json!({"traefik": 5})),
    ] {
        cases.push((
            format!("packs {label}"),
            body(n.clone(), u.clone(), l.clone(), bad),
        ));
    }
    cases.push(("invalid JSON".into(), "{".into()));
    cases.push((
        "extra field".into(),
        json!({"name": "x", "url": "http://127.0.0.1:9", "packs": {}, "admin": true}).to_string(),
    ));
    cases.push((
        "missing packs".into(),
        json!({"name": "x", "url": "http://127.0.0.1:9"}).to_string(),
    ));
    for (label, body) in &cases {
        let (status, text) = answer(
            http.post(&url)
                .bearer_auth(&token)
                .header("content-type", "application/json")
                .body(body.clone()),
        )
        .await;
        report.expect_clear(S, label, status, &text);
    }
    // Hostile tokens, for join and heartbeat, with a well-formed body.
    let good = body(n.clone(), u.clone(), l.clone(), p.clone());
    for (label, bad) in [
        ("garbage", "garbage".to_owned()),
        ("8 KiB", "emj_".to_owned() + &"a".repeat(8192)),
        ("runner prefix", "emr_abc".to_owned()),
        ("agent token", app.token.clone()),
    ] {
        for endpoint in ["join", "heartbeat"] {
            let (status, text) = answer(
                http.post(format!("{}/api/runners/{endpoint}", app.base_url()))
                    .bearer_auth(&bad)
                    .header("content-type", "application/json")
                    .body(good.clone()),
            )
            .await;
            report.expect_clear(
                S,
                &format!("{endpoint} with a {label} token"),
                status,
                &text,
            );
        }
    }
    let (status, text) = answer(
        http.post(&url)
            .header("content-type", "application/json")
            .body(good),
    )
    .await;
    report.expect_clear(S, "join without a token", status, &text);
    let joined: i64 = emisar::with_pool!(&app.db, pool => sqlx::query_scalar::<_, i64>("SELECT count(*) FROM runners").fetch_one(pool).await).unwrap();
    if joined != 0 {
        report.fail(S, format!("{joined} runners joined with hostile requests"));
    }
    if let Err(e) = ready(app).await {
        report.fail(S, format!("after the join cases: {e}"));
    }
}

/// A client that opens a connection per request. The corpus sends bodies the server refuses
/// before reading them all (a 3 MB login, a 10 MB JSON-RPC body); the server then closes that
/// connection, and a pooled client that picks it up again for the next case in that instant
/// fails to send, which would count a held case as failed.
fn one_connection_per_request() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap()
}

/// The status and body of `req`'s answer; status 0 when there was none (the error says
/// whether the connection was closed while the request was being sent).
async fn answer(req: reqwest::RequestBuilder) -> (u16, String) {
    match req.send().await {
        Ok(res) => {
            let status = res.status().as_u16();
            (status, res.text().await.unwrap_or_default())
        }
        Err(e) => {
            let closed = format!("{e:?}").contains("BrokenPipe")
                || format!("{e:?}").contains("ConnectionReset");
            let what = if closed {
                "connection closed"
            } else {
                "no answer"
            };
            (0, format!("{what}: {e}"))
        }
    }
}

/// Signs `claims` with the key at `key`.
fn sign(key: &Path, claims: &CallClaims) -> String {
    CallSigner::from_file(key).unwrap().sign(claims).unwrap()
}

/// The runner's execute endpoint, called directly.
async fn runner(app: &TestApp, report: &mut Report, exec_log: &Path) {
    const S: &str = "runner";
    let url = format!("{}/v1/call", app.runner_urls["node-1"]);
    let http = one_connection_per_request();
    let packs = emisar::pack::PackSet::load(None).unwrap();
    let digest = packs.pack("linux").unwrap().digest.clone();
    let request = |args: Value| CallRequest {
        tool: "linux.unit_status".into(),
        args: args.as_object().unwrap().clone(),
        mode: Mode::Execute,
        preview: None,
        preview_seal: None,
        raw: false,
        approval: None,
        witnessed: None,
        secret_salt: None,
        wave: None,
        decision: None,
        grant: None,
    };
    let claims_for = |req: &CallRequest| {
        let t = now();
        CallClaims {
            iss: ISSUER.into(),
            aud: "node-1".into(),
            iat: t,
            exp: t + 30,
            purpose: Purpose::Call,
            jti: uuid::Uuid::new_v4().to_string(),
            call_id: "hostile-corpus".into(),
            tool: req.tool.clone(),
            request_sha256: req.digest(),
            pack_sha256: digest.clone(),
            approval_id: None,
            lowered_by_policy: None,
        }
    };
    let other = tempfile::tempdir().unwrap();
    let (other_key, other_pub) = (other.path().join("k"), other.path().join("p"));
    emisar::protocol::signing::write_keypair(&other_key, &other_pub).unwrap();
    let good = request(json!({"unit": "consul"}));
    let body = serde_json::to_vec(&good).unwrap();
    let ran_before = executions(exec_log).len();

    let mut cases: Vec<(String, Option<String>, Vec<u8>)> = vec![
        ("unsigned".into(), None, body.clone()),
        ("garbage token".into(), Some("garbage".into()), body.clone()),
        ("8 KiB token".into(), Some("e".repeat(8192)), body.clone()),
        (
            "another key".into(),
            Some(sign(&other_key, &claims_for(&good))),
            body.clone(),
        ),
    ];
    let mut c = claims_for(&good);
    c.aud = "another-runner".into();
    cases.push((
        "another audience".into(),
        Some(sign(&app.private_key, &c)),
        body.clone(),
    ));
    let mut c = claims_for(&good);
    c.iat -= 600;
    c.exp -= 600;
    cases.push((
        "expired".into(),
        Some(sign(&app.private_key, &c)),
        body.clone(),
    ));
    let mut c = claims_for(&good);
    c.exp = c.iat + 24 * 3600;
    cases.push((
        "a day long".into(),
        Some(sign(&app.private_key, &c)),
        body.clone(),
    ));
    let mut c = claims_for(&good);
    c.request_sha256 = request(json!({"unit": "sshd"})).digest();
    cases.push((
        "signed for another request".into(),
        Some(sign(&app.private_key, &c)),
        body.clone(),
    ));
    let mut c = claims_for(&good);
    c.pack_sha256 = "0".repeat(64);
    cases.push((
        "another pack digest".into(),
        Some(sign(&app.private_key, &c)),
        body.clone(),
    ));
    let signed_raw = |label: &str, raw: Vec<u8>| {
        (
            label.to_owned(),
            Some(sign(&app.private_key, &claims_for(&good))),
            raw,
        )
    };
    cases.push(signed_raw("invalid JSON", b"{".to_vec()));
    cases.push(signed_raw(
        "wrong types",
        br#"{"tool": 5, "args": [], "mode": "x"}"#.to_vec(),
    ));
    cases.push(signed_raw(
        "10 MB body",
        format!(
            r#"{{"tool":"linux.unit_status","args":{{"unit":"{}"}},"mode":"execute"}}"#,
            "u".repeat(10 * 1000 * 1000)
        )
        .into_bytes(),
    ));
    // Well-signed requests whose arguments are hostile: the runner's own schema refuses them.
    // A value the `unit` schema accepts (`NaN` is a fine unit name) is not hostile to it; the
    // MCP cases already show such values arrive as one argv element.
    let unit_schema =
        emisar::pack::input_schema(packs.tool("linux.unit_status").unwrap())["properties"]["unit"]
            .as_object()
            .unwrap()
            .clone();
    let unit_ok = validator(&unit_schema);
    for (label, value) in hostile_strings()
        .into_iter()
        .chain(hostile_numbers())
        .chain(wrong_types())
    {
        if unit_ok.is_valid(&value) {
            continue;
        }
        let req = request(json!({"unit": value}));
        let Ok(raw) = serde_json::to_vec(&req) else {
            continue;
        };
        cases.push((
            format!("unit = {label}"),
            Some(sign(&app.private_key, &claims_for(&req))),
            raw,
        ));
    }
    let unknown = CallRequest {
        tool: "linux.nope".into(),
        ..request(json!({}))
    };
    cases.push((
        "unknown tool".into(),
        Some(sign(&app.private_key, &claims_for(&unknown))),
        serde_json::to_vec(&unknown).unwrap(),
    ));
    // A risk:high execution without an approval id.
    let restart = CallRequest {
        tool: "linux.systemctl_restart".into(),
        ..request(json!({"unit": "consul"}))
    };
    cases.push((
        "a write without an approval".into(),
        Some(sign(&app.private_key, &claims_for(&restart))),
        serde_json::to_vec(&restart).unwrap(),
    ));
    for (label, token, raw) in cases {
        let mut req = http
            .post(&url)
            .header("content-type", "application/json")
            .body(raw);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let (status, text) = answer(req).await;
        report.expect_clear(S, &label, status, &text);
    }
    if executions(exec_log).len() != ran_before {
        report.fail(
            S,
            format!(
                "refused calls executed: {:?}",
                &executions(exec_log)[ran_before..]
            ),
        );
    }
    // Replayed: the first use runs (a read), the same token again does not.
    let token = sign(&app.private_key, &claims_for(&good));
    for attempt in ["first use", "replayed"] {
        let res = http
            .post(&url)
            .bearer_auth(&token)
            .json(&good)
            .send()
            .await
            .unwrap();
        let status = res.status().as_u16();
        let text = res.text().await.unwrap();
        if attempt == "first use" {
            if status != 200 {
                report.fail(S, format!("a good signed call: {status} {text:.200}"));
            }
        } else {
            report.expect_clear(S, attempt, status, &text);
        }
    }
    if executions(exec_log).len() != ran_before + 1 {
        report.fail(
            S,
            format!(
                "the replay executed: {:?}",
                &executions(exec_log)[ran_before..]
            ),
        );
    }
}
