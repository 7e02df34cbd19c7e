//! Notices that reach people (`[notices]`): a local receiver gets the Slack-compatible
//! payload with the link to the page where people sign; the next group hears only after its
//! configured delay, and never when the request was decided first; reminders repeat and stop
//! at the decision; two replicas on one PostgreSQL send each step once, and a restarted
//! server resumes the schedule from the store; a request that expires unanswered tells the
//! agent and the people; an email reaches a real local SMTP server (aiosmtpd).
//!
//! And a grant an agent asks for reaches the first group at once with the link to the grant's
//! page, and a restarted server sends it to nobody again; a break-glass window's life in the
//! store (asked for, open, two calls) is told to every group at once, each step once, on both
//! backends. (A window opened and used through the server, its calls witnessed, is announced
//! in `break_glass.rs`.)

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use emisar::server::notices::config::{EscalationGroup, NoticesConfig};
use emisar::server::notices::email::{EmailConfig, SmtpTls};
use emisar::server::notices::webhook::{WebhookConfig, WebhookKind};
use emisar::server::principal::Role;
use serde_json::{Value, json};

use crate::approvals::{restart_app, restart_args, signed_in, systemctl_standin};
use crate::both_backends;
use crate::harness::Backend;
use crate::harness::app::{Options, TestApp};
use crate::harness::tools::{Proc, listens_on, require};
use crate::mcp_calls::call;

pub(crate) const PUBLIC_URL: &str = "https://emisar.example.test";

/// A hook receiver: every body it was posted, with the hook's path and when it came.
#[derive(Clone, Default)]
pub(crate) struct Receiver {
    got: Arc<Mutex<Vec<(String, Value, Instant)>>>,
}

