//! Floods, measured: no caller grows the audit log faster than its limits. A flood of
//! unknown-tool calls from one agent token, and a flood of joins with made-up tokens from one
//! address, each add a bounded number of audit rows, every refusal is still accounted for
//! (its own event, or counted in a `refusal.repeated` aggregate, written at the latest when
//! the server stops cleanly), and a real join made during the join flood gets through while
//! the flood is still being refused.

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use emisar::server::audit::{AuditFilter, Event};
use emisar::server::fleet::JoinTokenSpec;
use rmcp::model::CallToolRequestParams;
use serde_json::{Value, json};

use crate::harness::app::{Options, TestApp};
use crate::harness::{Backend, spawn_app};

/// The events of `kind`, and the refusals of `kind` counted in aggregates.
async fn accounted(app: &TestApp, kind: &str) -> (Vec<Event>, u64, Vec<Event>) {
    let own = app
        .events(AuditFilter {
            kind: Some(kind.into()),
            ..Default::default()
        })
        .await;
    let aggregates: Vec<Event> = app
        .events(AuditFilter {
            kind: Some("refusal.repeated".into()),
            ..Default::default()
        })
        .await
        .into_iter()
        .filter(|e| e.detail.as_ref().unwrap()["kind"] == kind)
        .collect();
    let counted = aggregates
        .iter()
        .map(|e| e.detail.as_ref().unwrap()["count"].as_u64().unwrap())
        .sum();
    (own, counted, aggregates)
}

/// Acceptance: 8 concurrent callers of an unknown tool for 10 s from one agent token (the
/// default limit, 20 a second with bursts of 40) add at most 100 audit rows, and every call
/// is accounted for once the server has stopped.
async fn an_unknown_tool_flood_costs_bounded_rows(backend: Backend) {
    let mut app = spawn_app(
        backend,
        vec![],
        Options {
            rate_limit: Some((20, 40)),
            ..Default::default()
        },
    )
    .await;
    let client = app.mcp_client().await;
    let before = app.audit_rows().await;
    let until = Instant::now() + Duration::from_secs(10);
    let callers = (0..8).map(|_| {
        let client = &client;
        async move {
            let (mut unknown, mut limited) = (0u64, 0u64);
            while Instant::now() < until {
                let res = client
                    .call_tool(
                        CallToolRequestParams::new("nope.tool").with_arguments(Default::default()),
                    )
                    .await;
                match res {
                    Err(e) if e.to_string().contains("unknown tool") => unknown += 1,
                    Ok(r) if format!("{:?}", r.content).contains("rate limited") => limited += 1,
                    other => panic!("neither unknown nor rate limited: {other:?}"),
                }
            }
            (unknown, limited)
        }
    });
    let answers = futures::future::join_all(callers).await;
    let unknown: u64 = answers.iter().map(|a| a.0).sum();
    let limited: u64 = answers.iter().map(|a| a.1).sum();
    assert!(
        unknown > 0 && limited > 0,
        "both refusals met: {unknown} unknown, {limited} rate limited"
    );
    client.cancel().await.unwrap();
    app.stop().await;

    let added = app.audit_rows().await - before;
    assert!(
        added <= 100,
        "{added} audit rows for {unknown} unknown-tool and {limited} rate-limited calls"
    );
    // Nothing is lost: each call is its own event or counted in an aggregate.
    let (own, counted, aggregates) = accounted(&app, "tool.rejected").await;
    assert_eq!(
        own.len() as u64 + counted,
        unknown + limited,
        "{own:#?} {aggregates:#?}"
    );
    let classes: Vec<&str> = aggregates
        .iter()
        .map(|e| e.detail.as_ref().unwrap()["class"].as_str().unwrap())
        .collect();
    assert!(
        classes.contains(&"unknown_tool") && classes.contains(&"rate_limited"),
        "{aggregates:#?}"
    );
    for agg in &aggregates {
        assert_eq!(agg.actor, "agent:test-agent");
        let detail = agg.detail.as_ref().unwrap();
        assert_eq!(detail["first"]["actor"], "agent:test-agent");
        assert!(detail["first_at"].as_str() <= detail["last_at"].as_str());
        assert_eq!(detail["window_secs"], 60);
    }
    app.assert_chain_intact().await;
}
crate::both_backends!(an_unknown_tool_flood_costs_bounded_rows);

