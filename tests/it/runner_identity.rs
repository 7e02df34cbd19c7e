//! A runner's identity, tried as an attacker holding a join token would: tokens are spent
//! (once, or N times) and two joins never share a use; a join never takes over a runner (one
//! from the config, or one that joined) nor gets labels its token does not grant; a join
//! answer with another server's key is refused by the runner and nothing is saved; a runner
//! restarts with its own credential after its join token expired, and not after removal, from
//! its runner.toml alone (the server named there, no token), which `emisar config check`
//! accepts, and a runner.toml that names no server says what to add; a
//! runner serving HTTPS is pinned to its certificate at join and re-pinned when it
//! re-registers with another.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use emisar::server::fleet::{JoinTokenSpec, JoinTokenState, NameRule};
use serde_json::{Value, json};

use crate::harness::app::{Options, TestApp};
use crate::harness::join::{
    run_runner_from_file_to_end, run_runner_to_end, runner_toml, spawn_runner,
    spawn_runner_from_file, state_dir,
};
use crate::harness::tools::{bound_addr, only_output};
use crate::harness::{Backend, RunnerSpec, spawn_app};
use crate::mcp_calls::{call, fixtures_dir};

/// A one-use token that grants the packs these tests' runners serve and are called for.
fn once() -> JoinTokenSpec {
    JoinTokenSpec {
        packs: ["testkit", "traefik", "linux"].map(str::to_owned).into(),
        ..JoinTokenSpec::once(Duration::from_secs(600))
    }
}

fn join_body(name: &str, url: &str) -> Value {
    json!({"name": name, "url": url, "labels": {}, "packs": {}})
}

async fn fixture_app(backend: Backend, runners: Vec<RunnerSpec>, probe_ms: Option<u64>) -> TestApp {
    spawn_app(
        backend,
        runners,
        Options {
            packs_dir: Some(fixtures_dir()),
            probe_interval_ms: probe_ms,
            ..Default::default()
        },
    )
    .await
}

/// Moves a join token's expiry into the past, as time would.
async fn expire(app: &TestApp, id: &str) {
    let past = emisar::server::audit::format_at(chrono::Utc::now() - chrono::Duration::hours(1));
    let sql = app
        .db
        .sql("UPDATE join_tokens SET expires_at = $1::timestamptz WHERE id = $2");
    emisar::with_pool!(app.db, pool => sqlx::query(sql).bind(&past).bind(id).execute(pool).await.map(|_| ())).unwrap();
}

async fn joined_names(app: &TestApp) -> Vec<String> {
    emisar::server::fleet::joined_runners(&app.db)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.name)
        .collect()
}

async fn refusals(app: &TestApp) -> Vec<emisar::server::audit::Event> {
    app.events(emisar::server::audit::AuditFilter {
        kind: Some("runner.join_refused".into()),
        ..Default::default()
    })
    .await
}

