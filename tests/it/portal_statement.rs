//! The portal's check before a passkey signs (web/statement.js, the file the page loads), run
//! in Node against statements and digests the Rust code made: it reads back what
//! `Statement::text` writes, hashes arguments and preview values to the bytes of
//! `digest::canonical_json` (escapes, nesting, big whole numbers), computes the challenge as
//! `Statement::hash`, and refuses what `check_before_signing` (the terminal's check) refuses,
//! naming the same field; a number it cannot write back exactly is refused, never guessed.

use std::collections::BTreeMap;
use std::path::PathBuf;

use emisar::digest::{canonical_json, json_digest};
use emisar::protocol::approval::statement::hash_text;
use emisar::protocol::approval::{Plan, Statement};
use serde_json::{Value, json};

use crate::harness::tools::require;

const NOW: u64 = 1_796_551_200;
const EXPIRES: &str = "2026-12-06T10:20:00Z";
const TOOL: &str = "linux.systemctl_restart";

fn id_at(secs: u64) -> String {
    let ms = secs * 1000;
    format!(
        "{:08x}-{:04x}-7000-8000-000000000001",
        ms >> 16,
        ms & 0xffff
    )
}

/// A request as `GET /api/approvals/ID` answers it, built from its parts, with its statement.
struct Request {
    id: String,
    shown: Value,
    signed: Value,
    runners: Vec<&'static str>,
    /// Runner → the canonical text of the preview values it sealed.
    sealed: BTreeMap<&'static str, String>,
    required: u32,
    expires: String,
}

impl Request {
    /// Two runners, one with preview values, a secret param (signed as its commitment, shown
    /// sealed), and values whose canonical JSON is easy to get wrong.
    fn tricky() -> Request {
        let hard = "q\"uote \\ back\nnl\ttab\u{1}\u{1f}\u{7f} é 😀 \u{2028} </script>";
        let signed = json!({
            "unit": "consul", "token": format!("commit:sha256:{}", "e".repeat(64)),
            "text": hard, "k\"ey": [1, -2, 9_007_199_254_740_991_i64, true, null, {}, []],
            "nested": {"z": {"b": 2, "a": 1}, "A": "upper before lower", "_": 0},
        });
        let mut shown = signed.clone();
        shown["token"] = json!(format!("hmac-sha256:{}", "f".repeat(64)));
        let vars = json!({"state": "active", "restarts": 3, "note": hard, "ids": [-9_007_199_254_740_991_i64]});
        Request {
            id: id_at(NOW - 60),
            shown,
            signed,
            runners: vec!["hvn06", "hvn05"],
            sealed: [("hvn05", canonical_json(&vars))].into(),
            required: 2,
            expires: EXPIRES.into(),
        }
    }

    fn statement(&self) -> Statement {
        Statement {
            approval_id: self.id.clone(),
            tool: TOOL.into(),
            pack_sha256: "a".repeat(64),
            args_sha256: json_digest(&self.signed),
            runners: self
                .runners
                .iter()
                .map(|r| {
                    let digest = self
                        .sealed
                        .get(r)
                        .map(|t| json_digest(&serde_json::from_str(t).unwrap()));
                    ((*r).to_owned(), digest)
                })
                .collect(),
            plan: self.plan(),
            required: self.required,
            policy_sha256: "d".repeat(64),
            requester: "agent:deploy-bot".into(),
            expires_at: self.expires.clone(),
        }
    }

    /// A canary, then the rest: the runners in the order the request names them.
    fn plan(&self) -> Plan {
        let mut waves: Vec<Vec<String>> = vec![vec![self.runners[0].to_owned()]];
        let mut rest: Vec<String> = self.runners[1..].iter().map(|r| (*r).to_owned()).collect();
        rest.sort();
        if !rest.is_empty() {
            waves.push(rest);
        }
        Plan {
            waves,
            pause_secs: 30,
        }
    }

    fn response(&self) -> Value {
        let text = self.statement().text().unwrap();
        let preview: serde_json::Map<String, Value> = self
            .sealed
            .iter()
            .map(|(r, t)| ((*r).to_owned(), json!({"ok": true, "sealed_vars": t})))
            .collect();
        json!({
            "id": self.id, "tool": TOOL, "state": "pending",
            "args": self.shown, "runners": self.runners, "required_approvals": self.required,
            "requester": "agent:deploy-bot",
            "preview": preview, "plan": self.plan(),
            "statement": {
                "text": text, "args": self.signed,
                // What a lying server would send: the page must compute its own.
                "sha256": "0".repeat(64), "challenge": "AAAA",
            },
        })
    }
}

/// Runs web/statement.js over `cases` (id, the API's answer as text, now in ms) in Node.
fn run_in_node(cases: &[(String, String, u64)]) -> Vec<Value> {
    let cases: Vec<Value> = cases
        .iter()
        .map(|(id, response, now_ms)| json!({"id": id, "response": response, "now_ms": now_ms}))
        .collect();
    run_in_node_cases(&cases)
}

/// Runs web/statement.js over `cases` as tests/browser/statement_check.mjs reads them.
fn run_in_node_cases(cases: &[Value]) -> Vec<Value> {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let node = require("node/bin/node");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cases.json");
    std::fs::write(&file, serde_json::to_vec(cases).unwrap()).unwrap();
    let out = std::process::Command::new(node)
        .arg("tests/browser/statement_check.mjs")
        .arg(&file)
        .current_dir(&repo)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "node failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let results: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(results.len(), cases.len());
    results
}

