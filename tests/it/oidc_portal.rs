//! People sign in to the portal through a real OpenID provider (npm `oidc-provider`, started
//! per test on loopback with its own people, groups and clients), wired into emisar's `[oidc]`:
//! in a real browser (Chromium driven by Playwright, as in portal_browser.rs) and scripted over
//! HTTP. An approver approves an agent's request and the audit log names them by their
//! provider identity; a person in no mapped group can approve nothing; a tampered, wrongly
//! issued, expired or misaddressed ID token and a wrong nonce are each refused at the real
//! callback with a clear message; password login can be switched off; roles follow the
//! provider at the next sign-in; a session ends at its expiry, and the provider ending its
//! session ends emisar's; and a provider that is down when emisar starts is found later while
//! password login keeps working.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use emisar::server::audit::AuditFilter;
use emisar::server::oidc::config::{OAuthConfig, OidcConfig};
use emisar::server::principal::Role;
use serde_json::{Value, json};

use crate::approvals::{
    Portal, add_user, call_in_background, finished, kinds_and_actors, restart_args, restarts,
    systemctl_standin, wait_for_pending,
};
use crate::harness::app::{Options, TestApp};
use crate::harness::oidc::{OidcProvider, ProviderSetup, TestKey, with_param};
use crate::harness::tools::{DeadEndpoint, require};
use crate::harness::{Backend, RunnerSpec, spawn_app};
use crate::portal_browser::{BROWSER_BUDGET, CHROMIUM, Driver, assert_png, require_path};

/// emisar's client at the provider.
pub(crate) const CLIENT: &str = "emisar-portal";
const CLIENT_SECRET: &str = "portal-secret-0123456789";
/// An MCP agent in a person's desktop client (authorization code + PKCE, public client).
pub(crate) const DESKTOP_AGENT: &str = "desktop-agent";
pub(crate) const DESKTOP_CALLBACK: &str = "http://127.0.0.1:33418/callback";
/// A headless agent (client credentials).
pub(crate) const HEADLESS_AGENT: &str = "deploy-bot";
pub(crate) const HEADLESS_SECRET: &str = "deploy-bot-secret";
/// A resource server that is not emisar.
pub(crate) const OTHER_RESOURCE: &str = "http://127.0.0.1:9/other";
const TOOL: &str = "linux.systemctl_restart";

/// What a test world looks like beyond the defaults.
#[derive(Default)]
pub(crate) struct Spec {
    /// Extra lines for `[oidc]` (before its `[roles]` table).
    pub oidc_extra: String,
    /// `[oauth]` with these extra lines, when set.
    pub oauth_extra: Option<String>,
    /// emisar starts before the provider does.
    pub provider_down: bool,
    /// A Traefik API for the runner's `traefik` service.
    pub traefik_url: Option<String>,
    pub policy_file: Option<PathBuf>,
    pub rate_limit: Option<(u32, u32)>,
    pub backend: Option<Backend>,
}

/// A provider, emisar configured for it, and one runner (`hvn05`, with a recording
/// `systemctl` stand-in).
pub(crate) struct World {
    pub provider: Option<OidcProvider>,
    /// The provider's port, held closed while the provider is down.
    provider_hold: Option<DeadEndpoint>,
    pub setup: ProviderSetup,
    pub app: TestApp,
    pub trusted: TestKey,
    pub issuer: String,
    pub record: PathBuf,
    _bin: tempfile::TempDir,
    _secret: tempfile::TempDir,
}

