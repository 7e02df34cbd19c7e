//! The bounds on approval requests: one agent has at most `max_pending_per_agent` pending,
//! and an approved request whose execution never started (its replica stopped between the
//! decision and the claim) runs only within `approved_start_within_secs` of the approval;
//! later, it expires and nothing runs.

use std::time::{Duration, Instant};

use emisar::server::audit::AuditFilter;
use emisar::server::principal::Role;
use serde_json::{Value, json};

use crate::approvals::{Portal, kinds_of, restart_args, restart_lab, restarts, signed_in};
use crate::both_backends;
use crate::harness::Backend;
use crate::harness::app::{Options, TestApp};
use crate::mcp_calls::call;

/// Asks for a restart; the call returns the pending request's id once its short wait ends.
async fn ask(
    client: &rmcp::service::RunningService<rmcp::RoleClient, ()>,
    reason: &str,
) -> rmcp::model::CallToolResult {
    call(client, "linux.systemctl_restart", restart_args(reason)).await
}

fn approval_id(res: &rmcp::model::CallToolResult) -> String {
    let s = res.structured_content.clone().unwrap();
    assert_eq!(s["approval"]["state"], "pending", "{s}");
    s["approval"]["approval_id"].as_str().unwrap().to_owned()
}

async fn an_agent_has_at_most_max_pending_requests(backend: Backend) {
    let (_bin, record, app) = restart_lab(
        backend,
        Options {
            max_pending_per_agent: Some(2),
            approval_wait_secs: Some(1),
            ..Default::default()
        },
    )
    .await;
    let client = app.mcp_client().await;
    let first = approval_id(&ask(&client, "one").await);
    approval_id(&ask(&client, "two").await);

    let res = ask(&client, "three").await;
    assert_eq!(res.is_error, Some(true), "{res:?}");
    let error = &res.structured_content.as_ref().unwrap()["error"];
    assert_eq!(error["kind"], "too_many_pending", "{error}");
    assert_eq!(
        (error["pending"].clone(), error["max"].clone()),
        (json!(2), json!(2))
    );
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("max_pending_per_agent = 2"),
        "{error}"
    );
    let rejected = app
        .events(AuditFilter {
            kind: Some("tool.rejected".into()),
            ..Default::default()
        })
        .await;
    assert_eq!(rejected.len(), 1, "{rejected:?}");
    assert_eq!(rejected[0].reason.as_deref(), Some("three"));

    // Once one is decided, there is room again.
    let bob = signed_in(&app, "bob", Role::Approver).await;
    let (status, body) = bob.deny(&first, "one at a time").await;
    assert_eq!(status, 200, "{body}");
    approval_id(&ask(&client, "four").await);
    assert_eq!(restarts(&record), 0);
    app.assert_chain_intact().await;
    client.cancel().await.unwrap();
}
both_backends!(an_agent_has_at_most_max_pending_requests);

/// Moves request `id` to `approved`, decided by alice `ago` in the past, the way a replica
/// that stopped right after recording the approval leaves it: its `approval.approved` in the
/// log (the sweep runs nothing the log does not back), the row's time `ago`.
async fn approved_long_ago(app: &TestApp, id: &str, ago: chrono::Duration) {
    approved_in_the_log(app, id).await;
    let at = emisar::server::audit::format_at(chrono::Utc::now() - ago);
    emisar::with_pool!(&app.db, pool => sqlx::query(app.db.sql(
        "UPDATE approvals SET state = 'approved', decided_by = 'approver:alice', updated_at = $1::timestamptz WHERE id = $2",
    ))
    .bind(&at)
    .bind(id)
    .execute(pool)
    .await
    .map(|_| ()))
    .unwrap();
}

/// The `approval.approved` event that settled request `id`, as the replica that approved it
/// appended it.
async fn approved_in_the_log(app: &TestApp, id: &str) {
    let requested = app
        .events(AuditFilter {
            approval_id: Some(id.into()),
            kind: Some("approval.requested".into()),
            ..Default::default()
        })
        .await;
    let requested = &requested[0];
    app.audit
        .append(emisar::server::audit::NewEvent {
            actor: "approver:alice".into(),
            kind: "approval.approved".into(),
            tool: requested.tool.clone(),
            call_id: requested.call_id.clone(),
            approval_id: Some(id.into()),
            detail: Some(json!({"votes": 1, "required": 1, "state": "approved"})),
            ..Default::default()
        })
        .await
        .unwrap();
}

