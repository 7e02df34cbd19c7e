//! Break-glass reviews on PostgreSQL (issue 47): a closed window is listed as unreviewed, by
//! `emisar audit break-glass` and by the portal's API, until two people of the approvers file
//! sign a review with a note in the terminal; a review without a note is refused, naming
//! `note`; one person's signature leaves the window unreviewed; the review is the audit log's,
//! so deleting the reviews' rows unreviews nothing.
//!
//! And one person alone cannot open a window: `emisar break-glass open` asks for it, the
//! opener cannot sign it, and one other person's signature leaves it requested; a second makes
//! it open.
//!
//! The reviewed window's own life (`grant.requested` … `grant.used`) is appended as the
//! grants' server side writes it, so that it is closed (expired an hour ago) and holds a call.
//!
//! And a window's calls run on TLS runners that honour break-glass, flagged in the log and
//! only once two witnesses cosigned their record; a runner whose file does not honour
//! break-glass refuses them, and a call no witness quorum cosigns runs nowhere. Every group of
//! the notices hears at once of the window asked for (with the link to its page), of it open,
//! and of each call inside it, once per call, with the tool and the runners.

use std::path::Path;

use emisar::protocol::approval::grant::{Grant, Runners};
use emisar::server::audit::NewEvent;
use emisar::server::principal::Role;
use serde_json::{Value, json};
use ssh_key::LineEnding;

use crate::approvals::signed_in;
use crate::harness::app::{Options, TestApp};
use crate::harness::{Backend, spawn_app};
use crate::signed_approvals::{key, pub_line};

/// alice (key 1), bob (key 2) and carol (key 3); every tool's writes need one person, and
/// every runner of this file honours break-glass.
fn approvers_text() -> String {
    format!(
        "serial = 1\n\
         [[person]]\nname = \"alice\"\nssh = [\"{}\"]\n\
         [[person]]\nname = \"bob\"\nssh = [\"{}\"]\n\
         [[person]]\nname = \"carol\"\nssh = [\"{}\"]\n\
         [[rule]]\ntools = \"*\"\napprovals = 1\nbreak_glass = true\n",
        pub_line(1),
        pub_line(2),
        pub_line(3)
    )
}

async fn app_with_approvers(files: &Path) -> TestApp {
    let approvers = files.join("approvers.toml");
    std::fs::write(&approvers, approvers_text()).unwrap();
    spawn_app(
        Backend::Postgres,
        vec![],
        Options {
            approvers_file: Some(approvers),
            ..Default::default()
        },
    )
    .await
}

/// A window over edge-1 asked for two hours ago, for one hour: closed by now. Its life, as
/// the grants' server side logs it: asked for and signed by alice and bob, active, one call.
async fn closed_window(app: &TestApp) -> Grant {
    let now = chrono::Utc::now().timestamp();
    let opened = uuid::Timestamp::from_unix(uuid::NoContext, (now - 7200) as u64, 0);
    let expires = chrono::DateTime::from_timestamp(now - 3600, 0).unwrap();
    let grant = Grant {
        id: uuid::Uuid::new_v7(opened).to_string(),
        agent: "agent:ops-bot".into(),
        break_glass: true,
        tools: vec!["*".into()],
        runners: Runners::Names(vec!["edge-1".into()]),
        args: Default::default(),
        max_calls: 100,
        max_calls_per_runner: 100,
        required: 2,
        reason: "INC-42: the edge is down".into(),
        expires_at: expires.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
    };
    let event = |actor: &str, kind: &str, detail: Value| NewEvent {
        actor: actor.into(),
        kind: kind.into(),
        outcome: Some("ok".into()),
        detail: Some(detail),
        ..Default::default()
    };
    let id = grant.id.clone();
    let mut used = event(
        "agent:ops-bot",
        "grant.used",
        json!({"grant": id, "use": 1, "call_id": "call-1", "runners": ["edge-1"], "break_glass": true}),
    );
    used.tool = Some("linux.systemctl_restart".into());
    used.call_id = Some("call-1".into());
    app.audit
        .append_all(vec![
            event(
                "approver:alice",
                "grant.requested",
                json!({"grant": id, "text": grant.text().unwrap(), "required": 2}),
            ),
            event(
                "approver:alice",
                "grant.signed",
                json!({"grant": id, "person": "alice"}),
            ),
            event(
                "approver:bob",
                "grant.signed",
                json!({"grant": id, "person": "bob"}),
            ),
            event("approver:bob", "grant.active", json!({"grant": id})),
            used,
        ])
        .await
        .unwrap();
    grant
}