impl World {
    pub async fn start(spec: Spec) -> World {
        // Both addresses are registered before their owners start (the server's URLs at the
        // provider, the provider's issuer in the server's config, possibly before the
        // provider is even up), so both are held on reserved ports until each binds.
        let server_hold = DeadEndpoint::bind_reserved();
        let base = server_hold.url();
        let provider_hold = DeadEndpoint::bind_reserved();
        let issuer = provider_hold.url();
        let provider_port = provider_hold.port;
        let trusted = TestKey::new("test-trusted");
        let setup = ProviderSetup::default()
            .user("u-alice", "alice", "alice-pw", json!({"preferred_username": "alice", "name": "Alice Approver", "groups": ["approvers", "staff"]}))
            .user("u-bob", "bob", "bob-pw", json!({"preferred_username": "bob", "name": "Bob Bystander", "groups": ["staff"]}))
            .user("u-carol", "carol", "carol-pw", json!({"preferred_username": "carol", "name": "Carol", "groups": ["approvers"]}))
            .web_client_with_logout(
                CLIENT,
                CLIENT_SECRET,
                &format!("{base}/login/oidc/callback"),
                &format!("{base}/login/oidc/backchannel-logout"),
            )
            .public_client(DESKTOP_AGENT, DESKTOP_CALLBACK)
            .service_client(HEADLESS_AGENT, HEADLESS_SECRET, json!({}))
            .resource(&format!("{base}/mcp"), "mcp:tools")
            .resource(OTHER_RESOURCE, "other:read")
            .publish(&trusted)
            .on_port(provider_port);
        let (provider, provider_hold) = if spec.provider_down {
            (None, Some(provider_hold))
        } else {
            provider_hold.release();
            (Some(OidcProvider::start(&setup).await), None)
        };
        let secret = tempfile::tempdir().unwrap();
        let secret_file = secret.path().join("client-secret");
        std::fs::write(&secret_file, format!("{CLIENT_SECRET}\n")).unwrap();
        let oidc: OidcConfig = toml::from_str(&format!(
            r#"
            issuer = "{issuer}"
            client_id = "{CLIENT}"
            client_secret_file = "{}"
            display_name = "Test provider"
            scopes = ["openid", "profile", "groups"]
            {}
            [roles]
            approver = ["approvers"]
            auditor = ["auditors"]
            admin = ["admins"]
            "#,
            secret_file.display(),
            spec.oidc_extra
        ))
        .unwrap();
        let oauth: Option<OAuthConfig> = spec.oauth_extra.as_ref().map(|extra| {
            toml::from_str(&format!(
                "issuer = \"{issuer}\"\nresource = \"{base}/mcp\"\n{extra}"
            ))
            .unwrap()
        });
        let bin = tempfile::tempdir().unwrap();
        let record = systemctl_standin(bin.path());
        let mut runner = RunnerSpec::new("hvn05")
            .path_first(bin.path())
            .allow("systemd_units", &["consul", "nomad"]);
        if let Some(url) = &spec.traefik_url {
            runner = runner.service("traefik", url);
        }
        let app = spawn_app(
            spec.backend.unwrap_or(Backend::Sqlite),
            vec![runner],
            Options {
                listen: Some(format!("127.0.0.1:{}", server_hold.release())),
                public_url: Some(base),
                oidc: Some(oidc),
                oauth,
                policy_file: spec.policy_file,
                rate_limit: spec.rate_limit,
                ..Default::default()
            },
        )
        .await;
        World {
            provider,
            provider_hold,
            setup,
            app,
            trusted,
            issuer,
            record,
            _bin: bin,
            _secret: secret,
        }
    }

    /// Starts the provider that was down at the start, on the port emisar was told.
    pub async fn start_provider(&mut self) {
        if let Some(hold) = self.provider_hold.take() {
            hold.release();
        }
        self.provider = Some(OidcProvider::start(&self.setup).await);
    }

    pub fn p(&self) -> &OidcProvider {
        self.provider.as_ref().expect("the provider was started")
    }

    pub fn base(&self) -> String {
        self.app.base_url()
    }

    fn http() -> reqwest::Client {
        reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap()
    }

