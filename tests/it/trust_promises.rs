//! The trust features' promise (issue 45), attacked as an insider with `server.key`, the log
//! key or the database would, on PostgreSQL with TLS runners (and real witnesses where the
//! runner requires them): what people see is what they sign and what runs; a witnessed
//! approval runs only the call it binds; an approvers file is one file per serial; the runner
//! holds the `required` count people signed for; and neither a restart nor a lost or torn
//! state file lets one approval run twice. Each attack is refused and nothing runs. The
//! preview-values attack also runs on SQLite and against the binaries that ship.

use std::path::PathBuf;

use emisar::digest::json_digest;
use emisar::protocol::approval::{ApprovalProof, Plan, SignedApprovers, Statement, sshsig};
use emisar::protocol::{CallRequest, Mode};
use emisar::server::audit::AuditFilter;
use emisar::server::principal::Role;
use serde_json::{Value, json};

use crate::approvals::{
    call_in_background, finished, restarts, signed_in, systemctl_standin, wait_for_pending,
};
use crate::both_backends_every_build;
use crate::harness::app::{Options, Signed, TestApp};
use crate::harness::certs::self_signed;
use crate::harness::{Backend, Build, RunnerSpec, spawn_app};
use crate::signed_approvals::{Agent, TOOL, approvers_text, emisar, in_secs, proof, sign};

/// The organisation root key's seed: hvn07 and hvn08 trust only approvers files it signed.
const ROOT: u8 = 9;

struct Lab {
    _bin: tempfile::TempDir,
    record: PathBuf,
    app: TestApp,
}

/// A TLS runner (its self-signed certificate pinned by the server) that restarts consul or
/// nomad through a recording `systemctl`.
fn tls_runner(bin: &std::path::Path, name: &str) -> RunnerSpec {
    let cert = self_signed(bin, name);
    RunnerSpec::new(name)
        .path_first(bin)
        .allow("systemd_units", &["consul", "nomad"])
        .https(cert.clone(), Some(cert.fingerprint.to_string()))
}

/// hvn05 trusts the approvers file on disk (a restart needs alice and bob); hvn07 a file the
/// server carries signed by the root key; hvn08 the same, but none below serial 2.
async fn signed_lab() -> Lab {
    signed_lab_with(None).await
}

/// [`signed_lab`] with the server's policy file `policy` (YAML).
async fn signed_lab_with(policy: Option<&str>) -> Lab {
    let bin = tempfile::tempdir().unwrap();
    let policy_file = policy.map(|p| {
        let path = bin.path().join("policy.yaml");
        std::fs::write(&path, p).unwrap();
        path
    });
    let record = systemctl_standin(bin.path());
    let file = bin.path().join("approvers.toml");
    std::fs::write(&file, approvers_text()).unwrap();
    let sig = bin.path().join("approvers.toml.sig");
    std::fs::write(&sig, carried(&approvers_text()).signature).unwrap();
    let root = [crate::signed_approvals::pub_line(ROOT)];
    let app = spawn_app(
        Backend::Postgres,
        vec![
            tls_runner(bin.path(), "hvn05").signed_approvals(&["*"], Some(file.clone()), &[]),
            tls_runner(bin.path(), "hvn07").signed_approvals(&["*"], None, &root),
            tls_runner(bin.path(), "hvn08")
                .signed_approvals(&["*"], None, &root)
                .min_approvers_serial(2),
        ],
        Options {
            approvers_file: Some(file),
            approvers_signature_file: Some(sig),
            policy_file,
            ..Default::default()
        },
    )
    .await;
    Lab {
        _bin: bin,
        record,
        app,
    }
}

/// An approvers file as the server carries it, signed by the root key.
fn carried(text: &str) -> SignedApprovers {
    SignedApprovers {
        signature: sign(ROOT, sshsig::APPROVERS_NAMESPACE, text),
        text: text.to_owned(),
    }
}

/// The statement of a restart of `unit` on `runners` as a server would write it now: a
/// UUIDv7 id, two people required, expiring in ten minutes.
fn statement(app: &TestApp, unit: &str, runners: &[&str]) -> Statement {
    let packs = emisar::pack::PackSet::load(app.packs_dir.as_deref()).unwrap();
    Statement {
        approval_id: uuid::Uuid::now_v7().to_string(),
        tool: TOOL.into(),
        pack_sha256: packs.pack("linux").unwrap().digest.clone(),
        args_sha256: json_digest(&json!({ "unit": unit })),
        runners: runners.iter().map(|r| ((*r).to_owned(), None)).collect(),
        plan: Plan {
            waves: vec![runners.iter().map(|r| (*r).to_owned()).collect()],
            pause_secs: 0,
        },
        required: 2,
        policy_sha256: "0".repeat(64),
        requester: "agent:test-agent".into(),
        expires_at: in_secs(600),
    }
}