impl Receiver {
    pub(crate) async fn start() -> (Receiver, String) {
        let receiver = Receiver::default();
        let kept = receiver.clone();
        let app = axum::Router::new().route(
            "/{hook}",
            axum::routing::post(
                move |axum::extract::Path(hook): axum::extract::Path<String>,
                      axum::Json(body): axum::Json<Value>| {
                    let kept = kept.clone();
                    async move {
                        kept.got.lock().unwrap().push((hook, body, Instant::now()));
                        "ok"
                    }
                },
            ),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (receiver, base)
    }

    /// The bodies `hook` got about request (or grant) `id`, with when each came.
    pub(crate) fn about(&self, hook: &str, id: &str) -> Vec<(Value, Instant)> {
        self.got
            .lock()
            .unwrap()
            .iter()
            .filter(|(h, body, _)| h == hook && mentions(body, id))
            .map(|(_, body, at)| (body.clone(), *at))
            .collect()
    }
}

/// Whether a body (generic or Slack) is about request (or grant) `id`.
fn mentions(body: &Value, id: &str) -> bool {
    body["approval_id"] == id
        || body["grant_id"] == id
        || body["text"].as_str().is_some_and(|t| t.contains(id))
}

/// The generic event, or the Slack text's first words, of each body.
pub(crate) fn kinds(bodies: &[(Value, Instant)]) -> Vec<String> {
    bodies
        .iter()
        .map(|(b, _)| match b["event"].as_str() {
            Some(event) => event.to_owned(),
            None => b["text"]
                .as_str()
                .unwrap()
                .split(':')
                .next()
                .unwrap()
                .to_owned(),
        })
        .collect()
}

pub(crate) fn hook(base: &str, name: &str, kind: WebhookKind) -> WebhookConfig {
    WebhookConfig {
        name: Some(name.into()),
        url: format!("{base}/{name}"),
        kind,
    }
}

/// Two groups: `first` (Slack) at once, `second` (generic) after `second_after` seconds;
/// reminders every `reminder` seconds; the store looked at every 200 ms.
fn escalating(base: &str, second_after: u64, reminder: Option<u64>) -> Options {
    Options {
        webhooks: vec![
            hook(base, "first", WebhookKind::Slack),
            hook(base, "second", WebhookKind::Generic),
        ],
        notices: Some(NoticesConfig {
            escalation: vec![
                EscalationGroup {
                    after_secs: 0,
                    targets: vec!["first".into()],
                },
                EscalationGroup {
                    after_secs: second_after,
                    targets: vec!["second".into()],
                },
            ],
            reminder_every_secs: reminder,
            check_every_ms: 200,
            ..Default::default()
        }),
        public_url: Some(PUBLIC_URL.into()),
        // The call returns the request id at once instead of waiting for a decision.
        approval_wait_secs: Some(0),
        ..Default::default()
    }
}

/// Asks for a restart through `app`; the pending request's id and when it was made.
async fn request(app: &TestApp, reason: &str) -> (String, Instant) {
    let client = app.mcp_client().await;
    let asked = Instant::now();
    let res = call(&client, "linux.systemctl_restart", restart_args(reason)).await;
    let out = res.structured_content.expect("a structured answer");
    assert_eq!(out["approval"]["state"], "pending", "{out}");
    client.cancel().await.unwrap();
    (
        out["approval"]["approval_id"].as_str().unwrap().to_owned(),
        asked,
    )
}

pub(crate) async fn eventually<T, F: FnMut() -> Option<T>>(
    secs: u64,
    what: &str,
    mut check: F,
) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(Instant::now() < deadline, "{what} within {secs} s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The first group hears at once, with the signing link in the Slack text and nothing that
/// decides; the second only after its delay, and never about a request denied before it;
/// reminders repeat to the groups told so far and stop at the decision.
async fn escalation_waits_its_delay_and_stops_at_the_decision(backend: Backend) {
    let bin = tempfile::tempdir().unwrap();
    systemctl_standin(bin.path());
    let (receiver, base) = Receiver::start().await;
    let app = restart_app(backend, bin.path(), escalating(&base, 3, Some(2))).await;
    let approver = signed_in(&app, "alice", Role::Approver).await;

    let (denied, _) = request(&app, "decided at once").await;
    let (waiting, asked) = request(&app, "nobody answers for a while").await;
    let (status, _) = approver.deny(&denied, "not now").await;
    assert_eq!(status, 200);

    // The first group: the Slack-compatible payload with the link to the signing page.
    let (first, _) = eventually(5, "the first group told", || {
        receiver.about("first", &waiting).into_iter().next()
    })
    .await;
    let text = first["text"].as_str().unwrap();
    let page = format!("{PUBLIC_URL}/#/approvals/{waiting}");
    assert!(
        text.starts_with(
            "Approval requested: `linux.systemctl_restart` on hvn05 by agent:test-agent"
        ) && text.contains(&format!("<{page}|review {waiting}>")),
        "{text}"
    );
    for deciding in ["approve", "deny"] {
        assert!(
            !text.to_lowercase().contains(&format!("/{deciding}")),
            "{text}"
        );
    }

    // Not before its delay.
    tokio::time::sleep_until((asked + Duration::from_millis(2_500)).into()).await;
    assert!(
        receiver.about("second", &waiting).is_empty(),
        "the second group was told early"
    );
    let (second, at) = eventually(5, "the second group told", || {
        receiver.about("second", &waiting).into_iter().next()
    })
    .await;
    assert!(
        at >= asked + Duration::from_secs(3),
        "told after {:?}",
        at - asked
    );
    assert_eq!(second["event"], "approval.requested", "{second}");
    assert_eq!(second["portal_url"], page.as_str(), "{second}");

    // A reminder after 4 s goes to both groups told so far.
    eventually(5, "the second reminder", || {
        (receiver.about("second", &waiting).len() >= 2).then_some(())
    })
    .await;
    let (status, _) = approver.deny(&waiting, "done by hand").await;
    assert_eq!(status, 200);
    // A delivery already under way when the decision came may still land.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let decided = (
        receiver.about("first", &waiting).len(),
        receiver.about("second", &waiting).len(),
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let second_kinds = kinds(&receiver.about("second", &waiting));
    assert_eq!(
        second_kinds[..2],
        ["approval.requested", "approval.reminder"]
    );
    let first_kinds = kinds(&receiver.about("first", &waiting));
    assert_eq!(first_kinds[0], "Approval requested");
    assert!(
        first_kinds[1..]
            .iter()
            .all(|k| k == "Reminder, approval still waiting"),
        "{first_kinds:?}"
    );
    assert_eq!(
        (
            receiver.about("first", &waiting).len(),
            receiver.about("second", &waiting).len()
        ),
        decided,
        "notices after the decision"
    );
    // The request denied at once: the first group heard of it (or not, if the denial came
    // first), the second never.
    assert!(
        receiver.about("second", &denied).is_empty(),
        "escalated after the decision"
    );
    assert!(receiver.about("first", &denied).len() <= 1);
}
both_backends!(escalation_waits_its_delay_and_stops_at_the_decision);

/// Two replicas of one server on one PostgreSQL, each with its runner.
async fn two_replicas(bin: &Path, options: impl Fn() -> Options) -> (TestApp, TestApp) {
    let a = restart_app(Backend::Postgres, bin, options()).await;
    let b = restart_app(
        Backend::Postgres,
        bin,
        Options {
            database_url: Some(a.database_url.clone()),
            keys: Some((a.private_key.clone(), a.public_key.clone())),
            ..options()
        },
    )
    .await;
    (a, b)
}

/// Two replicas on one PostgreSQL, both looking every 200 ms at the same requests: each
/// step of each request is sent once (the store's claim decides who sends it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_send_each_step_once() {
    const REQUESTS: usize = 12;
    let bin = tempfile::tempdir().unwrap();
    systemctl_standin(bin.path());
    let (receiver, base) = Receiver::start().await;
    let (a, b) = two_replicas(bin.path(), || escalating(&base, 2, None)).await;
    let mut ids = Vec::new();
    for i in 0..REQUESTS {
        let through = if i % 2 == 0 { &a } else { &b };
        ids.push(request(through, &format!("request {i}")).await.0);
    }
    eventually(15, "every request escalated", || {
        ids.iter()
            .all(|id| !receiver.about("second", id).is_empty())
            .then_some(())
    })
    .await;
    // Both replicas look every 200 ms: a second send would come within a second.
    tokio::time::sleep(Duration::from_secs(1)).await;
    for id in &ids {
        let sent = (
            receiver.about("first", id).len(),
            receiver.about("second", id).len(),
        );
        assert_eq!(sent, (1, 1), "request {id}: (first, second) sent");
    }
}

/// A server stopped between two steps: another started on the same store sends the next
/// step when it is due (the schedule is in the store), and nothing already sent again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_resumes_the_schedule() {
    let bin = tempfile::tempdir().unwrap();
    systemctl_standin(bin.path());
    let (receiver, base) = Receiver::start().await;
    let mut a = restart_app(Backend::Postgres, bin.path(), escalating(&base, 4, None)).await;
    let (id, asked) = request(&a, "before the restart").await;
    eventually(5, "the first group told", || {
        (!receiver.about("first", &id).is_empty()).then_some(())
    })
    .await;
    a.stop().await;
    assert!(receiver.about("second", &id).is_empty());