    /// The browser asks emisar to sign in: the provider URL it is sent to, and the binding
    /// cookie it got.
    pub async fn start_sign_in(&self) -> (String, String) {
        let res = Self::http()
            .get(format!(
                "{}/login/oidc?return_to=%2F%23%2Fapprovals",
                self.base()
            ))
            .send()
            .await
            .unwrap();
        assert_eq!(
            res.status(),
            303,
            "{}",
            res.text().await.unwrap_or_default()
        );
        let location = res.headers()["location"].to_str().unwrap().to_owned();
        let cookie = set_cookie(&res, "emisar_oidc").expect("a binding cookie");
        for attr in [
            "HttpOnly",
            "SameSite=Lax",
            "Path=/login/oidc",
            "Max-Age=600",
        ] {
            assert!(cookie.contains(attr), "{cookie}");
        }
        assert!(
            location.starts_with(&format!("{}/auth?", self.issuer)),
            "{location}"
        );
        (location, cookie_pair(&cookie))
    }

    /// The person logs in at the provider; the URL it sends the browser back to.
    pub async fn at_provider(
        &self,
        authorization_url: &str,
        user: &str,
        password: &str,
        jar: &mut BTreeMap<String, String>,
    ) -> String {
        let callback = format!("{}/login/oidc/callback", self.base());
        self.p()
            .login_keeping(jar, authorization_url, user, password, &callback)
            .await
            .unwrap_or_else(|e| panic!("{e}\nprovider log:\n{}", self.p().log()))
            .to_string()
    }

    /// The browser comes back to emisar's callback with `cookie` (`name=value`).
    pub async fn come_back(&self, callback: &str, cookie: Option<&str>) -> reqwest::Response {
        let mut req = Self::http().get(callback);
        if let Some(c) = cookie {
            req = req.header("cookie", c);
        }
        req.send().await.unwrap()
    }

    /// A whole sign-in, scripted: the person's portal session, and their provider cookies.
    pub async fn sign_in_keeping(
        &self,
        user: &str,
        password: &str,
    ) -> (Portal, BTreeMap<String, String>) {
        let mut jar = BTreeMap::new();
        let (auth, binding) = self.start_sign_in().await;
        let callback = self.at_provider(&auth, user, password, &mut jar).await;
        let res = self.come_back(&callback, Some(&binding)).await;
        let status = res.status();
        let location = res
            .headers()
            .get("location")
            .map(|v| v.to_str().unwrap().to_owned());
        let session = set_cookie(&res, "emisar_session");
        let body = res.text().await.unwrap_or_default();
        assert_eq!(status, 303, "{body}");
        assert_eq!(location.as_deref(), Some("/#/approvals"));
        let session = session.expect("a session cookie");
        for attr in ["HttpOnly", "SameSite=Strict", "Path=/"] {
            assert!(session.contains(attr), "{session}");
        }
        let cookie = cookie_pair(&session);
        let me: Value = reqwest::Client::new()
            .get(format!("{}/api/session", self.base()))
            .header("cookie", &cookie)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let csrf = me["csrf"].as_str().unwrap().to_owned();
        (Portal::with_session(self.base(), cookie, csrf), jar)
    }

    pub async fn sign_in(&self, user: &str, password: &str) -> Portal {
        self.sign_in_keeping(user, password).await.0
    }

    /// Audit events of `kind`, oldest first (the order the audit query returns).
    pub async fn events_of_kind(&self, kind: &str) -> Vec<emisar::server::audit::Event> {
        self.app
            .events(AuditFilter {
                kind: Some(kind.into()),
                ..Default::default()
            })
            .await
    }
}

/// The `Set-Cookie` header that sets cookie `name`.
pub(crate) fn set_cookie(res: &reqwest::Response, name: &str) -> Option<String> {
    res.headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|v| {
            v.starts_with(&format!("{name}="))
                && !v.starts_with(&format!("{name}=;"))
                && !v.contains("Max-Age=0")
        })
        .map(str::to_owned)
}

/// `name=value` of a `Set-Cookie` header.
fn cookie_pair(set_cookie: &str) -> String {
    set_cookie.split(';').next().unwrap().to_owned()
}

