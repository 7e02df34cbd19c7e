//! A halted rollout decided in the portal, in a real browser (issue 46): alice and bob, each
//! in a headless Chromium context of their own with a virtual authenticator, register
//! passkeys (tests/browser/decision_e2e.mjs); the operator puts both in the approvers file; the
//! server restarts with it and three TLS runners that require two people's signatures. The
//! agent rolls a change out that leaves the canary unhealthy: both approve it with their
//! passkeys, it halts at the canary's gate, and the page draws where (the canary's gate failed,
//! the two others not run). Alice proposes a retry; a database writer makes the decision let
//! only the two not run run (the failed canary left out): the page refuses to sign it, naming
//! `runners`, and the authenticator signs nothing. The decision as the server made it: alice
//! signs, bob joins, and the rollout completes: the canary again, then the rest.
//!
//! Screenshots land in target/decision-e2e/ (01-halted, 02-decision, 03-refused, 04-completed).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use emisar::server::config::WebauthnConfig;
use emisar::server::principal::Role;
use serde_json::{Value, json};

use crate::approvals::{Portal, add_user, call_in_background, signed_in};
use crate::harness::app::{Options, TestApp};
use crate::harness::certs::self_signed;
use crate::harness::pg::PgTestDb;
use crate::harness::tools::{DeadEndpoint, require};
use crate::harness::{Backend, RunnerSpec, spawn_app};
use crate::portal_browser::{CHROMIUM, Driver, assert_png, require_path};
use crate::rollouts::{PACK, TOOL, node_programs};

const RUNNERS: [&str; 3] = ["edge-1", "edge-2", "edge-3"];

/// A passkey the browser registered: its credential id, algorithm and public key, as the
/// approvers file names it.
fn passkey_line(key: &emisar::server::passkeys::Passkey) -> String {
    format!(
        "{{ id = \"{}\", alg = \"{}\", public_key = \"{}\" }}",
        key.credential_id,
        key.alg.as_str(),
        key.public_key
    )
}

/// Alice and bob (approvers) in a browser driver of their own (`script`, given
/// `ALICE_PASSWORD`, `BOB_PASSWORD`, `STEPS_DIR`, `SCREENSHOT_DIR`), on a first server on
/// PostgreSQL whose port is held for the server that follows: the origin a passkey signs for
/// names it, so both servers must be reached at the same one.
pub(crate) struct TwoPeople {
    pub work: tempfile::TempDir,
    /// Where the test writes the driver's steps.
    pub steps: PathBuf,
    pub shots: PathBuf,
    pub port: u16,
    pub origin: String,
    pub webauthn: WebauthnConfig,
    pub first: TestApp,
    pub driver: Driver,
}

impl TwoPeople {
    pub(crate) async fn start(script: &str, shots: &str) -> TwoPeople {
        let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let node = require("node/bin/node");
        let chromium = require_path(Path::new(CHROMIUM));
        require_path(&repo.join("tests/browser/node_modules/playwright-core/package.json"));
        let work = tempfile::tempdir().unwrap();
        let steps = work.path().join("steps");
        std::fs::create_dir_all(&steps).unwrap();
        let shots = repo.join("target").join(shots);
        std::fs::create_dir_all(&shots).unwrap();
        let port = DeadEndpoint::bind_reserved().release();
        let origin = format!("http://localhost:{port}");
        let webauthn = WebauthnConfig {
            rp_id: Some("localhost".into()),
            origins: vec![origin.clone()],
        };
        let first = spawn_app(
            Backend::Postgres,
            vec![],
            Options {
                listen: Some(format!("127.0.0.1:{port}")),
                webauthn: Some(webauthn.clone()),
                ..Default::default()
            },
        )
        .await;
        let alice_password = add_user(&first, "alice", Role::Approver).await;
        let bob_password = add_user(&first, "bob", Role::Approver).await;
        let driver = Driver::spawn(
            &repo,
            &node,
            script,
            &[
                ("PORTAL_URL", format!("{origin}/")),
                ("ALICE_PASSWORD", alice_password),
                ("BOB_PASSWORD", bob_password),
                ("STEPS_DIR", steps.display().to_string()),
                ("SCREENSHOT_DIR", shots.display().to_string()),
                ("CHROMIUM", chromium.display().to_string()),
                ("TMPDIR", work.path().display().to_string()),
            ],
        );
        TwoPeople {
            work,
            steps,
            shots,
            port,
            origin,
            webauthn,
            first,
            driver,
        }
    }
}