async fn join_tokens_are_spent(backend: Backend) {
    let app = fixture_app(backend, vec![], None).await;
    let url = "http://127.0.0.1:9/";
    let mut secrets = Vec::new();

    // One use: the second join with the same token is refused.
    let (once_id, one) = app.join_token(once()).await;
    secrets.push(one.clone());
    let (status, body) = app.raw_join(&one, &join_body("one-a", url)).await;
    assert_eq!(status, 200, "{body}");
    assert!(body["runner_token"].as_str().unwrap().starts_with("emr_"));
    let (status, body) = app.raw_join(&one, &join_body("one-b", url)).await;
    assert_eq!(status, 401, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("used up (1 of 1 joins)"),
        "{body}"
    );

    // N uses: three joins, then refused.
    let (thrice_id, three) = app
        .join_token(JoinTokenSpec {
            max_uses: 3,
            ..once()
        })
        .await;
    secrets.push(three.clone());
    for i in 0..3 {
        let (status, body) = app
            .raw_join(&three, &join_body(&format!("three-{i}"), url))
            .await;
        assert_eq!(status, 200, "join {i}: {body}");
    }
    let (status, body) = app.raw_join(&three, &join_body("three-3", url)).await;
    assert_eq!(status, 401, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("used up (3 of 3"),
        "{body}"
    );

    // Expired, revoked and unknown tokens admit nobody.
    let (expired_id, expired) = app.join_token(once()).await;
    secrets.push(expired.clone());
    expire(&app, &expired_id).await;
    let (status, body) = app.raw_join(&expired, &join_body("late", url)).await;
    assert_eq!(status, 401, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("expired"),
        "{body}"
    );
    let (revoked_id, revoked) = app.join_token(once()).await;
    secrets.push(revoked.clone());
    assert!(
        emisar::server::fleet::revoke_join_token(&app.db, &app.audit, &revoked_id, "test")
            .await
            .unwrap()
    );
    let (status, body) = app.raw_join(&revoked, &join_body("revoked", url)).await;
    assert_eq!(status, 401, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("revoked"),
        "{body}"
    );
    let (status, body) = app
        .raw_join(
            &format!("emj_{}", "B".repeat(43)),
            &join_body("stranger", url),
        )
        .await;
    assert_eq!(status, 401, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("unknown"),
        "{body}"
    );

    assert_eq!(
        joined_names(&app).await,
        ["one-a", "three-0", "three-1", "three-2"]
    );
    let tokens = emisar::server::fleet::list_join_tokens(&app.db)
        .await
        .unwrap();
    let state = |id: &str| {
        let t = tokens.iter().find(|t| t.id == id).unwrap();
        (t.uses, t.max_uses, t.state)
    };
    assert_eq!(state(&once_id), (1, 1, JoinTokenState::UsedUp));
    assert_eq!(state(&thrice_id), (3, 3, JoinTokenState::UsedUp));
    assert_eq!(state(&expired_id), (0, 1, JoinTokenState::Expired));
    assert_eq!(state(&revoked_id), (0, 1, JoinTokenState::Revoked));

    // Every refusal is audited with its reason, and no event holds a token.
    let refused = refusals(&app).await;
    let reasons: Vec<String> = refused
        .iter()
        .map(|e| {
            e.detail.as_ref().unwrap()["reason"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(reasons.len(), 5, "{reasons:?}");
    for all in app.events(Default::default()).await {
        let text = serde_json::to_string(&all).unwrap();
        for token in &secrets {
            let secret = emisar::protocol::JoinToken::parse(token).unwrap();
            assert!(
                !text.contains(secret.secret()),
                "a token is in the audit log: {text}"
            );
        }
    }
    app.assert_chain_intact().await;
}
crate::both_backends!(join_tokens_are_spent);

async fn concurrent_joins_share_no_use(backend: Backend) {
    let app = fixture_app(backend, vec![], None).await;
    let (id, token) = app.join_token(once()).await;
    let racers = (0..8).map(|i| {
        let base = app.base_url();
        let secret = emisar::protocol::JoinToken::parse(&token)
            .unwrap()
            .secret()
            .to_owned();
        tokio::spawn(async move {
            let res = reqwest::Client::new()
                .post(format!("{base}/api/runners/join"))
                .bearer_auth(secret)
                .json(&join_body(&format!("racer-{i}"), "http://127.0.0.1:9/"))
                .send()
                .await
                .unwrap();
            let status = res.status().as_u16();
            (status, res.json::<Value>().await.unwrap())
        })
    });
    let answers: Vec<(u16, Value)> = futures::future::join_all(racers)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let won = answers.iter().filter(|(s, _)| *s == 200).count();
    assert_eq!(won, 1, "{answers:?}");
    for (status, body) in answers.iter().filter(|(s, _)| *s != 200) {
        assert_eq!(*status, 401, "{body}");
        assert!(
            body["error"].as_str().unwrap().contains("used up"),
            "{body}"
        );
    }
    assert_eq!(joined_names(&app).await.len(), 1);
    let tokens = emisar::server::fleet::list_join_tokens(&app.db)
        .await
        .unwrap();
    let t = tokens.iter().find(|t| t.id == id).unwrap();
    assert_eq!((t.uses, t.max_uses), (1, 1));
    assert_eq!(refusals(&app).await.len(), 7);
    // Only the winner is recorded as joined.
    let joined = app
        .events(emisar::server::audit::AuditFilter {
            kind: Some("runner.joined".into()),
            ..Default::default()
        })
        .await;
    assert_eq!(joined.len(), 1, "{joined:?}");
}
crate::both_backends!(concurrent_joins_share_no_use);

/// A TCP listener that counts the connections it is offered (the attacker's "runner").
async fn counting_listener() -> (String, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let hits = Arc::new(AtomicUsize::new(0));
    let counted = hits.clone();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            drop(socket);
        }
    });
    (url, hits)
}

