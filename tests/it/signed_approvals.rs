//! Approvals signed by people and checked on the node (issue 25): two people approve a
//! restart from the terminal with their SSH keys through a real ssh-agent and the runner runs
//! it once; and every way a compromised server (its key, its database) could try to make a
//! runner run a write without the people the runner trusts is refused there, nothing run.

use std::path::{Path, PathBuf};
use std::process::Command;

use emisar::digest::json_digest;
use emisar::protocol::approval::{
    ApprovalProof, Plan, Signature, SignedApprovers, Statement, sshsig,
};
use emisar::protocol::{CallRequest, Mode};
use emisar::server::principal::Role;
use serde_json::{Value, json};
use ssh_key::{HashAlg, LineEnding, PrivateKey};

use crate::approvals::{
    Portal, call_in_background, finished, restarts, signed_in, systemctl_standin, wait_for_pending,
};
use crate::harness::app::{Options, Signed, TestApp};
use crate::harness::{Backend, RunnerSpec, spawn_app};

pub(crate) const TOOL: &str = "linux.systemctl_restart";

pub(crate) fn key(seed: u8) -> PrivateKey {
    PrivateKey::from(ssh_key::private::Ed25519Keypair::from_seed(&[seed; 32]))
}

pub(crate) fn pub_line(seed: u8) -> String {
    key(seed).public_key().to_openssh().unwrap()
}

/// alice holds keys 1 and 3, bob key 2; a restart needs two people, anything else one.
pub(crate) fn approvers_text() -> String {
    format!(
        "serial = 1\n\
         [[person]]\nname = \"alice\"\nssh = [\"{}\", \"{}\"]\n\
         [[person]]\nname = \"bob\"\nssh = [\"{}\"]\n\
         [[rule]]\ntools = \"{TOOL}\"\napprovals = 2\n\
         [[rule]]\ntools = \"*\"\napprovals = 1\n",
        pub_line(1),
        pub_line(3),
        pub_line(2)
    )
}

pub(crate) fn sign(seed: u8, namespace: &str, text: &str) -> String {
    key(seed)
        .sign(namespace, HashAlg::Sha512, text.as_bytes())
        .unwrap()
        .to_pem(LineEnding::LF)
        .unwrap()
}

pub(crate) fn ssh(seed: u8, text: &str) -> Signature {
    Signature::Ssh {
        signer: format!("key{seed}"),
        signature: sign(seed, sshsig::APPROVAL_NAMESPACE, text),
    }
}

struct Lab {
    _bin: tempfile::TempDir,
    record: PathBuf,
    app: TestApp,
    /// The organisation root key's seed (runner hvn07 trusts only files it signed).
    root: u8,
}

/// hvn05 and hvn06 trust the approvers file on disk; hvn07 only a file signed by the root key
/// (seed 9) that the server carries. The server has the file and its root signature.
async fn lab() -> Lab {
    let bin = tempfile::tempdir().unwrap();
    let record = systemctl_standin(bin.path());
    let file = bin.path().join("approvers.toml");
    let text = approvers_text();
    std::fs::write(&file, &text).unwrap();
    let sig = bin.path().join("approvers.toml.sig");
    std::fs::write(&sig, sign(9, sshsig::APPROVERS_NAMESPACE, &text)).unwrap();
    let runner = |name: &str, local: bool| {
        RunnerSpec::new(name)
            .path_first(bin.path())
            .allow("systemd_units", &["consul", "nomad"])
            .signed_approvals(
                &["*"],
                local.then(|| file.clone()),
                &if local { vec![] } else { vec![pub_line(9)] },
            )
    };
    let app = spawn_app(
        Backend::Postgres,
        vec![
            runner("hvn05", true),
            runner("hvn06", true),
            runner("hvn07", false),
        ],
        Options {
            approvers_file: Some(file.clone()),
            approvers_signature_file: Some(sig),
            ..Default::default()
        },
    )
    .await;
    Lab {
        _bin: bin,
        record,
        app,
        root: 9,
    }
}

