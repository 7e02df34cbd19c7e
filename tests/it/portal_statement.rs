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
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let node = require("node/bin/node");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cases.json");
    let cases: Vec<Value> = cases
        .iter()
        .map(|(id, response, now_ms)| json!({"id": id, "response": response, "now_ms": now_ms}))
        .collect();
    std::fs::write(&file, serde_json::to_vec(&cases).unwrap()).unwrap();
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
