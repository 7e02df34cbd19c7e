//! Grants as the runner holds them (issue 47), with the server bypassed: every call here is
//! forged with `server.key`, as an insider who holds it would, and sent straight to TLS
//! runners that require people's signatures. A grant signed by two people of the runner's
//! approvers file runs the restarts it allows, as many as it allows here, and nothing else:
//! not a fourth, not a unit outside its list, not on a runner outside its selector, not once
//! expired or living longer than the runner's bound, not with its text changed, not after the
//! server told the runner it was revoked (nor after a restart), not after the runner lost its
//! state. A break-glass window runs only where the runner's approvers file honours it, and
//! never with one person.

use std::path::{Path, PathBuf};

use emisar::protocol::approval::Signature;
use emisar::protocol::approval::grant::{Constraint, Grant, GrantProof, Runners};
use emisar::protocol::signing::{
    CallClaims, CallSigner, HealthClaims, Purpose, RevokeClaims, RevokedGrant, now,
};
use emisar::protocol::{CallRequest, Mode};
use emisar::selector::Selector;
use serde_json::{Value, json};

use crate::approvals::{restarts, systemctl_standin};
use crate::harness::app::{Options, Signed, TestApp};
use crate::harness::certs::self_signed;
use crate::harness::{Backend, RunnerSpec, spawn_app};
use crate::signed_approvals::{TOOL, in_secs, pub_line, ssh};

/// alice (keys 1 and 3) and bob (key 2); restarts need two people and may run under a grant;
/// with `break_glass`, this runner also honours break-glass windows.
fn approvers(break_glass: bool) -> String {
    format!(
        "serial = 1\n\
         [[person]]\nname = \"alice\"\nssh = [\"{}\", \"{}\"]\n\
         [[person]]\nname = \"bob\"\nssh = [\"{}\"]\n\
         [[rule]]\ntools = \"{TOOL}\"\napprovals = 2\ngrants = true\nbreak_glass = {break_glass}\n\
         [[rule]]\ntools = \"*\"\napprovals = 1\n",
        pub_line(1),
        pub_line(3),
        pub_line(2)
    )
}

struct Lab {
    _bin: tempfile::TempDir,
    record: PathBuf,
    app: TestApp,
}

/// edge-1 and edge-2 (labels role=edge) honour break-glass; core-1 (role=core) does not.
/// All three serve HTTPS and require people's signatures for every write.
async fn lab() -> Lab {
    let bin = tempfile::tempdir().unwrap();
    let record = systemctl_standin(bin.path());
    let write = |name: &str, text: String| -> PathBuf {
        let path = bin.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let honours = write("approvers-edge.toml", approvers(true));
    let plain = write("approvers-core.toml", approvers(false));
    let runner = |name: &str, role: &str, file: &Path| {
        let cert = self_signed(bin.path(), name);
        RunnerSpec::new(name)
            .https(cert.clone(), Some(cert.fingerprint.to_string()))
            .label("role", role)
            .path_first(bin.path())
            .allow("systemd_units", &["consul", "nomad", "traefik"])
            .signed_approvals(&["*"], Some(file.to_owned()), &[])
    };
    let app = spawn_app(
        Backend::Postgres,
        vec![
            runner("edge-1", "edge", &honours),
            runner("edge-2", "edge", &honours),
            runner("core-1", "core", &plain),
        ],
        Options {
            approvers_file: Some(plain.clone()),
            ..Default::default()
        },
    )
    .await;
    for url in app.runner_urls.values() {
        assert!(url.starts_with("https://"), "{url}");
    }
    Lab {
        _bin: bin,
        record,
        app,
    }
}

/// A UUIDv7 whose time is `secs_ago` seconds before now (to the millisecond, as the
/// server's ids are).
fn id_ago(secs_ago: u64) -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let ts = uuid::Timestamp::from_unix(uuid::NoContext, t.as_secs() - secs_ago, t.subsec_nanos());
    uuid::Uuid::new_v7(ts).to_string()
}

/// Restarts of consul or traefik on the edge, three in all and on one runner.
fn edge_grant() -> Grant {
    Grant {
        id: id_ago(0),
        agent: "agent:test-agent".into(),
        break_glass: false,
        tools: vec![TOOL.into()],
        runners: Runners::Labels(Selector::parse("role=edge").unwrap()),
        args: [(
            "unit".to_owned(),
            Constraint::In(vec![json!("consul"), json!("traefik")]),
        )]
        .into(),
        max_calls: 3,
        max_calls_per_runner: 3,
        required: 2,
        reason: "INC-7: consul and traefik flap on the edge".into(),
        expires_at: in_secs(600),
    }
}