async fn state_settles(p: &Portal, id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, row) = p.get(&format!("/api/approvals/{id}")).await;
        if row["state"] != "approved" && row["state"] != "executing" {
            return row;
        }
        assert!(Instant::now() < deadline, "{id} did not settle: {row}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn an_approval_that_never_started_expires(backend: Backend) {
    let (_bin, record, app) = restart_lab(
        backend,
        Options {
            approval_wait_secs: Some(1),
            ..Default::default()
        },
    )
    .await;
    let carol = signed_in(&app, "carol", Role::Auditor).await;
    let client = app.mcp_client().await;

    // Approved ten minutes ago and never started: it expires, and nothing runs.
    let stale = approval_id(&ask(&client, "approved, then the replica died").await);
    approved_long_ago(&app, &stale, chrono::Duration::minutes(10)).await;
    let row = state_settles(&carol, &stale).await;
    assert_eq!(row["state"], "expired", "{row}");
    let note = row["outcome_note"].as_str().unwrap();
    assert!(note.contains("did not start within 300 s"), "{note}");
    assert_eq!(restarts(&record), 0);
    assert_eq!(
        kinds_of(&app, &stale).await,
        [
            "tool.called",
            "approval.requested",
            "approval.approved",
            "approval.expired"
        ]
    );
    let res = call(
        &client,
        "emisar.approval_status",
        json!({"approval_id": stale, "reason": "did it run?"}),
    )
    .await;
    assert_eq!(res.is_error, Some(true), "{res:?}");
    let error = &res.structured_content.as_ref().unwrap()["error"];
    assert_eq!(error["kind"], "expired", "{error}");

    // Approved twenty seconds ago and never started: still in time, so the sweeper runs it.
    let recent = approval_id(&ask(&client, "approved, then the replica restarted").await);
    approved_long_ago(&app, &recent, chrono::Duration::seconds(20)).await;
    let row = state_settles(&carol, &recent).await;
    assert_eq!(row["state"], "executed", "{row}");
    assert_eq!(restarts(&record), 1);
    app.assert_chain_intact().await;
    client.cancel().await.unwrap();
}
both_backends!(an_approval_that_never_started_expires);

/// A restart asked for, approved by one person and run once on the lab's runner.
struct RanOnce {
    _bin: tempfile::TempDir,
    record: std::path::PathBuf,
    app: TestApp,
    /// An auditor, who reads the request.
    carol: Portal,
    client: rmcp::service::RunningService<rmcp::RoleClient, ()>,
    id: String,
}

async fn ran_once(backend: Backend) -> RanOnce {
    let (bin, record, app) = restart_lab(
        backend,
        Options {
            approval_wait_secs: Some(1),
            ..Default::default()
        },
    )
    .await;
    let carol = signed_in(&app, "carol", Role::Auditor).await;
    let bob = signed_in(&app, "bob", Role::Approver).await;
    let client = app.mcp_client().await;
    let id = approval_id(&ask(&client, "once").await);
    let (status, body) = bob.approve(&id).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(state_settles(&carol, &id).await["state"], "executed");
    assert_eq!(restarts(&record), 1);
    RanOnce {
        _bin: bin,
        record,
        app,
        carol,
        client,
        id,
    }
}

/// What an insider with the database does to run a request again: its row back to
/// `approved`, its time to `at`.
async fn set_back_to_approved(app: &TestApp, id: &str, at: &str) {
    emisar::with_pool!(&app.db, pool => sqlx::query(app.db.sql(
        "UPDATE approvals SET state = 'approved', updated_at = $1::timestamptz WHERE id = $2",
    ))
    .bind(at)
    .bind(id)
    .execute(pool)
    .await
    .map(|_| ()))
    .unwrap();
}

/// An insider with the database sets an executed request back to `approved`, its time to a
/// moment ago, the way an aborted rollout was set to run again (red team 2, A1): the sweep
/// finds its `approval.executing` in the audit log, runs nothing again, and expires it, saying
/// why.
async fn a_request_set_back_to_approved_in_the_store_does_not_run_again(backend: Backend) {
    let RanOnce {
        _bin,
        record,
        app,
        carol,
        client,
        id,
    } = ran_once(backend).await;

    let at = emisar::server::audit::format_at(chrono::Utc::now() - chrono::Duration::seconds(20));
    set_back_to_approved(&app, &id, &at).await;
    let row = state_settles(&carol, &id).await;
    assert_eq!(row["state"], "expired", "{row}");
    let note = row["outcome_note"].as_str().unwrap();
    assert!(note.contains("it started already"), "{note}");
    assert_eq!(restarts(&record), 1, "nothing ran again");
    app.assert_chain_intact().await;
    client.cancel().await.unwrap();
}
both_backends!(a_request_set_back_to_approved_in_the_store_does_not_run_again);