/// What a server holding server.key sends `runner` on its own: a restart of `unit` under
/// `approval_id` (or the policy's lowering), carrying `approval` and `witnessed`.
async fn execute(
    app: &TestApp,
    runner: &str,
    unit: &str,
    approval_id: Option<&str>,
    approval: Option<ApprovalProof>,
    witnessed: Option<emisar::protocol::witnessed::WitnessedApproval>,
) -> (u16, String) {
    let request = CallRequest {
        tool: TOOL.into(),
        args: json!({ "unit": unit }).as_object().unwrap().clone(),
        mode: Mode::Execute,
        preview: None,
        preview_seal: None,
        raw: false,
        approval,
        witnessed,
        secret_salt: None,
        // The one wave of a one-wave plan.
        wave: Some(1),
        decision: None,
        grant: None,
    };
    let answer = app
        .signed_request(
            runner,
            &request,
            &Signed {
                call_id: uuid::Uuid::new_v4().to_string(),
                approval_id: approval_id.map(str::to_owned),
                lowered_by_policy: approval_id.is_none().then(|| "1".repeat(64)),
            },
        )
        .await;
    let error = answer.body["error"].as_str().unwrap_or_default().to_owned();
    (answer.status, error)
}

/// `s` signed by alice and bob, sent by a server holding server.key to `runner` for `unit`.
async fn signed_by_two(app: &TestApp, runner: &str, unit: &str, s: &Statement) -> (u16, String) {
    execute(
        app,
        runner,
        unit,
        Some(&s.approval_id),
        Some(proof(s, &[1, 2])),
        None,
    )
    .await
}

/// A refusal with `status` whose reason says `why`.
#[track_caller]
fn refused(answer: (u16, String), status: u16, why: &str) {
    assert_eq!(answer.0, status, "{}", answer.1);
    assert!(
        answer.1.contains(why),
        "`{}` does not say `{why}`",
        answer.1
    );
}

/// The units the recording `systemctl` restarted, in order.
fn restarted(record: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(record)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.strip_prefix("restart "))
        .map(|l| l.rsplit(' ').next().unwrap_or_default().to_owned())
        .collect()
}