/// The operator guide's retention step 2: as the table's owner, delete the events before the
/// first `grant.used` (the anchor), which cuts every window's request out of the log.
async fn cut_log_before_the_first_call(app: &TestApp) {
    let pool = match app.db.pool() {
        emisar::server::db::Pool::Pg(p) => p,
        _ => unreachable!("PostgreSQL"),
    };
    let anchor: i64 =
        sqlx::query_scalar("SELECT min(seq) FROM audit_events WHERE kind = 'grant.used'")
            .fetch_one(pool)
            .await
            .unwrap();
    let mut tx = pool.begin().await.unwrap();
    for sql in [
        "ALTER TABLE audit_events DISABLE TRIGGER audit_events_no_update_delete".to_owned(),
        format!("DELETE FROM audit_events WHERE seq < {anchor}"),
        "ALTER TABLE audit_events ENABLE TRIGGER audit_events_no_update_delete".to_owned(),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&mut *tx)
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
}

/// Runs `emisar` with `args` (no ssh-agent: the keys are files).
async fn emisar(args: &[&str]) -> std::process::Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_emisar"))
        .args(args)
        .env_remove("SSH_AUTH_SOCK")
        .env_remove("EMISAR_SERVER")
        .env_remove("EMISAR_TOKEN")
        .env_remove("DATABASE_URL")
        .output()
        .await
        .unwrap()
}

fn key_file(dir: &Path, seed: u8) -> String {
    let path = dir.join(format!("id_{seed}"));
    key(seed).write_openssh_file(&path, LineEnding::LF).unwrap();
    path.display().to_string()
}

fn text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `emisar audit break-glass --unreviewed`, its reviews checked against the approvers file
/// `app_with_approvers` wrote in `files`: its exit code and what it printed.
async fn unreviewed_in_cli(app: &TestApp, files: &Path) -> (i32, String) {
    let approvers = files.join("approvers.toml");
    let out = emisar(&[
        "audit",
        "break-glass",
        "--unreviewed",
        "--approvers",
        &approvers.display().to_string(),
        "--database",
        &app.database_url,
    ])
    .await;
    (out.status.code().unwrap_or(-1), text(&out))
}