/// Red team 3, B1: the insider also deletes the request's `approval.executing` (its triggers
/// off: the table's owner can) before setting it back to `approved`. The sweep finds the gap
/// that deletion left in the log, runs nothing again, and expires it, saying why.
async fn a_claim_deleted_from_the_log_leaves_a_gap_and_runs_nothing_again(backend: Backend) {
    let RanOnce {
        _bin,
        record,
        app,
        carol,
        client,
        id,
    } = ran_once(backend).await;

    let triggers_off = match backend {
        Backend::Postgres => "ALTER TABLE audit_events DISABLE TRIGGER USER",
        Backend::Sqlite => "DROP TRIGGER audit_events_no_delete",
    };
    let at = emisar::server::audit::format_at(chrono::Utc::now() - chrono::Duration::seconds(20));
    for (sql, bind) in [
        (triggers_off, None),
        (
            "DELETE FROM audit_events WHERE approval_id = $1 AND kind = 'approval.executing'",
            Some(id.as_str()),
        ),
    ] {
        emisar::with_pool!(&app.db, pool => {
            let q = sqlx::query(app.db.sql(sql));
            let q = match bind { Some(b) => q.bind(b), None => q };
            q.execute(pool).await.map(|_| ())
        })
        .unwrap();
    }
    assert!(
        !kinds_of(&app, &id)
            .await
            .contains(&"approval.executing".to_owned())
    );
    set_back_to_approved(&app, &id, &at).await;
    let row = state_settles(&carol, &id).await;
    assert_eq!(row["state"], "expired", "{row}");
    let note = row["outcome_note"].as_str().unwrap();
    assert!(note.contains("missing events since its approval"), "{note}");
    assert_eq!(restarts(&record), 1, "nothing ran again");
    client.cancel().await.unwrap();
}
both_backends!(a_claim_deleted_from_the_log_leaves_a_gap_and_runs_nothing_again);

/// Red team 3, B0: while a request waits, an insider with the database lowers the count of
/// people it needs (the policy asks two) to one. One person's yes settles it in the store,
/// and the run refuses it: the log's `approval.requested` says two. Nothing runs.
async fn a_count_of_people_lowered_in_the_store_runs_nothing(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.yaml");
    std::fs::write(&policy, "approvers:\n  default: 2\n").unwrap();
    let (_bin, record, app) = restart_lab(
        backend,
        Options {
            approval_wait_secs: Some(1),
            policy_file: Some(policy),
            ..Default::default()
        },
    )
    .await;
    let carol = signed_in(&app, "carol", Role::Auditor).await;
    let bob = signed_in(&app, "bob", Role::Approver).await;
    let client = app.mcp_client().await;
    let id = approval_id(&ask(&client, "two people").await);
    emisar::with_pool!(&app.db, pool => sqlx::query(app.db.sql(
        "UPDATE approvals SET required_approvals = 1 WHERE id = $1",
    ))
    .bind(&id)
    .execute(pool)
    .await
    .map(|_| ()))
    .unwrap();
    let (status, body) = bob.approve(&id).await;
    assert_eq!(status, 200, "{body}");
    let row = state_settles(&carol, &id).await;
    assert_eq!(row["state"], "failed", "{row}");
    let note = row["outcome_note"].as_str().unwrap();
    assert!(
        note.contains("needs 1 people, and it was asked for with 2"),
        "{note}"
    );
    assert_eq!(restarts(&record), 0, "nothing ran");
    client.cancel().await.unwrap();
}
both_backends!(a_count_of_people_lowered_in_the_store_runs_nothing);

/// A number series of `/metrics` (scraped with `token`, an auditor's), or `None` when the
/// scrape does not have it.
async fn series(app: &TestApp, token: &str, name: &str) -> Option<f64> {
    let text = app.metrics(token).await;
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .map(|v| v.parse().unwrap())
}

/// `/metrics` has the backlog (requests waiting for people, counted in the store: decided and
/// expired ones leave it) and counts the requests that expired with nobody's answer. The
/// counter is the process's, which other tests' servers share: it is read before and after.
async fn the_backlog_and_the_requests_that_expired_unanswered_are_in_metrics(backend: Backend) {
    let (_bin, record, app) = restart_lab(
        backend,
        Options {
            approval_wait_secs: Some(1),
            approval_ttl_secs: Some(10),
            ..Default::default()
        },
    )
    .await;
    let prometheus = app.issue_token("prometheus", Role::Auditor).await;
    let backlog = || series(&app, &prometheus, "emisar_approvals_pending");
    let expired = || series(&app, &prometheus, "emisar_approvals_expired_total");
    assert_eq!(backlog().await, Some(0.0));
    let expired_before = expired()
        .await
        .expect("the counter is there from the start");

    let client = app.mcp_client().await;
    let denied = approval_id(&ask(&client, "one").await);
    let unanswered = approval_id(&ask(&client, "two").await);
    assert_eq!(backlog().await, Some(2.0));
    let bob = signed_in(&app, "bob", Role::Approver).await;
    let (status, body) = bob.deny(&denied, "not now").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(backlog().await, Some(1.0));

    // Nobody answers the other one: it expires after 10 s, and the sweep records it.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let kinds = kinds_of(&app, &unanswered).await;
        if kinds.last().map(String::as_str) == Some("approval.expired") {
            assert_eq!(
                kinds,
                ["tool.called", "approval.requested", "approval.expired"]
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not expired within 30 s: {kinds:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(backlog().await, Some(0.0));
    assert!(expired().await.unwrap() > expired_before);
    assert_eq!(restarts(&record), 0);
    client.cancel().await.unwrap();
}
both_backends!(the_backlog_and_the_requests_that_expired_unanswered_are_in_metrics);