/// The runner holds what people signed for: the statement's own `required`, a bounded
/// lifetime, one approvers file per serial (before and after a restart), a
/// `min_approvers_serial` for a fresh state, and no second run after a restart, a torn ledger
/// line, or a lost state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_runs_only_what_people_signed_for_under_one_file_per_serial() {
    let mut lab = signed_lab().await;
    let app = &mut lab.app;

    // The policy asked three people and the statement says `required 3`; two signed (the
    // file's rule is two), a third denied, and the server replays the two signatures.
    let mut three = statement(app, "consul", &["hvn05"]);
    three.required = 3;
    refused(
        execute(
            app,
            "hvn05",
            "consul",
            Some(&three.approval_id),
            Some(proof(&three, &[1, 2])),
            None,
        )
        .await,
        403,
        "`required 3`",
    );
    // Two signatures over a statement that expires in 2099.
    let mut far = statement(app, "consul", &["hvn05"]);
    far.expires_at = "2099-01-01T00:00:00Z".into();
    refused(
        execute(
            app,
            "hvn05",
            "consul",
            Some(&far.approval_id),
            Some(proof(&far, &[1, 2])),
            None,
        )
        .await,
        403,
        "`expires`",
    );
    assert_eq!(restarts(&lab.record), 0);

    // hvn07 takes the root-signed file at serial 1 and runs what alice and bob signed.
    let good = statement(app, "consul", &["hvn07"]);
    let mut p = proof(&good, &[1, 2]);
    p.approvers = Some(carried(&approvers_text()));
    let (status, why) = execute(
        app,
        "hvn07",
        "consul",
        Some(&good.approval_id),
        Some(p),
        None,
    )
    .await;
    assert_eq!(status, 200, "{why}");
    assert_eq!(restarted(&lab.record), ["consul"]);

    // An older, looser file at the same serial, also root-signed: one signature for a restart…
    let looser = approvers_text().replacen("approvals = 2\n", "approvals = 1\n", 1);
    assert_ne!(looser, approvers_text());
    let one = statement(app, "nomad", &["hvn07"]);
    let mut p = proof(&one, &[1]);
    p.approvers = Some(carried(&looser));
    let at_one = execute(
        app,
        "hvn07",
        "nomad",
        Some(&one.approval_id),
        Some(p.clone()),
        None,
    );
    refused(
        at_one.await,
        403,
        "not the one this runner accepted at serial 1",
    );
    // …or an older file, at serial 0…
    let older = approvers_text().replace("serial = 1", "serial = 0");
    let mut p0 = proof(&one, &[1, 2]);
    p0.approvers = Some(carried(&older));
    refused(
        execute(
            app,
            "hvn07",
            "nomad",
            Some(&one.approval_id),
            Some(p0),
            None,
        )
        .await,
        403,
        "older than serial 1 this runner accepted",
    );
    // …or a restart the server's policy lowered, with no signature at all.
    let open =
        approvers_text().replacen("approvals = 2\n", "approvals = 2\nunapproved = true\n", 1);
    let lowered = ApprovalProof {
        statement: String::new(),
        signatures: Vec::new(),
        approvers: Some(carried(&open)),
    };
    refused(
        execute(app, "hvn07", "nomad", None, Some(lowered.clone()), None).await,
        403,
        "not the one this runner accepted at serial 1",
    );
    // A restart of the runner keeps the file it accepted at serial 1.
    app.restart_runner("hvn07", false).await;
    refused(
        execute(app, "hvn07", "nomad", Some(&one.approval_id), Some(p), None).await,
        403,
        "not the one this runner accepted at serial 1",
    );
    refused(
        execute(app, "hvn07", "nomad", None, Some(lowered), None).await,
        403,
        "not the one this runner accepted at serial 1",
    );
    // hvn08 is new, and its config names serial 2 as the lowest it takes.
    let eight = statement(app, "consul", &["hvn08"]);
    let mut p = proof(&eight, &[1, 2]);
    p.approvers = Some(carried(&approvers_text()));
    refused(
        execute(
            app,
            "hvn08",
            "consul",
            Some(&eight.approval_id),
            Some(p),
            None,
        )
        .await,
        403,
        "below this runner's min_approvers_serial 2",
    );
    assert_eq!(restarted(&lab.record), ["consul"], "nothing else ran");
    // At serial 3, a file that lets the policy lower a restart: hvn08 runs the lowered write
    // with no signature, as its root-signed file says.
    let lowering = approvers_text()
        .replace("serial = 1", "serial = 3")
        .replacen("approvals = 2\n", "approvals = 2\nunapproved = true\n", 1);
    let lowered = ApprovalProof {
        statement: String::new(),
        signatures: Vec::new(),
        approvers: Some(carried(&lowering)),
    };
    let (status, why) = execute(app, "hvn08", "nomad", None, Some(lowered), None).await;
    assert_eq!(status, 200, "{why}");
    assert_eq!(restarted(&lab.record), ["consul", "nomad"]);

    // hvn05 runs a signed restart once; a restart of the runner remembers it…
    let once = statement(app, "consul", &["hvn05"]);
    let (status, why) = signed_by_two(app, "hvn05", "consul", &once).await;
    assert_eq!(status, 200, "{why}");
    assert_eq!(restarts(&lab.record), 3);
    app.restart_runner("hvn05", false).await;
    refused(
        signed_by_two(app, "hvn05", "consul", &once).await,
        409,
        "already executed",
    );
    // …and so does one whose ledger ends in a torn line (a crash mid-append).
    let ledger = app
        .dir
        .path()
        .join("state-hvn05")
        .join("approvals-executed");
    let mut text = std::fs::read_to_string(&ledger).unwrap();
    assert!(text.contains(&once.approval_id), "{text}");
    text.push_str("0193f4c2-7a10-7cc0-9f00-0000000");
    std::fs::write(&ledger, text).unwrap();
    app.restart_runner("hvn05", false).await;
    refused(
        signed_by_two(app, "hvn05", "consul", &once).await,
        409,
        "already executed",
    );
    // With its state_dir lost, it refuses everything requested before its new state began.
    app.restart_runner("hvn05", true).await;
    refused(
        signed_by_two(app, "hvn05", "consul", &once).await,
        403,
        "state_dir is new or was lost",
    );
    assert_eq!(restarts(&lab.record), 3, "each approval ran once");
    // What is requested after the new state began runs.
    let after = statement(app, "nomad", &["hvn05"]);
    let (status, why) = execute(
        app,
        "hvn05",
        "nomad",
        Some(&after.approval_id),
        Some(proof(&after, &[1, 2])),
        None,
    )
    .await;
    assert_eq!(status, 200, "{why}");
    assert_eq!(
        restarted(&lab.record),
        ["consul", "nomad", "consul", "nomad"]
    );
}

/// The server asks as many people as its policy says when that is more than the approvers
/// file's rule, and the statement people sign says so (the runner then holds it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_policy_asks_more_people_than_the_file_and_the_statement_says_so() {
    let lab = signed_lab_with(Some("approvers:\n  linux.systemctl_restart: 3\n")).await;
    let app = &lab.app;
    let watcher = signed_in(app, "carol", Role::Approver).await;
    let client = app.mcp_client().await;
    let call = call_in_background(
        &client,
        TOOL,
        json!({"unit": "consul", "runners": ["hvn05"], "reason": "three people"}),
    );
    let id = wait_for_pending(&watcher).await;
    let (_, request) = watcher.get(&format!("/api/approvals/{id}")).await;
    assert_eq!(request["required_approvals"], 3, "{request}");
    let text = request["statement"]["text"].as_str().unwrap();
    assert!(text.contains("\nrequired 3\n"), "{text}");
    drop(call);
}

