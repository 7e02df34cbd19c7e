//! The OpenID Connect and MCP-authorization modules against a real provider (npm
//! `oidc-provider`, started per test on loopback with its own users, groups and clients):
//! discovery, the key set and its rotation, a real sign-in, real access tokens, the official
//! Python MCP SDK obtaining a token that emisar accepts, and each refusal with its message.

use std::time::Duration;

use emisar::server::oidc::config::{OAuthConfig, OidcConfig, PersonRole};
use emisar::server::oidc::discovery::{DiscoveryError, discover_openid};
use emisar::server::oidc::fetch::client;
use emisar::server::oidc::jwks::JwksCache;
use emisar::server::oidc::jwt::{TokenError, unix_now, verify_signature};
use emisar::server::oidc::login::{Callback, LoginError, OidcLogin};
use emisar::server::oidc::resource::{AccessError, ProtectedResource};
use serde_json::{Value, json};

use crate::harness::oidc::{
    OidcProvider, ProviderSetup, TestKey, payload, query, tamper, with_param,
};
use crate::harness::tools::require;

const PORTAL_CB: &str = "http://127.0.0.1:9/login/oidc/callback";
const AGENT_CB: &str = "http://127.0.0.1:9/agent/callback";
const RESOURCE: &str = "http://127.0.0.1:7700/mcp";
const OTHER_RESOURCE: &str = "http://127.0.0.1:7701/other";

/// Alice approves, Bob is in no mapped group, Carol's groups are a string in a nested claim.
fn setup(trusted: &TestKey) -> ProviderSetup {
    ProviderSetup::default()
        .user("u-alice", "alice", "alice-pw", json!({"preferred_username": "alice", "name": "Alice A.", "groups": ["approvers", "staff"]}))
        .user("u-bob", "bob", "bob-pw", json!({"preferred_username": "bob", "groups": ["staff"]}))
        .web_client("portal", "portal-secret", PORTAL_CB)
        .public_client("desktop-agent", AGENT_CB)
        .service_client("deploy-bot", "bot-secret", json!({}))
        .resource(RESOURCE, "mcp:tools")
        .resource(OTHER_RESOURCE, "other:read")
        .publish(trusted)
}

/// The portal's `[oidc]` section; the client secret is read from `secret_file`, as an
/// operator would give it.
fn oidc_config(p: &OidcProvider, secret_file: &std::path::Path) -> OidcConfig {
    std::fs::write(secret_file, "portal-secret\n").unwrap();
    toml::from_str(&format!(
        r#"
        issuer = "{}"
        client_id = "portal"
        client_secret_file = "{}"
        display_name = "Test provider"
        scopes = ["openid", "profile", "groups"]
        redirect_url = "{PORTAL_CB}"
        [roles]
        approver = ["approvers"]
        auditor = ["auditors"]
        "#,
        p.issuer,
        secret_file.display()
    ))
    .unwrap()
}

fn oauth_config(p: &OidcProvider, extra: &str) -> OAuthConfig {
    toml::from_str(&format!(
        "issuer = \"{}\"\nresource = \"{RESOURCE}\"\n{extra}",
        p.issuer
    ))
    .unwrap()
}

async fn login_client(p: &OidcProvider) -> OidcLogin {
    // The secret is read once, at discovery; the file can go afterwards.
    let dir = tempfile::tempdir().unwrap();
    OidcLogin::discover(oidc_config(p, &dir.path().join("secret")), PORTAL_CB.into())
        .await
        .unwrap_or_else(|e| panic!("{e}\nprovider log:\n{}", p.log()))
}

