//! A portal session is refused once it has expired, and a change made with a session's
//! cookie is refused with a wrong CSRF token (another session's, or one altered by a
//! character), not only without one. Both backends.

use emisar::server::principal::Role;
use serde_json::Value;

use crate::approvals::{Portal, add_user};
use crate::both_backends;
use crate::harness::app::{Options, TestApp};
use crate::harness::{Backend, spawn_app};

/// `POST /api/logout` with `portal`'s cookie and `csrf` as its token.
async fn logout_with(portal: &Portal, csrf: &str) -> (u16, Value) {
    let res = reqwest::Client::new()
        .post(format!("{}/api/logout", portal.base))
        .header("cookie", &portal.cookie)
        .header("x-csrf-token", csrf)
        .send()
        .await
        .unwrap();
    (res.status().as_u16(), res.json().await.unwrap())
}

async fn signed_in(app: &TestApp, name: &str) -> Portal {
    let password = add_user(app, name, Role::Approver).await;
    Portal::login(app, name, &password).await
}

async fn a_wrong_csrf_token_changes_nothing(backend: Backend) {
    let app = spawn_app(backend, vec![], Options::default()).await;
    let carol = signed_in(&app, "carol").await;
    let dave = signed_in(&app, "dave").await;
    let mut altered = carol.csrf.clone().into_bytes();
    altered[0] = if altered[0] == b'A' { b'B' } else { b'A' };
    let altered = String::from_utf8(altered).unwrap();
    for (label, token) in [
        ("another session's token", dave.csrf.as_str()),
        ("the token altered by one character", altered.as_str()),
        ("the token cut short", &carol.csrf[..carol.csrf.len() - 1]),
    ] {
        let (status, body) = logout_with(&carol, token).await;
        assert_eq!(status, 403, "{label}: {body}");
        assert!(
            body["error"].as_str().unwrap().contains("CSRF"),
            "{label}: {body}"
        );
        // The session is still there: the logout did not happen.
        let (status, body) = carol.get("/api/session").await;
        assert_eq!(status, 200, "{label}: {body}");
    }
    // With its own token, the same request goes through.
    let (status, body) = logout_with(&carol, &carol.csrf).await;
    assert_eq!(status, 200, "{body}");
    let (status, _) = carol.get("/api/session").await;
    assert_eq!(status, 401);
}
both_backends!(a_wrong_csrf_token_changes_nothing);

async fn an_expired_portal_session_is_refused(backend: Backend) {
    let app = spawn_app(backend, vec![], Options::default()).await;
    let carol = signed_in(&app, "carol").await;
    let dave = signed_in(&app, "dave").await;
    let (status, body) = carol.get("/api/session").await;
    assert_eq!(status, 200, "{body}");
    // Carol's session expired a second ago; Dave's is untouched.
    let past = emisar::server::audit::format_at(chrono::Utc::now() - chrono::Duration::seconds(1));
    emisar::with_pool!(&app.db, pool => sqlx::query(app.db.sql("UPDATE sessions SET expires_at = $1::timestamptz WHERE user_name = $2"))
        .bind(&past).bind("carol").execute(pool).await.map(|_| ())).unwrap();
    let (status, body) = carol.get("/api/session").await;
    assert_eq!(status, 401, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("the session has ended"),
        "{body}"
    );
    let (status, body) = carol.get("/api/approvals").await;
    assert_eq!(status, 401, "{body}");
    let (status, body) = dave.get("/api/session").await;
    assert_eq!(status, 200, "{body}");
}
both_backends!(an_expired_portal_session_is_refused);