/// A write with a preview: people sign the digest of the values the runner sealed, and the
/// runner binds its own line of the statement to the values the execution brings. A server
/// that previews the same call twice and executes with the other preview's (equally sealed)
/// values gets nothing.
async fn a_signed_write_runs_only_with_the_preview_values_people_signed(
    backend: Backend,
    build: Build,
) {
    let packs = tempfile::tempdir().unwrap();
    std::fs::write(
        packs.path().join("pv.yaml"),
        "pack: pv\ndescription: A write whose preview captures a value that changes.\ntools:\n  stamp:\n    description: Touches `path`; its preview captures the time.\n    risk: high\n    scope: node\n    params:\n      path:\n        type: string\n        pattern: '^/tmp/[A-Za-z0-9._/-]+$'\n    preview:\n      steps:\n        - name: look\n          read_only: true\n          exec:\n            argv: [\"date\", \"+%s%N\"]\n          capture:\n            nanos: '.steps.look.stdout | rtrimstr(\"\\n\")'\n    verify: {none: this test never rolls the write out}\n    steps:\n      - name: write\n        exec:\n          argv: [\"touch\", \"{path}\"]\n",
    )
    .unwrap();
    let bin = tempfile::tempdir().unwrap();
    let file = bin.path().join("approvers.toml");
    std::fs::write(&file, approvers_text()).unwrap();
    let app = spawn_app(
        backend,
        vec![tls_runner(bin.path(), "hvn05").signed_approvals(&["pv.*"], Some(file.clone()), &[])],
        Options {
            packs_dir: Some(packs.path().to_owned()),
            approvers_file: Some(file),
            build,
            ..Default::default()
        },
    )
    .await;
    let target = bin.path().join("stamped");
    let args = json!({"path": target.to_str().unwrap()});
    let request = |mode, preview: Option<&Value>| CallRequest {
        tool: "pv.stamp".into(),
        args: args.as_object().unwrap().clone(),
        mode,
        preview: preview.map(|p| p["vars"].as_object().unwrap().clone()),
        preview_seal: preview.map(|p| p["seal"].as_str().unwrap().to_owned()),
        raw: false,
        approval: None,
        witnessed: None,
        secret_salt: None,
        wave: Some(1),
        decision: None,
        grant: None,
    };
    let id = uuid::Uuid::now_v7().to_string();
    let signed = || Signed {
        call_id: "call-1".into(),
        approval_id: Some(id.clone()),
        lowered_by_policy: None,
    };
    let preview = || async {
        let answer = app
            .signed_request("hvn05", &request(Mode::Preview, None), &signed())
            .await;
        assert_eq!(answer.status, 200, "{}", answer.body);
        answer.body
    };
    let shown = preview().await;
    let other = preview().await;
    assert_ne!(shown["vars"], other["vars"], "two previews, two times");
    let packs_loaded = emisar::pack::PackSet::load(Some(packs.path())).unwrap();
    let statement = Statement {
        approval_id: id.clone(),
        tool: "pv.stamp".into(),
        pack_sha256: packs_loaded.pack("pv").unwrap().digest.clone(),
        args_sha256: json_digest(&args),
        runners: [("hvn05".to_owned(), Some(json_digest(&shown["vars"])))].into(),
        plan: Plan::one_wave([&"hvn05".to_owned()]),
        required: 1,
        policy_sha256: "0".repeat(64),
        requester: "agent:test-agent".into(),
        expires_at: in_secs(600),
    };
    let with = |preview: &Value| CallRequest {
        approval: Some(proof(&statement, &[1])),
        ..request(Mode::Execute, Some(preview))
    };
    let answer = app.signed_request("hvn05", &with(&other), &signed()).await;
    assert_eq!(answer.status, 403, "{}", answer.body);
    let error = answer.body["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("differs from this call in `runner`"),
        "{error}"
    );
    assert!(!target.exists(), "nothing ran");
    // The values people signed run.
    let answer = app.signed_request("hvn05", &with(&shown), &signed()).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert!(target.exists());
}
both_backends_every_build!(a_signed_write_runs_only_with_the_preview_values_people_signed);

/// Sets the stored request's `column` (a database writer).
async fn set_column(app: &TestApp, id: &str, column: &str, value: &str) {
    let sql = format!(
        "UPDATE approvals SET {column} = '{}'{} WHERE id = '{id}'",
        value.replace('\'', "''"),
        if column == "args" { "::jsonb" } else { "" }
    );
    app.pg.as_ref().unwrap().superuser_sql(&sql).unwrap();
}

