//! A real OpenID provider (npm `oidc-provider`, tests/oidc/provider.mjs) on a free loopback
//! port, configured by the test (users, groups, clients, resource servers), stopped by PID on
//! drop. Also: a scripted person who logs in through the provider's login form (no browser),
//! and a key of the test's own that the provider publishes, for minting adversarial tokens.
//!
//! Which adversarial token comes from where:
//! - tampered: a real token from the provider, its payload altered by the test;
//! - wrong nonce: a real code flow whose authorization request carries another nonce;
//! - wrong issuer, expired, wrong audience: minted by the test with [`TestKey`], which the
//!   provider publishes in its key set, so the signature is trusted and only the claim under
//!   test is wrong;
//! - unknown key: minted with a [`TestKey`] the provider does not publish.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ed25519_dalek::SigningKey;
use ed25519_dalek::pkcs8::EncodePrivateKey;
use ed25519_dalek::pkcs8::spki::der::pem::LineEnding;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};

use super::tools::require;

/// Everything the provider holds: what the test passes on its stdin (see provider.mjs).
#[derive(Debug, Clone, Default)]
pub struct ProviderSetup {
    pub users: Vec<Value>,
    pub clients: Vec<Value>,
    pub client_token_claims: BTreeMap<String, Value>,
    pub resources: BTreeMap<String, Value>,
    pub extra_jwks: Vec<Value>,
    pub registration: bool,
    /// The port to bind; a free one when `None`.
    pub port: Option<u16>,
}

impl ProviderSetup {
    pub fn user(mut self, sub: &str, username: &str, password: &str, claims: Value) -> Self {
        self.users.push(
            json!({"sub": sub, "username": username, "password": password,
                               "claims": claims, "token_claims": {"preferred_username": username}}),
        );
        self
    }

    /// A confidential web client (authorization code + PKCE), e.g. the portal.
    pub fn web_client(mut self, id: &str, secret: &str, redirect_uri: &str) -> Self {
        self.clients.push(json!({"client_id": id, "client_secret": secret,
                                 "redirect_uris": [redirect_uri],
                                 "grant_types": ["authorization_code"], "response_types": ["code"]}));
        self
    }

    /// A confidential web client that the provider also tells, server to server, when a
    /// person signs out (back-channel logout with the session id), e.g. emisar's portal.
    pub fn web_client_with_logout(
        mut self,
        id: &str,
        secret: &str,
        redirect_uri: &str,
        logout_uri: &str,
    ) -> Self {
        self.clients.push(json!({"client_id": id, "client_secret": secret,
                                 "redirect_uris": [redirect_uri],
                                 "backchannel_logout_uri": logout_uri,
                                 "backchannel_logout_session_required": true,
                                 "grant_types": ["authorization_code"], "response_types": ["code"]}));
        self
    }

    /// Binds `port` instead of a free one (the issuer URL is then known before the start).
    pub fn on_port(mut self, port: u16) -> Self {
        self.port = Some(port);
        self
    }

    /// A public client (no secret, PKCE only), e.g. an MCP agent in a desktop app.
    pub fn public_client(mut self, id: &str, redirect_uri: &str) -> Self {
        self.clients.push(json!({"client_id": id, "token_endpoint_auth_method": "none",
                                 "application_type": "native", "redirect_uris": [redirect_uri],
                                 "grant_types": ["authorization_code"], "response_types": ["code"]}));
        self
    }

    /// A headless client (client credentials), with extra claims for its access tokens.
    pub fn service_client(mut self, id: &str, secret: &str, token_claims: Value) -> Self {
        self.clients.push(
            json!({"client_id": id, "client_secret": secret, "redirect_uris": [],
                                 "response_types": [], "grant_types": ["client_credentials"]}),
        );
        self.client_token_claims.insert(id.into(), token_claims);
        self
    }

    pub fn resource(mut self, indicator: &str, scope: &str) -> Self {
        self.resources
            .insert(indicator.into(), json!({"scope": scope, "ttl": 300}));
        self
    }

