//! What a call under a grant costs the runner, next to an approved call (issue 47's budget: at
//! most 1 ms more). One process runs an `emisar runner` (stock packs, plain HTTP on loopback,
//! `require_signed_approvals = ["*"]` with an approvers file of two people whose rule for the
//! restart lets grants run it) and calls it directly, as the server does, with call tokens
//! signed by the server's key, alternating the two kinds, one at a time, on one kept-alive
//! connection:
//!
//! - **approved**: `linux.systemctl_restart {unit: consul}` under a fresh approval id each time,
//!   carrying the statement two people signed (SSHSIG, Ed25519): the runner rebuilds the
//!   statement from the call, checks both signatures and records the approval id (fsynced);
//! - **grant**: the same restart under one grant two people signed (`calls` = the number of
//!   timed calls): the runner checks the grant (its text, what it admits, both signatures,
//!   its lifetime), that it was not revoked, and takes one of its uses in the ledger (fsynced).
//!
//! Everything a call needs (the signatures, the call token) is made before the clock starts;
//! the time is the POST's round trip, the restart included: its `systemctl` is a stand-in that
//! exits at once, the same for both kinds. The difference of the two is what the grant's
//! checks cost against the approval's.
//!
//! Environment: `BENCH_GRANT_CALLS` (300, at most 1,000: a grant's most calls) timed calls of
//! each kind, after `BENCH_GRANT_WARMUP` (20) of each; `BENCH_SUMMARY`: a file for `key=value`
//! lines (scripts/bench's budget row). Progress on stderr, the results on stdout as Markdown.

// The bench writes its `systemctl` stand-in and lets the runner spawn it (clippy.toml keeps
// product code from starting processes; nothing here does).
#![allow(clippy::disallowed_methods)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Instant;

use common::{Out, env_num, log, ms};
use emisar::digest::json_digest;
use emisar::node::agent::{RunnerState, run};
use emisar::node::config::RunnerConfig;
use emisar::protocol::approval::grant::{Constraint, Grant, GrantProof, Runners};
use emisar::protocol::approval::{ApprovalProof, Plan, Signature, Statement, sshsig};
use emisar::protocol::signing::{CallClaims, CallSigner, ISSUER, Purpose, now, write_keypair};
use emisar::protocol::{CallRequest, Mode};
use serde_json::json;
use ssh_key::{HashAlg, LineEnding, PrivateKey};

const TOOL: &str = "linux.systemctl_restart";
const RUNNER: &str = "bench-1";

fn key(seed: u8) -> PrivateKey {
    PrivateKey::from(ssh_key::private::Ed25519Keypair::from_seed(&[seed; 32]))
}

fn ssh(seed: u8, text: &str) -> Signature {
    Signature::Ssh {
        signer: format!("key{seed}"),
        signature: key(seed)
            .sign(sshsig::APPROVAL_NAMESPACE, HashAlg::Sha512, text.as_bytes())
            .unwrap()
            .to_pem(LineEnding::LF)
            .unwrap(),
    }
}