/// What people see is what they sign: `emisar approvals approve` recomputes every line of the
/// statement from what the request shows and refuses a statement a database writer changed
/// (the arguments and the statement's digest of them, a far-future expiry, the count of
/// people, the runners), naming the field; nothing is signed, no vote counts, nothing runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_terminal_signs_only_what_it_shows() {
    let lab = signed_lab().await;
    let app = &lab.app;
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(dir.path());
    let alice_pub = agent.add(dir.path(), 1);
    let alice = app.issue_token("alice", Role::Approver).await;
    let watcher = signed_in(app, "carol", Role::Approver).await;
    let client = app.mcp_client().await;
    let call = call_in_background(
        &client,
        TOOL,
        json!({"unit": "consul", "runners": ["hvn05"], "reason": "consul is wedged"}),
    );
    let id = wait_for_pending(&watcher).await;
    let (_, request) = watcher.get(&format!("/api/approvals/{id}")).await;
    let text = request["statement"]["text"].as_str().unwrap().to_owned();
    let base = app.base_url();
    let approve = || async {
        let out = emisar(
            &agent.socket,
            &[
                "approvals",
                "approve",
                &id,
                "--ssh-key",
                alice_pub.to_str().unwrap(),
                "--server",
                &base,
                "--token",
                &alice,
            ],
        )
        .await;
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let line = |key: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("{key} ")))
            .unwrap()
            .to_owned()
    };
    // The args the runner would receive, and the statement's digest of them, say nomad; the
    // request shows consul (its shown args, and the audit log, kept consul).
    let nomad = line("args").replace(
        &json_digest(&json!({"unit": "consul"})),
        &json_digest(&json!({"unit": "nomad"})),
    );
    let edits = [
        (
            "args",
            r#"{"unit": "nomad"}"#.to_owned(),
            text.replace(&line("args"), &nomad),
            "`args`",
        ),
        (
            "args",
            r#"{"unit": "consul"}"#.to_owned(),
            text.replace(&line("expires"), "expires 2099-01-01T00:00:00Z"),
            "`expires`",
        ),
        (
            "args",
            r#"{"unit": "consul"}"#.to_owned(),
            text.replace("required 2", "required 1"),
            "`required`",
        ),
        (
            "args",
            r#"{"unit": "consul"}"#.to_owned(),
            text.replace(
                &line("runner"),
                &format!("{}\nrunner hvn07 preview none", line("runner")),
            )
            .replace(&line("wave"), &format!("{},hvn07", line("wave"))),
            "`runner`",
        ),
    ];
    for (column, args, statement, field) in edits {
        set_column(app, &id, column, &args).await;
        set_column(app, &id, "statement", &statement).await;
        let (ok, said) = approve().await;
        assert!(!ok, "signed a statement edited in `{field}`: {said}");
        assert!(
            said.contains(field) && said.contains("not signed"),
            "{said}"
        );
        let (_, row) = watcher.get(&format!("/api/approvals/{id}")).await;
        assert_eq!(row["approvals"], json!([]), "no vote counts: {row}");
    }
    // The request as it was: the terminal shows consul, signs, and the vote counts.
    set_column(app, &id, "args", r#"{"unit": "consul"}"#).await;
    set_column(app, &id, "statement", &text).await;
    let (ok, said) = approve().await;
    assert!(ok, "{said}");
    assert!(said.contains(r#"args     {"unit":"consul"}"#), "{said}");
    let (_, row) = watcher.get(&format!("/api/approvals/{id}")).await;
    assert_eq!(row["approvals"].as_array().unwrap().len(), 1, "{row}");
    assert_eq!(restarts(&lab.record), 0, "one of two people: nothing ran");
    drop(call);
}

/// A witnessed approval runs only the call it binds: one honest, witnessed approval of
/// "restart consul on hvn05" proves nothing for nomad, for hvn06, for a second run (before or
/// after a restart, or once the state is lost), and the first of two votes proves nothing at
/// all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_witnessed_approval_runs_only_the_call_it_binds() {
    use crate::transparency::{ORIGIN, transparency, witness};
    let dir = tempfile::tempdir().unwrap();
    let log_key = dir.path().join("log.key");
    let key = emisar::tlog::keys::NoteKey::generate(ORIGIN).unwrap();
    emisar::util::files::create_private(&log_key, key.private_text().as_bytes()).unwrap();
    let w1 = witness(dir.path(), "w1", &key.verifier_key()).await;
    let w2 = witness(dir.path(), "w2", &key.verifier_key()).await;
    let bin = tempfile::tempdir().unwrap();
    let record = systemctl_standin(bin.path());
    let witnesses = [w1.vkey.clone(), w2.vkey.clone()];
    let runner = |name: &str| {
        tls_runner(bin.path(), name).require_witnessed(&key.verifier_key(), &witnesses, None)
    };
    let policy = bin.path().join("policy.yaml");
    std::fs::write(&policy, "approvers:\n  linux.systemctl_restart: 2\n").unwrap();
    let mut app = spawn_app(
        Backend::Postgres,
        vec![runner("hvn05"), runner("hvn06")],
        Options {
            transparency: Some(transparency(log_key, [&w1, &w2], 200, 1000)),
            policy_file: Some(policy),
            ..Default::default()
        },
    )
    .await;

    let client = app.mcp_client().await;
    let call = call_in_background(
        &client,
        TOOL,
        json!({"runners": ["hvn05"], "unit": "consul", "reason": "witnessed restart"}),
    );
    let alice = signed_in(&app, "alice", Role::Approver).await;
    let bob = signed_in(&app, "bob", Role::Approver).await;
    let id = wait_for_pending(&alice).await;
    let (status, body) = alice.approve(&id).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["state"], "pending", "{body}");
    // The first vote's event, witnessed, while the request is still pending.
    let first = witnessed(&app, &id).await;
    assert_eq!(first.event.detail.as_ref().unwrap()["state"], "pending");
    refused(
        execute(&app, "hvn05", "consul", Some(&id), None, Some(first)).await,
        403,
        "only the vote that approved it",
    );
    assert_eq!(restarts(&record), 0);

    let (status, body) = bob.approve(&id).await;
    assert_eq!(status, 200, "{body}");
    let out = finished(call).await.structured_content.unwrap();
    assert_eq!(out["approval"]["state"], "executed", "{out}");
    assert_eq!(restarted(&record), ["consul"]);
    let good = witnessed(&app, &id).await;
    assert_eq!(good.event.detail.as_ref().unwrap()["state"], "approved");

    // The honest proof replayed for other arguments, on another runner, and again.
    refused(
        execute(&app, "hvn05", "nomad", Some(&id), None, Some(good.clone())).await,
        403,
        "binds `args`",
    );
    refused(
        execute(&app, "hvn06", "consul", Some(&id), None, Some(good.clone())).await,
        403,
        "not this runner (`hvn06`)",
    );
    refused(
        execute(&app, "hvn05", "consul", Some(&id), None, Some(good.clone())).await,
        409,
        "already executed",
    );
    app.restart_runner("hvn05", false).await;
    refused(
        execute(&app, "hvn05", "consul", Some(&id), None, Some(good.clone())).await,
        409,
        "already executed",
    );
    app.restart_runner("hvn05", true).await;
    refused(
        execute(&app, "hvn05", "consul", Some(&id), None, Some(good)).await,
        403,
        "state_dir is new or was lost",
    );
    assert_eq!(
        restarted(&record),
        ["consul"],
        "it ran once, and nothing else ran"
    );
}

