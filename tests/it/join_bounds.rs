//! What a join token's holder can reach: only the packs the token grants (never another
//! agent's cluster-scoped calls), and only the networks the operator allows (never loopback,
//! the metadata address or the server itself), checked again on every connection.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use emisar::lab::clock::LabClock;
use emisar::lab::http::serve;
use emisar::lab::scenario;
use emisar::server::audit::AuditFilter;
use emisar::server::config::JoinConfig;
use emisar::server::fleet::{JoinTokenSpec, NameRule};
use serde_json::{Value, json};

use crate::both_backends;
use crate::harness::app::{Options, TestApp};
use crate::harness::{Backend, RunnerSpec, spawn_app};
use crate::mcp_calls::call;

/// A stand-in for a hostile runner: answers its health probe, records every request it gets
/// (method and path), and answers anything else with an invented result.
struct Recorder {
    url: String,
    seen: Arc<Mutex<Vec<String>>>,
}

impl Recorder {
    async fn start() -> Recorder {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let router = axum::Router::new().fallback(move |req: axum::extract::Request| {
            let log = log.clone();
            async move {
                let line = format!("{} {}", req.method(), req.uri().path());
                let healthz = req.uri().path() == "/healthz";
                log.lock().unwrap().push(line);
                if healthz {
                    axum::Json(json!({"status": "ok"}))
                } else {
                    axum::Json(json!({"status": "ok", "output": {"invented": true}}))
                }
            }
        });
        Recorder {
            url: serve(router).await,
            seen,
        }
    }

    fn calls(&self) -> Vec<String> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|l| !l.ends_with("/healthz"))
            .cloned()
            .collect()
    }
}

/// The stock packs' digests, as any runner's `/healthz` or the pack files give them away.
fn stock_digests(names: &[&str]) -> BTreeMap<String, String> {
    let set = emisar::pack::PackSet::load(None).unwrap();
    names
        .iter()
        .map(|n| ((*n).to_owned(), set.pack(n).unwrap().digest.clone()))
        .collect()
}

fn join_body(name: &str, url: &str) -> Value {
    json!({
        "name": name,
        "url": url,
        "labels": {},
        "packs": stock_digests(&["nomad", "consul", "vm"]),
    })
}

async fn nomad_app(backend: Backend, nomad: &str) -> TestApp {
    spawn_app(
        backend,
        vec![RunnerSpec::new("nomad-hvn01").service_with_header(
            "nomad",
            nomad,
            "X-Nomad-Token",
            "nomad-secret",
        )],
        Options::default(),
    )
    .await
}

