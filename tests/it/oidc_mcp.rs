//! `/mcp` as an OAuth 2.1 protected resource, wired in with `[oauth]` and a real authorization
//! server (npm `oidc-provider`, started per test): a request without a token gets the 401 whose
//! challenge points to the RFC 9728 metadata, served at both well-known paths; the official
//! Python MCP SDK follows it, obtains a token with the resource indicator (client credentials
//! for a headless agent, authorization code for an agent in a person's client) and calls
//! `traefik.ping` on a real Traefik, audited under the agent the token names; a token for
//! another audience, an expired one and one signed by an unknown key are refused with 401;
//! emisar's own `emt_` tokens keep working next to them; and a person may not approve what an
//! agent asked for on their behalf.

use std::collections::BTreeMap;

use emisar::server::audit::AuditFilter;
use emisar::server::oidc::jwt::unix_now;
use emisar::server::principal::Role;
use rmcp::model::CallToolRequestParams;
use serde_json::{Value, json};

use crate::approvals::{call_in_background, finished, restart_args, restarts, wait_for_pending};
use crate::harness::oidc::TestKey;
use crate::harness::tools::{mcp_client, require};
use crate::mcp_calls::{call, traefik_with_dead_backends};
use crate::oidc_portal::{
    DESKTOP_AGENT, DESKTOP_CALLBACK, HEADLESS_AGENT, HEADLESS_SECRET, OTHER_RESOURCE, Spec, World,
};

/// People are named by `preferred_username` both at sign-in and in an agent's token, so the
/// person an agent acts for is the same `person:<name>` who would approve.
const OIDC: &str = "identity_claim = \"preferred_username\"";
const OAUTH: &str = "scopes_supported = [\"mcp:tools\"]\nrequired_scope = \"mcp:tools\"\non_behalf_of_claim = \"preferred_username\"";
const SCOPE: &str = "mcp:tools";

async fn world(traefik_url: Option<String>) -> World {
    World::start(Spec {
        oidc_extra: OIDC.into(),
        oauth_extra: Some(OAUTH.into()),
        traefik_url,
        ..Default::default()
    })
    .await
}