/// Acceptance: a person in the `approvers` group signs in through the provider in a real
/// browser (the portal's button, the provider's own login form, back to the portal), sees the
/// agent's pending request appear live and approves it; the audit log names them
/// `person:<subject>`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approver_signs_in_through_the_provider_in_a_real_browser_and_approves() {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let node = require("node/bin/node");
    let chromium = require_path(std::path::Path::new(CHROMIUM));
    require_path(&repo.join("tests/browser/node_modules/playwright-core/package.json"));
    let w = World::start(Spec::default()).await;
    let base = w.base();

    let shots = repo.join("target/portal-e2e-oidc");
    std::fs::create_dir_all(&shots).unwrap();
    for entry in std::fs::read_dir(&shots).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "png") {
            std::fs::remove_file(&path).unwrap();
        }
    }
    let tmp = tempfile::tempdir().unwrap();
    let reason = "consul on hvn05 wedged after the upgrade";
    let mut driver = Driver::spawn(
        &repo,
        &node,
        "tests/browser/portal_e2e.mjs",
        &[
            ("PORTAL_URL", format!("{base}/")),
            ("LOGIN_VIA", "oidc".into()),
            ("PORTAL_USER", "alice".into()),
            ("PORTAL_PASSWORD", "alice-pw".into()),
            ("EXPECT_WHOAMI", "Alice Approver (approver)".into()),
            ("SCREENSHOT_DIR", shots.display().to_string()),
            ("EXPECT_TOOL", TOOL.into()),
            ("EXPECT_REASON_SUBSTRING", reason.into()),
            ("CHROMIUM", chromium.display().to_string()),
            ("TMPDIR", tmp.path().display().to_string()),
        ],
    );
    let client = w.app.mcp_client().await;
    let browser = async {
        let ready = driver.expect_line("READY").await;
        assert_eq!(ready, "READY", "{}", driver.transcript());
        let call = call_in_background(&client, TOOL, restart_args(reason));
        let appeared = driver.expect_json("{\"appeared_ms\": N}").await;
        assert!(appeared["appeared_ms"].is_u64(), "{appeared}");
        let done = driver
            .expect_json("{\"done\": true, \"state\": \"executed\"}")
            .await;
        assert_eq!(
            done,
            json!({"done": true, "state": "executed"}),
            "{}",
            driver.transcript()
        );
        let status = driver.wait_exit().await;
        assert!(
            status.success(),
            "the browser driver exited with {status}\n{}",
            driver.transcript()
        );
        call.await.expect("the agent's call completes")
    };
    let res = match tokio::time::timeout(BROWSER_BUDGET, browser).await {
        Ok(res) => res,
        Err(_) => panic!(
            "the browser test did not finish within {BROWSER_BUDGET:?}\n{}\nprovider log:\n{}",
            driver.transcript(),
            w.p().log()
        ),
    };
    assert_eq!(res.is_error, Some(false), "{res:?}");
    let out = res.structured_content.unwrap();
    assert_eq!(out["approval"]["state"], "executed", "{out}");
    let id = out["approval"]["approval_id"].as_str().unwrap().to_owned();
    assert_eq!(restarts(&w.record), 1, "exactly one restart ran");

    // The audit log names the approver by their provider identity.
    assert_eq!(
        kinds_and_actors(&w.app, &id).await,
        [
            ("tool.called".into(), "agent:test-agent".into()),
            ("approval.requested".into(), "agent:test-agent".into()),
            ("approval.approved".into(), "person:u-alice".into()),
            ("approval.executing".into(), "person:u-alice".into()),
            ("call.executed".into(), "agent:test-agent".into()),
        ]
    );
    let logins = w.events_of_kind("login").await;
    assert_eq!(logins.len(), 1, "{logins:?}");
    assert_eq!(logins[0].actor, "person:u-alice");
    let detail = logins[0].detail.as_ref().unwrap();
    assert_eq!(detail["provider"], w.issuer);
    assert_eq!(detail["roles"], json!(["approver"]));
    w.app.verify_with_cli();
    for name in [
        "01-login.png",
        "01b-provider-login.png",
        "03-pending.png",
        "05-executed.png",
    ] {
        assert_png(&shots.join(name));
    }
    client.cancel().await.unwrap();
}