/// The operator's approvers file, written in `work`: `origin`'s relying party, the passkeys
/// alice and bob registered in the browser (the driver's
/// `{"registered": {"alice": ID, "bob": ID}}`), then `rules`. Its path.
pub(crate) async fn approvers_of_people(
    driver: &mut Driver,
    first: &TestApp,
    work: &Path,
    origin: &str,
    rules: &str,
) -> PathBuf {
    let registered = driver.expect_json("{\"registered\": {…}}").await;
    let mut lines = Vec::new();
    for name in ["alice", "bob"] {
        let keys = emisar::server::passkeys::of_user(&first.db, name)
            .await
            .unwrap();
        assert_eq!(keys.len(), 1, "{keys:?}");
        assert_eq!(registered["registered"][name], keys[0].credential_id);
        lines.push(format!(
            "[[person]]\nname = \"{name}\"\npasskeys = [{}]\n",
            passkey_line(&keys[0])
        ));
    }
    let approvers = work.join("approvers.toml");
    std::fs::write(
        &approvers,
        format!(
            "serial = 1\n\n[webauthn]\nrp_id = \"localhost\"\norigins = [\"{origin}\"]\n\n{}\n{rules}",
            lines.join("\n")
        ),
    )
    .unwrap();
    approvers
}

/// The options of the server that follows `first`: on its port, database, keys and relying
/// party, serving TLS only, with the people's `approvers` file.
pub(crate) fn options_after(
    first: &TestApp,
    port: u16,
    webauthn: &WebauthnConfig,
    approvers: PathBuf,
) -> Options {
    Options {
        listen: Some(format!("127.0.0.1:{port}")),
        database_url: Some(first.database_url.clone()),
        keys: Some((first.private_key.clone(), first.public_key.clone())),
        webauthn: Some(webauthn.clone()),
        approvers_file: Some(approvers),
        insecure_http: Some(false),
        ..Default::default()
    }
}

/// Tells the driver its step `n`: written under another name and renamed, since the driver
/// reads the file as soon as it exists.
pub(crate) fn order(dir: &Path, n: usize, order: Value) {
    let tmp = dir.join(format!("{n}.tmp"));
    std::fs::write(&tmp, order.to_string()).unwrap();
    std::fs::rename(&tmp, dir.join(n.to_string())).unwrap();
}

/// The runners that marked `change`, in the order they did.
fn marked(dir: &Path, change: &str) -> Vec<String> {
    let text = std::fs::read_to_string(dir.join("marks.log")).unwrap_or_default();
    let mut marks: Vec<(u128, String)> = text
        .lines()
        .filter_map(|l| {
            let mut parts = l.split(' ');
            let (runner, c, at) = (parts.next()?, parts.next()?, parts.next()?);
            (c == change).then(|| (at.parse().unwrap(), runner.to_owned()))
        })
        .collect();
    marks.sort();
    marks.into_iter().map(|(_, r)| r).collect()
}

/// Waits until request `id` is in `state`.
async fn until_state(p: &Portal, id: &str, state: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, row) = p.get(&format!("/api/approvals/{id}")).await;
        if row["state"] == state {
            return row;
        }
        assert!(Instant::now() < deadline, "not {state}: {row}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The stored decision of request `id` (its JSON, as the server keeps it).
fn stored_decision(pg: &PgTestDb, id: &str) -> Value {
    let text = pg
        .superuser_sql(&format!("SELECT decision FROM approvals WHERE id = '{id}'"))
        .unwrap();
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text}"))
}