async fn a_join_never_takes_over_a_runner(backend: Backend) {
    // A runner from the server's config, probed every 100 ms.
    let app = fixture_app(
        backend,
        vec![RunnerSpec::new("local").label("role", "edge")],
        Some(100),
    )
    .await;
    let before = app.runner_status("local").await.unwrap();
    let (attacker, hits) = counting_listener().await;
    let (_, token) = app.join_token(once()).await;

    // The configured runner's name: refused, and the runner is as it was.
    let (status, body) = app
        .raw_join(
            &token,
            &json!({"name": "local", "url": attacker, "labels": {}, "packs": {}}),
        )
        .await;
    assert_eq!(status, 409, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("`local` is a runner in the server's config"),
        "{body}"
    );
    // Ten probe intervals: a replaced entry would have been probed at the attacker's URL.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = app.runner_status("local").await.unwrap();
    assert_eq!(after["url"], before["url"]);
    assert_eq!(after["labels"], json!({"role": "edge"}));
    assert_eq!(after["origin"], "config");
    assert!(joined_names(&app).await.is_empty());
    assert_eq!(
        hits.load(Ordering::SeqCst),
        0,
        "the server contacted the attacker's URL"
    );

    // The refusal did not spend the token: it still admits a new name once.
    let (status, body) = app
        .raw_join(&token, &join_body("edge-1", "http://127.0.0.1:7/"))
        .await;
    assert_eq!(status, 200, "{body}");

    // A name that already joined: refused, whatever the token.
    let (_, second) = app.join_token(once()).await;
    let (status, body) = app.raw_join(&second, &join_body("edge-1", &attacker)).await;
    assert_eq!(status, 409, "{body}");
    let error = body["error"].as_str().unwrap();
    assert!(
        error.contains("already joined") && error.contains("emisar runner remove edge-1"),
        "{body}"
    );
    let joined = emisar::server::fleet::joined_runners(&app.db)
        .await
        .unwrap();
    assert_eq!(joined.len(), 1);
    assert_eq!(joined[0].url, "http://127.0.0.1:7/");
    assert_eq!(
        app.runner_status("edge-1").await.unwrap()["url"],
        "http://127.0.0.1:7/"
    );

    // Labels: exactly the token's. Asking for others is refused, naming them.
    let (_, labelled) = app
        .join_token(JoinTokenSpec {
            labels: [("role".to_owned(), "edge".to_owned())].into(),
            ..once()
        })
        .await;
    for (asked, named) in [
        (json!({"role": "db"}), "role=db"),
        (json!({"role": "edge", "dc": "dc9"}), "dc=dc9"),
    ] {
        let (status, body) = app
            .raw_join(
                &labelled,
                &json!({"name": "edge-2", "url": "http://127.0.0.1:7/", "labels": asked, "packs": {}}),
            )
            .await;
        assert_eq!(status, 403, "{body}");
        assert!(body["error"].as_str().unwrap().contains(named), "{body}");
    }
    assert!(app.runner_status("edge-2").await.is_none());
    let (status, body) = app
        .raw_join(&labelled, &join_body("edge-2", "http://127.0.0.1:7/"))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["labels"], json!({"role": "edge"}));
    assert_eq!(
        app.runner_status("edge-2").await.unwrap()["labels"],
        json!({"role": "edge"})
    );

    // Names: a token bound to one name or a pattern admits no other.
    let (_, exact) = app
        .join_token(JoinTokenSpec {
            name: NameRule::Exact("edge-7".into()),
            ..once()
        })
        .await;
    let (status, body) = app.raw_join(&exact, &join_body("edge-8", &attacker)).await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("for runner `edge-7`"),
        "{body}"
    );
    let (_, pattern) = app
        .join_token(JoinTokenSpec {
            name: NameRule::Pattern("edge-*".into()),
            ..once()
        })
        .await;
    let (status, body) = app.raw_join(&pattern, &join_body("db-1", &attacker)).await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("does not match"),
        "{body}"
    );
    let (status, body) = app
        .raw_join(&pattern, &join_body("edge-9", "http://127.0.0.1:7/"))
        .await;
    assert_eq!(status, 200, "{body}");

    assert_eq!(joined_names(&app).await, ["edge-1", "edge-2", "edge-9"]);
    let refused = refusals(&app).await;
    assert_eq!(refused.len(), 6, "{refused:?}");
    assert!(refused.iter().all(|e| {
        !e.detail.as_ref().unwrap()["reason"]
            .as_str()
            .unwrap()
            .is_empty()
    }));
    assert_eq!(
        hits.load(Ordering::SeqCst),
        0,
        "the server contacted the attacker's URL"
    );
    app.assert_chain_intact().await;
}
crate::both_backends!(a_join_never_takes_over_a_runner);

