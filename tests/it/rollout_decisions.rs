//! People's signed decision on a halted rollout (issue 46), on PostgreSQL with the five TLS
//! runners of `rollouts.rs` that require alice's and bob's signatures: a retry, signed by
//! both once the canary is fixed, runs the canary again and then the rest wave by wave; an
//! abort, signed by one, ends another; a resume, signed by both, runs a third's runners left
//! without the canary; a request over `max_targets` is refused before anyone
//! is asked; and a server holding `server.key` cannot use a decision to run a runner twice, on
//! a runner it does not name, or with fewer people than the write needed.

use std::time::{Duration, Instant};

use emisar::digest::sha256_hex;
use emisar::protocol::approval::{Choice, Decision, DecisionProof};
use emisar::protocol::{CallRequest, Mode};
use emisar::server::principal::Role;
use serde_json::{Value, json};

use crate::approvals::{Portal, call_in_background, finished, signed_in};
use crate::harness::app::Signed;
use crate::rollouts::{FLEET, TOOL, events, fleet, fleet_with, roll, statement_for};
use crate::signed_approvals::{in_secs, proof, ssh};

/// Waits until request `id` leaves `executing`, and returns it.
async fn settled(p: &Portal, id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, row) = p.get(&format!("/api/approvals/{id}")).await;
        if row["state"] != "executing" {
            return row;
        }
        assert!(Instant::now() < deadline, "still executing: {row}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `who` proposes `choice` on request `id`: the request with the pending decision.
async fn propose(who: &Portal, id: &str, choice: &str) -> Value {
    let (status, body) = who
        .post(
            &format!("/api/approvals/{id}/decision"),
            json!({ "choice": choice }),
            true,
        )
        .await;
    assert_eq!(status, 200, "{body}");
    body
}

/// `who` votes for decision `decision` of request `id` with `body`'s other fields.
async fn vote(who: &Portal, id: &str, body: Value) -> (u16, Value) {
    who.post(&format!("/api/approvals/{id}/decision/vote"), body, true)
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signed_decisions_retry_abort_and_resume_halted_rollouts_as_people_signed() {
    let fleet = fleet().await;
    let alice = signed_in(&fleet.app, "alice", Role::Approver).await;
    let bob = signed_in(&fleet.app, "bob", Role::Approver).await;

    fleet.make_sick("edge-1", "fix");
    let (out, request) = roll(&fleet, &alice, &bob, "fix").await;
    assert_eq!(out["approval"]["state"], "halted", "{out}");
    // The agent reads where it halted, and what people may do.
    assert_eq!(
        out["halt"],
        json!({"wave": 1, "runner": "edge-1", "not_run": ["edge-2", "edge-3", "edge-4", "edge-5"]})
    );
    assert!(
        out["approval"]["message"]
            .as_str()
            .unwrap()
            .contains("resume, retry or abort it with a signed decision"),
        "{out}"
    );
    let id = request["id"].as_str().unwrap();

    // A retry: the failed canary, then everything left, in the signed plan's waves.
    let proposed = propose(&alice, id, "retry").await;
    let decision = &proposed["decision"];
    assert_eq!(decision["runners"], json!(FLEET), "{decision}");
    assert_eq!(decision["required"], 2);
    let text = decision["text"].as_str().unwrap().to_owned();
    let parsed = Decision::parse(&text).unwrap();
    assert_eq!(parsed.choice, Choice::Retry);
    assert_eq!(parsed.halted_wave, 1);
    assert_eq!(
        parsed.statement_sha256,
        sha256_hex(request["statement"]["text"].as_str().unwrap().as_bytes()),
        "the decision binds the statement people signed"
    );
    let did = decision["id"].as_str().unwrap();

    // Where the runners check signatures, a vote without one counts for nothing.
    let (status, body) = vote(&alice, id, json!({ "decision_id": did })).await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("`signature`"),
        "{body}"
    );
    // Nor does a signature over another text.
    let (status, body) = vote(
        &alice,
        id,
        json!({ "decision_id": did, "signature": ssh(1, &text.replace("retry", "resume")) }),
    )
    .await;
    assert_eq!(status, 403, "{body}");

    // The canary is fixed; alice and bob sign the retry.
    std::fs::remove_file(fleet.dir.path().join("edge-1").join("sick-fix")).unwrap();
    let (status, body) = vote(
        &alice,
        id,
        json!({ "decision_id": did, "signature": ssh(1, &text), "note": "edge-1 fixed" }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["state"], "halted", "one of two people: {body}");
    assert!(
        fleet.marked("fix").len() == 1,
        "nothing runs on one signature"
    );
    let (status, body) = vote(
        &bob,
        id,
        json!({ "decision_id": did, "signature": ssh(2, &text) }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["state"], "executing", "{body}");
    let row = settled(&alice, id).await;
    assert_eq!(row["state"], "executed", "{row}");

    // By the runners' own records: the canary twice, then wave 2, then wave 3.
    let marks = fleet.marked("fix");
    let order: Vec<&str> = marks.iter().map(|(r, _)| r.as_str()).collect();
    assert_eq!(order.len(), 6, "{marks:?}");
    assert_eq!(&order[..2], ["edge-1", "edge-1"], "{marks:?}");
    let at = |r: &str| marks.iter().rev().find(|(n, _)| n == r).unwrap().1;
    assert!(at("edge-1") < at("edge-2").min(at("edge-3")), "{marks:?}");
    assert!(
        at("edge-2").max(at("edge-3")) < at("edge-4").min(at("edge-5")),
        "{marks:?}"
    );
    let results = row["result"]["results"].as_array().unwrap();
    assert_eq!(results.len(), 5, "{row}");
    assert!(results.iter().all(|r| r["ok"] == true), "{row}");
    assert!(row["result"].get("halt").is_none(), "{row}");
    // Every step is in the audit log: the proposal, each signed vote, each gate.
    assert_eq!(
        events(&fleet.app, id, "rollout.decision_proposed")
            .await
            .len(),
        1
    );
    let decided = events(&fleet.app, id, "rollout.decided").await;
    assert_eq!(decided.len(), 2);
    let last = decided[1].detail.as_ref().unwrap();
    assert_eq!(last["state"], "executing");
    assert_eq!(last["text"], json!(text), "what the auditor verifies again");
    assert_eq!(last["signed"]["person"], "bob");

    // Another change halts; one person's signed abort ends it, and nothing more runs (the
    // file's two SSH signatures are for what runs: an abort runs nothing).
    fleet.make_sick("edge-1", "bad");
    let (out, request) = roll(&fleet, &alice, &bob, "bad").await;
    assert_eq!(out["approval"]["state"], "halted", "{out}");
    let id = request["id"].as_str().unwrap();
    let proposed = propose(&bob, id, "abort").await;
    let decision = &proposed["decision"];
    assert_eq!(decision["required"], 1);
    assert_eq!(decision["runners"], json!([]));
    let text = decision["text"].as_str().unwrap();
    let (status, body) = vote(
        &bob,
        id,
        json!({ "decision_id": decision["id"], "signature": ssh(2, text), "note": "rolling back by hand" }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["state"], "aborted", "{body}");
    // Aborted is final: no decision moves it on.
    let (status, _) = alice
        .post(
            &format!("/api/approvals/{id}/decision"),
            json!({"choice": "resume"}),
            true,
        )
        .await;
    assert_eq!(status, 409);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let marked: Vec<String> = fleet.marked("bad").into_iter().map(|(r, _)| r).collect();
    assert_eq!(marked, ["edge-1"], "the abort ran nothing");

    // A third halts; people resume it without the canary (say it is drained): the four left
    // run in their waves, the canary stays as it was, and its result still says why.
    fleet.make_sick("edge-1", "skip");
    let (out, request) = roll(&fleet, &alice, &bob, "skip").await;
    assert_eq!(out["approval"]["state"], "halted", "{out}");
    let id = request["id"].as_str().unwrap();
    let proposed = propose(&alice, id, "resume").await;
    let decision = &proposed["decision"];
    assert_eq!(
        decision["runners"],
        json!(["edge-2", "edge-3", "edge-4", "edge-5"])
    );
    let text = decision["text"].as_str().unwrap().to_owned();
    for (who, seed) in [(&alice, 1), (&bob, 2)] {
        let (status, body) = vote(
            who,
            id,
            json!({ "decision_id": decision["id"], "signature": ssh(seed, &text) }),
        )
        .await;
        assert_eq!(status, 200, "{body}");
    }
    let row = settled(&alice, id).await;
    assert_eq!(row["state"], "executed", "{row}");
    let marks = fleet.marked("skip");
    let order: Vec<&str> = marks.iter().map(|(r, _)| r.as_str()).collect();
    assert_eq!(order.len(), 5, "{marks:?}");
    assert_eq!(order[0], "edge-1", "the canary once, before the halt");
    let at = |r: &str| marks.iter().find(|(n, _)| n == r).unwrap().1;
    assert!(
        at("edge-2").max(at("edge-3")) < at("edge-4").min(at("edge-5")),
        "the resume kept the signed waves: {marks:?}"
    );
    let results = row["result"]["results"].as_array().unwrap();
    let canary = results.iter().find(|r| r["runner"] == "edge-1").unwrap();
    assert_eq!(canary["error_kind"], "gate_failed", "{row}");
    assert_eq!(
        results.iter().filter(|r| r["ok"] == true).count(),
        4,
        "{row}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_over_max_targets_is_refused_before_anyone_is_asked() {
    let fleet = fleet_with("max_targets:\n  \"roll.*\": 4\n").await;
    let client = fleet.app.mcp_client().await;
    let res = finished(call_in_background(
        &client,
        TOOL,
        json!({"change": "wide", "runners": FLEET, "reason": "all at once"}),
    ))
    .await;
    assert_eq!(res.is_error, Some(true), "{res:?}");
    let text = format!("{:?}", res.content);
    assert!(
        text.contains("at most 4 runners")
            && text.contains("max_targets")
            && text.contains("names 5"),
        "{text}"
    );
    let alice = signed_in(&fleet.app, "alice", Role::Approver).await;
    let (_, pending) = alice.get("/api/approvals?state=pending").await;
    assert_eq!(pending["approvals"], json!([]), "nobody was asked");
    assert!(fleet.marked("wide").is_empty());
}

/// A server holding `server.key` and people's signatures for one write and one retry: the
/// retry runs the failed runner once more, after the statement expired, and no further; a
/// decision never runs a runner it does not name, a resume never runs one twice, and a
/// decision one person signed does not hold where the write needed two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_holds_a_decision_to_what_people_signed() {
    let fleet = fleet().await;
    let app = &fleet.app;
    // Expires before the retry below.
    let statement = statement_for(&fleet, "once", 3);
    let statement_text = statement.text().unwrap();
    let decision = |choice: Choice, runners: &[&str], signers: &[u8]| {
        let text = Decision {
            id: uuid::Uuid::now_v7().to_string(),
            approval_id: statement.approval_id.clone(),
            statement_sha256: sha256_hex(statement_text.as_bytes()),
            halted_wave: 1,
            choice,
            runners: runners.iter().map(|r| (*r).to_owned()).collect(),
            expires_at: in_secs(600),
        }
        .text()
        .unwrap();
        DecisionProof {
            signatures: signers.iter().map(|s| ssh(*s, &text)).collect(),
            text,
        }
    };
    let send = |runner: &'static str, wave: u32, decision: Option<DecisionProof>| {
        let request = CallRequest {
            tool: TOOL.into(),
            args: json!({"change": "once"}).as_object().unwrap().clone(),
            mode: Mode::Execute,
            preview: None,
            preview_seal: None,
            raw: false,
            approval: Some(proof(&statement, &[1, 2])),
            witnessed: None,
            secret_salt: None,
            wave: Some(wave),
            decision,
            grant: None,
        };
        let signed = Signed {
            call_id: uuid::Uuid::new_v4().to_string(),
            approval_id: Some(statement.approval_id.clone()),
            lowered_by_policy: None,
        };
        async move { app.signed_request(runner, &request, &signed).await }
    };
    let refused = |answer: &crate::harness::app::DirectAnswer, status: u16, why: &str| {
        assert_eq!(answer.status, status, "{}", answer.body);
        let error = answer.body["error"].as_str().unwrap_or_default();
        assert!(error.contains(why), "{error}");
    };

    // The canary runs once under the statement.
    let answer = send("edge-1", 1, None).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    tokio::time::sleep(Duration::from_secs(4)).await;
    // The statement has expired: nothing runs under it alone.
    refused(&send("edge-2", 2, None).await, 403, "expired");
    // A resume never runs the canary twice.
    let resume = decision(Choice::Resume, &["edge-1", "edge-2"], &[1, 2]);
    refused(
        &send("edge-1", 1, Some(resume.clone())).await,
        403,
        "not a retry",
    );
    // A decision one person signed does not hold where the write needed two.
    let thin = decision(Choice::Retry, &["edge-1"], &[1]);
    refused(&send("edge-1", 1, Some(thin)).await, 403, "needs 2");
    // A decision holds only on the runners it names.
    let retry = decision(Choice::Retry, &["edge-1"], &[1, 2]);
    refused(
        &send("edge-3", 2, Some(retry.clone())).await,
        403,
        "does not name this runner",
    );
    // A decision signed for another statement holds for nothing.
    let mut other = decision(Choice::Retry, &["edge-1"], &[1, 2]);
    other.text = other
        .text
        .replacen(&sha256_hex(statement_text.as_bytes()), &"0".repeat(64), 1);
    other.signatures = vec![ssh(1, &other.text), ssh(2, &other.text)];
    refused(
        &send("edge-1", 1, Some(other)).await,
        403,
        "another statement",
    );
    assert_eq!(
        fleet.marked("once").len(),
        1,
        "nothing ran since the canary"
    );

    // The signed retry runs the canary once more, past the statement's expiry, and once only.
    let answer = send("edge-1", 1, Some(retry.clone())).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    refused(
        &send("edge-1", 1, Some(retry)).await,
        409,
        "already carried out",
    );
    // The resume runs a runner it names, in its wave, once.
    let answer = send("edge-2", 2, Some(resume.clone())).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    refused(
        &send("edge-2", 2, Some(resume)).await,
        403,
        "never runs a runner twice",
    );
    // A retry runs again only the runner of the wave it halted in: edge-2 ran (wave 2) and
    // passed, and a retry that names it does not run it twice; edge-3 never ran, and a retry
    // runs it once, and no more (red team: a replayed retry ran every runner it named twice).
    let wide = decision(Choice::Retry, &["edge-1", "edge-2", "edge-3"], &[1, 2]);
    refused(
        &send("edge-2", 2, Some(wide.clone())).await,
        403,
        "runs again only the runner that failed, in wave 1",
    );
    let answer = send("edge-3", 2, Some(wide.clone())).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    refused(
        &send("edge-3", 2, Some(wide)).await,
        403,
        "runs again only the runner that failed",
    );
    let order: Vec<String> = fleet.marked("once").into_iter().map(|(r, _)| r).collect();
    assert_eq!(order, ["edge-1", "edge-1", "edge-2", "edge-3"]);
}
