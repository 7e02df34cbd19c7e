//! A person signs in with the OpenID provider: the authorization code flow with PKCE (S256),
//! `state` and `nonce`, the code exchanged at the token endpoint, the ID token verified, and
//! the person named and given the roles their groups map to.
//!
//! *Invariants:* every sign-in has its own random `state`, `nonce`, PKCE verifier and browser
//! binding, kept here (never in the browser) until the provider sends the person back; each is
//! used at most once and forgotten after `login_timeout_secs`; a callback is accepted only in
//! the browser that started it (the binding cookie), only from the configured issuer (RFC 9207
//! `iss`, when the provider sends it), and only with an ID token that carries the sign-in's
//! nonce. The client secret is sent to the token endpoint and nowhere else, and never logged.
//! The store of pending sign-ins is bounded, so unauthenticated requests cannot grow it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use tokio::time::Instant;

use super::claims::{ClaimError, person_identity, roles_for};
use super::config::{ClientSecret, OidcConfig, PersonRole, TokenAuthMethod};
use super::discovery::{DiscoveryError, ProviderMetadata, discover_openid};
use super::fetch::{FetchError, TOKEN_LIMIT, client, error_chain, excerpt, read_limited};
use super::id_token::IdTokenVerifier;
use super::jwks::JwksCache;
use super::jwt::{Claims, TokenError, unix_now};

/// At most this many sign-ins may be in progress at once.
pub(crate) const MAX_PENDING: usize = 10_000;
/// The path the provider sends the browser back to, under the server's public URL.
pub(crate) const CALLBACK_PATH: &str = "/login/oidc/callback";

/// application/x-www-form-urlencoded: everything but the unreserved characters is escaped.
const FORM: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