fn signed(grant: &Grant, keys: &[u8]) -> GrantProof {
    let text = grant.text().unwrap();
    GrantProof {
        signatures: keys
            .iter()
            .map(|k| ssh(*k, &text))
            .collect::<Vec<Signature>>(),
        text,
        approvers: None,
    }
}

/// A restart of `unit` on `runner` under `grant` (and `approval_id`, when given), forged with
/// server.key.
async fn restart(
    app: &TestApp,
    runner: &str,
    unit: &str,
    grant: &GrantProof,
    approval_id: Option<&str>,
) -> (u16, Value) {
    let request = CallRequest {
        tool: TOOL.into(),
        args: json!({"unit": unit}).as_object().unwrap().clone(),
        mode: Mode::Execute,
        preview: None,
        preview_seal: None,
        raw: false,
        approval: None,
        witnessed: None,
        secret_salt: None,
        wave: None,
        decision: None,
        grant: Some(grant.clone()),
    };
    let answer = app
        .signed_request(
            runner,
            &request,
            &Signed {
                call_id: uuid::Uuid::new_v4().to_string(),
                approval_id: approval_id.map(str::to_owned),
                lowered_by_policy: None,
            },
        )
        .await;
    (answer.status, answer.body)
}

/// The revocation `app`'s key signs for `runner`, posted to it: its status and body.
async fn revoke(app: &TestApp, runner: &str, token: &str) -> (u16, Value) {
    let res = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .build()
        .unwrap()
        .post(format!("{}/v1/grants/revoked", app.runner_urls[runner]))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    (res.status().as_u16(), res.json().await.unwrap_or_default())
}

fn signer(app: &TestApp) -> CallSigner {
    CallSigner::from_file(&app.private_key).unwrap()
}

/// The answer refuses with `status`, saying `why`, and the restarts stay at `ran`.
#[track_caller]
fn refused(lab: &Lab, answer: (u16, Value), status: u16, why: &str, ran: usize) {
    let (code, body) = answer;
    let error = body["error"].as_str().unwrap_or_default();
    assert_eq!(code, status, "{body}");
    assert!(error.contains(why), "`{error}` does not say `{why}`");
    assert_eq!(restarts(&lab.record), ran, "nothing more ran: {error}");
}

