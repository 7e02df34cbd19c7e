//! Grants (issue 47), on PostgreSQL (and SQLite) with TLS runners that require people's signatures: an
//! agent asks for a grant, two people sign it from its text with their SSH keys, and the
//! agent's restarts it admits then run with no new request, up to its count; everything it
//! does not admit (a 4th call, a unit outside it, a runner outside it, after expiry, after
//! revocation, another agent's call) is asked of people instead, nothing run; one signature
//! alone activates nothing; a revocation is pushed to every runner.
//!
//! The runners' own check of a grant (and their answer to `POST /v1/grants/revoked`) is the
//! runner's side of issue 47: the restarts counted and the deliveries awaited here need it.

use std::time::{Duration, Instant};

use emisar::server::audit::AuditFilter;
use emisar::server::principal::Role;
use rmcp::ServiceExt;
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::{Value, json};

use crate::approvals::{
    Portal, call_in_background, finished, restarts, signed_in, systemctl_standin,
};
use crate::harness::app::{Options, TestApp};
use crate::harness::certs::self_signed;
use crate::harness::tools::only_output;
use crate::harness::{Backend, RunnerSpec, spawn_app};
use crate::signed_approvals::{TOOL, pub_line, ssh};

/// alice holds key 1, bob key 2; a restart needs two people and may run under a grant.
fn approvers_text() -> String {
    format!(
        "serial = 1\n\
         [[person]]\nname = \"alice\"\nssh = [\"{}\"]\n\
         [[person]]\nname = \"bob\"\nssh = [\"{}\"]\n\
         [[rule]]\ntools = \"{TOOL}\"\napprovals = 2\ngrants = true\n\
         [[rule]]\ntools = \"*\"\napprovals = 1\n",
        pub_line(1),
        pub_line(2)
    )
}

struct Lab {
    _dir: tempfile::TempDir,
    record: std::path::PathBuf,
    app: TestApp,
    alice: Portal,
    bob: Portal,
    agent: RunningService<RoleClient, ()>,
}

/// hvn05 and hvn06 serve HTTPS (pinned) and run every tool only with people's signatures
/// from the approvers file, which the server has too. A call waits 1 s for people before it
/// answers with its pending request.
async fn lab(backend: Backend) -> Lab {
    let dir = tempfile::tempdir().unwrap();
    let record = systemctl_standin(dir.path());
    let file = dir.path().join("approvers.toml");
    std::fs::write(&file, approvers_text()).unwrap();
    let runner = |name: &str| {
        let cert = self_signed(dir.path(), name);
        RunnerSpec::new(name)
            .path_first(dir.path())
            .https(cert.clone(), Some(cert.fingerprint.to_string()))
            .allow("systemd_units", &["consul", "nomad", "traefik"])
            .signed_approvals(&["*"], Some(file.clone()), &[])
    };
    let app = spawn_app(
        backend,
        vec![runner("hvn05"), runner("hvn06")],
        Options {
            approvers_file: Some(file.clone()),
            approval_wait_secs: Some(1),
            probe_interval_ms: Some(200),
            ..Default::default()
        },
    )
    .await;
    let alice = signed_in(&app, "alice", Role::Approver).await;
    let bob = signed_in(&app, "bob", Role::Approver).await;
    let agent = app.mcp_client().await;
    Lab {
        _dir: dir,
        record,
        app,
        alice,
        bob,
        agent,
    }
}

/// A call of `tool` with `args` by `client`, to its end.
async fn call(
    client: &RunningService<RoleClient, ()>,
    tool: &str,
    args: Value,
) -> rmcp::model::CallToolResult {
    finished(call_in_background(client, tool, args)).await
}

fn restart(unit: &str, runner: &str) -> Value {
    json!({"unit": unit, "runners": [runner], "reason": "INC-42"})
}