#[derive(Debug, thiserror::Error)]
pub enum LoginError {
    #[error("the provider refused the sign-in: {error}{}", description.as_deref().map(|d| format!(" ({d})")).unwrap_or_default())]
    Provider {
        error: String,
        description: Option<String>,
    },
    #[error("the provider's answer has no `{0}` parameter")]
    MissingParameter(&'static str),
    #[error("this sign-in is unknown or was already used; start again")]
    UnknownState,
    #[error("this sign-in took too long and was forgotten; start again")]
    Expired,
    #[error("this sign-in was started in another browser; start again")]
    BrowserMismatch,
    #[error("the answer names issuer `{found}`, not the configured issuer `{expected}`")]
    IssuerMismatch { expected: String, found: String },
    #[error("the provider promises to name itself (`iss`) in its answer, and this answer does not")]
    MissingIssuer,
    #[error("too many sign-ins in progress; try again in a few minutes")]
    TooManyPending,
    #[error("the token endpoint refused the code: {0}")]
    TokenEndpoint(String),
    #[error("failed to reach the token endpoint: {0}")]
    Fetch(#[from] FetchError),
    #[error("the token endpoint's answer has no ID token (is `openid` among the scopes?)")]
    NoIdToken,
    #[error("the ID token was refused: {0}")]
    IdToken(#[from] TokenError),
    #[error("the ID token cannot name the person: {0}")]
    Claim(#[from] ClaimError),
    #[error("no randomness available: {0}")]
    Randomness(String),
}

#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("{0:#}")]
    Config(anyhow::Error),
    #[error(transparent)]
    Discovery(#[from] DiscoveryError),
}

/// What the server keeps about one sign-in in progress.
#[derive(Debug, Clone)]
struct Pending {
    nonce: String,
    pkce_verifier: String,
    browser_hash: [u8; 32],
    return_to: Option<String>,
    expires: Instant,
}

/// Sign-ins in progress, by `state`. In memory: a sign-in must finish on the replica that
/// started it (sticky sessions, or one replica serving `/login/oidc/*`).
#[derive(Debug)]
pub struct PendingLogins {
    by_state: Mutex<HashMap<String, Pending>>,
    ttl: Duration,
    max: usize,
}

impl PendingLogins {
    pub(crate) fn new(ttl: Duration, max: usize) -> Self {
        PendingLogins {
            by_state: Mutex::new(HashMap::new()),
            ttl,
            max,
        }
    }

    fn insert(&self, state: String, mut p: Pending, now: Instant) -> Result<(), LoginError> {
        p.expires = now + self.ttl;
        let mut map = self.by_state.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= self.max {
            map.retain(|_, p| p.expires > now);
        }
        if map.len() >= self.max {
            return Err(LoginError::TooManyPending);
        }
        map.insert(state, p);
        Ok(())
    }

    /// Removes the sign-in (single use) and returns it unless it expired.
    fn take(&self, state: &str, now: Instant) -> Result<Pending, LoginError> {
        let p = self
            .by_state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(state)
            .ok_or(LoginError::UnknownState)?;
        if p.expires <= now {
            return Err(LoginError::Expired);
        }
        Ok(p)
    }

    pub fn len(&self) -> usize {
        self.by_state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Where to send the browser to start a sign-in.
#[derive(Debug, Clone)]
pub struct LoginStart {
    /// The provider's authorization URL with every parameter of this sign-in.
    pub authorization_url: String,
    pub state: String,
    /// A secret for a short-lived, HttpOnly, `SameSite=Lax` cookie on this browser; `finish`
    /// wants it back. (Lax, not Strict: the provider's redirect back is a cross-site
    /// navigation, and a Strict cookie would not come with it.)
    pub browser_binding: String,
}

/// The query of the provider's redirect back (`?code=…&state=…&iss=…` or `?error=…`).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Callback {
    #[serde(default)]
    pub code: Option<String>,
    #[serde(default)]
    pub state: Option<String>,
    #[serde(default)]
    pub iss: Option<String>,
    #[serde(default)]
    pub error: Option<String>,
    #[serde(default)]
    pub error_description: Option<String>,
}

/// A person the provider vouched for.
#[derive(Debug, Clone)]
pub struct SignedInPerson {
    /// `person:<identity claim>`: the name in the audit log, stable across sign-ins.
    pub identity: String,
    pub issuer: String,
    pub subject: String,
    /// For display only: `name`, else `preferred_username`, else the identity.
    pub display_name: String,
    /// Empty when none of the person's groups is mapped: signed in, allowed nothing.
    pub roles: BTreeSet<PersonRole>,
    /// When the portal session ends (Unix seconds): now + `session_lifetime_secs`.
    pub session_expires_at: i64,
    /// The provider's session id (`sid`), for ending the session with the provider's.
    pub provider_session: Option<String>,
    /// The local path the person wanted before signing in.
    pub return_to: Option<String>,
    /// The ID token, as `id_token_hint` for the provider's logout.
    pub id_token: String,
    pub claims: Claims,
}

fn random_b64(bytes: usize) -> Result<String, LoginError> {
    let mut buf = vec![0u8; bytes];
    getrandom::fill(&mut buf).map_err(|e| LoginError::Randomness(e.to_string()))?;
    Ok(URL_SAFE_NO_PAD.encode(buf))
}

/// RFC 7636 §4.2: `BASE64URL(SHA256(verifier))`.
pub fn pkce_challenge(verifier: &str) -> String {
    URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()))
}

fn form_encode(pairs: &[(&str, &str)]) -> String {
    pairs
        .iter()
        .map(|(k, v)| {
            format!(
                "{}={}",
                utf8_percent_encode(k, FORM),
                utf8_percent_encode(v, FORM)
            )
        })
        .collect::<Vec<_>>()
        .join("&")
}

/// A local path to come back to after sign-in: `/…`, never `//host` or `/\host` (which a
/// browser reads as another site), no control characters.
pub(crate) fn safe_return_path(path: &str) -> Option<&str> {
    let ok = path.starts_with('/')
        && !path.starts_with("//")
        && !path.starts_with("/\\")
        && path.len() <= 2048
        && !path.chars().any(|c| c.is_control());
    ok.then_some(path)
}

/// The redirect URL registered at the provider: `oidc.redirect_url`, or the public URL +
/// [`CALLBACK_PATH`].
pub(crate) fn redirect_url(
    config: &OidcConfig,
    public_url: Option<&str>,
) -> anyhow::Result<String> {
    match (&config.redirect_url, public_url) {
        (Some(u), _) => Ok(u.clone()),
        (None, Some(base)) => Ok(format!("{}{CALLBACK_PATH}", base.trim_end_matches('/'))),
        (None, None) => anyhow::bail!(
            "oidc.redirect_url is not set and there is no public_url to derive it from"
        ),
    }
}

#[derive(Deserialize)]
struct TokenAnswer {
    #[serde(default)]
    id_token: Option<String>,
}

#[derive(Deserialize)]
struct TokenRefusal {
    error: String,
    #[serde(default)]
    error_description: Option<String>,
}

/// The relying party: one per configured provider.
pub struct OidcLogin {
    config: OidcConfig,
    redirect_url: String,
    secret: Option<ClientSecret>,
    http: reqwest::Client,
    metadata: ProviderMetadata,
    jwks: Arc<JwksCache>,
    verifier: IdTokenVerifier,
    pending: PendingLogins,
    group_roles: BTreeMap<String, BTreeSet<PersonRole>>,
}

impl OidcLogin {
    /// Checks the config, reads the client secret and discovers the provider.
    pub async fn discover(config: OidcConfig, redirect_url: String) -> Result<Self, SetupError> {
        config.check().map_err(SetupError::Config)?;
        super::config::check_url("oidc.redirect_url", &redirect_url).map_err(SetupError::Config)?;
        let secret = config.client_secret().map_err(SetupError::Config)?;
        let http = client(Duration::from_millis(config.http_timeout_ms));
        let metadata = discover_openid(&http, &config.issuer).await?;
        metadata.code_flow_endpoints()?;
        let jwks = Arc::new(JwksCache::new(
            http.clone(),
            metadata.jwks_uri.clone(),
            Duration::from_secs(config.jwks_min_refresh_secs),
        ));
        let verifier = IdTokenVerifier {
            issuer: config.issuer.clone(),
            client_id: config.client_id.clone(),
            leeway_secs: config.leeway_secs,
            jwks: jwks.clone(),
        };
        let group_roles = config
            .group_roles()
            .into_iter()
            .map(|(g, r)| (g.to_owned(), r))
            .collect();
        Ok(OidcLogin {
            pending: PendingLogins::new(
                Duration::from_secs(config.login_timeout_secs),
                MAX_PENDING,
            ),
            config,
            redirect_url,
            secret,
            http,
            metadata,
            jwks,
            verifier,
            group_roles,
        })
    }

    pub fn config(&self) -> &OidcConfig {
        &self.config
    }

    pub fn metadata(&self) -> &ProviderMetadata {
        &self.metadata
    }

    pub fn jwks(&self) -> &Arc<JwksCache> {
        &self.jwks
    }

    pub fn pending(&self) -> &PendingLogins {
        &self.pending
    }

    /// Verifies a back-channel logout token from the provider; `now` in Unix seconds.
    pub(crate) async fn verify_logout_token(
        &self,
        token: &str,
        now: i64,
    ) -> Result<super::logout::LogoutRequest, TokenError> {
        let claims = super::jwt::verify_signature(token, &self.jwks).await?;
        super::logout::check_logout_claims(
            &claims,
            &self.config.issuer,
            &self.config.client_id,
            now,
            self.config.leeway_secs,
        )
    }

    /// Starts a sign-in: remembers its state, nonce, PKCE verifier and browser binding, and
    /// returns the URL to send the browser to. `return_to` is kept only if it is a local path.
    pub fn start(&self, return_to: Option<&str>) -> Result<LoginStart, LoginError> {
        let state = random_b64(32)?;
        let nonce = random_b64(32)?;
        let pkce_verifier = random_b64(32)?;
        let browser_binding = random_b64(32)?;
        let (authorization_endpoint, _) = self
            .metadata
            .code_flow_endpoints()
            .map_err(|e| LoginError::TokenEndpoint(e.to_string()))?;
        let mut url = reqwest::Url::parse(authorization_endpoint)
            .map_err(|e| LoginError::TokenEndpoint(format!("authorization_endpoint: {e}")))?;
        url.query_pairs_mut()
            .append_pair("response_type", "code")
            .append_pair("client_id", &self.config.client_id)
            .append_pair("redirect_uri", &self.redirect_url)
            .append_pair("scope", &self.config.scopes.join(" "))
            .append_pair("state", &state)
            .append_pair("nonce", &nonce)
            .append_pair("code_challenge", &pkce_challenge(&pkce_verifier))
            .append_pair("code_challenge_method", "S256");
        self.pending.insert(
            state.clone(),
            Pending {
                nonce,
                pkce_verifier,
                browser_hash: Sha256::digest(browser_binding.as_bytes()).into(),
                return_to: return_to.and_then(safe_return_path).map(str::to_owned),
                expires: Instant::now(),
            },
            Instant::now(),
        )?;
        Ok(LoginStart {
            authorization_url: url.into(),
            state,
            browser_binding,
        })
    }

    /// Finishes a sign-in from the provider's redirect back and the browser's binding cookie.
    pub async fn finish(
        &self,
        callback: &Callback,
        browser_binding: Option<&str>,
    ) -> Result<SignedInPerson, LoginError> {
        let state = callback
            .state
            .as_deref()
            .ok_or(LoginError::MissingParameter("state"))?;
        // The state is spent whatever happens next: a refused answer cannot be replayed.
        let pending = self.pending.take(state, Instant::now())?;
        let presented: [u8; 32] = Sha256::digest(browser_binding.unwrap_or("").as_bytes()).into();
        if presented != pending.browser_hash {
            return Err(LoginError::BrowserMismatch);
        }
        match &callback.iss {
            Some(iss) if *iss != self.config.issuer => {
                return Err(LoginError::IssuerMismatch {
                    expected: self.config.issuer.clone(),
                    found: iss.clone(),
                });
            }
            None if self.metadata.authorization_response_iss_parameter_supported => {
                return Err(LoginError::MissingIssuer);
            }
            _ => {}
        }
        if let Some(error) = &callback.error {
            return Err(LoginError::Provider {
                error: excerpt(error.as_bytes()),
                description: callback
                    .error_description
                    .as_deref()
                    .map(|d| excerpt(d.as_bytes())),
            });
        }
        let code = callback
            .code
            .as_deref()
            .ok_or(LoginError::MissingParameter("code"))?;
        let id_token = self.exchange(code, &pending.pkce_verifier).await?;
        let now = unix_now();
        let claims = self.verifier.verify(&id_token, &pending.nonce, now).await?;
        self.person(claims, id_token, pending.return_to, now)
    }

    fn person(
        &self,
        claims: Claims,
        id_token: String,
        return_to: Option<String>,
        now: i64,
    ) -> Result<SignedInPerson, LoginError> {
        let identity = person_identity(&claims, &self.config.identity_claim)?;
        let borrowed: BTreeMap<&str, BTreeSet<PersonRole>> = self
            .group_roles
            .iter()
            .map(|(g, r)| (g.as_str(), r.clone()))
            .collect();
        let roles = roles_for(&claims, &self.config.roles_claim, &borrowed);
        let text = |k: &str| {
            claims
                .get(k)
                .and_then(|v| v.as_str())
                .filter(|s| !s.is_empty())
                .map(|s| excerpt(s.as_bytes()))
        };
        Ok(SignedInPerson {
            display_name: text("name")
                .or_else(|| text("preferred_username"))
                .unwrap_or_else(|| identity.clone()),
            subject: text("sub").unwrap_or_default(),
            provider_session: text("sid"),
            identity,
            issuer: self.config.issuer.clone(),
            roles,
            session_expires_at: now + self.config.session_lifetime_secs as i64,
            return_to,
            id_token,
            claims,
        })
    }

    /// The token request (RFC 6749 §4.1.3 with the PKCE verifier); returns the ID token.
    async fn exchange(&self, code: &str, verifier: &str) -> Result<String, LoginError> {
        let (_, token_endpoint) = self
            .metadata
            .code_flow_endpoints()
            .map_err(|e| LoginError::TokenEndpoint(e.to_string()))?;
        let mut form = vec![
            ("grant_type", "authorization_code"),
            ("code", code),
            ("redirect_uri", self.redirect_url.as_str()),
            ("code_verifier", verifier),
        ];
        let mut req = self
            .http
            .post(token_endpoint)
            .header(reqwest::header::ACCEPT, "application/json")
            .header(
                reqwest::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            );
        let secret = self.secret.as_ref().map(ClientSecret::expose);
        match (self.config.token_auth_method, secret) {
            (TokenAuthMethod::ClientSecretBasic, Some(secret)) => {
                // RFC 6749 §2.3.1: both parts are form-encoded before they are joined.
                let pair = format!(
                    "{}:{}",
                    utf8_percent_encode(&self.config.client_id, FORM),
                    utf8_percent_encode(secret, FORM)
                );
                req = req.header(
                    reqwest::header::AUTHORIZATION,
                    format!("Basic {}", STANDARD.encode(pair)),
                );
            }
            (TokenAuthMethod::ClientSecretPost, Some(secret)) => {
                form.push(("client_id", self.config.client_id.as_str()));
                form.push(("client_secret", secret));
            }
            _ => form.push(("client_id", self.config.client_id.as_str())),
        }
        let resp = req
            .body(form_encode(&form))
            .send()
            .await
            .map_err(|e| FetchError::Request {
                url: token_endpoint.to_owned(),
                reason: error_chain(&e),
            })?;
        let status = resp.status();
        let body = read_limited(token_endpoint, resp, TOKEN_LIMIT).await?;
        if !status.is_success() {
            return Err(LoginError::TokenEndpoint(
                match serde_json::from_slice::<TokenRefusal>(&body) {
                    Ok(r) => format!(
                        "{}{}",
                        excerpt(r.error.as_bytes()),
                        r.error_description
                            .map(|d| format!(" ({})", excerpt(d.as_bytes())))
                            .unwrap_or_default()
                    ),
                    Err(_) => format!("HTTP {}: {}", status.as_u16(), excerpt(&body)),
                },
            ));
        }
        let answer: TokenAnswer = serde_json::from_slice(&body).map_err(|e| FetchError::Json {
            url: token_endpoint.to_owned(),
            reason: e.to_string(),
        })?;
        answer.id_token.ok_or(LoginError::NoIdToken)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn pending(hash_of: &str) -> Pending {
        Pending {
            nonce: "n".into(),
            pkce_verifier: "v".into(),
            browser_hash: Sha256::digest(hash_of.as_bytes()).into(),
            return_to: None,
            expires: Instant::now(),
        }
    }

    #[test]
    fn pkce_matches_rfc_7636_appendix_b() {
        assert_eq!(
            pkce_challenge("dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"),
            "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"
        );
    }

    #[test]
    fn form_encoding_escapes_everything_but_unreserved() {
        assert_eq!(
            form_encode(&[("a b", "x&y=z/é~._-")]),
            "a%20b=x%26y%3Dz%2F%C3%A9~._-"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_pending_login_is_single_use_and_expires() {
        let store = PendingLogins::new(Duration::from_secs(600), 10);
        store
            .insert("s1".into(), pending("b"), Instant::now())
            .unwrap();
        store
            .insert("s2".into(), pending("b"), Instant::now())
            .unwrap();
        assert!(store.take("s1", Instant::now()).is_ok());
        assert!(matches!(
            store.take("s1", Instant::now()),
            Err(LoginError::UnknownState)
        ));
        tokio::time::advance(Duration::from_secs(600)).await;
        assert!(matches!(
            store.take("s2", Instant::now()),
            Err(LoginError::Expired)
        ));
        assert!(store.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn the_store_is_bounded_and_sweeps_expired_entries() {
        let store = PendingLogins::new(Duration::from_secs(60), 3);
        for i in 0..3 {
            store
                .insert(format!("s{i}"), pending("b"), Instant::now())
                .unwrap();
        }
        assert!(matches!(
            store.insert("s3".into(), pending("b"), Instant::now()),
            Err(LoginError::TooManyPending)
        ));
        tokio::time::advance(Duration::from_secs(61)).await;
        store
            .insert("s3".into(), pending("b"), Instant::now())
            .unwrap();
        assert_eq!(store.len(), 1);
    }

    #[test]
    fn return_paths_stay_local() {
        assert_eq!(
            safe_return_path("/approvals/12?x=1"),
            Some("/approvals/12?x=1")
        );
        for bad in [
            "//evil.example",
            "/\\evil.example",
            "https://evil.example",
            "",
            "/a\nb",
        ] {
            assert_eq!(safe_return_path(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_redirect_url_comes_from_config_or_public_url() {
        let mut c: OidcConfig = toml::from_str(
            "issuer = \"https://sso.example.com\"\nclient_id = \"e\"\nclient_secret_env = \"S\"",
        )
        .unwrap();
        assert_eq!(
            redirect_url(&c, Some("https://emisar.example.com/")).unwrap(),
            "https://emisar.example.com/login/oidc/callback"
        );
        assert!(
            redirect_url(&c, None)
                .unwrap_err()
                .to_string()
                .contains("oidc.redirect_url")
        );
        c.redirect_url = Some("https://x.example.com/cb".into());
        assert_eq!(redirect_url(&c, None).unwrap(), "https://x.example.com/cb");
    }

    proptest! {
        #[test]
        fn return_paths_never_leave_the_site(path in any::<String>()) {
            if let Some(p) = safe_return_path(&path) {
                prop_assert!(p.starts_with('/'));
                prop_assert!(!p.starts_with("//") && !p.starts_with("/\\"));
                prop_assert!(!p.chars().any(|c| c.is_control()));
            }
        }
    }
}
