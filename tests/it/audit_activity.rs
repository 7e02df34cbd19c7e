//! `GET /api/audit/activity` on both backends: the store's per-bucket counts of events,
//! calls, refusals (a `refusal.repeated` by its `count`) and approvals are what a scan of the
//! same events gives, bucket by bucket; the bounds are refused with the parameter named; an
//! agent's token, which may not read the audit log, is refused.

use emisar::server::audit::{AuditFilter, AuditLog, NewEvent};
use emisar::server::principal::Role;
use serde_json::{Value, json};

use crate::both_backends;
use crate::harness::app::Options;
use crate::harness::{Backend, spawn_app};

/// One event of `kind`, by a test agent.
fn event(kind: &str, detail: Option<Value>) -> NewEvent {
    NewEvent {
        actor: "agent:chart".into(),
        kind: kind.into(),
        tool: Some("testkit.echo".into()),
        detail,
        ..Default::default()
    }
}

/// What a bucket should hold, counted from the events themselves: `[events, calls,
/// refusals, approvals]` per bucket of the window the answer names.
pub(crate) fn scan(events: &[emisar::server::audit::Event], answer: &Value) -> Vec<[i64; 4]> {
    let start = chrono::DateTime::parse_from_rfc3339(answer["start"].as_str().unwrap())
        .unwrap()
        .timestamp();
    let width = answer["bucket_seconds"].as_i64().unwrap();
    let n = answer["buckets"].as_array().unwrap().len();
    let mut counts = vec![[0i64; 4]; n];
    for e in events {
        let at = chrono::DateTime::parse_from_rfc3339(&e.at)
            .unwrap()
            .timestamp();
        let Some(bucket) = usize::try_from((at - start).div_euclid(width))
            .ok()
            .filter(|b| *b < n)
        else {
            continue;
        };
        let c = &mut counts[bucket];
        c[0] += 1;
        match e.kind.as_str() {
            "tool.called" => c[1] += 1,
            "tool.rejected" => c[2] += 1,
            "refusal.repeated" => c[2] += e.detail.as_ref().unwrap()["count"].as_i64().unwrap(),
            "approval.approved" => c[3] += 1,
            _ => {}
        }
    }
    counts
}

async fn activity_counts_what_the_log_holds(backend: Backend) {
    let app = spawn_app(backend, vec![], Options::default()).await;
    let auditor = app.issue_token("alice", Role::Auditor).await;
    let agent = app.issue_token("bot", Role::Agent).await;

    // A second writer of the same log, as a replica would be.
    let log = AuditLog::start(app.db.clone());
    for _ in 0..4 {
        log.append(event("tool.called", None)).await.unwrap();
    }
    for _ in 0..3 {
        log.append(event("tool.rejected", None)).await.unwrap();
    }
    log.append(event(
        "refusal.repeated",
        Some(json!({"count": 5, "refused_kind": "tool.rejected"})),
    ))
    .await
    .unwrap();
    for _ in 0..2 {
        log.append(event("approval.approved", None)).await.unwrap();
    }

    let http = app.http();
    let get = |token: &str, query: &str| {
        http.get(format!("{}/api/audit/activity{query}", app.base_url()))
            .bearer_auth(token.to_owned())
            .send()
    };
    let res = get(&auditor, "?buckets=30&bucket_seconds=10")
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let answer: Value = res.json().await.unwrap();
    let buckets = answer["buckets"].as_array().unwrap();
    assert_eq!(buckets.len(), 30, "{answer}");
    assert_eq!(answer["bucket_seconds"], 10);
    let events = app.events(AuditFilter::default()).await;
    let expected = scan(&events, &answer);
    let got: Vec<[i64; 4]> = buckets
        .iter()
        .map(|b| ["events", "calls", "refusals", "approvals"].map(|k| b[k].as_i64().unwrap()))
        .collect();
    assert_eq!(got, expected, "{answer}");
    // The window holds everything this test wrote: the scan is not vacuous.
    let total = |i: usize| got.iter().map(|c| c[i]).sum::<i64>();
    assert_eq!(total(0), events.len() as i64, "{answer}");
    assert_eq!((total(1), total(2), total(3)), (4, 3 + 5, 2), "{answer}");
    // Buckets are consecutive, 10 s apart, the last one holding now.
    let starts: Vec<i64> = buckets
        .iter()
        .map(|b| {
            chrono::DateTime::parse_from_rfc3339(b["start"].as_str().unwrap())
                .unwrap()
                .timestamp()
        })
        .collect();
    assert!(starts.windows(2).all(|w| w[1] - w[0] == 10), "{starts:?}");
    let now = chrono::Utc::now().timestamp();
    assert!(
        starts[29] <= now && now < starts[29] + 10 + 2,
        "{starts:?} {now}"
    );

    // The defaults: the last hour by the minute.
    let answer: Value = get(&auditor, "").await.unwrap().json().await.unwrap();
    assert_eq!(answer["buckets"].as_array().unwrap().len(), 60);
    assert_eq!(answer["bucket_seconds"], 60);

    // Bounds, each refused naming its parameter and the rule.
    for (query, says) in [
        (
            "?buckets=0",
            "`buckets` must be a whole number from 1 to 360",
        ),
        (
            "?buckets=361",
            "`buckets` must be a whole number from 1 to 360",
        ),
        (
            "?buckets=many",
            "`buckets` must be a whole number from 1 to 360",
        ),
        (
            "?bucket_seconds=1",
            "`bucket_seconds` must be a whole number from 10 to 3600",
        ),
        (
            "?buckets=360&bucket_seconds=3600",
            "`buckets` × `bucket_seconds` must be at most 604800 seconds",
        ),
        ("?range=day", "unknown field `range`"),
    ] {
        let res = get(&auditor, query).await.unwrap();
        assert_eq!(res.status(), 400, "{query}");
        let body: Value = res.json().await.unwrap();
        assert_eq!(body["code"], "invalid_request", "{query}: {body}");
        let error = body["error"].as_str().unwrap();
        assert!(error.contains(says), "{query}: {error}");
    }

    // An agent may not read the audit log, so not its activity either.
    let res = get(&agent, "").await.unwrap();
    assert_eq!(res.status(), 403);
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["code"], "forbidden", "{body}");
}
both_backends!(activity_counts_what_the_log_holds);