/// A server that answers every join with `key` and counts the joins it saw.
async fn fake_server(key: String) -> (String, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let counted = hits.clone();
    let router = axum::Router::new().route(
        "/api/runners/join",
        axum::routing::post(move || {
            let key = key.clone();
            counted.fetch_add(1, Ordering::SeqCst);
            async move {
                axum::Json(json!({
                    "runner_token": "emr_from-the-middle",
                    "server_public_key": key,
                    "heartbeat_interval_ms": 10_000,
                    "labels": {},
                }))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await });
    (url, hits)
}

fn files_in(dir: &std::path::Path) -> Vec<String> {
    match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect(),
        Err(_) => Vec::new(),
    }
}

async fn a_substituted_key_is_refused(backend: Backend) {
    let app = fixture_app(backend, vec![], None).await;
    let (id, token) = app.join_token(once()).await;
    let (_, intruder) = emisar::protocol::signing::generate_keypair().unwrap();
    let (fake, hits) = fake_server(intruder).await;
    let dir = tempfile::tempdir().unwrap();

    // The token's fingerprint names the real server's key: the answer is refused.
    let config = runner_toml(dir.path(), "edge-1", "");
    let (code, err) = run_runner_to_end(&fake, &config, Some(&token)).await;
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(
            "the server's key does not match the fingerprint in the join token (answered sha256"
        ) && err.contains("someone may be in the middle; nothing was saved"),
        "{err}"
    );
    assert_eq!(hits.load(Ordering::SeqCst), 1);
    assert!(files_in(&state_dir(dir.path(), "edge-1")).is_empty());

    // With server_public_key_file configured, the file is what the answer must match.
    let config = runner_toml(
        dir.path(),
        "edge-2",
        &format!("server_public_key_file = \"{}\"", app.public_key.display()),
    );
    let (code, err) = run_runner_to_end(&fake, &config, Some(&token)).await;
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("the server's key does not match server_public_key_file")
            && err.contains("nothing was saved"),
        "{err}"
    );
    assert_eq!(hits.load(Ordering::SeqCst), 2);
    assert!(files_in(&state_dir(dir.path(), "edge-2")).is_empty());

    // A malformed token is refused before anything is sent.
    let config = runner_toml(dir.path(), "edge-3", "");
    let secret_only = emisar::protocol::JoinToken::parse(&token)
        .unwrap()
        .secret()
        .to_owned();
    let (code, err) = run_runner_to_end(&fake, &config, Some(&secret_only)).await;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("the join token is malformed"), "{err}");
    assert!(
        !err.contains(&secret_only[4..]),
        "the secret was printed: {err}"
    );
    assert_eq!(hits.load(Ordering::SeqCst), 2);

    // The real server never saw the token.
    let tokens = emisar::server::fleet::list_join_tokens(&app.db)
        .await
        .unwrap();
    assert_eq!(tokens.iter().find(|t| t.id == id).unwrap().uses, 0);
}
crate::both_backends!(a_substituted_key_is_refused);