/// The newest `approval.approved` event of `id` with its proof in a checkpoint both
/// witnesses cosigned (waiting for the checkpointer).
async fn witnessed(app: &TestApp, id: &str) -> emisar::protocol::witnessed::WitnessedApproval {
    let event = app
        .events(AuditFilter {
            approval_id: Some(id.to_owned()),
            kind: Some("approval.approved".into()),
            limit: 10,
            ..Default::default()
        })
        .await
        .into_iter()
        .max_by_key(|e| e.seq)
        .unwrap();
    for _ in 0..100 {
        if let Ok(p) = emisar::server::audit::proofs::prove(&app.db, &event.id, 2).await {
            return emisar::protocol::witnessed::WitnessedApproval {
                event: p.event,
                checkpoint: p.checkpoint,
                proof: p.proof,
            };
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("event {} was not witnessed within 10 s", event.seq);
}

const PASSKEY_RP: &str = "emisar.example.com";
const PASSKEY_ORIGIN: &str = "https://emisar.example.com";

/// A person's passkey as the approvers file lists it, registered as the portal registers one.
fn passkey_entry(auth: &crate::passkeys::SoftAuthenticator) -> String {
    use base64::Engine;
    use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
    let challenge = [7u8; 32];
    let reg = auth.create(&challenge, PASSKEY_ORIGIN, "key");
    let bytes = |k: &str| URL_SAFE_NO_PAD.decode(reg[k].as_str().unwrap()).unwrap();
    let rp = emisar::protocol::approval::webauthn::RelyingParty {
        rp_id: PASSKEY_RP.into(),
        origins: vec![PASSKEY_ORIGIN.into()],
    };
    let key = emisar::protocol::approval::webauthn::parse_registration(
        &rp,
        &challenge,
        &bytes("attestation_object"),
        &bytes("client_data_json"),
    )
    .unwrap();
    format!(
        "passkeys = [{{ id = \"{}\", alg = \"{}\", public_key = \"{}\" }}]",
        URL_SAFE_NO_PAD.encode(&key.credential_id),
        key.alg.as_str(),
        STANDARD.encode(&key.public_key)
    )
}

/// A passkey's signature over a statement's text (its SHA-256 is the challenge).
fn passkey_signature(
    auth: &crate::passkeys::SoftAuthenticator,
    text: &str,
) -> emisar::protocol::approval::Signature {
    use base64::Engine;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let a = auth.get(
        &emisar::protocol::approval::statement::hash_text(text),
        PASSKEY_ORIGIN,
    );
    let b = |v: &[u8]| URL_SAFE_NO_PAD.encode(v);
    emisar::protocol::approval::Signature::Webauthn {
        signer: "portal".into(),
        credential_id: b(&a.credential_id),
        authenticator_data: b(&a.authenticator_data),
        client_data_json: b(&a.client_data_json),
        signature: b(&a.signature),
    }
}

/// A rule with `ssh_signatures = 1`: two passkeys alone (the portal's page, which a
/// compromised server serves) never make a restart run; with one signature from the terminal
/// it runs. The server refuses the deciding passkey vote at once, and the runner refuses two
/// passkey signatures a server replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_that_asks_for_the_terminal_takes_no_passkeys_alone() {
    use crate::passkeys::SoftAuthenticator;
    let (pa, pb) = (SoftAuthenticator::new(), SoftAuthenticator::new());
    let text = format!(
        "serial = 1\n[webauthn]\nrp_id = \"{PASSKEY_RP}\"\norigins = [\"{PASSKEY_ORIGIN}\"]\n\n\
         [[person]]\nname = \"alice\"\n{}\n\n[[person]]\nname = \"bob\"\n{}\n\n\
         [[person]]\nname = \"carol\"\nssh = [\"{}\"]\n\n\
         [[rule]]\ntools = \"{TOOL}\"\napprovals = 2\nssh_signatures = 1\n",
        passkey_entry(&pa),
        passkey_entry(&pb),
        crate::signed_approvals::pub_line(3)
    );
    let bin = tempfile::tempdir().unwrap();
    let record = systemctl_standin(bin.path());
    let file = bin.path().join("approvers.toml");
    std::fs::write(&file, &text).unwrap();
    let app = spawn_app(
        Backend::Postgres,
        vec![tls_runner(bin.path(), "hvn05").signed_approvals(&["*"], Some(file.clone()), &[])],
        Options {
            approvers_file: Some(file),
            ..Default::default()
        },
    )
    .await;

    // A server replays two passkey signatures: the runner wants one from the terminal.
    let s = statement(&app, "consul", &["hvn05"]);
    let st = s.text().unwrap();
    let two_passkeys = ApprovalProof {
        signatures: vec![passkey_signature(&pa, &st), passkey_signature(&pb, &st)],
        statement: st.clone(),
        approvers: None,
    };
    refused(
        execute(
            &app,
            "hvn05",
            "consul",
            Some(&s.approval_id),
            Some(two_passkeys),
            None,
        )
        .await,
        403,
        "needs 1 SSH signatures",
    );
    assert_eq!(restarts(&record), 0);

    // Through the server: the second passkey vote would decide, and is refused at once.
    let client = app.mcp_client().await;
    let call = call_in_background(
        &client,
        TOOL,
        json!({"unit": "consul", "runners": ["hvn05"], "reason": "two people, one at a terminal"}),
    );
    let alice = signed_in(&app, "alice", Role::Approver).await;
    let bob = signed_in(&app, "bob", Role::Approver).await;
    let carol = signed_in(&app, "carol", Role::Approver).await;
    let id = wait_for_pending(&alice).await;
    let (_, request) = alice.get(&format!("/api/approvals/{id}")).await;
    let text = request["statement"]["text"].as_str().unwrap().to_owned();
    let (status, body) = vote(&alice, &id, passkey_signature(&pa, &text)).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = vote(&bob, &id, passkey_signature(&pb, &text)).await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("SSH signatures"),
        "{body}"
    );
    let carol_sig = emisar::protocol::approval::Signature::Ssh {
        signer: "carol".into(),
        signature: sign(3, sshsig::APPROVAL_NAMESPACE, &text),
    };
    let (status, body) = vote(&carol, &id, carol_sig).await;
    assert_eq!(status, 200, "{body}");
    let out = finished(call).await.structured_content.unwrap();
    assert_eq!(out["approval"]["state"], "executed", "{out}");
    assert_eq!(restarted(&record), ["consul"]);
}