/// Acceptance: a person in no mapped group is signed in with no role and can approve nothing
/// (nor list what waits); a person in the approvers' group then approves. On both backends.
async fn a_person_in_no_mapped_group_can_approve_nothing(backend: Backend) {
    let w = World::start(Spec {
        backend: Some(backend),
        ..Default::default()
    })
    .await;
    let bob = w.sign_in("bob", "bob-pw").await;
    let (status, me) = bob.get("/api/session").await;
    assert_eq!(status, 200, "{me}");
    assert_eq!(me["user"], "person:u-bob");
    assert_eq!(me["display_name"], "Bob Bystander");
    assert_eq!(me["role"], "none");
    assert_eq!(me["roles"], json!([]));

    let client = w.app.mcp_client().await;
    let call = call_in_background(&client, TOOL, restart_args("consul is wedged"));
    let alice = w.sign_in("alice", "alice-pw").await;
    let id = wait_for_pending(&alice).await;

    let (status, body) = bob.get("/api/approvals?state=pending").await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("person:u-bob is signed in but holds no role in emisar"),
        "{body}"
    );
    assert_eq!(body["code"], "no_role", "{body}");
    let (status, body) = bob.approve(&id).await;
    assert_eq!(status, 403, "{body}");
    let (status, body) = bob
        .post(
            &format!("/api/approvals/{id}/deny"),
            json!({"note": "no"}),
            true,
        )
        .await;
    assert_eq!(status, 403, "{body}");
    let (_, row) = alice.get(&format!("/api/approvals/{id}")).await;
    assert_eq!(row["state"], "pending", "{row}");

    let (status, body) = alice.approve(&id).await;
    assert_eq!(status, 200, "{body}");
    let res = finished(call).await;
    assert_eq!(res.is_error, Some(false), "{res:?}");
    assert_eq!(restarts(&w.record), 1);
    let trail = kinds_and_actors(&w.app, &id).await;
    assert_eq!(
        trail[2],
        ("approval.approved".into(), "person:u-alice".into())
    );
    let roles: Vec<(String, Value)> = w
        .events_of_kind("login")
        .await
        .into_iter()
        .map(|e| (e.actor, e.detail.unwrap()["roles"].clone()))
        .collect();
    assert_eq!(
        roles,
        [
            ("person:u-bob".into(), json!([])),
            ("person:u-alice".into(), json!(["approver"]))
        ]
    );
    // Logging out ends the session, audited under the person's identity.
    let (status, _) = bob.post("/api/logout", json!({}), true).await;
    assert_eq!(status, 200);
    let (status, _) = bob.get("/api/session").await;
    assert_eq!(status, 401);
    assert_eq!(w.events_of_kind("logout").await[0].actor, "person:u-bob");
    w.app.assert_chain_intact().await;
    client.cancel().await.unwrap();
}
crate::both_backends!(a_person_in_no_mapped_group_can_approve_nothing);

/// A provider sign-in's portal session ends at its expiry (`session_lifetime_secs` after the
/// sign-in, in `provider_sessions.expires_at`), as a local user's does: past it the cookie
/// signs in nobody, while another person's live session is untouched.
async fn a_provider_session_ends_when_it_expires(backend: Backend) {
    let w = World::start(Spec {
        backend: Some(backend),
        ..Default::default()
    })
    .await;
    let alice = w.sign_in("alice", "alice-pw").await;
    let carol = w.sign_in("carol", "carol-pw").await;
    let (status, me) = alice.get("/api/session").await;
    assert_eq!(status, 200, "{me}");
    assert_eq!(me["user"], "person:u-alice");
    // Alice's session expired a second ago.
    let past = emisar::server::audit::format_at(chrono::Utc::now() - chrono::Duration::seconds(1));
    let db = &w.app.db;
    emisar::with_pool!(db, pool => sqlx::query(db.sql("UPDATE provider_sessions SET expires_at = $1::timestamptz WHERE identity = $2"))
        .bind(&past).bind("person:u-alice").execute(pool).await.map(|_| ())).unwrap();
    let (status, body) = alice.get("/api/session").await;
    assert_eq!(status, 401, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("the session has ended"),
        "{body}"
    );
    let (status, body) = alice.get("/api/approvals").await;
    assert_eq!(status, 401, "{body}");
    let (status, body) = carol.get("/api/session").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["user"], "person:u-carol");
}
crate::both_backends!(a_provider_session_ends_when_it_expires);

