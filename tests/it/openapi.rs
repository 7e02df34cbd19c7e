//! The API's OpenAPI document against a running server: served without credentials, and
//! every documented operation answered by its handler (never the router's 404 for an
//! unknown path, nor 405 for a method it does not serve there). The other direction (no
//! route under /api that the document lacks) holds by construction, the router being built
//! from the document (`api::try_routes`, tested in `cargo test --lib api::`). The answers
//! people read most (an approval and its votes, an event, a runner, a session) carry exactly
//! the fields the document gives them.

use emisar::server::http::api::Access;
use emisar::server::http::api::openapi::{document, operations};
use emisar::server::principal::Role;
use serde_json::{Value, json};

use crate::harness::app::Options;
use crate::harness::{Backend, spawn_app};

/// The router's answer to a path it does not serve (`portal::not_found`).
fn is_unrouted(status: u16, body: &Value) -> bool {
    status == 404 && body == &json!({"error": "not found", "code": "not_found"})
}

// One backend suffices: which routes exist does not depend on the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_document_is_what_the_server_serves() {
    let app = spawn_app(Backend::Sqlite, vec![], Options::default()).await;
    let base = app.base_url();
    let admin = app.issue_token("root", Role::Admin).await;
    let http = app.http();

    // Served as JSON, to anyone: it is what a newcomer reads first.
    let res = http
        .get(format!("{base}/api/openapi.json"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert!(
        res.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/json")
    );
    let served: Value = res.json().await.unwrap();
    assert_eq!(&served, document());
    assert_eq!(served["openapi"], "3.1.0");

    let ops = operations();
    assert!(ops.len() >= 20, "{ops:?}");
    for op in ops {
        let path = op
            .path
            .replace("{id}", "0b7e1c2a-5d4f-4e3b-9a8c-1f2e3d4c5b6a");
        let method = reqwest::Method::from_bytes(op.method.as_bytes()).unwrap();
        let mut req = http.request(method.clone(), format!("{base}{path}"));
        if op.access == Access::Door {
            req = req.bearer_auth(&admin);
        }
        if op.spec.get("requestBody").is_some() {
            req = req.json(&json!({}));
        }
        let res = req.send().await.unwrap();
        let status = res.status().as_u16();
        // A stream (`/api/events`) is answered once its headers are: its body is not read.
        let body: Value = if op.id == "approvals_events" {
            Value::Null
        } else {
            res.json().await.unwrap_or(Value::Null)
        };
        assert_ne!(
            status, 405,
            "{} {path} is documented, answered 405",
            op.method
        );
        assert!(
            !is_unrouted(status, &body),
            "{} {path} is documented, but the router does not serve it",
            op.method
        );
        // The door is where the document says it is.
        if op.access == Access::Door {
            let res = http
                .request(method, format!("{base}{path}"))
                .send()
                .await
                .unwrap();
            assert_eq!(res.status(), 401, "{} {path} without a token", op.method);
            // With the code the document's `Error` schema lists for it.
            let body: Value = res.json().await.unwrap_or(Value::Null);
            assert_eq!(
                body["code"], "unauthenticated",
                "{} {path}: {body}",
                op.method
            );
            let codes = &document()["components"]["schemas"]["Error"]["properties"]["code"]["enum"];
            assert!(codes.as_array().unwrap().contains(&body["code"]), "{codes}");
        }
    }

    // And the router's answers that the test above tells apart: an undocumented path is
    // not served, a documented path refuses a method it does not document.
    let res = http
        .get(format!("{base}/api/tokens"))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    let status = res.status().as_u16();
    assert!(is_unrouted(status, &res.json().await.unwrap()));
    let res = http
        .delete(format!("{base}/api/approvals"))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 405);
}

/// The keys of `value` against the properties the document gives schema `name`: none
/// undocumented, and with `exact`, none documented that the answer lacks.
fn assert_documented(name: &str, value: &Value, exact: bool) {
    let schema = &document()["components"]["schemas"][name];
    let documented: std::collections::BTreeSet<&str> = schema["properties"]
        .as_object()
        .unwrap_or_else(|| panic!("schema {name} has no properties"))
        .keys()
        .map(String::as_str)
        .collect();
    let answered: std::collections::BTreeSet<&str> = value
        .as_object()
        .unwrap_or_else(|| panic!("{name}: {value} is not an object"))
        .keys()
        .map(String::as_str)
        .collect();
    let undocumented: Vec<_> = answered.difference(&documented).collect();
    assert!(
        undocumented.is_empty(),
        "{name}: the answer has fields openapi.yaml does not document: {undocumented:?}"
    );
    if exact {
        let missing: Vec<_> = documented.difference(&answered).collect();
        assert!(
            missing.is_empty(),
            "{name}: openapi.yaml documents fields the answer lacks: {missing:?}"
        );
    }
}

/// The answers people and scripts read most carry exactly the fields the document gives
/// them: an approval and its votes, an audit event, a runner, a session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_answers_carry_the_documented_fields() {
    use crate::approvals::{
        call_in_background, finished, restart_args, restart_lab, signed_in, wait_for_pending,
    };
    let (_bin, _record, app) = restart_lab(Backend::Sqlite, Options::default()).await;
    let alice = signed_in(&app, "alice", Role::Approver).await;
    let bob = signed_in(&app, "bob", Role::Approver).await;
    let client = app.mcp_client().await;
    let call = call_in_background(
        &client,
        "linux.systemctl_restart",
        restart_args("the documented fields"),
    );
    let id = wait_for_pending(&alice).await;
    let (status, _) = alice
        .post(
            &format!("/api/approvals/{id}/approve"),
            json!({"note": "fine by me"}),
            true,
        )
        .await;
    assert_eq!(status, 200);
    finished(call).await;

    let (_, approval) = bob.get(&format!("/api/approvals/{id}")).await;
    assert_documented("Approval", &approval, true);
    assert_documented("Vote", &approval["approvals"][0], false);
    assert_eq!(approval["approvals"][0]["note"], "fine by me");
    let (_, listed) = bob.get("/api/approvals").await;
    assert_documented("Approval", &listed["approvals"][0], true);
    let (_, page) = bob.get(&format!("/api/audit?approval_id={id}")).await;
    for event in page["events"].as_array().unwrap() {
        assert_documented("Event", event, true);
    }
    let (_, runners) = bob.get("/api/runners").await;
    assert_documented("Runner", &runners["runners"][0], true);
    let (_, session) = bob.get("/api/session").await;
    assert_documented("Session", &session, true);
    client.cancel().await.unwrap();
}