    let again = Options {
        database_url: Some(a.database_url.clone()),
        keys: Some((a.private_key.clone(), a.public_key.clone())),
        ..escalating(&base, 4, None)
    };
    let _restarted = restart_app(Backend::Postgres, bin.path(), again).await;
    let (_, at) = eventually(10, "the second group told by the restarted server", || {
        receiver.about("second", &id).into_iter().next()
    })
    .await;
    assert!(
        at >= asked + Duration::from_secs(4),
        "told after {:?}",
        at - asked
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        receiver.about("first", &id).len(),
        1,
        "the first step sent again after the restart"
    );
    assert_eq!(receiver.about("second", &id).len(), 1);
}

/// A request nobody answers expires: the waiting call says it expired unanswered and how
/// long it waited, and the people told of it hear that it expired.
async fn an_unanswered_request_tells_the_agent_and_the_people(backend: Backend) {
    let bin = tempfile::tempdir().unwrap();
    systemctl_standin(bin.path());
    let (receiver, base) = Receiver::start().await;
    let options = Options {
        approval_ttl_secs: Some(10),
        approval_wait_secs: Some(30),
        ..escalating(&base, 60, None)
    };
    let app = restart_app(backend, bin.path(), options).await;
    let client = app.mcp_client().await;
    let res = call(
        &client,
        "linux.systemctl_restart",
        restart_args("nobody is awake"),
    )
    .await;
    assert_eq!(res.is_error, Some(true), "{res:?}");
    let text = format!("{:?}", res.content);
    assert!(
        text.contains("expired unanswered at")
            && text.contains("after waiting 10 s (0 of 1 approvals); nothing ran"),
        "{text}"
    );
    let id = receiver.got.lock().unwrap()[0].1["text"]
        .as_str()
        .unwrap()
        .split("|review ")
        .nth(1)
        .unwrap()
        .trim_end_matches('>')
        .to_owned();
    let (expired, _) = eventually(10, "the expiry told", || {
        receiver.about("first", &id).into_iter().nth(1)
    })
    .await;
    let text = expired["text"].as_str().unwrap();
    assert!(
        text.starts_with(
            "Approval expired unanswered after 10 s (nothing ran): `linux.systemctl_restart`"
        ) && text.contains(&format!("{PUBLIC_URL}/#/approvals/{id}")),
        "{text}"
    );
    // The second group, never told of the request, is not told of its expiry.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(receiver.about("second", &id).is_empty());
    assert_eq!(receiver.about("first", &id).len(), 2);
    client.cancel().await.unwrap();
}
both_backends!(an_unanswered_request_tells_the_agent_and_the_people);