/// Acceptance 2, the review: listed as unreviewed (CLI and API) until two people sign a
/// review with a note; a review without a note is refused, naming `note`.
#[tokio::test]
async fn a_window_is_listed_unreviewed_until_two_people_sign_a_review_with_a_note() {
    let files = tempfile::tempdir().unwrap();
    let app = app_with_approvers(files.path()).await;
    let window = closed_window(&app).await;
    let id = window.id.as_str();

    let (code, listed) = unreviewed_in_cli(&app, files.path()).await;
    assert_eq!(code, 1, "{listed}");
    assert!(
        listed.contains(id) && listed.contains("closed-unreviewed"),
        "{listed}"
    );
    assert!(
        listed.contains("linux.systemctl_restart on edge-1"),
        "{listed}"
    );
    let auditor = signed_in(&app, "carol", Role::Auditor).await;
    let (status, body) = auditor.get("/api/break-glass?unreviewed=true").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["windows"][0]["id"], id, "{body}");
    assert_eq!(body["windows"][0]["state"], "closed-unreviewed", "{body}");
    assert_eq!(
        body["windows"][0]["calls"][0]["call_id"], "call-1",
        "{body}"
    );

    let base = app.base_url();
    let alice = app.issue_token("alice", Role::Approver).await;
    let bob = app.issue_token("bob", Role::Approver).await;
    let review = |token: String, seed: u8, note: Option<&'static str>| {
        let key = key_file(files.path(), seed);
        let base = base.clone();
        let id = id.to_owned();
        async move {
            let mut args = vec![
                "break-glass".to_owned(),
                "review".into(),
                id,
                "--ssh-key".into(),
                key,
                "--server".into(),
                base,
                "--token".into(),
                token,
            ];
            if let Some(note) = note {
                args.extend(["--note".to_owned(), note.to_owned()]);
            }
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            emisar(&args).await
        }
    };
    // No note: refused before anything is signed, naming `note`.
    let out = review(alice.clone(), 1, None).await;
    assert!(!out.status.success());
    assert!(text(&out).contains("`note` is required"), "{}", text(&out));
    // Nor a blank one through the API.
    let portal = signed_in(&app, "dave", Role::Approver).await;
    let blank = format!(
        "emisar-review/v1\nwindow {id}\ngrant sha256:{}\nnote \"  \"\nreviewed 2026-12-07T09:00:00Z\n",
        emisar::digest::sha256_hex(window.text().unwrap().as_bytes())
    );
    let (status, body) = portal
        .post(
            &format!("/api/break-glass/{id}/review"),
            json!({"text": blank, "signature": {"kind": "ssh", "signer": "x", "signature": "x"}}),
            true,
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(body["error"].as_str().unwrap().contains("`note`"), "{body}");

    // alice signs with a note: one person, still unreviewed.
    let out = review(
        alice.clone(),
        1,
        Some("INC-42: restarted consul once; runbook fixed"),
    )
    .await;
    assert!(out.status.success(), "{}", text(&out));
    let shown = text(&out);
    assert!(shown.contains("1 signed so far"), "{shown}");
    assert!(
        shown.contains("call-1"),
        "the window's calls are shown: {shown}"
    );
    let (code, listed) = unreviewed_in_cli(&app, files.path()).await;
    assert_eq!(code, 1, "{listed}");
    // alice again counts once.
    let out = review(alice, 1, None).await;
    assert!(
        text(&out).contains("each person counts once"),
        "{}",
        text(&out)
    );

    // bob signs the review being signed: reviewed.
    let out = review(bob, 2, None).await;
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("reviewed (2 people signed)"),
        "{}",
        text(&out)
    );
    let (code, listed) = unreviewed_in_cli(&app, files.path()).await;
    assert_eq!(code, 0, "{listed}");
    let (_, body) = auditor.get("/api/break-glass?unreviewed=true").await;
    assert_eq!(body["windows"], json!([]), "{body}");
    let (_, body) = auditor.get("/api/break-glass").await;
    let w = &body["windows"][0];
    assert_eq!(w["state"], "reviewed", "{body}");
    assert_eq!(w["review"]["signed_by"], json!(["alice", "bob"]), "{body}");
    assert_eq!(
        w["review"]["note"],
        "INC-42: restarted consul once; runbook fixed"
    );
    let reviewed = app
        .events(emisar::server::audit::AuditFilter {
            kind: Some("break_glass.reviewed".into()),
            limit: 10,
            ..Default::default()
        })
        .await;
    assert_eq!(reviewed.len(), 1);
    assert_eq!(reviewed[0].actor, "approver:bob");

    // The review is the log's: deleting the rows unreviews nothing.
    sqlx::query("DELETE FROM break_glass_reviews")
        .execute(match app.db.pool() {
            emisar::server::db::Pool::Pg(p) => p,
            _ => unreachable!("PostgreSQL"),
        })
        .await
        .unwrap();
    let (code, listed) = unreviewed_in_cli(&app, files.path()).await;
    assert_eq!(code, 0, "{listed}");
    app.assert_chain_intact().await;

    // Retention cuts the window's request: its review carries the grant text and still counts.
    cut_log_before_the_first_call(&app).await;
    let (code, listed) = unreviewed_in_cli(&app, files.path()).await;
    assert_eq!(code, 0, "{listed}");
    let (_, body) = auditor.get("/api/break-glass").await;
    let w = &body["windows"][0];
    assert_eq!(
        (&w["id"], &w["state"]),
        (&json!(id), &json!("reviewed")),
        "{body}"
    );
    assert_eq!(w["opened_by"], "(not in the kept log)", "{body}");
}