/// A client-credentials access token for the headless agent, for emisar.
async fn headless_token(w: &World) -> String {
    let mcp = format!("{}/mcp", w.base());
    w.p()
        .client_credentials(HEADLESS_AGENT, HEADLESS_SECRET, &mcp, SCOPE)
        .await["access_token"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// An MCP `initialize` POST to `/mcp`, with `token` as the bearer when given.
async fn initialize(mcp: &str, token: Option<&str>) -> reqwest::Response {
    let mut req = reqwest::Client::new()
        .post(mcp)
        .header("accept", "application/json, text/event-stream")
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                      "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                                 "clientInfo": {"name": "probe", "version": "0"}}}));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    req.send().await.unwrap()
}

/// An access token for the desktop agent acting for `user` (authorization code + PKCE with
/// emisar's resource indicator, the person's login at the provider scripted).
async fn desktop_token(w: &World, user: &str, password: &str) -> String {
    let verifier = "a-verifier-of-at-least-forty-three-characters-0123456789";
    let resource = format!("{}/mcp", w.base());
    let mut auth = reqwest::Url::parse(&format!("{}/auth", w.issuer)).unwrap();
    auth.query_pairs_mut()
        .append_pair("client_id", DESKTOP_AGENT)
        .append_pair("response_type", "code")
        .append_pair("redirect_uri", DESKTOP_CALLBACK)
        .append_pair("scope", SCOPE)
        .append_pair("resource", &resource)
        .append_pair("state", "s")
        .append_pair(
            "code_challenge",
            &emisar::server::oidc::login::pkce_challenge(verifier),
        )
        .append_pair("code_challenge_method", "S256");
    let mut jar = BTreeMap::new();
    let back = w
        .p()
        .login_keeping(&mut jar, auth.as_str(), user, password, DESKTOP_CALLBACK)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", w.p().log()));
    let code = back
        .query_pairs()
        .find(|(k, _)| k == "code")
        .map(|(_, v)| v.into_owned())
        .unwrap_or_else(|| panic!("no code in {back}"));
    let answer = w
        .p()
        .exchange_public(DESKTOP_AGENT, &code, DESKTOP_CALLBACK, verifier, &resource)
        .await;
    answer["access_token"]
        .as_str()
        .unwrap_or_else(|| panic!("no access token: {answer}"))
        .to_owned()
}

/// Acceptance: without a token, `/mcp` answers 401 with `WWW-Authenticate: Bearer
/// resource_metadata="…"`, and the metadata is served at the path-suffixed and the root
/// well-known path; a token for another audience, an expired one and one signed by a key the
/// provider never published are each refused with 401 and the check named; a client
/// credentials token from the provider is accepted; emisar's own tokens work as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_is_a_protected_resource_next_to_emisar_tokens() {
    let w = world(None).await;
    let base = w.base();
    let mcp = format!("{base}/mcp");
    let metadata_url = format!("{base}/.well-known/oauth-protected-resource/mcp");

    let res = initialize(&mcp, None).await;
    assert_eq!(res.status(), 401);
    assert_eq!(
        res.headers()["www-authenticate"],
        format!("Bearer resource_metadata=\"{metadata_url}\", scope=\"mcp:tools\"").as_str()
    );
    for url in [
        metadata_url.clone(),
        format!("{base}/.well-known/oauth-protected-resource"),
    ] {
        let res = reqwest::get(&url).await.unwrap();
        assert_eq!(res.status(), 200, "{url}");
        let doc: Value = res.json().await.unwrap();
        assert_eq!(
            doc,
            json!({"resource": mcp, "authorization_servers": [w.issuer],
                   "scopes_supported": ["mcp:tools"], "bearer_methods_supported": ["header"],
                   "resource_name": "emisar"}),
            "{url}"
        );
    }

    // Refused tokens: each a 401 naming the check, with the challenge to start again.
    let other = w
        .p()
        .client_credentials(
            HEADLESS_AGENT,
            HEADLESS_SECRET,
            OTHER_RESOURCE,
            "other:read",
        )
        .await["access_token"]
        .as_str()
        .unwrap()
        .to_owned();
    let now = unix_now();
    let claims = |iat: i64, exp: i64| {
        json!({"iss": w.issuer, "aud": mcp, "client_id": HEADLESS_AGENT, "sub": HEADLESS_AGENT,
               "scope": SCOPE, "iat": iat, "exp": exp, "jti": format!("t{exp}")})
    };
    let expired = w.trusted.mint(&claims(now - 7200, now - 3600));
    let unknown_key = TestKey::new("stranger").mint(&claims(now, now + 300));
    for (name, token, want) in [
        (
            "another audience",
            other,
            format!("the token is for audience [\"{OTHER_RESOURCE}\"], not for `{mcp}`"),
        ),
        (
            "expired",
            expired,
            format!("the token expired at {}", now - 3600),
        ),
        (
            "unknown key",
            unknown_key,
            "the token is signed by key `stranger`, which is not in the provider's key set".into(),
        ),
    ] {
        let res = initialize(&mcp, Some(&token)).await;
        assert_eq!(res.status(), 401, "{name}");
        let challenge = res.headers()["www-authenticate"]
            .to_str()
            .unwrap()
            .to_owned();
        assert!(
            challenge.starts_with(&format!(
                "Bearer resource_metadata=\"{metadata_url}\", error=\"invalid_token\", error_description=\""
            )),
            "{name}: {challenge}"
        );
        let body: Value = res.json().await.unwrap();
        let error = body["error"].as_str().unwrap();
        assert!(
            error.starts_with("the access token was refused: ") && error.contains(&want),
            "{name}: {error} does not say {want}"
        );
    }
    // A token signed with a key the provider publishes, but minted here for the right
    // audience, is accepted: the refusals above are the checks, not the key or the minting.
    let good = w.trusted.mint(&claims(now, now + 300));
    assert_eq!(initialize(&mcp, Some(&good)).await.status(), 200);

    // A headless agent with client credentials calls a tool; the audit names it.
    let cc = headless_token(&w).await;
    let bot = mcp_client(&mcp, &cc).await;
    let tools = bot.list_all_tools().await.unwrap();
    assert!(tools.iter().any(|t| t.name == "linux.systemctl_restart"));
    bot.cancel().await.unwrap();

    // emisar's own tokens work next to OAuth; an unknown one is still a 401 with the challenge.
    let own = w.app.mcp_client().await;
    assert!(!own.list_all_tools().await.unwrap().is_empty());
    own.cancel().await.unwrap();
    let res = initialize(&mcp, Some("emt_not-a-real-token")).await;
    assert_eq!(res.status(), 401);
    assert_eq!(
        res.headers()["www-authenticate"],
        format!("Bearer resource_metadata=\"{metadata_url}\", scope=\"mcp:tools\"").as_str()
    );
    let body: Value = res.json().await.unwrap();
    assert_eq!(
        body["error"],
        "the bearer token is unknown, expired or revoked"
    );
}

/// Acceptance: the official Python MCP SDK connects to emisar's `/mcp`, gets the 401,
/// discovers the metadata and the provider, obtains a token with the resource indicator and
/// calls `traefik.ping` on a real Traefik: a headless agent with client credentials (no
/// browser), and an agent in Alice's client with the authorization code flow. The audit log
/// names each agent from its token, and the second's calls name Alice as the person it acted
/// for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_calls_traefik_ping_with_an_oauth_token() {
    let python = require("venv/bin/python");
    let (traefik, _dead) = traefik_with_dead_backends().await;
    let w = world(Some(traefik.api_url.clone())).await;
    let mcp = format!("{}/mcp", w.base());
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_python_oauth_client.py");
    for (agent, grant, reason) in [
        (
            HEADLESS_AGENT,
            vec![
                "--grant",
                "client_credentials",
                "--client-id",
                HEADLESS_AGENT,
                "--client-secret",
                HEADLESS_SECRET,
            ],
            "headless: is hvn05's edge up?",
        ),
        (
            DESKTOP_AGENT,
            vec![
                "--grant",
                "authorization_code",
                "--client-id",
                DESKTOP_AGENT,
                "--auth-method",
                "none",
                "--redirect-uri",
                DESKTOP_CALLBACK,
                "--username",
                "alice",
                "--password",
                "alice-pw",
            ],
            "for alice: is hvn05's edge up?",
        ),
    ] {
        let args = json!({"runners": ["hvn05"], "reason": reason}).to_string();
        let out = tokio::process::Command::new(&python)
            .arg(&script)
            .args(["--url", &mcp, "--issuer", &w.issuer])
            .args(&grant)
            .args(["--tool", "traefik.ping", "--args", &args])
            .output()
            .await
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "python oauth client ({agent}) failed: {stdout}\n{}\nprovider log:\n{}",
            String::from_utf8_lossy(&out.stderr),
            w.p().log()
        );
        let v: Value = serde_json::from_str(stdout.trim()).unwrap();
        assert_eq!(v["is_error"], false, "{v}");
        let r = &v["structured_content"]["results"][0];
        assert_eq!(r["runner"], "hvn05", "{v}");
        assert_eq!(
            r["output"],
            json!({"http_status": 200, "body": "OK"}),
            "{v}"
        );
        assert_eq!(v["token_claims"]["aud"], mcp, "{v}");

        let events = w
            .app
            .events(AuditFilter {
                tool: Some("traefik.ping".into()),
                actor: Some(format!("agent:{agent}")),
                ..Default::default()
            })
            .await;
        let seen: Vec<(String, String, Value)> = events
            .iter()
            .map(|e| {
                let d = e.detail.clone().unwrap_or_default();
                (e.kind.clone(), e.actor.clone(), d["on_behalf_of"].clone())
            })
            .collect();
        let person = if agent == DESKTOP_AGENT {
            json!("person:alice")
        } else {
            Value::Null
        };
        assert_eq!(
            seen,
            [
                (
                    "tool.called".into(),
                    format!("agent:{agent}"),
                    person.clone()
                ),
                ("call.executed".into(), format!("agent:{agent}"), person),
            ],
            "{agent}"
        );
    }
    w.app.assert_chain_intact().await;
}