/// A real SMTP server (aiosmtpd) on loopback, delivering into a maildir.
struct Smtp {
    _proc: Proc,
    port: u16,
    maildir: PathBuf,
}

impl Smtp {
    fn start(dir: &Path) -> Smtp {
        let python = require("venv/bin/python");
        let maildir = dir.join("maildir");
        for _ in 0..20 {
            // The range this suite's fixed ports come from.
            let port = 16_000 + (rand_u16() % 500);
            let child = std::process::Command::new(&python)
                .args(["-m", "aiosmtpd", "-n", "-l"])
                .arg(format!("127.0.0.1:{port}"))
                .args(["-c", "aiosmtpd.handlers.Mailbox"])
                .arg(&maildir)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("aiosmtpd starts (run scripts/install-test-deps)");
            let mut proc = Proc(child);
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if listens_on(proc.0.id(), port) {
                    return Smtp {
                        _proc: proc,
                        port,
                        maildir,
                    };
                }
                if proc.0.try_wait().unwrap().is_some() {
                    break; // the port was taken: another one
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = proc.0.kill();
        }
        panic!(
            "aiosmtpd did not listen on any port of 16000-16499 (is it installed? run scripts/install-test-deps)"
        );
    }

    /// The messages delivered so far, each read by Python's `email` parser: the headers
    /// (unfolded, decoded), a blank line, the body (transfer encoding undone).
    fn delivered(&self) -> Vec<String> {
        let files: Vec<PathBuf> = std::fs::read_dir(self.maildir.join("new"))
            .map(|entries| entries.filter_map(Result::ok).map(|e| e.path()).collect())
            .unwrap_or_default();
        files.iter().map(|f| parse_mail(f)).collect()
    }
}

const PARSE_MAIL: &str = r#"
import sys, email, email.policy
with open(sys.argv[1], "rb") as f:
    m = email.message_from_binary_file(f, policy=email.policy.default)
for key in ("From", "To", "Subject", "Content-Type"):
    print(f"{key}: {m[key]}")
print()
print(m.get_content())
"#;

fn parse_mail(file: &Path) -> String {
    let out = std::process::Command::new(require("venv/bin/python"))
        .args(["-c", PARSE_MAIL])
        .arg(file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn rand_u16() -> u16 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(Instant::now()) as u16
}

/// An email notice reaches a real SMTP server: sender, recipients, subject and the link.
async fn an_email_reaches_a_real_smtp_server(backend: Backend) {
    let python = require("venv/bin/python");
    let check = std::process::Command::new(&python)
        .args(["-c", "import aiosmtpd"])
        .status()
        .unwrap();
    assert!(
        check.success(),
        "aiosmtpd is missing from {}: run scripts/install-test-deps",
        python.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let smtp = Smtp::start(dir.path());
    let bin = tempfile::tempdir().unwrap();
    systemctl_standin(bin.path());
    let options = Options {
        notices: Some(NoticesConfig {
            email: vec![EmailConfig {
                name: Some("oncall-mail".into()),
                host: "127.0.0.1".into(),
                port: Some(smtp.port),
                tls: SmtpTls::None,
                from: "emisar <emisar@example.test>".into(),
                to: vec!["oncall@example.test".into(), "lead@example.test".into()],
                user: None,
                password_file: None,
                password_env: None,
            }],
            check_every_ms: 200,
            ..Default::default()
        }),
        public_url: Some(PUBLIC_URL.into()),
        approval_wait_secs: Some(0),
        ..Default::default()
    };
    let app = restart_app(backend, bin.path(), options).await;
    let (id, _) = request(&app, "consul is wedged").await;
    let mail = eventually(15, "the email delivered", || {
        smtp.delivered().into_iter().next()
    })
    .await;
    for want in [
        "From: emisar <emisar@example.test>".to_owned(),
        "To: oncall@example.test, lead@example.test".to_owned(),
        format!("Subject: [emisar] Approval requested: linux.systemctl_restart ({id})"),
        format!("Review and sign it here: {PUBLIC_URL}/#/approvals/{id}"),
        "Reason:    consul is wedged".to_owned(),
        "Content-Type: text/plain; charset=\"utf-8\"".to_owned(),
    ] {
        assert!(mail.contains(&want), "{want:?} not in:\n{mail}");
    }
    assert_eq!(json!(smtp.delivered().len()), json!(1));
}
both_backends!(an_email_reaches_a_real_smtp_server);

/// An agent asks for a grant: the first group hears at once, its Slack text naming the agent,
/// the tool and the runner with the link to the grant's page; the second group not before its
/// delay, and then from a server restarted on the same store, which sends the first group's
/// notice to nobody again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_request_reaches_the_first_group_once() {
    use crate::signed_approvals::pub_line;
    let bin = tempfile::tempdir().unwrap();
    systemctl_standin(bin.path());
    let approvers = bin.path().join("approvers.toml");
    std::fs::write(
        &approvers,
        format!(
            "serial = 1\n[[person]]\nname = \"alice\"\nssh = [\"{}\"]\n\
             [[rule]]\ntools = \"linux.systemctl_restart\"\napprovals = 1\ngrants = true\n",
            pub_line(1)
        ),
    )
    .unwrap();
    let (receiver, base) = Receiver::start().await;
    let options = || Options {
        approvers_file: Some(approvers.clone()),
        ..escalating(&base, 4, None)
    };
    let mut a = restart_app(Backend::Postgres, bin.path(), options()).await;
    let client = a.mcp_client().await;
    let asked = Instant::now();
    let res = call(
        &client,
        "emisar.request_grant",
        json!({
            "tools": ["linux.systemctl_restart"],
            "runners": {"names": ["hvn05"]},
            "calls": 2,
            "expires_in_secs": 600,
            "reason": "INC-5: consul flaps on hvn05",
        }),
    )
    .await;
    let out = crate::harness::tools::only_output(&res);
    let id = out["grant_id"].as_str().unwrap().to_owned();
    client.cancel().await.unwrap();

    let (first, _) = eventually(5, "the first group told of the grant", || {
        receiver.about("first", &id).into_iter().next()
    })
    .await;
    let text = first["text"].as_str().unwrap();
    assert!(
        text.starts_with(
            "Grant requested: agent:test-agent asks for `linux.systemctl_restart` on hvn05 (1 must sign): \"INC-5: consul flaps on hvn05\""
        ) && text.ends_with(&format!("<{PUBLIC_URL}/#/grants/{id}|review grant {id}>")),
        "{text}"
    );
    assert!(!text.contains("BREAK-GLASS"), "{text}");
    // Past a pass or two: the second group waits its 4 s.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        receiver.about("second", &id).is_empty(),
        "the second group was told at once"
    );

    a.stop().await;
    let again = Options {
        database_url: Some(a.database_url.clone()),
        keys: Some((a.private_key.clone(), a.public_key.clone())),
        ..options()
    };
    let _restarted = restart_app(Backend::Postgres, bin.path(), again).await;
    let (second, at) = eventually(10, "the second group told by the restarted server", || {
        receiver.about("second", &id).into_iter().next()
    })
    .await;
    assert!(
        at >= asked + Duration::from_secs(4),
        "told after {:?}",
        at - asked
    );
    assert_eq!(second["event"], "grant.requested", "{second}");
    assert_eq!(
        second["portal_url"],
        format!("{PUBLIC_URL}/#/grants/{id}"),
        "{second}"
    );
    // The restarted server passes over the grant every 200 ms.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        receiver.about("first", &id).len(),
        1,
        "the grant's notice sent again after the restart"
    );
}