async fn a_runner_restarts_with_its_credential(backend: Backend) {
    use std::os::unix::fs::PermissionsExt;
    let app = fixture_app(backend, vec![], None).await;
    let base = app.base_url();
    let (token_id, token) = app
        .join_token(JoinTokenSpec {
            name: NameRule::Exact("edge-1".into()),
            labels: [("role".to_owned(), "edge".to_owned())].into(),
            ..once()
        })
        .await;
    let dir = tempfile::tempdir().unwrap();
    let state = state_dir(dir.path(), "edge-1");
    let echo = json!({"runners": ["edge-1"], "reason": "is it there?", "word": "hi"});

    let config = runner_toml(dir.path(), "edge-1", "");
    let log = dir.path().join("first.log");
    let runner = spawn_runner(&base, &config, Some(&token), &log);
    app.wait_for_runner("edge-1", &log).await;
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    let credential_path = state.join("credential.json");
    // The server lists the runner as soon as it has answered the join; the runner saves its
    // credential only after it has checked that answer, a moment later.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !credential_path.exists() {
        assert!(
            Instant::now() < deadline,
            "edge-1 joined but saved no credential: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(mode(&state), 0o700);
    assert_eq!(mode(&credential_path), 0o600);
    let credential: Value =
        serde_json::from_str(&std::fs::read_to_string(&credential_path).unwrap()).unwrap();
    assert_eq!(credential["runner"], "edge-1");
    assert_eq!(credential["server"], base.as_str());
    let runner_token = credential["runner_token"].as_str().unwrap().to_owned();
    let client = app.mcp_client().await;
    assert_eq!(
        only_output(&call(&client, "testkit.echo", echo.clone()).await),
        json!({"said": "hi"})
    );
    drop(runner);

    // The join token expires; the runner restarts on another port without it.
    expire(&app, &token_id).await;
    let config = runner_toml(dir.path(), "edge-1", "");
    let log = dir.path().join("second.log");
    let mut runner = spawn_runner(&base, &config, None, &log);
    let new_url = format!(
        "http://{}",
        bound_addr(&mut runner, &log, "runner listening").await
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while app.runner_status("edge-1").await.unwrap()["url"] != new_url.as_str() {
        assert!(
            Instant::now() < deadline,
            "the runner did not re-register: {}",
            std::fs::read_to_string(&log).unwrap()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        only_output(&call(&client, "testkit.echo", echo.clone()).await),
        json!({"said": "hi"})
    );
    let registered = app
        .events(emisar::server::audit::AuditFilter {
            kind: Some("runner.registered".into()),
            ..Default::default()
        })
        .await;
    assert_eq!(registered.len(), 1);
    assert_eq!(registered[0].runner.as_deref(), Some("edge-1"));
    assert_eq!(
        app.runner_status("edge-1").await.unwrap()["labels"],
        json!({"role": "edge"})
    );

    // Removed: its credential stops working, the server forgets it, and a restart says
    // what to do.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_emisar"))
        .args([
            "runner",
            "remove",
            "edge-1",
            "--database",
            &app.database_url,
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop(runner);
    let heartbeat = reqwest::Client::new()
        .post(format!("{base}/api/runners/heartbeat"))
        .bearer_auth(&runner_token)
        .send()
        .await
        .unwrap();
    assert_eq!(heartbeat.status(), 401);
    let (code, err) = run_runner_to_end(&base, &config, None).await;
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("the server refused the credential of runner `edge-1`")
            && err.contains("emisar runner remove edge-1")
            && err.contains("emisar join-token issue --name edge-1"),
        "{err}"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while app.runner_status("edge-1").await.is_some() {
        assert!(
            Instant::now() < deadline,
            "the removed runner is still known"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let res = call(&client, "testkit.echo", echo.clone()).await;
    assert_eq!(res.is_error, Some(true));

    // A new join token lets it join again; the credential is replaced.
    let (_, again) = app
        .join_token(JoinTokenSpec {
            name: NameRule::Exact("edge-1".into()),
            ..once()
        })
        .await;
    let log = dir.path().join("third.log");
    let _runner = spawn_runner(&base, &config, Some(&again), &log);
    app.wait_for_runner("edge-1", &log).await;
    // As above, the runner replaces its credential a moment after the server lists it (the
    // file is replaced whole, by a rename).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let renewed: Value =
            serde_json::from_str(&std::fs::read_to_string(&credential_path).unwrap()).unwrap();
        if renewed["runner_token"] != runner_token.as_str() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "edge-1 joined again but kept its old credential: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        only_output(&call(&client, "testkit.echo", echo).await),
        json!({"said": "hi"})
    );
    client.cancel().await.unwrap();
    app.assert_chain_intact().await;
}
crate::both_backends!(a_runner_restarts_with_its_credential);

/// `emisar config check FILE`: (exit code, stdout).
fn config_check(config: &std::path::Path) -> (i32, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_emisar"))
        .args([
            "config",
            "check",
            "--kind",
            "runner",
            config.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// The operator's path: the runner joins once with `--server` and the token on the command
/// line; the token expires; systemd restarts it with `--config runner.toml` alone. Without
/// `[join] server` in the file the start (and `config check`) name the line to add; with it,
/// `config check` says ok and the runner re-registers with its credential. A runner.toml with
/// the server but neither a credential nor a token says it has not joined yet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joined_runner_restarts_from_its_config_alone() {
    let app = fixture_app(Backend::Sqlite, vec![], None).await;
    let base = app.base_url();
    let (token_id, token) = app
        .join_token(JoinTokenSpec {
            name: NameRule::Exact("edge-1".into()),
            ..once()
        })
        .await;
    let dir = tempfile::tempdir().unwrap();
    let credential_path = state_dir(dir.path(), "edge-1").join("credential.json");
    let echo = json!({"runners": ["edge-1"], "reason": "is it there?", "word": "hi"});

    // First start: the server and the token on the command line only.
    let bare = runner_toml(dir.path(), "edge-1", "");
    let log = dir.path().join("first.log");
    let runner = spawn_runner(&base, &bare, Some(&token), &log);
    app.wait_for_runner("edge-1", &log).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("the server came from --server only")
    {
        assert!(
            Instant::now() < deadline,
            "the runner did not warn that runner.toml names no server: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(credential_path.exists());
    drop(runner);
    expire(&app, &token_id).await;

    // Restarted from the file alone, which names no server: refused, naming the line to add.
    let wanted = format!("server = \"{base}\"");
    let (code, err) = run_runner_from_file_to_end(&bare).await;
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("runner `edge-1` names no server")
            && err.contains(&wanted)
            && err.contains(credential_path.to_str().unwrap()),
        "{err}"
    );
    let (code, out) = config_check(&bare);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains(&wanted), "{out}");

    // With the server in the file (and no token): config check accepts it, and the runner
    // re-registers with its credential although its join token expired.
    let config = runner_toml(
        dir.path(),
        "edge-1",
        &format!("[join]\nserver = \"{base}\"\n"),
    );
    let (code, out) = config_check(&config);
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with("ok: "), "{out}");
    let log = dir.path().join("second.log");
    let mut runner = spawn_runner_from_file(&config, &log);
    let new_url = format!(
        "http://{}",
        bound_addr(&mut runner, &log, "runner listening").await
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while app.runner_status("edge-1").await.unwrap()["url"] != new_url.as_str() {
        assert!(
            Instant::now() < deadline,
            "the runner did not re-register from its config alone: {}",
            std::fs::read_to_string(&log).unwrap()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let log_text = std::fs::read_to_string(&log).unwrap();
    assert!(
        log_text.contains("re-registered with the kept credential")
            && !log_text.contains("the server came from --server only"),
        "{log_text}"
    );
    let client = app.mcp_client().await;
    assert_eq!(
        only_output(&call(&client, "testkit.echo", echo).await),
        json!({"said": "hi"})
    );
    client.cancel().await.unwrap();
    drop(runner);

    // A runner that never joined, with the server but no token: both say what is missing.
    let fresh = runner_toml(
        dir.path(),
        "edge-2",
        &format!("[join]\nserver = \"{base}\"\n"),
    );
    let (code, out) = config_check(&fresh);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("join: runner `edge-2` has no credential for")
            && out.contains("no join token"),
        "{out}"
    );
    let (code, err) = run_runner_from_file_to_end(&fresh).await;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("it has not joined yet"), "{err}");
    app.assert_chain_intact().await;
}

/// The stored pin of runner `name` (NULL: none), straight from the store.
async fn stored_pin(app: &TestApp, name: &str) -> Option<String> {
    let sql = app
        .db
        .sql("SELECT tls_fingerprint FROM runners WHERE name = $1");
    let row: Option<(Option<String>,)> = emisar::with_pool!(&app.db, pool => {
        sqlx::query_as(sql).bind(name).fetch_optional(pool).await.unwrap()
    });
    row.and_then(|(pin,)| pin)
}

/// Identity and TLS together: a runner that serves HTTPS joins with its token and is pinned
/// to its certificate; restarted with another certificate and no token, it re-registers with
/// its credential, the server pins the new certificate, and calls reach it.
async fn a_runner_keeps_its_identity_over_tls(backend: Backend) {
    let app = fixture_app(backend, vec![], None).await;
    let base = app.base_url();
    let (_, token) = app
        .join_token(JoinTokenSpec {
            name: NameRule::Exact("edge-tls".into()),
            ..once()
        })
        .await;
    let dir = tempfile::tempdir().unwrap();
    let tls_toml = |cert: &crate::harness::certs::CertFiles| {
        format!(
            "tls_cert_file = \"{}\"\ntls_key_file = \"{}\"",
            cert.cert.display(),
            cert.key.display()
        )
    };
    let echo = json!({"runners": ["edge-tls"], "reason": "over TLS?", "word": "hi"});

    let first = crate::harness::certs::self_signed(dir.path(), "first");
    let config = runner_toml(dir.path(), "edge-tls", &tls_toml(&first));
    let log = dir.path().join("first.log");
    let mut runner = spawn_runner(&base, &config, Some(&token), &log);
    app.wait_for_runner("edge-tls", &log).await;
    let status = app.runner_status("edge-tls").await.unwrap();
    let bound = bound_addr(&mut runner, &log, "runner listening").await;
    assert_eq!(status["url"], format!("https://{bound}"));
    assert_eq!(
        stored_pin(&app, "edge-tls").await,
        Some(first.fingerprint.to_string())
    );
    let client = app.mcp_client().await;
    assert_eq!(
        only_output(&call(&client, "testkit.echo", echo.clone()).await),
        json!({"said": "hi"})
    );
    drop(runner);

    let second = crate::harness::certs::self_signed(dir.path(), "second");
    let config = runner_toml(dir.path(), "edge-tls", &tls_toml(&second));
    let log = dir.path().join("second.log");
    let _runner = spawn_runner(&base, &config, None, &log);
    let deadline = Instant::now() + Duration::from_secs(60);
    while stored_pin(&app, "edge-tls").await != Some(second.fingerprint.to_string()) {
        assert!(
            Instant::now() < deadline,
            "the runner did not re-register with its new certificate: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The registry follows the table at once on this replica (the re-registration upserts).
    assert_eq!(
        only_output(&call(&client, "testkit.echo", echo).await),
        json!({"said": "hi"})
    );
    let registered = app
        .events(emisar::server::audit::AuditFilter {
            kind: Some("runner.registered".into()),
            ..Default::default()
        })
        .await;
    assert_eq!(
        registered[0].detail.as_ref().unwrap()["tls_fingerprint"],
        json!(second.fingerprint.to_string())
    );
    client.cancel().await.unwrap();
    app.assert_chain_intact().await;
}
crate::both_backends!(a_runner_keeps_its_identity_over_tls);