#[tokio::test]
async fn a_runner_runs_a_grants_calls_only_within_it_whoever_signs_the_call() {
    let mut lab = lab().await;
    let grant = edge_grant();
    let app = &lab.app;

    // One person's signature is not a grant.
    let alone = restart(app, "edge-1", "consul", &signed(&grant, &[1]), None).await;
    refused(&lab, alone, 403, "needs 2", 0);
    let alice_twice = restart(app, "edge-1", "consul", &signed(&grant, &[1, 3]), None).await;
    refused(&lab, alice_twice, 403, "count once", 0);

    // Two people: three restarts run with no approval at all.
    let proof = signed(&grant, &[1, 2]);
    for (n, unit) in ["consul", "traefik", "consul"].iter().enumerate() {
        let (code, body) = restart(app, "edge-1", unit, &proof, None).await;
        assert_eq!(code, 200, "restart {n}: {body}");
        assert_eq!(restarts(&lab.record), n + 1);
    }
    // The fourth is over the grant's calls.
    let fourth = restart(app, "edge-1", "consul", &proof, None).await;
    refused(&lab, fourth, 409, "spent", 3);

    // A fresh grant of the same shape, for the refusals that are not about the count.
    let other = edge_grant();
    let proof = signed(&other, &[1, 2]);
    let outside = restart(app, "edge-2", "nomad", &proof, None).await;
    refused(&lab, outside, 403, "`unit`: \"nomad\" is outside", 3);
    let core = restart(app, "core-1", "consul", &proof, None).await;
    refused(&lab, core, 403, "labels do not match", 3);
    let both = restart(app, "edge-2", "consul", &proof, Some(&id_ago(0))).await;
    refused(&lab, both, 403, "never both", 3);
    // Its text changed under the same signatures: more calls.
    let mut more = proof.clone();
    more.text = proof.text.replace("\ncalls 3\n", "\ncalls 30\n");
    more.text = more
        .text
        .replace("\ncalls_per_runner 3\n", "\ncalls_per_runner 30\n");
    let more = restart(app, "edge-2", "consul", &more, None).await;
    refused(&lab, more, 403, "signature", 3);
    // Expired a minute ago, and one that lives two hours (the runner's bound is one).
    let expired = Grant {
        id: id_ago(300),
        expires_at: in_secs(-60),
        ..edge_grant()
    };
    let expired = restart(app, "edge-2", "consul", &signed(&expired, &[1, 2]), None).await;
    refused(&lab, expired, 403, "expired", 3);
    let long = Grant {
        expires_at: in_secs(7200),
        ..edge_grant()
    };
    let long = restart(app, "edge-2", "consul", &signed(&long, &[1, 2]), None).await;
    refused(&lab, long, 403, "more than the 3600 s", 3);

    // Revocation: one call runs, the server says it is revoked, nothing more runs; not after
    // a restart either, and a replayed revocation changes nothing.
    let (code, body) = restart(app, "edge-2", "consul", &proof, None).await;
    assert_eq!(code, 200, "{body}");
    let revoked = RevokedGrant {
        id: other.id.clone(),
        expires: now() + 600,
    };
    let token = signer(app)
        .sign(&RevokeClaims::for_runner("edge-2", vec![revoked.clone()]))
        .unwrap();
    assert_eq!(
        revoke(app, "edge-2", &token).await,
        (200, json!({"revoked": 1, "already_expired": 0}))
    );
    let after = restart(app, "edge-2", "traefik", &proof, None).await;
    refused(&lab, after, 403, "was revoked", 4);
    assert_eq!(revoke(app, "edge-2", &token).await.0, 200);
    // Only a revocation token for this runner revokes: a health token, a call token and one
    // for another runner are refused.
    let health = signer(app)
        .sign(&HealthClaims::for_runner("edge-1"))
        .unwrap();
    let (code, body) = revoke(app, "edge-1", &health).await;
    assert_eq!(code, 401, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("health token"),
        "{body}"
    );
    let for_edge_2 = token.clone();
    assert_eq!(revoke(app, "edge-1", &for_edge_2).await.0, 401);
    let call = CallClaims {
        iss: "emisar".into(),
        aud: "edge-1".into(),
        iat: now(),
        exp: now() + 30,
        purpose: Purpose::Call,
        jti: "j".into(),
        call_id: "c".into(),
        tool: TOOL.into(),
        request_sha256: "0".into(),
        pack_sha256: "0".into(),
        approval_id: None,
        lowered_by_policy: None,
    };
    let call = signer(app).sign(&call).unwrap();
    assert_eq!(revoke(app, "edge-1", &call).await.0, 401);
    let bad_id = signer(app)
        .sign(&RevokeClaims::for_runner(
            "edge-1",
            vec![RevokedGrant {
                id: "x 1\ngrant:y#1".into(),
                expires: now() + 60,
            }],
        ))
        .unwrap();
    let (code, body) = revoke(app, "edge-1", &bad_id).await;
    assert_eq!(code, 400, "{body}");

    lab.app.restart_runner("edge-2", false).await;
    let restarted = restart(&lab.app, "edge-2", "traefik", &proof, None).await;
    refused(&lab, restarted, 403, "was revoked", 4);

    // A runner that lost its state refuses every grant asked for before: it cannot know how
    // many of its calls ran.
    let third = edge_grant();
    let proof = signed(&third, &[1, 2]);
    lab.app.restart_runner("edge-1", true).await;
    let lost = restart(&lab.app, "edge-1", "consul", &proof, None).await;
    refused(&lab, lost, 403, "before this runner's state began", 4);
    // edge-1's three uses of the first grant are forgotten with its state, and the first
    // grant is refused there for the same reason, not run again.
    let first = restart(&lab.app, "edge-1", "consul", &signed(&grant, &[1, 2]), None).await;
    refused(&lab, first, 403, "before this runner's state began", 4);
}

#[tokio::test]
async fn a_break_glass_window_runs_only_where_the_runners_file_honours_it_and_never_with_one_person()
 {
    let lab = lab().await;
    let app = &lab.app;
    let window = Grant {
        break_glass: true,
        tools: vec!["*".into()],
        runners: Runners::Names(vec!["core-1".into(), "edge-1".into()]),
        args: Default::default(),
        max_calls: 10,
        max_calls_per_runner: 5,
        ..edge_grant()
    };
    let alone = restart(app, "edge-1", "nomad", &signed(&window, &[1]), None).await;
    refused(&lab, alone, 403, "needs 2", 0);
    let proof = signed(&window, &[1, 2]);
    let (code, body) = restart(app, "edge-1", "nomad", &proof, None).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(restarts(&lab.record), 1);
    let core = restart(app, "core-1", "nomad", &proof, None).await;
    refused(&lab, core, 403, "does not honour break-glass", 1);
    let unnamed = restart(app, "edge-2", "nomad", &proof, None).await;
    refused(
        &lab,
        unnamed,
        403,
        "does not name this runner (`edge-2`)",
        1,
    );
}