fn in_secs(secs: i64) -> String {
    (chrono::Utc::now() + chrono::Duration::seconds(secs))
        .format("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// Two people; the restart needs both and may run under a grant.
fn approvers() -> String {
    let line = |seed| key(seed).public_key().to_openssh().unwrap();
    format!(
        "serial = 1\n\
         [[person]]\nname = \"alice\"\nssh = [\"{}\"]\n\
         [[person]]\nname = \"bob\"\nssh = [\"{}\"]\n\
         [[rule]]\ntools = \"{TOOL}\"\napprovals = 2\ngrants = true\n",
        line(1),
        line(2)
    )
}

/// A `systemctl` that exits at once (`show` prints a running unit).
fn write_standin(dir: &Path) {
    let path = dir.join("systemctl");
    std::fs::write(
        &path,
        "#!/bin/sh\n[ \"$1\" = show ] && printf 'ActiveState=active\\nSubState=running\\n'\nexit 0\n",
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

struct Prepared {
    token: String,
    body: Vec<u8>,
}

/// The call token and body of one restart: under `approval` (its id and signed statement) or
/// under `grant`.
fn prepare(
    signer: &CallSigner,
    pack_sha256: &str,
    approval: Option<(String, ApprovalProof)>,
    grant: Option<GrantProof>,
) -> Prepared {
    let (approval_id, proof) = approval.unzip();
    let request = CallRequest {
        tool: TOOL.into(),
        args: json!({"unit": "consul"}).as_object().unwrap().clone(),
        mode: Mode::Execute,
        preview: None,
        preview_seal: None,
        raw: false,
        approval: proof,
        witnessed: None,
        secret_salt: None,
        wave: approval_id.as_ref().map(|_| 1),
        decision: None,
        grant,
    };
    let t = now();
    let claims = CallClaims {
        iss: ISSUER.into(),
        aud: RUNNER.into(),
        iat: t,
        exp: t + 30,
        purpose: Purpose::Call,
        jti: uuid::Uuid::new_v4().to_string(),
        call_id: uuid::Uuid::now_v7().to_string(),
        tool: TOOL.into(),
        request_sha256: request.digest(),
        pack_sha256: pack_sha256.to_owned(),
        approval_id,
        lowered_by_policy: None,
    };
    Prepared {
        token: signer.sign(&claims).unwrap(),
        body: serde_json::to_vec(&request).unwrap(),
    }
}

/// A fresh approval of the restart, signed by both people.
fn approved(pack_sha256: &str) -> (String, ApprovalProof) {
    let id = uuid::Uuid::now_v7().to_string();
    let statement = Statement {
        approval_id: id.clone(),
        tool: TOOL.into(),
        pack_sha256: pack_sha256.to_owned(),
        args_sha256: json_digest(&json!({"unit": "consul"})),
        runners: [(RUNNER.to_owned(), None)].into(),
        plan: Plan {
            waves: vec![vec![RUNNER.to_owned()]],
            pause_secs: 0,
        },
        required: 2,
        policy_sha256: "0".repeat(64),
        requester: "agent:bench".into(),
        expires_at: in_secs(600),
    };
    let text = statement.text().unwrap();
    let proof = ApprovalProof {
        signatures: vec![ssh(1, &text), ssh(2, &text)],
        statement: text,
        approvers: None,
    };
    (id, proof)
}

/// One grant for `calls` restarts of consul on this runner, signed by both people.
fn granted(calls: u32) -> GrantProof {
    let grant = Grant {
        id: uuid::Uuid::now_v7().to_string(),
        agent: "agent:bench".into(),
        break_glass: false,
        tools: vec![TOOL.into()],
        runners: Runners::Names(vec![RUNNER.into()]),
        args: [("unit".to_owned(), Constraint::In(vec![json!("consul")]))].into(),
        max_calls: calls,
        max_calls_per_runner: calls,
        required: 2,
        reason: "bench".into(),
        expires_at: in_secs(1800),
    };
    let text = grant.text().unwrap();
    GrantProof {
        signatures: vec![ssh(1, &text), ssh(2, &text)],
        text,
        approvers: None,
    }
}

struct Samples(Vec<f64>);

impl Samples {
    fn pct(&mut self, p: f64) -> f64 {
        self.0.sort_by(f64::total_cmp);
        let i = ((p / 100.0) * (self.0.len() - 1) as f64).round() as usize;
        self.0[i]
    }
}

async fn post(http: &reqwest::Client, url: &str, call: &Prepared) -> f64 {
    let start = Instant::now();
    let res = http
        .post(url)
        .bearer_auth(&call.token)
        .header("content-type", "application/json")
        .body(call.body.clone())
        .send()
        .await
        .unwrap();
    let status = res.status();
    let body = res.bytes().await.unwrap();
    let took = start.elapsed().as_secs_f64() * 1000.0;
    assert!(
        status.is_success(),
        "the runner refused: {status} {}",
        String::from_utf8_lossy(&body)
    );
    took
}

#[tokio::main]
async fn main() {
    let calls = env_num("BENCH_GRANT_CALLS", 300).min(1000) as usize;
    let warmup = env_num("BENCH_GRANT_WARMUP", 20) as usize;
    let dir = tempfile::tempdir().unwrap();
    let (private, public) = (dir.path().join("server.key"), dir.path().join("server.pub"));
    write_keypair(&private, &public).unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    write_standin(&bin);
    let file = dir.path().join("approvers.toml");
    std::fs::write(&file, approvers()).unwrap();

    let mut config = RunnerConfig::with_name(RUNNER);
    config.server_public_key_file = Some(public);
    config.state_dir = dir.path().join("state");
    config.exec_path = format!("{}:/usr/bin:/bin", bin.display());
    config.allowlists = [("systemd_units".to_owned(), vec!["consul".to_owned()])].into();
    config.require_signed_approvals = vec!["*".into()];
    config.approvers_file = Some(file);
    config.fill_standard_services();
    let state = RunnerState::new(config).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1/call", listener.local_addr().unwrap());
    let stop = tokio_util::sync::CancellationToken::new();
    tokio::spawn(run(listener, state, stop.clone()));

    let signer = CallSigner::from_file(&private).unwrap();
    let packs = emisar::pack::PackSet::load(None).unwrap();
    let pack_sha256 = packs.pack("linux").unwrap().digest.clone();
    let grant = granted((warmup + calls) as u32);
    let http = reqwest::Client::builder().build().unwrap();
    log(format!(
        "{warmup} + {calls} calls of each kind, alternating, one at a time"
    ));
    let (mut a, mut g) = (Samples(Vec::new()), Samples(Vec::new()));
    for i in 0..warmup + calls {
        let approval = prepare(&signer, &pack_sha256, Some(approved(&pack_sha256)), None);
        let under_grant = prepare(&signer, &pack_sha256, None, Some(grant.clone()));
        // A then B on even rounds, B then A on odd ones: neither kind always goes first.
        let (ta, tg) = if i % 2 == 0 {
            let ta = post(&http, &url, &approval).await;
            (ta, post(&http, &url, &under_grant).await)
        } else {
            let tg = post(&http, &url, &under_grant).await;
            (post(&http, &url, &approval).await, tg)
        };
        if i >= warmup {
            a.0.push(ta);
            g.0.push(tg);
        }
    }
    stop.cancel();

    let mut out = Out::default();
    let rows = [("approved", &mut a), ("grant", &mut g)];
    let mut report =
        String::from("| call | p50 (ms) | p95 (ms) | p99 (ms) |\n|---|---:|---:|---:|\n");
    let mut p = std::collections::BTreeMap::new();
    for (name, s) in rows {
        let (p50, p95, p99) = (s.pct(50.0), s.pct(95.0), s.pct(99.0));
        report.push_str(&format!(
            "| {name} | {} | {} | {} |\n",
            ms(p50),
            ms(p95),
            ms(p99)
        ));
        out.kv("grant", &format!("{name}_p50_ms"), format!("{p50:.3}"));
        out.kv("grant", &format!("{name}_p95_ms"), format!("{p95:.3}"));
        p.insert(name, (p50, p95));
    }
    let more_p50 = p["grant"].0 - p["approved"].0;
    let more_p95 = p["grant"].1 - p["approved"].1;
    out.kv("grant", "more_p50_ms", format!("{more_p50:.3}"));
    out.kv("grant", "more_p95_ms", format!("{more_p95:.3}"));
    out.kv("grant", "calls", calls);
    report.push_str(&format!(
        "\nA call under a grant costs the runner {} ms more than an approved call at p50 ({} ms at p95), over {calls} calls of each kind.\n",
        ms(more_p50),
        ms(more_p95)
    ));
    out.report = report;
    print!("{}", out.report);
    if let Ok(path) = std::env::var("BENCH_SUMMARY") {
        std::fs::write(path, &out.summary).unwrap();
    }
}