    /// Publishes `key` in the provider's key set (the provider never signs with it).
    pub fn publish(mut self, key: &TestKey) -> Self {
        self.extra_jwks.push(key.private_jwk());
        self
    }

    fn to_json(&self) -> Value {
        json!({"users": self.users, "clients": self.clients,
               "client_token_claims": self.client_token_claims, "resources": self.resources,
               "extra_jwks": self.extra_jwks, "registration": self.registration,
               "port": self.port})
    }
}

/// The running provider.
pub struct OidcProvider {
    child: Child,
    pub issuer: String,
    /// The key ids it published at start.
    pub kids: Vec<String>,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl OidcProvider {
    pub async fn start(setup: &ProviderSetup) -> OidcProvider {
        let node = require("node/bin/node");
        let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let script = repo.join("tests/oidc/provider.mjs");
        let module = repo.join("tests/oidc/node_modules/oidc-provider/package.json");
        assert!(
            module.exists(),
            "{} is missing: run scripts/install-test-deps (or scripts/test) first",
            module.display()
        );
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("provider.log");
        let mut child = Command::new(node)
            .arg(&script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("failed to start node tests/oidc/provider.mjs");
        let mut stdin = child.stdin.take().unwrap();
        stdin
            .write_all(setup.to_json().to_string().as_bytes())
            .unwrap();
        drop(stdin);
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        // A generous liveness bound: node starts in well under a second when the machine is idle.
        let line = tokio::task::spawn_blocking(move || rx.recv_timeout(Duration::from_secs(60)))
            .await
            .unwrap();
        let mut provider = OidcProvider {
            child,
            issuer: String::new(),
            kids: Vec::new(),
            log,
            _dir: dir,
        };
        let line = match line {
            Ok(l) if !l.trim().is_empty() => l,
            _ => panic!(
                "the OpenID provider printed no URL within 60 s; its log:\n{}",
                provider.log()
            ),
        };
        let started: Value = serde_json::from_str(line.trim()).unwrap();
        provider.issuer = started["issuer"].as_str().unwrap().to_owned();
        provider.kids = serde_json::from_value(started["kids"].clone()).unwrap();
        provider
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Puts a fresh signing key in front of the old one; returns the published key ids.
    pub async fn rotate_keys(&self) -> Vec<String> {
        let v: Value = reqwest::Client::new()
            .post(format!("{}/__test/rotate-keys", self.issuer))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        serde_json::from_value(v["kids"].clone()).unwrap()
    }

    /// Replaces a person's claims (their groups, say), as an administrator would.
    pub async fn set_claims(&self, sub: &str, claims: Value) {
        let res = reqwest::Client::new()
            .post(format!("{}/__test/set-claims", self.issuer))
            .json(&json!({"sub": sub, "claims": claims}))
            .send()
            .await
            .unwrap();
        assert!(res.status().is_success(), "set-claims: {}", res.status());
    }

    /// Alters the ID token of the next token response: `set` claims, then keep the original
    /// signature (`sign_with` `None`: a tampered token) or re-sign with a published test key.
    pub async fn next_id_token(&self, set: Value, sign_with: Option<&TestKey>) {
        let res = reqwest::Client::new()
            .post(format!("{}/__test/next-id-token", self.issuer))
            .json(&json!({"set": set, "sign_with": sign_with.map(|k| k.kid.clone())}))
            .send()
            .await
            .unwrap();
        assert!(res.status().is_success(), "next-id-token: {}", res.status());
    }

    /// Signs the person whose provider cookies are in `jar` out at the provider (RP-initiated
    /// logout, confirmed), which makes the provider post back-channel logout tokens.
    pub async fn end_session(&self, jar: &mut BTreeMap<String, String>) {
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap();
        let resp = http
            .get(format!("{}/session/end", self.issuer))
            .header("cookie", cookie_header(jar))
            .send()
            .await
            .unwrap();
        keep_cookies(jar, &resp);
        let page = resp.text().await.unwrap();
        let xsrf = page
            .split("name=\"xsrf\" value=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .unwrap_or_else(|| panic!("no xsrf field on the sign-out page: {page}"));
        let resp = http
            .post(format!("{}/session/end/confirm", self.issuer))
            .header("cookie", cookie_header(jar))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!("xsrf={}&logout=yes", form(xsrf)))
            .send()
            .await
            .unwrap();
        assert!(
            matches!(resp.status().as_u16(), 302 | 303),
            "sign-out at the provider: HTTP {}: {}\n{}",
            resp.status(),
            resp.text().await.unwrap_or_default(),
            self.log()
        );
    }

    /// A client-credentials token for `resource` with `scope` (the whole token response).
    pub async fn client_credentials(
        &self,
        id: &str,
        secret: &str,
        resource: &str,
        scope: &str,
    ) -> Value {
        let resp = reqwest::Client::new()
            .post(format!("{}/token", self.issuer))
            .basic_auth(id, Some(secret))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!(
                "grant_type=client_credentials&resource={}&scope={}",
                form(resource),
                form(scope)
            ))
            .send()
            .await
            .unwrap();
        let status = resp.status();
        let body: Value = resp.json().await.unwrap();
        assert!(status.is_success(), "token endpoint: {status} {body}");
        body
    }

    /// The authorization-code token request of a public client (PKCE), e.g. an MCP agent.
    pub async fn exchange_public(
        &self,
        client_id: &str,
        code: &str,
        redirect_uri: &str,
        verifier: &str,
        resource: &str,
    ) -> Value {
        let resp = reqwest::Client::new()
            .post(format!("{}/token", self.issuer))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!(
                "grant_type=authorization_code&client_id={}&code={}&redirect_uri={}&code_verifier={}&resource={}",
                form(client_id),
                form(code),
                form(redirect_uri),
                form(verifier),
                form(resource)
            ))
            .send()
            .await
            .unwrap();
        let status = resp.status();
        let body: Value = resp.json().await.unwrap();
        assert!(status.is_success(), "token endpoint: {status} {body}");
        body
    }

    /// A person logging in, scripted: follows `authorization_url` through the provider (its
    /// cookies kept), fills in the login form, and returns the URL the provider finally sends
    /// the browser to (the redirect URI with `code`, `state`, `iss`). `Err` carries the
    /// provider's refusal (e.g. a wrong password).
    pub async fn login(
        &self,
        authorization_url: &str,
        username: &str,
        password: &str,
        redirect_uri: &str,
    ) -> Result<reqwest::Url, String> {
        let mut jar = BTreeMap::new();
        self.login_keeping(
            &mut jar,
            authorization_url,
            username,
            password,
            redirect_uri,
        )
        .await
    }

    /// [`OidcProvider::login`] with the person's cookies at the provider kept in `jar` (their
    /// session there, for [`OidcProvider::end_session`]).
    pub async fn login_keeping(
        &self,
        jar: &mut BTreeMap<String, String>,
        authorization_url: &str,
        username: &str,
        password: &str,
        redirect_uri: &str,
    ) -> Result<reqwest::Url, String> {
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap();
        let mut url = reqwest::Url::parse(authorization_url).unwrap();
        for _ in 0..20 {
            if url.as_str().starts_with(redirect_uri) {
                return Ok(url);
            }
            let resp = http
                .get(url.clone())
                .header("cookie", cookie_header(jar))
                .send()
                .await
                .map_err(|e| e.to_string())?;
            keep_cookies(jar, &resp);
            let status = resp.status().as_u16();
            if matches!(status, 302 | 303) {
                url = url.join(location(&resp)).unwrap();
                continue;
            }
            let body = resp.text().await.unwrap_or_default();
            if status == 200 && body.contains("name=\"password\"") {
                let action = url.join(&format!("{}/login", url.path())).unwrap();
                let resp = http
                    .post(action.clone())
                    .header("cookie", cookie_header(jar))
                    .header("content-type", "application/x-www-form-urlencoded")
                    .body(format!(
                        "login={}&password={}",
                        form(username),
                        form(password)
                    ))
                    .send()
                    .await
                    .map_err(|e| e.to_string())?;
                keep_cookies(jar, &resp);
                if !matches!(resp.status().as_u16(), 302 | 303) {
                    return Err(format!(
                        "login refused: HTTP {}: {}",
                        resp.status(),
                        resp.text().await.unwrap_or_default()
                    ));
                }
                url = action.join(location(&resp)).unwrap();
                continue;
            }
            return Err(format!("HTTP {status} at {url}: {body}"));
        }
        Err("the provider never sent the browser back".into())
    }
}

impl Drop for OidcProvider {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn form(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
}

fn location(resp: &reqwest::Response) -> &str {
    resp.headers()
        .get("location")
        .and_then(|v| v.to_str().ok())
        .expect("a redirect has a Location")
}

fn keep_cookies(jar: &mut BTreeMap<String, String>, resp: &reqwest::Response) {
    for v in resp.headers().get_all("set-cookie") {
        let Ok(v) = v.to_str() else { continue };
        let first = v.split(';').next().unwrap_or("");
        if let Some((name, value)) = first.split_once('=') {
            let expired = v.to_ascii_lowercase().contains("expires=thu, 01 jan 1970");
            if value.is_empty() || expired {
                jar.remove(name.trim());
            } else {
                jar.insert(name.trim().to_owned(), value.to_owned());
            }
        }
    }
}

fn cookie_header(jar: &BTreeMap<String, String>) -> String {
    jar.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The query parameters of a URL.
pub fn query(url: &reqwest::Url) -> BTreeMap<String, String> {
    url.query_pairs()
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

/// `url` with query parameter `name` set to `value`.
pub fn with_param(url: &str, name: &str, value: &str) -> String {
    let mut u = reqwest::Url::parse(url).unwrap();
    let pairs: Vec<(String, String)> = u
        .query_pairs()
        .map(|(k, v)| {
            let v = if k == name {
                value.to_owned()
            } else {
                v.into_owned()
            };
            (k.into_owned(), v)
        })
        .collect();
    u.query_pairs_mut().clear().extend_pairs(pairs);
    u.into()
}

/// An Ed25519 key owned by the test, for minting tokens.
pub struct TestKey {
    pub kid: String,
    seed: [u8; 32],
}

impl TestKey {
    pub fn new(kid: &str) -> TestKey {
        let mut seed = [0u8; 32];
        getrandom::fill(&mut seed).unwrap();
        TestKey {
            kid: kid.into(),
            seed,
        }
    }

    fn signing(&self) -> SigningKey {
        SigningKey::from_bytes(&self.seed)
    }

    /// The private JWK (the provider loads keys as private JWKs and publishes the public half).
    pub fn private_jwk(&self) -> Value {
        json!({"kty": "OKP", "crv": "Ed25519", "kid": self.kid, "alg": "EdDSA", "use": "sig",
               "x": URL_SAFE_NO_PAD.encode(self.signing().verifying_key().to_bytes()),
               "d": URL_SAFE_NO_PAD.encode(self.seed)})
    }

    /// A JWT with `claims`, signed by this key, naming it in `kid`.
    pub fn mint(&self, claims: &Value) -> String {
        let pem = self.signing().to_pkcs8_pem(LineEnding::LF).unwrap();
        let key = EncodingKey::from_ed_pem(pem.as_bytes()).unwrap();
        let mut header = Header::new(Algorithm::EdDSA);
        header.kid = Some(self.kid.clone());
        jsonwebtoken::encode(&header, claims, &key).unwrap()
    }
}

/// `token` with its payload replaced by `edit(payload)`, the signature left as it was.
pub fn tamper(token: &str, edit: impl FnOnce(&mut Value)) -> String {
    let parts: Vec<&str> = token.split('.').collect();
    assert_eq!(parts.len(), 3, "a JWS compact token");
    let mut payload: Value =
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[1]).unwrap()).unwrap();
    edit(&mut payload);
    let body = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&payload).unwrap());
    format!("{}.{}.{}", parts[0], body, parts[2])
}

/// The payload of a JWT, unverified (to look at what the provider put in it).
pub fn payload(token: &str) -> Value {
    let part = token.split('.').nth(1).unwrap();
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(part).unwrap()).unwrap()
}