/// A break-glass window's life as the store holds it (its grant row, then signed open, then
/// two calls' `grant.used` flagged `break_glass`), on either backend: every group hears of it
/// asked for, open and of each call, once, with no escalation wait; the link is the grant's
/// page. (The window opened and used through the server, witnessed, is `break_glass.rs`.)
async fn a_windows_life_in_the_store_is_announced(backend: Backend) {
    use emisar::protocol::approval::grant::{Grant, Runners};
    use emisar::server::approvals::Vote;
    use emisar::server::audit::{NewEvent, format_at};
    use emisar::server::grants::{GrantRow, Grants, Status};

    let bin = tempfile::tempdir().unwrap();
    systemctl_standin(bin.path());
    let (receiver, base) = Receiver::start().await;
    let app = restart_app(backend, bin.path(), escalating(&base, 3600, None)).await;
    let now = chrono::Utc::now();
    let grant = Grant {
        id: uuid::Uuid::now_v7().to_string(),
        agent: "agent:ops-bot".into(),
        break_glass: true,
        tools: vec!["*".into()],
        runners: Runners::Names(vec!["edge-1".into(), "edge-2".into()]),
        args: Default::default(),
        max_calls: 100,
        max_calls_per_runner: 100,
        required: 2,
        reason: "INC-77: the edge is down".into(),
        expires_at: (now + chrono::Duration::minutes(30))
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
    };
    let id = grant.id.clone();
    let grants = Grants::new(app.db.clone());
    grants
        .insert(&GrantRow {
            id: id.clone(),
            agent: grant.agent.clone(),
            requester_name: "alice".into(),
            on_behalf_of: None,
            text: grant.text().unwrap(),
            status: Status::Requested,
            required: 2,
            signatures: vec![],
            break_glass: true,
            expires_at: grant.expires_at.clone(),
            requested_at: format_at(now),
            decided_at: None,
            decided_by: None,
            revoked_at: None,
            revoked_by: None,
            revoke_reason: None,
        })
        .await
        .unwrap();
    let of = |hook: &str, event: &str| -> Vec<Value> {
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
    let asked = eventually(
        5,
        "the window asked for told to the last group at once",
        || of("second", "break_glass.requested").pop(),
    )
    .await;
    assert_eq!(
        asked["portal_url"],
        format!("{PUBLIC_URL}/#/grants/{id}"),
        "{asked}"
    );
    eventually(5, "the window asked for told to the first group", || {
        of("first", "BREAK-GLASS window requested by alice").pop()
    })
    .await;

    let vote = |user: &str| Vote {
        user: user.into(),
        at: format_at(now),
        note: None,
        signature: None,
        signed: None,
    };
    let at = format_at(chrono::Utc::now());
    assert!(
        grants
            .sign(
                &id,
                0,
                &[vote("bob"), vote("carol")],
                Status::Active,
                Some(("approver:carol", &at))
            )
            .await
            .unwrap()
    );
    let used = |call_id: &str, runner: &str| NewEvent {
        actor: "agent:ops-bot".into(),
        kind: "grant.used".into(),
        tool: Some("linux.systemctl_restart".into()),
        call_id: Some(call_id.into()),
        outcome: Some("ok".into()),
        detail: Some(
            json!({"grant": id, "use": 1, "call_id": call_id, "runners": [runner], "break_glass": true}),
        ),
        ..Default::default()
    };
    app.audit
        .append_all(vec![used("call-a", "edge-1"), used("call-b", "edge-2")])
        .await
        .unwrap();
    let open = eventually(5, "the window told open", || {
        of("second", "break_glass.open").pop()
    })
    .await;
    assert_eq!(open["signed_by"], json!(["bob", "carol"]), "{open}");
    eventually(5, "both calls told to both groups", || {
        (of("second", "break_glass.call").len() >= 2 && of("first", "BREAK-GLASS call").len() >= 2)
            .then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut calls: Vec<(Value, Value, Value)> = of("second", "break_glass.call")
        .into_iter()
        .map(|b| {
            (
                b["call_id"].clone(),
                b["tool"].clone(),
                b["runners"].clone(),
            )
        })
        .collect();
    calls.sort_by_key(|c| c.0.to_string());
    assert_eq!(
        calls,
        [
            (
                json!("call-a"),
                json!("linux.systemctl_restart"),
                json!(["edge-1"])
            ),
            (
                json!("call-b"),
                json!("linux.systemctl_restart"),
                json!(["edge-2"])
            ),
        ]
    );
    let told = (
        receiver.about("first", &id).len(),
        receiver.about("second", &id).len(),
    );
    assert_eq!(told, (4, 4), "asked, open and two calls, each once");
    assert_eq!(of("first", "BREAK-GLASS").len(), 4);
}
both_backends!(a_windows_life_in_the_store_is_announced);