/// Acceptance: a tampered ID token, a wrong nonce, a wrong issuer, an expired token (and a
/// token for another client, another browser, a replayed answer): each refused at emisar's
/// real callback with a message that says why, no session opened, and the refusals of tokens
/// the provider handed over audited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_sign_ins_each_say_why_at_the_callback() {
    let w = World::start(Spec::default()).await;
    let p = w.p();
    let now = emisar::server::oidc::jwt::unix_now();

    // Each case: what to do to the sign-in, and what the refusal page must say.
    struct Case {
        name: &'static str,
        edit_auth: Option<(&'static str, &'static str)>,
        token: Option<(Value, bool)>,
        want: String,
        check: &'static str,
    }
    let cases = vec![
        Case {
            name: "tampered: bob adds himself to the approvers, the signature left as it was",
            edit_auth: None,
            token: Some((json!({"groups": ["approvers"]}), false)),
            want: "the sign-in was refused: the ID token was refused: the token's signature does not verify (it was altered, or not signed by the provider)".into(),
            check: "bad_signature",
        },
        Case {
            name: "wrong nonce: the authorization request carried another nonce",
            edit_auth: Some(("nonce", "attacker-chosen-nonce")),
            token: None,
            want: "the ID token's nonce does not match the nonce sent with this sign-in".into(),
            check: "nonce_mismatch",
        },
        Case {
            name: "wrong issuer",
            edit_auth: None,
            token: Some((json!({"iss": "http://127.0.0.1:1"}), true)),
            want: format!(
                "the token was issued by `http://127.0.0.1:1`, not by the configured issuer `{}`",
                w.issuer
            ),
            check: "wrong_issuer",
        },
        Case {
            name: "expired",
            edit_auth: None,
            token: Some((json!({"exp": now - 3600, "iat": now - 7200}), true)),
            want: format!("the token expired at {}", now - 3600),
            check: "expired",
        },
        Case {
            name: "for another client",
            edit_auth: None,
            token: Some((json!({"aud": "another-client"}), true)),
            want: format!("the token is for audience [\"another-client\"], not for `{CLIENT}`"),
            check: "wrong_audience",
        },
    ];
    for case in &cases {
        let mut jar = BTreeMap::new();
        let (mut auth, binding) = w.start_sign_in().await;
        if let Some((param, value)) = case.edit_auth {
            auth = with_param(&auth, param, value);
        }
        let callback = w.at_provider(&auth, "bob", "bob-pw", &mut jar).await;
        if let Some((set, resign)) = &case.token {
            p.next_id_token(set.clone(), resign.then_some(&w.trusted))
                .await;
        }
        let res = w.come_back(&callback, Some(&binding)).await;
        assert_eq!(res.status(), 400, "{}", case.name);
        assert!(
            set_cookie(&res, "emisar_session").is_none(),
            "{}",
            case.name
        );
        let page = res.text().await.unwrap();
        assert!(
            page.contains(&escape(&case.want)),
            "{}: the page does not say {:?}:\n{page}",
            case.name,
            case.want
        );
        assert!(
            page.contains("<h1 id=\"title\">Sign-in refused</h1>"),
            "{page}"
        );
    }
    let refused: Vec<(String, Value)> = w
        .events_of_kind("login.failed")
        .await
        .into_iter()
        .map(|e| (e.actor, e.detail.unwrap()["check"].clone()))
        .collect();
    let want: Vec<(String, Value)> = cases
        .iter()
        .map(|c| ("system:oidc".to_owned(), json!(c.check)))
        .collect();
    assert_eq!(refused, want);
    assert!(
        w.events_of_kind("login").await.is_empty(),
        "nobody signed in"
    );

    // Another browser (no binding cookie), then the same answer replayed: neither opens a
    // session, and neither is audited (anyone can send them), only refused.
    let mut jar = BTreeMap::new();
    let (auth, binding) = w.start_sign_in().await;
    let callback = w.at_provider(&auth, "alice", "alice-pw", &mut jar).await;
    let res = w.come_back(&callback, None).await;
    assert_eq!(res.status(), 400);
    assert!(
        res.text()
            .await
            .unwrap()
            .contains("this sign-in was started in another browser; start again")
    );
    let res = w.come_back(&callback, Some(&binding)).await;
    assert_eq!(res.status(), 400);
    assert!(
        res.text()
            .await
            .unwrap()
            .contains("this sign-in is unknown or was already used; start again")
    );
    assert_eq!(w.events_of_kind("login.failed").await.len(), cases.len());
    // A real sign-in still works afterwards.
    let alice = w.sign_in("alice", "alice-pw").await;
    assert_eq!(alice.get("/api/session").await.1["role"], "approver");
}