/// The grant the agent asks for: restarts of consul or traefik on hvn05, 3 in all.
async fn ask(lab: &Lab, expires_in_secs: u64) -> (String, String) {
    let res = call(
        &lab.agent,
        "emisar.request_grant",
        json!({
            "tools": [TOOL],
            "runners": {"names": ["hvn05"]},
            "args": {"unit": {"in": ["traefik", "consul"]}},
            "calls": 3,
            "expires_in_secs": expires_in_secs,
            "reason": "INC-42: consul and traefik flap on hvn05",
        }),
    )
    .await;
    assert_ne!(res.is_error, Some(true), "{res:?}");
    let out = only_output(&res);
    assert_eq!(out["status"], "requested", "{out}");
    assert_eq!(out["required"], 2, "the approvers file's rule for the tool");
    let id = out["grant_id"].as_str().unwrap().to_owned();
    let text = out["text"].as_str().unwrap().to_owned();
    assert!(text.starts_with("emisar-grant/v1\n"), "{text}");
    (id, text)
}

/// `who` signs grant `id`'s `text` with SSH key `seed`; the grant after.
async fn sign(who: &Portal, id: &str, text: &str, seed: u8) -> Value {
    let (status, body) = who
        .post(
            &format!("/api/grants/{id}/approve"),
            json!({"signature": ssh(seed, text)}),
            true,
        )
        .await;
    assert_eq!(status, 200, "{body}");
    body
}

/// An active grant: asked for, then signed by alice and bob.
async fn active(lab: &Lab, expires_in_secs: u64) -> String {
    let (id, text) = ask(lab, expires_in_secs).await;
    assert_eq!(sign(&lab.alice, &id, &text, 1).await["status"], "requested");
    assert_eq!(sign(&lab.bob, &id, &text, 2).await["status"], "active");
    id
}

/// The call ran under grant `id` as use `n`: its outcome says so, and nothing was asked of
/// people.
fn ran_under(res: &rmcp::model::CallToolResult, id: &str, n: u64) {
    let out = res.structured_content.clone().unwrap();
    assert_eq!(out["grant"]["grant_id"], id, "{out}");
    assert_eq!(out["grant"]["use"], n, "{out}");
    assert!(out.get("approval").is_none(), "no request: {out}");
}

/// The call was asked of people instead (its request pending, nothing run under a grant),
/// and the agent reads why no grant covered it (`why`, when a grant was looked at).
fn asked_people(res: &rmcp::model::CallToolResult, why: Option<&str>) -> String {
    let out = res.structured_content.clone().unwrap();
    assert!(out.get("grant").is_none(), "not under a grant: {out}");
    assert_eq!(out["approval"]["state"], "pending", "{out}");
    let message = out["approval"]["message"].as_str().unwrap();
    match why {
        Some(why) => assert!(
            message.contains("no grant covered this call") && message.contains(why),
            "`{message}` does not say `{why}`"
        ),
        None => assert!(!message.contains("no grant"), "{message}"),
    }
    out["approval"]["approval_id"].as_str().unwrap().to_owned()
}

async fn kind_events(app: &TestApp, kind: &str) -> Vec<emisar::protocol::audit_event::Event> {
    app.events(AuditFilter {
        kind: Some(kind.into()),
        ..Default::default()
    })
    .await
}