/// The statement a server would write for a restart of `unit` on `runners` (no preview).
fn statement(app: &TestApp, approval_id: &str, unit: &str, runners: &[&str]) -> Statement {
    let packs = emisar::pack::PackSet::load(app.packs_dir.as_deref()).unwrap();
    Statement {
        approval_id: approval_id.into(),
        tool: TOOL.into(),
        pack_sha256: packs.pack("linux").unwrap().digest.clone(),
        args_sha256: json_digest(&json!({"unit": unit})),
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

pub(crate) fn in_secs(secs: i64) -> String {
    (chrono::Utc::now() + chrono::Duration::seconds(secs))
        .format("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// A compromised server's execution: signed with server.key, under `approval_id`, carrying
/// `proof`, for a restart of `unit`.
async fn execute(
    app: &TestApp,
    runner: &str,
    unit: &str,
    approval_id: Option<&str>,
    lowered: bool,
    proof: Option<ApprovalProof>,
) -> (u16, Value) {
    let request = CallRequest {
        tool: TOOL.into(),
        args: json!({"unit": unit}).as_object().unwrap().clone(),
        mode: Mode::Execute,
        preview: None,
        preview_seal: None,
        raw: false,
        approval: proof,
        witnessed: None,
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
                lowered_by_policy: lowered.then(|| "1".repeat(64)),
            },
        )
        .await;
    (answer.status, answer.body)
}

pub(crate) fn proof(s: &Statement, signers: &[u8]) -> ApprovalProof {
    let text = s.text().unwrap();
    ApprovalProof {
        signatures: signers.iter().map(|k| ssh(*k, &text)).collect(),
        statement: text,
        approvers: None,
    }
}

/// The refusal a runner gave: 403 (or 409 for a second execution) naming `why`; and nothing
/// ran.
fn refused(lab: &Lab, answer: (u16, Value), status: u16, why: &str) {
    let (code, body) = answer;
    assert_eq!(code, status, "{body}");
    let error = body["error"].as_str().unwrap_or_default();
    assert!(error.contains(why), "`{error}` does not say `{why}`");
    assert_eq!(restarts(&lab.record), 0, "nothing runs: {error}");
}

/// What a server holding server.key can send a runner on its own, case by case: no signatures,
/// too few, one person twice, a stranger's key, signatures replayed for other args, another
/// approval id or a runner the statement does not name, an expired statement, a lowering the
/// file does not allow, and carried approvers files not signed by the root key; each refused,
/// nothing run. The rest of what a compromised server or database writer can try (the count
/// it signed for, a far expiry, an older or other file at a serial, a restart or a lost
/// state, a witnessed approval replayed) is in `trust_promises.rs`.
#[tokio::test]
async fn a_compromised_server_cannot_make_a_node_run_a_write() {
    let lab = lab().await;
    let app = &lab.app;
    let id = uuid::Uuid::now_v7().to_string();
    let good = statement(app, &id, "consul", &["hvn05", "hvn06"]);

    // Signed with server.key, an invented approval id, no signatures.
    refused(
        &lab,
        execute(app, "hvn05", "consul", Some(&id), false, None).await,
        403,
        "the call carries none",
    );
    // One signature where the node needs two.
    refused(
        &lab,
        execute(
            app,
            "hvn05",
            "consul",
            Some(&id),
            false,
            Some(proof(&good, &[1])),
        )
        .await,
        403,
        "needs 2 people's signatures",
    );
    // Two signatures by one person (two keys of alice's: a local user and a provider
    // identity of the same person sign with different keys, and the node counts people).
    refused(
        &lab,
        execute(
            app,
            "hvn05",
            "consul",
            Some(&id),
            false,
            Some(proof(&good, &[1, 3])),
        )
        .await,
        403,
        "count once",
    );
    // A key not in the node's approvers file.
    refused(
        &lab,
        execute(
            app,
            "hvn05",
            "consul",
            Some(&id),
            false,
            Some(proof(&good, &[1, 7])),
        )
        .await,
        403,
        "not in the approvers file",
    );
    // Valid signatures replayed for other arguments…
    refused(
        &lab,
        execute(
            app,
            "hvn05",
            "nomad",
            Some(&id),
            false,
            Some(proof(&good, &[1, 2])),
        )
        .await,
        403,
        "differs from this call in `args`",
    );
    // …for another approval id…
    let other_id = uuid::Uuid::now_v7().to_string();
    refused(
        &lab,
        execute(
            app,
            "hvn05",
            "consul",
            Some(&other_id),
            false,
            Some(proof(&good, &[1, 2])),
        )
        .await,
        403,
        "differs from this call in `approval`",
    );
    // …for a runner the statement does not name.
    let only_05 = statement(app, &id, "consul", &["hvn05"]);
    refused(
        &lab,
        execute(
            app,
            "hvn06",
            "consul",
            Some(&id),
            false,
            Some(proof(&only_05, &[1, 2])),
        )
        .await,
        403,
        "does not name this runner",
    );
    // A statement whose signatures are good but which has expired.
    let mut old = statement(app, &id, "consul", &["hvn05"]);
    old.expires_at = in_secs(-5);
    refused(
        &lab,
        execute(
            app,
            "hvn05",
            "consul",
            Some(&id),
            false,
            Some(proof(&old, &[1, 2])),
        )
        .await,
        403,
        "expired",
    );
    // A write the server's policy lowered, for a tool the node's file does not allow
    // unapproved.
    refused(
        &lab,
        execute(app, "hvn05", "consul", None, true, None).await,
        403,
        "does not allow it unapproved",
    );
    // hvn07 trusts only a file signed by the root key: a carried file without that signature
    // (here signed by alice's key, with mallory added) is refused…
    let forged_text = format!(
        "{}[[person]]\nname = \"mallory\"\nssh = [\"{}\"]\n",
        approvers_text().replace("serial = 1", "serial = 2"),
        pub_line(7)
    );
    let mut carried = proof(&statement(app, &id, "consul", &["hvn07"]), &[7, 1]);
    carried.approvers = Some(SignedApprovers {
        signature: sign(1, sshsig::APPROVERS_NAMESPACE, &forged_text),
        text: forged_text.clone(),
    });
    refused(
        &lab,
        execute(
            app,
            "hvn07",
            "consul",
            Some(&id),
            false,
            Some(carried.clone()),
        )
        .await,
        403,
        "not one of this runner's `approvers_root_keys`",
    );
    // …and so is one carried without any signature that verifies over its bytes.
    carried.approvers = Some(SignedApprovers {
        signature: sign(lab.root, sshsig::APPROVERS_NAMESPACE, &approvers_text()),
        text: forged_text,
    });
    refused(
        &lab,
        execute(app, "hvn07", "consul", Some(&id), false, Some(carried)).await,
        403,
        "root signature",
    );

    // The control: the same runner runs exactly what two people signed, once.
    let (status, body) = execute(
        app,
        "hvn05",
        "consul",
        Some(&id),
        false,
        Some(proof(&good, &[1, 2])),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(restarts(&lab.record), 1);
    let (status, body) = execute(
        app,
        "hvn05",
        "consul",
        Some(&id),
        false,
        Some(proof(&good, &[1, 2])),
    )
    .await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(restarts(&lab.record), 1, "an approval runs once");
    // And hvn07 runs it with the file the root key signed.
    let id7 = uuid::Uuid::now_v7().to_string();
    let mut rooted = proof(&statement(app, &id7, "consul", &["hvn07"]), &[3, 2]);
    rooted.approvers = Some(SignedApprovers {
        signature: sign(lab.root, sshsig::APPROVERS_NAMESPACE, &approvers_text()),
        text: approvers_text(),
    });
    let (status, body) = execute(app, "hvn07", "consul", Some(&id7), false, Some(rooted)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(restarts(&lab.record), 2);
}

/// The agent's `consul` restart on hvn05, waiting for two people (the node's rule): alice and
/// bob signed in, the request's id and the statement text they sign. `client` keeps the
/// agent's call open.
struct PendingRestart {
    alice: Portal,
    bob: Portal,
    client: rmcp::service::RunningService<rmcp::RoleClient, ()>,
    call: tokio::task::JoinHandle<rmcp::model::CallToolResult>,
    id: String,
    text: String,
}

async fn pending_restart(app: &TestApp) -> PendingRestart {
    let alice = signed_in(app, "alice", Role::Approver).await;
    let bob = signed_in(app, "bob", Role::Approver).await;
    let client = app.mcp_client().await;
    let call = call_in_background(
        &client,
        TOOL,
        json!({"unit": "consul", "runners": ["hvn05"], "reason": "wedged"}),
    );
    let id = wait_for_pending(&alice).await;
    let (_, request) = alice.get(&format!("/api/approvals/{id}")).await;
    let text = request["statement"]["text"].as_str().unwrap().to_owned();
    assert_eq!(request["required_approvals"], 2, "the node's rule sets two");
    PendingRestart {
        alice,
        bob,
        client,
        call,
        id,
        text,
    }
}

/// A vote's `signature`: the SSH signature of the key `seed` over `text`.
fn ssh_vote(seed: u8, text: &str) -> Value {
    json!({"kind": "ssh", "signer": "x", "signature": sign(seed, sshsig::APPROVAL_NAMESPACE, text)})
}

/// Acceptance 3, through the server: arguments edited in the approvals table after people
/// signed are refused by the runner, which rebuilds the statement from what it receives.
#[tokio::test]
async fn arguments_edited_in_the_table_after_signing_do_not_run() {
    let lab = lab().await;
    let app = &lab.app;
    let PendingRestart {
        alice,
        bob,
        client: _client,
        call,
        id,
        text,
    } = pending_restart(app).await;
    // Unsigned: refused by the server, which says how to sign.
    let (status, body) = alice.approve(&id).await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("`signature`"),
        "{body}"
    );
    let sig = |seed| ssh_vote(seed, &text);
    let (status, body) = alice
        .post(
            &format!("/api/approvals/{id}/approve"),
            json!({"signature": sig(1), "note": "checked"}),
            true,
        )
        .await;
    assert_eq!(status, 200, "{body}");
    // The attacker with the database changes what will run.
    emisar::with_pool!(&app.db, pool => sqlx::query(app.db.sql(
        "UPDATE approvals SET args = '{\"unit\": \"nomad\"}'::jsonb WHERE id = $1"))
        .bind(&id)
        .execute(pool)
        .await
        .map(|_| ()))
    .unwrap();
    let (status, body) = bob
        .post(
            &format!("/api/approvals/{id}/approve"),
            json!({"signature": sig(2)}),
            true,
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let res = finished(call).await;
    let out = res.structured_content.unwrap();
    assert_eq!(out["approval"]["state"], "failed", "{out}");
    let error = out["results"][0]["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("runner_refused") || error.contains("refused"),
        "{out}"
    );
    assert_eq!(restarts(&lab.record), 0, "nothing ran");
}

/// A statement rewritten in the store between two votes (an insider with the database): the
/// second person signs the text the server now shows, and the server refuses the vote, since
/// the first signature does not hold over it. Nobody is counted for two different texts, and
/// nothing runs (red team 1, F5, issue 46).
#[tokio::test]
async fn a_vote_on_a_statement_rewritten_after_the_first_vote_is_refused() {
    let lab = lab().await;
    let app = &lab.app;
    let PendingRestart {
        alice,
        bob,
        client: _client,
        call,
        id,
        text,
    } = pending_restart(app).await;
    let (status, body) = alice
        .post(
            &format!("/api/approvals/{id}/approve"),
            json!({"signature": ssh_vote(1, &text)}),
            true,
        )
        .await;
    assert_eq!(status, 200, "{body}");
    // The insider points what people read at other arguments (a `nomad` restart).
    let other = json_digest(&json!({"unit": "nomad"}));
    let rewritten: String = text
        .lines()
        .map(|l| match l.starts_with("args ") {
            true => format!("args sha256:{other}\n"),
            false => format!("{l}\n"),
        })
        .collect();
    assert_ne!(rewritten, text, "the statement names the arguments' digest");
    emisar::with_pool!(&app.db, pool => sqlx::query(app.db.sql(
        "UPDATE approvals SET statement = $1 WHERE id = $2"))
        .bind(&rewritten)
        .bind(&id)
        .execute(pool)
        .await
        .map(|_| ()))
    .unwrap();
    let (_, shown) = bob.get(&format!("/api/approvals/{id}")).await;
    assert_eq!(shown["statement"]["text"], rewritten.as_str());
    let (status, body) = bob
        .post(
            &format!("/api/approvals/{id}/approve"),
            json!({"signature": ssh_vote(2, &rewritten)}),
            true,
        )
        .await;
    assert_eq!(status, 403, "{body}");
    let error = body["error"].as_str().unwrap_or_default();
    assert!(error.contains("changed since `alice` signed it"), "{body}");
    let (_, after) = bob.get(&format!("/api/approvals/{id}")).await;
    assert_eq!(after["state"], "pending", "{after}");
    assert_eq!(
        after["approvals"].as_array().map(Vec::len),
        Some(1),
        "{after}"
    );
    assert_eq!(restarts(&lab.record), 0, "nothing ran");
    call.abort();
}

/// Runs `emisar` with `args`, SSH_AUTH_SOCK set to `agent` (without blocking the runtime the
/// server runs on).
pub(crate) async fn emisar(agent: &Path, args: &[&str]) -> std::process::Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_emisar"))
        .args(args)
        .env("SSH_AUTH_SOCK", agent)
        .env_remove("EMISAR_SERVER")
        .env_remove("EMISAR_TOKEN")
        .output()
        .await
        .unwrap()
}

/// A real ssh-agent on a socket in `dir`, killed when dropped.
pub(crate) struct Agent {
    pub(crate) socket: PathBuf,
    child: std::process::Child,
}

impl Agent {
    pub(crate) fn start(dir: &Path) -> Agent {
        let socket = dir.join("agent.sock");
        let child = Command::new("ssh-agent")
            .arg("-D")
            .arg("-a")
            .arg(&socket)
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("ssh-agent runs (openssh-client, installed by scripts/install-test-deps)");
        for _ in 0..100 {
            if socket.exists() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        Agent { socket, child }
    }

    /// Adds key `seed` and returns the path of its .pub.
    pub(crate) fn add(&self, dir: &Path, seed: u8) -> PathBuf {
        let private = dir.join(format!("id_{seed}"));
        key(seed)
            .write_openssh_file(&private, LineEnding::LF)
            .unwrap();
        let public = dir.join(format!("id_{seed}.pub"));
        std::fs::write(&public, pub_line(seed)).unwrap();
        let out = Command::new("ssh-add")
            .arg(&private)
            .env("SSH_AUTH_SOCK", &self.socket)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        public
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Acceptance 2: two people approve from the terminal with Ed25519 keys held by ssh-agent;
/// the runner checks both signatures and runs the restart once.
#[tokio::test]
async fn two_people_approve_in_the_terminal_through_ssh_agent_and_it_runs_once() {
    let lab = lab().await;
    let app = &lab.app;
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(dir.path());
    let alice_pub = agent.add(dir.path(), 1);
    let bob_pub = agent.add(dir.path(), 2);
    let alice = app.issue_token("alice", Role::Approver).await;
    let bob = app.issue_token("bob", Role::Approver).await;
    let watcher = signed_in(app, "carol", Role::Approver).await;
    let client = app.mcp_client().await;
    let call = call_in_background(
        &client,
        TOOL,
        json!({"unit": "consul", "runners": ["hvn05", "hvn06"], "reason": "wedged"}),
    );
    let id = wait_for_pending(&watcher).await;
    let base = app.base_url();

    let shown = emisar(
        &agent.socket,
        &[
            "approvals",
            "show",
            &id,
            "--statement",
            "--server",
            &base,
            "--token",
            &alice,
        ],
    )
    .await;
    assert!(
        shown.status.success(),
        "{}",
        String::from_utf8_lossy(&shown.stderr)
    );
    let text = String::from_utf8(shown.stdout).unwrap();
    let parsed = Statement::parse(&text).unwrap();
    assert_eq!(parsed.approval_id, id);
    assert_eq!(parsed.runners.len(), 2);

    // The agent holds two keys: the CLI asks which, then signs with the one named.
    let ambiguous = emisar(
        &agent.socket,
        &[
            "approvals",
            "approve",
            &id,
            "--server",
            &base,
            "--token",
            &alice,
        ],
    )
    .await;
    assert!(!ambiguous.status.success());
    assert!(String::from_utf8_lossy(&ambiguous.stderr).contains("several ssh-ed25519 keys"));
    let first = emisar(
        &agent.socket,
        &[
            "approvals",
            "approve",
            &id,
            "--note",
            "checked the unit",
            "--ssh-key",
            alice_pub.to_str().unwrap(),
            "--server",
            &base,
            "--token",
            &alice,
        ],
    )
    .await;
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    assert!(String::from_utf8_lossy(&first.stdout).contains("pending (1 of 2 approvals)"));
    assert_eq!(restarts(&lab.record), 0, "one person is not enough");
    let second = emisar(
        &agent.socket,
        &[
            "approvals",
            "approve",
            &id,
            "--ssh-key",
            bob_pub.to_str().unwrap(),
            "--server",
            &base,
            "--token",
            &bob,
        ],
    )
    .await;
    assert!(
        second.status.success(),
        "{}",
        String::from_utf8_lossy(&second.stderr)
    );

    let res = finished(call).await;
    let out = res.structured_content.unwrap();
    assert_eq!(out["approval"]["state"], "executed", "{out}");
    assert_eq!(restarts(&lab.record), 2, "once on each of the two runners");

    // The note and every signature are kept, in the request and in the audit log.
    let (_, request) = watcher.get(&format!("/api/approvals/{id}")).await;
    assert_eq!(request["approvals"][0]["note"], "checked the unit");
    assert_eq!(request["approvals"][0]["signed"]["person"], "alice");
    assert_eq!(request["approvals"][1]["signed"]["person"], "bob");
    let approved: Vec<Value> = app
        .events(emisar::server::audit::AuditFilter {
            approval_id: Some(id.clone()),
            ..Default::default()
        })
        .await
        .into_iter()
        .filter(|e| e.kind == "approval.approved")
        .map(|e| e.detail.unwrap())
        .collect();
    assert_eq!(approved.len(), 2);
    assert_eq!(approved[0]["note"], "checked the unit");
    assert_eq!(approved[0]["signed"]["alg"], "ssh-ed25519");
    assert_eq!(approved[1]["statement"], text);

    // Acceptance 4: an auditor re-verifies every executed approval offline…
    let approvers_file = lab._bin.path().join("approvers.toml");
    let approvers_arg = approvers_file.to_str().unwrap();
    let verified = emisar(
        &agent.socket,
        &[
            "audit",
            "verify-approvals",
            "--approvers",
            approvers_arg,
            "--database",
            &app.database_url,
        ],
    )
    .await;
    let says = String::from_utf8_lossy(&verified.stdout).into_owned();
    assert!(
        verified.status.success(),
        "{says}{}",
        String::from_utf8_lossy(&verified.stderr)
    );
    assert!(
        says.contains("ok: 1 executed approvals and 0 rollout decisions verified"),
        "{says}"
    );
    // …and a stored signature altered by someone who owns the database is named.
    let bob_vote = app
        .events(emisar::server::audit::AuditFilter {
            approval_id: Some(id.clone()),
            kind: Some("approval.approved".into()),
            ..Default::default()
        })
        .await
        .pop()
        .unwrap();
    let forged = bob_vote.detail.clone().unwrap()["signature"]["signature"]
        .as_str()
        .unwrap()
        .to_owned();
    // Another valid SSHSIG by bob, over other text: well-formed, and wrong for this statement.
    let other = sign(2, sshsig::APPROVAL_NAMESPACE, "another statement\n");
    let detail = bob_vote.detail.unwrap().to_string().replace(
        &serde_json::to_string(&forged).unwrap(),
        &serde_json::to_string(&other).unwrap(),
    );
    app.pg
        .as_ref()
        .unwrap()
        .superuser_sql(&format!(
            "ALTER TABLE audit_events DISABLE TRIGGER USER; \
         UPDATE audit_events SET detail = '{}' WHERE seq = {}; \
         ALTER TABLE audit_events ENABLE TRIGGER USER;",
            detail.replace('\'', "''"),
            bob_vote.seq
        ))
        .unwrap();
    let caught = emisar(
        &agent.socket,
        &[
            "audit",
            "verify-approvals",
            "--approvers",
            approvers_arg,
            "--database",
            &app.database_url,
        ],
    )
    .await;
    let says = String::from_utf8_lossy(&caught.stdout).into_owned();
    assert_eq!(caught.status.code(), Some(1), "{says}");
    assert!(
        says.contains(&format!("event seq {}", bob_vote.seq)),
        "{says}"
    );
    assert!(says.contains("does not verify"), "{says}");

    // After a rollout, the approvals before it ran unsigned: `--from-seq` checks only what
    // began executing from that event on, and says how many it set aside, never counting
    // them as verified.
    let executing = app
        .events(emisar::server::audit::AuditFilter {
            approval_id: Some(id.clone()),
            kind: Some("approval.executing".into()),
            ..Default::default()
        })
        .await
        .pop()
        .unwrap();
    let verify_from = |from: i64| {
        let (socket, approvers, url) = (
            agent.socket.clone(),
            approvers_arg.to_owned(),
            app.database_url.clone(),
        );
        async move {
            let from = from.to_string();
            let run = emisar(
                &socket,
                &[
                    "audit",
                    "verify-approvals",
                    "--approvers",
                    &approvers,
                    "--from-seq",
                    &from,
                    "--database",
                    &url,
                ],
            )
            .await;
            (
                run.status.code(),
                String::from_utf8_lossy(&run.stdout).into_owned(),
            )
        }
    };
    let after = executing.seq + 1;
    let (code, says) = verify_from(after).await;
    assert_eq!(code, Some(0), "{says}");
    assert!(
        says.contains(&format!(
            "ok: 0 executed approvals and 0 rollout decisions verified against {approvers_arg}"
        )) && says.contains(&format!("1 before seq {after} not checked")),
        "{says}"
    );
    let (code, says) = verify_from(executing.seq).await;
    assert_eq!(code, Some(1), "from its own seq it is checked: {says}");
}

/// The server refuses to ask people for what the runners' approvers could never give, and
/// says why: a tool no rule covers.
#[tokio::test]
async fn a_request_no_one_could_sign_is_refused_before_anyone_is_asked() {
    let bin = tempfile::tempdir().unwrap();
    let record = systemctl_standin(bin.path());
    let file = bin.path().join("approvers.toml");
    // Only nomad tools have a rule.
    std::fs::write(
        &file,
        approvers_text()
            .replace(&format!("tools = \"{TOOL}\""), "tools = \"nomad.*\"")
            .replace("[[rule]]\ntools = \"*\"\napprovals = 1\n", ""),
    )
    .unwrap();
    let app = spawn_app(
        Backend::Postgres,
        vec![
            RunnerSpec::new("hvn05")
                .path_first(bin.path())
                .allow("systemd_units", &["consul"])
                .signed_approvals(&["*"], Some(file.clone()), &[]),
        ],
        Options {
            approvers_file: Some(file),
            ..Default::default()
        },
    )
    .await;
    let client = app.mcp_client().await;
    let res = finished(call_in_background(
        &client,
        TOOL,
        json!({"unit": "consul", "runners": ["hvn05"], "reason": "wedged"}),
    ))
    .await;
    assert_eq!(res.is_error, Some(true));
    let out = res.structured_content.unwrap();
    assert_eq!(out["error"]["kind"], "signatures_unsatisfiable", "{out}");
    assert!(
        out["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no rule"),
        "{out}"
    );
    assert_eq!(restarts(&record), 0);
}

/// Our SSH signatures are OpenSSH's: `ssh-keygen -Y sign` signs a statement the runner's
/// check accepts, and `ssh-keygen -Y verify` accepts the signatures `emisar` makes.
#[test]
fn ssh_signatures_interoperate_with_ssh_keygen_both_ways() {
    let dir = tempfile::tempdir().unwrap();
    let private = dir.path().join("id_ed25519");
    key(4).write_openssh_file(&private, LineEnding::LF).unwrap();
    let message = dir.path().join("statement");
    let text = "emisar-approval/v1\napproval x\n";
    std::fs::write(&message, text).unwrap();
    let out = Command::new("ssh-keygen")
        .args(["-Y", "sign", "-n", sshsig::APPROVAL_NAMESPACE, "-f"])
        .arg(&private)
        .arg(&message)
        .output()
        .expect("ssh-keygen runs (openssh-client)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let theirs = std::fs::read_to_string(dir.path().join("statement.sig")).unwrap();
    let public = key(4).public_key().clone();
    sshsig::verify(
        &public,
        sshsig::APPROVAL_NAMESPACE,
        text.as_bytes(),
        &theirs,
    )
    .unwrap();
    assert!(sshsig::verify(&public, sshsig::APPROVAL_NAMESPACE, b"other", &theirs).is_err());

    let ours = dir.path().join("ours.sig");
    std::fs::write(&ours, sign(4, sshsig::APPROVAL_NAMESPACE, text)).unwrap();
    let allowed = dir.path().join("allowed_signers");
    std::fs::write(&allowed, format!("alice {}\n", pub_line(4))).unwrap();
    let verify = |namespace: &str| {
        Command::new("ssh-keygen")
            .args(["-Y", "verify", "-I", "alice", "-n", namespace, "-f"])
            .arg(&allowed)
            .arg("-s")
            .arg(&ours)
            .stdin(std::fs::File::open(&message).unwrap())
            .output()
            .unwrap()
    };
    let good = verify(sshsig::APPROVAL_NAMESPACE);
    assert!(
        good.status.success(),
        "{}",
        String::from_utf8_lossy(&good.stderr)
    );
    assert!(!verify(sshsig::APPROVERS_NAMESPACE).status.success());
}