/// What the refusal page shows for `text` (it escapes quotes and angle brackets).
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

/// `oidc.local_login = false`: the password form is gone and the API refuses passwords; the
/// provider's sign-in still works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn password_login_can_be_switched_off() {
    let w = World::start(Spec {
        oidc_extra: "local_login = false".into(),
        ..Default::default()
    })
    .await;
    let password = add_user(&w.app, "dave", Role::Approver).await;
    let res = reqwest::Client::new()
        .post(format!("{}/api/login", w.base()))
        .json(&json!({"name": "dave", "password": password}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 403);
    let body: Value = res.json().await.unwrap();
    assert_eq!(
        body["error"],
        "password login is switched off here (oidc.local_login = false): sign in with Test provider"
    );
    assert_eq!(body["code"], "password_login_off", "{body}");
    let options: Value = reqwest::get(format!("{}/api/login/options", w.base()))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        options,
        json!({"local_login": false, "oidc": {"name": "Test provider", "url": "/login/oidc",
                                              "available": true, "problem": null}})
    );
    let alice = w.sign_in("alice", "alice-pw").await;
    assert_eq!(alice.get("/api/session").await.1["role"], "approver");
}

/// Roles come from the provider at each sign-in: a group removed there takes effect at the
/// person's next sign-in (for all their sessions), and the provider ending the person's
/// session (back-channel logout) ends emisar's at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roles_and_sessions_follow_the_provider() {
    let w = World::start(Spec::default()).await;
    let p = w.p();
    let (alice_first, _) = w.sign_in_keeping("alice", "alice-pw").await;
    assert_eq!(alice_first.get("/api/session").await.1["role"], "approver");
    assert_eq!(alice_first.get("/api/approvals").await.0, 200);

    // An administrator takes Alice out of the approvers at the provider. Her session keeps
    // its role until she signs in again; then every session of hers has the new roles.
    p.set_claims(
        "u-alice",
        json!({"preferred_username": "alice", "name": "Alice Approver", "groups": ["staff"]}),
    )
    .await;
    assert_eq!(alice_first.get("/api/session").await.1["role"], "approver");
    let (alice_again, _) = w.sign_in_keeping("alice", "alice-pw").await;
    assert_eq!(alice_again.get("/api/session").await.1["role"], "none");
    assert_eq!(alice_first.get("/api/session").await.1["role"], "none");
    assert_eq!(alice_first.get("/api/approvals").await.0, 403);
    let client = w.app.mcp_client().await;
    let call = call_in_background(
        &client,
        TOOL,
        restart_args("a write nobody here may approve"),
    );
    let carol = w.sign_in("carol", "carol-pw").await;
    let id = wait_for_pending(&carol).await;
    assert_eq!(alice_first.approve(&id).await.0, 403);

    // Carol signs out at the provider: the provider tells emisar, which ends her portal
    // session (and only hers).
    let (carol2, mut carol_jar) = w.sign_in_keeping("carol", "carol-pw").await;
    assert_eq!(carol2.get("/api/session").await.0, 200);
    p.end_session(&mut carol_jar).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if carol2.get("/api/session").await.0 == 401 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the provider's sign-out did not end the session\nprovider log:\n{}",
            p.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Her first session came from another sign-in at the provider (another `sid`): it lives.
    assert_eq!(carol.get("/api/session").await.0, 200);
    let ended: Vec<(String, Value)> = w
        .events_of_kind("logout")
        .await
        .into_iter()
        .map(|e| (e.actor, e.detail.unwrap_or_default()))
        .collect();
    assert_eq!(
        ended,
        [(
            "person:u-carol".into(),
            json!({"by": "provider", "provider": w.issuer})
        )]
    );
    // A forged logout token (signed by a key the provider never published) ends nothing.
    let forged = TestKey::new("stranger").mint(&json!({
        "iss": w.issuer, "aud": CLIENT, "iat": emisar::server::oidc::jwt::unix_now(),
        "exp": emisar::server::oidc::jwt::unix_now() + 60, "jti": "x", "sub": "u-carol",
        "events": {"http://schemas.openid.net/event/backchannel-logout": {}}}));
    let res = reqwest::Client::new()
        .post(format!("{}/login/oidc/backchannel-logout", w.base()))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("logout_token={forged}"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 400);
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["error"], "invalid_request");
    assert!(
        body["error_description"]
            .as_str()
            .unwrap()
            .contains("which is not in the provider's key set"),
        "{body}"
    );
    assert_eq!(carol.get("/api/session").await.0, 200);

    // Carol decides; the request she did not make runs.
    assert_eq!(carol.approve(&id).await.0, 200);
    assert_eq!(finished(call).await.is_error, Some(false));
    w.app.assert_chain_intact().await;
    client.cancel().await.unwrap();
}