/// A grant signed by 2 people lets the agent restart allowed units 3 times with no new
/// approvals; a 4th call, a unit outside it and a runner outside it are asked of people;
/// one signature alone activates nothing.
async fn a_grant_two_people_signed_runs_three_restarts_and_nothing_outside_it(backend: Backend) {
    let lab = lab(backend).await;
    let (id, text) = ask(&lab, 600).await;

    // One person's signature alone: the grant is still requested, and the call is asked of
    // people.
    assert_eq!(sign(&lab.alice, &id, &text, 1).await["status"], "requested");
    let res = call(&lab.agent, TOOL, restart("consul", "hvn05")).await;
    asked_people(&res, None);
    // One account signs once; and one person of the file counts once, whichever account
    // sends their signature (bob's session with alice's key).
    let (status, body) = lab
        .alice
        .post(
            &format!("/api/grants/{id}/approve"),
            json!({"signature": ssh(1, &text)}),
            true,
        )
        .await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("signed this grant already"),
        "{body}"
    );
    let (status, body) = lab
        .bob
        .post(
            &format!("/api/grants/{id}/approve"),
            json!({"signature": ssh(1, &text)}),
            true,
        )
        .await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("counts once"),
        "{body}"
    );
    // A signature over another text is refused before it is stored.
    let (status, body) = lab
        .bob
        .post(
            &format!("/api/grants/{id}/approve"),
            json!({"signature": ssh(2, &text.replace("calls 3", "calls 30"))}),
            true,
        )
        .await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(sign(&lab.bob, &id, &text, 2).await["status"], "active");

    // Outside the grant: a unit it does not list, a runner it does not name.
    let res = call(&lab.agent, TOOL, restart("nomad", "hvn05")).await;
    asked_people(&res, Some("`unit`: \"nomad\" is outside"));
    let res = call(&lab.agent, TOOL, restart("consul", "hvn06")).await;
    asked_people(&res, Some("does not name this runner (`hvn06`)"));
    assert_eq!(restarts(&lab.record), 0, "nothing ran without people");

    // Three restarts it admits run now, each under the grant.
    for (n, unit) in [(1, "consul"), (2, "traefik"), (3, "consul")] {
        let res = call(&lab.agent, TOOL, restart(unit, "hvn05")).await;
        ran_under(&res, &id, n);
    }
    let used = kind_events(&lab.app, "grant.used").await;
    assert_eq!(used.len(), 3, "each use is in the log");
    for (i, e) in used.iter().enumerate() {
        let d = e.detail.clone().unwrap();
        assert_eq!(d["grant"], id.as_str());
        assert_eq!(d["use"], i as u64 + 1);
        assert_eq!(d["runners"], json!(["hvn05"]));
        let intent = lab.app.events_of_call(e.call_id.as_deref().unwrap()).await;
        let called = intent.iter().find(|e| e.kind == "tool.called").unwrap();
        assert_eq!(
            called.detail.clone().unwrap()["grant"],
            id.as_str(),
            "the intent names the grant"
        );
    }
    // The 4th is over the grant's count.
    let res = call(&lab.agent, TOOL, restart("consul", "hvn05")).await;
    asked_people(&res, Some(&format!("grant {id}: 3 of 3 calls used")));

    // The agent reads what remains.
    let res = call(
        &lab.agent,
        "emisar.grants",
        json!({"reason": "what is left"}),
    )
    .await;
    let grants = only_output(&res)["grants"].as_array().unwrap().clone();
    assert_eq!(grants.len(), 1);
    assert_eq!(grants[0]["status"], "active");
    assert_eq!(grants[0]["calls_left"], 0);
    assert_eq!(grants[0]["runners_used"]["hvn05"]["used"], 3);
    assert!(
        grants[0].get("signatures").is_none(),
        "the agent reads no signatures"
    );

    // The grant's life, each step by its actor.
    let life: Vec<(String, String)> = lab
        .app
        .all_events()
        .await
        .into_iter()
        .filter(|e| e.kind.starts_with("grant.") && e.kind != "grant.used")
        .map(|e| (e.kind, e.actor))
        .collect();
    assert_eq!(
        life,
        [
            ("grant.requested".to_owned(), "agent:test-agent".to_owned()),
            ("grant.signed".to_owned(), "approver:alice".to_owned()),
            ("grant.signed".to_owned(), "approver:bob".to_owned()),
            ("grant.active".to_owned(), "approver:bob".to_owned()),
        ]
    );
    // The runner ran exactly the three restarts (its own check of the grant).
    assert_eq!(
        restarts(&lab.record),
        3,
        "the runner ran the grant's three calls"
    );
}

crate::both_backends!(a_grant_two_people_signed_runs_three_restarts_and_nothing_outside_it);