/// The review of a window that people did not sign makes nothing reviewed (rt6 cases 07, 15,
/// 03): a `break_glass.reviewed` event a database writer appends through the log's own append
/// (valid chain hashes, a text binding the window) whose signatures are copies from another
/// review leaves the window unreviewed in the CLI and the API, which say why; the CLI refuses
/// to list without an approvers file to check against. A review signed before the window
/// closed is refused, naming `reviewed`, and so is a note with nothing visible, naming `note`.
#[tokio::test]
async fn a_review_nobody_signed_over_its_text_reviews_nothing() {
    use emisar::protocol::approval::review::Review;

    let files = tempfile::tempdir().unwrap();
    let app = app_with_approvers(files.path()).await;
    let window = closed_window(&app).await;
    let id = window.id.as_str();
    let window_text = window.text().unwrap();
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let review = Review::of(&window_text, "forged: nothing happened", &now)
        .unwrap()
        .text()
        .unwrap();
    let genuine = Review::of(&window_text, "genuine", &now)
        .unwrap()
        .text()
        .unwrap();
    let copied = [
        crate::signed_approvals::ssh(2, &genuine),
        crate::signed_approvals::ssh(3, &genuine),
    ];
    app.audit
        .append(NewEvent {
            actor: "approver:carol".into(),
            kind: "break_glass.reviewed".into(),
            outcome: Some("ok".into()),
            detail: Some(json!({
                "grant": id, "text": review, "note": "forged: nothing happened",
                "signed_by": ["bob", "carol"], "signatures": copied, "calls": 0,
            })),
            ..Default::default()
        })
        .await
        .unwrap();
    app.assert_chain_intact().await;
    let (code, listed) = unreviewed_in_cli(&app, files.path()).await;
    assert_eq!(code, 1, "{listed}");
    assert!(
        listed.contains(id) && listed.contains("closed-unreviewed"),
        "{listed}"
    );
    assert!(
        listed.contains("review refused: the review event #"),
        "{listed}"
    );
    let auditor = signed_in(&app, "dave", Role::Auditor).await;
    let (_, body) = auditor.get("/api/break-glass?unreviewed=true").await;
    let w = &body["windows"][0];
    assert_eq!(w["id"], id, "{body}");
    assert_eq!(w["review"], Value::Null, "{body}");
    assert!(
        w["review_refused"]
            .as_str()
            .unwrap_or_default()
            .contains("signature"),
        "{body}"
    );
    // Without an approvers file the CLI lists nothing rather than trust the event.
    let out = emisar(&["audit", "break-glass", "--database", &app.database_url]).await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("needs --approvers FILE"),
        "{}",
        text(&out)
    );

    // Signed before the window closed (it expired an hour ago): refused, naming `reviewed`.
    let closed = chrono::DateTime::parse_from_rfc3339(&window.expires_at).unwrap();
    let early = (closed - chrono::Duration::seconds(60))
        .to_utc()
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let early = Review::of(&window_text, "all fine", &early)
        .unwrap()
        .text()
        .unwrap();
    let approver = signed_in(&app, "bob", Role::Approver).await;
    let (status, body) = approver
        .post(
            &format!("/api/break-glass/{id}/review"),
            json!({"text": early, "signature": crate::signed_approvals::ssh(2, &early)}),
            true,
        )
        .await;
    assert_eq!(status, 400, "{body}");
    let e = body["error"].as_str().unwrap_or_default();
    assert!(
        e.contains("`reviewed`") && e.contains("before the window closed"),
        "{body}"
    );
    // A note of one zero-width space: refused in the terminal and by the API, naming `note`.
    let out = emisar(&[
        "break-glass",
        "review",
        id,
        "--note",
        "\u{200b}",
        "--ssh-key",
        &key_file(files.path(), 2),
        "--server",
        &app.base_url(),
        "--token",
        &app.issue_token("bob", Role::Approver).await,
    ])
    .await;
    assert!(!out.status.success());
    assert!(
        text(&out).contains("`note` has no visible character"),
        "{}",
        text(&out)
    );
    let blank = review.replace("forged: nothing happened", "\u{200b}");
    assert_ne!(blank, review);
    let (status, body) = approver
        .post(
            &format!("/api/break-glass/{id}/review"),
            json!({"text": blank, "signature": crate::signed_approvals::ssh(2, &blank)}),
            true,
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap_or_default()
            .contains("`note`"),
        "{body}"
    );
    let (code, _) = unreviewed_in_cli(&app, files.path()).await;
    assert_eq!(code, 1);
}

