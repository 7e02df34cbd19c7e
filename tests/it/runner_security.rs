//! The runner accepts only calls the server signed, for itself, once, unexpired, matching the
//! request and its own packs, with arguments its own schema accepts. Each refusal is checked
//! by talking to a real runner over HTTP with hand-made tokens.

use emisar::pack::PackSet;
use emisar::protocol::signing::{CallClaims, CallSigner, HealthClaims, ISSUER, Purpose, now};
use emisar::protocol::{CallRequest, Mode};
use emisar::server::principal::Role;
use serde_json::{Value, json};

use crate::harness::app::Options;
use crate::harness::{Backend, RunnerSpec, spawn_app};
use crate::mcp_calls::fixtures_dir;

struct Fixture {
    signer: CallSigner,
    url: String,
    pack_sha256: String,
    http: reqwest::Client,
}

impl Fixture {
    fn claims(&self, args: &Value) -> CallClaims {
        let t = now();
        CallClaims {
            iss: ISSUER.into(),
            aud: "node-1".into(),
            iat: t,
            exp: t + 30,
            purpose: Purpose::Call,
            jti: uuid::Uuid::new_v4().to_string(),
            call_id: "test".into(),
            tool: "testkit.echo".into(),
            request_sha256: CallRequest {
                tool: "testkit.echo".into(),
                args: args.as_object().unwrap().clone(),
                mode: Mode::Execute,
                preview: None,
                preview_seal: None,
                raw: false,
                approval: None,
                witnessed: None,
                secret_salt: None,
                wave: None,
                decision: None,
                grant: None,
            }
            .digest(),
            pack_sha256: self.pack_sha256.clone(),
            approval_id: None,
            lowered_by_policy: None,
        }
    }

    async fn post(&self, token: Option<&str>, tool: &str, args: &Value) -> (u16, Value) {
        let mut req = self
            .http
            .post(format!("{}/v1/call", self.url))
            .json(&json!({"tool": tool, "args": args}));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let res = req.send().await.unwrap();
        (res.status().as_u16(), res.json().await.unwrap())
    }
}

#[tokio::test]
async fn runner_refuses_every_call_it_should() {
    let app = spawn_app(
        Backend::Sqlite,
        vec![RunnerSpec::new("node-1")],
        Options {
            packs_dir: Some(fixtures_dir()),
            ..Default::default()
        },
    )
    .await;
    let packs = PackSet::load(Some(&fixtures_dir())).unwrap();
    let f = Fixture {
        signer: CallSigner::from_file(&app.private_key).unwrap(),
        url: app.runner_urls["node-1"].clone(),
        pack_sha256: packs.pack("testkit").unwrap().digest.clone(),
        http: reqwest::Client::new(),
    };
    let args = json!({"word": "hello"});
    let sign = |c: &CallClaims| f.signer.sign(c).unwrap();

    // A good call runs, once.
    let good = sign(&f.claims(&args));
    let (status, body) = f.post(Some(&good), "testkit.echo", &args).await;
    assert_eq!((status, &body["status"]), (200, &json!("ok")), "{body}");
    assert_eq!(body["output"], json!({"said": "hello"}));
    let (status, body) = f.post(Some(&good), "testkit.echo", &args).await;
    assert_eq!(status, 409, "{body}");
    assert!(body["error"].as_str().unwrap().contains("already used"));

    let refusals: Vec<(&str, Option<String>, Value, u16, &str)> = vec![
        (
            "no token",
            None,
            args.clone(),
            401,
            "signed call token is required",
        ),
        (
            "another runner",
            Some(sign(&CallClaims {
                aud: "node-2".into(),
                ..f.claims(&args)
            })),
            args.clone(),
            401,
            "InvalidAudience",
        ),
        (
            "expired",
            Some(sign(&CallClaims {
                iat: now() - 200,
                exp: now() - 100,
                ..f.claims(&args)
            })),
            args.clone(),
            401,
            "Expired",
        ),
        (
            "too long-lived",
            Some(sign(&CallClaims {
                exp: now() + 3600,
                ..f.claims(&args)
            })),
            args.clone(),
            401,
            "more than the 60 s",
        ),
        (
            "other issuer",
            Some(sign(&CallClaims {
                iss: "mallory".into(),
                ..f.claims(&args)
            })),
            args.clone(),
            401,
            "InvalidIssuer",
        ),
        (
            "changed arguments",
            Some(sign(&f.claims(&args))),
            json!({"word": "other"}),
            401,
            "another request",
        ),
        (
            "other pack version",
            Some(sign(&CallClaims {
                pack_sha256: "0".repeat(64),
                approval_id: None,
                ..f.claims(&args)
            })),
            args.clone(),
            409,
            "differs between server",
        ),
        (
            "invalid argument",
            Some(sign(&f.claims(&json!({"word": "-rf /"})))),
            json!({"word": "-rf /"}),
            400,
            "`word`",
        ),
    ];
    for (what, token, body_args, want_status, want_text) in refusals {
        let (status, body) = f.post(token.as_deref(), "testkit.echo", &body_args).await;
        assert_eq!(status, want_status, "{what}: {body}");
        let error = body["error"].as_str().unwrap_or_default();
        assert!(
            error.contains(want_text),
            "{what}: expected {want_text:?} in {error:?}"
        );
    }

    // A token signed by some other key.
    let (other_private, _) = emisar::protocol::signing::generate_keypair().unwrap();
    let forged = CallSigner::from_pem(&other_private)
        .unwrap()
        .sign(&f.claims(&args))
        .unwrap();
    let (status, body) = f.post(Some(&forged), "testkit.echo", &args).await;
    assert_eq!(status, 401, "{body}");
    assert!(body["error"].as_str().unwrap().contains("InvalidSignature"));

    // A token for one tool cannot run another.
    let token = sign(&f.claims(&json!({})));
    let (status, body) = f.post(Some(&token), "testkit.touch", &json!({})).await;
    assert_eq!(status, 401, "{body}");
}