/// A person's yes with `signature`, through the approvals API.
async fn vote(
    who: &crate::approvals::Portal,
    id: &str,
    signature: emisar::protocol::approval::Signature,
) -> (u16, Value) {
    who.post(
        &format!("/api/approvals/{id}/approve"),
        json!({ "signature": signature }),
        true,
    )
    .await
}

/// One edit a database writer makes to the stored request between the moment people looked
/// at it and its execution: what the runners receive, what is shown, and each line of the
/// statement, each chosen on its own.
#[derive(Debug, Clone)]
struct Edit {
    /// The unit the runners receive.
    stored: &'static str,
    /// The unit the request shows (its shown args).
    shown: &'static str,
    /// The unit the statement's `args` digest (and `statement.args`) covers.
    signed: &'static str,
    /// The runners the request shows, and the ones the statement names.
    runners_shown: Vec<&'static str>,
    runners_signed: Vec<&'static str>,
    /// A preview digest on the statement's runner lines (the tool has no preview).
    preview_line: bool,
    required_shown: u32,
    required_signed: u32,
    /// Seconds from now to the statement's expiry.
    expires_in: i64,
}

/// An honest request (a unit, its runners, two people, ten minutes) with each field edited
/// with probability 1/4, so that both honest and edited requests come up.
fn arb_edit() -> impl proptest::strategy::Strategy<Value = Edit> {
    use proptest::prelude::*;
    let flip = || proptest::bool::weighted(0.25);
    let sets: [Vec<&'static str>; 3] = [vec!["hvn05"], vec!["hvn06"], vec!["hvn05", "hvn06"]];
    (
        any::<bool>(),
        0..3usize,
        (flip(), flip(), flip()),
        (flip(), 1..3usize, flip(), 1..3usize, flip()),
        (flip(), 1..=3u32, flip(), 1..=3u32),
        (
            flip(),
            prop_oneof![Just(1200i64), Just(5000), Just(2_000_000_000)],
        ),
    )
        .prop_map(move |(nomad, set, units, runners, required, expires)| {
            let (u, other) = if nomad {
                ("nomad", "consul")
            } else {
                ("consul", "nomad")
            };
            let pick = |edited: bool| if edited { other } else { u };
            let base = sets[set].clone();
            let moved = |edited: bool, by: usize| {
                if edited {
                    sets[(set + by) % 3].clone()
                } else {
                    base.clone()
                }
            };
            Edit {
                stored: pick(units.0),
                shown: pick(units.1),
                signed: pick(units.2),
                runners_shown: moved(runners.0, runners.1),
                runners_signed: moved(runners.2, runners.3),
                preview_line: runners.4,
                required_shown: if required.0 { required.1 } else { 2 },
                required_signed: if required.2 { required.3 } else { 2 },
                expires_in: if expires.0 { expires.1 } else { 600 },
            }
        })
}

/// Acceptance 3: whatever a database writer edits between display and execution, either the
/// signer (`emisar approvals approve`'s check) refuses, or every runner refuses, or what runs
/// is exactly what the signer showed: the unit on the runners it showed. Each runner records
/// its own restarts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whatever_is_edited_between_display_and_execution_only_what_was_shown_runs() {
    use proptest::strategy::{Strategy, ValueTree};
    use proptest::test_runner::{Config, TestRunner};
    let bins: Vec<tempfile::TempDir> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let records: Vec<PathBuf> = bins.iter().map(|b| systemctl_standin(b.path())).collect();
    let file = bins[0].path().join("approvers.toml");
    std::fs::write(&file, approvers_text()).unwrap();
    let app = spawn_app(
        Backend::Postgres,
        vec![
            tls_runner(bins[0].path(), "hvn05").signed_approvals(&["*"], Some(file.clone()), &[]),
            tls_runner(bins[1].path(), "hvn06").signed_approvals(&["*"], Some(file), &[]),
        ],
        Options::default(),
    )
    .await;
    let names = ["hvn05", "hvn06"];
    let mut runner = TestRunner::new(Config {
        cases: 48,
        ..Config::default()
    });
    let (mut signed_cases, mut ran_cases) = (0, 0);
    for case in 0..48 {
        // The first case is the request as people saw it, untouched: it must run.
        let edit = match case {
            0 => Edit {
                stored: "consul",
                shown: "consul",
                signed: "consul",
                runners_shown: vec!["hvn05", "hvn06"],
                runners_signed: vec!["hvn05", "hvn06"],
                preview_line: false,
                required_shown: 2,
                required_signed: 2,
                expires_in: 600,
            },
            _ => arb_edit().new_tree(&mut runner).unwrap().current(),
        };
        // The stored request after the edit, as the approvals API would show it.
        let mut s = statement(&app, edit.signed, &edit.runners_signed);
        s.required = edit.required_signed;
        s.expires_at = in_secs(edit.expires_in);
        if edit.preview_line {
            for p in s.runners.values_mut() {
                *p = Some("c".repeat(64));
            }
        }
        let text = s.text().unwrap();
        let view = json!({
            "id": s.approval_id, "tool": TOOL,
            "args": {"unit": edit.shown},
            "runners": edit.runners_shown,
            "required_approvals": edit.required_shown,
            "requester": s.requester,
            "preview": null,
            "plan": s.plan,
            "statement": {"text": text, "args": {"unit": edit.signed}},
        });
        let now = emisar::protocol::signing::now();
        let before: Vec<usize> = records.iter().map(|r| restarted(r).len()).collect();
        let Ok(_) = emisar::cli::check_before_signing(&s.approval_id, &view, now, 1260) else {
            continue; // the signer refused: nothing is signed, so nothing can run
        };
        signed_cases += 1;
        // Two people signed what the terminal showed; the server sends the stored request
        // to every runner, the ones the statement names and the others.
        let p = proof(&s, &[1, 2]);
        for name in names {
            let _ = execute(
                &app,
                name,
                edit.stored,
                Some(&s.approval_id),
                Some(p.clone()),
                None,
            )
            .await;
        }
        for (i, name) in names.iter().enumerate() {
            let new = &restarted(&records[i])[before[i]..];
            if !new.is_empty() {
                ran_cases += 1;
            }
            for unit in new {
                assert_eq!(
                    unit, edit.shown,
                    "{name} ran another unit than shown: {edit:?}"
                );
                assert!(
                    edit.runners_shown.contains(name),
                    "{name} was not shown: {edit:?}"
                );
            }
            assert!(new.len() <= 1, "{name} ran one approval twice: {edit:?}");
        }
    }
    // The property is about refusals; the honest cases must still run, or it proves nothing.
    assert!(
        signed_cases > 0 && ran_cases > 0,
        "signed {signed_cases}, ran {ran_cases}"
    );
}

