//! The API's OpenAPI document against a running server: served without credentials, and
//! every documented operation answered by its handler (never the router's 404 for an
//! unknown path, nor 405 for a method it does not serve there). The other direction (no
//! route under /api that the document lacks) holds by construction, the router being built
//! from the document (`api::try_routes`, tested in `cargo test --lib api::`).

use emisar::server::api::Access;
use emisar::server::api::openapi::{document, operations};
use emisar::server::tokens::Role;
use serde_json::{Value, json};

use crate::harness::app::Options;
use crate::harness::{Backend, spawn_app};

/// The router's answer to a path it does not serve (`portal::not_found`).
fn is_unrouted(status: u16, body: &Value) -> bool {
    status == 404 && body == &json!({"error": "not found"})
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