/// A provider that is down when emisar starts: emisar starts anyway, password login works, the
/// login page says why the provider's button is missing, and once the provider is up
/// (discovery retried in the background with backoff) people sign in through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_down_at_start_is_found_later() {
    let mut w = World::start(Spec {
        provider_down: true,
        ..Default::default()
    })
    .await;
    let options = |w: &World| {
        let url = format!("{}/api/login/options", w.base());
        async move {
            reqwest::get(url)
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        }
    };
    let down = options(&w).await;
    assert_eq!(down["local_login"], true);
    assert_eq!(down["oidc"]["available"], false, "{down}");
    let problem = down["oidc"]["problem"].as_str().unwrap();
    assert!(
        problem.starts_with(&format!(
            "the OpenID provider is unavailable ({}:",
            w.issuer
        )) && problem.contains("retrying"),
        "{problem}"
    );
    let res = World::http()
        .get(format!("{}/login/oidc", w.base()))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 503);
    let page = res.text().await.unwrap();
    assert!(
        page.contains("Signing in with Test provider is not possible right now")
            && page.contains("Password login still works."),
        "{page}"
    );
    let password = add_user(&w.app, "dave", Role::Approver).await;
    let dave = Portal::login(&w.app, "dave", &password).await;
    assert_eq!(dave.get("/api/session").await.1["user"], "dave");

    w.start_provider().await;
    // Liveness bound only: the retry waits at most 30 s between attempts.
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let now = options(&w).await;
        if now["oidc"]["available"] == true {
            break;
        }
        assert!(Instant::now() < deadline, "still unavailable: {now}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let alice = w.sign_in("alice", "alice-pw").await;
    assert_eq!(alice.get("/api/session").await.1["user"], "person:u-alice");
}