/// A server whose approvals would live longer than a runner allows says so when the agent
/// asks, instead of asking people for an approval the runner would refuse at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_would_outlive_what_the_runner_allows_is_refused_at_once() {
    let bin = tempfile::tempdir().unwrap();
    let file = bin.path().join("approvers.toml");
    std::fs::write(&file, approvers_text()).unwrap();
    let app = spawn_app(
        Backend::Postgres,
        vec![tls_runner(bin.path(), "hvn05").signed_approvals(&["*"], Some(file.clone()), &[])],
        Options {
            approvers_file: Some(file),
            approval_ttl_secs: Some(3600),
            // Until the first probe the server does not know the runner's bound: a call made
            // then waits a second and leaves its request pending.
            approval_wait_secs: Some(1),
            probe_interval_ms: Some(200),
            ..Default::default()
        },
    )
    .await;
    let client = app.mcp_client().await;
    let mut said = String::new();
    for _ in 0..50 {
        let res = finished(call_in_background(
            &client,
            TOOL,
            json!({"unit": "consul", "runners": ["hvn05"], "reason": "an hour to decide"}),
        ))
        .await;
        said = res
            .content
            .first()
            .and_then(|c| c.as_text())
            .map(|t| t.text.clone())
            .unwrap_or_default();
        if said.contains("max_approval_lifetime_secs") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(
        said.contains("lets an approval live 1260 s") && said.contains("3901 s"),
        "{said}"
    );
}