/// After its expiry and after its revocation a grant runs nothing (asked of people
/// instead); another agent never runs under a grant that is not its own; a revocation is
/// pushed to every runner until each acknowledged it.
async fn expired_revoked_and_other_agents_grants_run_nothing(backend: Backend) {
    let lab = lab(backend).await;
    let app = &lab.app;

    // Another agent's call that the grant would admit were it its own.
    let revoked = active(&lab, 600).await;
    let other_token = app.issue_token("other-agent", Role::Agent).await;
    let config =
        StreamableHttpClientTransportConfig::with_uri(app.mcp_url.clone()).auth_header(other_token);
    let other = ()
        .serve(StreamableHttpClientTransport::with_client(
            app.http(),
            config,
        ))
        .await
        .unwrap();
    let res = call(&other, TOOL, restart("consul", "hvn05")).await;
    asked_people(&res, None);
    let res = call(&other, "emisar.grants", json!({"reason": "mine?"})).await;
    assert_eq!(
        only_output(&res)["grants"],
        json!([]),
        "an agent sees only its own"
    );

    // Revoked: the server runs nothing more under it at once.
    let (status, body) = lab
        .alice
        .post(
            &format!("/api/grants/{revoked}/revoke"),
            json!({"reason": "INC-42 is over"}),
            true,
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "revoked");
    let res = call(&lab.agent, TOOL, restart("consul", "hvn05")).await;
    asked_people(&res, None);
    let (status, body) = lab
        .alice
        .post(
            &format!("/api/grants/{revoked}/revoke"),
            json!({"reason": "again"}),
            true,
        )
        .await;
    assert_eq!(status, 403, "{body}");

    // Expired: a grant of 3 s, signed, then past its expiry.
    let expired = active(&lab, 3).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let res = call(&lab.agent, TOOL, restart("consul", "hvn05")).await;
    asked_people(&res, None);
    let res = call(
        &lab.agent,
        "emisar.grants",
        json!({"reason": "where do they stand"}),
    )
    .await;
    let statuses: Vec<(String, String)> = only_output(&res)["grants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            (
                g["grant_id"].as_str().unwrap().to_owned(),
                g["status"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        statuses,
        [
            (expired.clone(), "expired".to_owned()),
            (revoked.clone(), "revoked".to_owned())
        ]
    );
    assert!(
        kind_events(app, "grant.used").await.is_empty(),
        "nothing ran under a grant"
    );
    assert_eq!(restarts(&lab.record), 0, "nothing ran without people");
    let expired_events = kind_events(app, "grant.expired").await;
    assert_eq!(expired_events.len(), 1);
    assert_eq!(
        expired_events[0].detail.clone().unwrap()["grant"],
        expired.as_str()
    );

    // The revocation reached every runner (each acknowledged it once).
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let mut reached: Vec<String> = kind_events(app, "grant.revocation_delivered")
            .await
            .into_iter()
            .filter(|e| {
                e.detail
                    .as_ref()
                    .is_some_and(|d| d["grant"] == revoked.as_str())
            })
            .filter_map(|e| e.runner)
            .collect();
        reached.sort();
        if reached == ["hvn05", "hvn06"] {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the revocation did not reach every runner: {reached:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

crate::both_backends!(expired_revoked_and_other_agents_grants_run_nothing);

/// What the agent asks for is checked, each error naming the field and the rule; nothing is
/// stored or asked of people.
#[tokio::test]
async fn a_bad_grant_request_names_the_field_and_the_rule() {
    let lab = lab(Backend::Postgres).await;
    let good = json!({
        "tools": [TOOL], "runners": {"names": ["hvn05"]}, "calls": 3,
        "expires_in_secs": 600, "reason": "INC-42",
    });
    for (field, value, why) in [
        (
            "expires_in_secs",
            json!(3601),
            "`expires_in_secs` must be 1 to 3600",
        ),
        (
            "tools",
            json!(["consul.members"]),
            "`tools`: `consul.members` covers no write tool",
        ),
        ("runners", json!({"names": ["nowhere"]}), "`runners.names`"),
        ("runners", json!({"any": ["hvn05"]}), "runners"),
        (
            "args",
            json!({"colour": {"in": ["red"]}}),
            "`args.colour`: no granted tool takes",
        ),
        (
            "calls_per_runner",
            json!(4),
            "`calls_per_runner` must be at most `calls`",
        ),
    ] {
        let mut args = good.clone();
        args[field] = value;
        let res = call(&lab.agent, "emisar.request_grant", args).await;
        assert_eq!(res.is_error, Some(true), "{field}: {res:?}");
        let text = format!("{:?}", res.content);
        assert!(text.contains(why), "{field}: {text} does not say {why}");
    }
    let (status, body) = lab.alice.get("/api/grants").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["grants"], json!([]), "nothing stored");
}

/// One agent waits on at most `max_pending_per_agent` grants (20 here) at once, as on
/// approval requests: the 21st ask is refused as `too_many_pending`, naming the limit, and
/// stores nothing; once one of them is signed, the agent may ask again.
#[tokio::test]
async fn an_agent_waits_on_no_more_grants_than_max_pending_per_agent() {
    let lab = lab(Backend::Sqlite).await;
    let ask = json!({
        "tools": [TOOL], "runners": {"names": ["hvn05"]}, "calls": 1,
        "expires_in_secs": 600, "reason": "INC-42",
    });
    let mut first = None;
    for n in 0..20 {
        let res = call(&lab.agent, "emisar.request_grant", ask.clone()).await;
        assert_ne!(res.is_error, Some(true), "ask {n}: {res:?}");
        let out = only_output(&res);
        first.get_or_insert_with(|| {
            (
                out["grant_id"].as_str().unwrap().to_owned(),
                out["text"].as_str().unwrap().to_owned(),
            )
        });
    }
    let res = call(&lab.agent, "emisar.request_grant", ask.clone()).await;
    assert_eq!(res.is_error, Some(true), "{res:?}");
    let error = &res.structured_content.as_ref().unwrap()["error"];
    assert_eq!(error["kind"], "too_many_pending", "{error}");
    assert_eq!(
        (error["pending"].clone(), error["max"].clone()),
        (json!(20), json!(20))
    );
    let text = format!("{:?}", res.content);
    assert!(
        text.contains("already has 20 grants waiting for people's signatures")
            && text.contains("max_pending_per_agent = 20"),
        "{text}"
    );
    let (_, body) = lab.alice.get("/api/grants").await;
    assert_eq!(
        body["grants"].as_array().unwrap().len(),
        20,
        "nothing stored"
    );
    // One is signed: the agent may ask again.
    let (id, grant) = first.unwrap();
    sign(&lab.alice, &id, &grant, 1).await;
    let signed = sign(&lab.bob, &id, &grant, 2).await;
    assert_eq!(signed["status"], "active", "{signed}");
    let res = call(&lab.agent, "emisar.request_grant", ask).await;
    assert_ne!(res.is_error, Some(true), "{res:?}");
}

/// Red team 5's cases, each once more than people signed, none run:
/// - one account signs a grant twice with two people's keys (B4): refused, as an approval is;
/// - a call naming two runners takes two of the grant's calls (B3): with one left it runs
///   nowhere, and the runners ran exactly `calls` restarts;
/// - whoever can write the database deletes the `grant.used` events (B1; deleting a
///   `grant.revoked` is the same gap, B2): the log has events missing since the grant was
///   asked for, so its uses cannot be counted, and nothing more runs under it.
async fn one_account_a_wide_call_or_a_deleted_use_gets_no_more_than_people_signed(
    backend: Backend,
) {
    let lab = lab(backend).await;
    let app = &lab.app;
    let res = call(
        &lab.agent,
        "emisar.request_grant",
        json!({
            "tools": [TOOL], "runners": {"names": ["hvn05", "hvn06"]},
            "args": {"unit": {"in": ["consul"]}}, "calls": 3, "calls_per_runner": 2,
            "expires_in_secs": 600, "reason": "INC-43: consul on both",
        }),
    )
    .await;
    let out = only_output(&res);
    let (id, text) = (
        out["grant_id"].as_str().unwrap().to_owned(),
        out["text"].as_str().unwrap().to_owned(),
    );
    assert_eq!(sign(&lab.alice, &id, &text, 1).await["status"], "requested");
    let (status, body) = lab
        .alice
        .post(
            &format!("/api/grants/{id}/approve"),
            json!({"signature": ssh(2, &text)}),
            true,
        )
        .await;
    assert!(status >= 400, "{status} {body}");
    assert!(
        body.to_string().contains("signed this grant already"),
        "{body}"
    );
    assert_eq!(sign(&lab.bob, &id, &text, 2).await["status"], "active");

    let both = json!({"unit": "consul", "runners": ["hvn05", "hvn06"], "reason": "INC-43"});
    ran_under(&call(&lab.agent, TOOL, both.clone()).await, &id, 1);
    assert_eq!(restarts(&lab.record), 2);
    let res = call(&lab.agent, TOOL, both).await;
    asked_people(
        &res,
        Some("2 of 3 calls used, and this call would run on 2 runners"),
    );
    ran_under(
        &call(&lab.agent, TOOL, restart("consul", "hvn06")).await,
        &id,
        3,
    );
    assert_eq!(restarts(&lab.record), 3, "exactly the grant's 3 calls ran");

    let triggers_off = match backend {
        Backend::Postgres => "ALTER TABLE audit_events DISABLE TRIGGER USER",
        Backend::Sqlite => "DROP TRIGGER audit_events_no_delete",
    };
    let delete = match backend {
        Backend::Postgres => {
            "DELETE FROM audit_events WHERE kind = 'grant.used' AND (detail::jsonb ->> 'grant') = $1"
        }
        Backend::Sqlite => {
            "DELETE FROM audit_events WHERE kind = 'grant.used' AND json_extract(detail, '$.grant') = $1"
        }
    };
    for (sql, bind) in [(triggers_off, None), (delete, Some(id.as_str()))] {
        emisar::with_pool!(&app.db, pool => {
            let q = sqlx::query(sql);
            let q = match bind { Some(b) => q.bind(b), None => q };
            q.execute(pool).await.map(|_| ())
        })
        .unwrap();
    }
    assert!(kind_events(app, "grant.used").await.is_empty());
    // hvn05 ran the grant once, so its own count would let one more run there.
    let res = call(&lab.agent, TOOL, restart("consul", "hvn05")).await;
    asked_people(
        &res,
        Some("the audit log is missing events since it was asked for"),
    );
    assert_eq!(restarts(&lab.record), 3, "nothing more ran");
}

crate::both_backends!(one_account_a_wide_call_or_a_deleted_use_gets_no_more_than_people_signed);

/// Eight calls at once for a grant of three: exactly three run under it (uses 1, 2 and 3, each
/// once), the other five are asked of people; the grant's lock (a PostgreSQL advisory lock
/// on that backend) holds from the count to the append.
async fn calls_at_once_never_take_one_use_twice(backend: Backend) {
    let lab = lab(backend).await;
    let id = active(&lab, 600).await;
    let calls: Vec<_> = (0..8)
        .map(|_| call_in_background(&lab.agent, TOOL, restart("consul", "hvn05")))
        .collect();
    let mut uses = Vec::new();
    let mut asked = 0;
    for c in calls {
        let out = finished(c).await.structured_content.unwrap();
        match out.get("grant") {
            Some(grant) => {
                assert_eq!(grant["grant_id"], id.as_str(), "{out}");
                uses.push(grant["use"].as_u64().unwrap());
            }
            None => {
                assert_eq!(out["approval"]["state"], "pending", "{out}");
                asked += 1;
            }
        }
    }
    uses.sort_unstable();
    assert_eq!(uses, vec![1, 2, 3]);
    assert_eq!(asked, 5);
    assert_eq!(restarts(&lab.record), 3);
    assert_eq!(kind_events(&lab.app, "grant.used").await.len(), 3);
}

crate::both_backends!(calls_at_once_never_take_one_use_twice);