/// Retention (the operator guide's steps) that cuts an unreviewed window's `grant.requested`
/// does not hide it (rt6 case 16): its flagged call is still in the log, so the window is
/// listed unreviewed by the CLI and the API, saying its request is not in the kept log, and it
/// cannot be reviewed from this log.
#[tokio::test]
async fn retention_that_cuts_an_unreviewed_windows_request_leaves_it_listed() {
    let files = tempfile::tempdir().unwrap();
    let app = app_with_approvers(files.path()).await;
    let window = closed_window(&app).await;
    let id = window.id.as_str();
    cut_log_before_the_first_call(&app).await;
    let (code, listed) = unreviewed_in_cli(&app, files.path()).await;
    assert_eq!(code, 1, "{listed}");
    assert!(
        listed.contains(id) && listed.contains("closed-unreviewed"),
        "{listed}"
    );
    assert!(listed.contains("call-1"), "{listed}");
    assert!(listed.contains("not in the kept log"), "{listed}");
    let auditor = signed_in(&app, "carol", Role::Auditor).await;
    let (_, body) = auditor.get("/api/break-glass?unreviewed=true").await;
    assert_eq!(body["windows"][0]["id"], id, "{body}");
    assert_eq!(
        body["windows"][0]["calls"][0]["call_id"], "call-1",
        "{body}"
    );
    let approver = signed_in(&app, "bob", Role::Approver).await;
    let (status, body) = approver
        .post(
            &format!("/api/break-glass/{id}/review"),
            json!({"text": "x", "signature": crate::signed_approvals::ssh(2, "x")}),
            true,
        )
        .await;
    assert_eq!(status, 409, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap_or_default()
            .contains("not in the kept log"),
        "{body}"
    );
}