#[test]
fn the_portal_reads_statements_and_digests_exactly_as_the_rust_writes_them() {
    let r = Request::tricky();
    let response = r.response();
    let text = response["statement"]["text"].as_str().unwrap().to_owned();
    let got = run_in_node(&[(r.id.clone(), response.to_string(), NOW * 1000)]);
    let ok = &got[0]["ok"];
    assert!(ok.is_object(), "refused: {}", got[0]);
    assert_eq!(ok["sha256"], hex::encode(hash_text(&text)), "{ok}");
    assert_eq!(ok["challenge_is_the_text_hash"], true, "{ok}");
    assert_eq!(ok["args"], canonical_json(&r.signed), "{ok}");
    assert_eq!(
        ok["runners"],
        json!([{"name": "hvn05", "preview": r.sealed["hvn05"]}, {"name": "hvn06", "preview": null}]),
    );
    assert_eq!(ok["required"], 2);
    assert_eq!(ok["expires"], EXPIRES);
}

/// An edit of a request: of its parts, before its statement is made (the statement then says
/// what the edit says), or of the API's answer, after (the statement says what it said).
enum Edit {
    Parts(fn(&mut Request)),
    Answer(fn(&mut Value)),
}

#[test]
fn the_portal_refuses_what_the_terminal_refuses_naming_the_field() {
    use Edit::{Answer, Parts};
    // Each: the edit, the clock, and what the refusal must say.
    let cases: Vec<(Edit, u64, &str)> = vec![
        // What the request shows is not what the statement covers.
        (
            Answer(|v| v["args"]["unit"] = json!("nomad")),
            NOW,
            "`args`: `unit` is \"consul\" in the statement and \"nomad\" in the request shown",
        ),
        (
            Answer(|v| v["statement"]["args"]["unit"] = json!("nomad")),
            NOW,
            "`args`: the statement's digest is not the digest",
        ),
        (
            Answer(|v| v["args"]["token"] = json!("plain")),
            NOW,
            "`args`: `token`",
        ),
        (
            Answer(|v| v["args"]["extra"] = json!(1)),
            NOW,
            "`args`: the statement covers other arguments",
        ),
        (
            Answer(|v| {
                let args = v["args"].as_object_mut().unwrap();
                args.remove("unit");
                args.insert("other".into(), json!("consul"));
            }),
            NOW,
            "`args`: `unit` is \"consul\" in the statement and absent",
        ),
        (
            Answer(|v| v["statement"]["args"] = Value::Null),
            NOW,
            "`args`: the server sent no arguments",
        ),
        (
            Answer(|v| v["runners"] = json!(["hvn05"])),
            NOW,
            "`runner`: the statement names",
        ),
        // The rollout shown is not the one signed: all at once, or another canary.
        (
            Answer(|v| v["plan"]["waves"] = json!([["hvn05", "hvn06"]])),
            NOW,
            "`wave`: the statement's rollout is",
        ),
        (
            Answer(|v| v["plan"]["waves"] = json!([["hvn05"], ["hvn06"]])),
            NOW,
            "`wave`: the statement's rollout is",
        ),
        (
            Answer(|v| v["plan"]["pause_secs"] = json!(0)),
            NOW,
            "`wave`: the statement's rollout is",
        ),
        (
            Answer(|v| v["runners"] = json!(["hvn05", "hvn07"])),
            NOW,
            "`runner`: the statement names",
        ),
        (
            Answer(|v| v["preview"]["hvn05"]["sealed_vars"] = json!(r#"{"state":"failed"}"#)),
            NOW,
            "`runner hvn05 preview`: the statement's digest",
        ),
        (
            Answer(|v| v["preview"]["hvn06"] = json!({"sealed_vars": "{}"})),
            NOW,
            "`runner hvn06 preview`: the statement's digest",
        ),
        (
            Answer(|v| v["preview"]["hvn09"] = json!({"sealed_vars": "{}"})),
            NOW,
            "`runner hvn09 preview`: the request shows a preview for a runner the statement does not name",
        ),
        (
            Answer(|v| v["required_approvals"] = json!(3)),
            NOW,
            "`required`: the statement says 2, the request shows 3",
        ),
        (
            Answer(|v| v["requester"] = json!("agent:trusted-bot")),
            NOW,
            "`requester`: the statement says `agent:deploy-bot`, the request shows \"agent:trusted-bot\"",
        ),
        (
            Answer(|v| v["tool"] = json!("linux.systemctl_reload")),
            NOW,
            "`tool`: the statement names `linux.systemctl_restart`",
        ),
        // The lifetime.
        (
            Parts(|r| r.expires = "2099-01-01T00:00:00Z".into()),
            NOW,
            "`expires`: the approval lives",
        ),
        (Parts(|_| ()), NOW + 1200, "`expires`: the approval expired"),
        (
            Parts(|r| r.id = id_at(NOW + 120)),
            NOW,
            "`approval`: requested at",
        ),
        (
            Parts(|r| r.id = r.id.replacen("-7000-", "-4000-", 1)),
            NOW,
            "is not a UUIDv7",
        ),
        // Numbers this page cannot write back byte for byte, wherever they are hashed.
        (
            Parts(|r| {
                r.signed["n"] = json!(1.5);
                r.shown["n"] = json!(1.5);
            }),
            NOW,
            "`args`: `n` is the number 1.5, which this page cannot hash exactly",
        ),
        (
            Parts(|r| {
                r.signed["n"] = json!(1.0);
                r.shown["n"] = json!(1.0);
            }),
            NOW,
            "`args`: `n` is the number 1.0,",
        ),
        (
            Parts(|r| {
                r.signed["n"] = json!(-0.0);
                r.shown["n"] = json!(-0.0);
            }),
            NOW,
            "`args`: `n` is the number -0.0,",
        ),
        (
            Parts(|r| {
                r.signed["n"] = json!([1_u64 << 60]);
                r.shown["n"] = json!([1_u64 << 60]);
            }),
            NOW,
            "`args`: `n[0]` is the number 1152921504606846976,",
        ),
        (
            Parts(|r| {
                r.sealed.insert("hvn05", r#"{"load":0.25}"#.into());
            }),
            NOW,
            "`runner hvn05 preview`: `load` is the number 0.25,",
        ),
        (
            Parts(|r| {
                r.signed["clé"] = json!(1);
                r.shown["clé"] = json!(1);
            }),
            NOW,
            "`args` has the key \"clé\", which is not ASCII",
        ),
    ];
    let mut runs = Vec::new();
    let mut wanted = Vec::new();
    for (edit, now, says) in &cases {
        let mut r = Request::tricky();
        if let Parts(f) = edit {
            f(&mut r);
        }
        let mut response = r.response();
        if let Answer(f) = edit {
            f(&mut response);
        }
        runs.push((r.id.clone(), response.to_string(), now * 1000));
        wanted.push(*says);
    }
    // The statement of another request: the page checks it against the id it asked for.
    let base = Request::tricky();
    runs.push((id_at(NOW - 30), base.response().to_string(), NOW * 1000));
    wanted.push("`approval`: the statement names approval");
    // And statements that are not what `Statement::text` writes.
    let text = base.response()["statement"]["text"]
        .as_str()
        .unwrap()
        .to_owned();
    let statement_edits = [
        (
            text.replace("required 2", "required 02"),
            "not in canonical form",
        ),
        (
            text.replace("runner hvn05 preview", "runner hvn07 preview"),
            "`wave 2` names `hvn05`, which no `runner` line names",
        ),
        (
            text.replace("emisar-approval/v2", "emisar-approval/v1"),
            "the first line",
        ),
        // The plan: waves out of order, a runner in two, one in none.
        (
            text.replace("wave 2 hvn05", "wave 3 hvn05"),
            "expected `wave 2`, found `wave 3`",
        ),
        (
            text.replace("wave 2 hvn05", "wave 2 hvn05,hvn06"),
            "runner `hvn06` is in two waves",
        ),
        (
            text.replace("wave 2 hvn05\n", ""),
            "runner `hvn05` is in no wave",
        ),
        (text.replace("pause 30", "pause -1"), "`pause` must be"),
        (text.trim_end().to_owned(), "must end with a newline"),
        (
            text.replace("expires 2026-12-06", "expires 2026-02-30"),
            "`expires` must be UTC",
        ),
        (text.replace("tool linux", "tool  linux"), "no whitespace"),
        (format!("{text}extra line\n"), "a line follows `expires`"),
    ];
    for (edited, says) in &statement_edits {
        let mut response = base.response();
        response["statement"]["text"] = json!(edited);
        runs.push((base.id.clone(), response.to_string(), NOW * 1000));
        wanted.push(says);
    }
    let got = run_in_node(&runs);
    for (i, (result, says)) in got.iter().zip(&wanted).enumerate() {
        let error = result["error"].as_str().unwrap_or_else(|| {
            panic!("case {i} (wanted a refusal saying `{says}`) was not refused: {result}")
        });
        assert!(
            error.contains(says),
            "case {i}: `{error}` does not say `{says}`"
        );
    }
}

/// The portal's check of a rollout decision before a passkey signs it
/// (`checkDecisionBeforeSigning` in web/statement.js), against decisions `Decision::text`
/// wrote: it holds the decision to the approval, the choice clicked, the statement shown and
/// the runners the shown halt leaves, within the lifetime, as `check_decision_before_signing`
/// (the terminal's check) does, and refuses what that refuses, naming the same field.
mod decisions {
    use emisar::protocol::approval::statement::hash_text;
    use emisar::protocol::approval::{Choice, Decision};
    use serde_json::{Value, json};

    use super::{EXPIRES, NOW, Request, id_at};

    /// The tricky request (canary `hvn06`, then `hvn05`) halted on its canary's gate.
    fn halted_request() -> (Request, Value) {
        let r = Request::tricky();
        let mut v = r.response();
        v["state"] = json!("halted");
        v["outcome_note"] = json!("wave 1 of 2: runner `hvn06`: the health gate failed");
        v["result"] = json!({
            "results": [{"runner": "hvn06", "ok": true}, {"runner": "hvn05", "ok": false, "error_kind": "not_run"}],
            "halt": {"wave": 1, "runner": "hvn06", "not_run": ["hvn05"]},
        });
        (r, v)
    }

    /// The decision the server would propose for `choice` on [`halted_request`].
    fn decision(r: &Request, response: &Value, choice: Choice) -> Decision {
        let runners: &[&str] = match choice {
            Choice::Resume => &["hvn05"],
            Choice::Retry => &["hvn05", "hvn06"],
            Choice::Abort => &[],
        };
        Decision {
            id: id_at(NOW - 30),
            approval_id: r.id.clone(),
            statement_sha256: hex::encode(hash_text(
                response["statement"]["text"].as_str().unwrap(),
            )),
            halted_wave: 1,
            choice,
            runners: runners.iter().map(|s| (*s).to_owned()).collect(),
            expires_at: EXPIRES.into(),
        }
    }

    /// The API's answer with `text` as the pending decision (the server's own hash and
    /// challenge wrong on purpose: the page computes its own).
    fn with_decision(mut response: Value, d: &Decision, text: &str) -> Value {
        response["decision"] = json!({
            "id": d.id, "choice": d.choice, "runners": d.runners, "text": text,
            "expires_at": d.expires_at, "proposed_by": "user:carol", "required": 2,
            "votes": [], "taken": false,
            "sha256": "0".repeat(64), "challenge": "AAAA",
        });
        response
    }

    fn case(choice: Choice, edit: impl FnOnce(&mut Decision)) -> (String, String, u64) {
        let (r, response) = halted_request();
        let mut d = decision(&r, &response, choice);
        edit(&mut d);
        let text = d.text().unwrap();
        (
            r.id.clone(),
            with_decision(response, &d, &text).to_string(),
            NOW * 1000,
        )
    }

    /// Runs the cases, each with the choice the person clicked.
    fn run(cases: &[(Choice, (String, String, u64))]) -> Vec<Value> {
        let repo = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let node = crate::harness::tools::require("node/bin/node");
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("cases.json");
        let json: Vec<Value> = cases
            .iter()
            .map(|(choice, (id, response, now_ms))| {
                json!({"id": id, "choice": choice.as_str(), "response": response, "now_ms": now_ms})
            })
            .collect();
        std::fs::write(&file, serde_json::to_vec(&json).unwrap()).unwrap();
        let out = std::process::Command::new(node)
            .arg("tests/browser/statement_check.mjs")
            .arg(&file)
            .current_dir(&repo)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "node failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let results: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(results.len(), cases.len());
        results
    }

    #[test]
    fn the_portal_reads_each_choice_as_the_rust_writes_it_and_computes_its_own_challenge() {
        let cases: Vec<(Choice, (String, String, u64))> =
            [Choice::Retry, Choice::Resume, Choice::Abort]
                .into_iter()
                .map(|c| (c, case(c, |_| ())))
                .collect();
        let got = run(&cases);
        for ((choice, (_, response, _)), result) in cases.iter().zip(&got) {
            let response: Value = serde_json::from_str(response).unwrap();
            let text = response["decision"]["text"].as_str().unwrap();
            let ok = &result["ok"];
            assert!(ok.is_object(), "{choice:?} refused: {result}");
            assert_eq!(ok["sha256"], hex::encode(hash_text(text)), "{ok}");
            assert_eq!(ok["challenge_is_the_text_hash"], true, "{ok}");
            assert_eq!(ok["choice"], choice.as_str());
            assert_eq!(ok["runners"], response["decision"]["runners"], "{ok}");
            assert_eq!(ok["halted"], 1);
            assert_eq!(ok["failed"], "hvn06");
            assert_eq!(ok["expires"], EXPIRES);
        }
    }

    #[test]
    fn the_portal_refuses_the_decisions_the_terminal_refuses_naming_the_field() {
        use Choice::{Abort, Resume, Retry};
        let mut cases: Vec<(Choice, (String, String, u64), &str)> = vec![
            // The runners are not what the halt shown gives: the failed one left out of a
            // retry, one more than the halt leaves, a resume that runs the failed one, an
            // abort that runs something, another wave.
            (
                Retry,
                case(Retry, |d| d.runners = vec!["hvn05".into()]),
                "`runners`: the decision lets [\"hvn05\"] run after wave 1, and the request's halt",
            ),
            (
                Retry,
                case(Retry, |d| d.runners.push("hvn07".into())),
                "`runners`: the decision lets",
            ),
            (
                Resume,
                case(Resume, |d| d.runners = vec!["hvn05".into(), "hvn06".into()]),
                "`runners`: the decision lets",
            ),
            (
                Retry,
                case(Retry, |d| d.halted_wave = 2),
                "`runners`: the decision lets [\"hvn05\", \"hvn06\"] run after wave 2",
            ),
            // The decision is about something else than what the person clicked or reads.
            (
                Retry,
                case(Retry, |d| d.approval_id = id_at(NOW - 90)),
                "`approval`: the decision is about approval",
            ),
            (
                Retry,
                case(Resume, |_| ()),
                "`choice`: the decision is a resume, not a retry",
            ),
            (
                Retry,
                case(Retry, |d| {
                    d.statement_sha256 = hex::encode(hash_text("another\n"))
                }),
                "`statement`: the decision binds another statement than the request's",
            ),
            // The lifetime, with the decision's own id.
            (
                Retry,
                case(Retry, |d| d.expires_at = "2099-01-01T00:00:00Z".into()),
                "`expires`: the approval lives",
            ),
            (
                Retry,
                case(Retry, |d| d.id = id_at(NOW + 120)),
                "`decision`: requested at",
            ),
            (
                Retry,
                case(Retry, |d| d.id = d.id.replacen("-7000-", "-4000-", 1)),
                "`decision`: `",
            ),
        ];
        let (id, expired, _) = case(Retry, |_| ());
        cases.push((
            Retry,
            (id, expired, (NOW + 1200) * 1000),
            "`expires`: the approval expired",
        ));
        // What the request shows changed under the same decision: its halt, or none at all.
        let (r, response) = halted_request();
        let d = decision(&r, &response, Retry);
        let text = d.text().unwrap();
        let shown = |edit: &dyn Fn(&mut Value)| {
            let mut v = with_decision(response.clone(), &d, &text);
            edit(&mut v);
            (r.id.clone(), v.to_string(), NOW * 1000)
        };
        cases.push((
            Retry,
            shown(&|v| v["result"]["halt"]["not_run"] = json!(["hvn05", "hvn07"])),
            "`runners`: the decision lets",
        ));
        cases.push((
            Retry,
            shown(&|v| v["result"] = Value::Null),
            "`runners`: the request does not show where its rollout halted",
        ));
        cases.push((
            Retry,
            shown(&|v| v["statement"]["text"] = json!("emisar-approval/v2\n")),
            "`statement`: the decision binds another statement",
        ));
        cases.push((
            Retry,
            shown(&|v| v["decision"] = Value::Null),
            "the request has no decision to sign",
        ));
        // Texts that are not what `Decision::text` writes.
        let statement = response["statement"]["text"].as_str().unwrap().to_owned();
        for (from, to, says) in [
            (
                "runners hvn05,hvn06",
                "runners hvn06,hvn05",
                "`runners` must be sorted, each once",
            ),
            (
                "runners hvn05,hvn06",
                "runners hvn05, hvn06",
                "`runners` must be 1 to 512 bytes without whitespace",
            ),
            (
                "runners hvn05,hvn06",
                "runners -",
                "`runners`: a retry names the runners it lets run",
            ),
            (
                "choice retry",
                "choice rerun",
                "`choice` must be resume, retry or abort, not `rerun`",
            ),
            ("halted 1", "halted 0", "`halted` must be a wave, 1 to 1000"),
            ("halted 1", "halted one", "`halted` must be a wave number"),
            ("halted 1", "halted +1", "not in canonical form"),
            (
                "statement sha256:",
                "statement ",
                "`statement` must be `sha256:HEX`",
            ),
            (
                "emisar-rollout-decision/v1",
                "emisar-approval/v2",
                "the first line must be",
            ),
            (
                "expires 2026-12-06",
                "expires 2026-02-30",
                "`expires` must be YYYY-MM-DDTHH:MM:SSZ",
            ),
            (
                "\nhalted 1\n",
                "\nhalted\n",
                "every line after the first is `key value`",
            ),
            ("\nhalted 1\n", "\n", "expected `halted`, found `choice`"),
        ] {
            assert!(text.contains(from), "{from}");
            let edited = text.replacen(from, to, 1);
            cases.push((
                Retry,
                shown(&|v| v["decision"]["text"] = json!(edited)),
                says,
            ));
        }
        cases.push((
            Retry,
            shown(&|v| v["decision"]["text"] = json!(text.trim_end())),
            "must end with a newline",
        ));
        cases.push((
            Retry,
            shown(&|v| v["decision"]["text"] = json!(format!("{text}extra x\n"))),
            "a line follows `expires`",
        ));
        cases.push((
            Retry,
            shown(&|v| v["decision"]["text"] = json!(statement)),
            "the first line must be `emisar-rollout-decision/v1`",
        ));
        let abort = decision(&r, &response, Abort).text().unwrap();
        cases.push((
            Abort,
            shown(&|v| v["decision"]["text"] = json!(abort.replace("runners -", "runners hvn05"))),
            "`runners`: an abort lets no runner run",
        ));

        let runs: Vec<(Choice, (String, String, u64))> =
            cases.iter().map(|(c, run, _)| (*c, run.clone())).collect();
        let got = run(&runs);
        for (i, (result, (_, _, says))) in got.iter().zip(&cases).enumerate() {
            let error = result["error"].as_str().unwrap_or_else(|| {
                panic!("case {i} (wanted a refusal saying `{says}`) was not refused: {result}")
            });
            assert!(
                error.contains(says),
                "case {i}: `{error}` does not say `{says}`"
            );
        }
    }
}

/// The portal's reading of a grant before a passkey signs it (web/statement.js
/// `checkGrantBeforeSigning`), held to the Rust: what `Grant::text` writes it reads back line
/// for line, in words as the terminal shows them, with the challenge the text's SHA-256; what
/// `Grant::parse` or the terminal's check refuses, it refuses naming the line; and where it
/// cannot read a line exactly (a glob beyond `*`, a number beyond 2^53) it refuses and sends
/// the person to the terminal, never guesses.
mod grants {
    use std::collections::BTreeMap;

    use emisar::protocol::approval::grant::{Constraint, Grant, Runners};
    use emisar::protocol::approval::statement::hash_text;
    use emisar::selector::Selector;
    use serde_json::{Value, json};

    use super::{NOW, id_at, run_in_node_cases};

    fn tricky() -> Grant {
        Grant {
            id: id_at(NOW - 60),
            agent: "agent:deploy-bot".into(),
            break_glass: false,
            tools: vec!["linux.systemctl_restart".into(), "nomad.job_*".into()],
            runners: Runners::Labels(Selector::parse("role=edge,dc=dc1").unwrap()),
            args: BTreeMap::from([
                ("memory".into(), Constraint::Range { min: -5, max: 8192 }),
                (
                    "unit".into(),
                    Constraint::In(vec![
                        json!("\"q\\uote é 😀"),
                        json!("consul"),
                        json!("consul\u{200b}"),
                        json!(-3),
                        json!(12),
                        json!(false),
                    ]),
                ),
            ]),
            max_calls: 3,
            max_calls_per_runner: 2,
            required: 2,
            reason: "INC-42: \"edge\" flaps\nsee the runbook é".into(),
            expires_at: "2026-12-06T10:30:00Z".into(),
        }
    }

    /// `GET /api/grants/ID`'s answer for `text`, with the fields a lying server could fill.
    fn answer(id: &str, text: &str) -> String {
        json!({
            "grant_id": id, "status": "requested", "text": text,
            "tools": ["*"], "runners": {"names": ["everything"]}, "sha256": "0".repeat(64),
        })
        .to_string()
    }

    fn sorted(mut g: Grant) -> Grant {
        if let Some(Constraint::In(values)) = g.args.get_mut("unit") {
            values.sort_by_key(Value::to_string);
        }
        g
    }

    fn check(cases: &[(&str, String, u64)]) -> Vec<Value> {
        let cases: Vec<Value> = cases
            .iter()
            .map(|(id, text, now)| json!({"grant": true, "id": id, "response": answer(id, text), "now_ms": now * 1000}))
            .collect();
        run_in_node_cases(&cases)
    }

    #[test]
    fn the_portal_reads_a_grant_exactly_as_the_rust_writes_it() {
        let g = sorted(tricky());
        let text = g.text().unwrap();
        let window = Grant {
            break_glass: true,
            tools: vec!["*".into()],
            runners: Runners::Names(vec!["edge-1".into(), "edge-2".into()]),
            args: BTreeMap::new(),
            ..g.clone()
        };
        let window_text = window.text().unwrap();
        let got = check(&[
            (&g.id, text.clone(), NOW),
            (&window.id, window_text.clone(), NOW),
        ]);
        let ok = &got[0]["ok"];
        assert!(ok.is_object(), "refused: {}", got[0]);
        assert_eq!(ok["sha256"], hex::encode(hash_text(&text)), "{ok}");
        assert_eq!(ok["challenge_is_the_text_hash"], true, "{ok}");
        let words = &ok["words"];
        assert_eq!(words["grant"], g.id.as_str());
        assert_eq!(words["for"], "agent:deploy-bot");
        assert_eq!(words["tools"], "linux.systemctl_restart, nomad.job_*");
        assert_eq!(
            words["runners"],
            "those whose labels match role=edge,dc=dc1"
        );
        assert_eq!(
            words["arguments"],
            "memory from -5 to 8192; unit one of \"\\\"q\\\\uote é 😀\", \"consul\", \"consul\u{200b}\", -3, 12, false",
            "{ok}"
        );
        assert_eq!(words["calls"], "at most 3 in all, 2 on one runner");
        assert_eq!(words["needs"], "2 people's signatures");
        assert_eq!(words["reason"], g.reason.as_str());
        assert_eq!(words["expires"], "2026-12-06T10:30:00Z");
        assert!(words.get("break-glass").is_none(), "{words}");
        // What a reader cannot see is shown: the zero-width space, the newline.
        let shown = ok["visible"].to_string();
        assert!(shown.contains("consul\\\\u{200b}"), "{shown}");
        assert!(shown.contains("flaps\\\\u{a}see"), "{shown}");
        // The server's own `tools`, `runners` and `sha256` were not read.
        assert!(!shown.contains("everything"), "{shown}");

        let ok = &got[1]["ok"];
        assert!(ok.is_object(), "refused: {}", got[1]);
        assert_eq!(ok["sha256"], hex::encode(hash_text(&window_text)));
        assert_eq!(ok["words"]["runners"], "only edge-1, edge-2");
        assert_eq!(ok["words"]["tools"], "*");
        assert!(
            ok["words"]["break-glass"]
                .as_str()
                .is_some_and(|s| s.starts_with("yes")),
            "{ok}"
        );
        assert_eq!(
            ok["words"]["arguments"],
            "any (the runners' own allowlists still hold)"
        );
    }

    #[test]
    fn the_portal_refuses_a_grant_the_terminal_refuses_naming_the_line() {
        let g = sorted(tricky());
        let text = g.text().unwrap();
        let edit = |from: &str, to: &str| {
            assert!(text.contains(from), "{from:?} not in {text}");
            text.replacen(from, to, 1)
        };
        let long = Grant {
            expires_at: "2026-12-06T11:00:00Z".into(),
            ..g.clone()
        };
        let v4 = Grant {
            id: "0193f4d0-5d4f-4e3b-9a8c-1f2e3d4c5b6a".into(),
            ..g.clone()
        };
        let future = Grant {
            id: id_at(NOW + 600),
            expires_at: "2026-12-06T10:40:00Z".into(),
            ..g.clone()
        };
        // Each: the text, the clock, what the refusal says, and whether the Rust reads the
        // text as a grant at all (`Grant::parse`).
        let cases: Vec<(String, u64, &str, bool)> = vec![
            (
                edit("calls 3\n", "calls 03\n"),
                NOW,
                "`calls` must be a whole number",
                false,
            ),
            (
                edit("calls 3\n", "calls 1001\n"),
                NOW,
                "`calls` must be 1 to 1000",
                false,
            ),
            (
                edit("calls_per_runner 2", "calls_per_runner 4"),
                NOW,
                "`calls_per_runner` must be 1 to 3",
                false,
            ),
            (
                edit("required 2", "required 0"),
                NOW,
                "`required` must be 1 to 32",
                false,
            ),
            (
                edit(
                    "tool linux.systemctl_restart\ntool nomad.job_*",
                    "tool nomad.job_*\ntool linux.systemctl_restart",
                ),
                NOW,
                "`tool` lines are sorted, each once",
                false,
            ),
            (
                edit("range -5..8192", "range 8192..-5"),
                NOW,
                "a range's MIN (8192) is at most its MAX (-5)",
                false,
            ),
            (
                edit("range -5..8192", "range -05..8192"),
                NOW,
                "a range's ends are whole numbers",
                false,
            ),
            (
                edit("range -5..8192", "range -0..8192"),
                NOW,
                "a range's ends are whole numbers",
                false,
            ),
            (
                edit(",-3,12,", ",12,-3,"),
                NOW,
                "`in` values are sorted by their JSON text, each once",
                false,
            ),
            (
                edit(",-3,12,", ",-3, 12,"),
                NOW,
                "not in canonical form",
                false,
            ),
            (
                edit(",-3,12,", ",-3,1.0,"),
                NOW,
                "which this page cannot check exactly",
                false,
            ),
            (
                edit(",-3,12,", ",-3,[12],"),
                NOW,
                "`in` takes strings, whole numbers and booleans",
                false,
            ),
            (
                edit("reason \"INC", "reason \"\\u0049NC"),
                NOW,
                "not in canonical form",
                false,
            ),
            (
                edit(
                    "reason \"INC-42: \\\"edge\\\" flaps\\nsee the runbook é\"",
                    "reason \"  \"",
                ),
                NOW,
                "`reason` says why",
                false,
            ),
            (
                edit(
                    "runners labels role=edge,dc=dc1",
                    "runners labels role=edge;dc=dc1",
                ),
                NOW,
                "`runners labels`: selector pair 1",
                false,
            ),
            (
                edit("runners labels", "runners label"),
                NOW,
                "`runners` is `names a,b` or `labels key=value,…`",
                false,
            ),
            (
                edit(
                    "agent agent:deploy-bot\n",
                    "agent agent:deploy-bot\nbreak_glass true\n",
                ),
                NOW,
                "a break-glass window names its runners",
                false,
            ),
            (
                edit(
                    "agent agent:deploy-bot\n",
                    "agent agent:deploy-bot\nbreak_glass yes\n",
                ),
                NOW,
                "`break_glass` is given once",
                false,
            ),
            (
                edit("arg unit", "arg memory"),
                NOW,
                "`arg memory` is given twice",
                false,
            ),
            (
                format!("{text}calls 4\n"),
                NOW,
                "a line follows `expires`",
                false,
            ),
            (
                text.trim_end().to_owned(),
                NOW,
                "must end with a newline",
                false,
            ),
            (
                edit("emisar-grant/v1", "emisar-approval/v2"),
                NOW,
                "the first line must be `emisar-grant/v1`",
                false,
            ),
            (
                edit(
                    "expires 2026-12-06T10:30:00Z",
                    "expires 2026-02-30T10:30:00Z",
                ),
                NOW,
                "`expires` must be YYYY-MM-DDTHH:MM:SSZ",
                false,
            ),
            // Grants the Rust reads, which the terminal's check or this page refuses.
            (
                long.text().unwrap(),
                NOW,
                "`expires`: the grant lives 3660 s from its request to its expiry, more than the 3600 s",
                true,
            ),
            (
                g.text().unwrap(),
                NOW + 1800,
                "`expires`: the grant expired at 2026-12-06T10:30:00Z",
                true,
            ),
            (v4.text().unwrap(), NOW, "is not a UUIDv7", true),
            (
                future.text().unwrap(),
                NOW,
                "a grant from the future is refused",
                true,
            ),
            (
                edit("tool nomad.job_*", "tool nomad.job_[ab]"),
                NOW,
                "a pattern this page does not read",
                true,
            ),
            (
                edit("range -5..8192", "range -5..9007199254740993"),
                NOW,
                "beyond what this page checks exactly",
                true,
            ),
        ];
        // The page is opened for the grant the text names (or the sample's, where the Rust
        // reads no grant in it).
        let ids: Vec<String> = cases
            .iter()
            .map(|(text, ..)| Grant::parse(text).map_or(g.id.clone(), |g| g.id))
            .collect();
        let node_cases: Vec<(&str, String, u64)> = cases
            .iter()
            .zip(&ids)
            .map(|((text, now, ..), id)| (id.as_str(), text.clone(), *now))
            .collect();
        let got = check(&node_cases);
        for ((text, _, says, rust_reads), out) in cases.iter().zip(&got) {
            let error = out["error"]
                .as_str()
                .unwrap_or_else(|| panic!("not refused ({says}): {out}\n{text}"));
            assert!(
                error.contains(says),
                "wanted {says:?}, got {error:?}\n{text}"
            );
            assert_eq!(
                Grant::parse(text).is_ok(),
                *rust_reads,
                "{says}: the Rust's reading\n{text}"
            );
        }
        // The page was opened for another grant than its text names.
        let other = id_at(NOW - 30);
        let got = check(&[(&other, text.clone(), NOW)]);
        let error = got[0]["error"].as_str().unwrap_or_default();
        assert!(
            error.contains(&format!(
                "`grant`: the text is of grant {}, not {other}",
                g.id
            )),
            "{}",
            got[0]
        );
    }

    /// A break-glass window's review in the portal: a new one is the text `Review::text`
    /// writes for the note at the browser's clock, and a proposed one is read as
    /// `Review::parse` and `review::check` read it: bound to this window's id and the SHA-256 of
    /// its grant text computed in the browser, proposed between the window's close (its
    /// revocation as the API gives it, or its expiry) and now, with a visible note.
    #[test]
    fn the_portal_writes_and_reads_a_review_as_the_rust_does() {
        use emisar::protocol::approval::review::Review;

        let window = Grant {
            break_glass: true,
            tools: vec!["*".into()],
            runners: Runners::Names(vec!["edge-1".into()]),
            args: BTreeMap::new(),
            ..sorted(tricky())
        };
        // Asked for at 09:59, expires at 10:30.
        let text = window.text().unwrap();
        let note = "INC-42: restarted \"consul\" twice\né 😀";
        let at = "2026-12-06T10:35:00Z";
        let review = Review::of(&text, note, at).unwrap().text().unwrap();
        let case = |proposed: Option<&str>, note: Option<&str>, now: u64| json!({"review": true, "id": window.id, "window_text": text, "proposed": proposed, "note": note, "now_ms": now * 1000});
        let plain = Grant {
            break_glass: false,
            ..window.clone()
        };
        let edit = |from: &str, to: &str| review.replacen(from, to, 1);
        let other_grant = edit(&hex::encode(hash_text(&text)), &"0".repeat(64));
        // 10:35:00 by the browser's clock.
        let now = 1_796_553_300;
        let revoked_then = |proposed: &str| {
            let mut c = case(Some(proposed), None, now);
            c["closed_at"] = json!("2026-12-06T10:20:00.123456Z");
            c
        };
        let cases = vec![
            // A new review, at 10:35:00 by the browser's clock.
            case(None, Some(note), now),
            // The review proposed, read back.
            case(Some(&review), None, now),
            // Revoked at 10:20: a review at 10:25 holds.
            revoked_then(&edit(at, "2026-12-06T10:25:00Z")),
            // Refused.
            case(None, Some("   "), now),
            case(Some(&edit(&window.id, &id_at(NOW - 30))), None, now),
            case(Some(&other_grant), None, now),
            case(Some(&edit(at, "2026-12-06T09:00:00Z")), None, now),
            case(Some(&edit(at, "2026-12-06T11:00:00Z")), None, now),
            case(Some(&edit("note \"INC", "note \"\\u0049NC")), None, now),
            json!({"review": true, "id": plain.id, "window_text": plain.text().unwrap(), "note": note, "now_ms": now * 1000}),
            // Signed while the window was open: before its expiry, or before its revocation.
            case(Some(&edit(at, "2026-12-06T10:25:00Z")), None, now),
            revoked_then(&edit(at, "2026-12-06T10:15:00Z")),
            case(None, Some(note), 1_796_552_700),
            // A note with nothing visible.
            case(None, Some("\u{200b}"), now),
            case(None, Some(" \u{202e}\u{2060}\n"), now),
            case(
                Some(&edit(
                    &Value::String(note.into()).to_string(),
                    "\"\u{200b}\"",
                )),
                None,
                now,
            ),
        ];
        let got = run_in_node_cases(&cases);
        let ok = &got[0]["ok"];
        assert_eq!(ok["text"], review.as_str(), "{}", got[0]);
        assert_eq!(ok["sha256"], hex::encode(hash_text(&review)));
        assert_eq!(ok["challenge_is_the_text_hash"], true);
        assert_eq!(got[1]["ok"]["text"], review.as_str(), "{}", got[1]);
        assert_eq!(got[1]["ok"]["note"], note);
        assert_eq!(
            got[2]["ok"]["reviewed"], "2026-12-06T10:25:00Z",
            "{}",
            got[2]
        );
        let says = [
            "`note` is required",
            "`window`: the review is of window",
            "`grant`: the review binds another grant text",
            "`reviewed`: 2026-12-06T09:00:00Z is before the window was asked for",
            "`reviewed`: 2026-12-06T11:00:00Z is in the future of this clock",
            "not in canonical form",
            "is not a break-glass window",
            "`reviewed`: 2026-12-06T10:25:00Z is before the window closed (at 1796553000,",
            "`reviewed`: 2026-12-06T10:15:00Z is before the window closed (at 1796552400,",
            "`reviewed`: 2026-12-06T10:25:00Z is before the window closed",
            "`note` has no visible character",
            "`note` has no visible character",
            "`note` has no visible character",
        ];
        assert_eq!(got.len(), 3 + says.len());
        for (out, says) in got[3..].iter().zip(says) {
            let error = out["error"].as_str().unwrap_or_default();
            assert!(error.contains(says), "wanted {says:?}: {out}");
        }
        // The Rust refuses the same, with the same words.
        for (close, reviewed) in [
            (1_796_553_000, "2026-12-06T10:25:00Z"),
            (1_796_552_400, "2026-12-06T10:15:00Z"),
        ] {
            let e = emisar::protocol::approval::review::check_unsigned(
                &text,
                &edit(at, reviewed),
                now,
                close,
            )
            .unwrap_err();
            assert!(
                e.contains(&format!(
                    "`reviewed`: {reviewed} is before the window closed (at {close},"
                )),
                "{e}"
            );
        }
        for invisible in ["\u{200b}", " \u{202e}\u{2060}\n"] {
            let e = Review::of(&text, invisible, at).unwrap_err().to_string();
            assert!(e.contains("`note` has no visible character"), "{e}");
        }
    }
}