/// An agent acting for Alice asks for a write: Alice, signed in at the portal through the same
/// provider, may not approve it (nor deny it); Carol approves and it runs. The request names
/// the person it was made for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_may_not_approve_what_an_agent_asked_for_on_their_behalf() {
    let w = world(None).await;
    let mcp = format!("{}/mcp", w.base());
    let token = desktop_token(&w, "alice", "alice-pw").await;
    let agent = mcp_client(&mcp, &token).await;
    let call = call_in_background(
        &agent,
        "linux.systemctl_restart",
        restart_args("restart consul for alice"),
    );
    let alice = w.sign_in("alice", "alice-pw").await;
    assert_eq!(alice.get("/api/session").await.1["user"], "person:alice");
    let id = wait_for_pending(&alice).await;
    let (_, row) = alice.get(&format!("/api/approvals/{id}")).await;
    assert_eq!(row["on_behalf_of"], "person:alice", "{row}");
    assert_eq!(row["requester"], "agent:desktop-agent", "{row}");

    let (status, body) = alice.approve(&id).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(
        body["error"],
        "refused: agent `desktop-agent` asked for this on your behalf: someone else must decide"
    );
    assert_eq!(restarts(&w.record), 0);

    let carol = w.sign_in("carol", "carol-pw").await;
    let (status, body) = carol.approve(&id).await;
    assert_eq!(status, 200, "{body}");
    let res = finished(call).await;
    assert_eq!(res.is_error, Some(false), "{res:?}");
    assert_eq!(restarts(&w.record), 1);
    let approved = w.events_of_kind("approval.approved").await;
    assert_eq!(approved.len(), 1);
    assert_eq!(approved[0].actor, "person:carol");
    let requested = w.events_of_kind("approval.requested").await;
    assert_eq!(
        requested[0].detail.as_ref().unwrap()["on_behalf_of"],
        "person:alice"
    );
    w.app.assert_chain_intact().await;
    agent.cancel().await.unwrap();
}