/// Sends `req`; its status, and the number its answer took from `answers` when it arrived.
async fn numbered(
    req: reqwest::RequestBuilder,
    answers: Arc<AtomicUsize>,
) -> reqwest::Result<(u16, usize)> {
    let status = req.send().await?.status().as_u16();
    Ok((status, answers.fetch_add(1, Ordering::SeqCst)))
}

fn join_body(name: &str) -> Value {
    json!({"name": name, "url": "http://127.0.0.1:9/", "labels": {}, "packs": {}})
}

/// Acceptance: 400 joins with made-up tokens in 6 s from one address add at most 20 audit
/// rows; a real join from another address during the flood succeeds while the flood is still
/// being refused (its answer comes before the answer to the flood's last join: an order, not
/// a clock, so a slow machine slows both sides alike); every refusal is accounted for once
/// the server has stopped.
async fn a_join_flood_costs_bounded_rows_and_real_joins_get_through(backend: Backend) {
    let mut app = spawn_app(backend, vec![], Options::default()).await;
    let (_, real) = app
        .join_token(JoinTokenSpec::once(Duration::from_secs(600)))
        .await;
    let real = emisar::protocol::JoinToken::parse(&real)
        .unwrap()
        .secret()
        .to_owned();
    let url = format!("{}/api/runners/join", app.base_url());
    let before = app.audit_rows().await;

    // Each answer takes the next number as it arrives: the order the client heard them in.
    let answers = Arc::new(AtomicUsize::new(0));
    // The real join goes when a bucket shared with the flood would be empty: after the flood
    // spent the burst and before the first join refills, halfway. (Sent as a refill lands, it
    // would get through a shared bucket too, and not tell the two apart.)
    let per_minute = emisar::server::fleet::JOINS_PER_MINUTE as u64;
    let (burst_spent_ms, refill_ms) = (per_minute * 15, 60_000 / per_minute);
    assert!(
        burst_spent_ms < refill_ms,
        "the flood spends the burst before one join refills"
    );
    let honest_after = (burst_spent_ms + refill_ms) / 2 / 15;
    let flooder = reqwest::Client::new();
    let started = Instant::now();
    let mut every = tokio::time::interval(Duration::from_millis(15));
    let mut flood = Vec::new();
    let mut honest = None;
    for i in 0..400 {
        every.tick().await;
        let req = flooder
            .post(&url)
            .bearer_auth(format!("emj_made-up-{i:04}-{}", "x".repeat(30)))
            .json(&join_body(&format!("flood-{i}")));
        flood.push(tokio::spawn(numbered(req, answers.clone())));
        if i == honest_after {
            // The operator's runner joins from its own address.
            let req = reqwest::Client::builder()
                .local_address(IpAddr::from([127, 0, 0, 2]))
                .build()
                .unwrap()
                .post(&url)
                .bearer_auth(&real)
                .json(&join_body("honest-1"));
            honest = Some(tokio::spawn(numbered(req, answers.clone())));
        }
    }
    let mut statuses = Vec::new();
    let mut last_flood_answer = 0;
    for answer in futures::future::join_all(flood).await {
        let (status, nth) = answer.unwrap().expect("every join is answered");
        statuses.push(status);
        last_flood_answer = nth;
    }
    let flood_took = started.elapsed();
    let (honest_status, honest_nth) = honest
        .unwrap()
        .await
        .unwrap()
        .expect("the real join is answered");
    assert_eq!(honest_status, 200, "the real join succeeded");
    assert_eq!(
        statuses.last(),
        Some(&429),
        "the flood's last join is refused by the limit: {statuses:?}"
    );
    assert!(
        honest_nth < last_flood_answer,
        "the real join was answered while the flood was still being refused, not after it: \
         answer {honest_nth}, the flood's last join answer {last_flood_answer}"
    );
    assert_eq!(statuses.len(), 400);
    let unauthorized = statuses.iter().filter(|s| **s == 401).count();
    let limited = statuses.iter().filter(|s| **s == 429).count();
    assert_eq!(unauthorized + limited, 400, "{statuses:?}");
    // The burst, plus what the bucket refilled while the flood lasted.
    let per_minute = emisar::server::fleet::JOINS_PER_MINUTE as f64;
    let allowed = per_minute + (flood_took.as_secs_f64() * per_minute / 60.0).ceil();
    assert!(
        unauthorized as f64 <= allowed,
        "{unauthorized} reached the store in {flood_took:?}"
    );
    app.stop().await;

    let added = app.audit_rows().await - before;
    assert!(
        added <= 20,
        "{added} audit rows for 400 refused joins in {flood_took:?}"
    );
    let (own, counted, aggregates) = accounted(&app, "runner.join_refused").await;
    assert_eq!(own.len() as u64 + counted, 400, "{own:#?} {aggregates:#?}");
    assert!(
        aggregates.iter().all(|e| e.actor == "address:127.0.0.1"),
        "{aggregates:#?}"
    );
    let joined = emisar::server::fleet::joined_runners(&app.db)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.name)
        .collect::<Vec<_>>();
    assert_eq!(joined, ["honest-1"]);
    app.assert_chain_intact().await;
}
crate::both_backends!(a_join_flood_costs_bounded_rows_and_real_joins_get_through);