both_backends!(a_runner_joined_with_a_default_token_never_receives_cluster_calls);
async fn a_runner_joined_with_a_default_token_never_receives_cluster_calls(backend: Backend) {
    {
        let nomad = scenario::nomad("nomad-secret", Arc::new(LabClock::frozen()));
        let nomad = serve(nomad.router()).await;
        let app = nomad_app(backend, &nomad).await;
        let evil = Recorder::start().await;
        // Names that sort before, between and after the configured runner's: the pick must
        // not depend on the name a joiner chooses.
        for name in ["0", "0evil", "Aevil", "nomad-hvn00", "zz-evil"] {
            let (_, token) = app
                .join_token(JoinTokenSpec::once(Duration::from_secs(600)))
                .await;
            let (status, answer) = app.raw_join(&token, &join_body(name, &evil.url)).await;
            assert_eq!(status, 200, "{backend:?} {name}: {answer}");
            assert_eq!(answer["packs"], json!([]), "a default token grants no pack");
            let shown = app.runner_status(name).await.unwrap();
            assert_eq!(shown["packs"], json!([]), "{shown}");
        }
        let client = app.mcp_client().await;
        for _ in 0..3 {
            let res = call(
                &client,
                "nomad.job_resources",
                json!({"job": "traefik", "reason": "what is the cap?"}),
            )
            .await;
            let s = res.structured_content.unwrap();
            assert_eq!(s["runner_chosen_by_server"], true);
            assert_eq!(s["results"][0]["runner"], "nomad-hvn01", "{s}");
            assert_eq!(s["results"][0]["output"]["job_modify_index"], 93, "{s}");
        }
        // Named, the joined runners are not runners of that pack either.
        let res = call(
            &client,
            "nomad.job_resources",
            json!({"job": "traefik", "reason": "r", "runners": ["0evil"]}),
        )
        .await;
        assert!(
            res.is_error == Some(true)
                || res.structured_content.as_ref().unwrap()["error"]["kind"] == "invalid_arguments",
            "{res:?}"
        );
        assert_eq!(evil.calls(), Vec::<String>::new(), "{backend:?}");

        // The audit log says what each join announced and what it serves.
        let joined = app
            .events(AuditFilter {
                kind: Some("runner.joined".into()),
                ..Default::default()
            })
            .await;
        let detail = joined[0].detail.as_ref().unwrap();
        assert_eq!(detail["served"], json!([]), "{detail}");
        assert_eq!(
            detail["not_granted"],
            json!(["consul", "nomad", "vm"]),
            "{detail}"
        );
        client.cancel().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_granted_pack_is_served_and_configured_runners_are_picked_first() {
    let nomad = scenario::nomad("nomad-secret", Arc::new(LabClock::frozen()));
    let nomad = serve(nomad.router()).await;
    let app = nomad_app(Backend::Postgres, &nomad).await;
    let joined = Recorder::start().await;
    let (_, token) = app
        .join_token(JoinTokenSpec {
            name: NameRule::Exact("0granted".into()),
            packs: ["nomad".to_owned()].into(),
            ..JoinTokenSpec::once(Duration::from_secs(600))
        })
        .await;
    let (status, answer) = app
        .raw_join(&token, &join_body("0granted", &joined.url))
        .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["packs"], json!(["nomad"]));
    assert_eq!(
        app.runner_status("0granted").await.unwrap()["packs"],
        json!(["nomad"])
    );

    // Both are designated for nomad and healthy; the configured one is picked, though the
    // joined one's name sorts first.
    let client = app.mcp_client().await;
    let res = call(
        &client,
        "nomad.job_resources",
        json!({"job": "traefik", "reason": "r"}),
    )
    .await;
    let s = res.structured_content.unwrap();
    assert_eq!(s["results"][0]["runner"], "nomad-hvn01", "{s}");
    assert!(joined.calls().is_empty());
    // Named, the granted runner is called.
    call(
        &client,
        "nomad.job_resources",
        json!({"job": "traefik", "reason": "r", "runners": ["0granted"]}),
    )
    .await;
    assert_eq!(joined.calls(), ["POST /v1/call"]);
    client.cancel().await.unwrap();
}

both_backends!(a_join_reaches_only_the_networks_the_operator_allows);
async fn a_join_reaches_only_the_networks_the_operator_allows(backend: Backend) {
    {
        // The server's defaults: private ranges only.
        let app = spawn_app(
            backend,
            vec![],
            Options {
                join: Some(JoinConfig::default()),
                ..Default::default()
            },
        )
        .await;
        let inside = Recorder::start().await;
        let port = inside.url.rsplit(':').next().unwrap().to_owned();
        let server = app.base_url();
        let cases = [
            (inside.url.clone(), 403, "loopback"),
            (
                format!("http://localhost:{port}"),
                403,
                "resolves to an address outside",
            ),
            (
                "http://169.254.169.254/latest/meta-data/".into(),
                403,
                "link-local",
            ),
            (format!("http://[::1]:{port}"), 403, "loopback"),
            ("http://0.0.0.0:80".into(), 403, "not a host address"),
            (
                format!("{server}/api/approvals/x/approve?"),
                400,
                "no credentials, query or fragment",
            ),
            (
                "http://10.0.0.1:7701/#".into(),
                400,
                "no credentials, query or fragment",
            ),
        ];
        for (i, (url, want, why)) in cases.iter().enumerate() {
            let (_, token) = app
                .join_token(JoinTokenSpec::once(Duration::from_secs(600)))
                .await;
            let name = format!("probe-{i}");
            let (status, answer) = app.raw_join(&token, &join_body(&name, url)).await;
            assert_eq!(status, *want, "{backend:?} {url}: {answer}");
            let error = answer["error"].as_str().unwrap();
            assert!(error.contains(why), "{url}: {error}");
            assert!(app.runner_status(&name).await.is_none(), "{url}");
        }
        assert!(
            inside.seen.lock().unwrap().is_empty(),
            "nothing was dialled"
        );

        // Listed, loopback is allowed; the server's own address never is.
        let app = spawn_app(backend, vec![], Options::default()).await;
        let (_, token) = app
            .join_token(JoinTokenSpec::once(Duration::from_secs(600)))
            .await;
        let (status, answer) = app
            .raw_join(&token, &join_body("itself", &app.base_url()))
            .await;
        assert_eq!(status, 403, "{answer}");
        assert!(
            answer["error"].as_str().unwrap().contains("own address"),
            "{answer}"
        );
    }
}

/// A name that resolved inside when the runner joined and outside later (DNS rebinding)
/// reaches nothing: the runner's client checks every address on every connection. Played
/// with two replicas of one database: one allows loopback (the join), one does not (it loads
/// the same runner from the table, and must never connect to it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_connection_is_checked_not_only_the_join() {
    let first = spawn_app(Backend::Postgres, vec![], Options::default()).await;
    let target = Recorder::start().await;
    let port = target.url.rsplit(':').next().unwrap().to_owned();
    let (_, token) = first
        .join_token(JoinTokenSpec {
            name: NameRule::Exact("by-name".into()),
            packs: ["nomad".to_owned()].into(),
            ..JoinTokenSpec::once(Duration::from_secs(600))
        })
        .await;
    let url = format!("http://localhost:{port}");
    let (status, answer) = first.raw_join(&token, &join_body("by-name", &url)).await;
    assert_eq!(status, 200, "{answer}");

    let second = spawn_app(
        Backend::Postgres,
        vec![],
        Options {
            database_url: Some(first.database_url.clone()),
            keys: Some((first.private_key.clone(), first.public_key.clone())),
            join: Some(JoinConfig::default()),
            ..Default::default()
        },
    )
    .await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while second.runner_status("by-name").await.is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "the sync never loaded it"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let before = target.seen.lock().unwrap().len();
    let client = second.mcp_client().await;
    let res = call(
        &client,
        "nomad.job_resources",
        json!({"job": "traefik", "reason": "r", "runners": ["by-name"]}),
    )
    .await;
    let s = res.structured_content.unwrap();
    assert!(s["results"][0]["error"].is_string(), "{s}");
    // The first replica's prober may have probed it meanwhile; the second sent nothing.
    let after: Vec<String> = target.seen.lock().unwrap()[before..].to_vec();
    assert!(
        after.iter().all(|l| l.ends_with("/healthz")),
        "the second replica connected: {after:?}"
    );
    assert!(target.calls().is_empty());
    client.cancel().await.unwrap();
}