/// An OAuth agent is governed exactly like an emisar-token agent of the same name: the
/// policy's tools for that name (others are unknown to it), and one rate-limit bucket shared
/// by both ways of presenting the name; refusals are audited under `agent:<name>`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oauth_agent_is_governed_like_a_token_agent_of_its_name() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.yaml");
    std::fs::write(
        &policy,
        "agents:\n  deploy-bot:\n    tools: [\"linux.unit_status\"]\n  \"*\":\n    tools: [\"linux.*\", \"traefik.*\"]\n",
    )
    .unwrap();
    let w = World::start(Spec {
        oidc_extra: OIDC.into(),
        oauth_extra: Some(OAUTH.into()),
        policy_file: Some(policy),
        rate_limit: Some((1, 2)),
        ..Default::default()
    })
    .await;
    let mcp = format!("{}/mcp", w.base());
    let bot = mcp_client(&mcp, &headless_token(&w).await).await;
    let names: Vec<String> = bot
        .list_all_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name.to_string())
        .filter(|n| !n.starts_with("emisar."))
        .collect();
    assert_eq!(names, ["linux.unit_status"]);
    // One bucket for the name, whichever way a call comes, and refusals count (so unknown
    // names cannot flood the audit log): the refused call below and one call over OAuth use
    // the burst of two; a third over an emt_ token of the same name is refused. The calls
    // lack a reason, so they stop right after the rate limit, with no runner round trip.
    let same_name = w.app.issue_token(HEADLESS_AGENT, Role::Agent).await;
    let token_bot = mcp_client(&mcp, &same_name).await;
    let refused = bot
        .call_tool(
            CallToolRequestParams::new("linux.systemctl_restart")
                .with_arguments(restart_args("not for you").as_object().unwrap().clone()),
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("unknown tool: linux.systemctl_restart"),
        "{refused}"
    );
    let no_reason = json!({"unit": "consul", "runners": ["hvn05"]});
    let res = call(&bot, "linux.unit_status", no_reason.clone()).await;
    let text = serde_json::to_string(&res.content).unwrap();
    assert!(text.contains("reason"), "{text}");
    let res = call(&token_bot, "linux.unit_status", no_reason).await;
    assert_eq!(res.is_error, Some(true));
    let text = serde_json::to_string(&res.content).unwrap();
    assert!(
        text.contains(
            "rate limited: agent `deploy-bot` may make 1 calls per second (bursts of 2); retry in"
        ),
        "{text}"
    );
    let actors: Vec<String> = w
        .events_of_kind("tool.rejected")
        .await
        .into_iter()
        .map(|e| e.actor)
        .collect();
    assert_eq!(actors.len(), 3, "{actors:?}");
    assert!(actors.iter().all(|a| a == "agent:deploy-bot"), "{actors:?}");
    bot.cancel().await.unwrap();
    token_bot.cancel().await.unwrap();
}