/// A runner's `/healthz` answers liveness to anyone and its details (name, pack digests,
/// allowlists) only with a health token the server signed for it. A call token, a health
/// token for another runner or under another key reads nothing, and a health token runs no
/// call. The server's prober carries the token: its view of the runner has the allowlists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_shows_its_details_only_to_the_server() {
    let app = spawn_app(
        Backend::Sqlite,
        vec![RunnerSpec::new("node-1").allow("units", &["nginx"])],
        Options {
            packs_dir: Some(fixtures_dir()),
            probe_interval_ms: Some(200),
            ..Default::default()
        },
    )
    .await;
    let packs = PackSet::load(Some(&fixtures_dir())).unwrap();
    let f = Fixture {
        signer: CallSigner::from_file(&app.private_key).unwrap(),
        url: app.runner_urls["node-1"].clone(),
        pack_sha256: packs.pack("testkit").unwrap().digest.clone(),
        http: reqwest::Client::new(),
    };
    let health = |token: Option<String>| {
        let req = f.http.get(format!("{}/healthz", f.url));
        let req = match token {
            Some(t) => req.bearer_auth(t),
            None => req,
        };
        async move {
            let res = req.send().await.unwrap();
            (res.status().as_u16(), res.json::<Value>().await.unwrap())
        }
    };

    // A stranger learns that the runner is up, and nothing else.
    assert_eq!(health(None).await, (200, json!({"status": "ok"})));

    // The server's health token reads the details.
    let token = f.signer.sign(&HealthClaims::for_runner("node-1")).unwrap();
    let (status, body) = health(Some(token.clone())).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["name"], "node-1", "{body}");
    assert_eq!(body["packs"]["testkit"], json!(f.pack_sha256), "{body}");
    assert_eq!(body["allowlists"]["units"], json!(["nginx"]), "{body}");

    let other = tempfile::tempdir().unwrap();
    let (other_key, other_pub) = (other.path().join("k"), other.path().join("p"));
    emisar::protocol::signing::write_keypair(&other_key, &other_pub).unwrap();
    let forger = CallSigner::from_file(&other_key).unwrap();
    let args = json!({"word": "hello"});
    let refused = [
        (
            "a call token",
            f.signer.sign(&f.claims(&args)).unwrap(),
            "the token is a call token, not a health token",
        ),
        (
            "another runner's health token",
            f.signer.sign(&HealthClaims::for_runner("node-2")).unwrap(),
            "InvalidAudience",
        ),
        (
            "a health token under another key",
            forger.sign(&HealthClaims::for_runner("node-1")).unwrap(),
            "InvalidSignature",
        ),
        ("not a token", "x.y.z".to_owned(), "the token is invalid"),
    ];
    for (what, token, why) in refused {
        let (status, body) = health(Some(token)).await;
        assert_eq!(status, 401, "{what}: {body}");
        let error = body["error"].as_str().unwrap_or_default();
        assert!(error.contains(why), "{what}: {body}");
        for detail in ["name", "packs", "allowlists"] {
            assert!(body.get(detail).is_none(), "{what} read `{detail}`: {body}");
        }
    }

    // A health token runs nothing.
    let (status, body) = f.post(Some(&token), "testkit.echo", &args).await;
    assert_eq!(status, 401, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("the token is a health token, not a call token"),
        "{body}"
    );

    // The prober authenticates: the server holds the runner's allowlists and a good heartbeat.
    let admin = app.issue_token("ops-admin", Role::Admin).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let api: Value = app
            .http()
            .get(format!("{}/api/runners", app.base_url()))
            .bearer_auth(&admin)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let runner = &api["runners"][0];
        if runner["allowlists"]["units"] == json!(["nginx"]) && runner["heartbeat_ok"] == true {
            assert_eq!(runner["last_error"], Value::Null, "{api}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the prober never read the runner's details: {api}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}