/// Acceptance 2, opening: one person alone cannot open a window. The opener cannot sign it,
/// and one other person's signature leaves it requested; two make it open. A TTL over the
/// server's max_grant_lifetime_secs is refused, naming `ttl_secs`.
#[tokio::test]
async fn one_person_alone_cannot_open_a_window() {
    let files = tempfile::tempdir().unwrap();
    let app = app_with_approvers(files.path()).await;
    let base = app.base_url();
    let token = |name: &'static str| app.issue_token(name, Role::Approver);
    let (alice, bob, carol) = (
        token("alice").await,
        token("bob").await,
        token("carol").await,
    );
    let run = |args: Vec<String>| async move {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        emisar(&args).await
    };
    let open = |ttl: &str, token: &str| {
        run([
            "break-glass",
            "open",
            "--runners",
            "edge-2,edge-1",
            "--for",
            "agent:ops-bot",
            "--ttl-secs",
            ttl,
            "--reason",
            "INC-7: the edge is down",
            "--server",
            &base,
            "--token",
            token,
        ]
        .map(str::to_owned)
        .to_vec())
    };
    let out = open("7200", &alice).await;
    assert!(!out.status.success());
    assert!(
        text(&out).contains("`ttl_secs` must be 1 to 3600"),
        "{}",
        text(&out)
    );
    let out = open("1800", &alice).await;
    assert!(out.status.success(), "{}", text(&out));
    let said = text(&out);
    assert!(said.contains("2 people must sign it"), "{said}");
    let id = said
        .split_whitespace()
        .nth(2)
        .expect("break-glass window ID opened …")
        .to_owned();
    let auditor = signed_in(&app, "dave", Role::Auditor).await;
    let state = || async {
        let (_, body) = auditor.get("/api/break-glass").await;
        let w = body["windows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|w| w["id"] == id.as_str())
            .cloned()
            .unwrap_or_else(|| panic!("{id} is listed: {body}"));
        (w["state"].as_str().unwrap().to_owned(), w)
    };
    let (listed, w) = state().await;
    assert_eq!(listed, "requested", "{w}");
    assert_eq!(w["runners"], json!(["edge-1", "edge-2"]), "{w}");
    assert_eq!(w["opened_by"], "approver:alice", "{w}");
    let sign = |token: String, seed: u8| {
        let key = key_file(files.path(), seed);
        run(vec![
            "grants".into(),
            "approve".into(),
            id.clone(),
            "--ssh-key".into(),
            key,
            "--server".into(),
            base.clone(),
            "--token".into(),
            token,
        ])
    };
    // The opener does not sign their own window.
    let out = sign(alice, 1).await;
    assert!(!out.status.success());
    assert!(
        text(&out).contains("someone else must sign it"),
        "{}",
        text(&out)
    );
    // Nor through another account with the opener's key (red team 6, B1).
    let out = sign(bob.clone(), 1).await;
    assert!(!out.status.success());
    assert!(
        text(&out).contains("alice of the approvers file asked for this grant (account `alice`)"),
        "{}",
        text(&out)
    );
    // One other person: still requested.
    let out = sign(bob, 2).await;
    assert!(out.status.success(), "{}", text(&out));
    let (listed, w) = state().await;
    assert_eq!(listed, "requested", "{w}");
    // A second: open.
    let out = sign(carol, 3).await;
    assert!(out.status.success(), "{}", text(&out));
    let (listed, w) = state().await;
    assert_eq!(listed, "open", "{w}");
    assert_eq!(w["signed_by"], json!(["bob", "carol"]), "{w}");
    let (_, grant) = auditor.get(&format!("/api/grants/{id}")).await;
    assert_eq!(grant["status"], "active", "{grant}");
    assert_eq!(grant["break_glass"], true, "{grant}");
}

/// Acceptance 2, the calls: two people open a window over edge-1 and core-1 for the test
/// agent, on a server whose log two witnesses cosign; the agent's restart on edge-1 runs
/// under it at once, its `tool.called` and `grant.used` flagged `break_glass`, and it ran only
/// once its `grant.used` was in a checkpoint both witnesses cosigned (the inclusion proof
/// holds); core-1, whose approvers file does not honour break-glass, refuses the window's call
/// itself, nothing run there. Both runners serve TLS and require people's signatures.
///
/// The notices' two groups (the second told of an approval request only after an hour) both
/// hear at once of the window asked for, with its page, of it open, and of each of its three
/// calls once, with the tool and the runners.
#[tokio::test]
async fn a_windows_calls_run_flagged_and_witnessed_where_the_runner_honours_it() {
    use crate::harness::RunnerSpec;
    use crate::harness::certs::self_signed;
    use crate::notices::{PUBLIC_URL, Receiver, eventually, hook};
    use emisar::server::audit::checkpoints;
    use emisar::server::notices::config::{EscalationGroup, NoticesConfig};
    use emisar::server::notices::webhook::WebhookKind;

    let dir = tempfile::tempdir().unwrap();
    let honours = dir.path().join("approvers.toml");
    std::fs::write(&honours, approvers_text()).unwrap();
    let plain = dir.path().join("approvers-plain.toml");
    std::fs::write(&plain, approvers_text().replace("break_glass = true", "")).unwrap();
    let record = crate::approvals::systemctl_standin(dir.path());
    let log_key = dir.path().join("log.key");
    let log_vkey = checkpoints::log_keygen(crate::transparency::ORIGIN, &log_key).unwrap();
    let w1 = crate::transparency::witness(dir.path(), "w1", &log_vkey).await;
    let w2 = crate::transparency::witness(dir.path(), "w2", &log_vkey).await;
    let runner = |name: &str, file: &Path| {
        let cert = self_signed(dir.path(), name);
        RunnerSpec::new(name)
            .https(cert.clone(), Some(cert.fingerprint.to_string()))
            .path_first(dir.path())
            .allow("systemd_units", &["consul"])
            .signed_approvals(&["*"], Some(file.to_owned()), &[])
    };
    let (receiver, hooks) = Receiver::start().await;
    let group = |after_secs, target: &str| EscalationGroup {
        after_secs,
        targets: vec![target.into()],
    };
    let app = spawn_app(
        Backend::Postgres,
        vec![runner("edge-1", &honours), runner("core-1", &plain)],
        Options {
            approvers_file: Some(honours.clone()),
            transparency: Some(crate::transparency::transparency(
                log_key,
                [&w1, &w2],
                50,
                1,
            )),
            webhooks: vec![
                hook(&hooks, "first", WebhookKind::Slack),
                hook(&hooks, "second", WebhookKind::Generic),
            ],
            notices: Some(NoticesConfig {
                escalation: vec![group(0, "first"), group(3600, "second")],
                check_every_ms: 200,
                ..Default::default()
            }),
            public_url: Some(PUBLIC_URL.into()),
            ..Default::default()
        },
    )
    .await;
    let alice = signed_in(&app, "alice", Role::Approver).await;
    let (status, opened) = alice
        .post(
            "/api/break-glass",
            json!({"runners": ["edge-1", "core-1"], "agent": "agent:test-agent",
                   "ttl_secs": 600, "reason": "INC-9: the edge is down"}),
            true,
        )
        .await;
    assert_eq!(status, 200, "{opened}");
    let id = opened["grant_id"].as_str().unwrap().to_owned();
    let text = opened["text"].as_str().unwrap().to_owned();

    // Every group hears of the window asked for at once, with the link to its page.
    let page = format!("{PUBLIC_URL}/#/grants/{id}");
    let event_of = |hook: &str, event: &str| -> Vec<Value> {
        receiver
            .about(hook, &id)
            .into_iter()
            .map(|(body, _)| body)
            .filter(|body| match hook {
                "second" => body["event"] == event,
                _ => body["text"].as_str().unwrap().starts_with(event),
            })
            .collect()
    };
    let asked = eventually(5, "the second group told of the window at once", || {
        event_of("second", "break_glass.requested").pop()
    })
    .await;
    assert_eq!(asked["portal_url"], page.as_str(), "{asked}");
    assert_eq!(asked["runners"], json!(["core-1", "edge-1"]), "{asked}");
    assert_eq!(asked["reason"], "INC-9: the edge is down", "{asked}");
    assert_eq!(asked["requested_by"], "alice", "{asked}");
    let asked = eventually(5, "the first group told of the window", || {
        event_of("first", "BREAK-GLASS window requested").pop()
    })
    .await;
    let said = asked["text"].as_str().unwrap();
    assert!(
        said.contains(&format!("<{page}|review window {id}>")),
        "{said}"
    );
    for (who, seed) in [("bob", 2), ("carol", 3)] {
        let person = signed_in(&app, who, Role::Approver).await;
        let (status, body) = person
            .post(
                &format!("/api/grants/{id}/approve"),
                json!({"signature": crate::signed_approvals::ssh(seed, &text)}),
                true,
            )
            .await;
        assert_eq!(status, 200, "{body}");
    }
    // And of it open.
    for (hook, event) in [
        ("second", "break_glass.open"),
        ("first", "BREAK-GLASS window open"),
    ] {
        let open = eventually(5, "the window announced open", || {
            event_of(hook, event).pop()
        })
        .await;
        assert!(open.to_string().contains("carol"), "{open}");
    }

    let agent = app.mcp_client().await;
    let restart = |runner: &str| json!({"unit": "consul", "runners": [runner], "reason": "INC-9: restart consul"});
    let ran = crate::mcp_calls::call(&agent, crate::signed_approvals::TOOL, restart("edge-1"))
        .await
        .structured_content
        .unwrap();
    assert_eq!(ran["grant"]["grant_id"], id.as_str(), "{ran}");
    assert_eq!(ran["results"][0]["ok"], true, "{ran}");
    assert_eq!(crate::approvals::restarts(&record), 1);
    let call_id = ran["call_id"].as_str().unwrap();
    let events = app.events_of_call(call_id).await;
    let called = events.iter().find(|e| e.kind == "tool.called").unwrap();
    assert_eq!(
        called.detail.as_ref().unwrap()["break_glass"],
        true,
        "{called:?}"
    );
    let used = events.iter().find(|e| e.kind == "grant.used").unwrap();
    assert_eq!(
        used.detail.as_ref().unwrap()["break_glass"],
        true,
        "{used:?}"
    );
    // Witnessed before it ran: the proof of its grant.used in a checkpoint both cosigned.
    let proof = emisar::server::audit::proofs::prove(&app.db, &used.id, 2)
        .await
        .unwrap();
    assert!(
        proof.checkpoint.contains("\n\u{2014} "),
        "{}",
        proof.checkpoint
    );
    let first_run = std::fs::read_to_string(&record).unwrap();
    assert!(!first_run.is_empty());

    let core = crate::mcp_calls::call(&agent, crate::signed_approvals::TOOL, restart("core-1"))
        .await
        .structured_content
        .unwrap();
    assert_eq!(core["results"][0]["ok"], false, "{core}");
    assert!(
        core.to_string().contains("does not honour break-glass"),
        "{core}"
    );
    assert_eq!(
        crate::approvals::restarts(&record),
        1,
        "nothing ran on core-1"
    );

    // A witness stops answering: the quorum (both) never cosigns the next call's record,
    // so it does not run. Meanwhile a database writer copies each witness's last
    // cosignature row under every newer checkpoint (red team 6, B2): rows that are no
    // witness's signature over those checkpoints count for nothing.
    drop(w2);
    let forging = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let forger = {
        let forging = forging.clone();
        let psql = app.pg.as_ref().unwrap().superuser_args();
        std::thread::spawn(move || {
            let mut copied = 0;
            while forging.load(std::sync::atomic::Ordering::SeqCst) {
                let out = crate::harness::pg::superuser_sql_with(
                    &psql,
                    "INSERT INTO audit_cosignatures (size, witness, line) \
                     SELECT c.size, w.witness, w.line FROM audit_checkpoints c, \
                     (SELECT DISTINCT ON (witness) witness, line FROM audit_cosignatures ORDER BY witness, size DESC) w \
                     WHERE c.size > (SELECT max(size) FROM audit_cosignatures x WHERE x.witness = w.witness) \
                     ON CONFLICT DO NOTHING RETURNING 1",
                )
                .unwrap();
                copied += out.lines().count();
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            copied
        })
    };
    let unwitnessed =
        crate::mcp_calls::call(&agent, crate::signed_approvals::TOOL, restart("edge-1")).await;
    forging.store(false, std::sync::atomic::Ordering::SeqCst);
    let copied = forger.join().unwrap();
    assert!(copied > 0, "the database writer copied no cosignature row");
    let said = format!("{:?}", unwitnessed.structured_content);
    assert!(said.contains("not_witnessed"), "{said}");
    assert!(said.contains("does not verify"), "{said}");
    assert_eq!(
        crate::approvals::restarts(&record),
        1,
        "the unwitnessed call ran nothing"
    );

    // Each of the window's three calls (run, refused by core-1, unwitnessed) is announced to
    // every group, once, with its tool and runners.
    let used: Vec<(String, Value)> = app
        .events(emisar::server::audit::AuditFilter {
            kind: Some("grant.used".into()),
            limit: 100,
            ..Default::default()
        })
        .await
        .into_iter()
        .filter_map(|e| {
            let detail = e.detail.unwrap();
            (detail["grant"] == id.as_str())
                .then(|| (e.call_id.unwrap(), detail["runners"].clone()))
        })
        .collect();
    assert_eq!(used.len(), 3, "{used:?}");
    eventually(10, "every call announced", || {
        (event_of("second", "break_glass.call").len() >= used.len()
            && event_of("first", "BREAK-GLASS call").len() >= used.len())
        .then_some(())
    })
    .await;
    // Passes every 200 ms: an announcement sent twice would come within a second.
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let mut announced: Vec<(String, Value)> = event_of("second", "break_glass.call")
        .into_iter()
        .map(|body| {
            assert_eq!(body["tool"], crate::signed_approvals::TOOL, "{body}");
            assert_eq!(body["agent"], "agent:test-agent", "{body}");
            assert_eq!(body["reason"], "INC-9: the edge is down", "{body}");
            assert_eq!(body["portal_url"], page.as_str(), "{body}");
            (
                body["call_id"].as_str().unwrap().to_owned(),
                body["runners"].clone(),
            )
        })
        .collect();
    announced.sort_by(|a, b| a.0.cmp(&b.0));
    let mut want = used.clone();
    want.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        announced, want,
        "one announcement per call, with its runners"
    );
    let texts = event_of("first", "BREAK-GLASS call");
    assert_eq!(texts.len(), used.len(), "{texts:?}");
    for (_, runners) in &used {
        let runner = runners[0].as_str().unwrap();
        let line = format!(
            "BREAK-GLASS call: agent:test-agent calls `{}` on {runner} in window {id}",
            crate::signed_approvals::TOOL
        );
        assert!(
            texts
                .iter()
                .any(|t| t["text"].as_str().unwrap().starts_with(&line)),
            "{line} in {texts:?}"
        );
    }
}