/// Failed logins for one name: the first is its own `login.failed`, the rest one
/// `refusal.repeated` per window with the count; a good password still signs in.
async fn repeated_failed_logins_are_counted_not_written_one_by_one(backend: Backend) {
    let app = spawn_app(backend, vec![], Options::default()).await;
    let password =
        crate::approvals::add_user(&app, "alice", emisar::server::principal::Role::Approver).await;
    let before = app.audit_rows().await;
    for i in 0..4 {
        let err = emisar::server::users::login(&app.db, &app.audit, "alice", &format!("wrong-{i}"))
            .await
            .unwrap_err();
        assert!(
            matches!(err, emisar::server::users::UserError::BadLogin),
            "{err}"
        );
    }
    let (own, counted, aggregates) = accounted(&app, "login.failed").await;
    assert_eq!(own.len(), 1, "{own:#?}");
    assert_eq!(counted, 0, "not written before the window ends");
    assert_eq!(app.audit_rows().await - before, 1);
    assert_eq!(app.audit.flush_refusals().await, 3);
    let (own, counted, aggregates_after) = accounted(&app, "login.failed").await;
    assert!(aggregates.is_empty());
    assert_eq!((own.len(), counted), (1, 3), "{aggregates_after:#?}");
    let detail = aggregates_after[0].detail.as_ref().unwrap();
    assert_eq!(aggregates_after[0].actor, "user:alice");
    assert_eq!(detail["class"], "bad_password");
    assert!(
        !detail.to_string().contains("wrong-"),
        "no password is sampled"
    );
    emisar::server::users::login(&app.db, &app.audit, "alice", &password)
        .await
        .unwrap();
    app.assert_chain_intact().await;
}
crate::both_backends!(repeated_failed_logins_are_counted_not_written_one_by_one);

/// `[join] attempts_per_address_per_minute` is the limit in force: raised above the default
/// (a fleet joining from behind one NAT), that many attempts from one address reach the
/// store, the next is refused with 429 naming the limit, and another address has its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operators_join_limit_is_the_one_in_force() {
    let per_minute = emisar::server::fleet::JOINS_PER_MINUTE + 5;
    let app = spawn_app(
        Backend::Sqlite,
        vec![],
        Options {
            join: Some(emisar::server::config::JoinConfig {
                allowed_networks: Some(vec!["127.0.0.0/8".into()]),
                attempts_per_address_per_minute: per_minute,
            }),
            ..Default::default()
        },
    )
    .await;
    let url = format!("{}/api/runners/join", app.base_url());
    let attempt = |client: &reqwest::Client, i: u32| {
        client
            .post(&url)
            .bearer_auth(format!("emj_made-up-{i:04}-{}", "x".repeat(30)))
            .json(&join_body(&format!("nat-{i}")))
            .send()
    };
    let one_address = reqwest::Client::new();
    for i in 0..per_minute {
        let status = attempt(&one_address, i).await.unwrap().status().as_u16();
        assert_eq!(
            status, 401,
            "attempt {i} reaches the store (a made-up token)"
        );
    }
    let refused = attempt(&one_address, per_minute).await.unwrap();
    assert_eq!(refused.status().as_u16(), 429);
    let answer: Value = refused.json().await.unwrap();
    let error = answer["error"].as_str().unwrap();
    assert!(
        error.contains(&format!("at most {per_minute} a minute")),
        "{error}"
    );
    let other = reqwest::Client::builder()
        .local_address(IpAddr::from([127, 0, 0, 2]))
        .build()
        .unwrap();
    let status = attempt(&other, 0).await.unwrap().status().as_u16();
    assert_eq!(status, 401, "another address has its own bucket");
}