/// Runs a sign-in through the provider as `user`; returns the callback and the binding.
async fn sign_in(
    p: &OidcProvider,
    rp: &OidcLogin,
    user: &str,
    password: &str,
    edit_url: impl FnOnce(String) -> String,
) -> (Callback, String) {
    let start = rp.start(Some("/approvals")).unwrap();
    let url = edit_url(start.authorization_url);
    let back = p
        .login(&url, user, password, PORTAL_CB)
        .await
        .unwrap_or_else(|e| panic!("{e}\nprovider log:\n{}", p.log()));
    let q = query(&back);
    let cb = Callback {
        code: q.get("code").cloned(),
        state: q.get("state").cloned(),
        iss: q.get("iss").cloned(),
        error: q.get("error").cloned(),
        error_description: q.get("error_description").cloned(),
    };
    (cb, start.browser_binding)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_checks_the_issuer() {
    let p = OidcProvider::start(&setup(&TestKey::new("t"))).await;
    let http = client(Duration::from_secs(10));
    let meta = discover_openid(&http, &p.issuer).await.unwrap();
    assert_eq!(meta.issuer, p.issuer);
    assert_eq!(meta.jwks_uri, format!("{}/jwks", p.issuer));
    assert!(meta.authorization_response_iss_parameter_supported);
    meta.code_flow_endpoints().unwrap();

    // The same document fetched for an issuer spelled differently is refused.
    let e = discover_openid(&http, &format!("{}/", p.issuer))
        .await
        .unwrap_err();
    assert!(matches!(e, DiscoveryError::IssuerMismatch { .. }), "{e}");
    assert!(e.to_string().contains("not the configured issuer"), "{e}");
    let e = discover_openid(&http, &format!("{}/nothing-here", p.issuer))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("HTTP 404"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_set_follows_a_rotation_and_resists_made_up_kids() {
    let p = OidcProvider::start(&setup(&TestKey::new("t"))).await;
    let http = client(Duration::from_secs(10));
    let jwks_uri = format!("{}/jwks", p.issuer);

    // A key set that may refresh whenever a kid is unknown.
    let jwks = JwksCache::new(http.clone(), jwks_uri.clone(), Duration::ZERO);
    let first = p
        .client_credentials("deploy-bot", "bot-secret", RESOURCE, "mcp:tools")
        .await;
    let at = first["access_token"].as_str().unwrap();
    verify_signature(at, &jwks).await.unwrap();
    assert_eq!(jwks.fetch_count(), 1);
    verify_signature(at, &jwks).await.unwrap();
    assert_eq!(jwks.fetch_count(), 1, "a known kid needs no fetch");

    let kids = p.rotate_keys().await;
    assert_eq!(kids.len(), p.kids.len() + 1);
    let second = p
        .client_credentials("deploy-bot", "bot-secret", RESOURCE, "mcp:tools")
        .await;
    let at2 = second["access_token"].as_str().unwrap();
    let new_kid = jsonwebtoken::decode_header(at2).unwrap().kid.unwrap();
    assert_eq!(new_kid, kids[0], "the provider signs with the new key");
    assert!(!p.kids.contains(&new_kid));
    verify_signature(at2, &jwks).await.unwrap();
    assert_eq!(jwks.fetch_count(), 2, "the unknown kid caused one fetch");
    verify_signature(at, &jwks).await.unwrap();

    // A key set with the default 30 s interval: a flood of made-up kids costs no fetch.
    let limited = JwksCache::new(http, jwks_uri, Duration::from_secs(30));
    verify_signature(at2, &limited).await.unwrap();
    let strangers: Vec<String> = (0..50)
        .map(|i| TestKey::new(&format!("made-up-{i}")).mint(&json!({"iss": p.issuer})))
        .collect();
    let results =
        futures::future::join_all(strangers.iter().map(|t| verify_signature(t, &limited))).await;
    for r in results {
        let e = r.unwrap_err();
        assert!(matches!(e, TokenError::UnknownKey { .. }), "{e}");
    }
    assert_eq!(limited.fetch_count(), 1, "made-up kids were rate limited");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_signs_in_through_the_provider() {
    let p = OidcProvider::start(&setup(&TestKey::new("t"))).await;
    let rp = login_client(&p).await;

    let (cb, binding) = sign_in(&p, &rp, "alice", "alice-pw", |u| u).await;
    assert_eq!(cb.iss.as_deref(), Some(p.issuer.as_str()));
    let alice = rp.finish(&cb, Some(&binding)).await.unwrap();
    assert_eq!(alice.identity, "person:u-alice");
    assert_eq!(alice.display_name, "Alice A.");
    assert_eq!(alice.roles, [PersonRole::Approver].into());
    assert_eq!(alice.return_to.as_deref(), Some("/approvals"));
    assert_eq!(alice.issuer, p.issuer);
    let lifetime = alice.session_expires_at - unix_now();
    assert!((43_100..=43_200).contains(&lifetime), "{lifetime}");

    // The same answer again: the state was spent.
    let e = rp.finish(&cb, Some(&binding)).await.unwrap_err();
    assert!(matches!(e, LoginError::UnknownState), "{e}");

    // Bob is in no mapped group: signed in, with no role; and his identity is stable.
    let (cb, binding) = sign_in(&p, &rp, "bob", "bob-pw", |u| u).await;
    let bob = rp.finish(&cb, Some(&binding)).await.unwrap();
    assert_eq!(bob.identity, "person:u-bob");
    assert!(bob.roles.is_empty());
    let (cb, binding) = sign_in(&p, &rp, "bob", "bob-pw", |u| u).await;
    assert_eq!(
        rp.finish(&cb, Some(&binding)).await.unwrap().identity,
        "person:u-bob"
    );

    // The provider itself refuses a wrong password.
    let start = rp.start(None).unwrap();
    let e = p
        .login(&start.authorization_url, "alice", "wrong", PORTAL_CB)
        .await
        .unwrap_err();
    assert!(e.contains("Unknown user or wrong password"), "{e}");
    assert!(!rp.pending().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sign_in_refusals_each_say_why() {
    let p = OidcProvider::start(&setup(&TestKey::new("t"))).await;
    let rp = login_client(&p).await;

    // Wrong nonce: the authorization request carried another nonce than the one kept here.
    let (cb, binding) = sign_in(&p, &rp, "alice", "alice-pw", |u| {
        with_param(&u, "nonce", "attacker-chosen-nonce")
    })
    .await;
    let e = rp.finish(&cb, Some(&binding)).await.unwrap_err();
    assert!(
        matches!(e, LoginError::IdToken(TokenError::NonceMismatch)),
        "{e}"
    );
    assert_eq!(
        e.to_string(),
        "the ID token was refused: the ID token's nonce does not match the nonce sent with this sign-in"
    );

    // Another browser: the binding cookie does not match.
    let (cb, _) = sign_in(&p, &rp, "alice", "alice-pw", |u| u).await;
    let e = rp
        .finish(&cb, Some("someone-elses-cookie"))
        .await
        .unwrap_err();
    assert!(matches!(e, LoginError::BrowserMismatch), "{e}");
    let (cb, _) = sign_in(&p, &rp, "alice", "alice-pw", |u| u).await;
    assert!(matches!(
        rp.finish(&cb, None).await.unwrap_err(),
        LoginError::BrowserMismatch
    ));

    // A mix-up: the answer names another issuer (RFC 9207).
    let (mut cb, binding) = sign_in(&p, &rp, "alice", "alice-pw", |u| u).await;
    cb.iss = Some("https://evil.example.com".into());
    let e = rp.finish(&cb, Some(&binding)).await.unwrap_err();
    assert!(
        e.to_string()
            .contains("names issuer `https://evil.example.com`"),
        "{e}"
    );
    // The provider always names itself, so an answer without `iss` is refused too.
    let (mut cb, binding) = sign_in(&p, &rp, "alice", "alice-pw", |u| u).await;
    cb.iss = None;
    assert!(matches!(
        rp.finish(&cb, Some(&binding)).await.unwrap_err(),
        LoginError::MissingIssuer
    ));

    // A code that is not the one issued: the token endpoint refuses it.
    let (mut cb, binding) = sign_in(&p, &rp, "alice", "alice-pw", |u| u).await;
    cb.code = Some("forged-code".into());
    let e = rp.finish(&cb, Some(&binding)).await.unwrap_err();
    assert!(
        e.to_string()
            .contains("the token endpoint refused the code: invalid_grant"),
        "{e}"
    );

    // A state that was never issued.
    let e = rp
        .finish(
            &Callback {
                state: Some("never-issued".into()),
                code: Some("x".into()),
                ..Default::default()
            },
            Some("b"),
        )
        .await
        .unwrap_err();
    assert!(matches!(e, LoginError::UnknownState), "{e}");

    // The provider's own refusal is passed on.
    let start = rp.start(None).unwrap();
    let e = rp
        .finish(
            &Callback {
                state: Some(start.state),
                iss: Some(p.issuer.clone()),
                error: Some("access_denied".into()),
                error_description: Some("the person said no".into()),
                ..Default::default()
            },
            Some(&start.browser_binding),
        )
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "the provider refused the sign-in: access_denied (the person said no)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn id_token_refusals_each_say_why() {
    let trusted = TestKey::new("test-trusted");
    let p = OidcProvider::start(&setup(&trusted)).await;
    let rp = login_client(&p).await;
    let (cb, binding) = sign_in(&p, &rp, "bob", "bob-pw", |u| u).await;
    let real = rp.finish(&cb, Some(&binding)).await.unwrap();
    let verifier = emisar::server::oidc::id_token::IdTokenVerifier {
        issuer: p.issuer.clone(),
        client_id: "portal".into(),
        leeway_secs: 60,
        jwks: rp.jwks().clone(),
    };
    let nonce = payload(&real.id_token)["nonce"]
        .as_str()
        .unwrap()
        .to_owned();
    let now = unix_now();
    verifier.verify(&real.id_token, &nonce, now).await.unwrap();

    // Tampered: Bob adds himself to the approvers in a real token.
    let tampered = tamper(&real.id_token, |c| c["groups"] = json!(["approvers"]));
    let e = verifier.verify(&tampered, &nonce, now).await.unwrap_err();
    assert!(matches!(e, TokenError::BadSignature), "{e}");
    assert_eq!(
        e.to_string(),
        "the token's signature does not verify (it was altered, or not signed by the provider)"
    );

    // Minted with a key the provider publishes: only the claim under test is wrong.
    let claims = |edit: &dyn Fn(&mut Value)| {
        let mut c = json!({"iss": p.issuer, "aud": "portal", "sub": "u-bob", "nonce": nonce,
                           "iat": now, "exp": now + 300});
        edit(&mut c);
        c
    };
    verifier
        .verify(&trusted.mint(&claims(&|_| {})), &nonce, now)
        .await
        .expect("a correct token minted with the published test key passes");
    let cases: Vec<(Value, &str)> = vec![
        (
            claims(&|c| c["iss"] = json!("http://127.0.0.1:1")),
            "the token was issued by `http://127.0.0.1:1`, not by the configured issuer",
        ),
        (
            claims(&|c| {
                c["exp"] = json!(now - 3600);
                c["iat"] = json!(now - 7200);
            }),
            "the token expired at",
        ),
        (
            claims(&|c| c["aud"] = json!("another-client")),
            "the token is for audience [\"another-client\"], not for `portal`",
        ),
        (
            claims(&|c| c["nonce"] = json!("other")),
            "the ID token's nonce does not match",
        ),
        (
            claims(&|c| c["nbf"] = json!(now + 3600)),
            "the token is not valid before",
        ),
    ];
    for (c, want) in cases {
        let e = verifier
            .verify(&trusted.mint(&c), &nonce, now)
            .await
            .unwrap_err();
        assert!(e.to_string().contains(want), "{e} does not say {want}");
    }

    // Signed by a key the provider never published.
    let stranger = TestKey::new("stranger");
    let e = verifier
        .verify(&stranger.mint(&claims(&|_| {})), &nonce, now)
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "the token is signed by key `stranger`, which is not in the provider's key set"
    );
    // A token that names a published kid but is signed by another key.
    let impostor = TestKey::new("test-trusted");
    let e = verifier
        .verify(&impostor.mint(&claims(&|_| {})), &nonce, now)
        .await
        .unwrap_err();
    assert!(matches!(e, TokenError::BadSignature), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_tokens_for_emisar_and_nothing_else() {
    let trusted = TestKey::new("test-trusted");
    let p = OidcProvider::start(&setup(&trusted)).await;
    let rs = ProtectedResource::discover(oauth_config(
        &p,
        "on_behalf_of_claim = \"preferred_username\"\nrequired_scope = \"mcp:tools\"",
    ))
    .await
    .unwrap_or_else(|e| panic!("{e}\nprovider log:\n{}", p.log()));
    let now = unix_now();

    // A headless agent: client credentials with the resource indicator.
    let cc = p
        .client_credentials("deploy-bot", "bot-secret", RESOURCE, "mcp:tools")
        .await;
    let token = cc["access_token"].as_str().unwrap();
    assert_eq!(payload(token)["aud"], RESOURCE);
    let agent = rs.authenticate(token, now).await.unwrap();
    assert_eq!(agent.agent, "deploy-bot");
    assert_eq!(agent.on_behalf_of, None);
    assert_eq!(agent.scopes, ["mcp:tools"]);

    // An agent in Alice's desktop client: authorization code + PKCE with the resource.
    let verifier = "a-verifier-of-at-least-forty-three-characters-0123456789";
    let mut auth = reqwest::Url::parse(&format!("{}/auth", p.issuer)).unwrap();
    auth.query_pairs_mut()
        .append_pair("client_id", "desktop-agent")
        .append_pair("response_type", "code")
        .append_pair("redirect_uri", AGENT_CB)
        .append_pair("scope", "mcp:tools")
        .append_pair("resource", RESOURCE)
        .append_pair("state", "s")
        .append_pair(
            "code_challenge",
            &emisar::server::oidc::login::pkce_challenge(verifier),
        )
        .append_pair("code_challenge_method", "S256");
    let back = p
        .login(auth.as_str(), "alice", "alice-pw", AGENT_CB)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", p.log()));
    let code = query(&back)["code"].clone();
    let answer = p
        .exchange_public("desktop-agent", &code, AGENT_CB, verifier, RESOURCE)
        .await;
    let agent = rs
        .authenticate(answer["access_token"].as_str().unwrap(), now)
        .await
        .unwrap();
    assert_eq!(agent.agent, "desktop-agent");
    assert_eq!(agent.on_behalf_of.as_deref(), Some("person:alice"));
    assert_eq!(agent.subject.as_deref(), Some("u-alice"));

    // A real token for another resource.
    let other = p
        .client_credentials("deploy-bot", "bot-secret", OTHER_RESOURCE, "other:read")
        .await;
    let e = rs
        .authenticate(other["access_token"].as_str().unwrap(), now)
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        format!("the token is for audience [\"{OTHER_RESOURCE}\"], not for `{RESOURCE}`")
    );
    assert_eq!(e.oauth_error(), "invalid_token");

    // Minted with the published key: expired, wrong issuer, no scope.
    let base = json!({"iss": p.issuer, "aud": RESOURCE, "client_id": "deploy-bot",
                      "scope": "mcp:tools", "iat": now, "exp": now + 300});
    let mint = |edit: &dyn Fn(&mut Value)| {
        let mut c = base.clone();
        edit(&mut c);
        trusted.mint(&c)
    };
    rs.authenticate(&mint(&|_| {}), now).await.unwrap();
    for (token, want) in [
        (
            mint(&|c| c["exp"] = json!(now - 120)),
            "the token expired at",
        ),
        (
            mint(&|c| c["iss"] = json!("http://127.0.0.1:1")),
            "not by the configured issuer",
        ),
        (
            mint(&|c| c["scope"] = json!("other:read")),
            "does not carry the required scope `mcp:tools`",
        ),
        (
            mint(&|c| c["client_id"] = json!("a b")),
            "the token cannot name an agent",
        ),
    ] {
        let e = rs.authenticate(&token, now).await.unwrap_err();
        assert!(e.to_string().contains(want), "{e} does not say {want}");
    }
    let e = rs
        .authenticate(&TestKey::new("stranger").mint(&base), now)
        .await
        .unwrap_err();
    assert!(
        matches!(e, AccessError::Token(TokenError::UnknownKey { .. })),
        "{e}"
    );
    let e = rs
        .authenticate(&tamper(token, |c| c["client_id"] = json!("admin-bot")), now)
        .await
        .unwrap_err();
    assert!(
        matches!(e, AccessError::Token(TokenError::BadSignature)),
        "{e}"
    );

    // What /mcp will serve and answer.
    let doc = serde_json::to_value(rs.metadata_document()).unwrap();
    assert_eq!(
        doc,
        json!({"resource": RESOURCE, "authorization_servers": [p.issuer],
               "scopes_supported": ["mcp:tools"], "bearer_methods_supported": ["header"],
               "resource_name": "emisar"})
    );
    assert_eq!(
        rs.challenge(None),
        "Bearer resource_metadata=\"http://127.0.0.1:7700/.well-known/oauth-protected-resource/mcp\", scope=\"mcp:tools\""
    );
}

/// The official Python MCP SDK runs its OAuth flow (`--probe`: emisar's 401 challenge and
/// metadata document come from `ProtectedResource`, everything else is the real provider) and
/// the token it obtains is one `ProtectedResource` accepts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_obtains_a_token_emisar_accepts() {
    let python = require("venv/bin/python");
    let p = OidcProvider::start(&setup(&TestKey::new("t"))).await;
    let rs = ProtectedResource::discover(oauth_config(
        &p,
        "on_behalf_of_claim = \"preferred_username\"",
    ))
    .await
    .unwrap();
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_python_oauth_client.py");
    let doc = serde_json::to_string(&rs.metadata_document()).unwrap();
    let challenge = rs.challenge(None);
    for grant in [
        vec![
            "--grant",
            "client_credentials",
            "--client-id",
            "deploy-bot",
            "--client-secret",
            "bot-secret",
        ],
        vec![
            "--grant",
            "authorization_code",
            "--client-id",
            "desktop-agent",
            "--auth-method",
            "none",
            "--redirect-uri",
            AGENT_CB,
            "--username",
            "alice",
            "--password",
            "alice-pw",
        ],
    ] {
        let out = tokio::process::Command::new(&python)
            .arg(&script)
            .args(["--probe", "--url", RESOURCE, "--issuer", &p.issuer])
            .args(["--challenge", &challenge, "--resource-metadata", &doc])
            .args(&grant)
            .output()
            .await
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "python oauth client ({grant:?}) failed: {stdout}\n{}\nprovider log:\n{}",
            String::from_utf8_lossy(&out.stderr),
            p.log()
        );
        let v: Value = serde_json::from_str(stdout.trim()).unwrap();
        let requests = v["requests"].as_array().unwrap();
        // The SDK followed the challenge to the metadata, then to the provider.
        assert_eq!(
            v["resource_metadata_url"],
            "http://127.0.0.1:7700/.well-known/oauth-protected-resource/mcp"
        );
        let token_request = requests
            .iter()
            .find(|r| r["url"] == format!("{}/token", p.issuer))
            .unwrap_or_else(|| panic!("no token request in {v}"));
        assert_eq!(token_request["form"]["resource"], RESOURCE, "{v}");
        let agent = rs
            .authenticate(v["access_token"].as_str().unwrap(), unix_now())
            .await
            .unwrap();
        if grant[1] == "client_credentials" {
            assert_eq!(agent.agent, "deploy-bot");
            assert_eq!(agent.on_behalf_of, None);
        } else {
            assert_eq!(agent.agent, "desktop-agent");
            assert_eq!(agent.on_behalf_of.as_deref(), Some("person:alice"));
        }
    }
}