fn store_decision(pg: &PgTestDb, id: &str, decision: &Value) {
    pg.superuser_sql(&format!(
        "UPDATE approvals SET decision = '{}' WHERE id = '{id}'",
        decision.to_string().replace('\'', "''")
    ))
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_people_retry_a_halted_rollout_with_passkeys_and_the_page_refuses_a_tampered_decision()
{
    let TwoPeople {
        work,
        steps,
        shots,
        port,
        origin,
        webauthn,
        mut first,
        mut driver,
    } = TwoPeople::start("tests/browser/decision_e2e.mjs", "decision-e2e").await;

    let run = async {
        // 1. Registered in the browser; the operator's approvers file holds both passkeys,
        // and a `roll` write needs both people.
        let approvers = approvers_of_people(
            &mut driver,
            &first,
            work.path(),
            &origin,
            "[[rule]]\ntools = \"roll.*\"\napprovals = 2\n",
        )
        .await;
        let packs = work.path().join("packs");
        std::fs::create_dir_all(&packs).unwrap();
        std::fs::write(packs.join("roll.yaml"), PACK).unwrap();
        let policy = work.path().join("policy.yaml");
        std::fs::write(&policy, "rollout:\n  default: {canary: 1, wave: 2}\n").unwrap();
        let runners = RUNNERS
            .iter()
            .map(|name| {
                let bin = node_programs(work.path(), name);
                let cert = self_signed(work.path(), name);
                RunnerSpec::new(name)
                    .path_first(&bin)
                    .https(cert.clone(), Some(cert.fingerprint.to_string()))
                    .signed_approvals(&["*"], Some(approvers.clone()), &[])
            })
            .collect();
        first.stop().await;
        let app = spawn_app(
            Backend::Postgres,
            runners,
            Options {
                packs_dir: Some(packs),
                policy_file: Some(policy),
                approval_wait_secs: Some(300),
                ..options_after(&first, port, &webauthn, approvers)
            },
        )
        .await;
        let pg = first
            .pg
            .as_ref()
            .expect("the database the first server made");
        let watcher = signed_in(&app, "carol", Role::Approver).await;

        // 2. The agent rolls out a change the canary is sick after; both approve it with
        // their passkeys; it halts at the canary's gate.
        let sick = work.path().join("edge-1").join("sick-fix");
        std::fs::write(&sick, "").unwrap();
        let client = app.mcp_client().await;
        let call = call_in_background(
            &client,
            TOOL,
            json!({"change": "fix", "runners": RUNNERS, "reason": "roll the fix out"}),
        );
        let id = crate::approvals::wait_for_pending(&watcher).await;
        order(
            &steps,
            1,
            json!({"do": "approve", "who": ["alice", "bob"], "id": id}),
        );
        driver.expect_json("{\"step\": 1, \"approved\": …}").await;
        let row = until_state(&watcher, &id, "halted").await;
        assert_eq!(
            row["result"]["halt"],
            json!({"wave": 1, "runner": "edge-1", "not_run": ["edge-2", "edge-3"]}),
            "{row}"
        );
        assert_eq!(
            marked(work.path(), "fix"),
            ["edge-1"],
            "only the canary ran"
        );

        // 3. The page draws it: the canary's gate failed, the others not run; and says why.
        order(&steps, 2, json!({"do": "halted", "id": id}));
        let shown = driver.expect_json("{\"step\": 2, \"drawing\": …}").await;
        let context = format!("{shown}\n{}", driver.transcript());
        assert_eq!(shown["state"], "halted", "{context}");
        assert_eq!(
            shown["drawing"],
            json!([
                ["edge-1", "gate-failed"],
                ["edge-2", "not-run"],
                ["edge-3", "not-run"]
            ]),
            "{context}"
        );
        assert_eq!(shown["halt"]["wave"], "wave 1 of 2", "{context}");
        assert_eq!(shown["halt"]["runner"], "edge-1", "{context}");
        assert_eq!(shown["halt"]["not_run"], "edge-2, edge-3", "{context}");
        assert!(
            shown["halt"]["why"]
                .as_str()
                .is_some_and(|w| w.contains("edge-1 is failed after fix")),
            "the gate's evidence: {context}"
        );
        assert_eq!(
            shown["buttons"],
            json!(["Resume", "Retry", "Abort"]),
            "{context}"
        );

        // 4. Alice proposes a retry: the page shows the decision's text and what it lets run.
        order(
            &steps,
            3,
            json!({"do": "propose", "choice": "retry", "id": id}),
        );
        let proposed = driver.expect_json("{\"step\": 3, \"decision\": …}").await;
        let context = format!("{proposed}\n{}", driver.transcript());
        let stored = stored_decision(pg, &id);
        let text = stored["text"].as_str().unwrap().to_owned();
        assert_eq!(proposed["decision"]["text"], text.trim_end(), "{context}");
        assert_eq!(proposed["decision"]["choice"], "retry", "{context}");
        assert_eq!(
            proposed["decision"]["runners"], "edge-1, edge-2, edge-3",
            "{context}"
        );
        assert_eq!(
            proposed["decision"]["sha256"],
            emisar::digest::sha256_hex(text.as_bytes()),
            "{context}"
        );
        assert_eq!(
            proposed["decision"]["votes"], "0 of 2 people signed",
            "{context}"
        );

        // 5. A database writer leaves the failed canary out of the retry: a well-formed
        // decision, but not what the halt shown gives. The page refuses it before the click
        // and at it; the authenticator signs nothing; no vote counts.
        let mut tampered = stored.clone();
        tampered["text"] =
            json!(text.replace("runners edge-1,edge-2,edge-3", "runners edge-2,edge-3"));
        tampered["runners"] = json!(["edge-2", "edge-3"]);
        assert_ne!(tampered["text"], stored["text"]);
        store_decision(pg, &id, &tampered);
        order(&steps, 4, json!({"do": "refuse", "who": "alice", "id": id}));
        let refused = driver.expect_json("{\"step\": 4, \"error\": …}").await;
        let context = format!("{refused}\n{}", driver.transcript());
        let says = "`runners`: the decision lets [\"edge-2\", \"edge-3\"] run after wave 1";
        assert!(
            refused["shown_refused"]
                .as_str()
                .is_some_and(|t| t.contains(says)),
            "{context}"
        );
        assert!(
            refused["error"]
                .as_str()
                .is_some_and(|t| t.contains(says) && t.ends_with(": not signed")),
            "{context}"
        );
        assert_eq!(
            refused["sign_count"][0], refused["sign_count"][1],
            "{context}"
        );
        assert_eq!(refused["state"], "halted", "{context}");
        let (_, row) = watcher.get(&format!("/api/approvals/{id}")).await;
        assert_eq!(row["decision"]["votes"], json!([]), "no vote counts: {row}");

        // 6. The decision as the server made it, the canary fixed: alice signs, bob joins, and
        // the rollout completes.
        store_decision(pg, &id, &stored);
        std::fs::remove_file(&sick).unwrap();
        order(&steps, 5, json!({"do": "sign", "who": "alice", "id": id}));
        let signed = driver.expect_json("{\"step\": 5, \"votes\": …}").await;
        let context = format!("{signed}\n{}", driver.transcript());
        assert_eq!(signed["votes"], "1 of 2 people signed: alice", "{context}");
        assert_eq!(signed["state"], "halted", "{context}");
        let counts = signed["sign_count"].as_array().unwrap();
        assert_eq!(
            counts[1].as_u64(),
            counts[0].as_u64().map(|n| n + 1),
            "{context}"
        );
        assert_eq!(
            marked(work.path(), "fix"),
            ["edge-1"],
            "nothing runs on one signature"
        );

        order(
            &steps,
            6,
            json!({"do": "sign", "who": "bob", "id": id, "until": "executed"}),
        );
        let joined = driver.expect_json("{\"step\": 6, \"votes\": …}").await;
        let context = format!("{joined}\n{}", driver.transcript());
        assert_eq!(
            joined["shown"]["votes"], "1 of 2 people signed: alice",
            "{context}"
        );
        assert_eq!(joined["state"], "executed", "{context}");
        assert_eq!(
            joined["drawing"],
            json!([["edge-1", "ok"], ["edge-2", "ok"], ["edge-3", "ok"]]),
            "{context}"
        );
        assert_eq!(
            joined["taken"],
            "After the halt, alice, bob decided to retry (edge-1, edge-2, edge-3).",
            "{context}"
        );
        order(&steps, 7, json!({"do": "done"}));
        let status = driver.wait_exit().await;
        assert!(status.success(), "{status}\n{}", driver.transcript());
        let _ = call.await;
        client.cancel().await.unwrap();
        (app, watcher, id)
    };
    let (app, watcher, id) = match tokio::time::timeout(Duration::from_secs(240), run).await {
        Ok(out) => out,
        Err(_) => panic!(
            "the decision browser test did not finish within 240 s\n{}",
            driver.transcript()
        ),
    };

    // By the runners' own records: the canary twice (the bad run, the retry), then the rest.
    let marks = marked(work.path(), "fix");
    assert_eq!(marks.len(), 4, "{marks:?}");
    assert_eq!(&marks[..2], ["edge-1", "edge-1"], "{marks:?}");
    let (_, row) = watcher.get(&format!("/api/approvals/{id}")).await;
    let decision = &row["decision"];
    assert_eq!(decision["taken"], true, "{row}");
    let voters: Vec<&str> = decision["votes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["user"].as_str().unwrap())
        .collect();
    assert_eq!(voters, ["alice", "bob"], "{row}");
    for vote in decision["votes"].as_array().unwrap() {
        assert_eq!(vote["signature"]["kind"], "webauthn", "{vote}");
    }
    app.verify_with_cli();
    for name in [
        "01-halted.png",
        "02-decision.png",
        "03-refused.png",
        "04-completed.png",
    ] {
        assert_png(&shots.join(name));
    }
}

/// Where the runners check no signatures, the same page decides without passkeys: one person
/// approves a rollout that halts on its canary, proposes an abort in the portal and votes for
/// it without a signature (the server refuses a signed vote there); the request ends
/// `aborted` and nothing more runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_person_aborts_a_halted_rollout_whose_runners_check_no_signatures() {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let node = require("node/bin/node");
    let chromium = require_path(Path::new(CHROMIUM));
    require_path(&repo.join("tests/browser/node_modules/playwright-core/package.json"));
    let work = tempfile::tempdir().unwrap();
    let steps = work.path().join("steps");
    std::fs::create_dir_all(&steps).unwrap();
    let shots = repo.join("target").join("decision-e2e-unsigned");
    std::fs::create_dir_all(&shots).unwrap();
    let packs = work.path().join("packs");
    std::fs::create_dir_all(&packs).unwrap();
    std::fs::write(packs.join("roll.yaml"), PACK).unwrap();
    let policy = work.path().join("policy.yaml");
    std::fs::write(&policy, "rollout:\n  default: {canary: 1, wave: 2}\n").unwrap();
    let runners = RUNNERS
        .iter()
        .map(|name| RunnerSpec::new(name).path_first(&node_programs(work.path(), name)))
        .collect();
    let app = spawn_app(
        Backend::Sqlite,
        runners,
        Options {
            packs_dir: Some(packs),
            policy_file: Some(policy),
            approval_wait_secs: Some(300),
            ..Default::default()
        },
    )
    .await;
    let alice_password = add_user(&app, "alice", Role::Approver).await;
    let bob_password = add_user(&app, "bob", Role::Approver).await;
    let watcher = signed_in(&app, "carol", Role::Approver).await;
    let mut driver = Driver::spawn(
        &repo,
        &node,
        "tests/browser/decision_e2e.mjs",
        &[
            ("PORTAL_URL", format!("{}/", app.base_url())),
            ("ALICE_PASSWORD", alice_password),
            ("BOB_PASSWORD", bob_password),
            ("STEPS_DIR", steps.display().to_string()),
            ("SCREENSHOT_DIR", shots.display().to_string()),
            ("CHROMIUM", chromium.display().to_string()),
            ("TMPDIR", work.path().display().to_string()),
            ("UNSIGNED", "1".into()),
        ],
    );

    let run = async {
        assert_eq!(
            driver.expect_json("{\"registered\": null}").await,
            json!({"registered": null})
        );
        std::fs::write(work.path().join("edge-1").join("sick-bad"), "").unwrap();
        let client = app.mcp_client().await;
        let call = call_in_background(
            &client,
            TOOL,
            json!({"change": "bad", "runners": RUNNERS, "reason": "roll it out"}),
        );
        let id = crate::approvals::wait_for_pending(&watcher).await;
        let (_, request) = watcher.get(&format!("/api/approvals/{id}")).await;
        assert_eq!(request["statement"], Value::Null, "{request}");
        assert_eq!(request["required_approvals"], 1, "{request}");
        order(
            &steps,
            1,
            json!({"do": "approve", "who": ["alice"], "id": id}),
        );
        driver.expect_json("{\"step\": 1, \"approved\": …}").await;
        until_state(&watcher, &id, "halted").await;

        order(&steps, 2, json!({"do": "halted", "id": id}));
        let shown = driver.expect_json("{\"step\": 2, \"drawing\": …}").await;
        let context = format!("{shown}\n{}", driver.transcript());
        assert_eq!(
            shown["drawing"],
            json!([
                ["edge-1", "gate-failed"],
                ["edge-2", "not-run"],
                ["edge-3", "not-run"]
            ]),
            "{context}"
        );

        order(
            &steps,
            3,
            json!({"do": "propose", "choice": "abort", "id": id}),
        );
        let proposed = driver.expect_json("{\"step\": 3, \"decision\": …}").await;
        let context = format!("{proposed}\n{}", driver.transcript());
        assert_eq!(proposed["decision"]["choice"], "abort", "{context}");
        assert_eq!(proposed["decision"]["runners"], "none", "{context}");
        assert_eq!(
            proposed["decision"]["votes"], "0 of 1 people voted for it",
            "{context}"
        );
        assert_eq!(proposed["decision"]["refused"], Value::Null, "{context}");

        order(
            &steps,
            4,
            json!({"do": "sign", "who": "alice", "id": id, "until": "aborted"}),
        );
        let voted = driver.expect_json("{\"step\": 4, \"votes\": …}").await;
        let context = format!("{voted}\n{}", driver.transcript());
        assert_eq!(voted["state"], "aborted", "{context}");
        assert_eq!(
            voted["taken"], "After the halt, alice decided to abort (no runner).",
            "{context}"
        );
        assert_eq!(
            voted["drawing"],
            json!([
                ["edge-1", "gate-failed"],
                ["edge-2", "not-run"],
                ["edge-3", "not-run"]
            ]),
            "{context}"
        );
        order(&steps, 5, json!({"do": "done"}));
        let status = driver.wait_exit().await;
        assert!(status.success(), "{status}\n{}", driver.transcript());
        let _ = call.await;
        client.cancel().await.unwrap();
        id
    };
    let id = match tokio::time::timeout(Duration::from_secs(180), run).await {
        Ok(id) => id,
        Err(_) => panic!(
            "the unsigned decision browser test did not finish within 180 s\n{}",
            driver.transcript()
        ),
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        marked(work.path(), "bad"),
        ["edge-1"],
        "the abort ran nothing"
    );
    let (_, row) = watcher.get(&format!("/api/approvals/{id}")).await;
    let votes = row["decision"]["votes"].as_array().unwrap();
    assert_eq!(votes.len(), 1, "{row}");
    assert_eq!(votes[0]["user"], "alice", "{row}");
    assert!(votes[0].get("signature").is_none(), "{row}");
}
